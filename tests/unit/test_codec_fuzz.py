"""Property tests: peer bytes give commands or RemoteProtocolError, never anything else."""

import dataclasses
import json
import re
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.protocol import codec
from common.protocol.codec import FrameDecoder, RemoteProtocolError, decode_frame, encode
from common.protocol.codes import LanguageCode, SerializeType
from common.protocol.command import RemotingCommand
from tests.support.frames import json_frame
from tests.support.node import VECTORS

GOLDEN = [
    bytes.fromhex(f["frame_hex"])
    for f in json.loads((VECTORS / "vectors.json").read_text(encoding="utf-8"))["frames"]
    if "frame_hex" in f
]
FUZZ = settings(max_examples=300, deadline=None)


def drain(data: bytes, chunk: int) -> list[RemotingCommand]:
    """Feed ``data`` in ``chunk``-sized pieces; return the commands, or stop at a RemoteProtocolError."""
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    try:
        for i in range(0, len(data), chunk):
            decoder.feed(data[i : i + chunk])
            while (cmd := decoder.next_command()) is not None:
                assert isinstance(cmd, RemotingCommand)
                out.append(cmd)
    except RemoteProtocolError:
        pass
    return out


@FUZZ
@given(st.binary(max_size=300), st.integers(1, 64))
def test_random_bytes(data, chunk):
    drain(data, chunk)


@st.composite
def mutated_golden(draw):
    frame = bytearray(draw(st.sampled_from(GOLDEN)))
    for _ in range(draw(st.integers(1, 6))):
        action = draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        pos = draw(st.integers(0, max(len(frame) - 1, 0)))
        if action == "flip" and frame:
            frame[pos] = draw(st.integers(0, 255))
        elif action == "cut":
            del frame[pos:]
        elif action == "insert":
            frame[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del frame[pos : pos + draw(st.integers(1, 8))]
    if draw(st.booleans()) and len(frame) >= 8:
        # keep the length words consistent so the mutation reaches the header parser
        (word,) = struct.unpack_from(">I", frame, 4)
        header_len = min(word & 0xFFFFFF, len(frame) - 8)
        struct.pack_into(">II", frame, 0, len(frame) - 4, (word & 0xFF000000) | header_len)
    return bytes(frame)


@FUZZ
@given(mutated_golden(), st.integers(1, 300))
def test_mutated_golden_frames(data, chunk):
    drain(data, chunk)


_int16 = st.integers(-(2**15), 2**15 - 1)
_int32 = st.integers(-(2**31), 2**31 - 1)
_text = st.text(max_size=20)


@st.composite
def commands(draw):
    return RemotingCommand(
        code=draw(_int16),
        opaque=draw(_int32),
        flag=draw(_int32),
        language=draw(st.sampled_from(LanguageCode)),
        version=draw(_int16),
        remark=draw(st.none() | _text),
        ext_fields=draw(st.none() | st.dictionaries(_text, _text, max_size=5)),
        body=draw(st.none() | st.binary(min_size=1, max_size=64)),
        serialize_type=draw(st.sampled_from(SerializeType)),
    )


def expected_after_round_trip(cmd: RemotingCommand) -> RemotingCommand:
    """ROCKETMQ carries no empty strings: "" reads back as absent, and an empty ext map as none."""
    if cmd.serialize_type != SerializeType.ROCKETMQ:
        return cmd
    ext = {k: v for k, v in (cmd.ext_fields or {}).items() if k and v}
    has_block = any(True for _ in (cmd.ext_fields or {}))
    return RemotingCommand(
        code=cmd.code,
        opaque=cmd.opaque,
        flag=cmd.flag,
        language=cmd.language,
        version=cmd.version,
        remark=cmd.remark or None,
        ext_fields=ext if has_block else None,
        body=cmd.body,
        serialize_type=cmd.serialize_type,
    )


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(commands(), st.integers(1, 50))
def test_encode_decode_round_trip(cmd, chunk):
    decoded = drain(encode(cmd) * 2, chunk)
    assert decoded == [expected_after_round_trip(cmd)] * 2


# --- headers remembered by shape ----------------------------------------------------------------
# The decoder parses a header once per shape (everything but the opaque) and then only splices the
# opaque in.  These check that the shortcut answers exactly what a full parse answers, including for
# headers built to mislead it: an "opaque" key inside extFields, a missing or non-canonical opaque.

_json_scalar = st.none() | st.booleans() | _int32 | st.integers() | _text | st.floats(allow_nan=False)


@st.composite
def json_headers(draw) -> dict:
    header: dict = {}
    for key in draw(st.permutations(["code", "extFields", "flag", "language", "opaque", "remark", "version", "x"])):
        if not draw(st.booleans()):
            continue
        if key == "extFields":
            ext = draw(st.dictionaries(_text, _text | _int32, max_size=3))
            if draw(st.booleans()):
                ext["opaque"] = draw(_int32 | _text)  # a decoy before the real opaque
            header[key] = ext
        elif key == "language":
            header[key] = draw(st.sampled_from(["JAVA", "CPP", "GO", "NOPE"]) | st.integers(0, 20))
        else:
            header[key] = draw(_int32) if key != "remark" and draw(st.booleans()) else draw(_json_scalar)
    return header


def _full_parse(header_text: bytes) -> RemotingCommand | type[RemoteProtocolError]:
    try:
        return codec._parse_json_header(header_text)
    except RemoteProtocolError:
        return RemoteProtocolError


def _decoded(frame: bytes) -> RemotingCommand | type[RemoteProtocolError]:
    try:
        return decode_frame(frame)
    except RemoteProtocolError:
        return RemoteProtocolError


@FUZZ
@given(json_headers(), st.sampled_from([b"0", b"7", b"-1", b"007", b"-0", b"2147483648", b"1.5", b"12e1"]))
def test_remembered_json_shape_decodes_as_a_full_parse(header, other_opaque):
    first = json.dumps(header, separators=(",", ":")).encode()
    # the same header with whatever the decoder takes for the opaque's digits replaced
    second = re.sub(rb'("opaque":)-?[0-9]+', lambda m: m.group(1) + other_opaque, first, count=1)
    for text in (first, second, first):
        got = _decoded(json_frame(text))
        want = _full_parse(text)
        assert got == want
        if isinstance(got, RemotingCommand):
            assert got.unknown == want.unknown


@settings(max_examples=200, deadline=None)
@given(commands(), _int32)
def test_one_shape_many_opaques(cmd, other):
    first, second = encode(cmd), encode(dataclasses.replace(cmd, opaque=other))
    assert decode_frame(first) == expected_after_round_trip(cmd)
    assert decode_frame(second) == expected_after_round_trip(dataclasses.replace(cmd, opaque=other))


# --- what a hostile peer can put into a command -------------------------------------------------
# A lone surrogate reaches us through a JSON "\ud800" escape, and the answer may repeat it (a topic
# name in a remark).  Encoding never fails on it: it is written as '?', as Java's getBytes(UTF_8) does.

_any_text = st.text(st.characters(blacklist_categories=()), max_size=20)


@pytest.mark.slow
@FUZZ
@given(commands(), _any_text, st.dictionaries(_any_text, _any_text, max_size=3))
def test_any_text_in_an_answer_encodes_with_lone_surrogates_as_question_marks(cmd, remark, ext):
    cmd = dataclasses.replace(cmd, remark=remark or None, ext_fields=ext)
    decoded = decode_frame(encode(cmd))

    def java(text):
        return text.encode("utf-8", "replace").decode("utf-8")

    assert decoded.remark == expected_after_round_trip(dataclasses.replace(cmd, remark=java(remark) or None)).remark
    want = {java(k): java(v) for k, v in ext.items()}
    assert decoded.ext_fields == expected_after_round_trip(dataclasses.replace(cmd, ext_fields=want)).ext_fields


@FUZZ
@given(st.sampled_from(["code", "opaque", "flag", "version"]), st.integers(11, 6000), st.booleans())
def test_absurd_integers_in_a_header_are_a_protocol_error(key, digits, quoted):
    number = "9" * digits
    text = ('{"code":105,"%s":%s}' % (key, f'"{number}"' if quoted else number)).encode()
    try:
        decode_frame(json_frame(text))
    except RemoteProtocolError as e:
        assert len(str(e)) < 8000
    else:
        raise AssertionError("a number beyond 32 bits was accepted")
