"""Applying the monitor's actions: fencing by last-seen time, duplicates, the clock-skew bound, which
monitors are obeyed, and that every admitted action tells the monitor watchdog."""

from __future__ import annotations

import logging

from common.contract import Action, ActionType, encode_action
from common.protocol.types import DataVersion, RegisterBrokerBody, TopicConfig
from common.routes import RouteInfoManager, RouteSettings
from namesrv.config import load_config
from namesrv.events.actions import (
    ActionApplier,
    ActionConsumer,
    ConsumerSettings,
    Outcome,
    action_stats,
)
from namesrv.handlers import NodeObserver
from namesrv.liveness import (
    Departure,
    ExpiryScan,
    MonitorTrust,
    MonitorWatchdog,
    UnregisterBatcher,
    departure,
    trusted_monitors,
)
from tests.support.clock import Clock

CLUSTER, NAME, ADDR = "DefaultCluster", "broker-a", "127.0.0.1:10911"
BODY = RegisterBrokerBody(DataVersion(1, 0, 1), {"A": TopicConfig("A"), "B": TopicConfig("B")})


class Recorder(NodeObserver):
    def __init__(self) -> None:
        self.unregistered: list[tuple[str, Departure]] = []

    def broker_unregistered(self, request, departure):
        self.unregistered.append((request.broker_addr, departure))


def expire(last_heartbeat: int, **kw) -> Action:
    fields = dict(
        cluster_name=CLUSTER,
        broker_addr=ADDR,
        broker_name=NAME,
        broker_id=0,
        last_heartbeat=last_heartbeat,
        watermark=last_heartbeat + 10_000,
    )
    fields.update(kw)
    return Action(ActionType.EXPIRE, "monitor-1", 5_000_000, **fields)


def setup(last_seen: dict | None = None):
    routes = RouteInfoManager(RouteSettings())
    routes.register_broker(CLUSTER, ADDR, NAME, 0, None, body=BODY)
    batch = UnregisterBatcher(routes, 10)
    observer = Recorder()
    seen = {} if last_seen is None else last_seen
    applier = ActionApplier(routes, batch.submit, lambda c, a: seen.get((c, a)), observer)
    return routes, batch, observer, applier


def test_an_action_based_on_the_latest_event_removes_the_broker_like_an_unregistration():
    routes, batch, observer, applier = setup({(CLUSTER, ADDR): 1_000})
    assert applier.apply(expire(1_000)) is Outcome.APPLIED
    batch.drain_now()
    assert routes.last_seen(CLUSTER, ADDR) is None and routes.get_all_topic_list() == []
    assert observer.unregistered == [(ADDR, departure.MONITOR_EXPIRE)]


def test_an_action_older_than_what_the_node_saw_is_stale_and_changes_nothing():
    routes, batch, observer, applier = setup({(CLUSTER, ADDR): 1_001})
    assert applier.apply(expire(1_000)) is Outcome.STALE
    batch.drain_now()
    assert routes.last_seen(CLUSTER, ADDR) is not None and observer.unregistered == []


def test_duplicates_and_unknown_brokers_are_harmless():
    routes, batch, observer, applier = setup()
    assert applier.apply(expire(1_000, reason="silent")) is Outcome.APPLIED
    batch.drain_now()
    assert applier.apply(expire(1_000)) is Outcome.ABSENT
    assert applier.apply(expire(1_000, broker_addr="10.0.0.9:10911")) is Outcome.ABSENT
    assert applier.counts[Outcome.APPLIED] == 1 and applier.counts[Outcome.ABSENT] == 2


def test_a_registration_between_decision_and_batch_keeps_the_broker():
    routes, batch, _, applier = setup()
    assert applier.apply(expire(1_000)) is Outcome.APPLIED
    routes.register_broker(CLUSTER, ADDR, NAME, 0, None, body=BODY)  # before the batch runs
    batch.drain_now()
    assert routes.last_seen(CLUSTER, ADDR) is not None


def test_a_role_change_or_a_full_queue_skips_the_action():
    routes, batch, _, applier = setup()
    assert applier.apply(expire(1_000, broker_id=1)) is Outcome.ROLE_CHANGED
    full = ActionApplier(routes, lambda requests: False, lambda c, a: None, Recorder())
    assert full.apply(expire(1_000)) is Outcome.REJECTED
    batch.drain_now()
    assert routes.last_seen(CLUSTER, ADDR) is not None


def test_watchdog_switches_the_local_scan_off_while_the_monitor_speaks_and_back_after_silence(caplog):
    routes = RouteInfoManager(RouteSettings())
    scan = ExpiryScan(routes, 5000)
    clock = Clock()
    dog = MonitorWatchdog(scan, silence_ms=30_000, now=clock.seconds)
    dog.check()
    assert scan.enabled  # never heard: Apache behaviour
    applier = ActionApplier(routes, lambda r: True, lambda c, a: None, Recorder(), dog)
    assert applier.apply(Action(ActionType.MONITOR_HEARTBEAT, "monitor-1", 1)) is Outcome.HEARD
    assert not scan.enabled
    clock.advance(seconds=29.9)
    dog.check()
    assert not scan.enabled
    clock.advance(seconds=0.2)
    dog.check()
    assert scan.enabled and "silent for 30000 ms" in caplog.text
    applier.apply(expire(1))  # any action proves the monitor is alive
    assert not scan.enabled


def test_consumer_counts_and_skips_bad_records_and_delivers_good_ones():
    delivered = []
    consumer = ActionConsumer(ConsumerSettings("k:1", "actions"), delivered.append)
    good = expire(7)
    for value in (b"{bad", None, b'{"v":1,"type":"REBOOT","monitor":"m","decidedAt":1}', encode_action(good)):
        consumer._handle(value)
    assert delivered == [good]
    assert (consumer.received, consumer.skipped) == (4, 3)


# --------------------------------------------------------------------------- times ahead of the node's clock

NOW_MS = 1_700_000_000_000


def skew_setup(skew_ms: int = 10_000):
    routes, batch, observer, _ = setup()
    scan = ExpiryScan(routes, 5000)
    dog = MonitorWatchdog(scan, silence_ms=30_000, now=Clock().seconds)
    applier = ActionApplier(
        routes, batch.submit, lambda c, a: None, observer, dog, max_clock_skew_ms=skew_ms, wall_clock_ms=lambda: NOW_MS
    )
    return routes, batch, scan, applier


def test_an_action_whose_last_heartbeat_is_further_ahead_than_the_skew_bound_is_refused(caplog):
    routes, batch, scan, applier = skew_setup()
    far = expire(NOW_MS + 10_001, watermark=NOW_MS)
    assert applier.apply(far) is Outcome.AHEAD
    assert applier.apply(expire(NOW_MS, watermark=NOW_MS + 10_001)) is Outcome.AHEAD
    batch.drain_now()
    assert routes.last_seen(CLUSTER, ADDR) is not None and scan.enabled  # not removed, monitor not "heard"
    assert applier.counts[Outcome.AHEAD] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1  # one per monitor and minute
    assert (
        "refusing EXPIRE of '127.0.0.1:10911' from monitor 'monitor-1': its lastHeartbeat is 10001 ms ahead"
        in warnings[0]
        and "maxClockSkewMillis=10000" in warnings[0]
    )


def test_an_action_exactly_at_the_skew_bound_is_applied():
    routes, batch, scan, applier = skew_setup()
    assert applier.apply(expire(NOW_MS + 10_000, watermark=NOW_MS + 10_000)) is Outcome.APPLIED
    batch.drain_now()
    assert routes.last_seen(CLUSTER, ADDR) is None and not scan.enabled


def test_a_monitor_heartbeat_with_a_watermark_in_the_future_does_not_keep_the_local_scan_off():
    _, _, scan, applier = skew_setup(skew_ms=0)
    beat = Action(ActionType.MONITOR_HEARTBEAT, "monitor-1", NOW_MS, watermark=NOW_MS + 1)
    assert applier.apply(beat) is Outcome.AHEAD and scan.enabled
    assert applier.apply(Action(ActionType.MONITOR_HEARTBEAT, "monitor-1", NOW_MS, watermark=NOW_MS)) is Outcome.HEARD
    assert not scan.enabled


def test_a_monitor_heartbeat_deciding_through_the_future_is_refused_and_one_from_now_is_taken():
    # a monitor that claims to have decided past the node's clock would keep every overdue broker here
    _, _, _, applier = skew_setup(skew_ms=0)
    ahead = Action(ActionType.MONITOR_HEARTBEAT, "monitor-1", NOW_MS, watermark=NOW_MS, decided_through=NOW_MS + 1)
    assert applier.apply(ahead) is Outcome.AHEAD
    assert applier.watchdog is not None and applier.watchdog.decided_through() is None
    now = Action(ActionType.MONITOR_HEARTBEAT, "monitor-1", NOW_MS, watermark=NOW_MS, decided_through=NOW_MS)
    assert applier.apply(now) is Outcome.HEARD
    assert applier.watchdog.decided_through() == NOW_MS


# --------------------------------------------------------------------------- which monitors are obeyed


def trust_setup(trusted: str = "", silence_ms: int = 30_000):
    routes, batch, observer, _ = setup()
    clock = Clock()
    scan = ExpiryScan(routes, 5000)
    dog = MonitorWatchdog(scan, silence_ms=silence_ms, now=clock.seconds)
    trust = MonitorTrust(trusted_monitors(load_config(None, {"trustedMonitors": trusted})), dog)
    applier = ActionApplier(routes, batch.submit, lambda c, a: None, observer, dog, trust=trust)
    return routes, batch, scan, applier, clock


def beat(monitor: str) -> Action:
    return Action(ActionType.MONITOR_HEARTBEAT, monitor, 1)


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_by_default_the_first_monitor_heard_is_obeyed_and_a_second_one_refused_and_reported(caplog):
    routes, batch, scan, applier, clock = trust_setup()
    assert applier.apply(beat("job-a")) is Outcome.HEARD and not scan.enabled
    rogue = expire(1_000)
    rogue.monitor = "nobody-runs-this"
    for _ in range(3):
        assert applier.apply(rogue) is Outcome.UNTRUSTED
    batch.drain_now()
    assert routes.last_seen(CLUSTER, ADDR) is not None
    (warning,) = warnings_of(caplog)  # one per untrusted id per minute
    assert "ignoring EXPIRE from monitor 'nobody-runs-this': this node obeys monitor 'job-a'" in warning
    assert "monitorSilenceFallbackMillis" in warning and "set trustedMonitors" in warning
    clock.advance(seconds=61)
    applier.apply(beat("job-a"))
    assert applier.apply(beat("nobody-runs-this")) is Outcome.UNTRUSTED
    assert len(warnings_of(caplog)) == 2  # a minute later: reported again
    assert applier.counts[Outcome.UNTRUSTED] == 4
    assert action_stats(ActionConsumer(ConsumerSettings("k:1", "a"), lambda a: None), applier).untrusted == 4


def test_an_untrusted_monitor_never_switches_the_local_scan_off():
    _, _, scan, applier, _ = trust_setup("job-a")
    assert applier.apply(beat("job-b")) is Outcome.UNTRUSTED
    assert scan.enabled


def test_another_monitor_takes_over_only_after_the_first_was_silent_for_the_fallback_time(caplog):
    caplog.set_level(logging.INFO, logger="namesrv.liveness")
    routes, batch, scan, applier, clock = trust_setup(silence_ms=30_000)
    assert applier.apply(beat("job-1")) is Outcome.HEARD
    assert "obeying monitor 'job-1', the first one heard" in caplog.text
    clock.advance(seconds=29.9)
    assert applier.apply(beat("job-2")) is Outcome.UNTRUSTED
    clock.advance(seconds=0.1)  # job-1 silent for 30 s now: the local scan is back on, and job-2 may take over
    applier.watchdog.check()
    assert scan.enabled
    take_over = expire(1_000)
    take_over.monitor = "job-2"
    assert applier.apply(take_over) is Outcome.APPLIED and not scan.enabled
    batch.drain_now()
    assert routes.last_seen(CLUSTER, ADDR) is None
    assert any(
        "monitor 'job-1' silent for 30000 ms (monitorSilenceFallbackMillis=30000): obeying monitor 'job-2'" in w
        for w in warnings_of(caplog)
    )
    assert applier.apply(beat("job-1")) is Outcome.UNTRUSTED  # the old one came back: now it is the second


def test_a_node_that_stood_still_does_not_hand_the_monitor_s_place_to_another_for_its_own_silence():
    """The silence is the watchdog's one clock, made up for the node's own stall: a minute frozen is not
    the obeyed monitor's minute of silence, so another monitor heard on waking is still refused."""
    _, _, scan, applier, clock = trust_setup(silence_ms=30_000)
    applier.watchdog._observed = clock.seconds()  # as the watchdog's run() reads the clock every period
    assert applier.apply(beat("job-1")) is Outcome.HEARD
    clock.advance(seconds=60)  # the node frozen
    assert applier.apply(beat("job-2")) is Outcome.UNTRUSTED
    assert applier.apply(beat("job-1")) is Outcome.HEARD and not scan.enabled


def test_configured_monitors_are_obeyed_whoever_spoke_first_and_others_are_refused(caplog):
    assert trusted_monitors(load_config(None, {"trustedMonitors": " job-a ; ;job-b;"})) == {"job-a", "job-b"}
    _, _, scan, applier, clock = trust_setup("job-a;job-b")
    assert applier.apply(beat("job-c")) is Outcome.UNTRUSTED and scan.enabled
    assert applier.apply(beat("job-b")) is Outcome.HEARD
    assert applier.apply(beat("job-a")) is Outcome.HEARD
    clock.advance(seconds=3600)  # silence changes nothing with a configured list
    assert applier.apply(beat("job-c")) is Outcome.UNTRUSTED
    (warning, again) = warnings_of(caplog)
    assert "ignoring MONITOR_HEARTBEAT from monitor 'job-c': not in trustedMonitors (job-a;job-b)" in warning
    assert warning == again
