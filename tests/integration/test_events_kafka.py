"""Events out and actions in, against Apache Kafka and real TCP.

The module starts one Kafka (a KRaft node, on free ports); every test gets topics of its own on it
and in-process name-server nodes on free ports.  Waits poll with deadlines; nothing sleeps for a
fixed long time.
"""

from __future__ import annotations

import json
import time

import pytest

from common import kafka_clients
from common.contract import Action, ActionType, DataVersionInfo, EventType, QueueInfo
from common.protocol import bodies
from common.protocol.codes import RequestCode, ResponseCode
from common.protocol.types import DataVersion, QueueData, TopicRouteData
from infra.config import TopicSpec
from infra.kafka import KafkaService, ensure_topics, kafka_admin
from namesrv.client import NameServerClient
from tests.support.kafka import EventReader, fresh_topics, kafka_broker, publish_actions
from tests.support.node import VECTORS, free_port, running_node
from tests.support.routes import brokers_at
from tests.support.wait import wait_until

V = json.loads((VECTORS / "vectors.json").read_text())
FRAMES = {f["name"]: f for f in V["frames"]}
REGISTER_EXT = json.loads(FRAMES["REGISTER_BROKER request (uncompressed body)"]["header_json"])["extFields"]
REGISTER_BODY = (VECTORS / "register_broker_body.json").read_bytes()
CLUSTER, ADDR = REGISTER_EXT["clusterName"], REGISTER_EXT["brokerAddr"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with kafka_broker(tmp_path_factory.mktemp("kafka")) as service:
        yield service


class Kafka:
    """The module's Kafka with this test's own events and actions topics."""

    def __init__(self, service: KafkaService) -> None:
        self.service = service
        topics = fresh_topics(service, events=2, actions=1)
        self.events, self.actions = topics["events"], topics["actions"]

    @property
    def bootstrap_servers(self) -> str:
        return self.service.bootstrap_servers


@pytest.fixture
def kafka(broker) -> Kafka:
    return Kafka(broker)


def kafka_props(kafka: Kafka, name: str, **extra: str) -> dict[str, str]:
    return {
        "kafkaBootstrapServers": kafka.bootstrap_servers, "eventsTopic": kafka.events, "actionsTopic": kafka.actions,
        "nodeName": name, "tickIntervalMillis": "300", **extra,
    }  # fmt: skip


def register(client: NameServerClient, name: str = "broker-a", addr: str = ADDR, counter: int | None = None):
    """broker ``name`` at ``addr`` with the spec's topic table; ``counter`` changes its DataVersion."""
    body = REGISTER_BODY
    ext = dict(REGISTER_EXT, brokerName=name, brokerAddr=addr)
    if counter is not None or name != "broker-a" or addr != ADDR:
        d = json.loads(body)
        if counter is not None:
            d["topicConfigSerializeWrapper"]["dataVersion"]["counter"] = counter
        body, ext["bodyCrc32"] = json.dumps(d).encode(), "0"
    response = client.call(RequestCode.REGISTER_BROKER, ext, body)
    assert response.code == ResponseCode.SUCCESS, response.remark
    return response


def consumer_ready(*nodes) -> None:
    for node in nodes:
        assert node.running.kafka.consumer.ready.wait(15), "the action consumer did not reach the topic's end"


def expire(addr: str, last_heartbeat: int, name: str = "broker-a", kind=ActionType.EXPIRE) -> Action:
    return Action(
        kind,
        "test-monitor",
        int(time.time() * 1000),
        cluster_name=CLUSTER,
        broker_addr=addr,
        broker_name=name,
        broker_id=0,
        last_heartbeat=last_heartbeat,
        watermark=last_heartbeat,
    )


def last_seen_event_time(reader: EventReader, addr: str) -> int:
    return max(
        e.event_time
        for e in reader.events()
        if e.broker_addr == addr and e.type in (EventType.REGISTER, EventType.HEARTBEAT)
    )


# --------------------------------------------------------------------------- events out


def test_every_kind_of_request_publishes_its_event(kafka, tmp_path):
    reader = EventReader(kafka.bootstrap_servers, kafka.events)
    with running_node(tmp_path, **kafka_props(kafka, "ns-1")) as node, NameServerClient(node.addr) as c:
        register(c)
        register(c)
        identity = {"clusterName": CLUSTER, "brokerAddr": ADDR, "brokerName": "broker-a", "brokerId": "0"}
        c.call(
            RequestCode.QUERY_DATA_VERSION, identity, bodies.encode_data_version(DataVersion(5, 0, 1_700_000_000_000))
        )
        c.call(RequestCode.BROKER_HEARTBEAT, {"clusterName": CLUSTER, "brokerAddr": ADDR}, oneway=True)
        assert c.wipe_write_perm("broker-a") == 2
        assert c.add_write_perm("broker-a") == 2
        route = TopicRouteData(queue_datas=[QueueData("broker-a", 8, 8, 6)])
        c.ok(RequestCode.REGISTER_TOPIC_IN_NAMESRV, {"topic": "NewTopic"}, bodies.encode_route(route, standard=True))
        c.ok(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "NewTopic"})
        c.ok(RequestCode.UNREGISTER_BROKER, identity)
        with NameServerClient(node.addr) as other:  # a broker whose connection then closes
            register(other, "broker-b", "127.0.0.1:20911")
        reader.wait_for_events(lambda e: e.type is EventType.CHANNEL_CLOSED, what="CHANNEL_CLOSED")
        reader.wait_for_events(lambda e: e.type is EventType.TICK, count=2, what="two ticks")
    reader.close()

    # one partition keeps one key's order; across partitions the node's seq gives the order
    mine = sorted((e for e in reader.events() if e.type is not EventType.TICK), key=lambda e: e.seq)
    kinds = [(e.type.value, e.source or e.op or "") for e in mine]
    assert kinds == [
        ("REGISTER", ""), ("HEARTBEAT", "REGISTER_BROKER"), ("HEARTBEAT", "QUERY_DATA_VERSION"),
        ("HEARTBEAT", "BROKER_HEARTBEAT"), ("ADMIN", "WIPE_WRITE_PERM"), ("ADMIN", "ADD_WRITE_PERM"),
        ("ADMIN", "REGISTER_TOPIC"), ("ADMIN", "DELETE_TOPIC"), ("UNREGISTER", "UNREGISTER_BROKER"),
        ("REGISTER", ""), ("CHANNEL_CLOSED", ""),
    ]  # fmt: skip
    first = mine[0]
    assert (first.node, first.cluster_name, first.broker_name, first.broker_id, first.broker_addr) == (
        "ns-1",
        CLUSTER,
        "broker-a",
        0,
        ADDR,
    )
    assert (first.ha_server_addr, first.enable_acting_master, first.heartbeat_timeout_millis) == (
        "127.0.0.1:10912",
        False,
        120000,
    )
    assert first.data_version == DataVersionInfo(5, 0, 1_700_000_000_000)
    assert first.topics == {"TopicTest": QueueInfo(4, 4, 6, 0), "DefaultCluster": QueueInfo(16, 16, 7, 0)}
    assert all(e.broker_name == "broker-a" and e.broker_id == 0 for e in mine[1:4])
    assert mine[4].topic_count == 2 and mine[6].queue_datas[0].queues == QueueInfo(8, 8, 6, 0)
    assert mine[7].topic == "NewTopic" and mine[-1].broker_addr == "127.0.0.1:20911"
    now = time.time() * 1000
    assert all(now - 60_000 < e.event_time <= now for e in mine)
    # one per-node sequence, in publishing order per broker (key = brokerAddr)
    all_events = reader.events()
    assert sorted(e.seq for e in all_events) == list(range(1, len(all_events) + 1))
    for record in reader.records:
        event = json.loads(record.value)
        assert record.key == (event.get("brokerAddr") or event["node"]).encode()
    per_addr = [e.seq for e in all_events if e.broker_addr == ADDR]
    assert per_addr == sorted(per_addr)


# --------------------------------------------------------------------------- actions in


def test_an_expire_action_removes_the_broker_at_every_node(kafka, tmp_path):
    reader = EventReader(kafka.bootstrap_servers, kafka.events)
    with (
        running_node(tmp_path / "1", **kafka_props(kafka, "ns-1")) as n1,
        running_node(tmp_path / "2", **kafka_props(kafka, "ns-2")) as n2,
        NameServerClient(n1.addr) as c1,
        NameServerClient(n2.addr) as c2,
    ):
        consumer_ready(n1, n2)
        register(c1)
        register(c2)
        register(c1, "broker-b", "127.0.0.1:20911")
        register(c2, "broker-b", "127.0.0.1:20911")
        reader.wait_for_events(lambda e: e.type is EventType.REGISTER, count=4, what="4 registrations")
        assert n1.running.expiry.enabled  # until the monitor speaks
        publish_actions(kafka.bootstrap_servers, kafka.actions, expire(ADDR, last_seen_event_time(reader, ADDR)))
        wait_until(
            lambda: "broker-a" not in brokers_at(n1.addr) and "broker-a" not in brokers_at(n2.addr),
            what="broker-a removed at both nodes",
        )
        assert brokers_at(n1.addr) == brokers_at(n2.addr) == {"broker-b": {0: "127.0.0.1:20911"}}
        applied = reader.wait_for_events(
            lambda e: e.type is EventType.UNREGISTER and e.source == "EXPIRE",
            count=2,
            what="UNREGISTER(EXPIRE) from both nodes",
        )
        assert {e.node for e in applied} == {"ns-1", "ns-2"}
        for node in (n1, n2):
            stats = node.running.kafka.action_stats()
            assert (stats.applied, stats.stale, stats.skipped) == (1, 0, 0)
            assert not node.running.expiry.enabled  # the monitor spoke: the local scan is off
        # the same action again, and garbage, change nothing
        publish_actions(kafka.bootstrap_servers, kafka.actions, expire(ADDR, last_seen_event_time(reader, ADDR)))
        wait_until(lambda: n1.running.kafka.action_stats().absent == 1, what="duplicate seen")
        assert brokers_at(n1.addr) == {"broker-b": {0: "127.0.0.1:20911"}}
    reader.close()


def test_a_stale_action_does_not_remove_a_broker_that_registered_again(kafka, tmp_path):
    reader = EventReader(kafka.bootstrap_servers, kafka.events)
    with running_node(tmp_path, **kafka_props(kafka, "ns-1")) as node, NameServerClient(node.addr) as c:
        consumer_ready(node)
        register(c)
        register(c, "broker-b", "127.0.0.1:20911")
        reader.wait_for_events(lambda e: e.type is EventType.REGISTER, count=2, what="registrations")
        decided_on = last_seen_event_time(reader, ADDR)
        register(c, counter=6)  # broker-a comes back with a new topic table after the decision's evidence
        newer = reader.wait_for_events(
            lambda e: e.broker_addr == ADDR and e.event_time > decided_on, what="broker-a's newer registration"
        )
        assert newer[0].type is EventType.REGISTER and newer[0].data_version.counter == 6
        b_seen = last_seen_event_time(reader, "127.0.0.1:20911")
        # the stale EXPIRE for broker-a, then a valid REMOVE for broker-b as a marker (one partition: in order)
        publish_actions(
            kafka.bootstrap_servers,
            kafka.actions,
            expire(ADDR, decided_on),
            expire("127.0.0.1:20911", b_seen, "broker-b", ActionType.REMOVE),
        )
        wait_until(lambda: "broker-b" not in brokers_at(node.addr), what="broker-b removed")
        assert brokers_at(node.addr) == {"broker-a": {0: ADDR}}
        stats = node.running.kafka.action_stats()
        assert (stats.stale, stats.applied) == (1, 1)
    reader.close()


def test_a_node_reads_actions_from_the_end_and_falls_back_when_the_monitor_goes_silent(kafka, tmp_path):
    future = int(time.time() * 1000) + 3_600_000  # would pass the fence if it were read
    old = [Action(ActionType.MONITOR_HEARTBEAT, "old-monitor", 1)] * 3 + [expire(ADDR, future)]
    publish_actions(kafka.bootstrap_servers, kafka.actions, *old)  # before the node starts: behind the end it starts at
    props = kafka_props(kafka, "ns-1", monitorSilenceFallbackMillis="600")
    with running_node(tmp_path, **props) as node, NameServerClient(node.addr) as c:
        consumer_ready(node)
        register(c)
        publish_actions(kafka.bootstrap_servers, kafka.actions, Action(ActionType.MONITOR_HEARTBEAT, "monitor-1", 2))
        wait_until(lambda: node.running.kafka.action_stats().monitor_heartbeats == 1, what="the new heartbeat")
        stats = node.running.kafka.action_stats()
        assert (stats.received, stats.applied) == (1, 0)
        assert brokers_at(node.addr) == {"broker-a": {0: ADDR}}
        assert not node.running.expiry.enabled
        wait_until(lambda: node.running.expiry.enabled, timeout=5, what="local scan back on after silence")


def test_a_node_follows_an_actions_topic_made_again_under_it(kafka, tmp_path):
    """The log below the node's position is gone (the topic deleted and made again): Kafka's own rules move
    the consumer back into the new log (OFFSET_OUT_OF_RANGE, or the point where its leader epochs
    diverge), so the node reads the actions that follow instead of waiting for the log to reach its old
    position."""
    with running_node(tmp_path, **kafka_props(kafka, "ns-1")) as node, NameServerClient(node.addr) as c:
        consumer_ready(node)
        register(c)
        beats = [Action(ActionType.MONITOR_HEARTBEAT, "test-monitor", i) for i in range(1, 6)]
        publish_actions(kafka.bootstrap_servers, kafka.actions, *beats)
        wait_until(lambda: node.running.kafka.action_stats().monitor_heartbeats == 5, what="five heartbeats")
        with kafka_admin(kafka.bootstrap_servers) as admin:
            admin.delete_topics([kafka.actions])
        # deletion completes in the background; until then the name is taken
        wait_until(
            lambda: ensure_topics(kafka.bootstrap_servers, [TopicSpec(kafka.actions, 1)]) == [kafka.actions],
            what="the actions topic made again",
        )
        # what lands before the node has noticed may be below where it resumes: beat until one is heard
        stats = node.running.kafka.action_stats
        wait_until(
            lambda: stats().monitor_heartbeats > 5,
            20,
            "a heartbeat from the new log",
            interval=0.5,
            during=lambda: publish_actions(kafka.bootstrap_servers, kafka.actions, beats[0]),
        )
        publish_actions(kafka.bootstrap_servers, kafka.actions, expire(ADDR, int(time.time() * 1000)))
        wait_until(lambda: "broker-a" not in brokers_at(node.addr), what="the EXPIRE in the new log applied")
        assert stats().applied == 1


def test_malformed_and_unknown_actions_are_counted_and_skipped(kafka, tmp_path):
    with running_node(tmp_path, **kafka_props(kafka, "ns-1")) as node, NameServerClient(node.addr) as c:
        consumer_ready(node)
        register(c)
        producer = kafka_clients.producer(kafka.bootstrap_servers, pinned=True)
        for value in (b"{not json", b'{"v":2,"type":"EXPIRE"}', b'{"v":1,"type":"REBOOT","monitor":"m","decidedAt":1}'):
            producer.send(kafka.actions, value)
        producer.flush(10)
        producer.close(5)
        publish_actions(kafka.bootstrap_servers, kafka.actions, Action(ActionType.MONITOR_HEARTBEAT, "m", 1))
        wait_until(lambda: node.running.kafka.action_stats().monitor_heartbeats == 1, what="monitor heartbeat")
        assert node.running.kafka.action_stats().skipped == 3
        assert brokers_at(node.addr) == {"broker-a": {0: ADDR}}


def test_poison_actions_are_refused_and_only_the_trusted_monitor_is_obeyed(kafka, tmp_path):
    """Poison actions: lastHeartbeat = 2^64-1, a far-future one, and a monitor nobody runs change nothing."""
    props = kafka_props(kafka, "ns-1", trustedMonitors="test-monitor")
    with running_node(tmp_path, **props) as node, NameServerClient(node.addr) as c:
        consumer_ready(node)
        register(c)
        register(c, "broker-b", "127.0.0.1:20911")
        now = int(time.time() * 1000)
        rogue = expire(ADDR, now + 1_000)
        rogue.monitor = "nobody-runs-this"
        rogue_beat = Action(ActionType.MONITOR_HEARTBEAT, "nobody-runs-this", now)
        # one partition: read in this order
        publish_actions(
            kafka.bootstrap_servers,
            kafka.actions,
            expire(ADDR, 2**64 - 1),
            expire(ADDR, now + 3_600_000),
            rogue,
            rogue_beat,
        )
        wait_until(lambda: node.running.kafka.action_stats().untrusted == 2, what="the rogue monitor refused")
        stats = node.running.kafka.action_stats()
        assert (stats.skipped, stats.ahead, stats.applied) == (1, 1, 0)
        assert set(brokers_at(node.addr)) == {"broker-a", "broker-b"}
        assert node.running.expiry.enabled  # nobody the node trusts has spoken
        publish_actions(kafka.bootstrap_servers, kafka.actions, expire("127.0.0.1:20911", now + 1_000, "broker-b"))
        wait_until(lambda: "broker-b" not in brokers_at(node.addr), what="the trusted monitor's EXPIRE applied")
        assert set(brokers_at(node.addr)) == {"broker-a"} and not node.running.expiry.enabled


# --------------------------------------------------------------------------- Kafka outages


def test_kafka_restart_loses_nothing_the_node_queued_and_the_publisher_recovers(kafka, tmp_path):
    """The Kafka process stops and starts again on the same ports and data directory; every event the
    node made while it was down reaches the topic, and the node never waits for it."""
    service = kafka.service
    addrs = [f"127.0.0.1:{30000 + i}" for i in range(13)]
    with running_node(tmp_path, **kafka_props(kafka, "ns-1")) as node, NameServerClient(node.addr) as c:
        consumer_ready(node)
        for i in range(4):
            register(c, f"b{i}", addrs[i])
        old_pid = service.status().pid
        service.stop()
        made = node.running.kafka.publisher_stats().emitted
        slowest = 0.0
        for i in range(4, 8):  # registrations while Kafka is down are answered at once
            t0 = time.monotonic()
            register(c, f"b{i}", addrs[i])
            slowest = max(slowest, time.monotonic() - t0)
        assert slowest < 0.5
        # a few ticks (every 300 ms) wait behind the registrations, in the producer or the node's queue
        wait_until(
            lambda: node.running.kafka.publisher_stats().emitted >= made + 8,
            what="ticks made while Kafka is down",
            state=node.running.kafka.publisher_stats,
        )
        up_ms = int(time.time() * 1000)
        assert service.start().pid != old_pid  # a new process, same ports and data directory
        for i in range(8, 12):
            register(c, f"b{i}", addrs[i])
        assert set(brokers_at(node.addr)) == {f"b{i}" for i in range(12)}

        reader = EventReader(kafka.bootstrap_servers, kafka.events)
        register(c, "b12", addrs[12])
        registered = reader.wait_for_events(
            lambda e: e.type is EventType.REGISTER, count=13, timeout=20, what="all 13 registrations"
        )
        # those from before the stop too: the log survived the restart
        assert {e.broker_addr for e in registered} == set(addrs)
        # what the node queued while Kafka was down, from b4's registration on: every sequence number,
        # ticks included (one in flight as Kafka stopped may fail; it came before b4's and is superseded)
        events = reader.events()
        first = next(e.seq for e in registered if e.broker_addr == addrs[4])
        last = max(e.seq for e in events if e.event_time <= up_ms)
        assert sorted({e.seq for e in events if first <= e.seq <= last}) == list(range(first, last + 1))
        assert sum(e.type is EventType.TICK and first < e.seq <= last for e in events) >= 4
        reader.close()
        stats = node.running.kafka.publisher_stats()
        assert stats.dropped == 0 and stats.queued < 5, stats

        # the action consumer carries on at its offset in the same log
        publish_actions(
            kafka.bootstrap_servers, kafka.actions, expire(addrs[11], int(time.time() * 1000) + 1000, "b11")
        )
        wait_until(lambda: "b11" not in brokers_at(node.addr), timeout=20, what="b11 removed after the restart")


def test_a_node_starts_and_serves_while_kafka_is_down(tmp_path):
    props = {"kafkaBootstrapServers": f"127.0.0.1:{free_port()}", "nodeName": "lonely", "tickIntervalMillis": "100"}
    t0 = time.monotonic()
    with running_node(tmp_path, **props) as node, NameServerClient(node.addr) as c:
        register(c)
        assert c.topic_route("TopicTest").broker_datas[0].broker_addrs == {0: ADDR}
        assert node.running.expiry.enabled  # no monitor heard: Apache behaviour
        wait_until(lambda: node.running.kafka.publisher_stats().emitted >= 3, what="ticks queued")
    assert time.monotonic() - t0 < 15


def test_a_node_without_kafka_starts_and_serves_as_before(tmp_path):
    with running_node(tmp_path) as node, NameServerClient(node.addr) as c:
        register(c)
        assert c.topic_route("TopicTest").broker_datas[0].broker_addrs == {0: ADDR}
        assert node.running.kafka is None
        assert type(node.running.context.observer).__name__ == "NodeObserver"
        assert node.running.expiry.enabled
