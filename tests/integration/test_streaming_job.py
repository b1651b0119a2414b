"""The liveness monitor end to end: real Apache Kafka, real Redis, local Spark, synthetic event times.

Events are written to Kafka as two nodes (n1, n2) would write them, with event times chosen by
the test, so every expiry happens at a known event time and nothing depends on the wall clock.
The watermark delay is the shipped 120 s: a broker still expires as soon as event time passes its
deadline. The job runs with a 200 ms trigger; ``until`` waits for what the job publishes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kafka import TopicPartition

from common import kafka_clients
from common.contract import (
    ActionType,
    DataVersionInfo,
    Event,
    EventType,
    QueueInfo,
    decode_action,
    encode_event,
    event_key,
    wall_ms,
)
from infra.config import TopicSpec
from infra.processes import free_port
from streaming import job
from streaming.alerts import decode_alert
from streaming.config import load_config
from streaming.routes import RouteLookup
from streaming.session import build_spark
from tests.support import alertmanager
from tests.support.prometheus import running_prometheus

pytestmark = pytest.mark.timeout(240)

CLUSTER = "DefaultCluster"
TIMEOUT = 10_000  # every broker's heartbeatTimeoutMillis
NODE_SILENT = 10_000
A = ("broker-a", "10.0.0.1:10911")  # keeps heartbeating
B = ("broker-b", "10.0.0.2:10911")  # goes silent
C = ("broker-c", "10.0.0.3:10911")  # unregisters
TOPICS = {A: ["TA", "TS"], B: ["TB", "TS"], C: ["TC"]}


# --------------------------------------------------------------------------- services


@pytest.fixture(scope="module")
def spark():
    cfg = load_config(None, {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2"})
    session = build_spark(cfg)
    session.sparkContext.setLogLevel("ERROR")
    return session  # shared with the other streaming test modules; Spark stops it at exit


class World:
    """One test's topics, Redis prefix and checkpoint, and the two nodes' event clocks."""

    def __init__(self, name: str, services, tmp_path: Path) -> None:
        kafka, redis = services
        self.bootstrap = kafka.bootstrap_servers
        self.events_topic, self.actions_topic, self.alerts_topic = f"{name}-events", f"{name}-actions", f"{name}-alerts"
        kafka.ensure_topics(
            [TopicSpec(self.events_topic, 2), TopicSpec(self.actions_topic, 1), TopicSpec(self.alerts_topic, 1)]
        )
        self.cfg = load_config(None, {
            "kafka.bootstrap": self.bootstrap,
            "kafka.eventsTopic": self.events_topic,
            "kafka.actionsTopic": self.actions_topic,
            "kafka.alertsTopic": self.alerts_topic,
            "monitor.checkpointDir": str(tmp_path / "checkpoint"),
            "monitor.heartbeatIntervalMillis": "1000",
            "monitor.id": "test-monitor",
            "alerts.nodeSilentMillis": str(NODE_SILENT),
            "alerts.monitorLagMillis": str(10**12),  # synthetic times run ahead of the clock
            "redis.url": redis.url,
            "redis.keyPrefix": name,
            "spark.master": "local[2]",
        })  # fmt: skip
        self.producer = kafka_clients.producer(self.bootstrap)
        self.seq = {"n1": 0, "n2": 0}
        self.t0 = 1_700_000_000_000
        self.lookup = RouteLookup(redis.url, prefix=name)
        self._seen_actions: list = []
        self._seen_alerts: list = []
        self._consumer = kafka_clients.consumer(self.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=10)
        self._consumer.assign([TopicPartition(self.actions_topic, 0), TopicPartition(self.alerts_topic, 0)])
        for tp in self._consumer.assignment():
            self._consumer.seek(tp, 0)

    # -- what the nodes send

    def send(self, node: str, etype: EventType, dt: int, broker=None, **kw) -> None:
        self.seq[node] += 1
        fields = dict(type=etype, node=node, event_time=self.t0 + dt, seq=self.seq[node], **kw)
        if broker is not None:
            fields.update(cluster_name=CLUSTER, broker_name=broker[0], broker_addr=broker[1], broker_id=0)
        e = Event(**fields)
        self.producer.send(self.events_topic, key=event_key(e), value=encode_event(e))

    def register(self, broker, dt: int, nodes=("n1", "n2")) -> None:
        for node in nodes:
            self.send(node, EventType.REGISTER, dt, broker, heartbeat_timeout_millis=TIMEOUT,
                      data_version=DataVersionInfo(1, 0, 1), ha_server_addr=broker[1], enable_acting_master=False,
                      topics={t: QueueInfo(4, 4, 6) for t in [*TOPICS[broker], CLUSTER]})  # fmt: skip

    def heartbeat(self, broker, dt: int, nodes=("n1", "n2")) -> None:
        for node in nodes:
            self.send(node, EventType.HEARTBEAT, dt, broker, source="BROKER_HEARTBEAT")

    def tick(self, dt: int, nodes=("n1", "n2")) -> None:
        for node in nodes:
            self.send(node, EventType.TICK, dt)

    def flush(self) -> None:
        self.producer.flush()

    # -- what the job publishes

    def _drain(self) -> None:
        for tp, records in self._consumer.poll(timeout_ms=100).items():
            for r in records:
                if tp.topic == self.actions_topic:
                    self._seen_actions.append(decode_action(r.value))
                else:
                    self._seen_alerts.append(decode_alert(r.value))

    def actions(self, *types: ActionType) -> list:
        self._drain()
        return [a for a in self._seen_actions if a.type in types]

    def decisions(self) -> list[tuple[str, str, int]]:
        return [
            (str(a.type), a.broker_addr, a.last_heartbeat - self.t0)
            for a in self.actions(ActionType.EXPIRE, ActionType.REMOVE)
        ]

    def alerts(self) -> list[tuple[str, str, str]]:
        self._drain()
        return [
            (str(a.kind), str(a.state), a.broker_addr or a.topic or a.node or a.broker_name or "")
            for a in self._seen_alerts
        ]

    def route_brokers(self, topic: str) -> set[str] | None:
        route = self.lookup.get(topic)
        return None if route is None else {q.broker_name for q in route.queue_datas}

    def close(self) -> None:
        self.producer.close()
        self._consumer.close()
        self.lookup.close()


@pytest.fixture
def world(request, services, tmp_path):
    w = World(request.node.name.replace("_", "-")[:40], services, tmp_path)
    yield w
    w.close()


def until(
    monitor: job.MonitorJob, check: Callable[[], object], timeout: float = 60.0, what: str = "", drain: bool = True
):
    """Run the query until ``check()`` is true (no-data batches fire timers on later triggers).

    ``drain=False`` when something keeps producing events: processAllAvailable would never return.
    """
    deadline = time.monotonic() + timeout
    while True:
        if drain:
            monitor.process_all_available()
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.2)


def settle(monitor: job.MonitorJob, seconds: float = 1.5) -> None:
    """Let the job run a few more triggers, for checks that something did *not* happen."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        monitor.process_all_available()
        time.sleep(0.2)


def a_and_b_serve_ts(w: World, monitor: job.MonitorJob) -> None:
    """Brokers A and B register through both nodes at event time 0, and Redis shows both serving TS."""
    w.register(A, 0)
    w.register(B, 0)
    w.tick(0)
    w.flush()
    until(monitor, lambda: w.route_brokers("TS") == {"broker-a", "broker-b"}, what="routes")


@contextmanager
def running(spark, world: World) -> Iterator[job.MonitorJob]:
    """The job on ``world``, stopped afterwards; a query that failed on its own fails the test."""
    monitor = job.start(spark, world.cfg, trigger_ms=200)
    try:
        yield monitor
    finally:
        monitor.stop()
    assert monitor.query.exception() is None


# --------------------------------------------------------------------------- the scenario


def test_expire_once_remove_once_keep_the_live_one_and_ticks_expire_the_silent(spark, world):
    w = world
    with running(spark, w) as monitor:
        t_start = time.monotonic()
        # t=0: three brokers register through both nodes
        for b in (A, B, C):
            w.register(b, 0)
        w.tick(0)
        w.flush()
        until(monitor, lambda: w.lookup.topics() == sorted(["TA", "TB", "TC", "TS", CLUSTER]), what="routes")
        assert w.route_brokers("TS") == {"broker-a", "broker-b"}
        assert set(w.lookup.cluster_info().broker_addr_table) == {"broker-a", "broker-b", "broker-c"}
        route_latency = time.monotonic() - t_start

        # t=5 s: A and B heartbeat, C unregisters (reported by both nodes): one REMOVE
        w.heartbeat(A, 5_000)
        w.heartbeat(B, 5_000)
        for node in ("n1", "n2"):
            w.send(node, EventType.UNREGISTER, 5_000, C, source="UNREGISTER_BROKER")
        w.tick(5_000)
        w.flush()
        until(monitor, lambda: w.lookup.get("TC") is None, what="TC removed")
        assert w.decisions() == [("REMOVE", C[1], 5_000)]
        assert "broker-c" not in w.lookup.cluster_info().broker_addr_table

        # t=15 s: B's deadline is 5 + 10 s: not yet
        w.heartbeat(A, 10_000)
        w.heartbeat(A, 15_000)
        w.tick(15_000)
        w.flush()
        settle(monitor)
        assert w.decisions() == [("REMOVE", C[1], 5_000)]
        assert w.route_brokers("TB") == {"broker-b"}

        # t=16 s: past 15 s, B expires, once (the 120 s watermark delay is not waited for); n2 stops
        # ticking from here on
        w.tick(16_000, nodes=("n1",))
        w.flush()
        until(monitor, lambda: len(w.decisions()) == 2, what="B expired")
        assert w.decisions()[1] == ("EXPIRE", B[1], 5_000)
        until(monitor, lambda: w.lookup.get("TB") is None, what="TB gone")
        assert w.route_brokers("TS") == {"broker-a"}

        # A keeps going; time passes; B is not expired again and A is not touched
        w.heartbeat(A, 24_000, nodes=("n1",))
        w.tick(30_000, nodes=("n1",))
        w.flush()
        until(monitor, lambda: ("NODE_SILENT", "OPEN", "n2") in w.alerts(), what="n2 silent")
        settle(monitor)
        assert [d[:2] for d in w.decisions()] == [("REMOVE", C[1]), ("EXPIRE", B[1])]
        assert w.route_brokers("TA") == {"broker-a"}

        # every broker silent, only ticks: A expires after its own deadline (24 + 10 s)
        w.tick(40_000, nodes=("n1",))
        w.tick(50_000, nodes=("n1",))
        w.flush()
        until(monitor, lambda: len(w.decisions()) == 3, what="A expired")
        assert w.decisions()[2] == ("EXPIRE", A[1], 24_000)
        until(monitor, lambda: w.lookup.topics() == [], what="no routes left")
        assert w.lookup.cluster_info().broker_addr_table == {}

        alerts = w.alerts()
        for expected in [
            ("BROKER_REMOVED", "OPEN", C[1]),
            ("BROKER_EXPIRED", "OPEN", B[1]),
            ("TOPIC_NOT_WRITABLE", "OPEN", "broker-b"),  # TB, lost with B (TS is still on A)
            ("BROKER_EXPIRED", "OPEN", A[1]),
            ("TOPIC_NOT_WRITABLE", "OPEN", "broker-a"),  # TA and TS: one incident, not one per topic
        ]:
            assert alerts.count(expected) == 1, (expected, alerts)
        assert len([a for a in alerts if a[0] == "TOPIC_NOT_WRITABLE"]) == 2, alerts
        open_now = {a.incident for a in w.lookup.alerts()}
        assert f"BROKER_EXPIRED|{CLUSTER}|{B[1]}" in open_now and "NODE_SILENT|n2" in open_now
        # the monitor's own heartbeat reached the actions topic
        until(monitor, lambda: w.actions(ActionType.MONITOR_HEARTBEAT), what="monitor heartbeat")
        durations = monitor.status.batch_durations_ms
        print(
            f"\nscenario: {len(durations)} batches, median {sorted(durations)[len(durations) // 2]} ms, "
            f"max {max(durations)} ms; first routes visible after {route_latency:.1f} s"
        )


def test_a_restart_from_the_checkpoint_keeps_offsets_state_and_pending_expiries(spark, world):
    w = world
    with running(spark, w) as monitor:
        a_and_b_serve_ts(w, monitor)
        w.heartbeat(A, 8_000)
        for node in ("n1", "n2"):
            w.send(node, EventType.UNREGISTER, 1_000, C, source="UNREGISTER_BROKER")  # unknown broker: nothing
        w.tick(9_000)
        w.flush()
        settle(monitor, 1.0)
        assert w.decisions() == []
    first_query = str(monitor.query.id)

    # events arrive while the job is down; B's expiry (deadline 10 s) is pending in the state
    w.tick(14_000)
    w.flush()
    with running(spark, w) as monitor:
        assert str(monitor.query.id) == first_query
        until(monitor, lambda: w.decisions() == [("EXPIRE", B[1], 0)], what="B expired after the restart")
        until(monitor, lambda: w.route_brokers("TS") == {"broker-a"}, what="TS without B")
        # A's heartbeat at 8 s was kept: not expired at event time 14 s
        settle(monitor, 1.0)
        assert w.decisions() == [("EXPIRE", B[1], 0)]
        assert int(w.lookup.status()["batchId"]) > 0


def test_prometheus_scrapes_the_monitor_s_batches_brokers_alerts_and_redis_writes(spark, world, tmp_path):
    w = world
    port = free_port()
    w.cfg = dataclasses.replace(w.cfg, metrics_port=port, metrics_bind_address="127.0.0.1")
    with running(spark, w) as monitor, running_prometheus(tmp_path, {"monitor": f"127.0.0.1:{port}"}) as prom:
        assert monitor.metrics is not None and monitor.metrics.url == f"http://127.0.0.1:{port}/metrics"
        a_and_b_serve_ts(w, monitor)
        prom.wait_for('rocketmq_namesrv_monitor_brokers_alive{job="monitor"}', lambda v: v == [2])
        w.heartbeat(A, 8_000)
        w.tick(14_000)  # past B's deadline (0 + 10 s)
        w.flush()
        until(monitor, lambda: w.decisions() == [("EXPIRE", B[1], 0)], what="B expired")
        prom.wait_for("rocketmq_namesrv_monitor_brokers_alive", lambda v: v == [1])
        prom.wait_for("rocketmq_namesrv_monitor_brokers_expired_total", lambda v: v == [1])
        prom.wait_for('rocketmq_namesrv_monitor_actions_published_total{type="EXPIRE"}', lambda v: v == [1])
        prom.wait_for('rocketmq_namesrv_monitor_open_alerts{kind="BROKER_EXPIRED"}', lambda v: v == [1])
        prom.wait_for("rocketmq_namesrv_monitor_events_total", lambda v: v and v[0] >= 9)
        prom.wait_for("rocketmq_namesrv_monitor_batch_duration_seconds_count", lambda v: v and v[0] >= 2)
        prom.wait_for("rocketmq_namesrv_monitor_redis_write_seconds_count", lambda v: v and v[0] >= 2)
        assert prom.values("rocketmq_namesrv_monitor_redis_write_failures_total") == [0]
        assert len(prom.values("rocketmq_namesrv_monitor_input_rows_per_second")) == 1
        # event times here are synthetic (2023): the lag is the wall clock's distance to them
        (lag,) = prom.values("rocketmq_namesrv_monitor_watermark_lag_seconds")
        assert lag == pytest.approx((wall_ms() - (w.t0 + 14_000)) / 1000, abs=120)


def test_poison_events_are_refused_and_the_job_keeps_deciding_after_a_restart(spark, world):
    """Schema-shaped events a buggy node could send: a clock in 2100, a 0.9 MB node name, Long.MAX."""
    w = world
    poison = [
        Event(type=EventType.TICK, node="clock-in-2100", event_time=4_102_444_800_000, seq=1),
        Event(type=EventType.TICK, node="n" * 900_000, event_time=w.t0, seq=1),
        Event(type=EventType.TICK, node="long-max", event_time=2**63 - 1, seq=1),
    ]
    big = kafka_clients.producer(w.bootstrap, max_request_size=4 * 1024 * 1024)
    with running(spark, w) as monitor:
        a_and_b_serve_ts(w, monitor)
        for e in poison:
            big.send(w.events_topic, key=b"poison", value=encode_event(e))
        big.flush()
        w.heartbeat(A, 8_000)
        w.tick(9_000)
        w.flush()
        until(
            monitor,
            lambda: monitor.status.ahead_events == 1 and monitor.status.bad_events == 2,
            what="one event refused as ahead of the clock, two as out of the schema's bounds",
        )
        settle(monitor, 1.0)
        assert w.decisions() == []  # the tick from 2100 moved nothing: nobody expired
        until(monitor, lambda: ("NODE_CLOCK_AHEAD", "OPEN", "clock-in-2100") in w.alerts(), what="clock alert")
        assert monitor.query.isActive
    big.close()
    # the poison is behind the checkpointed offsets; a restart goes on deciding
    w.tick(14_000)
    w.flush()
    with running(spark, w) as monitor:
        until(monitor, lambda: w.decisions() == [("EXPIRE", B[1], 0)], what="B expired after the restart")
        settle(monitor, 1.0)
        assert w.decisions() == [("EXPIRE", B[1], 0)]


def test_malformed_events_are_counted_and_skipped(spark, world):
    w = world
    with running(spark, w) as monitor:
        bad = [b"not json", b'{"v": 2, "type": "TICK"}', b'{"v": 1, "type": "REGISTER", "node": "n1"}',
               b'{"v": 1, "type": "TICK", "node": "n1", "eventTime": "soon", "seq": 1}', None]  # fmt: skip
        for value in bad:
            w.producer.send(w.events_topic, key=b"x", value=value)
        w.register(A, 0)
        w.flush()
        until(monitor, lambda: w.route_brokers("TA") == {"broker-a"}, what="the good event's route")
        until(monitor, lambda: monitor.status.bad_events == len(bad), what="bad events counted")
        assert monitor.query.isActive


def test_redis_routes_are_the_bytes_two_real_nodes_answer(spark, world, tmp_path):
    """Brokers register with two real nodes that publish to Kafka; Redis must answer what they answer."""
    from common.protocol.codes import RequestCode
    from namesrv.client import NameServerClient
    from tests.support.brokers import register_broker
    from tests.support.node import running_node

    w = world
    node_conf = dict(kafkaBootstrapServers=w.bootstrap, eventsTopic=w.events_topic, actionsTopic=w.actions_topic,
                     tickIntervalMillis="1000")  # fmt: skip
    with running(spark, w) as monitor:
        with (
            running_node(tmp_path / "n1", nodeName="n1", **node_conf) as n1,
            running_node(tmp_path / "n2", nodeName="n2", **node_conf) as n2,
            NameServerClient(n1.addr) as b1,
            NameServerClient(n2.addr) as b2,
        ):
            for conn in (b1, b2):
                register_broker(conn, broker_addr="10.0.0.1:10911", broker_name="broker-a", topics=["TA", "TS"])
                register_broker(
                    conn, broker_addr="10.0.0.2:10911", broker_name="broker-b", topics=["TS", "TB"], queues=8
                )
                register_broker(
                    conn, broker_addr="10.0.0.3:10911", broker_name="broker-a", broker_id=1, topics=["TA", "TS"]
                )  # a slave of broker-a
            want = sorted(["TA", "TB", "TS", CLUSTER])
            until(monitor, lambda: w.lookup.topics() == want, what="the nodes' topics in redis", drain=False)
            with NameServerClient(n1.addr) as q1, NameServerClient(n2.addr) as q2:
                for topic in want:
                    answers = {q.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}).body for q in (q1, q2)}
                    assert len(answers) == 1, topic  # the two nodes answer alike
                    # the topics can reach Redis a batch before the last registration's brokers (the slave)
                    until(
                        monitor,
                        lambda topic=topic, answers=answers: {w.lookup.get_raw(topic)} == answers,
                        what=f"{topic}'s route in redis, as the nodes answer it: {answers}",
                        drain=False,
                    )
                cluster = q1.call(RequestCode.GET_BROKER_CLUSTER_INFO).body
            until(
                monitor,
                lambda: w.lookup.client.get(f"{w.lookup.keys.prefix}:cluster") == cluster,
                what="cluster info",
                drain=False,
            )


@pytest.mark.skipif(not alertmanager.available(), reason=f"{alertmanager.BINARY} is not installed")
def test_alertmanager_hears_an_expiry_and_its_resolution(spark, world, tmp_path):
    """The job as started for real, with alerts.alertmanagerUrl set, against Debian's Alertmanager."""
    w = world
    (tmp_path / "am").mkdir()
    am = alertmanager.Alertmanager(tmp_path / "am")
    am.start()
    w.cfg = dataclasses.replace(w.cfg, alertmanager_urls=(am.url,), alerts_resend_interval_millis=1000)
    try:
        with running(spark, w) as monitor:
            a_and_b_serve_ts(w, monitor)
            w.heartbeat(A, 8_000)
            w.tick(12_000)  # past B's deadline (0 + 10 s), not A's
            w.flush()
            (expired,) = until(
                monitor, lambda: am.firing(alertname="BROKER_EXPIRED"), what="B's expiry in Alertmanager"
            )
            assert expired["labels"] == {"alertname": "BROKER_EXPIRED", "severity": "critical", "cluster": CLUSTER,
                                         "broker": "broker-b", "broker_addr": B[1]}  # fmt: skip
            (lost,) = until(monitor, lambda: am.firing(alertname="TOPIC_NOT_WRITABLE"), what="the group's incident")
            assert lost["labels"]["broker"] == "broker-b" and "1 topic(s): TB" in lost["annotations"]["description"]

            w.register(B, 13_000)  # B is back
            w.tick(13_000)
            w.flush()
            until(monitor, lambda: am.alerts() == [], what="both resolved in Alertmanager")
    finally:
        am.stop()
