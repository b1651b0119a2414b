"""The monitor watchdog: expiry handed to the monitor when it is heard, taken back after its silence."""

from __future__ import annotations

import asyncio
import logging

from common.routes import RouteInfoManager, RouteSettings
from namesrv.liveness import ExpiryScan, MonitorWatchdog
from tests.support.clock import Clock


def watchdog(silence_ms: int = 30_000) -> tuple[ExpiryScan, MonitorWatchdog, Clock]:
    scan, clock = ExpiryScan(RouteInfoManager(RouteSettings()), 5000), Clock()
    return scan, MonitorWatchdog(scan, silence_ms, now=clock.seconds, wall_clock_ms=clock), clock


def test_the_scan_hands_expiry_over_and_takes_it_back_once_each_way():
    scan = ExpiryScan(RouteInfoManager(RouteSettings()), 5000)
    assert scan.enabled  # the node decides until a monitor is heard, as Apache RocketMQ's does
    assert scan.hand_to_monitor() and not scan.enabled
    assert not scan.hand_to_monitor() and not scan.enabled  # already the monitor's: no second hand-over
    assert scan.take_back() and scan.enabled
    assert not scan.take_back() and scan.enabled


def test_the_first_hand_over_is_news_and_a_hand_back_after_silence_is_a_warning(caplog):
    caplog.set_level(logging.INFO, logger="namesrv.liveness")
    scan, dog, clock = watchdog()
    dog.heard("job-1")
    assert not scan.enabled
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "liveness monitor 'job-1' is alive: local expiry scan off, the monitor decides")
    ]
    caplog.clear()
    clock.advance(seconds=30)
    dog.check()
    assert scan.enabled
    dog.heard("job-1")
    assert not scan.enabled
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]  # scan back on, then off again
    caplog.clear()
    dog.heard("job-1")  # heard again while it decides: nothing to say
    assert caplog.records == []


def test_the_watchdog_reports_how_long_the_monitor_has_been_silent():
    _, dog, clock = watchdog()
    assert dog.silence_s() is None
    dog.heard("m")
    clock.advance(seconds=4)
    assert dog.silence_s() == 4


# --------------------------------------------------------------------------- what the monitor does not decide in time


def guarded_node(tmp_path, grace_ms: int = 1500):
    """A node with a broker (timeout 10 s) registered at 1,000,000 ms, and its watchdog on the same clock."""
    import concurrent.futures

    from tests.unit.liveness_support import Channel, make_node, register

    clock = Clock(1_000_000)  # the route tables' clock, and the wall clock (the same here)
    node, _, scan = make_node(tmp_path, clock)
    register(node, Channel(), heartbeatTimeoutMillis="10000")
    dog = MonitorWatchdog(scan, 30_000, now=clock.seconds, grace_ms=grace_ms, wall_clock_ms=clock)
    return node, dog, clock, concurrent.futures.ThreadPoolExecutor(1)


def expired(dog: MonitorWatchdog, worker) -> list[str]:
    got: list[str] = []
    scan_report = dog.expiry._report

    def report(outcome, why=""):
        got.extend(r.broker_addr for r in outcome.applied)
        return scan_report(outcome, why)

    dog.expiry._report = report  # type: ignore[method-assign]
    asyncio.run(dog.expire_undecided(worker))
    return got


def test_a_broker_the_monitor_has_not_decided_within_the_grace_is_expired_by_the_node(tmp_path):
    node, dog, clock, worker = guarded_node(tmp_path)
    deadline = 1_000_000 + 10_000
    dog.heard("job-1", decided_through=deadline - 1)  # a monitor heard, but not yet past the deadline
    clock.ms = deadline + 1500
    assert expired(dog, worker) == []  # within the grace: the monitor's to decide
    dog.heard("job-1", decided_through=deadline - 1)  # still behind the deadline (stalled on a backlog)
    clock.ms = deadline + 1501
    assert expired(dog, worker) == ["127.0.0.1:10911"]


def test_a_broker_the_monitor_passed_and_kept_stays_while_it_keeps_saying_so(tmp_path):
    # another node still hears it: the monitor, which counts every node's heartbeats, kept it
    node, dog, clock, worker = guarded_node(tmp_path)
    deadline = 1_000_000 + 10_000
    clock.ms = deadline + 5_000
    dog.heard("job-1", decided_through=deadline + 4_000)
    assert expired(dog, worker) == []
    clock.advance(1_000)
    assert expired(dog, worker) == []  # heard 1 s ago: its word still holds
    clock.advance(501)
    assert expired(dog, worker) == ["127.0.0.1:10911"]  # silent past the grace: stalled, so the node decides


def test_without_a_monitor_s_word_a_broker_goes_at_its_deadline_plus_the_grace(tmp_path):
    node, dog, clock, worker = guarded_node(tmp_path)
    dog.heard("old-job")  # a monitor that does not say how far it decided
    clock.ms = 1_000_000 + 10_000 + 1500
    assert expired(dog, worker) == []
    clock.advance(1)
    assert expired(dog, worker) == ["127.0.0.1:10911"]


def test_the_monitor_covers_a_moment_only_while_its_word_is_fresh():
    _, dog, clock = watchdog()
    assert not dog.covers(0) and dog.decided_through() is None
    dog.heard("m", decided_through=5_000)
    assert dog.covers(5_000) and not dog.covers(5_001)
    clock.advance(seconds=1.5)
    assert dog.covers(5_000)
    clock.advance(seconds=0.001)
    assert not dog.covers(5_000) and dog.decided_through() is None


def test_a_node_that_stood_still_does_not_blame_the_monitor_for_it_and_decides_nothing_while_it_catches_up(
    tmp_path, caplog
):
    """Frozen for a minute, the node heard neither the monitor nor its brokers: on waking, the monitor's silence
    is the node's (no scan taken back, no MONITOR_DOWN from silence_s), and for one grace it expires nothing,
    so the heartbeats queued up for it are read first; then it decides as before."""
    caplog.set_level(logging.WARNING, logger="namesrv.liveness")
    node, dog, clock, worker = guarded_node(tmp_path)
    dog._observed = dog.now()  # as run() starts reading the clock every PERIOD_S
    dog.heard("job-1", decided_through=clock.ms)
    clock.advance(60_000)  # stood still past the broker's deadline (registered at 1,000,000 with 10 s)
    assert dog.silence_s() == 0 and dog.monitor_alive and dog.decided_through() is not None
    dog.check()
    assert not dog.expiry.enabled  # the scan stays the monitor's
    assert expired(dog, worker) == []  # settling: what queued up is read first
    assert [r.getMessage() for r in caplog.records if "stood still" in r.getMessage()]
    for _ in range(7):  # one grace of looks every PERIOD_S
        clock.advance(250)
        dog.silence_s()
    assert expired(dog, worker) == ["127.0.0.1:10911"]  # nothing queued up for it: now the node decides


def test_the_node_says_it_is_catching_up_for_one_grace_after_it_stood_still_and_not_before_or_after(tmp_path):
    """Whoever reads first after the gap finds it (the server, on a connection's end, may be first)."""
    _, dog, clock, _ = guarded_node(tmp_path)
    assert not dog.catching_up()  # run() not reading yet: no gap can be told from a quiet start
    dog._observed = dog.now()  # as run() starts reading the clock every PERIOD_S
    clock.advance(250)
    assert not dog.catching_up()  # a look a period later: no stall
    clock.advance(60_000)
    assert dog.catching_up()  # this reading finds the stall
    clock.advance(dog.grace_ms - 250)
    assert dog.catching_up()
    clock.advance(250)
    assert not dog.catching_up()


def test_what_the_node_reads_while_it_catches_up_counts_as_heard_when_it_stopped(tmp_path):
    """The heartbeats that queued up for a node standing still were sent while it stood: the earliest they can
    have been sent is when it stopped, and that is when the handlers count them, for one grace."""
    _, dog, clock, _ = guarded_node(tmp_path)
    dog._observed = dog.now()  # as run() starts reading the clock every PERIOD_S
    clock.advance(250)
    assert dog.heard_at_ms() is None  # a look a period later: heard now
    stopped = clock.ms
    clock.advance(60_000)
    assert dog.heard_at_ms() == stopped  # the first reading after the gap finds it
    clock.advance(dog.grace_ms - 250)
    assert dog.heard_at_ms() == stopped
    clock.advance(250)
    assert dog.heard_at_ms() is None  # caught up


def test_a_node_with_kafka_asks_its_watchdog_when_what_it_reads_was_heard(tmp_path):
    from namesrv.app import build_node
    from namesrv.config import load_config

    config = load_config(None, {
        "kafkaBootstrapServers": "127.0.0.1:9", "kvConfigPath": str(tmp_path / "kv.json"),
        "configStorePath": str(tmp_path / "namesrv.properties"),
    })  # fmt: skip
    parts = build_node(config)
    try:
        assert parts.kafka is not None
        assert parts.context.heard_at_ms == parts.kafka.watchdog.heard_at_ms
    finally:
        parts.context.close()
