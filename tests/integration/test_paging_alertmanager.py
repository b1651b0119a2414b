"""The monitor's pager against Debian's real Alertmanager, fed by the job's sink as a batch feeds it (no Spark).

The sink decides alerts from output rows (:mod:`tests.support.streaming`) and writes Redis for real;
its pager pushes to an Alertmanager on a free loopback port (:mod:`tests.support.alertmanager`),
with a resend interval of 1 s so that the periodic re-sending shows within a test. A resolved
alert is one Alertmanager no longer lists (its GET /api/v2/alerts leaves out those whose endsAt
has passed).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from streaming.alerts import AlertKind, AlertState, Severity
from streaming.liveness import KIND_ALERT
from streaming.paging import Outbox, Pager, PagingSettings
from tests.support import alertmanager
from tests.support.streaming import T0, expire_row, make_sink, out_row, register, route_row
from tests.support.wait import wait_until

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not alertmanager.available(), reason=f"{alertmanager.BINARY} is not installed"),
]

ADDR = "10.0.0.1:1"
RESEND_MS = 1000


@pytest.fixture
def am(tmp_path) -> Iterator[alertmanager.Alertmanager]:
    server = alertmanager.Alertmanager(tmp_path)
    server.start()
    yield server
    server.stop()


def expired_alert(state: AlertState, t: int) -> dict:
    """The BROKER_EXPIRED row the stateful step emits (its resolution says severity INFO)."""
    return out_row(
        KIND_ALERT, t, type=str(AlertKind.BROKER_EXPIRED), state=str(state),
        severity=str(Severity.CRITICAL if state is AlertState.OPEN else Severity.INFO),
        message="broker a expired" if state is AlertState.OPEN else "broker a is back",
        clusterName="C", brokerName="a", brokerAddr=ADDR,
    )  # fmt: skip


def paged_sink(redis_url: str, prefix: str, url: str):
    """A sink (FakePublisher, real Redis) with a pager to ``url``, its lineage set (the pager started)."""
    sink, _ = make_sink(redis_url, prefix)
    sink.clock = lambda: int(time.time() * 1000)  # the pager's endsAt is wall time
    settings = PagingSettings(alertmanager_urls=(url,), resend_ms=RESEND_MS, timeout_ms=2000, monitor="m")
    sink.pager = Pager(settings, Outbox(sink.store.client, sink.store.keys.alerts_outbox))
    sink.set_lineage("q")
    return sink


def test_an_expiry_raises_the_alert_in_alertmanager_and_a_comeback_resolves_it(redis_url, am):
    sink = paged_sink(redis_url, "p1", am.url)
    try:
        sink.process([route_row(register())], 0)
        sink.process([expire_row(T0 + 20_000), expired_alert(AlertState.OPEN, T0 + 20_000)], 1)
        (expired,) = wait_until(lambda: am.firing(alertname="BROKER_EXPIRED"), 15, "BROKER_EXPIRED in Alertmanager")
        assert expired["labels"] == {
            "alertname": "BROKER_EXPIRED", "severity": "critical", "cluster": "C", "broker": "a", "broker_addr": ADDR,
        }  # fmt: skip
        assert expired["annotations"]["description"] == "broker a expired"
        assert expired["annotations"]["incident"] == f"BROKER_EXPIRED|C|{ADDR}"
        # the topics it took with it: one incident for the group, naming T and counting C (the cluster's topic)
        (lost,) = wait_until(lambda: am.firing(alertname="TOPIC_NOT_WRITABLE"), 15, "the group's incident")
        assert lost["labels"] == {
            "alertname": "TOPIC_NOT_WRITABLE",
            "severity": "critical",
            "cluster": "C",
            "broker": "a",
        }
        assert "1 topic(s): T;" in lost["annotations"]["description"]
        assert len(am.alerts()) == 2

        # the broker comes back: both end, though the stateful step's resolution says severity INFO
        sink.process([route_row(register(t=T0 + 30_000, seq=2)), expired_alert(AlertState.RESOLVED, T0 + 30_000)], 2)
        wait_until(lambda: am.alerts() == [], 15, "both resolved in Alertmanager", state=am.alerts)
        wait_until(lambda: not sink.store.client.exists(sink.store.keys.alerts_outbox), 5, "the outbox emptied")
    finally:
        sink.close()


def test_a_restarted_alertmanager_has_the_open_alerts_again_within_a_resend_interval(redis_url, am):
    sink = paged_sink(redis_url, "p2", am.url)
    try:
        sink.process([route_row(register())], 0)
        sink.process([expired_alert(AlertState.OPEN, T0 + 20_000)], 1)
        wait_until(lambda: am.firing(alertname="BROKER_EXPIRED"), 15, "BROKER_EXPIRED in Alertmanager")
        (target,) = sink.pager.targets
        am.restart()  # alerts are in its memory only
        restarted = time.monotonic()
        sent = target.delivered
        wait_until(lambda: am.firing(alertname="BROKER_EXPIRED"), 15, "BROKER_EXPIRED back after the restart")
        took = time.monotonic() - restarted
        assert target.delivered > sent
        print(f"\nalert back in a restarted Alertmanager after {took:.2f} s (resend interval {RESEND_MS} ms)")
    finally:
        sink.close()


def test_a_resolution_not_delivered_before_the_monitor_stopped_is_delivered_after_its_restart(redis_url, am):
    first = paged_sink(redis_url, "p3", am.url)
    first.process([route_row(register())], 0)
    first.process([expired_alert(AlertState.OPEN, T0 + 20_000)], 1)
    wait_until(lambda: am.firing(alertname="BROKER_EXPIRED"), 15, "BROKER_EXPIRED in Alertmanager")
    first.pager.stop()  # the monitor dies right after the next batch is written
    first.process([expired_alert(AlertState.RESOLVED, T0 + 30_000)], 2)
    first.close()
    keys = first.store.keys
    assert first.store.client.hkeys(keys.alerts_outbox) == [f"BROKER_EXPIRED|C|{ADDR}".encode()]
    assert am.firing(alertname="BROKER_EXPIRED"), "Alertmanager has not heard of the resolution yet"

    again = paged_sink(redis_url, "p3", am.url)  # the restarted monitor: same lineage, same Redis
    try:
        wait_until(lambda: am.alerts() == [], 15, "the resolution delivered after the restart", state=am.alerts)
        wait_until(lambda: not again.store.client.exists(keys.alerts_outbox), 5, "the outbox emptied")
    finally:
        again.close()


class _Webhook(http.server.BaseHTTPRequestHandler):
    """Refuses the first POST with 503 and keeps the bodies of the others."""

    bodies: list[dict] = []
    refusals = 1

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).refusals > 0:
            type(self).refusals -= 1
            self.send_response(503)
        else:
            type(self).bodies.append(json.loads(body))
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_webhook_gets_json_batches_after_retrying_an_unavailable_receiver():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    sink, _ = make_sink(None, "w")
    sink.pager = Pager(PagingSettings(webhook_url=url, resend_ms=60_000, timeout_ms=2000, monitor="m"))
    sink.set_lineage("q")
    try:
        sink.process([route_row(register()), expired_alert(AlertState.OPEN, T0 + 20_000)], 0)
        wait_until(lambda: _Webhook.bodies, 15, "a delivery after the 503")
        (body,) = _Webhook.bodies
        assert body["version"] == 1 and body["monitor"] == "m"
        (alert,) = body["alerts"]
        assert (alert["id"], alert["state"], alert["endsAt"]) == (f"BROKER_EXPIRED|C|{ADDR}", "OPEN", None)
    finally:
        sink.close()
        server.shutdown()
