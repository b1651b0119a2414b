"""The job's steps on small static DataFrames, and its foreachBatch sink without Spark."""

from __future__ import annotations

import logging

import pytest

from infra.services import RedisService, free_port
from namesrv.events.schema import (
    ActionType,
    DataVersionInfo,
    Event,
    EventType,
    QueueInfo,
    decode_action,
    encode_event,
)
from streaming import job
from streaming.alerts import decode_alert
from streaming.config import load_config
from streaming.events import parse_record
from streaming.liveness import KIND_ACTION, KIND_ROUTE, OUTPUT_COLUMNS
from streaming.routes import RedisRouteStore, RouteLookup

T0 = 1_700_000_000_000
#: a TICK from a node whose clock says 2100: refused, it must not move event time
YEAR_2100 = 4_102_444_800_000
SKEW = 10_000


def register(node: str = "n1", t: int = T0, addr: str = "10.0.0.1:1", name: str = "a", seq: int = 1) -> Event:
    return Event(
        type=EventType.REGISTER, node=node, event_time=t, seq=seq, cluster_name="C", broker_name=name, broker_id=0,
        broker_addr=addr, heartbeat_timeout_millis=10_000, data_version=DataVersionInfo(1, 0, 1),
        topics={"T": QueueInfo(4, 4, 6), "C": QueueInfo(1, 1, 7)},
    )  # fmt: skip


# --------------------------------------------------------------------------- steps on Spark


@pytest.fixture(scope="module")
def spark():
    cfg = load_config(None, {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2"})
    session = job.build_spark(cfg)
    session.sparkContext.setLogLevel("ERROR")
    return session


@pytest.fixture(scope="module")
def parsed(spark):
    tick = Event(type=EventType.TICK, node="n2", event_time=T0 + 5, seq=9)
    future = Event(type=EventType.TICK, node="n3", event_time=YEAR_2100, seq=1)
    records = spark.createDataFrame(
        [(encode_event(register()),), (b"junk",), (encode_event(tick),), (b'{"v":1,"type":"TICK"}',),
         (encode_event(future),)],
        "value binary",
    )  # fmt: skip
    return job.parse(records, SKEW)


def test_parse_keeps_checked_events_keyed_by_broker_or_node(parsed):
    rows = sorted(parsed.collect(), key=lambda r: r.eventTime)
    assert [(r.key, r.type, r.eventTime) for r in rows] == [
        ("broker:C|10.0.0.1:1", "REGISTER", T0),
        ("node:n2", "TICK", T0 + 5),
    ]
    assert rows[0].raw.startswith('{"v":1,"type":"REGISTER"') and rows[1].raw is None
    assert "error" not in parsed.columns


def test_event_time_is_a_timestamp_with_a_watermark(parsed):
    timed = job.with_event_time(parsed, 2_000)
    (row,) = timed.filter("type = 'TICK'").collect()
    assert int(row.eventTs.timestamp() * 1000) == T0 + 5


def test_decide_passes_one_copy_of_a_registration_reported_by_two_nodes(spark):
    records = spark.createDataFrame(
        [(encode_event(register("n1")),), (encode_event(register("n2", T0 + 3, seq=4)),)], "value binary"
    )
    out = job.decide(job.with_event_time(job.parse(records, SKEW), 2_000), job.liveness_settings(load_config(None, {})))
    assert out.columns == [c for c, _, _ in OUTPUT_COLUMNS]
    rows = out.collect()
    assert [(r.kind, r.type, r.node) for r in rows] == [(KIND_ROUTE, "REGISTER", "n1")]


# --------------------------------------------------------------------------- the sink, without Spark


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.flushes = 0

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout_s: float = 30.0) -> None:
        self.flushes += 1

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    svc = RedisService(port=free_port(), run_dir=tmp_path_factory.mktemp("redis"))
    svc.start()
    yield svc.url
    svc.stop()


def out_row(kind: str, t: int, **kw) -> dict:
    row = {c: None for c, _, _ in OUTPUT_COLUMNS}
    row.update({"kind": kind, "orderTime": t, "step": 0, **kw})
    return row


def route_row(e: Event) -> dict:
    return out_row(KIND_ROUTE, e.event_time, node=e.node, seq=e.seq, type="REGISTER", raw=encode_event(e).decode())


def expire_row(t: int, addr: str = "10.0.0.1:1", last: int = T0) -> dict:
    return out_row(KIND_ACTION, t, type="EXPIRE", cause="TIMEOUT", clusterName="C", brokerName="a", brokerId=0,
                   brokerAddr=addr, lastHeartbeat=last, watermark=t, reason="silent")  # fmt: skip


def make_sink(redis_url: str | None, prefix: str, **overrides: str) -> tuple[job.BatchSink, FakePublisher]:
    cfg = load_config(None, {"redis.url": redis_url or "", "redis.keyPrefix": prefix, "monitor.id": "m",
                             "alerts.monitorLagMillis": "1000", **overrides})  # fmt: skip
    pub = FakePublisher()
    store = RedisRouteStore.from_url(cfg.redis_url, cfg.redis_prefix) if redis_url else None
    return job.BatchSink(cfg, pub, store, clock=lambda: T0 + 100_000), pub


def test_the_sink_publishes_actions_then_writes_routes_and_skips_a_replayed_batch(redis_url):
    sink, pub = make_sink(redis_url, "s1")
    sink.set_lineage("q")
    lookup = RouteLookup(redis_url, prefix="s1")
    sink.process([route_row(register())], 0)
    assert lookup.get("T").broker_datas[0].broker_addrs == {0: "10.0.0.1:1"}

    alerts = sink.process([expire_row(T0 + 20_000)], 1)
    (action,) = [decode_action(v) for topic, _, v in pub.sent if topic == sink.cfg.actions_topic]
    assert (action.type, action.broker_addr, action.last_heartbeat, action.monitor) == (
        ActionType.EXPIRE, "10.0.0.1:1", T0, "m"
    )
    assert lookup.get("T") is None and lookup.topics() == []
    # topics lost with their last broker are an incident, published and kept open in Redis
    assert {a.incident for a in alerts} == {"TOPIC_NOT_WRITABLE|T", "TOPIC_NOT_WRITABLE|C"}
    assert {decode_alert(v).incident for t, _, v in pub.sent if t == sink.cfg.alerts_topic} == {
        "TOPIC_NOT_WRITABLE|T", "TOPIC_NOT_WRITABLE|C"
    }
    assert len(lookup.alerts()) == 2

    # the same batch again (a replay after a crash): nothing is published or written
    sent = len(pub.sent)
    assert sink.process([route_row(register(t=T0 + 30_000))], 1) == []
    assert len(pub.sent) == sent and lookup.get("T") is None

    # a restarted driver with the same query carries on from Redis
    again, _ = make_sink(redis_url, "s1")
    again.set_lineage("q")
    assert again.process([route_row(register(t=T0 + 40_000))], 1) == []
    resolved = again.process([route_row(register(t=T0 + 40_000))], 2)
    assert {(a.incident, str(a.state)) for a in resolved} == {
        ("TOPIC_NOT_WRITABLE|T", "RESOLVED"), ("TOPIC_NOT_WRITABLE|C", "RESOLVED")
    }
    assert lookup.get("T") is not None and lookup.alerts() == []


def test_the_sink_applies_order_conf_when_configured_and_a_restart_keeps_it(redis_url):
    conf = Event(type=EventType.ORDER_TOPIC_CONF, node="n1", event_time=T0 + 1, seq=2, topic="T",
                 order_topic_conf="a:4")  # fmt: skip
    conf_row = out_row(KIND_ROUTE, conf.event_time, node="n1", seq=2, type="ORDER_TOPIC_CONF",
                       raw=encode_event(conf).decode())  # fmt: skip
    lookup = RouteLookup(redis_url, prefix="s5")
    sink, _ = make_sink(redis_url, "s5", **{"routes.orderMessageEnable": "true"})
    sink.set_lineage("q")
    sink.process([route_row(register()), conf_row], 0)
    assert lookup.get("T").order_topic_conf == "a:4" and lookup.get("C").order_topic_conf is None

    again, _ = make_sink(redis_url, "s5", **{"routes.orderMessageEnable": "true"})
    again.set_lineage("q")
    assert again.model.order_topic_conf("T") == "a:4"
    again.process([route_row(register(t=T0 + 20_000, seq=3))], 1)  # the group changes nothing here
    assert lookup.get("T").order_topic_conf == "a:4"

    off, _ = make_sink(redis_url, "s6")  # the default, as on a node
    off.set_lineage("q")
    off.process([route_row(register()), conf_row], 0)
    assert RouteLookup(redis_url, prefix="s6").get("T").order_topic_conf is None


def test_a_new_query_lineage_replaces_what_redis_held(redis_url):
    old, _ = make_sink(redis_url, "s2")
    old.set_lineage("old")
    old.process([route_row(register(addr="10.0.0.9:1", name="z"))], 5)
    new, _ = make_sink(redis_url, "s2")
    new.set_lineage("new")
    new.process([route_row(register())], 0)
    lookup = RouteLookup(redis_url, prefix="s2")
    assert [b.broker_name for b in lookup.get("T").broker_datas] == ["a"]
    assert lookup.status()["lineage"] == "new"


def test_redis_down_does_not_stop_decisions_and_the_next_write_catches_up(redis_url, caplog):
    sink, pub = make_sink(redis_url, "s3")
    sink.set_lineage("q")
    good_client = sink.store.client
    sink.store.client = RedisRouteStore.from_url(f"redis://127.0.0.1:{free_port()}/0").client
    with caplog.at_level(logging.ERROR, logger="streaming.job"):
        sink.process([route_row(register()), expire_row(T0 + 20_000, addr="10.0.0.7:1")], 0)
    assert "not written" in caplog.text
    assert [t for t, _, _ in pub.sent if t == sink.cfg.actions_topic]  # the action went out anyway
    sink.store.client = good_client
    sink.process([], 1)
    assert RouteLookup(redis_url, prefix="s3").get("T") is not None


def test_the_monitor_heartbeat_goes_out_only_while_deciding_and_lag_is_an_incident_once():
    now = [T0 + 100_000]
    sink, pub = make_sink(None, "s4")
    sink.clock = lambda: now[0]
    delay = sink.cfg.watermark_delay_millis

    def beats() -> list:
        return [decode_action(v) for t, _, v in pub.sent if t == sink.cfg.actions_topic]

    def alerts() -> list:
        return [(str(a.kind), str(a.state)) for a in (decode_alert(v) for t, _, v in pub.sent
                                                      if t == sink.cfg.alerts_topic)]

    sink.set_lineage("q")
    sink.monitor_tick()
    assert beats() == []  # started, but no batch finished: the nodes keep their own expiry
    sink.status.last_batch_done_at = now[0]
    sink.status.watermark_ms = now[0] - delay  # event time is the clock
    sink.monitor_tick()
    assert [(b.type, b.watermark) for b in beats()] == [(ActionType.MONITOR_HEARTBEAT, now[0] - delay)]
    sink.status.watermark_ms = T0 - delay  # event time 100 s behind the clock, threshold 1 s
    sink.monitor_tick()
    sink.monitor_tick()
    assert len(beats()) == 1  # lagging: not deciding in time, so silent
    assert alerts() == [("MONITOR_LAGGING", "OPEN")]
    sink.status.watermark_ms = now[0] - delay
    sink.monitor_tick()
    assert len(beats()) == 2 and alerts() == [("MONITOR_LAGGING", "OPEN"), ("MONITOR_LAGGING", "RESOLVED")]
    now[0] += 60_000  # no batch for a minute: stalled
    sink.status.watermark_ms = now[0] - delay
    sink.monitor_tick()
    assert len(beats()) == 2


def test_events_ahead_of_the_clock_open_an_alert_naming_the_node_which_ends_when_they_stop():
    now = [T0]
    sink, pub = make_sink(None, "s5")
    sink.clock = lambda: now[0]
    sink.set_lineage("q")
    sink.status.note_ahead({"n9"}, 3, YEAR_2100, now[0])
    sink.monitor_tick()
    (alert,) = [decode_alert(v) for t, _, v in pub.sent if t == sink.cfg.alerts_topic]
    assert (str(alert.kind), str(alert.state), alert.node) == ("NODE_CLOCK_AHEAD", "OPEN", "n9")
    assert "3 event(s) refused" in alert.message and "monitor.maxClockSkewMillis=10000" in alert.message
    now[0] += 61_000
    sink.monitor_tick()
    states = [str(decode_alert(v).state) for t, _, v in pub.sent if t == sink.cfg.alerts_topic]
    assert states == ["OPEN", "RESOLVED"]


def test_order_applies_a_removal_before_a_later_comeback():
    rows = [
        out_row(KIND_ROUTE, T0 + 5, node="n2", seq=1, step=0),
        out_row(KIND_ACTION, T0 + 1, node="n1", seq=7, step=0),
        out_row(KIND_ROUTE, T0 + 1, node="n1", seq=7, step=1),
    ]
    ordered = sorted(rows, key=job.order_key)
    assert [(r["orderTime"], r["step"]) for r in ordered] == [(T0 + 1, 0), (T0 + 1, 1), (T0 + 5, 0)]


def test_parse_record_flags_what_it_cannot_read():
    assert parse_record(None)["error"] == "record without a value"
    assert "missing required" in parse_record(b'{"v":1,"type":"HEARTBEAT","node":"n","eventTime":1,"seq":1}')["error"]


def test_each_state_layout_has_its_own_checkpoint_and_an_old_one_is_named(tmp_path, caplog, monkeypatch):
    from streaming import liveness

    root = tmp_path / "checkpoint"
    (root / "offsets").mkdir(parents=True)  # a checkpoint from before layouts were kept apart
    with caplog.at_level(logging.WARNING, logger="streaming.job"):
        first = job.checkpoint_location(root)
    assert first.parent == root and first.name == f"state-{liveness.state_layout()}" and first.is_dir()
    assert "unversioned" in caplog.text
    caplog.clear()
    assert job.checkpoint_location(root) == first and caplog.text == ""  # a restart reuses it quietly

    # a version of the job whose state schema changed gets a checkpoint of its own
    monkeypatch.setitem(liveness.STATE_DDL, "broker", liveness.STATE_DDL["broker"] + ", extra STRING")
    with caplog.at_level(logging.WARNING, logger="streaming.job"):
        second = job.checkpoint_location(root)
    assert second != first and second.is_dir()
    assert first.name in caplog.text


def test_the_monitor_waits_for_kafka_at_start_and_can_be_stopped_meanwhile(caplog):
    """Kafka down at start-up is a wait with one warning, not a crash; a stop request ends the wait."""
    import threading

    stopping = threading.Event()
    threading.Timer(1.0, stopping.set).start()
    with caplog.at_level(logging.WARNING, logger="streaming.job"):
        assert job.KafkaPublisher.connect(f"127.0.0.1:{free_port()}", stopping) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "streaming.job"]
    assert len(warnings) == 1 and "does not answer yet" in warnings[0] and "kafka.bootstrap" in warnings[0]
