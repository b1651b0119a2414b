"""Applying the monitor's actions: fencing by last-seen time, duplicates, the monitor watchdog."""

from __future__ import annotations

from namesrv.events.actions import ActionApplier, ActionConsumer, ConsumerSettings, MonitorWatchdog, Outcome
from namesrv.events.schema import Action, ActionType, encode_action
from namesrv.handlers import NodeObserver
from namesrv.liveness import BatchUnregistration, ExpiryScan
from namesrv.protocol.types import DataVersion, RegisterBrokerBody, TopicConfig
from namesrv.routes import RouteInfoManager, RouteSettings

CLUSTER, NAME, ADDR = "DefaultCluster", "broker-a", "127.0.0.1:10911"
BODY = RegisterBrokerBody(DataVersion(1, 0, 1), {"A": TopicConfig("A"), "B": TopicConfig("B")})


class Recorder(NodeObserver):
    def __init__(self) -> None:
        self.unregistered: list[tuple[str, str]] = []

    def broker_unregistered(self, request, reason):
        self.unregistered.append((request.broker_addr, reason))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def expire(last_heartbeat: int, **kw) -> Action:
    fields = dict(cluster_name=CLUSTER, broker_addr=ADDR, broker_name=NAME, broker_id=0,
                  last_heartbeat=last_heartbeat, watermark=last_heartbeat + 10_000)
    fields.update(kw)
    return Action(ActionType.EXPIRE, "monitor-1", 5_000_000, **fields)


def setup(last_seen: dict | None = None):
    routes = RouteInfoManager(RouteSettings())
    routes.register_broker(CLUSTER, ADDR, NAME, 0, None, body=BODY)
    batch = BatchUnregistration(routes, 10)
    observer = Recorder()
    seen = {} if last_seen is None else last_seen
    applier = ActionApplier(routes, batch.submit, lambda c, a: seen.get((c, a)), observer)
    return routes, batch, observer, applier


def test_an_action_based_on_the_latest_event_removes_the_broker_like_an_unregistration():
    routes, batch, observer, applier = setup({(CLUSTER, ADDR): 1_000})
    assert applier.apply(expire(1_000)) is Outcome.APPLIED
    batch.drain_now()
    assert routes.last_seen(CLUSTER, ADDR) is None and routes.get_all_topic_list() == []
    assert observer.unregistered == [(ADDR, "EXPIRE")]


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
    clock = FakeClock()
    dog = MonitorWatchdog(scan, silence_ms=30_000, now=clock)
    dog.check()
    assert scan.enabled  # never heard: Apache behaviour
    applier = ActionApplier(routes, lambda r: True, lambda c, a: None, Recorder(), dog)
    assert applier.apply(Action(ActionType.MONITOR_HEARTBEAT, "monitor-1", 1)) is Outcome.HEARD
    assert not scan.enabled
    clock.now += 29.9
    dog.check()
    assert not scan.enabled
    clock.now += 0.2
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
