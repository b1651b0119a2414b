"""The monitor watchdog: expiry handed to the monitor when it is heard, taken back after its silence."""

from __future__ import annotations

import logging

from namesrv.liveness import ExpiryScan, MonitorWatchdog
from namesrv.routes import RouteInfoManager, RouteSettings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watchdog(silence_ms: int = 30_000) -> tuple[ExpiryScan, MonitorWatchdog, Clock]:
    scan, clock = ExpiryScan(RouteInfoManager(RouteSettings()), 5000), Clock()
    return scan, MonitorWatchdog(scan, silence_ms, now=clock), clock


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
    clock.now += 30
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
    clock.now += 4
    assert dog.silence_s() == 4
