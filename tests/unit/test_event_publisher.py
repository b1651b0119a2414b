"""The publisher without Kafka: queue policy, what each observer call publishes, the sender thread."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, NotLeaderForPartitionError
from kafka.future import Future

from common.contract import (
    AdminOp,
    DataVersionInfo,
    Event,
    EventType,
    QueueInfo,
    decode_event,
    encode_event,
    event_key,
)
from common.protocol import fastjson
from common.protocol.codes import RequestCode
from common.protocol.headers import RegisterBrokerHeader
from common.protocol.types import DataVersion, QueueData, RegisterBrokerBody, TopicConfig
from common.routes import RouteInfoManager, RouteSettings, UnregisterRequest
from namesrv.config import ConfigError
from namesrv.events.link import check_bootstrap_servers
from namesrv.events.publisher import UNREGISTER_SOURCES, EventPublisher, EventQueue, PublisherSettings
from namesrv.handlers import AdminChange
from namesrv.liveness import Cause, departure
from tests.support.clock import Clock

REPO = Path(__file__).resolve().parents[2]

CLUSTER, NAME, ADDR = "DefaultCluster", "broker-a", "127.0.0.1:10911"


def ev(seq: int, light: bool) -> Event:
    return Event(EventType.HEARTBEAT if light else EventType.REGISTER, "n", seq, seq)


def seqs(events):
    return [e.seq for e in events]


# --------------------------------------------------------------------------- the queue


def test_full_queue_drops_oldest_heartbeat_first_then_oldest_registration():
    q = EventQueue(3)
    for seq, light in [(1, False), (2, True), (3, True), (4, False)]:
        q.put(ev(seq, light))
    assert (q.dropped_light, q.dropped_heavy) == (1, 0)  # seq 2 went, the registration stayed
    q.put(ev(5, False))
    q.put(ev(6, False))  # nothing light left: the oldest registration goes
    assert (q.dropped_light, q.dropped_heavy) == (2, 1)
    assert seqs(q.take(10, 0)) == [4, 5, 6]


def test_take_merges_lanes_in_seq_order_and_put_back_restores_order():
    q = EventQueue(10)
    for seq, light in [(1, True), (2, False), (3, True), (4, False)]:
        q.put(ev(seq, light))
    first = q.take(3, 0)
    assert seqs(first) == [1, 2, 3]
    q.put(ev(5, True))
    q.put_back([first[2]])
    q.put_back([first[1]])
    assert seqs(q.take(10, 0)) == [2, 3, 4, 5]
    assert q.take(10, 0) == []


# --------------------------------------------------------------------------- observer calls


def make_publisher(**settings) -> tuple[EventPublisher, RouteInfoManager]:
    routes = RouteInfoManager(RouteSettings())
    clock = Clock(1_700_000_000_000, step_ms=1)  # every event a new millisecond
    publisher = EventPublisher(PublisherSettings("k:1", "events", "ns-1", **settings), routes, clock_ms=clock)
    return publisher, routes


def register(
    publisher,
    routes,
    dv=DataVersion(1, 0, 5),
    timeout=None,
    zone=None,
    filters=None,
    mappings=None,
    acting=True,
    heard_at_ms=None,
):
    header = RegisterBrokerHeader(
        broker_name=NAME, broker_addr=ADDR, cluster_name=CLUSTER, ha_server_addr="127.0.0.1:10912",
        broker_id=0, heartbeat_timeout_millis=timeout, enable_acting_master=acting,
    )  # fmt: skip
    topics = {"T1": TopicConfig("T1", 4, 2, 6), "T2": TopicConfig("T2", 1, 1, 4, topic_sys_flag=1)}
    body = RegisterBrokerBody(dv, topics, filter_server_list=filters, topic_queue_mapping_info_map=mappings or {})
    result = routes.register_broker(CLUSTER, ADDR, NAME, 0, "127.0.0.1:10912", zone, timeout, acting, body, None)
    publisher.broker_registered(header, body, result, heard_at_ms)


def drain(publisher) -> list[Event]:
    return publisher.queue.take(1000, 0)


def test_first_registration_carries_the_topic_table_then_unchanged_ones_are_heartbeats():
    p, routes = make_publisher()
    register(p, routes, zone="z1")
    register(p, routes, zone="z1")
    register(p, routes, zone="z1", dv=DataVersion(2, 0, 6), timeout=30000)
    first, again, changed = drain(p)
    assert first.type is EventType.REGISTER and first.seq == 1 and first.node == "ns-1"
    assert (first.cluster_name, first.broker_name, first.broker_id, first.broker_addr) == (CLUSTER, NAME, 0, ADDR)
    assert (first.ha_server_addr, first.zone_name, first.enable_acting_master) == ("127.0.0.1:10912", "z1", True)
    assert first.heartbeat_timeout_millis == 120000  # the broker sent none: the default applies
    assert first.data_version == DataVersionInfo(1, 0, 5)
    assert first.topics == {"T1": QueueInfo(4, 2, 6, 0), "T2": QueueInfo(1, 1, 4, 1)}
    assert again.type is EventType.HEARTBEAT and again.source == "REGISTER_BROKER" and again.topics is None
    assert again.data_version == DataVersionInfo(1, 0, 5)
    assert changed.type is EventType.REGISTER and changed.heartbeat_timeout_millis == 30000
    assert p.last_event_time(CLUSTER, ADDR) == changed.event_time
    for e in (first, again, changed):
        assert decode_event(encode_event(e)) == e


def test_registrations_carry_filter_servers_and_mappings_and_a_filter_change_is_a_registration():
    p, routes = make_publisher()
    # a static topic's mapping as a broker sends it: fastjson writes currIdMap's integer keys bare
    info = {"topic": "T1", "bname": NAME, "epoch": 2, "totalQueues": 12, "currIdMap": {i: i for i in range(12)}}
    register(p, routes, filters=["10.0.0.9:1", "10.0.0.9:2"], mappings={"T1": info})
    register(p, routes, filters=["10.0.0.9:1", "10.0.0.9:2"], mappings={"T1": info})  # unchanged
    register(p, routes, filters=[], mappings={"T1": info})  # same DataVersion, filters gone
    register(p, routes, dv=DataVersion(2, 0, 6), filters=[])
    register(p, routes, dv=DataVersion(3, 0, 7))  # a broker before 3.0.11: no list at all
    first, unchanged, cleared, changed, ancient = drain(p)

    assert first.type is EventType.REGISTER and first.filter_server_list == ["10.0.0.9:1", "10.0.0.9:2"]
    text = first.topic_queue_mapping_info_map["T1"]
    assert "{0:0,1:1,2:2," in text  # integer keys kept bare, in numeric order
    assert fastjson.loads(text) == info
    assert unchanged.type is EventType.HEARTBEAT and unchanged.filter_server_list is None
    assert cleared.type is EventType.REGISTER and cleared.filter_server_list == []
    assert cleared.topics == first.topics and cleared.data_version == first.data_version
    assert changed.type is EventType.REGISTER and changed.filter_server_list == []
    assert changed.topic_queue_mapping_info_map is None  # no mappings sent: the field is left out
    assert ancient.type is EventType.REGISTER and ancient.filter_server_list is None
    wire = json.loads(encode_event(cleared))
    assert wire["filterServerList"] == [] and wire["topicQueueMappingInfoMap"] == {"T1": text}
    for e in (first, cleared, changed, ancient):
        assert decode_event(encode_event(e)) == e


def test_a_zone_or_acting_master_change_with_the_same_data_version_is_a_registration():
    p, routes = make_publisher()
    register(p, routes, zone="z1")
    register(p, routes, zone="z2")
    register(p, routes, zone="z2", acting=False)
    register(p, routes, zone="z2", acting=False)
    first, moved, flag, unchanged = drain(p)
    assert moved.type is EventType.REGISTER and moved.zone_name == "z2" and moved.topics == first.topics
    assert moved.data_version == first.data_version
    assert flag.type is EventType.REGISTER and flag.enable_acting_master is False
    assert unchanged.type is EventType.HEARTBEAT


def test_order_topic_config_changes_are_published_and_other_namespaces_are_not():
    p, _ = make_publisher()
    p.kv_config_changed("ORDER_TOPIC_CONFIG", "TopicOrder", "broker-a:4;broker-b:4")
    p.kv_config_changed("OTHER", "TopicOrder", "x")
    p.kv_config_changed("ORDER_TOPIC_CONFIG", "TopicOrder", None)
    put, delete = drain(p)
    assert (put.type, put.topic, put.order_topic_conf) == (
        EventType.ORDER_TOPIC_CONF,
        "TopicOrder",
        "broker-a:4;broker-b:4",
    )
    assert (delete.type, delete.topic, delete.order_topic_conf) == (EventType.ORDER_TOPIC_CONF, "TopicOrder", None)
    assert delete.seq == put.seq + 1 and delete.event_time > put.event_time
    for e in (put, delete):
        assert decode_event(encode_event(e)) == e and event_key(e) == b"TopicOrder"
    assert p.stats().emitted == 2


def test_heartbeats_name_the_broker_and_skip_brokers_the_node_does_not_hold():
    p, routes = make_publisher()
    p.broker_heartbeat(CLUSTER, ADDR, RequestCode.QUERY_DATA_VERSION)
    assert drain(p) == [] and p.stats().ignored == 1 and p.last_event_time(CLUSTER, ADDR) is None
    register(p, routes)
    drain(p)
    p.broker_heartbeat(CLUSTER, ADDR, RequestCode.BROKER_HEARTBEAT)
    p.broker_heartbeat(CLUSTER, ADDR, RequestCode.QUERY_DATA_VERSION)
    hb, qdv = drain(p)
    assert (hb.type, hb.source, hb.broker_name, hb.broker_id) == (EventType.HEARTBEAT, "BROKER_HEARTBEAT", NAME, 0)
    assert qdv.source == "QUERY_DATA_VERSION" and qdv.seq == hb.seq + 1
    assert p.last_event_time(CLUSTER, ADDR) == qdv.event_time


def test_what_a_node_catching_up_read_is_published_at_when_it_was_heard_and_fences_from_then():
    """Read by a node woken from standing still, a registration or heartbeat is stamped with the moment the
    node stopped: the monitor counts it no later than it can have been sent, and a removal decided on a later
    heartbeat from another node is not fenced by it."""
    p, routes = make_publisher()
    stopped = 1_600_000_000_000
    register(p, routes, heard_at_ms=stopped)
    register(p, routes, dv=DataVersion(2, 0, 6), heard_at_ms=stopped)
    register(p, routes, dv=DataVersion(2, 0, 6), heard_at_ms=stopped)
    p.broker_heartbeat(CLUSTER, ADDR, RequestCode.BROKER_HEARTBEAT, stopped)
    p.broker_heartbeat(CLUSTER, ADDR, RequestCode.QUERY_DATA_VERSION, stopped)
    events = drain(p)
    assert [e.type for e in events] == [EventType.REGISTER] * 2 + [EventType.HEARTBEAT] * 3
    assert {e.event_time for e in events} == {stopped}
    assert p.last_event_time(CLUSTER, ADDR) == stopped
    p.broker_heartbeat(CLUSTER, ADDR, RequestCode.BROKER_HEARTBEAT)  # caught up: now again
    (now,) = drain(p)
    assert now.event_time > stopped + 60_000 and p.last_event_time(CLUSTER, ADDR) == now.event_time


def test_unregistrations_say_why_and_closed_connections_are_their_own_type():
    p, _ = make_publisher()
    req = UnregisterRequest(CLUSTER, ADDR, NAME, 0, 1)
    for why in (
        departure.BROKER_ASKED,
        departure.LOCAL_EXPIRY,
        departure.MONITOR_EXPIRE,
        departure.MONITOR_REMOVE,
        departure.PEER_CLOSED,
        departure.idle(30),
        departure.malformed_frame(ValueError("bad length")),
    ):
        p.broker_unregistered(req, why)
    events = drain(p)
    assert [(e.type, e.source) for e in events[:4]] == [
        (EventType.UNREGISTER, "UNREGISTER_BROKER"), (EventType.UNREGISTER, "LOCAL_EXPIRY"),
        (EventType.UNREGISTER, "EXPIRE"), (EventType.UNREGISTER, "REMOVE"),
    ]  # fmt: skip
    closed = events[4]
    assert (closed.type, closed.reason, closed.broker_addr, closed.broker_name) == (
        EventType.CHANNEL_CLOSED,
        "connection closed",
        ADDR,
        NAME,
    )
    assert [(e.type, e.reason) for e in events[5:]] == [
        (EventType.CHANNEL_CLOSED, "idle for 30 s (serverChannelMaxIdleTimeSeconds)"),
        (EventType.CHANNEL_CLOSED, "malformed frame: bad length"),
    ]


@pytest.mark.parametrize("cause", list(Cause))
def test_every_departure_cause_is_either_an_unregister_source_or_a_connection_end(cause):
    # a new cause must be given its event on purpose, never fall through to CHANNEL_CLOSED
    assert cause.connection_ended != (cause in UNREGISTER_SOURCES)


def test_admin_operations_carry_their_details():
    p, _ = make_publisher()
    p.route_changed_by_admin(AdminChange(RequestCode.WIPE_WRITE_PERM_OF_BROKER, broker_name=NAME, topic_count=2))
    p.route_changed_by_admin(AdminChange(RequestCode.DELETE_TOPIC_IN_NAMESRV, topic="T1"))
    p.route_changed_by_admin(
        AdminChange(RequestCode.REGISTER_TOPIC_IN_NAMESRV, topic="T3", queue_datas=(QueueData(NAME, 8, 8, 6),))
    )
    wipe, delete, reg = drain(p)
    assert (wipe.op, wipe.broker_name, wipe.topic_count) == (AdminOp.WIPE_WRITE_PERM, NAME, 2)
    assert (delete.op, delete.topic, delete.cluster_name) == (AdminOp.DELETE_TOPIC, "T1", None)
    assert reg.op is AdminOp.REGISTER_TOPIC and reg.queue_datas[0].broker_name == NAME
    assert reg.queue_datas[0].queues == QueueInfo(8, 8, 6, 0)


def test_a_publishing_bug_never_escapes_into_the_request(caplog):
    p, _ = make_publisher()
    broken = AdminChange(RequestCode.REGISTER_TOPIC_IN_NAMESRV, topic="T", queue_datas=(None,))  # type: ignore[arg-type]
    p.route_changed_by_admin(broken)
    assert drain(p) == []
    assert "could not publish" in caplog.text


def test_ticks_carry_only_the_node_clock_and_whether_its_local_scan_is_on():
    p, _ = make_publisher()
    tick = p.tick()
    assert (tick.type, tick.broker_addr, tick.node, tick.local_scan) == (EventType.TICK, None, "ns-1", None)
    assert (p.tick(local_scan=True).local_scan, p.tick(local_scan=False).local_scan) == (True, False)


def test_the_tick_task_asks_the_scan_each_time():
    p, _ = make_publisher(tick_interval_ms=0)  # no waiting between ticks
    scan = iter([True, False])

    async def two_ticks() -> None:
        task = asyncio.ensure_future(p.run_ticks(lambda: next(scan)))
        while p.stats().emitted < 2:
            await asyncio.sleep(0)
        task.cancel()

    asyncio.run(two_ticks())
    assert [e.local_scan for e in drain(p)] == [True, False]


def test_a_tick_past_a_brokers_deadline_reports_it_silent_once_per_silence():
    p, routes = make_publisher()
    clock = p.clock_ms
    register(p, routes, timeout=10_000)
    heard = drain(p)[-1].event_time
    clock.ms = heard + 10_000 - 1  # the tick's own time is heard + 10,000: not past the deadline yet
    assert [e.type for e in (p.tick(), *drain(p)[1:])] == [EventType.TICK]
    p.tick()  # heard + 10,001: strictly past it, as RocketMQ's last + timeout < now
    tick, silent = drain(p)
    assert (silent.type, silent.cluster_name, silent.broker_addr, silent.broker_name, silent.broker_id) == (
        EventType.SILENT, CLUSTER, ADDR, NAME, 0,
    )  # fmt: skip
    assert silent.event_time > heard + 10_000 and silent.reason == f"nothing heard since {heard} (timeout 10000 ms)"
    clock.advance(60_000)
    p.tick()
    assert [e.type for e in drain(p)] == [EventType.TICK]  # once per silence
    # a heartbeat starts a new silence, with the registration's timeout
    p.broker_heartbeat(CLUSTER, ADDR, RequestCode.BROKER_HEARTBEAT)
    clock.advance(10_001)
    p.tick()
    assert [e.type for e in drain(p)] == [EventType.HEARTBEAT, EventType.TICK, EventType.SILENT]


def test_a_deadline_between_two_ticks_is_reported_when_it_passes_not_at_the_next_tick():
    p, routes = make_publisher(tick_interval_ms=3_600_000)  # the next tick is an hour away
    clock = p.clock_ms
    register(p, routes, timeout=10_000)
    heard = drain(p)[-1].event_time

    async def run() -> list[EventType]:
        clock.ms = heard + 10_000 - 50  # the first tick comes 50 ms before the deadline
        task = asyncio.ensure_future(p.run_ticks())
        while p.stats().emitted < 2:  # the registration, then the first tick
            await asyncio.sleep(0)
        clock.ms = heard + 10_000 + 1  # the task sleeps until the deadline's millisecond (50 ms)
        deadline = time.monotonic() + 5
        while p.stats().emitted < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        task.cancel()
        return [e.type for e in drain(p)]

    assert asyncio.run(run()) == [EventType.TICK, EventType.SILENT]


def test_a_broker_that_unregistered_is_never_reported_silent():
    p, routes = make_publisher()
    register(p, routes, timeout=10_000)
    p.broker_unregistered(UnregisterRequest(CLUSTER, ADDR, NAME, 0, 1), departure.BROKER_ASKED)
    drain(p)
    p.clock_ms.advance(60_000)
    p.tick()
    assert [e.type for e in drain(p)] == [EventType.TICK]


def test_a_broker_whose_connection_closed_is_still_reported_silent_at_its_deadline_once():
    # the node dropped it, but heard nothing since: where the other nodes that held it are dead, this
    # report is what lets the monitor decide at the deadline
    p, routes = make_publisher()
    register(p, routes, timeout=10_000)
    heard = drain(p)[-1].event_time
    p.broker_unregistered(UnregisterRequest(CLUSTER, ADDR, NAME, 0, 1), departure.PEER_CLOSED)
    assert [e.type for e in drain(p)] == [EventType.CHANNEL_CLOSED]
    p.clock_ms.ms = heard + 10_000 - 1
    p.tick()
    assert [e.type for e in drain(p)] == [EventType.TICK]
    p.tick()
    tick, silent = drain(p)
    assert (silent.type, silent.broker_addr, silent.broker_name) == (EventType.SILENT, ADDR, NAME)
    assert silent.reason == f"nothing heard since {heard} (timeout 10000 ms)"
    p.clock_ms.advance(60_000)
    p.tick()
    assert [e.type for e in drain(p)] == [EventType.TICK]


# --------------------------------------------------------------------------- the sender thread


class FakeProducer:
    """Records sends; ``outcomes`` decides each send: None = ack, an exception = raise or fail."""

    def __init__(self, outcomes=()) -> None:
        self.outcomes = list(outcomes)
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.lock = threading.Lock()

    def send(self, topic, key=None, value=None):
        with self.lock:
            outcome = self.outcomes.pop(0) if self.outcomes else None
        if isinstance(outcome, KafkaTimeoutError):
            raise outcome
        future = Future()
        if outcome is None:
            self.sent.append((topic, key, value))
            future.success("ok")
        else:
            future.failure(outcome)
        return future

    def flush(self, timeout=None):
        pass

    def close(self, timeout=None):
        pass


def run_with(producer, events) -> EventPublisher:
    p, _ = make_publisher()
    p._producer_factory = lambda settings, client_id: producer
    for e in events:
        p.queue.put(e)
    p.start()
    assert p.flush(5)
    p.stop(1)
    return p


def test_sender_publishes_in_order_with_broker_keys():
    producer = FakeProducer()
    hb = Event(EventType.HEARTBEAT, "", 1, 1, cluster_name=CLUSTER, broker_addr=ADDR, source="BROKER_HEARTBEAT")
    p = run_with(producer, [hb, Event(EventType.TICK, "", 2, 2)])
    assert [(t, k) for t, k, _ in producer.sent] == [("events", ADDR.encode()), ("events", b"ns-1")]
    assert decode_event(producer.sent[0][2]).node == "ns-1"  # stamped when sent
    assert (p.stats().sent, p.stats().queued) == (2, 0)


def test_undelivered_registrations_are_retried_and_heartbeats_counted_as_failed(monkeypatch):
    monkeypatch.setattr("namesrv.events.publisher.RETRY_PAUSE_S", 0.01)  # the pause's length is not the point
    producer = FakeProducer([NotLeaderForPartitionError(), NotLeaderForPartitionError(), KafkaTimeoutError()])
    p = run_with(producer, [ev(1, False), ev(2, True), ev(3, False)])
    assert sorted(json.loads(v)["seq"] for _, _, v in producer.sent) == [1, 3]
    s = p.stats()
    assert (s.requeued, s.failed, s.sent) == (1, 1, 2)


def test_non_retriable_send_errors_are_counted_and_skipped():
    producer = FakeProducer([MessageSizeTooLargeError()])
    p = run_with(producer, [ev(1, False), ev(2, False)])
    assert [json.loads(v)["seq"] for _, _, v in producer.sent] == [2]
    assert p.stats().failed == 1


def test_bad_bootstrap_servers_stop_the_node_before_it_listens():
    check_bootstrap_servers("kafka-1:9092, kafka-2:9092")
    check_bootstrap_servers("localhost")
    check_bootstrap_servers("a:1,,b:2,")  # empty entries are dropped, as by every Kafka client we build
    for bad in ("127.0.0.1:notaport", "a:70000", ":9092"):
        with pytest.raises(ConfigError, match=f"kafkaBootstrapServers='{bad}' is not a valid .*: bad entry"):
            check_bootstrap_servers(bad)
    with pytest.raises(ConfigError, match="kafkaBootstrapServers=' , ' .* names no server"):
        check_bootstrap_servers(" , ")


def test_the_event_queue_capacity_comes_from_the_node_config():
    from namesrv.config import load_config

    config = load_config(None, {"kafkaBootstrapServers": "127.0.0.1:9092", "eventQueueCapacity": "3"})
    assert PublisherSettings.from_config(config).capacity == 3
    with pytest.raises(ConfigError, match="eventQueueCapacity"):
        load_config(None, {"eventQueueCapacity": "0"})


# --------------------------------------------------------------------------- bounds before queueing


def test_an_event_outside_the_schema_bounds_is_counted_and_never_queued_with_one_warning_per_field(caplog):
    p, routes = make_publisher()
    long_addr = "10.0.0.1:" + "9" * 2000 + "\n"
    routes.register_broker(CLUSTER, long_addr, NAME, 0, None, body=RegisterBrokerBody(DataVersion(1, 0, 5), {}))
    for _ in range(3):
        p.broker_heartbeat(CLUSTER, long_addr, RequestCode.BROKER_HEARTBEAT)
    p.kv_config_changed("ORDER_TOPIC_CONFIG", "T" * 1025, "a:4")
    p.tick()
    (tick,) = drain(p)
    assert tick.seq == 1  # refused events take no number: the job sees no gap
    s = p.stats()
    assert (s.invalid, s.emitted, s.queued) == (4, 1, 0)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2  # one for brokerAddr (three heartbeats), one for the topic
    assert "not publishing a HEARTBEAT event of broker '10.0.0.1:999" in warnings[0]
    assert "event.brokerAddr: 2010 characters, more than the 1024 allowed" in warnings[0]
    assert "\n" not in warnings[0] and len(warnings[0]) < 400  # quoted and cut, not the raw 2 kB name
    assert "event.topic: 1025 characters" in warnings[1]
    # the node saw the broker alive all the same: an action based on older evidence stays stale
    assert p.last_event_time(CLUSTER, long_addr) is not None


def test_a_broker_timeout_outside_the_schema_range_is_clamped_not_dropped(caplog):
    p, routes = make_publisher()
    register(p, routes, timeout=0)
    register(p, routes, timeout=0, dv=DataVersion(2, 0, 6))
    register(p, routes, timeout=10**15, dv=DataVersion(3, 0, 7))
    low, again, high = drain(p)
    assert low.heartbeat_timeout_millis == again.heartbeat_timeout_millis == 1
    assert high.heartbeat_timeout_millis == 864_000_000
    assert p.stats().invalid == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "heartbeatTimeoutMillis=0: publishing 1" in warnings[0]


def test_a_long_close_reason_is_cut_to_its_bound():
    p, _ = make_publisher()
    p.broker_unregistered(
        UnregisterRequest(CLUSTER, ADDR, NAME, 0, 1), departure.connection_error(OSError("x" * 10_000))
    )
    (closed,) = drain(p)
    assert closed.type is EventType.CHANNEL_CLOSED and len(closed.reason) == 4096
    assert decode_event(encode_event(closed)) == closed


def test_a_node_name_or_monitor_id_longer_than_the_schema_allows_stops_the_node_at_start_up():
    from namesrv.config import load_config
    from namesrv.events.link import check_names

    check_names(load_config(None, {"nodeName": "n" * 1024, "trustedMonitors": "a;" + "m" * 1024}))
    with pytest.raises(ConfigError, match="nodeName: a name of 1025 characters; events and actions allow at most 1024"):
        check_names(load_config(None, {"nodeName": "n" * 1025}))
    with pytest.raises(ConfigError, match="trustedMonitors: a name of 1025 characters"):
        check_names(load_config(None, {"trustedMonitors": "ok;" + "m" * 1025}))


def test_ticks_are_light_and_every_250_ms_by_default():
    from namesrv.config import load_config

    assert PublisherSettings.from_config(load_config(None, {})).tick_interval_ms == 250
    # under pressure a queue full of ticks still takes a registration, dropping the oldest tick
    q = EventQueue(3)
    for seq in (1, 2, 3):
        q.put(Event(EventType.TICK, "n", seq, seq))
    q.put(ev(4, False))
    assert (q.dropped_light, q.dropped_heavy) == (1, 0) and seqs(q.take(10, 0)) == [2, 3, 4]


#: what a Kafka client waits for an answer when nothing sets ``request.timeout.ms`` (Kafka's default)
KAFKA_DEFAULT_REQUEST_TIMEOUT_MS = 30_000


def test_the_nodes_producers_give_up_on_a_frozen_kafka_node_well_before_the_monitor_s_clients_do(tmp_path):
    """A frozen Kafka node holds the produce requests and the monitor's fetches alike until they time out.
    The events it held must be at their partitions' new leaders before the monitor reads on past them, or
    the monitor sees the other partitions' time pass a live broker's deadline without its heartbeats."""
    from namesrv.events.publisher import kafka_producer
    from streaming.config import load_config

    producer = kafka_producer(PublisherSettings("127.0.0.1:1", "events", max_block_ms=100), "t")
    try:
        ours = producer.config["request_timeout_ms"]
    finally:
        producer.close(0)
    options = load_config(REPO / "conf" / "streaming.properties", base_dir=tmp_path).source_options()
    monitor = int(options.get("kafka.request.timeout.ms", KAFKA_DEFAULT_REQUEST_TIMEOUT_MS))
    # a retry after the timeout, on fresh metadata, still lands well within the monitor's wait
    assert 2 * ours <= monitor, (ours, monitor)
