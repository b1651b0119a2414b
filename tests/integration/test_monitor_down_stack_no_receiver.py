"""MONITOR_DOWN with no receiver: the whole stack with its job stalled by SIGSTOP.

Kafka, Redis, two nodes and the Spark job as processes (:class:`~tests.support.system.System`),
with ``make run``'s console, every setting as ``conf/`` ships it: no ``alerts.alertmanagerUrl`` and no
``alerts.webhookUrl``, as under ``make run``; only the nodes' ``alerts.monitorLagMillis`` is shortened
to ``LAG_MS``. Once both nodes trust the job it is frozen with SIGSTOP (its driver, JVM and Python
workers: a job that hangs, not one that dies, so nothing notices a death) and kept frozen: MONITOR_DOWN,
raised by the nodes, appears in Redis as ``namesrv-monitor routes alerts`` reads it
(:class:`streaming.routes.RouteLookup`, and the command itself) and on the console. The job is let go
on (SIGCONT); once the nodes hear it the alert is resolved, once. A thread reads Redis every 50 ms
throughout: the alert opens once and ends once, and no node ever claims a resend interval (there is
no one to send to). The times (stall -> open, job heard again -> resolved) are printed and held to
load-aware bounds (:func:`tests.support.liveness.bounds_now`).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from common.alerts import AlertKind, AlertState, Severity, decode_alert
from common.contract import wall_ms
from common.redis_keys import RedisKeys
from infra.apps import ConsoleService
from namesrv.client import NameServerClient
from streaming import cli
from streaming.routes import RouteLookup
from tests.integration.test_monitor_down_stack import console_alerts, monitor_down
from tests.support.backends import ProcessInfra
from tests.support.liveness import bounds_now
from tests.support.node import free_port
from tests.support.recovery import first_heartbeat
from tests.support.report import report
from tests.support.system import ACTIONS, SHIPPED, System
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(900)

#: the nodes' alerts.monitorLagMillis here (conf/ ships 60 s)
LAG_MS = 15_000
#: the node's pager looks every second (monitor_down.PERIOD_S)
LOOK_MS = 1_000
#: past its due time (the last decision heard + LAG_MS) -> the alert in Redis, and the job heard again ->
#: the alert resolved in Redis: the node looks within a second and runs one script
OPEN_LATE_S, RESOLVE_S = 3.0, 3.0
NODES = ("node-1", "node-2")
RECEIVER_KEYS = ("alerts.alertmanagerUrl", "alerts.webhookUrl")


class LaggingSystem(System):
    """The system whose nodes say MONITOR_DOWN after ``LAG_MS``; no receiver, as ``conf/`` ships them."""

    def node_properties(self, i: int, *, warm_start: bool) -> dict[str, str]:
        return {**super().node_properties(i, warm_start=warm_start), "alerts.monitorLagMillis": str(LAG_MS)}


class RedisWatch:
    """What ``namesrv-monitor routes alerts`` shows, read every 50 ms in a thread: per read (wall ms, whether
    MONITOR_DOWN is open, how many MONITOR_DOWN resolutions are listed, whether a resend interval is claimed)."""

    def __init__(self, redis_url: str) -> None:
        self.lookup = RouteLookup(redis_url)
        self.keys = self.lookup.keys
        self.seen: list[tuple[int, bool, int, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redis-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = self.lookup.client
        while not self._stop.wait(0.05):
            try:
                shown = any(a.kind == AlertKind.MONITOR_DOWN for a in self.lookup.alerts())
                resolved = [decode_alert(r).kind for r in client.lrange(self.keys.alerts_resolved, 0, -1)]
                claimed = bool(client.exists(self.keys.monitor_down_resend))
            except (OSError, ValueError):
                continue
            self.seen.append((wall_ms(), shown, resolved.count(AlertKind.MONITOR_DOWN), claimed))

    def first(self, shown: bool, since_ms: int = 0) -> int | None:
        """The wall ms of the first read at or after ``since_ms`` where MONITOR_DOWN was (not) open."""
        return next((at for at, s, _, _ in list(self.seen) if at >= since_ms and s is shown), None)

    def openings(self) -> int:
        """How often MONITOR_DOWN went from not shown to shown."""
        states = [s for _, s, _, _ in list(self.seen)]
        return sum(1 for a, b in zip([False, *states], states, strict=False) if b and not a)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.lookup.close()


def routes_alerts(redis_url: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``namesrv-monitor routes alerts`` prints."""
    capsys.readouterr()
    assert cli.main(["routes", "--redis", redis_url, "alerts"]) == 0
    return capsys.readouterr().out


def test_with_no_receiver_a_stalled_job_shows_monitor_down_in_redis_and_it_is_resolved_once_the_job_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    run_dir = tmp_path / "stack"
    run_dir.mkdir()
    system = LaggingSystem(ProcessInfra(run_dir), run_dir, timing=SHIPPED)
    console = ConsoleService(port=free_port(), run_dir=run_dir / "console", redis_url=system.redis_url)
    watch: RedisWatch | None = None
    frozen = False
    try:
        system.start()  # returns once the job committed a batch and sent a MONITOR_HEARTBEAT
        console.start()
        watch = RedisWatch(system.redis_url)
        keys: RedisKeys = watch.keys
        for addr in system.node_addrs:  # no receiver on either node, as make run starts them
            with NameServerClient(addr, timeout=5) as client:
                config = client.get_config()
            assert {k: config[k] for k in RECEIVER_KEYS} == dict.fromkeys(RECEIVER_KEYS, ""), addr
            assert config["alerts.monitorLagMillis"] == str(LAG_MS)
        wait_until(
            lambda: {e.node for e in system.tap.events() if str(e.type) == "TICK" and e.local_scan is False}
            >= set(NODES),
            60,
            "both nodes trust the job (their TICKs: localScan false)",
        )
        assert watch.first(True) is None  # nothing while it decides

        # -- the job frozen, and kept so
        system.streaming_signal(signal.SIGSTOP)  # the driver and everything under it
        frozen = True
        stalled = wall_ms()  # after the freeze: whatever the job decided by then, the nodes may have heard
        opened_at = wait_until(lambda: watch.first(True, stalled), LAG_MS / 1000 + 60, "MONITOR_DOWN in Redis",
                               state=lambda: watch.seen[-3:])  # fmt: skip
        last_decided = max(a.decided_at for a in system.tap.actions() if a.decided_at <= stalled)
        (open_late_ms,) = bounds_now(OPEN_LATE_S)
        report(
            f"MONITOR_DOWN with no receiver: stall -> Redis {(opened_at - stalled) / 1000:.1f} s; last decision -> "
            f"Redis {(opened_at - last_decided) / 1000:.1f} s (alerts.monitorLagMillis {LAG_MS / 1000:.0f} s, "
            f"bound +{open_late_ms / 1000:.0f} s)"
        )
        assert opened_at >= last_decided + LAG_MS, "opened before the monitor was silent for alerts.monitorLagMillis"
        assert opened_at <= last_decided + LAG_MS + open_late_ms
        (alert,) = [a for a in watch.lookup.alerts() if a.kind == AlertKind.MONITOR_DOWN]
        assert (alert.state, alert.severity, alert.node) == (AlertState.OPEN, Severity.CRITICAL, None)
        assert f"for {LAG_MS // 1000} s (alerts.monitorLagMillis)" in alert.message and "it-monitor" in alert.message
        assert any(f"seen by {n})" in alert.message for n in NODES)  # raised by a node, not the job
        assert [a for a in system.tap.alerts() if str(a.kind) == "MONITOR_DOWN"] == []
        printed = routes_alerts(system.redis_url, capsys)
        assert "MONITOR_DOWN" in printed and "CRITICAL" in printed, printed
        shown = wait_until(lambda: monitor_down(console_alerts(console)["open"]), 10, "MONITOR_DOWN on the console")
        assert [(a["incident"], a["state"], a["severity"]) for a in shown] == [("MONITOR_DOWN", "OPEN", "CRITICAL")]
        # both nodes look every second while it is open: still one alert, a few looks on
        wait_until(lambda: wall_ms() >= opened_at + 3 * LOOK_MS, 10, "three more looks")
        assert [a.kind for a in watch.lookup.alerts()].count(AlertKind.MONITOR_DOWN) == 1

        # -- the job goes on: once the nodes hear it, the alert is resolved
        assert not [a for a in system.tap.actions() if a.decided_at > stalled], "nothing decided while frozen"
        heard_before = len(system.tap.seen(ACTIONS))
        resumed = wall_ms()
        system.streaming_signal(signal.SIGCONT)
        frozen = False
        back = wait_until(lambda: len(system.tap.seen(ACTIONS)) > heard_before, 120, "an action of the job going on")
        back_at = wall_ms()  # within the tap's poll of the first action read again; a node reads it as fast
        resolved_at = wait_until(lambda: watch.first(False, opened_at), 60, "MONITOR_DOWN resolved in Redis",
                                 state=lambda: watch.seen[-3:])  # fmt: skip
        wait_until(
            lambda: monitor_down(console_alerts(console)["resolved"]), 10, "MONITOR_DOWN resolved on the console"
        )
        (resolve_ms,) = bounds_now(RESOLVE_S)
        report(
            f"MONITOR_DOWN with no receiver resolved: resume -> first action read {(back_at - resumed) / 1000:.1f} s, "
            f"-> resolved in Redis {(resolved_at - resumed) / 1000:.1f} s (bound {resolve_ms / 1000:.0f} s after "
            f"the first action)"
        )
        assert back and resolved_at >= resumed, "resolved before the job went on"
        assert resolved_at <= back_at + resolve_ms
        # a node resolving (or opening) on its own would do so within a look of the other: both nodes have had
        # three looks since the resolution once the job beats that much later
        wait_until(
            lambda: first_heartbeat(system.tap.actions(), resolved_at + 3 * LOOK_MS),
            60,
            "a MONITOR_HEARTBEAT of the job three looks after the resolution",
        )
        wait_until(lambda: watch.seen and watch.seen[-1][0] >= wall_ms() - 200, 5, "a fresh read of Redis")

        # one incident: opened once, resolved once, and never offered to a receiver
        assert watch.openings() == 1, watch.seen
        assert watch.seen[-1][1] is False and watch.seen[-1][2] == 1, watch.seen[-1]
        assert not any(claimed for _, _, _, claimed in watch.seen), "a node claimed a resend interval"
        assert watch.lookup.client.get(keys.monitor_down) in (None, b"heard")
        assert "MONITOR_DOWN" not in routes_alerts(system.redis_url, capsys)
        now_shown = console_alerts(console)
        assert monitor_down(now_shown["open"]) == []
        assert [(a["incident"], a["state"]) for a in monitor_down(now_shown["resolved"])] == [
            ("MONITOR_DOWN", "RESOLVED")
        ]
    finally:
        if frozen:  # a frozen job would not take the SIGTERM that stops it
            system.streaming_signal(signal.SIGCONT)
        if watch is not None:
            watch.stop()
        console.stop()
        system.stop()
