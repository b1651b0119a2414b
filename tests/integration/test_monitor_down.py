"""MONITOR_DOWN through a real Redis and a real Alertmanager: two nodes page once and resolve once.

The nodes' watchdogs run on a test clock and each node's look (:meth:`MonitorDownPager.step`) is
called by hand, so the test decides who looks when; Redis, Alertmanager and a webhook are real.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from common import redis_clients
from common.alerts import decode_alert
from common.paging import PagingSettings
from common.redis_keys import RedisKeys
from namesrv.liveness import MonitorDownPager, MonitorWatchdog
from tests.support import alertmanager
from tests.support.wait import wait_until

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not alertmanager.available(), reason=f"{alertmanager.BINARY} is not installed"),
]

THRESHOLD_MS = 60_000


class _Keeper(http.server.BaseHTTPRequestHandler):
    """Keeps the alerts of every POST."""

    alerts: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        type(self).alerts += json.loads(self.rfile.read(int(self.headers["Content-Length"])))["alerts"]
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[str]:
    _Keeper.alerts = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Keeper)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()


def test_two_nodes_page_once_show_it_in_redis_and_the_first_to_hear_the_monitor_resolves_it(redis_url, am, webhook):
    clock = [1000.0]
    keys = RedisKeys("md1")
    client = redis_clients.connect(redis_url)
    settings = PagingSettings((am.url,), webhook, resend_ms=60_000)
    nodes = []
    for name in ("node-a", "node-b"):
        watchdog = MonitorWatchdog(SimpleNamespace(hand_to_monitor=lambda: False), 30_000, now=lambda: clock[0])
        watchdog.heard("liveness@test")
        nodes.append(MonitorDownPager(redis_clients.connect(redis_url), keys, name, watchdog, settings, THRESHOLD_MS))
    a, b = nodes

    def open_in_redis() -> list[str]:
        return [decode_alert(raw).kind for raw in client.hvals(keys.alerts)]

    try:
        a.step(), b.step()
        clock[0] += THRESHOLD_MS / 1000 - 0.5
        a.step(), b.step()
        assert _Keeper.alerts == [] and open_in_redis() == []  # not yet silent long enough

        clock[0] += 0.5
        for _ in range(3):
            b.step(), a.step()
        assert [(x["kind"], x["state"]) for x in _Keeper.alerts] == [("MONITOR_DOWN", "OPEN")]  # once
        assert open_in_redis() == ["MONITOR_DOWN"]  # the console shows it
        firing = wait_until(lambda: am.firing(alertname="MONITOR_DOWN"), 15, "MONITOR_DOWN active")
        assert len(firing) == 1 and firing[0]["labels"] == {"alertname": "MONITOR_DOWN", "severity": "critical"}

        b.watchdog.heard("liveness@test")  # a monitor decides again; node-b hears it first
        b.step()
        a.step()  # node-a has not heard it yet: it does not open the alert again
        a.watchdog.heard("liveness@test")
        a.step(), b.step()
        assert [(x["kind"], x["state"]) for x in _Keeper.alerts] == [
            ("MONITOR_DOWN", "OPEN"), ("MONITOR_DOWN", "RESOLVED"),
        ]  # fmt: skip
        assert _Keeper.alerts[1]["id"] == _Keeper.alerts[0]["id"]
        assert open_in_redis() == []
        assert decode_alert(client.lindex(keys.alerts_resolved, 0)).kind == "MONITOR_DOWN"
        wait_until(lambda: not am.firing(alertname="MONITOR_DOWN"), 15, "MONITOR_DOWN resolved")
    finally:
        client.close()
        for node in nodes:
            node.client.close()
