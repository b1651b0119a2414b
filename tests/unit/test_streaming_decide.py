"""The liveness rules (streaming.decide) on plain values: no Spark, no state store, no clock.

Events reach the rules as the processor hands them over (checked, bundled and unpacked as the job
does); a timer is the broker's or node's own wake-up, called once the watermark reaches it, as the
adapter does. Event time runs DELAY ahead of the watermark, and DELAY is never part of a timeout.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import orjson
import pytest

from common.contract import DataVersionInfo, Event, EventType, QueueInfo, encode_event
from streaming.decide import (
    NO_TIMER,
    REPLAY_GAP_MS,
    ActionRow,
    AlertChange,
    Broker,
    BrokerState,
    HealthRow,
    LivenessSettings,
    NodeState,
    Output,
    PackedEvent,
    RouteRow,
    admin_events,
    broker_due,
    broker_events,
    broker_timer,
    node_ticks,
    node_timer,
)
from streaming.events import PACKED_FIELDS, bundled_rows
from tests.support.broker_events import (
    ADDR,
    CLUSTER,
    DELAY,
    T0,
    TIMEOUT,
    closed,
    ev,
    heartbeat,
    register,
    silent,
    unregister,
)
from tests.support.streaming import YEAR_2100

BROKER = Broker(CLUSTER, ADDR, "broker-a", 0)


def packed(*events: Event) -> list[PackedEvent]:
    """``events`` as the rules get them: checked and bundled as the job does, unpacked, in event-time order."""
    bundles = bundled_rows([encode_event(e) for e in events], clock_ms=YEAR_2100, max_clock_skew_ms=0)
    out = [e for b in bundles if b[0] is not None for e in orjson.loads(b[2])]
    return sorted(out, key=lambda e: (e["eventTime"], e["seq"]))


class Monitor:
    """One broker between batches, kept as the adapter keeps it: its state, and its last registration apart."""

    def __init__(self, **settings: Any) -> None:
        self.settings = LivenessSettings(**{"heartbeat_timeout_ms": 60_000, "watermark_delay_ms": DELAY, **settings})
        self.state: BrokerState | None = None
        self.registration: str | None = None
        self.registration_reads = 0

    def feed(self, *events: Event, watermark: int = T0 - DELAY, health: bool = False) -> list[Output]:
        st, out, registration = broker_events(self.state, packed(*events), watermark, self.settings, self._stored)
        self.state = st
        if registration is not None:
            self.registration = registration
        return out if health else [o for o in out if not isinstance(o, HealthRow)]

    def _stored(self) -> str | None:
        self.registration_reads += 1
        return self.registration

    def reach(self, now: int) -> list[Output]:
        """Event time reaches ``now``: the broker's timer runs if one of its wake-ups has come."""
        watermark = now - DELAY
        st = self.state
        assert st is not None
        if not any(t != NO_TIMER and t <= watermark for t in (st.deadline, st.flap_timer)):
            return []
        self.state, out = broker_timer(st, watermark, self.settings)
        if self.state is None:
            self.registration = None
        return out


def actions(out: list[Output]) -> list[ActionRow]:
    return [o for o in out if isinstance(o, ActionRow)]


def alerts(out: list[Output]) -> list[tuple[str, str]]:
    return [(o.kind, o.state) for o in out if isinstance(o, AlertChange)]


def routes(out: list[Output]) -> list[RouteRow]:
    return [o for o in out if isinstance(o, RouteRow)]


# --------------------------------------------------------------------------- expiry


def test_a_broker_expires_once_event_time_is_past_its_deadline():
    m = Monitor()
    m.feed(register(T0))
    assert m.state is not None
    # the registration's 10 s replaces the 60 s default; the wake-up is in watermark time
    assert broker_due(m.state, m.settings) == T0 + TIMEOUT + 1
    assert m.state.deadline == T0 + TIMEOUT + 1 - DELAY
    assert m.reach(T0 + TIMEOUT) == []
    out = m.reach(T0 + TIMEOUT + 1)
    reason = f"no heartbeat at any node for 10.0 s (timeout 10000 ms, last heartbeat at {T0}, event time now {T0 + TIMEOUT + 1})"
    assert out == [
        ActionRow(T0 + TIMEOUT + 1, "EXPIRE", "TIMEOUT", T0, T0 + TIMEOUT + 1 - DELAY, reason, BROKER),
        AlertChange(T0 + TIMEOUT + 1, "BROKER_EXPIRED", "OPEN", "CRITICAL", f"broker broker-a[0] {ADDR} ({CLUSTER}) expired: {reason}", BROKER),
    ]  # fmt: skip
    assert m.state.deadline == T0 + TIMEOUT + 1 + 86_400_000 - DELAY  # next: forgetting it, a day later
    assert m.reach(T0 + 10 * TIMEOUT) == []  # never twice


def test_a_broker_known_only_by_heartbeats_has_the_default_timeout_until_it_registers():
    m = Monitor()
    m.feed(heartbeat(T0))
    assert m.reach(T0 + TIMEOUT + 1) == []
    assert [a.last_heartbeat for a in actions(m.reach(T0 + 60_001))] == [T0]
    m.feed(register(T0 + 70_000))  # a comeback with its own 10 s
    assert [a.last_heartbeat for a in actions(m.reach(T0 + 70_000 + TIMEOUT + 1))] == [T0 + 70_000]


def test_heartbeats_at_any_node_move_the_deadline():
    m = Monitor()
    m.feed(register(T0))
    assert m.feed(heartbeat(T0 + 8_000), heartbeat(T0 + 9_000, "n2")) == []
    # the old wake-up comes, finds nothing due and moves on to the new deadline
    assert m.reach(T0 + TIMEOUT + 1) == []
    assert m.state is not None and m.state.deadline == T0 + 9_000 + TIMEOUT + 1 - DELAY
    assert [a.last_heartbeat for a in actions(m.reach(T0 + 9_000 + TIMEOUT + 1))] == [T0 + 9_000]


def test_the_reason_says_how_long_the_broker_was_really_silent():
    m = Monitor()
    m.feed(register(T0))
    (action,) = actions(m.reach(T0 + TIMEOUT + 4_000))  # a batch that came late: 14 s past
    assert action.at == T0 + TIMEOUT + 1
    assert "no heartbeat at any node for 14.0 s (timeout 10000 ms" in action.reason


def test_a_silent_report_past_the_deadline_expires_the_broker_there_and_then():
    m = Monitor()
    m.feed(register(T0))
    out = m.feed(silent(T0 + TIMEOUT + 1), watermark=T0 - 5)
    (action,) = actions(out)
    assert (action.type, action.at, action.last_heartbeat, action.watermark) == ("EXPIRE", T0 + TIMEOUT + 1, T0, T0 - 5)
    assert alerts(out) == [("BROKER_EXPIRED", "OPEN")]
    # decided once: neither another node's report nor the timer expires it again
    assert m.feed(silent(T0 + TIMEOUT + 2, "n2")) == []
    assert actions(m.reach(T0 + 10 * TIMEOUT)) == []


def test_a_silent_report_not_past_the_deadline_changes_nothing_and_the_timer_still_decides():
    m = Monitor()
    m.feed(register(T0), heartbeat(T0 + 5_000, "n2"))  # n2 heard it later than n1 did
    assert m.feed(silent(T0 + TIMEOUT + 1, "n1")) == []  # n1's deadline, not the monitor's
    assert m.feed(silent(T0 + 5_000 + TIMEOUT)) == []  # at the deadline, not past it
    assert [a.last_heartbeat for a in actions(m.reach(T0 + 5_000 + TIMEOUT + 1))] == [T0 + 5_000]


def test_a_silent_report_about_an_unknown_or_gone_broker_changes_nothing():
    m = Monitor()
    assert m.feed(silent(T0)) == [] and m.state is None
    m.feed(register(T0), unregister(T0 + 1))
    assert m.feed(silent(T0 + TIMEOUT + 1)) == []


# --------------------------------------------------------------------------- removal


def test_an_unregistration_removes_once_as_a_notice_resolved_at_once_and_echoes_of_it_change_nothing():
    m = Monitor()
    m.feed(register(T0))
    out = m.feed(unregister(T0 + 1_000, "n1"), unregister(T0 + 1_001, "n2"), watermark=T0 - 7)
    reason = f"UNREGISTER_BROKER reported by n1 at {T0 + 1_000}"
    name = f"broker broker-a[0] {ADDR} ({CLUSTER})"
    # a clean shutdown pages nobody: the notice opens and resolves in the same breath, naming no node
    assert out == [
        ActionRow(T0 + 1_000, "REMOVE", "UNREGISTER_BROKER", T0 + 1_000, T0 - 7, reason, BROKER, "n1", 1),
        AlertChange(T0 + 1_000, "BROKER_REMOVED", "OPEN", "INFO",
                    f"{name} unregistered ({reason}); removed at every node", BROKER),
        AlertChange(T0 + 1_000, "BROKER_REMOVED", "RESOLVED", "INFO",
                    f"{name} unregistered (a clean shutdown): a notice, nothing stays open", BROKER),
    ]  # fmt: skip
    assert m.feed(unregister(T0 + 2_000, "n3", source="REMOVE")) == []
    assert m.reach(T0 + 100 * TIMEOUT) == []  # gone: no expiry on top
    assert alerts(m.feed(register(T0 + 200 * TIMEOUT))) == []  # nothing was left open for its return


@pytest.mark.parametrize("source", ["LOCAL_EXPIRY", "EXPIRE", "REMOVE"])
def test_unregistrations_that_echo_an_expiry_or_our_own_action_change_nothing(source):
    m = Monitor()
    m.feed(register(T0))
    assert m.feed(unregister(T0 + 1_000, source=source)) == []
    assert len(actions(m.reach(T0 + TIMEOUT + 1))) == 1  # still alive until it expires


def test_a_report_of_departure_older_than_the_last_heartbeat_changes_nothing():
    m = Monitor()
    m.feed(register(T0), heartbeat(T0 + 5_000, "n2"))
    assert m.feed(unregister(T0 + 4_000)) == []
    assert m.feed(closed(T0 + 4_000, "n2")) == []


def test_a_close_at_some_nodes_removes_nothing_and_the_last_close_removes_everywhere():
    m = Monitor()
    m.feed(register(T0, "n1"), register(T0 + 3, "n2"))
    assert m.feed(closed(T0 + 1_000, "n1")) == []
    out = m.feed(closed(T0 + 1_200, "n2"))
    (action,) = actions(out)
    assert (action.cause, action.at, action.last_heartbeat, action.node) == (
        "CHANNEL_CLOSED",
        T0 + 1_200,
        T0 + 1_200,
        "n2",
    )
    assert action.reason == f"CHANNEL_CLOSED at n1 at {T0 + 1_000}, n2 at {T0 + 1_200}"
    (alert,) = [o for o in out if isinstance(o, AlertChange)]
    assert (alert.kind, alert.severity) == ("BROKER_REMOVED", "WARNING")
    assert "lost its connection at every node that held one" in alert.message


def test_a_node_that_heard_the_broker_after_its_close_still_holds_a_connection():
    m = Monitor()
    m.feed(register(T0, "n1"), register(T0 + 3, "n2"))
    m.feed(closed(T0 + 1_000, "n1"), heartbeat(T0 + 1_500, "n1", "REGISTER_BROKER"))  # n1: reconnected
    assert actions(m.feed(closed(T0 + 2_000, "n2"))) == []
    assert actions(m.feed(closed(T0 + 1_100, "n1"))) == []  # older than n1's reconnection
    assert actions(m.feed(closed(T0 + 3_000, "n1"))) != []


def test_remove_on_channel_close_removes_at_the_first_close():
    m = Monitor(remove_on_channel_close=True)
    m.feed(register(T0, "n1"), register(T0 + 3, "n2"))
    out = m.feed(closed(T0 + 1_000, "n1"))
    assert [(a.type, a.cause) for a in actions(out)] == [("REMOVE", "CHANNEL_CLOSED")]
    (alert,) = [o for o in out if isinstance(o, AlertChange)]
    assert f"lost its connection (CHANNEL_CLOSED reported by n1 at {T0 + 1_000})" in alert.message


def test_reports_about_a_broker_never_seen_alive_leave_no_state():
    m = Monitor()
    assert m.feed(unregister(T0), closed(T0 + 1, "n2"), health=True) == [] and m.state is None


# --------------------------------------------------------------------------- routes


def test_a_registration_is_passed_once_whichever_node_reports_it_and_kept_for_replays():
    m = Monitor()
    first = register(T0, "n1")
    out = m.feed(first, register(T0 + 5, "n2"), watermark=T0 - 9)
    assert out == [RouteRow(T0, "REGISTER", encode_event(first).decode(), "n1", 1, None, BROKER)]
    assert m.registration == encode_event(first).decode()
    assert m.feed(register(T0 + 30_000)) == []
    assert [r.cause for r in routes(m.feed(register(T0 + 31_000, counter=2)))] == [None]


def test_a_comeback_by_heartbeat_passes_the_last_registration_again():
    m = Monitor()
    m.feed(register(T0))
    m.reach(T0 + TIMEOUT + 1)
    reads = m.registration_reads
    out = m.feed(heartbeat(T0 + 20_000, "n2", "REGISTER_BROKER"))
    assert [(r.cause, r.type, r.raw, r.node) for r in routes(out)] == [("COMEBACK", "REGISTER", m.registration, "n2")]
    assert m.registration_reads == reads + 1  # read only to replay it
    assert alerts(out) == [("BROKER_EXPIRED", "RESOLVED")]
    assert len(actions(m.reach(T0 + 20_000 + TIMEOUT + 1))) == 1  # alive again: it can expire again


def test_a_heartbeat_no_newer_than_the_one_an_expiry_counted_brings_nothing_back():
    """A node woken from standing still publishes the heartbeats queued for it stamped with when it stopped:
    the broker's other nodes heard those, or later ones, before it expired; they are not a comeback."""
    m = Monitor()
    m.feed(register(T0), heartbeat(T0 + 2_000, "n2"))
    assert len(actions(m.reach(T0 + 2_000 + TIMEOUT + 1))) == 1
    assert m.feed(heartbeat(T0 + 1_000, "n1"), heartbeat(T0 + 2_000, "n1", "REGISTER_BROKER")) == []
    assert m.state is not None and not m.state.alive
    out = m.feed(heartbeat(T0 + 2_001, "n1"))  # anything newer is
    assert [r.cause for r in routes(out)] == ["COMEBACK"] and alerts(out) == [("BROKER_EXPIRED", "RESOLVED")]


def test_a_heartbeat_read_late_past_its_own_deadline_brings_nothing_back_and_a_registration_is_kept():
    """A node's events read late (its partition stalled): a proof of life whose deadline event time has
    already passed is no comeback (it would open and close the incident again, and its deadline could only
    be met by a wake-up already behind the watermark); a registration among them is kept for the replay."""
    m = Monitor()
    m.feed(register(T0))
    assert len(actions(m.reach(T0 + TIMEOUT + 1))) == 1
    now = T0 + 200_000
    late = [heartbeat(T0 + 100_000, "n1"), register(T0 + 150_000, "n1", counter=2)]
    assert m.feed(*late, watermark=now - DELAY) == []
    assert m.state is not None and not m.state.alive
    out = m.feed(heartbeat(now, "n2"), watermark=now - DELAY)  # in time: back, with the newer registration
    assert [(r.cause, r.raw) for r in routes(out)] == [("COMEBACK", encode_event(late[1]).decode())]


def test_a_registration_and_a_comeback_in_one_batch_replay_that_registration_without_reading_the_store():
    m = Monitor()
    m.feed(register(T0))
    newer = register(T0 + 1_000, counter=2)
    out = m.feed(newer, unregister(T0 + 2_000), heartbeat(T0 + 3_000))
    assert [(r.cause, r.raw) for r in routes(out)] == [(None, encode_event(newer).decode())] * 1 + [
        ("COMEBACK", encode_event(newer).decode())
    ]
    assert m.registration_reads == 0


def test_an_unchanged_re_registration_passes_the_last_registration_at_most_once_per_gap():
    m = Monitor()
    m.feed(register(T0))
    out = m.feed(heartbeat(T0 + 30_000, "n1", "REGISTER_BROKER"), heartbeat(T0 + 30_002, "n2", "REGISTER_BROKER"))
    assert [r.cause for r in routes(out)] == ["REREGISTER"]
    assert m.feed(heartbeat(T0 + 30_000 + REPLAY_GAP_MS - 1, "n1", "REGISTER_BROKER")) == []
    assert m.feed(heartbeat(T0 + 45_000)) == []  # plain heartbeats never
    assert len(routes(m.feed(heartbeat(T0 + 30_000 + REPLAY_GAP_MS, "n2", "REGISTER_BROKER")))) == 1


def test_nothing_is_replayed_for_a_broker_known_only_by_heartbeats():
    m = Monitor()
    m.feed(heartbeat(T0))
    assert m.feed(heartbeat(T0 + 30_000, source="REGISTER_BROKER")) == []
    assert m.state is not None and m.state.replayed_at == 0


def test_admin_and_order_topic_conf_events_pass_through_in_the_order_given():
    a = ev(EventType.ADMIN, T0 + 1, "n1", seq=6, op="WIPE_WRITE_PERM", broker_name="broker-a", topic_count=1)
    o = Event(type=EventType.ORDER_TOPIC_CONF, node="n1", event_time=T0 + 2, seq=7, topic="T", order_topic_conf="a:4")
    assert admin_events(packed(o, a)) == [
        RouteRow(T0 + 1, "ADMIN", encode_event(a).decode(), "n1", 6),
        RouteRow(T0 + 2, "ORDER_TOPIC_CONF", encode_event(o).decode(), "n1", 7),
    ]


# --------------------------------------------------------------------------- alerts


def test_a_broker_that_lost_every_connection_stays_an_incident_until_it_comes_back():
    m = Monitor()
    m.feed(register(T0))
    (opened,) = [o for o in m.feed(closed(T0 + 1_000, "n1")) if isinstance(o, AlertChange)]
    assert m.reach(T0 + 100 * TIMEOUT) == []  # open for as long as it stays away
    out = m.feed(register(T0 + 200 * TIMEOUT, "n2"))
    assert [r.cause for r in routes(out)] == [None]  # a comeback's registration is passed whatever it says
    (alert,) = [o for o in out if isinstance(o, AlertChange)]
    # the resolution says what the open said of severity and subject: Alertmanager's labels come from them
    assert (alert.kind, alert.state, alert.severity, alert.broker, alert.node) == (
        "BROKER_REMOVED", "RESOLVED", opened.severity, opened.broker, None,
    )  # fmt: skip
    assert opened.severity == "WARNING" and opened.node is None
    message = f"broker broker-a[0] {ADDR} ({CLUSTER}) is back (event at {T0 + 200 * TIMEOUT} from n2)"
    assert alert.message == message


@pytest.mark.parametrize("broker_id, severity", [(0, "CRITICAL"), (1, "WARNING")])
def test_an_expiry_resolves_with_the_severity_it_opened_with_whatever_id_the_broker_returns_with(broker_id, severity):
    m = Monitor()

    def registration(t: int, node: str, as_id: int) -> Event:
        return ev(EventType.REGISTER, t, node, broker_name="broker-a", broker_id=as_id, heartbeat_timeout_millis=TIMEOUT,
                  data_version=DataVersionInfo(1, 0, 1), topics={"T": QueueInfo(4, 4, 6)})  # fmt: skip

    m.feed(registration(T0, "n1", broker_id))
    (opened,) = [o for o in m.reach(T0 + TIMEOUT + 1) if isinstance(o, AlertChange)]
    back = registration(T0 + 50_000, "n2", 1 - broker_id)  # a slave promoted, or a master demoted
    (resolved,) = [o for o in m.feed(back) if isinstance(o, AlertChange)]
    assert (opened.state, opened.severity, opened.node) == ("OPEN", severity, None)
    assert (resolved.state, resolved.severity, resolved.node) == ("RESOLVED", severity, None)


def test_flapping_opens_past_the_threshold_and_resolves_when_the_window_empties():
    m = Monitor(flap_threshold=2, flap_window_ms=100_000)
    m.feed(register(T0))
    now = T0 + TIMEOUT + 1
    m.reach(now)  # expired: 1 change
    m.feed(heartbeat(now + 1_000))  # back: 2, not more than the threshold
    now += 1_000 + TIMEOUT + 1
    out = m.reach(now)  # expired again: 3
    assert [(o.kind, o.state, o.at) for o in out if isinstance(o, AlertChange)] == [
        ("BROKER_EXPIRED", "OPEN", now),
        ("BROKER_FLAPPING", "OPEN", now),
    ]
    assert "expired or came back 3 times within 100 s (threshold 2)" in out[-1].message
    now += 1_000
    assert alerts(m.feed(heartbeat(now))) == [("BROKER_EXPIRED", "RESOLVED")]  # open once
    assert m.state is not None
    first_flap = T0 + TIMEOUT + 1
    assert m.state.flap_timer == first_flap + 100_000 - DELAY  # re-checked when the oldest leaves the window
    later = []
    for step in range(1, 20):  # alive and quiet while the window passes
        later += alerts(m.feed(heartbeat(now + step * 9_000)))
        later += alerts(m.reach(now + step * 9_000 + 1))
    assert later == [("BROKER_FLAPPING", "RESOLVED")]
    assert m.state.flap_timer == NO_TIMER


def test_a_broker_gone_long_enough_is_forgotten_and_its_incidents_resolved():
    m = Monitor(forget_after_ms=50_000)
    m.feed(register(T0))
    m.reach(T0 + TIMEOUT + 1)
    assert m.reach(T0 + TIMEOUT + 50_000) == []
    out = m.reach(T0 + TIMEOUT + 1 + 50_000)
    assert [(o.kind, o.state, o.severity) for o in out if isinstance(o, AlertChange)] == [
        ("BROKER_EXPIRED", "RESOLVED", "CRITICAL")  # as it opened: broker-a is a master
    ]
    assert m.state is None
    assert [r.cause for r in routes(m.feed(register(T0 + 100_000)))] == [None]  # from scratch: no comeback


def test_each_batch_reports_the_brokers_health_for_the_console():
    m = Monitor()
    out = m.feed(register(T0), heartbeat(T0 + 3_000, "n2"), health=True)
    assert out[-1] == HealthRow(T0 + 3_000, T0 + 3_000, "ALIVE", BROKER, TIMEOUT)
    assert m.feed(unregister(T0 + 4_000), health=True)[-1] == HealthRow(
        T0 + 4_000, T0 + 3_000, "REMOVED", BROKER, TIMEOUT
    )
    assert m.feed(silent(T0 + 5_000), health=True)[-1].state == "REMOVED"
    m2 = Monitor()
    m2.feed(register(T0))
    assert m2.feed(silent(T0 + TIMEOUT + 1), health=True)[-1].state == "EXPIRED"


def tick(t: int, seq: int = 1, local_scan: bool | None = None) -> Event:
    return ev(EventType.TICK, t, "n1", seq=seq, local_scan=local_scan)


def test_a_silent_node_opens_node_silent_at_its_deadline_and_a_new_tick_resolves_it():
    s = LivenessSettings(node_silent_ms=5_000, watermark_delay_ms=DELAY)
    st, out, wake = node_ticks(None, "n1", packed(tick(T0, local_scan=True)), s)
    assert out == [HealthRow(T0, T0, "SCAN_ON", node="n1")]
    assert wake == T0 + 5_001 - DELAY
    # a tick since the wake-up was set: the timer only moves on
    node_ticks(st, "n1", packed(tick(T0 + 2_000, seq=2)), s)
    assert node_timer(st, T0 + 5_001 - DELAY, s) == (st, [], T0 + 7_001 - DELAY)
    _, out, wake = node_timer(st, T0 + 7_001 - DELAY, s)
    message = "name-server node n1 sent no tick for 5 s of event time"
    assert (out, wake) == ([AlertChange(T0 + 7_001, "NODE_SILENT", "OPEN", "WARNING", message, node="n1")], None)
    assert node_timer(st, T0 + 50_000 - DELAY, s)[1] == []  # open once
    _, out, _ = node_ticks(st, "n1", packed(tick(T0 + 60_000, seq=3)), s)
    assert [(o.kind, o.state) for o in out if isinstance(o, AlertChange)] == [("NODE_SILENT", "RESOLVED")]
    assert out[-1] == HealthRow(T0 + 60_000, T0 + 60_000, None, node="n1")  # an older node: no scan field


def test_an_old_tick_moves_no_deadline():
    s = LivenessSettings(node_silent_ms=5_000, watermark_delay_ms=DELAY)
    st = NodeState("n1", last_tick=T0)
    _, out, wake = node_ticks(st, "n1", packed(tick(T0 - 1_000, local_scan=False)), s)
    assert (wake, out) == (None, [HealthRow(T0, T0, "SCAN_OFF", node="n1")])


# --------------------------------------------------------------------------- the module itself


def test_the_rules_get_exactly_the_fields_the_job_packs():
    assert set(PackedEvent.__annotations__) == set(PACKED_FIELDS)


def test_the_rules_import_no_spark():
    code = "import sys, streaming.decide; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"
