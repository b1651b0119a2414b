"""MONITOR_DOWN with no receiver, through a real Redis: two nodes open it once and resolve it once.

As in test_monitor_down.py, the nodes' watchdogs run on a test clock and each node's look
(:meth:`MonitorDownPager.step`) is called by hand; Redis is real and no node has ``alerts.alertmanagerUrl``
or ``alerts.webhookUrl``. The alert is read as ``namesrv-monitor routes alerts`` reads it
(:class:`streaming.routes.RouteLookup`, and the command itself).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from common import redis_clients
from common.alerts import AlertKind, AlertState, Severity, decode_alert
from common.paging import Notice, PagingSettings
from common.redis_keys import RedisKeys
from namesrv.liveness import MonitorDownPager, MonitorWatchdog, monitor_down
from streaming import cli
from streaming.routes import RouteLookup
from tests.support.clock import Clock

pytestmark = pytest.mark.timeout(120)

THRESHOLD_MS = 60_000
PREFIX = "md0"


def no_post(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a node without a receiver POSTed")


def test_with_no_receiver_two_nodes_open_it_once_in_redis_and_the_first_to_hear_the_monitor_resolves_it(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setattr(monitor_down, "post_json", no_post)
    clock = Clock()
    keys = RedisKeys(PREFIX)
    client = redis_clients.connect(redis_url)
    lookup = RouteLookup(redis_url, prefix=PREFIX)
    nodes = []
    for name in ("node-a", "node-b"):
        watchdog = MonitorWatchdog(SimpleNamespace(hand_to_monitor=lambda: False), 30_000, now=clock.seconds)
        watchdog.heard("liveness@test")
        nodes.append(MonitorDownPager(redis_clients.connect(redis_url), keys, name, watchdog, PagingSettings(),
                                      THRESHOLD_MS))  # fmt: skip
    a, b = nodes

    def shown() -> list[tuple[str, str]]:
        return [(a.kind, a.state) for a in lookup.alerts()]

    try:
        a.step(), b.step()
        clock.advance(THRESHOLD_MS - 500)
        a.step(), b.step()
        assert shown() == [] and client.get(keys.monitor_down) is None  # not yet silent long enough

        clock.advance(500)
        for _ in range(3):
            b.step(), a.step()
        (alert,) = lookup.alerts()
        assert (alert.kind, alert.state, alert.severity) == (AlertKind.MONITOR_DOWN, AlertState.OPEN, Severity.CRITICAL)
        assert "node-b" in alert.message  # the first node's notice, not one per node
        assert Notice.decode(client.get(keys.monitor_down)).state == "OPEN"
        assert client.exists(keys.monitor_down_resend) == 0  # no receiver: no resend interval claimed
        assert cli.main(["routes", "--redis", redis_url, "--prefix", PREFIX, "alerts"]) == 0
        printed = capsys.readouterr().out
        assert "MONITOR_DOWN" in printed and "CRITICAL" in printed

        client.delete(keys.alerts)  # as a job's rewrite of Redis does
        a.step()
        assert [x.message for x in lookup.alerts()] == [alert.message]  # shown again, the same alert
        stored = client.get(keys.monitor_down)

        b.watchdog.heard("liveness@test")  # a monitor decides again; node-b hears it first
        b.step()
        a.step()  # node-a has not heard it yet: it does not open the alert again
        a.watchdog.heard("liveness@test")
        a.step(), b.step()
        assert shown() == [] and client.get(keys.monitor_down) == monitor_down.HEARD
        (resolved,) = [decode_alert(r) for r in client.lrange(keys.alerts_resolved, 0, -1)]
        assert (resolved.kind, resolved.state) == (AlertKind.MONITOR_DOWN, AlertState.RESOLVED)
        assert a.unsent is None and b.unsent is None  # no resolution waits for a receiver
        # a node that read the open notice just before node-b resolved it puts nothing back on the console
        client.eval(monitor_down._SHOW, 2, keys.monitor_down, keys.alerts, stored, alert.incident,
                    orjson.dumps(Notice.decode(stored).alert))  # fmt: skip
        assert client.hlen(keys.alerts) == 0
        assert cli.main(["routes", "--redis", redis_url, "--prefix", PREFIX, "alerts"]) == 0
        assert "MONITOR_DOWN" not in capsys.readouterr().out
    finally:
        lookup.close()
        client.close()
        for node in nodes:
            node.client.close()
