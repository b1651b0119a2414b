"""LivenessProcessor without a stream: PySpark's TwsTester drives it with an in-memory handle.

Event time only: the watermark is set by hand, as Spark would after a micro-batch, and trails
event time by the shipped watermark delay (120 s), which must never be added to a timeout.
"""

from __future__ import annotations

import orjson
import pytest
from pyspark.sql import Row
from pyspark.sql.streaming.tws_tester import TwsTester

from common.contract import Event, EventType, encode_event
from streaming.events import PACKED, STATE_BUCKETS, broker_key, bundled_rows, group_key
from streaming.health import KIND_HEALTH
from streaming.liveness import KIND_ACTION, KIND_ALERT, KIND_ROUTE, LivenessProcessor, LivenessSettings
from tests.support.broker_events import ADDR, CLUSTER, DELAY, T0, TIMEOUT, closed, ev, heartbeat, register, silent
from tests.support.streaming import YEAR_2100


def rows(*events: Event) -> list[Row]:
    """The rows the processor gets for ``events``: checked and bundled as the job's source does
    (``streaming.events.bundled_rows``), one bundle per key; ``eventTime`` is a bundle's latest, which
    the tester, like Spark, drops rows at or before the watermark by."""
    bundles = bundled_rows([encode_event(e) for e in events], clock_ms=YEAR_2100, max_clock_skew_ms=0)
    return [Row(key=b[0], eventTime=b[1], **{PACKED: b[2].decode()}) for b in bundles if b[0] is not None]


def make_tester(**settings) -> TwsTester:
    s = LivenessSettings(
        **{"heartbeat_timeout_ms": 60_000, "node_silent_ms": 5_000, "watermark_delay_ms": DELAY, **settings}
    )
    return TwsTester(
        LivenessProcessor(s), timeMode="EventTime", outputMode="Append",
        eventTimeExtractor=lambda row: row["eventTime"],
    )  # fmt: skip


KEY = group_key(register(T0))


def feed(t: TwsTester, *events: Event, key: str = KEY, health: bool = False) -> list[dict]:
    """The rows emitted for ``events``; HEALTH rows (one per key and call, for the console) only if ``health``."""
    out = [r.asDict() for r in t.test(key, rows(*events))]
    return out if health else [r for r in out if r["kind"] != KIND_HEALTH]


def fire(t: TwsTester, now: int) -> list[dict]:
    """Event time (the largest seen) reaches ``now``: the watermark moves to ``now - DELAY``."""
    out = t.setWatermark(now - DELAY)
    return [r.asDict() for r in out]


def kinds(rows: list[dict], kind: str) -> list[dict]:
    return [r for r in rows if r["kind"] == kind]


def test_a_registration_is_passed_to_routes_and_expires_once_after_its_own_timeout():
    t = make_tester()
    out = feed(t, register(T0))
    assert [(r["kind"], r["type"]) for r in out] == [(KIND_ROUTE, "REGISTER")]
    # the registration's 10 s replaces the 60 s default; expired once event time is past the
    # deadline, though the watermark is still 110 s before it
    assert fire(t, T0 + TIMEOUT) == []
    out = fire(t, T0 + TIMEOUT + 1)
    actions = kinds(out, KIND_ACTION)
    assert len(actions) == 1
    a = actions[0]
    assert (a["type"], a["clusterName"], a["brokerAddr"], a["brokerName"], a["brokerId"]) == (
        "EXPIRE",
        CLUSTER,
        ADDR,
        "broker-a",
        0,
    )
    assert a["lastHeartbeat"] == T0 and a["watermark"] == T0 + TIMEOUT + 1 - DELAY
    assert a["orderTime"] == T0 + TIMEOUT + 1
    assert "no heartbeat at any node for 10.0 s (timeout 10000 ms" in a["reason"]
    alerts = kinds(out, KIND_ALERT)
    assert [(r["type"], r["state"], r["severity"]) for r in alerts] == [("BROKER_EXPIRED", "OPEN", "CRITICAL")]
    assert fire(t, T0 + 10 * TIMEOUT) == []  # never twice


def test_heartbeats_move_the_deadline():
    t = make_tester()
    feed(t, register(T0))
    assert feed(t, heartbeat(T0 + 8_000), heartbeat(T0 + 9_000, node="n2")) == []
    assert fire(t, T0 + TIMEOUT + 1) == []
    out = fire(t, T0 + 9_000 + TIMEOUT + 1)
    assert [r["lastHeartbeat"] for r in kinds(out, KIND_ACTION)] == [T0 + 9_000]


def kept(t: TwsTester, key: str = KEY) -> set[str]:
    """Brokers the key's bucket keeps anything of: a state, or a stored registration."""
    held = t.peekValueState("brokers", key)
    brokers = set() if held is None else set(orjson.loads(held[0]))
    return brokers | {user_key[0] for user_key in t.peekMapState("registration", key)}


def timers(t: TwsTester, key: str = KEY) -> list[int]:
    """The key's registered timers, as event times (timers live in watermark time: event time - DELAY)."""
    t.handle.setGroupingKey(key)
    return [w + DELAY for w in t.handle.listTimers()]


def test_heartbeats_leave_the_timer_alone_and_it_wakes_up_at_the_old_deadline_to_set_the_new_one():
    # a timer delete is the dearest state call: heartbeats must not move the timer every batch
    t = make_tester()
    feed(t, register(T0))
    for i in range(1, 10):
        feed(t, heartbeat(T0 + i * 1_000))
    assert timers(t) == [T0 + TIMEOUT + 1]
    assert fire(t, T0 + TIMEOUT + 1) == []  # a wake-up: the deadline moved, nothing is decided
    assert timers(t) == [T0 + 9_000 + TIMEOUT + 1]
    assert [r["lastHeartbeat"] for r in kinds(fire(t, T0 + 9_000 + TIMEOUT + 1), KIND_ACTION)] == [T0 + 9_000]


def test_a_comeback_replaces_the_forget_timer_with_the_earlier_liveness_one():
    t = make_tester()
    feed(t, register(T0))
    fire(t, T0 + TIMEOUT + 1)  # expired; its next decision is forgetting it, a day later
    assert timers(t) == [T0 + TIMEOUT + 1 + 86_400_000]
    feed(t, heartbeat(T0 + 20_000))
    assert timers(t) == [T0 + 20_000 + TIMEOUT + 1]
    assert [r["type"] for r in kinds(fire(t, T0 + 20_000 + TIMEOUT + 1), KIND_ACTION)] == ["EXPIRE"]


def test_the_same_registration_from_a_second_node_is_not_passed_again_but_a_new_one_is():
    t = make_tester()
    assert len(feed(t, register(T0, "n1"), register(T0 + 5, "n2"))) == 1
    assert feed(t, register(T0 + 30_000, "n1")) == []
    assert [r["kind"] for r in feed(t, register(T0 + 31_000, "n1", counter=2))] == [KIND_ROUTE]


def test_unregistration_removes_once_and_echoes_change_nothing():
    t = make_tester()
    feed(t, register(T0))
    out = feed(
        t,
        ev(EventType.UNREGISTER, T0 + 1_000, "n1", source="UNREGISTER_BROKER"),
        ev(EventType.UNREGISTER, T0 + 1_001, "n2", source="UNREGISTER_BROKER"),
    )
    actions = kinds(out, KIND_ACTION)
    assert [(a["type"], a["cause"], a["lastHeartbeat"]) for a in actions] == [
        ("REMOVE", "UNREGISTER_BROKER", T0 + 1_000)
    ]
    # a clean shutdown: a notice, resolved at once
    assert [(r["type"], r["state"], r["severity"]) for r in kinds(out, KIND_ALERT)] == [
        ("BROKER_REMOVED", "OPEN", "INFO"), ("BROKER_REMOVED", "RESOLVED", "INFO"),
    ]  # fmt: skip
    # nodes applying our REMOVE report it back; no second action, and no expiry later
    assert feed(t, ev(EventType.UNREGISTER, T0 + 2_000, "n3", source="REMOVE")) == []
    assert fire(t, T0 + 100 * TIMEOUT) == []


def test_an_unregistration_older_than_the_last_heartbeat_is_ignored():
    t = make_tester()
    feed(t, register(T0), heartbeat(T0 + 5_000, "n2"))
    assert feed(t, ev(EventType.UNREGISTER, T0 + 4_000, "n1", source="UNREGISTER_BROKER")) == []


def test_local_expiry_at_a_node_is_not_a_decision_of_ours():
    t = make_tester()
    feed(t, register(T0))
    assert feed(t, ev(EventType.UNREGISTER, T0 + 1_000, source="LOCAL_EXPIRY")) == []
    assert len(kinds(fire(t, T0 + TIMEOUT + 1), KIND_ACTION)) == 1


def test_the_alert_says_how_long_the_broker_was_really_silent():
    t = make_tester()
    feed(t, register(T0))
    out = fire(t, T0 + TIMEOUT + 4_000)  # a batch that came late: event time already 14 s past
    (alert,) = kinds(out, KIND_ALERT)
    assert "no heartbeat at any node for 14.0 s (timeout 10000 ms" in alert["message"]


def test_a_close_at_some_nodes_removes_nothing_and_the_last_close_removes_everywhere():
    t = make_tester()
    feed(t, register(T0, "n1"), register(T0 + 3, "n2"))
    assert feed(t, closed(T0 + 1_000, "n1")) == []
    out = feed(t, closed(T0 + 1_200, "n2"))
    (action,) = kinds(out, KIND_ACTION)
    assert (action["type"], action["cause"], action["lastHeartbeat"]) == ("REMOVE", "CHANNEL_CLOSED", T0 + 1_200)
    (alert,) = kinds(out, KIND_ALERT)
    assert (alert["type"], alert["severity"]) == ("BROKER_REMOVED", "WARNING")
    assert "lost its connection at every node" in alert["message"] and "n1 at" in alert["message"]
    assert fire(t, T0 + 100 * TIMEOUT) == []  # gone: no expiry on top


def test_a_node_that_heard_the_broker_after_its_close_still_holds_a_connection():
    t = make_tester()
    feed(t, register(T0, "n1"), register(T0 + 3, "n2"))
    # n1's connection closed and the broker reconnected to it; n2's close then leaves n1 holding one
    feed(t, closed(T0 + 1_000, "n1"), heartbeat(T0 + 1_500, "n1", "REGISTER_BROKER"))
    assert kinds(feed(t, closed(T0 + 2_000, "n2")), KIND_ACTION) == []
    # a late close from n1 older than its reconnection changes nothing either
    assert kinds(feed(t, closed(T0 + 1_100, "n1")), KIND_ACTION) == []
    assert kinds(feed(t, closed(T0 + 3_000, "n1")), KIND_ACTION) != []


def test_a_close_older_than_the_last_heartbeat_removes_nothing():
    t = make_tester()
    feed(t, register(T0, "n1"), heartbeat(T0 + 5_000, "n1"))
    assert feed(t, closed(T0 + 4_000, "n1")) == []


def test_remove_on_channel_close_removes_at_the_first_close():
    t = make_tester(remove_on_channel_close=True)
    feed(t, register(T0, "n1"), register(T0 + 3, "n2"))
    out = feed(t, closed(T0 + 1_000, "n1"))
    assert [(a["type"], a["cause"]) for a in kinds(out, KIND_ACTION)] == [("REMOVE", "CHANNEL_CLOSED")]


def test_a_comeback_by_heartbeat_brings_back_the_last_registration_and_resolves_the_alert():
    t = make_tester()
    feed(t, register(T0))
    fire(t, T0 + TIMEOUT + 1)
    out = feed(t, heartbeat(T0 + 20_000, "n2", source="REGISTER_BROKER"))
    routes = kinds(out, KIND_ROUTE)
    assert len(routes) == 1 and routes[0]["cause"] == "COMEBACK"
    assert '"brokerName":"broker-a"' in routes[0]["raw"]
    assert [(r["type"], r["state"]) for r in kinds(out, KIND_ALERT)] == [("BROKER_EXPIRED", "RESOLVED")]
    # alive again: it expires again after silence
    assert len(kinds(fire(t, T0 + 20_000 + TIMEOUT + 1), KIND_ACTION)) == 1


def test_flapping_opens_once_and_resolves_when_the_window_empties():
    t = make_tester(flap_threshold=2, flap_window_ms=100_000)
    feed(t, register(T0))
    opened = []
    t_now = T0
    for _ in range(3):  # expire, come back, three times: 6 changes > 2
        wm = t_now + TIMEOUT + 1
        opened += kinds(fire(t, wm), KIND_ALERT)
        t_now = wm + 1_000
        opened += kinds(feed(t, heartbeat(t_now)), KIND_ALERT)
    flapping = [r for r in opened if r["type"] == "BROKER_FLAPPING"]
    assert [r["state"] for r in flapping] == ["OPEN"]
    # a quiet broker: keep it alive with heartbeats while the window passes
    later = []
    for step in range(1, 20):
        hb_t = t_now + step * 9_000
        later += kinds(feed(t, heartbeat(hb_t)), KIND_ALERT)
        later += kinds(fire(t, hb_t - 1), KIND_ALERT)
    assert [(r["type"], r["state"]) for r in later] == [("BROKER_FLAPPING", "RESOLVED")]


def test_node_ticks_silence_opens_an_alert_and_a_new_tick_resolves_it():
    t = make_tester()
    key = "node:n1"
    assert feed(t, ev(EventType.TICK, T0, "n1"), key=key) == []
    assert fire(t, T0 + 5_000) == []
    out = fire(t, T0 + 5_001)
    assert [(r["type"], r["state"], r["node"]) for r in out] == [("NODE_SILENT", "OPEN", "n1")]
    assert fire(t, T0 + 50_000) == []
    out = feed(t, ev(EventType.TICK, T0 + 60_000, "n1"), key=key)
    assert [(r["type"], r["state"]) for r in out] == [("NODE_SILENT", "RESOLVED")]


def test_admin_events_pass_through_in_order():
    t = make_tester()
    a1 = ev(EventType.ADMIN, T0 + 2, "n1", seq=7, op="DELETE_TOPIC", topic="T")
    a0 = ev(EventType.ADMIN, T0 + 1, "n1", seq=6, op="WIPE_WRITE_PERM", broker_name="broker-a", topic_count=1)
    out = feed(t, a1, a0, key=group_key(a0))
    assert [(r["kind"], r["seq"]) for r in out] == [(KIND_ROUTE, 6), (KIND_ROUTE, 7)]


def test_order_topic_conf_events_pass_through_in_order_keyed_by_node():
    t = make_tester()
    put = Event(type=EventType.ORDER_TOPIC_CONF, node="n1", event_time=T0 + 1, seq=3, topic="T", order_topic_conf="a:4")
    delete = Event(type=EventType.ORDER_TOPIC_CONF, node="n1", event_time=T0 + 2, seq=4, topic="T")
    assert group_key(put) == group_key(ev(EventType.ADMIN, T0, "n1", op="DELETE_TOPIC", topic="T")) == "admin:n1"
    out = feed(t, delete, put, key=group_key(put))
    assert [(r["kind"], r["type"], r["seq"]) for r in out] == [
        (KIND_ROUTE, "ORDER_TOPIC_CONF", 3), (KIND_ROUTE, "ORDER_TOPIC_CONF", 4)
    ]  # fmt: skip
    assert out[0]["raw"] == encode_event(put).decode()


def test_an_unchanged_re_registration_passes_the_last_registration_once_per_cycle():
    t = make_tester()
    feed(t, register(T0))
    out = feed(t, heartbeat(T0 + 30_000, "n1", "REGISTER_BROKER"), heartbeat(T0 + 30_002, "n2", "REGISTER_BROKER"))
    assert [(r["kind"], r["cause"]) for r in out] == [(KIND_ROUTE, "REREGISTER")]
    # plain heartbeats never do
    assert feed(t, heartbeat(T0 + 45_000)) == []
    assert len(feed(t, heartbeat(T0 + 60_000, "n2", "REGISTER_BROKER"))) == 1


def test_a_broker_gone_long_enough_is_forgotten_and_its_incident_resolved():
    t = make_tester(forget_after_ms=50_000)
    feed(t, register(T0))
    fire(t, T0 + TIMEOUT + 1)  # expired at deadline T0 + 10_001
    assert fire(t, T0 + TIMEOUT + 50_000) == []
    out = fire(t, T0 + TIMEOUT + 1 + 50_000)
    assert [(r["type"], r["state"]) for r in out] == [("BROKER_EXPIRED", "RESOLVED")]
    assert kept(t) == set()
    # a later registration starts from scratch: no comeback, no flap
    out = feed(t, register(T0 + 100_000))
    assert [(r["kind"], r["cause"]) for r in out] == [(KIND_ROUTE, None)]


def test_reports_about_a_broker_never_seen_alive_leave_no_state():
    t = make_tester()
    assert feed(t, ev(EventType.UNREGISTER, T0, source="UNREGISTER_BROKER")) == []
    assert kept(t) == set()


def test_a_node_reporting_the_broker_silent_past_the_deadline_expires_it_in_that_batch():
    t = make_tester()
    feed(t, register(T0))
    # no watermark move: the report itself is the event past the deadline, read in this batch
    out = feed(t, silent(T0 + TIMEOUT + 1))
    actions = kinds(out, KIND_ACTION)
    assert [(a["type"], a["lastHeartbeat"], a["orderTime"]) for a in actions] == [("EXPIRE", T0, T0 + TIMEOUT + 1)]
    assert "no heartbeat at any node for 10.0 s (timeout 10000 ms" in actions[0]["reason"]
    assert [(r["type"], r["state"]) for r in kinds(out, KIND_ALERT)] == [("BROKER_EXPIRED", "OPEN")]
    # decided once: neither the timer nor the other nodes' reports expire it again
    assert feed(t, silent(T0 + TIMEOUT + 2, node="n2")) == []
    assert kinds(fire(t, T0 + 10 * TIMEOUT), KIND_ACTION) == []


def test_a_silent_report_not_past_the_monitors_deadline_changes_nothing_and_the_timer_still_decides():
    t = make_tester()
    feed(t, register(T0))
    feed(t, heartbeat(T0 + 5_000, node="n2"))  # n2 heard it later than n1 did
    assert feed(t, silent(T0 + TIMEOUT + 1, node="n1")) == []
    assert feed(t, silent(T0 + 5_000 + TIMEOUT)) == []  # not *past* the deadline
    out = fire(t, T0 + 5_000 + TIMEOUT + 1)
    assert [a["lastHeartbeat"] for a in kinds(out, KIND_ACTION)] == [T0 + 5_000]


def test_a_silent_report_about_an_unknown_or_gone_broker_changes_nothing():
    t = make_tester()
    assert feed(t, silent(T0)) == [] and kept(t) == set()
    feed(t, register(T0))
    feed(t, ev(EventType.UNREGISTER, T0 + 1, source="UNREGISTER_BROKER"))
    assert feed(t, silent(T0 + TIMEOUT + 1)) == []


def test_each_call_reports_the_brokers_last_heartbeat_timeout_and_state_for_the_console():
    t = make_tester()
    (row,) = kinds(feed(t, register(T0), heartbeat(T0 + 3_000, "n2"), health=True), KIND_HEALTH)
    assert (row["lastHeartbeat"], row["timeoutMillis"], row["state"], row["brokerName"], row["brokerId"]) == (
        T0 + 3_000, TIMEOUT, "ALIVE", "broker-a", 0,
    )  # fmt: skip
    out = feed(t, ev(EventType.UNREGISTER, T0 + 4_000, "n1", source="UNREGISTER_BROKER"), health=True)
    assert [(r["state"], r["lastHeartbeat"]) for r in kinds(out, KIND_HEALTH)] == [("REMOVED", T0 + 3_000)]


def test_a_nodes_ticks_report_its_last_tick_and_whether_its_local_scan_is_on():
    t = make_tester()
    key = group_key(ev(EventType.TICK, T0, "n1"))
    out = feed(t, ev(EventType.TICK, T0, "n1", local_scan=False), ev(EventType.TICK, T0 + 500, "n1", seq=2,
               local_scan=True), key=key, health=True)  # fmt: skip
    assert [(r["node"], r["lastHeartbeat"], r["state"]) for r in kinds(out, KIND_HEALTH)] == [
        ("n1", T0 + 500, "SCAN_ON")
    ]
    out = feed(t, ev(EventType.TICK, T0 + 1_000, "n1", seq=3), key=key, health=True)  # an older node: no field
    assert [r["state"] for r in kinds(out, KIND_HEALTH)] == [None]


def same_bucket_addresses(n: int) -> list[str]:
    """``n`` broker addresses whose states share ADDR's bucket (key)."""
    found = [ADDR]
    port = 10_000
    while len(found) < n:
        port += 1
        addr = f"10.0.0.2:{port}"
        if broker_key(CLUSTER, addr) == KEY:
            found.append(addr)
    return found


def test_brokers_sharing_a_bucket_are_decided_each_on_its_own():
    # a fleet's brokers share STATE_BUCKETS keys: one read and write a key and batch, one Spark
    # timer a key, and every broker's own deadline
    assert len({broker_key(CLUSTER, f"10.0.{i // 250}.{i % 250}:10911") for i in range(1_000)}) == STATE_BUCKETS
    a, b, c = same_bucket_addresses(3)
    t = make_tester()
    feed(t, register(T0, addr=a), register(T0 + 1_000, addr=b), register(T0 + 2_000, addr=c))
    assert kept(t) == {f"{CLUSTER}|{x}" for x in (a, b, c)}
    assert timers(t) == [T0 + TIMEOUT + 1]  # one timer for the bucket: its earliest deadline
    feed(t, heartbeat(T0 + 5_000), ev(EventType.HEARTBEAT, T0 + 5_000, addr=c, source="BROKER_HEARTBEAT"))
    assert timers(t) == [T0 + TIMEOUT + 1]  # heartbeats leave it alone

    out = fire(t, T0 + 1_000 + TIMEOUT + 1)  # the timer wakes the bucket; only b is due
    assert [(r["type"], r["brokerAddr"], r["lastHeartbeat"]) for r in kinds(out, KIND_ACTION)] == [
        ("EXPIRE", b, T0 + 1_000)
    ]
    assert timers(t) == [T0 + 5_000 + TIMEOUT + 1]  # the next one: a and c, heartbeated at the same time
    out = fire(t, T0 + 5_000 + TIMEOUT + 1)
    assert sorted(r["brokerAddr"] for r in kinds(out, KIND_ACTION)) == sorted([a, c])

    # b comes back: its registration is replayed from the bucket's map state, nobody else's
    out = feed(t, ev(EventType.HEARTBEAT, T0 + 30_000, addr=b, source="BROKER_HEARTBEAT"))
    routes = kinds(out, KIND_ROUTE)
    assert [(r["cause"], r["brokerAddr"]) for r in routes] == [("COMEBACK", b)]
    assert orjson.loads(routes[0]["raw"])["brokerAddr"] == b


def test_a_full_bucket_takes_no_new_broker_and_keeps_deciding_for_those_it_holds(monkeypatch, caplog):
    from streaming import liveness

    monkeypatch.setattr(liveness, "MAX_BROKERS_PER_BUCKET", 2)
    a, b, c = same_bucket_addresses(3)
    t = make_tester()
    feed(t, register(T0, addr=a), register(T0, addr=b))
    out = feed(t, register(T0 + 1, addr=c))  # a made-up address flood must not grow the bucket
    assert out == [] and kept(t) == {f"{CLUSTER}|{a}", f"{CLUSTER}|{b}"}
    assert "1 new one(s) not monitored" in caplog.text
    assert sorted(r["brokerAddr"] for r in kinds(fire(t, T0 + TIMEOUT + 1), KIND_ACTION)) == sorted([a, b])


# --------------------------------------------------------------------------- bundles


def _bundles_of(events: list[Event], sizes: list[int]) -> list[Row]:
    """``events`` cut into consecutive bundles of ``sizes`` events (what several reads would give)."""
    out, at = [], 0
    for n in sizes:
        out.extend(rows(*events[at : at + n]))
        at += n
    return out


@pytest.mark.parametrize("sizes", [[1] * 8, [8], [3, 5], [5, 2, 1]], ids=["singles", "one", "3+5", "5+2+1"])
def test_how_events_are_bundled_changes_nothing_the_processor_decides_late_events_included(sizes):
    """Spark drops a row at or before the watermark; in a bundle only the latest event decides that, so
    the processor drops each event at or before it itself. Whatever the cut, the outputs are those of one
    event per row (what the tester, like Spark, filters one by one)."""
    wm = T0 + 30_000 - DELAY  # event time has reached T0 + 30 s
    events = [
        register(T0 + 31_000, seq=1),
        heartbeat(T0 + 25_000),  # behind the watermark's event time... still on time (delay 120 s)
        heartbeat(wm - 5_000),  # late: 125 s behind the latest event time
        heartbeat(wm),  # at the watermark: late
        heartbeat(T0 + 33_000, node="n2"),
        ev(EventType.UNREGISTER, wm - 1, seq=7, broker_name="broker-a", broker_id=0, source="UNREGISTER_BROKER"),  # late
        heartbeat(T0 + 34_000, node="n2"),
        heartbeat(T0 + 35_000),
    ]  # fmt: skip

    def run(batch: list[Row]) -> list[dict]:
        t = make_tester()
        t.setWatermark(wm)
        out = [r.asDict() for r in t.test(KEY, batch)]
        return out + fire(t, T0 + 35_000 + TIMEOUT + 1)

    one_per_row = run(_bundles_of(events, [1] * len(events)))
    assert run(_bundles_of(events, sizes)) == one_per_row
    # the late unregistration was dropped, so the broker was alive until it expired
    assert [r["type"] for r in kinds(one_per_row, KIND_ACTION)] == ["EXPIRE"]
