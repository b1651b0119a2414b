"""MONITOR_DOWN through a real Redis and a real Alertmanager: two nodes page once and resolve once.

The nodes' watchdogs run on a test clock and each node's look (:meth:`MonitorDownPager.step`) is
called by hand, so the test decides who looks when; Redis, Alertmanager and a webhook are real.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from common import redis_clients
from common.alerts import decode_alert
from common.paging import PagingSettings
from common.redis_keys import RedisKeys
from namesrv.liveness import MonitorDownPager, MonitorWatchdog
from tests.support import alertmanager
from tests.support.clock import Clock
from tests.support.wait import wait_until

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not alertmanager.available(), reason=f"{alertmanager.BINARY} is not installed"),
]

THRESHOLD_MS = 60_000


def test_two_nodes_page_once_show_it_in_redis_and_the_first_to_hear_the_monitor_resolves_it(redis_url, am, webhook):
    clock = Clock()
    keys = RedisKeys("md1")
    client = redis_clients.connect(redis_url)
    settings = PagingSettings((am.url,), webhook.url, resend_ms=60_000)
    nodes = []
    for name in ("node-a", "node-b"):
        watchdog = MonitorWatchdog(SimpleNamespace(hand_to_monitor=lambda: False), 30_000, now=clock.seconds)
        watchdog.heard("liveness@test")
        nodes.append(MonitorDownPager(redis_clients.connect(redis_url), keys, name, watchdog, settings, THRESHOLD_MS))
    a, b = nodes

    def open_in_redis() -> list[str]:
        return [decode_alert(raw).kind for raw in client.hvals(keys.alerts)]

    try:
        a.step(), b.step()
        clock.advance(THRESHOLD_MS - 500)
        a.step(), b.step()
        assert webhook.alerts() == [] and open_in_redis() == []  # not yet silent long enough

        clock.advance(500)
        for _ in range(3):
            b.step(), a.step()
        assert [(x["kind"], x["state"]) for x in webhook.alerts()] == [("MONITOR_DOWN", "OPEN")]  # once
        assert open_in_redis() == ["MONITOR_DOWN"]  # the console shows it
        firing = wait_until(lambda: am.firing(alertname="MONITOR_DOWN"), 15, "MONITOR_DOWN active")
        assert len(firing) == 1 and firing[0]["labels"] == {"alertname": "MONITOR_DOWN", "severity": "critical"}

        b.watchdog.heard("liveness@test")  # a monitor decides again; node-b hears it first
        b.step()
        a.step()  # node-a has not heard it yet: it does not open the alert again
        a.watchdog.heard("liveness@test")
        a.step(), b.step()
        assert [(x["kind"], x["state"]) for x in webhook.alerts()] == [
            ("MONITOR_DOWN", "OPEN"), ("MONITOR_DOWN", "RESOLVED"),
        ]  # fmt: skip
        assert webhook.alerts()[1]["id"] == webhook.alerts()[0]["id"]
        assert open_in_redis() == []
        assert decode_alert(client.lindex(keys.alerts_resolved, 0)).kind == "MONITOR_DOWN"
        wait_until(lambda: not am.firing(alertname="MONITOR_DOWN"), 15, "MONITOR_DOWN resolved")
    finally:
        client.close()
        for node in nodes:
            node.client.close()
