"""A page when the monitor is gone: the whole stack with its job SIGKILLed and kept dead.

Kafka, Redis, two nodes and the Spark job as processes (:class:`~tests.support.system.System`),
with ``make run``'s console, every setting as ``conf/`` ships it except the nodes' paging keys: both
nodes page a real Alertmanager (the ``am`` fixture) and a webhook kept by this test, and their
``alerts.monitorLagMillis`` is shortened to ``LAG_MS`` (how long the nodes wait cannot hide how many
pages and resolutions they send). Once both nodes trust the job it is SIGKILLed and nothing restarts
it: MONITOR_DOWN, paged by the nodes (not the job), reaches Alertmanager and the webhook once, not
once per node, and the console lists it; a new job is started, and once it decides the alert is
resolved once, with the labels it opened with, at both receivers and on the console. The times
(kill -> page, restart -> resolved) are printed and held to load-aware bounds
(:func:`tests.support.liveness.bounds_now`).
"""

from __future__ import annotations

import json
import threading
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from common.contract import wall_ms
from infra.apps import ConsoleService
from namesrv.client import NameServerClient
from tests.support import alertmanager
from tests.support.backends import ProcessInfra
from tests.support.liveness import bounds_now
from tests.support.node import free_port
from tests.support.recovery import first_heartbeat
from tests.support.report import report
from tests.support.system import SHIPPED, System
from tests.support.wait import wait_until
from tests.support.webhook import Webhook

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(not alertmanager.available(), reason=f"{alertmanager.BINARY} is not installed"),
]

#: the nodes' alerts.monitorLagMillis here (conf/ ships 60 s)
LAG_MS = 15_000
#: as conf/ ships it (namesrv.config's default): an open alert is sent again this often
RESEND_MS = 60_000
#: the node's pager looks every second (monitor_down.PERIOD_S): a node paging or resolving on its own
#: would do so within a look or two of the other, far inside the windows checked below
LOOK_MS = 1_000
#: past its due time (the last decision heard + LAG_MS) -> the page at the receivers, and the new job's
#: first decision -> the resolution at the receivers: the node hears the action, looks within a second
#: and POSTs
PAGE_LATE_S, RESOLVE_S = 3.0, 3.0
LABELS = {"alertname": "MONITOR_DOWN", "severity": "critical"}
NODES = ("node-1", "node-2")


class AlertingSystem(System):
    """The system whose nodes page MONITOR_DOWN to ``alerts`` (their ``alerts.*`` keys)."""

    def __init__(self, *args: Any, alerts: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alerts = alerts

    def node_properties(self, i: int, *, warm_start: bool) -> dict[str, str]:
        return {**super().node_properties(i, warm_start=warm_start), **self.alerts}


def hooked(webhook: Webhook, state: str) -> list[tuple[int, str, dict[str, Any]]]:
    """The MONITOR_DOWN alerts in ``state`` the webhook got: (wall ms received, the sender's ``monitor``, the alert)."""
    return [
        (d.at_ms, d.body.get("monitor"), alert)
        for d in webhook.deliveries()
        for alert in d.body["alerts"]
        if alert.get("kind") == "MONITOR_DOWN" and alert.get("state") == state
    ]


class Watch:
    """Alertmanager's MONITOR_DOWN alerts, read every 50 ms in a thread: (wall ms, alerts) per read."""

    def __init__(self, am: alertmanager.Alertmanager) -> None:
        self.am = am
        self.seen: list[tuple[int, list[dict[str, Any]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="am-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                found = self.am.alerts(alertname="MONITOR_DOWN")
            except OSError:
                continue
            self.seen.append((wall_ms(), found))

    def first(self, check: Any, since_ms: int = 0) -> int | None:
        """The wall ms of the first read at or after ``since_ms`` whose (wall ms, alerts) satisfy ``check``."""
        return next((at for at, found in list(self.seen) if at >= since_ms and check(at, found)), None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def firing(at: int, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The alerts of a read at ``at`` that were open then: active, and ending later (a resolution ends at once)."""
    return [a for a in found if a["status"]["state"] == "active" and iso_ms(a["endsAt"]) > at]


def ended(at: int, found: list[dict[str, Any]]) -> bool:
    return not firing(at, found)


def console_alerts(console: ConsoleService) -> dict[str, list[dict[str, Any]]]:
    """The console's alerts (its ``/api/state``, what the page shows); empty lists before its first read."""
    with urllib.request.urlopen(console.url + "api/state", timeout=5) as answer:
        doc = json.load(answer)
    alerts = doc.get("alerts") or {}
    return {"open": alerts.get("open", []), "resolved": alerts.get("resolved", [])}


def monitor_down(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in alerts if a["kind"] == "MONITOR_DOWN"]


def iso_ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def test_with_the_job_killed_the_nodes_page_monitor_down_once_and_resolve_it_once_the_new_job_decides(
    tmp_path: Path, am: alertmanager.Alertmanager, webhook: Webhook
):
    alerts = {
        "alerts.monitorLagMillis": str(LAG_MS),
        "alerts.alertmanagerUrl": am.url,
        "alerts.webhookUrl": webhook.url,
    }
    run_dir = tmp_path / "stack"
    run_dir.mkdir()
    system = AlertingSystem(ProcessInfra(run_dir), run_dir, timing=SHIPPED, alerts=alerts)
    console = ConsoleService(port=free_port(), run_dir=run_dir / "console", redis_url=system.redis_url)
    watch: Watch | None = None
    try:
        system.start()  # returns once the job committed a batch and sent a MONITOR_HEARTBEAT
        console.start()
        watch = Watch(am)
        for addr in system.node_addrs:  # both nodes page, with the settings given (the rest as shipped)
            with NameServerClient(addr, timeout=5) as client:
                config = client.get_config()
            assert {k: config[k] for k in alerts} == alerts, addr
            assert config["alerts.resendIntervalMillis"] == str(RESEND_MS)
        # a node that heard the job hands expiry to it, and its TICKs say its own scan is off
        wait_until(
            lambda: {e.node for e in system.tap.events() if str(e.type) == "TICK" and e.local_scan is False}
            >= set(NODES),
            60,
            "both nodes trust the job (their TICKs: localScan false)",
        )
        assert hooked(webhook, "OPEN") == [] and not am.alerts(alertname="MONITOR_DOWN")  # no page while it decides

        # -- the job SIGKILLed, and nothing restarts it
        killed = wall_ms()
        system.kill_streaming()
        assert system.streaming_pid is None
        wait_until(
            lambda: hooked(webhook, "OPEN"), LAG_MS / 1000 + 60, "MONITOR_DOWN at the webhook", state=webhook.deliveries
        )
        am_paged_at = wait_until(lambda: watch.first(firing, killed), 30, "MONITOR_DOWN active in Alertmanager")
        last_decided = max(a.decided_at for a in system.tap.actions() if a.decided_at <= killed)
        ((paged_at, sender, opened),) = hooked(webhook, "OPEN")
        (page_late_ms,) = bounds_now(PAGE_LATE_S)
        report(
            f"MONITOR_DOWN paged: kill -> webhook {(paged_at - killed) / 1000:.1f} s, -> Alertmanager "
            f"{(am_paged_at - killed) / 1000:.1f} s; last decision -> webhook {(paged_at - last_decided) / 1000:.1f} s "
            f"(alerts.monitorLagMillis {LAG_MS / 1000:.0f} s, bound +{page_late_ms / 1000:.0f} s)"
        )
        assert paged_at >= last_decided + LAG_MS, "paged before the monitor was silent for alerts.monitorLagMillis"
        assert paged_at <= last_decided + LAG_MS + page_late_ms
        # from a node, not the job: the webhook's sender is a node, and the job put none on its alerts topic
        # (the notice is the first node's to see the silence; the sender, the first to take the interval's turn)
        assert sender in NODES and opened["monitor"] in NODES
        assert [a for a in system.tap.alerts() if str(a.kind) == "MONITOR_DOWN"] == []
        assert opened["id"] == "MONITOR_DOWN" and opened["severity"] == "CRITICAL" and opened["endsAt"] is None
        assert not {"clusterName", "brokerName", "brokerAddr", "node", "topic"} & opened.keys()  # it names no node
        assert f"for {LAG_MS // 1000} s (alerts.monitorLagMillis)" in opened["message"]
        assert "it-monitor" in opened["message"]  # the last monitor heard
        (in_am,) = am.alerts(alertname="MONITOR_DOWN")
        assert in_am["labels"] == LABELS and in_am["status"]["state"] == "active"
        assert (
            in_am["annotations"]["summary"] == "MONITOR_DOWN" and in_am["annotations"]["monitor"] == opened["monitor"]
        )
        assert in_am["annotations"]["incident"] == "MONITOR_DOWN"
        assert iso_ms(in_am["startsAt"]) == iso_ms(opened["startsAt"])
        fingerprint = in_am["fingerprint"]
        shown = wait_until(lambda: monitor_down(console_alerts(console)["open"]), 10, "MONITOR_DOWN on the console")
        assert [(a["incident"], a["state"], a["severity"], a["subject"]) for a in shown] == [
            ("MONITOR_DOWN", "OPEN", "CRITICAL", "")
        ]

        # -- a new job: once it decides, the alert is resolved
        assert system.streaming_pid is None and not [
            a for a in system.tap.actions() if a.decided_at > killed
        ], "nothing decided while the job was dead"
        restarted = wall_ms()
        system.start_streaming()
        first_decision = min(a.decided_at for a in system.tap.actions() if a.decided_at >= restarted)
        wait_until(
            lambda: hooked(webhook, "RESOLVED"), 60, "MONITOR_DOWN resolved at the webhook", state=webhook.deliveries
        )
        am_resolved_at = wait_until(
            lambda: watch.first(ended, am_paged_at), 30, "MONITOR_DOWN resolved in Alertmanager"
        )
        shown = wait_until(
            lambda: monitor_down(console_alerts(console)["resolved"]), 10, "MONITOR_DOWN resolved on the console"
        )
        resolved_at = hooked(webhook, "RESOLVED")[0][0]
        # a node resolving on its own would do so within a look of hearing the new job, as the first did: both
        # nodes have had three looks since the resolution once the new job beats that much later
        wait_until(
            lambda: first_heartbeat(system.tap.actions(), resolved_at + 3 * LOOK_MS),
            60,
            "a MONITOR_HEARTBEAT of the new job three looks after the resolution",
        )
        (resolve_ms,) = bounds_now(RESOLVE_S)
        report(
            f"MONITOR_DOWN resolved: restart -> first decision {(first_decision - restarted) / 1000:.1f} s, -> webhook "
            f"{(resolved_at - restarted) / 1000:.1f} s, -> Alertmanager {(am_resolved_at - restarted) / 1000:.1f} s; "
            f"first decision -> webhook {(resolved_at - first_decision) / 1000:.1f} s (bound {resolve_ms / 1000:.0f} s)"
        )
        assert first_decision <= resolved_at <= first_decision + resolve_ms, "resolved only once the new job decides"

        # one page, not one per node: the webhook got the OPEN once per resend interval (once unless the new
        # job took longer than that to decide), Alertmanager as often; one resolution, with the OPEN's labels
        opens, resolutions = hooked(webhook, "OPEN"), hooked(webhook, "RESOLVED")
        assert len(resolutions) == 1, resolutions
        ((_, resolver, closed),) = resolutions
        times = [at for at, _, _ in opens]
        assert [t for t in times if t < paged_at + RESEND_MS - LOOK_MS] == [paged_at], opens  # once in its interval
        assert all(b - a >= RESEND_MS - LOOK_MS for a, b in zip(times, times[1:], strict=False)), opens
        assert all(o == opened | {"emittedAt": o["emittedAt"]} for _, _, o in opens)  # the stored notice, resent
        assert resolver in NODES and closed["monitor"] == opened["monitor"]  # the OPEN's fields, whoever resolves
        assert closed["id"] == opened["id"] and closed["severity"] == "CRITICAL" and closed["kind"] == "MONITOR_DOWN"
        assert closed["startsAt"] == opened["startsAt"] and closed["endsAt"] is not None
        assert max(times) <= resolved_at  # nothing opened it again after the resolution
        reads = [(at, found) for at, found in watch.seen if found]
        assert {a["fingerprint"] for _, found in reads for a in found} == {fingerprint}  # one alert, opened and ended
        assert all(a["labels"] == LABELS for _, found in reads for a in found)
        open_updates = {a["updatedAt"] for at, found in reads for a in firing(at, found)}
        assert len(open_updates) == len(opens), open_updates  # Alertmanager took it as often as the webhook
        assert ended(wall_ms(), am.alerts(alertname="MONITOR_DOWN"))
        # the console: none open, the resolution listed with the incident
        now_shown = console_alerts(console)
        assert monitor_down(now_shown["open"]) == []
        assert [(a["incident"], a["state"], a["severity"]) for a in monitor_down(now_shown["resolved"])][:1] == [
            ("MONITOR_DOWN", "RESOLVED", "INFO")
        ]
        assert len(monitor_down(now_shown["resolved"])) == 1 and shown
    finally:
        if watch is not None:
            watch.stop()
        console.stop()
        system.stop()
