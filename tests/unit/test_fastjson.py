import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.protocol.codes import LanguageCode, Perm
from common.protocol.fastjson import FastjsonError, dumps_legacy, dumps_standard, dumps_standard_fastjson2, loads

# ---------------------------------------------------------------------------------------------
# loads


def test_loads_standard_json_and_bytes_or_str():
    assert loads(b'{"a":[1,2.5,true,false,null],"b":"x"}') == {"a": [1, 2.5, True, False, None], "b": "x"}
    assert loads('{"a":1}') == {"a": 1}


def test_loads_bare_integer_keys_become_int_keys():
    assert loads(b'{0:"127.0.0.1:10911",1:"127.0.0.1:10921",-2:"x"}') == {
        0: "127.0.0.1:10911",
        1: "127.0.0.1:10921",
        -2: "x",
    }


def test_loads_mixed_and_nested_bare_keys():
    text = '{"brokerAddrs":{0:"a", "1":"b"},"m":{"currIdMap":{0:3,1:4}}}'
    assert loads(text) == {"brokerAddrs": {0: "a", "1": "b"}, "m": {"currIdMap": {0: 3, 1: 4}}}


def test_loads_keeps_key_like_text_inside_strings():
    # a regex pre-pass that unquotes/quotes {0: would corrupt these values
    value = loads('{0:"{0:\\"x\\"}", "s":"{1:2}"}')
    assert value == {0: '{0:"x"}', "s": "{1:2}"}


def test_loads_accepts_unquoted_names_trailing_commas_and_whitespace():
    assert loads(' {name : 1, "l":[1,2,],}\n') == {"name": 1, "l": [1, 2]}


def test_loads_big_integers_and_escapes_in_fallback():
    assert loads('{0:123456789012345678901234567890,"e":"\\u00e9\\n"}') == {
        0: 123456789012345678901234567890,
        "e": "é\n",
    }


@pytest.mark.parametrize(
    ("text", "pos"),
    [
        ("", 0),
        ("{", 1),
        ("{0 1}", 3),
        ("[1 2]", 3),
        ("tru", 0),
        ('{"a":1}x', 7),
        ("{:1}", 1),
        ('{"a" 1}', 5),
        ('"unterminated', 0),
        ("{0:}", 3),
    ],
)
def test_loads_garbage_raises_with_position(text, pos):
    with pytest.raises(FastjsonError) as info:
        loads(text)
    assert isinstance(info.value, ValueError)
    assert info.value.pos == pos


def test_loads_rejects_invalid_utf8():
    with pytest.raises(FastjsonError, match="UTF-8"):
        loads(b'{0:"\xff"}')


def test_loads_deep_nesting_is_an_error_not_a_crash():
    with pytest.raises(FastjsonError, match="deep"):
        loads("[" * 100_000)
    with pytest.raises(FastjsonError, match="deep"):
        loads("{0:" * 10_000)


# ---------------------------------------------------------------------------------------------
# dumps_legacy


def test_legacy_int_keys_bare_and_numerically_sorted_before_strings():
    assert dumps_legacy({10: "c", 2: "b", "a": 1, 0: "a"}) == b'{0:"a",2:"b",10:"c","a":1}'


def test_legacy_sorts_string_keys_and_omits_null_values():
    assert dumps_legacy({"b": 1, "a": None, "c": [None, True, False]}) == b'{"b":1,"c":[null,true,false]}'


def test_legacy_is_raw_utf8_with_raw_slash():
    assert dumps_legacy({"z": "zone/1", "n": "bé"}) == '{"n":"bé","z":"zone/1"}'.encode()


def test_legacy_writes_enums_as_numbers_or_names():
    assert dumps_legacy({"perm": Perm.READ | Perm.WRITE, "lang": LanguageCode.JAVA}) == b'{"lang":0,"perm":6}'


def test_legacy_fallback_writes_lone_surrogates_as_question_mark():
    assert dumps_legacy({0: "a\ud800b"}) == b'{0:"a?b"}'


def test_legacy_nan_is_null_like_fastjson():
    assert dumps_legacy([float("nan"), 1.5]) == b"[null,1.5]"


def test_legacy_rejects_unknown_types():
    with pytest.raises(TypeError, match="to_wire"):
        dumps_legacy({"x": object()})


# ---------------------------------------------------------------------------------------------
# dumps_standard


def test_standard_quotes_int_keys_sorted_numerically():
    assert dumps_standard({10: "c", 2: "b", 0: "a"}) == b'{"0":"a","2":"b","10":"c"}'


def test_standard_escapes_non_ascii_upper_hex_and_slash():
    assert dumps_standard({"n": "bé/😀"}) == b'{"n":"b\\u00E9\\/\\uD83D\\uDE00"}'


def test_standard_escapes_del_as_the_stdlib_encoder_does():
    # orjson leaves DEL raw in otherwise ASCII output (hypothesis found it: see the byte-for-byte test)
    assert dumps_standard({"d": "a\x7fb"}) == b'{"d":"a\\u007Fb"}'


def test_standard_leaves_literal_backslash_u_text_alone():
    # the text \u00e9 (backslash, u, ...) is written as \\u00e9 and must not be upper-cased
    assert dumps_standard({"s": "\\u00e9é"}) == b'{"s":"\\\\u00e9\\u00E9"}'


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (2**53 - 1, b"9007199254740991"),
        (2**53, b'"9007199254740992"'),
        (-(2**53 - 1), b"-9007199254740991"),
        (-(2**53), b'"-9007199254740992"'),
    ],
)
def test_standard_writes_js_unsafe_longs_as_strings(value, text):
    assert dumps_standard({"t": value}) == b'{"t":' + text + b"}"


def test_standard_omits_null_values():
    assert dumps_standard({"a": None, "b": [None]}) == b'{"b":[null]}'


# ---------------------------------------------------------------------------------------------
# properties

_int_keys = st.integers(-(2**31), 2**31)
_str_keys = st.text(max_size=8)
_scalars = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=12))
#: maps may mix int and str keys: the legacy dialect keeps 1 and "1" apart
_mixed_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.one_of(_int_keys, _str_keys), inner, max_size=4)
    ),
    max_leaves=20,
)
#: one key type per map: quoted, 1 and "1" would collide (as they would in Java)
_uniform_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(_int_keys, inner, max_size=4),
        st.dictionaries(_str_keys, inner, max_size=4),
    ),
    max_leaves=20,
)


def _standardise(v):
    """What strict JSON makes of a value written in the standard dialect."""
    if isinstance(v, dict):
        return {str(k): _standardise(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_standardise(x) for x in v]
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2**53 - 1:
        return str(v)
    return v


@settings(max_examples=150, deadline=None)
@given(_mixed_values)
def test_legacy_round_trips_through_loads(value):
    assert loads(dumps_legacy(value)) == value


@settings(max_examples=150, deadline=None)
@given(_uniform_values)
def test_standard_is_strict_ascii_json(value):
    text = dumps_standard(value)
    assert text.isascii()
    assert json.loads(text) == _standardise(value)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_uniform_values)
def test_standard_writes_byte_for_byte_what_the_stdlib_encoder_writes(value):
    # dumps_standard lets orjson write whenever its output is ASCII; the reference is json.dumps with
    # ensure_ascii (control characters, quotes and backslashes included), escapes upper-cased, '/' escaped
    from common.protocol import fastjson

    prepared = fastjson._prepare(value, standard=True)
    text = json.dumps(prepared, ensure_ascii=True, separators=(",", ":"))
    text = fastjson._LOWER_HEX_ESCAPE.sub(fastjson._upper_hex, text).replace("/", "\\/")
    assert dumps_standard(value) == text.encode("ascii")


# ---------------------------------------------------------------------------------------------
# the standard dialect of 5.4.0 and later (fastjson2's BrowserCompatible)

#: one broker group named each of these: every name as the body of Apache RocketMQ 5.5.0's
#: ``TopicRouteData.encode(BrowserCompatible, MapSortField)`` (fastjson2) writes it, and as fastjson's
#: BrowserCompatible (5.3.3 and before) does, escaping non-ASCII, "/" and DEL
FASTJSON2_NAMES = [
    ("é ü 主题", "é ü 主题", "\\u00E9 \\u00FC \\u4E3B\\u9898"),
    ("\U0001f600", "\U0001f600", "\\uD83D\\uDE00"),
    ("ctl\x01\x1f\x7f", "ctl\\u0001\\u001f\x7f", "ctl\\u0001\\u001F\\u007F"),
    ('quote"back\\slash/', 'quote\\"back\\\\slash/', 'quote\\"back\\\\slash\\/'),
    ("line\u2028sep\u2029", "line\u2028sep\u2029", "line\\u2028sep\\u2029"),
    ("<script>&amp;", "<script>&amp;", "<script>&amp;"),
]


def _one_group_route(name: str) -> dict:
    return {
        "brokerDatas": [{"brokerAddrs": {0: name}, "brokerName": name, "cluster": "C", "enableActingMaster": False}],
        "filterServerTable": {},
        "queueDatas": [{"brokerName": name, "perm": 6, "readQueueNums": 4, "topicSysFlag": 0, "writeQueueNums": 4}],
    }


def _as_java(written: str) -> bytes:
    return (
        f'{{"brokerDatas":[{{"brokerAddrs":{{"0":"{written}"}},"brokerName":"{written}","cluster":"C",'
        f'"enableActingMaster":false}}],"filterServerTable":{{}},"queueDatas":[{{"brokerName":"{written}",'
        '"perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}'
    ).encode()


@pytest.mark.parametrize("name, v5_5, v5_3", FASTJSON2_NAMES)
def test_standard_routes_as_5_5_and_as_5_3_write_them(name, v5_5, v5_3):
    assert dumps_standard_fastjson2(_one_group_route(name)) == _as_java(v5_5)
    assert dumps_standard(_one_group_route(name)) == _as_java(v5_3)


def test_fastjson2_standard_strings_longs_and_lone_surrogates():
    big = {"big": 1 << 60, "safe": 9007199254740991, "unsafe": 9007199254740992, "neg": -(1 << 60)}
    assert dumps_standard_fastjson2(big) == (
        b'{"big":"1152921504606846976","neg":"-1152921504606846976","safe":9007199254740991,'
        b'"unsafe":"9007199254740992"}'
    )
    assert dumps_standard_fastjson2({"ctl": "\x00\x08\x0b\x1f", "lone": "a\ud800b"}) == (
        b'{"ctl":"\\u0000\\b\\u000b\\u001f","lone":"a?b"}'
    )
