"""The spec's frames (§6) and behaviours, over real TCP against a running node.

The spec's frames are Apache 5.3.3's; our node answers as 5.5.0 does, which differs from them only in
the version stamp of every answer (513 for 479, as ``tests/integration/test_rocketmq_real.py`` checks
against Apache's 5.5.0 NameServer itself), so the spec's response frames are compared byte for byte,
their stamp made ours (:func:`as_ours`), where the spec gives bytes.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from common.protocol import fastjson
from common.protocol.codec import FrameDecoder, decode_frame, encode
from common.protocol.codes import RequestCode, ResponseCode, SerializeType, Version
from common.protocol.command import request
from namesrv.client import NameServerClient
from tests.support.frames import commands, json_frame
from tests.support.node import VECTORS, raw_exchange
from tests.support.wait import wait_until

V = json.loads((VECTORS / "vectors.json").read_text())
FRAMES = {f["name"]: f for f in V["frames"]}
REGISTER_BODY = (VECTORS / "register_broker_body.json").read_bytes()
V3_EXT = json.loads(FRAMES["REGISTER_BROKER request (uncompressed body)"]["header_json"])["extFields"]


def frame(name: str) -> bytes:
    return bytes.fromhex(FRAMES[name]["frame_hex"])


def as_ours(answer: bytes) -> bytes:
    """A response frame (or header) of the spec, stamped by Apache 5.3.3, with our node's stamp instead."""
    theirs, ours = b'"version":%d}' % Version.V5_3_3, b'"version":%d}' % Version.CURRENT
    assert len(theirs) == len(ours) and answer.count(theirs) == 1, answer
    return answer.replace(theirs, ours)


def register_v3(client: NameServerClient, **ext_overrides: str):
    return client.call(RequestCode.REGISTER_BROKER, {**V3_EXT, **ext_overrides}, REGISTER_BODY)


def test_v1_route_frames_are_byte_identical_after_v3_registration(node):
    expected = as_ours(frame("GET_ROUTEINFO_BY_TOPIC response SUCCESS (standard JSON body, request version>=401)"))
    with NameServerClient(node.addr) as broker:  # the broker's connection stays open, or it is unregistered
        assert register_v3(broker).code == ResponseCode.SUCCESS
        assert raw_exchange(node.addr, frame("GET_ROUTEINFO_BY_TOPIC request (JSON)")) == expected
        # the binary-header request gets the same JSON answer: responses use the server's type
        assert raw_exchange(node.addr, frame("same request, ROCKETMQ binary header")) == expected


def test_v1_legacy_dialect_for_old_clients_and_standard_on_request(node):
    route_frame = FRAMES["GET_ROUTEINFO_BY_TOPIC response SUCCESS (standard JSON body, request version>=401)"]
    with NameServerClient(node.addr) as c:
        register_v3(c)
        old = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}, version=63)
        assert old.body.decode() == route_frame["legacy_body (request version<401 and no acceptStandardJsonOnly)"]
        asked = c.call(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest", "acceptStandardJsonOnly": "true"}, version=0
        )
        assert asked.body.decode() == route_frame["body_text"]


def test_v2_unknown_topic_is_byte_identical(node):
    req = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopic"}, opaque=2)
    got = raw_exchange(node.addr, encode(req))
    header_json = as_ours(FRAMES["GET_ROUTEINFO_BY_TOPIC response TOPIC_NOT_EXIST"]["header_json"].encode())
    assert got == json_frame(header_json)
    assert len(got) - 4 == 0xFB


def test_v3_register_response_and_negative_cases(node):
    with NameServerClient(node.addr) as c:
        bad_crc = register_v3(c, bodyCrc32="1")
        assert (bad_crc.code, bad_crc.remark) == (ResponseCode.SYSTEM_ERROR, "crc32 not match")
        ok = register_v3(c)
        assert ok.code == ResponseCode.SUCCESS and ok.ext_fields == {} and ok.body is None
    expected = json.loads(
        FRAMES["REGISTER_BROKER response for a master (no KV ORDER_TOPIC_CONFIG namespace)"]["header_json"]
    )
    with NameServerClient(node.addr) as c:
        raw = c.call(RequestCode.REGISTER_BROKER, V3_EXT, REGISTER_BODY)
        assert (raw.code, raw.flag, raw.ext_fields, raw.version) == (
            expected["code"],
            expected["flag"],
            expected["extFields"],
            Version.CURRENT,
        )


def test_v3_first_registration_with_one_topic_fails(node):
    body = json.loads(REGISTER_BODY)
    del body["topicConfigSerializeWrapper"]["topicConfigTable"]["DefaultCluster"]
    raw = json.dumps(body, separators=(",", ":")).encode()
    with NameServerClient(node.addr) as c:
        r = c.call(RequestCode.REGISTER_BROKER, {**V3_EXT, "bodyCrc32": "0"}, raw)
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "register broker failed")
        brokers, _ = c.cluster_info()
        assert brokers["broker-a"].broker_addrs == {}  # Java leaves an empty group behind


def test_v3_slave_gets_master_addresses_and_order_topic_table(node):
    with NameServerClient(node.addr) as c:
        c.put_kv("ORDER_TOPIC_CONFIG", "TopicOrder", "broker-a:4;broker-b:4")
        register_v3(c)
        slave = register_v3(c, brokerId="1", brokerAddr="127.0.0.1:10921", bodyCrc32="0")
    expected = FRAMES["REGISTER_BROKER response for a slave (master alive) with ORDER_TOPIC_CONFIG KV present"]
    assert slave.ext_fields == json.loads(expected["header_json"])["extFields"]
    assert slave.body.decode() == expected["body_text"]


def test_v4_cluster_info_is_legacy_json(node):
    with NameServerClient(node.addr) as broker:
        register_v3(broker)
        got = commands(raw_exchange(node.addr, frame("GET_BROKER_CLUSTER_INFO request")))
    assert (
        got[0].body.decode()
        == FRAMES["GET_BROKER_CLUSTER_INFO response (legacy fastjson: unquoted numeric keys)"]["body_text"]
    )


def test_v5_query_data_version(node):
    qdv = frame("QUERY_DATA_VERSION request (body = broker DataVersion)")
    before = commands(raw_exchange(node.addr, qdv))[0]
    assert before.ext_fields == {"changed": "true"} and before.body is None
    with NameServerClient(node.addr) as c:
        register_v3(c)
        after = commands(raw_exchange(node.addr, qdv))[0]
    unchanged = FRAMES["QUERY_DATA_VERSION response (unchanged)"]
    assert after.ext_fields == {"changed": "false"}
    assert after.body.decode() == unchanged["body_text"]


def test_v6_kv_round_trip_and_file(node, tmp_path):
    put = raw_exchange(node.addr, frame("PUT_KV_CONFIG request"))
    assert put == json_frame(as_ours(FRAMES["PUT_KV_CONFIG response"]["header_json"].encode()))
    assert (tmp_path / "kvConfig.json").read_text() == V["json_bodies"]["kvConfig.json"]
    with NameServerClient(node.addr) as c:
        assert c.get_kv("ORDER_TOPIC_CONFIG", "TopicOrder") == "broker-a:4"
        missing = c.call(RequestCode.GET_KV_CONFIG, {"namespace": "ORDER_TOPIC_CONFIG", "key": "missing"})
        assert (missing.code, missing.remark, missing.ext_fields) == (
            ResponseCode.QUERY_NOT_FOUND,
            "No config item, Namespace: ORDER_TOPIC_CONFIG Key: missing",
            {},
        )
        c.delete_kv("ORDER_TOPIC_CONFIG", "TopicOrder")
        assert c.get_kv("ORDER_TOPIC_CONFIG", "TopicOrder") is None
        assert c.kv_namespace("ORDER_TOPIC_CONFIG") == {}  # the namespace outlives its last key


def test_every_request_code_is_answered(node):
    with NameServerClient(node.addr) as c:
        register_v3(c)
        for code in RequestCode:
            if code == RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE:
                continue
            r = c.call(
                code,
                {
                    "topic": "TopicTest",
                    "brokerName": "broker-a",
                    "clusterName": "DefaultCluster",
                    "brokerAddr": "127.0.0.1:10911",
                    "cluster": "DefaultCluster",
                    "namespace": "ns",
                    "key": "k",
                },
            )
            assert r.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED, code
        unknown = c.call(99999)
        assert (unknown.code, unknown.remark) == (
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            " request type 99999 not supported",
        )


def test_oneway_requests_get_no_answer_even_on_error(node):
    oneway_bad = encode(request(99999, opaque=41, oneway=True))
    oneway_hb = encode(
        request(RequestCode.BROKER_HEARTBEAT, {"clusterName": "c", "brokerAddr": "a"}, opaque=42, oneway=True)
    )
    normal = encode(request(RequestCode.GET_BROKER_CLUSTER_INFO, opaque=43))
    got = commands(raw_exchange(node.addr, oneway_bad + oneway_hb + normal))
    assert [r.opaque for r in got] == [43]


def test_response_frames_from_peers_are_not_requests(node):
    stray = request(RequestCode.GET_BROKER_CLUSTER_INFO, opaque=5)
    stray.flag = 1
    normal = encode(request(RequestCode.GET_BROKER_CLUSTER_INFO, opaque=6))
    assert [r.opaque for r in commands(raw_exchange(node.addr, encode(stray) + normal))] == [6]


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">i", 16 * 1024 * 1024 - 3) + b"\x00\x00\x00\x02",  # length over the 16 MiB cap
        struct.pack(">ii", 8, 50) + b"xxxx",  # header longer than the frame
        struct.pack(">ii", 6, 2) + b"{]",  # not JSON
        struct.pack(">ii", 6, 0x05000002) + b"{}",  # unknown serialize type
    ],
    ids=["oversize", "header-too-long", "bad-json", "bad-type"],
)
def test_malformed_frame_closes_only_that_connection(node, garbage):
    with NameServerClient(node.addr) as healthy:
        healthy.cluster_info()
        raw_exchange(node.addr, garbage, expect_close=True)
        healthy.cluster_info()


def test_closing_the_broker_connection_unregisters_it(node):
    with NameServerClient(node.addr) as broker:
        register_v3(broker)
        with NameServerClient(node.addr) as client:
            assert client.topic_route("TopicTest").queue_datas
    with NameServerClient(node.addr) as client:
        wait_until(
            lambda: client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).code
            == ResponseCode.TOPIC_NOT_EXIST,
            3,
            "the broker's route to go with its connection",
            0.02,
        )


def test_rocketmq_binary_requests_are_answered(node):
    with NameServerClient(node.addr, serialize_type=SerializeType.ROCKETMQ) as c:
        register_v3(c)
        assert c.topic_route("TopicTest").broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}


def test_namesrv_config_update_blacklist_and_listing(node, tmp_path):
    with NameServerClient(node.addr) as c:
        for key in ("configStorePath", "kvConfigPath", "configBlackList", "rocketmqHome"):
            r = c.call(RequestCode.UPDATE_NAMESRV_CONFIG, body=f"{key}=/tmp/x\n".encode())
            assert (r.code, r.remark) == (ResponseCode.NO_PERMISSION, "Can not update config in black list.")
        c.update_config({"enableAllTopicList": "false"})
        r = c.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "disable")
        text = c.ok(RequestCode.GET_NAMESRV_CONFIG).body.decode()
        keys = [line.split("=", 1)[0] for line in text.splitlines() if line]
        assert keys == sorted(keys) and "enableAllTopicList=false" in text
    assert "enableAllTopicList=false" in (tmp_path / "namesrv.properties").read_text()


def test_tolerant_register_body_with_bare_integer_keys(node):
    body = json.loads(REGISTER_BODY)
    text = json.dumps(body, separators=(",", ":")).replace(
        '"topicQueueMappingInfoMap":{}',
        '"topicQueueMappingInfoMap":{"TopicTest":{"bname":"broker-a","currIdMap":{0:0,1:1},"epoch":0,'
        '"scope":"__global__","topic":"TopicTest","totalQueues":2}}',
    )
    with NameServerClient(node.addr) as c:
        r = c.call(RequestCode.REGISTER_BROKER, {**V3_EXT, "bodyCrc32": "0"}, text.encode())
        assert r.code == ResponseCode.SUCCESS, r.remark
        route = fastjson.loads(c.ok(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).body)
        assert route["topicQueueMappingByBroker"]["broker-a"]["currIdMap"] == {"0": 0, "1": 1}


def test_idle_connections_are_closed_and_their_brokers_unregistered(tmp_path):
    from tests.support.node import running_node

    with running_node(tmp_path, serverChannelMaxIdleTimeSeconds="1") as n:
        with NameServerClient(n.addr) as broker:
            register_v3(broker)
            time.sleep(2.5)
            with pytest.raises((ConnectionError, OSError)):
                broker.cluster_info()
        with NameServerClient(n.addr) as client:
            r = client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"})
            assert r.code == ResponseCode.TOPIC_NOT_EXIST


def test_a_closed_and_an_idled_out_connection_each_drop_their_broker_and_say_which(tmp_path):
    """Both end in CHANNEL_CLOSED (the observer's broker_unregistered) with a reason telling them apart."""
    from tests.support.node import running_node

    class Closes:
        def __init__(self) -> None:
            self.reasons: dict[str, str] = {}

        def broker_unregistered(self, request, departure):
            self.reasons[request.broker_addr] = str(departure)

    closes = Closes()
    cluster = V3_EXT["clusterName"]
    with running_node(tmp_path, serverChannelMaxIdleTimeSeconds="1") as n:
        # the node's observer (one that tells no one, without Kafka) reports to the test as well
        n.call(setattr, n.running.context.observer, "broker_unregistered", closes.broker_unregistered)
        with NameServerClient(n.addr) as idle:
            assert register_v3(idle).code == ResponseCode.SUCCESS  # 127.0.0.1:10911, then silent
            with NameServerClient(n.addr) as leaving:
                assert register_v3(leaving, brokerAddr="127.0.0.1:20911", brokerName="broker-b").code == 0
            wait_until(lambda: len(closes.reasons) == 2, 10, "both connections to end")
            assert closes.reasons == {
                "127.0.0.1:20911": "connection closed",
                "127.0.0.1:10911": "idle for 1 s (serverChannelMaxIdleTimeSeconds)",
            }
            routes = n.running.context.routes
            wait_until(
                lambda: n.call(routes.last_seen, cluster, "127.0.0.1:10911") is None
                and n.call(routes.last_seen, cluster, "127.0.0.1:20911") is None,
                10,
                "both brokers dropped",
            )


def test_decode_of_a_whole_frame_helper_matches_stream_decoder():
    data = frame("GET_ROUTEINFO_BY_TOPIC request (JSON)")
    assert decode_frame(data).ext_fields == {"topic": "TopicTest"}


def test_node_stats_count_tables_and_connections(node):
    from namesrv.app import node_stats

    with NameServerClient(node.addr) as broker:
        register_v3(broker)
        stats = node.call(node_stats, node.running)
    assert stats == {"brokers": 1, "groups": 1, "topics": 2, "connections": 1, "localExpiry": "on"}


def test_a_peer_that_does_not_read_its_answers_is_held_back_and_loses_nothing(node):
    """Answers queue only up to the transport's high-water mark; then the node stops reading that peer."""
    from tests.support.brokers import register_broker

    with NameServerClient(node.addr) as broker:
        register_broker(broker, broker_addr="127.0.0.1:10911", topics=[f"T{i:04d}-{'x' * 40}" for i in range(1000)])
        one_answer = len(encode(broker.call(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)))
        n = 2000  # about 100 MB of answers if all were queued at once
        pipeline = b"".join(encode(request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, opaque=i)) for i in range(n))
        with socket.create_connection(("127.0.0.1", node.running.port)) as peer:
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sender = threading.Thread(target=peer.sendall, args=(pipeline,), daemon=True)
            sender.start()
            wait_until(
                lambda: node.call(lambda: any(c.paused for c in node.running.server.connections)),
                10,
                "the node to stop reading the peer",
            )
            time.sleep(0.3)  # a node that kept reading would keep queueing now
            queued = node.call(
                lambda: max(c.transport.get_write_buffer_size() for c in node.running.server.connections)
            )
            assert queued < 64 * 1024 + 50 * one_answer  # the high-water mark plus one read's worth of answers
            with NameServerClient(node.addr) as other:  # everyone else is served meanwhile
                assert other.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == ResponseCode.SUCCESS

            decoder, opaques = FrameDecoder(), []
            peer.settimeout(10)
            while len(opaques) < n:
                decoder.feed(peer.recv(1 << 20))
                while (cmd := decoder.next_command()) is not None:
                    opaques.append(cmd.opaque)
            sender.join(10)
    assert opaques == list(range(n))


def _accepted_socket_settings(n) -> list[tuple[int, int, tuple[int, int]]]:
    """(SO_SNDBUF, SO_RCVBUF, (low, high) write-buffer marks) of every connection the node accepted."""

    def read():
        out = []
        for c in n.running.server.connections:
            sock = c.transport.get_extra_info("socket")
            out.append(
                (
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
                    c.transport.get_write_buffer_limits(),
                )
            )
        return out

    return n.call(read)


def test_socket_buffer_sizes_and_write_buffer_marks_apply_to_every_accepted_connection(tmp_path):
    from tests.support.node import running_node

    # sizes no kernel picks by default; Linux reports twice what was set (its bookkeeping overhead)
    snd, rcv = 40_000, 50_000
    with running_node(
        tmp_path,
        serverSocketSndBufSize=str(snd),
        serverSocketRcvBufSize=str(rcv),
        writeBufferHighWaterMark="8192",
        writeBufferLowWaterMark="2048",
    ) as n:
        with NameServerClient(n.addr) as a, NameServerClient(n.addr) as b:
            a.cluster_info()
            b.cluster_info()
            settings = _accepted_socket_settings(n)
    assert len(settings) == 2
    for got_snd, got_rcv, marks in settings:
        assert got_snd in (snd, 2 * snd) and got_rcv in (rcv, 2 * rcv)
        assert marks == (2048, 8192)


def test_one_write_buffer_mark_alone_leaves_the_loop_defaults(tmp_path):
    """As Java: the marks apply only when both are set."""
    from tests.support.node import running_node

    seen = []
    for i, settings in enumerate([{}, {"writeBufferHighWaterMark": "8192"}, {"writeBufferLowWaterMark": "2048"}]):
        with running_node(tmp_path / str(i), **settings) as n:
            with NameServerClient(n.addr) as client:
                client.cluster_info()
                ((_, _, marks),) = _accepted_socket_settings(n)
        seen.append(marks)
    assert seen[0][1] == 64 * 1024 and seen[1] == seen[0] and seen[2] == seen[0]
