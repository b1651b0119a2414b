import struct
import zlib

import pytest

from common.protocol import bodies
from common.protocol.bodies import (
    TopicList,
    body_crc32,
    decode_data_version,
    decode_kv_table,
    decode_register_broker_body,
    decode_route,
    decode_topic_list,
    encode_data_version,
    encode_kv_table,
    encode_register_broker_body,
    encode_route,
    encode_topic_list,
)
from common.protocol.types import (
    BodyError,
    BrokerData,
    DataVersion,
    QueueData,
    RegisterBrokerBody,
    TopicConfig,
    TopicRouteData,
)

DV = DataVersion(5, 0, 1_700_000_000_000)
V7_DEFLATED = bytes.fromhex(
    "78da636060b0a8564ace2fcd2b492d52b232d5512a2e492c490d4b2d2acecccf53b232d0512ac9cc4d050ae6162859199a1b"
    "20402d0303032310cb86e41764268700d5289800a19942b0a79fbb8f6b7c88a3bb4235481153742c9064000053e71b65"
)
MAPPING = {
    "bname": "broker-a",
    "currIdMap": {0: 3},
    "dirty": False,
    "epoch": 1,
    "scope": "__global__",
    "topic": "Static",
    "totalQueues": 4,
}


def one_topic_body(**overrides) -> RegisterBrokerBody:
    fields = dict(
        data_version=DV,
        topic_config_table={"TopicTest": TopicConfig("TopicTest", 4, 4, 6)},
        filter_server_list=[],
        topic_queue_mapping_info_map={},
    )
    fields.update(overrides)
    return RegisterBrokerBody(**fields)


def plain(*chunks: bytes, counts: dict[int, int] | None = None) -> bytes:
    """A compressed-format plaintext: int32-length-prefixed chunks; counts[i] = raw int32 before chunk i."""
    out = b""
    for i, c in enumerate(chunks):
        if counts and i in counts:
            out += struct.pack(">i", counts[i])
        out += struct.pack(">i", len(c)) + c
    return out


# ---------------------------------------------------------------------------------------------
# crc


def test_crc32_is_masked_to_31_bits_and_zero_for_no_body():
    assert body_crc32(None) == 0
    assert body_crc32(b"") == 0
    data = b"\x00\x01\x02"
    assert body_crc32(data) == zlib.crc32(data) & 0x7FFFFFFF
    assert all(body_crc32(bytes([i])) < 2**31 for i in range(256))


# ---------------------------------------------------------------------------------------------
# REGISTER_BROKER: JSON forms


def test_register_body_json_round_trip():
    rb = one_topic_body(
        topic_config_table={
            "A": TopicConfig("A", 8, 8, 6, attributes={"+message.type": "NORMAL"}),
            "B": TopicConfig("B", 1, 2, 7, topic_sys_flag=1, order=True),
        },
        filter_server_list=["10.0.0.1:1"],
        topic_queue_mapping_info_map={"Static": MAPPING},
    )
    encoded = encode_register_broker_body(rb)
    assert b'currIdMap":{0:3}' in encoded  # fastjson writes the int-keyed map bare
    assert decode_register_broker_body(encoded, compressed=False, version=479) == rb


def test_register_body_without_body_has_zero_data_version():
    rb = decode_register_broker_body(None, compressed=False, version=479)
    assert rb.data_version == DataVersion(0, 0, 0) and rb.topic_config_table == {} and rb.filter_server_list == []
    assert decode_register_broker_body(b"", compressed=True, version=1).filter_server_list is None


def test_ancient_broker_sends_a_bare_wrapper_without_filter_list():
    rb = one_topic_body(filter_server_list=None)
    body = encode_register_broker_body(rb, version=36)
    assert body.startswith(b'{"dataVersion"')
    assert decode_register_broker_body(body, compressed=False, version=36) == rb


def test_version_zero_reading_a_modern_body_registers_no_topics():
    # spec pitfall: a client sending version 0 has its RegisterBrokerBody read as a wrapper
    body = encode_register_broker_body(one_topic_body())
    rb = decode_register_broker_body(body, compressed=False, version=0)
    assert rb.topic_config_table == {} and rb.filter_server_list is None


def test_register_body_accepts_old_topic_syn_flag_and_unknown_keys():
    body = (
        b'{"filterServerList":[],"x":1,"topicConfigSerializeWrapper":{"dataVersion":{"counter":1,"timestamp":2},'
        b'"topicConfigTable":{"T":{"topicName":"T","topicSynFlag":2,"perm":6,"readQueueNums":1,"writeQueueNums":1}}}}'
    )
    rb = decode_register_broker_body(body, compressed=False, version=479)
    assert rb.data_version == DataVersion(1, 0, 2)
    assert rb.topic_config_table["T"].topic_sys_flag == 2


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"topicConfigSerializeWrapper":[]}',
        b'{"topicConfigSerializeWrapper":{"topicConfigTable":[]}}',
        b'{"topicConfigSerializeWrapper":{"dataVersion":"x"}}',
        b'{"topicConfigSerializeWrapper":{"topicConfigTable":{"T":{"perm":"rw"}}}}',
        b'{"filterServerList":{}}',
        b'{"topicConfigSerializeWrapper":{"topicQueueMappingInfoMap":[1]}}',
    ],
)
def test_malformed_json_register_body_raises_body_error(body):
    with pytest.raises(BodyError):
        decode_register_broker_body(body, compressed=False, version=479)


# ---------------------------------------------------------------------------------------------
# REGISTER_BROKER: compressed form


def test_v7_compressed_vector_decodes():
    rb = decode_register_broker_body(V7_DEFLATED, compressed=True, version=479)
    assert rb == one_topic_body()
    tc = rb.topic_config_table["TopicTest"]
    assert (tc.topic_filter_type, tc.attributes, tc.topic_sys_flag, tc.order) == ("SINGLE_TAG", {}, 0, False)


def test_v7_compressed_vector_is_reproduced_byte_for_byte():
    assert encode_register_broker_body(one_topic_body(), compressed=True, version=479) == V7_DEFLATED


def test_deflated_body_without_the_flag_is_sniffed():
    # 5.x brokers with compressedRegister=true send compressed=false
    assert decode_register_broker_body(V7_DEFLATED, compressed=False, version=479) == one_topic_body()


def test_compressed_mapping_section_only_from_5_0():
    rb = one_topic_body(topic_queue_mapping_info_map={"Static": MAPPING})
    new = encode_register_broker_body(rb, compressed=True, version=413)
    assert decode_register_broker_body(new, compressed=True, version=413) == rb
    # an older broker's decoder stops before the section
    assert decode_register_broker_body(new, compressed=True, version=412).topic_queue_mapping_info_map == {}
    old = encode_register_broker_body(rb, compressed=True, version=412)
    assert len(zlib.decompress(old)) == len(zlib.decompress(new)) - 4 - 4 - len(bodies.fastjson.dumps_legacy(MAPPING))
    # a >= 5.0 reader given a body that ends before the section sees no mappings
    assert decode_register_broker_body(old, compressed=True, version=479).topic_queue_mapping_info_map == {}


def test_compressed_format_drops_sys_flag_and_order():
    rb = one_topic_body(topic_config_table={"T": TopicConfig("T", 2, 2, 6, topic_sys_flag=3, order=True)})
    back = decode_register_broker_body(encode_register_broker_body(rb, compressed=True), compressed=True, version=479)
    assert back.topic_config_table["T"] == TopicConfig("T", 2, 2, 6)


def test_compressed_attributes_with_a_space_are_ignored_like_java():
    dv = encode_data_version(DV)
    data = plain(dv, b'T 1 1 6 MULTI_TAG {"a":"x y"}', b"[]", counts={1: 1})
    rb = decode_register_broker_body(zlib.compress(data), compressed=True, version=400)
    assert rb.topic_config_table["T"] == TopicConfig("T", 1, 1, 6, topic_filter_type="MULTI_TAG", attributes={})


def _compressed(plaintext: bytes) -> bytes:
    return zlib.compress(plaintext, 9)


_DVJ = b'{"counter":1,"stateVersion":0,"timestamp":2}'
BAD_COMPRESSED = {
    "not zlib": b"\x78garbage",
    "truncated stream": V7_DEFLATED[:-6],
    "empty plaintext": _compressed(b""),
    "dataVersion not json": _compressed(plain(b"{x")),
    "no topic count": _compressed(plain(_DVJ)),
    "negative topic count": _compressed(plain(_DVJ) + struct.pack(">i", -1)),
    "topic count beyond data": _compressed(plain(_DVJ) + struct.pack(">i", 9)),
    "topic line too long": _compressed(plain(_DVJ) + struct.pack(">ii", 1, 500) + b"T 1 1 6 SINGLE_TAG"),
    "topic line too short": _compressed(plain(_DVJ, b"T 1 1 6", b"[]", counts={1: 1})),
    "topic line bad number": _compressed(plain(_DVJ, b"T x 1 6 SINGLE_TAG", b"[]", counts={1: 1})),
    "topic line bad filter": _compressed(plain(_DVJ, b"T 1 1 6 NO_TAG", b"[]", counts={1: 1})),
    "topic line not utf8": _compressed(plain(_DVJ, b"T\xff 1 1 6 SINGLE_TAG", b"[]", counts={1: 1})),
    "filter list not array": _compressed(plain(_DVJ, b"{}", counts={1: 0})),
    "mapping not object": _compressed(plain(_DVJ, b"[]", b"[]", counts={1: 0, 2: 1})),
    "mapping without topic": _compressed(plain(_DVJ, b"[]", b"{}", counts={1: 0, 2: 1})),
}


@pytest.mark.parametrize("body", BAD_COMPRESSED.values(), ids=BAD_COMPRESSED.keys())
def test_malformed_compressed_body_raises_body_error(body):
    with pytest.raises(BodyError):
        decode_register_broker_body(body, compressed=True, version=479)


def test_zip_bomb_is_refused(monkeypatch):
    monkeypatch.setattr(bodies, "MAX_INFLATED_SIZE", 10_000)
    bomb = zlib.compress(bytes(20_000), 9)
    with pytest.raises(BodyError, match="inflates beyond"):
        decode_register_broker_body(bomb, compressed=True, version=479)


def test_a_zip_bomb_is_refused_within_a_piece_of_the_cap_the_rest_never_inflated(monkeypatch):
    monkeypatch.setattr(bodies, "MAX_INFLATED_SIZE", 1024 * 1024)
    inflated: list[int] = []
    real = zlib.decompressobj

    class Counting:
        def __init__(self) -> None:
            self.inner = real()

        def decompress(self, data, *args):
            out = self.inner.decompress(data, *args)
            inflated.append(len(out))
            return out

        @property
        def eof(self) -> bool:
            return self.inner.eof

    monkeypatch.setattr(bodies.zlib, "decompressobj", Counting)
    bomb = zlib.compress(bytes(32 * 1024 * 1024), 9)
    with pytest.raises(BodyError, match="inflates beyond"):
        decode_register_broker_body(bomb, compressed=True, version=479)
    # a piece is what 64 compressed bytes inflate to: deflate's best is 1,032 to 1
    piece = 64 * 1032
    assert 1024 * 1024 < sum(inflated) <= 1024 * 1024 + piece and max(inflated) <= piece


# ---------------------------------------------------------------------------------------------
# DataVersion, route, KV table, topic list


def test_data_version_round_trip():
    body = encode_data_version(DV)
    assert body == b'{"counter":5,"stateVersion":0,"timestamp":1700000000000}'
    assert decode_data_version(body) == DV
    assert decode_data_version(None) is None
    with pytest.raises(BodyError):
        decode_data_version(b"[1")


def _route() -> TopicRouteData:
    return TopicRouteData(
        queue_datas=[QueueData("broker-a", 4, 4, 6)],
        broker_datas=[BrokerData("DefaultCluster", "broker-a", {0: "127.0.0.1:10911"})],
    )


def test_route_dialects():
    standard = encode_route(_route(), standard=True)
    legacy = encode_route(_route(), standard=False)
    assert b'"brokerAddrs":{"0":"127.0.0.1:10911"}' in standard
    assert b'"brokerAddrs":{0:"127.0.0.1:10911"}' in legacy
    assert decode_route(standard) == decode_route(legacy) == _route()


def test_route_decode_errors():
    with pytest.raises(BodyError):
        decode_route(None)
    with pytest.raises(BodyError):
        decode_route(b'{"queueDatas":[{"perm":6}]}')  # no brokerName


def test_kv_table():
    body = encode_kv_table({"TopicOrder": "broker-a:4;broker-b:4"})
    assert body == b'{"table":{"TopicOrder":"broker-a:4;broker-b:4"}}'
    assert decode_kv_table(body) == {"TopicOrder": "broker-a:4;broker-b:4"}
    assert decode_kv_table(b'{"table":{}}') == {} and decode_kv_table(None) == {}
    with pytest.raises(BodyError):
        decode_kv_table(b'{"table":[]}')


def test_topic_list():
    assert encode_topic_list(["TopicTest"]) == b'{"topicList":["TopicTest"]}'
    system = encode_topic_list(["broker-a", "DefaultCluster"], broker_addr="127.0.0.1:10911")
    assert system == b'{"brokerAddr":"127.0.0.1:10911","topicList":["broker-a","DefaultCluster"]}'
    assert decode_topic_list(system) == TopicList(["broker-a", "DefaultCluster"], "127.0.0.1:10911")
    assert decode_topic_list(None) == TopicList([])
    with pytest.raises(BodyError):
        decode_topic_list(b'{"topicList":"x"}')


# --- RegisterBodyCache: an unchanged topic table is not parsed again


def _plain_body(counter: int, topics: dict[str, int]) -> bytes:
    """A body as a Java broker without filter servers writes it (fastjson, keys sorted)."""
    rb = RegisterBrokerBody(
        DataVersion(counter, 0, 1_700_000_000_000),
        {name: TopicConfig(name, 8, 8, perm) for name, perm in topics.items()},
        filter_server_list=[],
    )
    body = encode_register_broker_body(rb)
    assert body.startswith(bodies._PLAIN_PREFIX)  # the shape the cache takes
    return body


def _decode(cache: bodies.RegisterBodyCache, body: bytes, key=("C", "a:1")) -> RegisterBrokerBody:
    return cache.decode(key, body, compressed=False, version=409)


def test_a_re_registration_with_only_a_new_data_version_reuses_the_parse():
    cache = bodies.RegisterBodyCache()
    first = _decode(cache, _plain_body(1, {"T1": 6, "T2": 6}))
    again = _decode(cache, _plain_body(2, {"T1": 6, "T2": 6}))
    assert (cache.hits, cache.misses) == (1, 1)
    assert again.data_version == DataVersion(2, 0, 1_700_000_000_000)
    assert again.topic_config_table is first.topic_config_table
    assert again == decode_register_broker_body(_plain_body(2, {"T1": 6, "T2": 6}), compressed=False, version=409)
    assert cache.reuse(("C", "a:1"), _plain_body(3, {"T1": 6, "T2": 6}), compressed=False, version=409) is not None


def test_a_remembered_parse_and_its_reuses_share_a_table_id_no_other_parse_has():
    cache = bodies.RegisterBodyCache()
    first = _decode(cache, _plain_body(1, {"T1": 6, "T2": 6}))
    again = _decode(cache, _plain_body(2, {"T1": 6, "T2": 6}))
    reused = cache.reuse(("C", "a:1"), _plain_body(3, {"T1": 6, "T2": 6}), compressed=False, version=409)
    assert first.table_id > 0 and again.table_id == reused.table_id == first.table_id
    changed = _decode(cache, _plain_body(4, {"T1": 6, "T2": 4}))  # same length, one byte differs
    other = _decode(cache, _plain_body(4, {"T1": 6, "T2": 4}), key=("C", "b:1"))
    assert len({first.table_id, changed.table_id, other.table_id}) == 3 and cache.hits == 2
    assert decode_register_broker_body(_plain_body(4, {"T1": 6, "T2": 4}), compressed=False, version=409).table_id == 0
    assert changed == decode_register_broker_body(_plain_body(4, {"T1": 6, "T2": 4}), compressed=False, version=409)


def test_a_changed_table_or_another_broker_is_parsed_in_full():
    cache = bodies.RegisterBodyCache()
    _decode(cache, _plain_body(1, {"T1": 6}))
    changed = _decode(cache, _plain_body(2, {"T1": 4}))
    assert changed.topic_config_table["T1"].perm == 4
    other = _decode(cache, _plain_body(2, {"T1": 4}), key=("C", "b:1"))
    assert other.topic_config_table["T1"].perm == 4
    assert cache.hits == 0
    assert cache.reuse(("C", "a:1"), _plain_body(3, {"T1": 6}), compressed=False, version=409) is None


@pytest.mark.parametrize(
    "tail",
    [
        # a second DataVersion later in the wrapper: JSON's last key wins, so the prefix's is not the one
        b',"topicConfigTable":{},"dataVersion":{"counter":9,"stateVersion":0,"timestamp":1}}}',
        # the same key spelled with an escape
        b',"topicConfigTable":{},"d\\u0061taVersion":{"counter":9,"stateVersion":0,"timestamp":1}}}',
        # a second wrapper replaces the whole first one
        b',"topicConfigTable":{}},"topicConfigSerializeWrapper":{"topicConfigTable":{}}}',
    ],
)
def test_a_tail_that_can_redefine_the_data_version_is_never_reused(tail):
    cache = bodies.RegisterBodyCache()
    for counter in (1, 2):
        body = bodies._PLAIN_PREFIX + b'{"counter":%d,"stateVersion":0,"timestamp":5}' % counter + tail
        assert _decode(cache, body) == decode_register_broker_body(body, compressed=False, version=409)
    assert cache.hits == 0 and len(cache) == 0


def test_other_shapes_are_parsed_as_before_and_not_remembered():
    cache = bodies.RegisterBodyCache()
    rb = RegisterBrokerBody(DV, {"T": TopicConfig("T")}, filter_server_list=["f:1"])
    for body, compressed in (
        (encode_register_broker_body(rb), False),
        (encode_register_broker_body(rb, compressed=True), True),
    ):
        assert cache.decode(("C", "a"), body, compressed=compressed, version=409) == decode_register_broker_body(
            body, compressed=compressed, version=409
        )
    assert len(cache) == 0


def test_the_cache_is_bounded_in_bytes_oldest_out_first():
    body = _plain_body(1, {f"T{i}": 6 for i in range(20)})
    tail = len(body) - body.index(b',"topicConfigTable"')
    cache = bodies.RegisterBodyCache(max_tail_bytes=3 * tail)
    for i in range(5):
        _decode(cache, body, key=("C", f"b{i}"))
    assert len(cache) == 3
    assert cache.reuse(("C", "b0"), body, compressed=False, version=409) is None
    assert cache.reuse(("C", "b4"), body, compressed=False, version=409) is not None
