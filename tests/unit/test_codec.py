import struct

import pytest

from common.protocol.codec import (
    MAX_LENGTH,
    FrameDecoder,
    LocalProtocolError,
    RemoteProtocolError,
    TlsRecordError,
    decode_frame,
    encode,
)
from common.protocol.codes import FRAME_MAX_LENGTH, Flag, LanguageCode, RequestCode, SerializeType, Version
from common.protocol.command import RemotingCommand, request
from tests.support.frames import assert_truncation_changes_nothing, json_frame

V1_JSON_FRAME = bytes.fromhex(
    "00000087000000837b22636f6465223a3130352c226578744669656c6473223a7b22746f706963223a22546f70696354"
    "657374227d2c22666c6167223a302c226c616e6775616765223a224a415641222c226f7061717565223a312c2273657269"
    "616c697a655479706543757272656e74525043223a224a534f4e222c2276657273696f6e223a3437397d"
)
V1_ROCKETMQ_FRAME = bytes.fromhex(
    "0000002d0100002900690001df000000010000000000000000000000140005746f70696300000009546f70696354657374"
)


def rmq_header(code=105, lang=0, version=479, opaque=1, flag=0, remark=b"", ext=b"", remark_len=None, ext_len=None):
    return (
        struct.pack(">hbhiii", code, lang, version, opaque, flag, len(remark) if remark_len is None else remark_len)
        + remark
        + struct.pack(">i", len(ext) if ext_len is None else ext_len)
        + ext
    )


def ext_entry(key: bytes, value: bytes) -> bytes:
    return struct.pack(">h", len(key)) + key + struct.pack(">i", len(value)) + value


# ---------------------------------------------------------------------------------------------
# encode


def test_encode_json_request_is_byte_identical_to_java():
    # the vectors' frames are a 5.3.3 peer's
    cmd = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}, opaque=1, version=Version.V5_3_3)
    assert encode(cmd) == V1_JSON_FRAME


def test_encode_rocketmq_request_is_byte_identical_to_java():
    cmd = request(
        RequestCode.GET_ROUTEINFO_BY_TOPIC,
        {"topic": "TopicTest"},
        opaque=1,
        version=Version.V5_3_3,
        serialize_type=SerializeType.ROCKETMQ,
    )
    assert encode(cmd) == V1_ROCKETMQ_FRAME


def test_encode_json_header_key_order_and_null_omission():
    cmd = RemotingCommand(code=22, opaque=8, flag=Flag.RESPONSE, version=479, remark="No config", ext_fields={})
    header = encode(cmd)[8:]
    assert header == (
        b'{"code":22,"extFields":{},"flag":1,"language":"JAVA","opaque":8,"remark":"No config",'
        b'"serializeTypeCurrentRPC":"JSON","version":479}'
    )
    assert b"remark" not in encode(RemotingCommand(code=0))
    assert b"extFields" not in encode(RemotingCommand(code=0))


def test_encode_writes_raw_utf8_and_raw_slash_in_json_header():
    frame = encode(RemotingCommand(code=1, remark="é https://x/y\n"))
    assert '"remark":"é https://x/y\\n"'.encode() in frame


def test_encode_appends_body_and_counts_it_in_the_length():
    frame = encode(RemotingCommand(code=0, body=b"xyz"))
    length, word = struct.unpack(">II", frame[:8])
    assert length == len(frame) - 4
    assert frame.endswith(b"xyz") and word & 0xFFFFFF == len(frame) - 8 - 3


def test_encode_stringifies_ext_values_java_style_and_drops_nulls():
    cmd = RemotingCommand(code=0, ext_fields={"n": 5, "b": True, "s": "x", "none": None})  # type: ignore[dict-item]
    assert decode_frame(encode(cmd)).ext_fields == {"n": "5", "b": "true", "s": "x"}


def test_encode_refuses_a_frame_over_the_cap():
    big = RemotingCommand(code=0, body=bytes(FRAME_MAX_LENGTH))
    with pytest.raises(LocalProtocolError, match="limit"):
        encode(big)


@pytest.mark.parametrize(
    "cmd",
    [
        RemotingCommand(code=2**31),
        RemotingCommand(code=0, opaque=-(2**31) - 1),
        RemotingCommand(code=0, language=99),  # type: ignore[arg-type]
        RemotingCommand(code=40000, serialize_type=SerializeType.ROCKETMQ),
        RemotingCommand(code=0, version=70000, serialize_type=SerializeType.ROCKETMQ),
        RemotingCommand(code=0, serialize_type=7),  # type: ignore[arg-type]
        RemotingCommand(code=0, ext_fields={"k" * 40000: "v"}, serialize_type=SerializeType.ROCKETMQ),
    ],
)
def test_encode_misuse_raises_local_protocol_error(cmd):
    with pytest.raises(LocalProtocolError):
        encode(cmd)


# ---------------------------------------------------------------------------------------------
# decode: JSON header


def test_decode_json_request():
    cmd = decode_frame(V1_JSON_FRAME)
    assert cmd == RemotingCommand(
        code=105, opaque=1, flag=0, version=479, ext_fields={"topic": "TopicTest"}, language=LanguageCode.JAVA
    )
    assert cmd.body is None and cmd.unknown == {}


def test_decode_rocketmq_request_equals_the_json_one():
    cmd = decode_frame(V1_ROCKETMQ_FRAME)
    assert cmd.serialize_type == SerializeType.ROCKETMQ
    cmd.serialize_type = SerializeType.JSON
    assert cmd == decode_frame(V1_JSON_FRAME)


def test_decode_json_missing_keys_take_java_defaults():
    cmd = decode_frame(json_frame(b'{"code":105}'))
    assert (cmd.opaque, cmd.flag, cmd.version, cmd.language, cmd.remark, cmd.ext_fields) == (
        0,
        0,
        0,
        LanguageCode.JAVA,
        None,
        None,
    )


def test_decode_json_language_by_ordinal_and_unknown_name():
    assert decode_frame(json_frame(b'{"code":1,"language":1}')).language == LanguageCode.CPP
    cmd = decode_frame(json_frame(b'{"code":1,"language":"COBOL"}'))
    assert cmd.language == LanguageCode.OTHER and cmd.unknown == {"language": "COBOL"}


def test_decode_json_keeps_unknown_keys_and_accepts_nulls():
    cmd = decode_frame(json_frame(b'{"code":105,"remark":null,"language":"PYTHON","x":[1],"extFields":{"topic":"T"}}'))
    assert cmd.remark is None and cmd.language == LanguageCode.PYTHON
    assert cmd.unknown == {"x": [1]} and cmd.ext_fields == {"topic": "T"}


def test_decode_json_coerces_ext_values_like_java():
    header = b'{"code":1,"extFields":{"i":5,"f":1.5,"t":true,"n":null,"o":{"a":[1,2]},"s":""}}'
    assert decode_frame(json_frame(header)).ext_fields == {
        "i": "5",
        "f": "1.5",
        "t": "true",
        "o": '{"a":[1,2]}',
        "s": "",
    }


def test_decode_json_header_with_bare_int_keys():
    cmd = decode_frame(json_frame(b'{"code":1,"extFields":{"m":{0:"a"},7:"x"}}'))
    assert cmd.ext_fields == {"m": '{"0":"a"}', "7": "x"}


def test_decode_json_empty_body_is_none_and_body_is_kept():
    assert decode_frame(json_frame(b'{"code":1}')).body is None
    assert decode_frame(json_frame(b'{"code":1}', b"\x00\x01")).body == b"\x00\x01"


# ---------------------------------------------------------------------------------------------
# decode: ROCKETMQ header


def test_decode_rocketmq_empty_strings_are_absent():
    ext = ext_entry(b"a", b"") + ext_entry(b"", b"v") + ext_entry(b"k", b"v")
    cmd = decode_frame(json_frame(rmq_header(remark=b"", ext=ext), type_byte=1))
    assert cmd.remark is None and cmd.ext_fields == {"k": "v"}


def test_decode_rocketmq_remark_utf8_and_unknown_language():
    cmd = decode_frame(json_frame(rmq_header(lang=99, remark="é".encode()), type_byte=1))
    assert cmd.remark == "é" and cmd.ext_fields is None
    assert cmd.language == LanguageCode.OTHER and cmd.unknown == {"language": 99}


def test_encode_rocketmq_empty_ext_decodes_as_none():
    cmd = RemotingCommand(code=0, ext_fields={}, remark="", serialize_type=SerializeType.ROCKETMQ)
    back = decode_frame(encode(cmd))
    assert back.ext_fields is None and back.remark is None


def test_numeric_strings_in_integer_header_fields_are_read_as_fastjson_does():
    cmd = decode_frame(json_frame(b'{"code":"105","opaque":"7"}'))
    assert (cmd.code, cmd.opaque) == (105, 7)


# ---------------------------------------------------------------------------------------------
# decode: garbage

BAD_FRAMES = {
    "length below 4": struct.pack(">II", 3, 0),
    "unknown type byte": json_frame(b'{"code":1}', type_byte=2),
    "header longer than frame": struct.pack(">II", 10, 7) + b"{}" + b"\x00" * 4,
    "bad utf8": json_frame(b'{"code":1,"remark":"\xff"}'),
    "bad json": json_frame(b'{"code":'),
    # str.isdigit() says yes to "²"; int() and fastjson say no
    "superscript digit as opaque": json_frame('{"code":1,"opaque":"\u00b2"}'.encode()),
    "empty json header": json_frame(b""),
    "header is an array": json_frame(b"[1]"),
    "code is a non-numeric string": json_frame(b'{"code":"abc"}'),
    "code is a bool": json_frame(b'{"code":true}'),
    "code is a float": json_frame(b'{"code":1.5}'),
    "opaque beyond int32": json_frame(b'{"code":1,"opaque":2147483648}'),
    "flag is an object": json_frame(b'{"code":1,"flag":{}}'),
    "version is a list": json_frame(b'{"code":1,"version":[]}'),
    "extFields is a list": json_frame(b'{"code":1,"extFields":[]}'),
    "language is an object": json_frame(b'{"code":1,"language":{}}'),
    "rmq header too short": json_frame(rmq_header()[:20], type_byte=1),
    "rmq remark too long": json_frame(rmq_header(remark_len=100), type_byte=1),
    "rmq remark negative": json_frame(rmq_header(remark_len=-1), type_byte=1),
    "rmq ext too long": json_frame(rmq_header(ext_len=5), type_byte=1),
    "rmq ext negative": json_frame(rmq_header(ext_len=-5), type_byte=1),
    "rmq ext key length cut": json_frame(rmq_header(ext=b"\x00"), type_byte=1),
    "rmq ext key too long": json_frame(rmq_header(ext=b"\x00\x09ab"), type_byte=1),
    "rmq ext value length cut": json_frame(rmq_header(ext=b"\x00\x01a\x00"), type_byte=1),
    "rmq ext value too long": json_frame(rmq_header(ext=b"\x00\x01a\x00\x00\x00\x09b"), type_byte=1),
    "rmq ext negative key": json_frame(rmq_header(ext=b"\xff\xff"), type_byte=1),
    "rmq remark bad utf8": json_frame(rmq_header(remark=b"\xc3"), type_byte=1),
}


@pytest.mark.parametrize("frame", BAD_FRAMES.values(), ids=BAD_FRAMES.keys())
def test_garbage_raises_remote_protocol_error(frame):
    with pytest.raises(RemoteProtocolError):
        decode_frame(frame)


def test_oversize_length_word_alone_is_rejected():
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">I", FRAME_MAX_LENGTH - 3))  # one more than the largest legal length
    with pytest.raises(RemoteProtocolError, match="exceeds"):
        decoder.next_command()


def test_oversize_length_is_rejected_from_the_first_8_bytes():
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">II", FRAME_MAX_LENGTH + 1, 10))
    with pytest.raises(RemoteProtocolError):
        decoder.next_command()


@pytest.mark.parametrize(
    "first",
    [
        bytes.fromhex("16030100f4010000f00303"),  # a ClientHello record (version 3.1), as Java and OpenSSL send
        bytes.fromhex("16030300"),  # its first 4 bytes alone (record version 3.3)
    ],
)
def test_a_tls_handshake_where_a_frame_length_belongs_is_named_as_such(first):
    decoder = FrameDecoder()
    decoder.feed(first)
    with pytest.raises(TlsRecordError, match=r"frame length \d+ exceeds the limit \d+: a TLS handshake record"):
        decoder.next_command()


@pytest.mark.parametrize("first", [bytes.fromhex("1703030020000000"), bytes.fromhex("1604010000000000")])
def test_other_oversize_lengths_are_not_taken_for_tls(first):
    decoder = FrameDecoder()
    decoder.feed(first)  # a TLS application-data record; a 0x16 not followed by 3
    with pytest.raises(RemoteProtocolError, match="exceeds the limit") as raised:
        decoder.next_command()
    assert type(raised.value) is RemoteProtocolError


def test_largest_legal_length_waits_for_the_rest():
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">II", MAX_LENGTH, 10))
    assert MAX_LENGTH == 16 * 1024 * 1024 - 4
    assert decoder.next_command() is None


def test_header_length_checked_before_the_body_arrives():
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">II", 100, 97))
    with pytest.raises(RemoteProtocolError, match="header length"):
        decoder.next_command()


def test_a_header_over_the_decoders_limit_is_refused_from_the_first_8_bytes():
    at_limit = encode(request(105, {"topic": "t" * 80}, opaque=1))
    limit = struct.unpack_from(">I", at_limit, 4)[0] & 0xFFFFFF  # this frame's header is exactly at the limit
    decoder = FrameDecoder(max_header=limit)
    decoder.feed(at_limit)
    assert decoder.next_command().ext_fields == {"topic": "t" * 80}
    decoder.feed(struct.pack(">II", 4 + limit + 1, limit + 1))  # no byte of the header needed to judge it
    with pytest.raises(RemoteProtocolError, match=f"header of {limit + 1} bytes exceeds the limit of {limit}"):
        decoder.next_command()


def test_decoder_stays_broken_after_an_error():
    decoder = FrameDecoder()
    decoder.feed(BAD_FRAMES["bad json"])
    with pytest.raises(RemoteProtocolError):
        decoder.next_command()
    decoder.feed(V1_JSON_FRAME)
    with pytest.raises(RemoteProtocolError):
        decoder.next_command()


# ---------------------------------------------------------------------------------------------
# streaming


def test_pipelined_frames_come_out_in_order():
    frames = [encode(request(105, {"topic": f"T{i}"}, opaque=i)) for i in range(5)]
    decoder = FrameDecoder()
    decoder.feed(b"".join(frames) + frames[0][:3])
    got = []
    while (cmd := decoder.next_command()) is not None:
        got.append(cmd.opaque)
    assert got == [0, 1, 2, 3, 4]
    assert decoder.buffered == 3
    decoder.feed(frames[0][3:])
    assert decoder.next_command().opaque == 0
    assert decoder.buffered == 0


def test_repeated_header_shapes_keep_each_frames_own_opaque():
    frames = [
        encode(request(322, {"brokerAddr": "10.0.0.1:10911"}, opaque=o, serialize_type=t))
        for t in SerializeType
        for o in (1, 2, -5, 2**31 - 1)
    ]
    assert [decode_frame(f).opaque for f in frames] == [1, 2, -5, 2**31 - 1] * 2


@pytest.mark.parametrize("top_level", [b"", b',"opaque":0', b',"opaque":9'])
def test_an_opaque_key_in_ext_fields_is_not_taken_for_the_opaque(top_level):
    # The decoder remembers headers by everything but the opaque; the first "opaque": here is an
    # extFields key, and a frame differing only in it is a different header, not a new opaque.
    for decoy in (7, 8, 7, 8):  # a shape is remembered when it comes back
        header = b'{"code":105,"extFields":{"opaque":%d}%b,"flag":0}' % (decoy, top_level)
        cmd = decode_frame(json_frame(header))
        assert cmd.ext_fields == {"opaque": str(decoy)}
        assert cmd.opaque == (9 if top_level.endswith(b"9") else 0)


def test_a_non_canonical_opaque_is_judged_by_the_full_parser():
    # leading zeros are not JSON: the shortcut must not make such a header acceptable
    good = decode_frame(json_frame(b'{"code":105,"opaque":7}'))
    assert good.opaque == 7
    with pytest.raises(RemoteProtocolError):
        decode_frame(json_frame(b'{"code":105,"opaque":007}'))


@pytest.mark.parametrize("frame", [V1_JSON_FRAME, V1_ROCKETMQ_FRAME])
def test_truncation_at_every_offset_changes_nothing(frame):
    assert_truncation_changes_nothing(frame)


def test_decode_frame_rejects_incomplete_and_trailing_bytes():
    with pytest.raises(RemoteProtocolError, match="incomplete"):
        decode_frame(V1_JSON_FRAME[:-1])
    with pytest.raises(RemoteProtocolError, match="after the frame"):
        decode_frame(V1_JSON_FRAME + b"\x00")


def test_codec_module_does_no_io():
    import common.protocol.codec as codec

    source = open(codec.__file__, encoding="utf-8").read()
    assert "import socket" not in source and "import asyncio" not in source


# ---------------------------------------------------------------------------------------------
# body limits: an oversized body is refused from its header and dropped as it arrives


LIMITS = {200: 1000}


def test_body_over_its_codes_limit_is_handed_out_at_its_header_and_dropped():
    big = encode(request(200, {"k": "v"}, b"x" * 5000, opaque=7))
    after = encode(request(105, {"topic": "T"}, opaque=8))
    header_end = len(big) - 5000
    decoder = FrameDecoder(LIMITS)
    decoder.feed(big[: header_end - 1])
    assert decoder.next_command() is None  # the header is not all in yet
    decoder.feed(big[header_end - 1 : header_end + 10])
    cmd = decoder.next_command()
    assert (cmd.code, cmd.opaque, cmd.ext_fields, cmd.body, cmd.body_dropped) == (200, 7, {"k": "v"}, None, 5000)
    assert decoder.buffered == 0
    for i in range(header_end + 10, len(big), 700):  # the rest of the body is counted off, never kept
        decoder.feed(big[i : i + 700])
        assert decoder.buffered == 0
        assert decoder.next_command() is None
    decoder.feed(after)
    assert decoder.next_command().opaque == 8


def test_body_limit_applies_to_whole_frames_and_the_tail_of_a_chunk_is_kept():
    big = encode(request(200, None, b"x" * 5000, opaque=1))
    after = encode(request(105, {"topic": "T"}, opaque=2))
    decoder = FrameDecoder(LIMITS)
    decoder.feed(big + after)
    first = decoder.next_command()
    assert (first.body, first.body_dropped) == (None, 5000)
    assert decoder.next_command().opaque == 2
    decoder = FrameDecoder(LIMITS)
    cut = len(big) - 4900  # the header and 100 bytes of the body
    decoder.feed(big[:cut])
    assert decoder.next_command().body_dropped == 5000
    decoder.feed(big[cut:] + after[:10])  # the end of the dropped body and the start of the next frame
    assert decoder.buffered == 10
    decoder.feed(after[10:])
    assert decoder.next_command().opaque == 2


def test_bodies_within_limits_and_other_codes_are_untouched():
    decoder = FrameDecoder(LIMITS)
    for frame in (
        encode(request(200, None, b"y" * 1000, opaque=1)),  # at the limit
        encode(request(105, None, b"z" * 5000, opaque=2)),  # no limit for this code
    ):
        for i in range(0, len(frame), 300):
            decoder.feed(frame[i : i + 300])
            cmd = decoder.next_command()
        assert cmd is not None and cmd.body_dropped == 0 and len(cmd.body) in (1000, 5000)
    response = request(200, None, b"r" * 5000, opaque=3)
    response.flag = 1  # a response is never a request the limits are for
    decoder.feed(encode(response))
    assert len(decoder.next_command().body) == 5000


@pytest.mark.parametrize("body_size", [5000, 300_000], ids=["small", "large"])
@pytest.mark.parametrize("chunk", [None, 700], ids=["whole", "chunks"])
def test_a_header_looked_at_for_its_limit_is_parsed_once(monkeypatch, body_size, chunk):
    from common.protocol import codec

    parsed = []
    decode = codec._decode_header
    monkeypatch.setattr(codec, "_decode_header", lambda *a: parsed.append(a) or decode(*a))
    body = bytes(range(256)) * (body_size // 256)
    frame = encode(request(103, {"brokerName": "b"}, body, opaque=9))
    decoder, got = FrameDecoder(LIMITS), []
    for i in range(0, len(frame), chunk or len(frame)):
        decoder.feed(frame[i : i + (chunk or len(frame))])
        got.append(decoder.next_command())
    assert [(c.opaque, c.ext_fields, c.body) for c in got if c is not None] == [(9, {"brokerName": "b"}, body)]
    assert len(parsed) == 1 and decoder.buffered == 0


# ---------------------------------------------------------------------------------------------
# large frames: received into memory of their own, copied out once


@pytest.mark.parametrize("sizes", [(256 * 1024,), (1000, 70_000, 3, 300_000), (4096,)], ids=["reads", "mixed", "small"])
def test_a_large_frame_fed_in_any_chunks_comes_out_whole_with_the_next_frame(sizes):
    from common.protocol.codec import LARGE_FRAME_BYTES

    body = bytes(range(256)) * (4 * LARGE_FRAME_BYTES // 256)  # 1 MiB, every offset distinct mod 256
    stream = encode(request(103, {"brokerName": "b"}, body, opaque=1)) + encode(request(105, {"topic": "T"}, opaque=2))
    decoder, got, fed, i = FrameDecoder(), [], 0, 0
    while fed < len(stream):
        n = sizes[i % len(sizes)]
        decoder.feed(stream[fed : fed + n])
        fed, i = fed + n, i + 1
        while (cmd := decoder.next_command()) is not None:
            got.append(cmd)
        assert decoder.buffered == min(fed, len(stream)) - sum(
            len(encode(request(c.code, c.ext_fields, c.body, opaque=c.opaque))) for c in got
        )
    assert [(c.opaque, c.body) for c in got] == [(1, body), (2, None)]
    assert got[0].ext_fields == {"brokerName": "b"}


def test_a_large_frame_can_be_received_straight_into_its_own_memory_up_to_its_end():
    from common.protocol.codec import LARGE_FRAME_BYTES

    body = bytes(range(256)) * (4 * LARGE_FRAME_BYTES // 256)
    large = encode(request(103, {"brokerName": "b"}, body, opaque=1))
    stream = large + encode(request(105, {"topic": "T"}, opaque=2))
    decoder = FrameDecoder()
    assert decoder.receive_buffer(65536) is None and not decoder.receiving_large_frame
    decoder.feed(stream[:1000])  # the header is in: the frame's memory is ready, of its declared length
    assert decoder.next_command() is None and decoder.receiving_large_frame
    fed = 1000
    while (view := decoder.receive_buffer(300_000)) is not None:
        assert 0 < len(view) <= 300_000 and fed + len(view) <= len(large)  # never past the frame's end
        view[:] = stream[fed : fed + len(view)]
        decoder.received(len(view))
        fed += len(view)
        assert decoder.buffered == fed
        if fed < len(large):
            assert decoder.next_command() is None
        else:
            assert decoder.next_command().body == body
    assert fed == len(large) and not decoder.receiving_large_frame and decoder.buffered == 0
    decoder.feed(stream[fed:])  # the next frame goes by feed again
    assert decoder.next_command().opaque == 2
