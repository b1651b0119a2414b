"""Every golden frame and body of the spec (section 6, tests/vectors/) against our codec.

The vectors were produced by fastjson over bean replicas of the Java classes, so byte equality here
means byte equality with a Java name server.
"""

import json
import struct

import pytest

from common.protocol import fastjson
from common.protocol.bodies import (
    body_crc32,
    decode_register_broker_body,
    encode_data_version,
    encode_register_broker_body,
    encode_route,
    encode_topic_list,
)
from common.protocol.codec import FrameDecoder, RemoteProtocolError, decode_frame, encode
from common.protocol.codes import FRAME_MAX_LENGTH, SerializeType
from common.protocol.command import RemotingCommand
from common.protocol.types import BrokerData, DataVersion, QueueData, TopicConfig, TopicRouteData
from tests.support.frames import assert_truncation_changes_nothing
from tests.support.node import VECTORS as VECTORS_DIR

VECTORS = json.loads((VECTORS_DIR / "vectors.json").read_text(encoding="utf-8"))
FRAMES = [f for f in VECTORS["frames"] if "frame_hex" in f]
V1_RESPONSE = next(f for f in FRAMES if f["name"].startswith("GET_ROUTEINFO_BY_TOPIC response SUCCESS"))
V7 = next(f for f in VECTORS["frames"] if f["name"].startswith("compressed RegisterBrokerBody"))
REGISTER_BODY = (VECTORS_DIR / "register_broker_body.json").read_bytes()


def feed_three_ways(frame: bytes) -> RemotingCommand:
    """Decode ``frame`` whole, one byte at a time and followed by more bytes; all must agree."""
    decoder = FrameDecoder()
    decoder.feed(frame)
    whole = decoder.next_command()
    assert whole is not None
    assert decoder.next_command() is None and decoder.buffered == 0

    decoder = FrameDecoder()
    for i in range(len(frame) - 1):
        decoder.feed(frame[i : i + 1])
        assert decoder.next_command() is None, f"a command before the last byte (offset {i})"
    decoder.feed(frame[-1:])
    assert decoder.next_command() == whole

    decoder = FrameDecoder()
    decoder.feed(frame + frame[:7])
    assert decoder.next_command() == whole
    assert decoder.next_command() is None and decoder.buffered == 7  # the tail waits for the next call
    decoder.feed(frame[7:])
    assert decoder.next_command() == whole and decoder.buffered == 0
    return whole


def _header(frame: bytes) -> bytes:
    (word,) = struct.unpack_from(">I", frame, 4)
    return frame[8 : 8 + (word & 0xFFFFFF)]


# ---------------------------------------------------------------------------------------------
# frames


@pytest.mark.parametrize("vector", FRAMES, ids=[f["name"] for f in FRAMES])
def test_golden_frame_decodes_and_re_encodes(vector):
    frame = bytes.fromhex(vector["frame_hex"])
    cmd = feed_three_ways(frame)
    if "header_json" in vector:
        expected = json.loads(vector["header_json"])
        assert cmd.code == expected["code"] and cmd.opaque == expected["opaque"] and cmd.flag == expected["flag"]
        assert cmd.ext_fields == expected.get("extFields") and cmd.remark == expected.get("remark")
        assert cmd.version == expected["version"] and cmd.language.name == expected["language"]
        if "body_text" in vector:
            assert cmd.body == vector["body_text"].encode()
    again = encode(cmd)
    assert again[8 + len(_header(again)) :] == frame[8 + len(_header(frame)) :], "body differs"
    if len(cmd.ext_fields or {}) <= 1:
        assert again == frame
    else:  # Java writes extFields in HashMap order: only JSON equivalence is promised
        assert json.loads(_header(again)) == json.loads(_header(frame))
        assert decode_frame(again) == cmd


@pytest.mark.parametrize("vector", FRAMES, ids=[f["name"] for f in FRAMES])
def test_golden_frame_truncated_anywhere_changes_nothing(vector):
    assert_truncation_changes_nothing(bytes.fromhex(vector["frame_hex"]))


def test_rocketmq_and_json_v1_requests_are_the_same_command():
    json_cmd = decode_frame(bytes.fromhex(FRAMES[0]["frame_hex"]))
    rmq_cmd = decode_frame(bytes.fromhex(FRAMES[1]["frame_hex"]))
    assert rmq_cmd.serialize_type == SerializeType.ROCKETMQ
    rmq_cmd.serialize_type = SerializeType.JSON
    assert rmq_cmd == json_cmd


def test_v2_frame_lengths():
    frame = bytes.fromhex(next(f for f in FRAMES if "TOPIC_NOT_EXIST" in f["name"])["frame_hex"])
    assert struct.unpack(">II", frame[:8]) == (0xFB, 0xF7)
    assert "\nSee https://" in decode_frame(frame).remark


SYNTHETIC = {
    "json, empty body": RemotingCommand(code=106, opaque=5, version=479),
    "json, large body": RemotingCommand(code=103, opaque=9, ext_fields={"k": "v"}, body=bytes(range(256)) * 400),
    "rocketmq, remark and ext": RemotingCommand(
        code=1,
        opaque=3,
        flag=1,
        remark="boom é",
        ext_fields={"a": "1", "b": "x"},
        serialize_type=SerializeType.ROCKETMQ,
    ),
    "rocketmq, body": RemotingCommand(code=0, body=b"\x00" * 1000, serialize_type=SerializeType.ROCKETMQ),
}


@pytest.mark.parametrize("cmd", SYNTHETIC.values(), ids=SYNTHETIC.keys())
def test_synthetic_frames_through_the_shared_helper(cmd):
    assert feed_three_ways(encode(cmd)) == cmd


@pytest.mark.parametrize("prefix_len", [4, 8])
def test_oversize_length_word_alone_is_a_protocol_error(prefix_len):
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">II", FRAME_MAX_LENGTH - 3, 0)[:prefix_len])
    with pytest.raises(RemoteProtocolError):
        decoder.next_command()


# ---------------------------------------------------------------------------------------------
# bodies


def _v1_route() -> TopicRouteData:
    return TopicRouteData(
        queue_datas=[QueueData("broker-a", 4, 4, 6)],
        broker_datas=[BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"})],
    )


def test_v1_route_body_standard_and_legacy_byte_exact():
    assert encode_route(_v1_route(), standard=True) == V1_RESPONSE["body_text"].encode()
    legacy_key = next(k for k in V1_RESPONSE if k.startswith("legacy_body"))
    assert encode_route(_v1_route(), standard=False) == V1_RESPONSE[legacy_key].encode()


def test_escaping_vectors_byte_exact():
    route = TopicRouteData(
        queue_datas=[],
        broker_datas=[
            BrokerData(
                "C",
                "bé",
                {10: "10.0.0.3:10911", 0: "10.0.0.1:10911", 1: "10.0.0.2:10911"},
                zone_name="zone/1",
                enable_acting_master=True,
            )
        ],
        order_topic_conf="bé:4",
    )
    assert encode_route(route, standard=True) == V1_RESPONSE["std_json_with_escapes"].encode()
    assert encode_route(route, standard=False) == V1_RESPONSE["legacy_json_same"].encode()
    assert fastjson.dumps_standard({"t": 9007199254740993}) == V1_RESPONSE["big_long_std"].encode()
    legacy, std = V1_RESPONSE["int_key_map_legacy"].split(" std=")
    assert fastjson.dumps_legacy({1: 4, 0: 3}) == legacy.encode()
    assert fastjson.dumps_standard({1: 4, 0: 3}) == std.encode()


def test_legacy_json_bodies_byte_exact():
    bodies = VECTORS["json_bodies"]
    assert encode_topic_list(["TopicTest"]) == bodies["TopicList_json"].encode()
    system = encode_topic_list(["broker-a", "DefaultCluster"], "127.0.0.1:10911")
    assert system == bodies["SystemTopicList_json"].encode()
    assert encode_data_version(DataVersion(5, 0, 1700000000000)) == bodies["DataVersion_json"].encode()
    member_group = bodies["GetBrokerMemberGroupResponseBody_json"]
    assert fastjson.dumps_legacy(fastjson.loads(member_group)) == member_group.encode()
    cluster_info = next(f for f in FRAMES if f["name"].startswith("GET_BROKER_CLUSTER_INFO response"))["body_text"]
    assert fastjson.dumps_legacy(fastjson.loads(cluster_info)) == cluster_info.encode()


def test_register_broker_body_vector():
    assert len(REGISTER_BODY) == 623
    assert body_crc32(REGISTER_BODY) == 1733174871
    v3_hex = next(f for f in FRAMES if f["name"].startswith("REGISTER_BROKER request"))["frame_hex"]
    v3 = decode_frame(bytes.fromhex(v3_hex))
    assert v3.body == REGISTER_BODY and v3.ext("bodyCrc32") == str(body_crc32(v3.body))
    rb = decode_register_broker_body(REGISTER_BODY, compressed=False, version=v3.version)
    assert rb.data_version == DataVersion(5, 0, 1700000000000)
    assert rb.topic_config_table == {
        "TopicTest": TopicConfig("TopicTest", 4, 4, 6),
        "DefaultCluster": TopicConfig("DefaultCluster", 16, 16, 7),
    }
    assert rb.filter_server_list == [] and rb.topic_queue_mapping_info_map == {}
    assert decode_register_broker_body(encode_register_broker_body(rb), compressed=False, version=479) == rb


def test_v7_compressed_register_body():
    blob = bytes.fromhex(V7["deflated_hex"])
    plaintext = bytes.fromhex(V7["name"].split("plaintext_hex=")[1])
    rb = decode_register_broker_body(blob, compressed=True, version=413)
    assert rb.data_version == DataVersion(5, 0, 1700000000000)
    assert rb.topic_config_table == {"TopicTest": TopicConfig("TopicTest", 4, 4, 6)}
    assert rb.filter_server_list == [] and rb.topic_queue_mapping_info_map == {}
    assert V7["topicconfig_line"].encode() in plaintext
    assert encode_register_broker_body(rb, compressed=True, version=479) == blob
