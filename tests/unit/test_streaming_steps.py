"""The job's foreachBatch sink and helpers without Spark, Redis or Kafka.

The steps on Spark DataFrames and the sink against a real Redis are in tests/integration
(test_streaming_steps_spark.py, test_streaming_sink.py).
"""

from __future__ import annotations

import logging

import pytest

from common.contract import EVENT_FIELDS, ActionType, Event, decode_action, encode_event
from streaming import events, job
from streaming.alerts import decode_alert
from streaming.events import parse_record
from streaming.liveness import KIND_ACTION, KIND_ROUTE
from streaming.sink import MonitorHeartbeat, order_key
from tests.support.clock import Clock
from tests.support.streaming import T0, YEAR_2100, make_sink, out_row
from tests.unit.test_event_schema import EVENTS


def test_the_monitor_heartbeat_goes_out_only_while_deciding_and_lag_is_an_incident_once():
    clock = Clock(T0 + 100_000)
    sink, pub = make_sink(None, "s4")
    sink.clock = clock
    delay = sink.cfg.watermark_delay_millis

    def beats() -> list:
        return [decode_action(v) for t, _, v in pub.sent if t == sink.cfg.actions_topic]

    def alerts() -> list:
        return [
            (str(a.kind), str(a.state)) for a in (decode_alert(v) for t, _, v in pub.sent if t == sink.cfg.alerts_topic)
        ]

    sink.set_lineage("q")
    sink.monitor_tick()
    assert beats() == []  # started, but no batch finished: the nodes keep their own expiry
    sink.status.last_batch_done_at = clock.ms
    sink.status.watermark_ms = clock.ms - delay  # event time is the clock
    sink.monitor_tick()
    assert [(b.type, b.watermark) for b in beats()] == [(ActionType.MONITOR_HEARTBEAT, clock.ms - delay)]
    sink.status.watermark_ms = T0 - delay  # event time 100 s behind the clock, threshold 1 s
    sink.monitor_tick()
    sink.monitor_tick()
    assert len(beats()) == 1  # lagging: not deciding in time, so silent
    assert alerts() == [("MONITOR_LAGGING", "OPEN")]
    sink.status.watermark_ms = clock.ms - delay
    sink.monitor_tick()
    assert len(beats()) == 2 and alerts() == [("MONITOR_LAGGING", "OPEN"), ("MONITOR_LAGGING", "RESOLVED")]
    clock.advance(60_000)  # no batch for a minute: stalled
    sink.status.watermark_ms = clock.ms - delay
    sink.monitor_tick()
    assert len(beats()) == 2


def test_the_heartbeat_looks_often_until_its_first_beat_then_beats_at_its_interval():
    clock = Clock(T0 + 100_000)
    sink, _ = make_sink(None, "s6")
    sink.clock = clock
    sink.set_lineage("q")
    heartbeat = MonitorHeartbeat(sink, interval_s=5.0)
    # the nodes hand expiry back at the first beat: it follows the first batch that allows it, not 5 s later
    assert heartbeat.next_tick_s() == MonitorHeartbeat.FIRST_BEAT_POLL_S < 0.5
    sink.monitor_tick()
    assert heartbeat.next_tick_s() < 0.5  # no batch yet: no beat
    sink.status.last_batch_done_at = clock.ms
    sink.status.watermark_ms = clock.ms - sink.cfg.watermark_delay_millis
    sink.monitor_tick()
    assert heartbeat.next_tick_s() == 5.0


def test_events_ahead_of_the_clock_open_an_alert_naming_the_node_which_ends_when_they_stop():
    clock = Clock(T0)
    sink, pub = make_sink(None, "s5")
    sink.clock = clock
    sink.set_lineage("q")
    sink.status.note_ahead({"n9"}, 3, YEAR_2100, clock.ms)
    sink.monitor_tick()
    (alert,) = [decode_alert(v) for t, _, v in pub.sent if t == sink.cfg.alerts_topic]
    assert (str(alert.kind), str(alert.state), alert.node) == ("NODE_CLOCK_AHEAD", "OPEN", "n9")
    assert "3 event(s) refused" in alert.message and "monitor.maxClockSkewMillis=10000" in alert.message
    clock.advance(61_000)
    sink.monitor_tick()
    states = [str(decode_alert(v).state) for t, _, v in pub.sent if t == sink.cfg.alerts_topic]
    assert states == ["OPEN", "RESOLVED"]


def test_order_applies_a_removal_before_a_later_comeback():
    rows = [
        out_row(KIND_ROUTE, T0 + 5, node="n2", seq=1, step=0),
        out_row(KIND_ACTION, T0 + 1, node="n1", seq=7, step=0),
        out_row(KIND_ROUTE, T0 + 1, node="n1", seq=7, step=1),
    ]
    ordered = sorted(rows, key=order_key)
    assert [(r["orderTime"], r["step"]) for r in ordered] == [(T0 + 1, 0), (T0 + 1, 1), (T0 + 5, 0)]


def test_parse_record_flags_what_it_cannot_read():
    assert parse_record(None)["error"] == "record without a value"
    assert "missing required" in parse_record(b'{"v":1,"type":"HEARTBEAT","node":"n","eventTime":1,"seq":1}')["error"]
    # a value nested as deep as JSON allows is a bad record too, not an exception that stops the source
    deep = b'{"v":1,"type":"TICK","node":' + b"[" * 1000 + b"]" * 1000 + b',"eventTime":1,"seq":1}'
    assert parse_record(deep)["error"].startswith("event.node: expected a string, got list")


def _event_row(event: Event) -> dict:
    """The row as the source made it from the decoded Event (what parse_record did before it skipped the Event)."""
    raw = encode_event(event).decode() if event.type in events.RAW_TYPES else None
    attrs = {f.name: f.attr for f in EVENT_FIELDS}
    row = {"key": events.group_key(event), **{c: getattr(event, attrs[c]) for c in events.LIVENESS_FIELDS}}
    return {**row, "type": str(event.type), "raw": raw, "error": None}


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: f"{e.type.value}-{e.seq}")
def test_a_parsed_row_holds_what_the_decoded_event_holds(event):
    assert parse_record(encode_event(event)) == _event_row(event)


def test_bucket_keys_are_remembered_up_to_a_bound_and_stay_the_hash(monkeypatch):
    import zlib

    monkeypatch.setattr(events, "_BUCKET_KEYS", {})
    monkeypatch.setattr(events, "_BUCKET_KEYS_MAX", 3)
    addrs = [f"10.0.0.{i}:10911" for i in range(10)]
    for _ in range(2):
        for a in addrs:
            bucket = zlib.crc32(f"C|{a}".encode()) % events.STATE_BUCKETS
            assert events.broker_key("C", a) == f"broker:{bucket}"
            assert len(events._BUCKET_KEYS) <= 3


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
    monkeypatch.setitem(liveness.STATE_DDL, "brokers", liveness.STATE_DDL["brokers"] + ", extra STRING")
    with caplog.at_level(logging.WARNING, logger="streaming.job"):
        second = job.checkpoint_location(root)
    assert second != first and second.is_dir()
    assert first.name in caplog.text


# --------------------------------------------------------------------------- bundles


def test_a_read_becomes_one_bundle_per_state_key_and_a_report_of_what_was_refused():
    import orjson

    from common.contract import EventType

    clock, skew = T0, 10_000
    tick = lambda node, t, seq: Event(type=EventType.TICK, node=node, event_time=t, seq=seq)  # noqa: E731
    values = [
        encode_event(tick("n1", T0 - 5, 1)),
        b"junk",
        encode_event(tick("n2", T0 + skew, 1)),  # at the bound: on time
        encode_event(tick("n1", T0 - 9, 2)),
        encode_event(tick("n7", T0 + skew + 1, 1)),  # ahead
        None,
        encode_event(tick("n3", T0 + 99_999, 1)),  # ahead, further
    ]
    rows = [dict(zip(events.BUNDLE_COLUMNS, r, strict=True)) for r in events.bundled_rows(values, clock, skew)]
    bundles = {r["key"]: r for r in rows if r["key"] is not None}
    assert {k: (b["count"], b["eventTime"]) for k, b in bundles.items()} == {
        "node:n1": (2, T0 - 5),  # the latest of its events, whatever their order
        "node:n2": (1, T0 + skew),
    }
    packed = orjson.loads(bundles["node:n1"]["events"])
    assert [e["seq"] for e in packed] == [1, 2]  # in read order
    assert packed[0] == {f: parse_record(values[0])[f] for f in events.PACKED_FIELDS}
    (report,) = [r for r in rows if r["key"] is None]
    assert (report["count"], report["bad"], report["ahead"]) == (0, 2, 2)
    assert (report["aheadNode"], report["aheadOtherNode"], report["aheadMax"]) == ("n7", "n3", T0 + 99_999)
    # a read with nothing refused has no report
    assert all(r[0] is not None for r in events.bundled_rows(values[:1], clock, skew))


def test_a_bundle_is_closed_at_its_byte_bound_and_another_begun(monkeypatch):
    from common.contract import EventType

    monkeypatch.setattr(events, "BUNDLE_MAX_BYTES", 300)
    values = [encode_event(Event(type=EventType.TICK, node="n1", event_time=T0 + i, seq=i)) for i in range(10)]
    per_bundle = -(-300 // len(values[0]))  # records until the bound is reached
    rows = events.bundled_rows(values, T0, 10_000)
    assert [r[3] for r in rows] == [per_bundle] * (10 // per_bundle) + ([10 % per_bundle] if 10 % per_bundle else [])
    assert all(r[0] == "node:n1" for r in rows)


def test_route_incidents_are_checked_only_when_a_batch_changed_the_routes(monkeypatch):
    """Checking them walks every topic (200 ms a batch at 100,000 topics); the tables alone decide them."""
    from streaming.alerts import AlertKind
    from tests.support.streaming import expire_row, register, route_row

    sink, pub = make_sink(None, "ri")
    sink.set_lineage("q")
    walks = []
    real = sink.model.manager.route_health
    monkeypatch.setattr(sink.model.manager, "route_health", lambda topics: walks.append(1) or real(topics))
    sink.process([route_row(register())], 0)
    assert len(walks) == 1  # the first batch always checks
    sink.process([], 1)
    sink.process([], 2)
    assert len(walks) == 1  # nothing changed: nothing walked, nothing said
    sink.process([expire_row(T0 + 20_000)], 3)  # the group's only broker expires: its topics are lost
    assert len(walks) == 2
    assert [a.kind for a in sink.book.open.values()] == [AlertKind.TOPIC_NOT_WRITABLE]
