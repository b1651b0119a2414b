"""The monitor's pager against Debian's real Alertmanager, fed by the job's sink as a batch feeds it (no Spark).

The sink decides alerts from output rows (:mod:`tests.support.streaming`) and writes Redis for real;
its pager pushes to an Alertmanager on a free loopback port (:mod:`tests.support.alertmanager`),
with a resend interval of 1 s so that the periodic re-sending shows within a test. A resolved
alert is one Alertmanager no longer lists (its GET /api/v2/alerts leaves out those whose endsAt
has passed).
"""

from __future__ import annotations

import time

import orjson
import pytest

from common.contract import Event, EventType, encode_event
from streaming.alerts import AlertKind, AlertState, Severity
from streaming.decide import BrokerState, LivenessSettings, broker_events, broker_timer
from streaming.events import bundled_rows
from streaming.liveness import KIND_ALERT, _rows
from streaming.paging import Outbox, Pager, PagingSettings
from tests.support import alertmanager
from tests.support.streaming import T0, YEAR_2100, expire_row, make_sink, out_row, register, route_row
from tests.support.wait import wait_until
from tests.support.webhook import Webhook

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not alertmanager.available(), reason=f"{alertmanager.BINARY} is not installed"),
]

ADDR = "10.0.0.1:1"
RESEND_MS = 1000


def expired_alert(state: AlertState, t: int, severity: Severity = Severity.CRITICAL) -> dict:
    """A BROKER_EXPIRED row of the stateful step, with the severity of the incident (or another one)."""
    return out_row(
        KIND_ALERT, t, type=str(AlertKind.BROKER_EXPIRED), state=str(state), severity=str(severity),
        message="broker a expired" if state is AlertState.OPEN else "broker a is back",
        clusterName="C", brokerName="a", brokerAddr=ADDR,
    )  # fmt: skip


class Decider:
    """Broker ``a``'s liveness rules (streaming.decide) with their outputs as the stateful step's rows."""

    def __init__(self) -> None:
        self.state: BrokerState | None = None
        self.settings = LivenessSettings(heartbeat_timeout_ms=10_000, watermark_delay_ms=0)

    def feed(self, *events: Event) -> list[dict]:
        bundles = bundled_rows([encode_event(e) for e in events], clock_ms=YEAR_2100, max_clock_skew_ms=0)
        packed = [e for b in bundles if b[0] is not None for e in orjson.loads(b[2])]
        self.state, out, _ = broker_events(self.state, packed, 0, self.settings, lambda: None)
        return [r.asDict() for r in _rows(out)]

    def reach(self, event_time: int) -> list[dict]:
        assert self.state is not None
        self.state, out = broker_timer(self.state, event_time, self.settings)
        return [r.asDict() for r in _rows(out)]


def departure(etype: EventType, t: int, seq: int) -> Event:
    if etype is EventType.UNREGISTER:
        return Event(type=etype, node="n1", event_time=t, seq=seq, cluster_name="C", broker_addr=ADDR,
                     source="UNREGISTER_BROKER")  # fmt: skip
    return Event(type=etype, node="n1", event_time=t, seq=seq, cluster_name="C", broker_addr=ADDR, reason="reset")


def paged_sink(redis_url: str, prefix: str, url: str):
    """A sink (FakePublisher, real Redis) with a pager to ``url``, its lineage set (the pager started)."""
    sink, _ = make_sink(redis_url, prefix)
    sink.clock = lambda: int(time.time() * 1000)  # the pager's endsAt is wall time
    settings = PagingSettings(alertmanager_urls=(url,), resend_ms=RESEND_MS, timeout_ms=2000, raised_by="m")
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

        # the broker comes back: both end, even with a resolution that says another severity (older versions)
        back = expired_alert(AlertState.RESOLVED, T0 + 30_000, Severity.INFO)
        sink.process([route_row(register(t=T0 + 30_000, seq=2)), back], 2)
        wait_until(lambda: am.alerts() == [], 15, "both resolved in Alertmanager", state=am.alerts)
        wait_until(lambda: not sink.store.client.exists(sink.store.keys.alerts_outbox), 5, "the outbox emptied")
    finally:
        sink.close()


def test_a_clean_unregistration_pages_nobody_and_a_lost_broker_fires_until_it_returns_with_the_same_labels(
    redis_url, am
):
    sink = paged_sink(redis_url, "p4", am.url)
    (target,) = sink.pager.targets
    broker = Decider()
    try:
        sink.process(broker.feed(register()), 0)
        sink.process(broker.feed(departure(EventType.UNREGISTER, T0 + 1_000, 2)), 1)
        # the notice reaches Alertmanager already resolved: it is not listed, nothing fires
        wait_until(lambda: target.delivered >= 1, 15, "the notice delivered")
        wait_until(lambda: not sink.store.client.exists(sink.store.keys.alerts_outbox), 5, "the outbox emptied")
        assert am.alerts() == [], "a clean shutdown is no incident"

        sink.process(broker.feed(register(t=T0 + 2_000, seq=3)), 2)
        sink.process(broker.feed(departure(EventType.CHANNEL_CLOSED, T0 + 3_000, 4)), 3)
        (lost,) = wait_until(lambda: am.firing(alertname="BROKER_REMOVED"), 15, "BROKER_REMOVED firing")
        labels = {"alertname": "BROKER_REMOVED", "severity": "warning", "cluster": "C", "broker": "a",
                  "broker_addr": ADDR}  # fmt: skip
        assert lost["labels"] == labels
        sent = target.delivered
        wait_until(lambda: target.delivered >= sent + 2, 15, "two resends")
        assert [a["labels"] for a in am.alerts(alertname="BROKER_REMOVED")] == [labels]  # still the one alert
        sink.process(broker.feed(register(t=T0 + 60_000, seq=5)), 4)
        wait_until(lambda: am.alerts() == [], 15, "the comeback resolves it", state=am.alerts)
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


def test_the_webhook_s_resolution_has_the_severity_and_fields_of_its_open():
    hook = Webhook()
    url = hook.url
    sink, _ = make_sink(None, "w2")
    sink.pager = Pager(PagingSettings(webhook_url=url, resend_ms=60_000, timeout_ms=2000, raised_by="m"))
    sink.set_lineage("q")
    broker = Decider()
    try:

        def said() -> list[dict]:
            return hook.alerts("BROKER_EXPIRED")

        sink.process(broker.feed(register()), 0)
        sink.process(broker.reach(T0 + 10_001), 1)  # expired: a master, CRITICAL
        wait_until(said, 15, "the open delivered")  # (else the resolution takes its place in the queue)
        sink.process(broker.feed(register(node="n2", t=T0 + 30_000, seq=2)), 2)  # back, heard by n2
        opened, resolved = wait_until(lambda: len(said()) == 2 and said(), 15, "the resolution")
        assert (opened["state"], resolved["state"]) == ("OPEN", "RESOLVED")
        same = ("id", "severity", "clusterName", "brokerName", "brokerAddr")
        assert {k: resolved.get(k) for k in same} == {k: opened.get(k) for k in same}
        assert resolved["severity"] == "CRITICAL" and "node" not in resolved
    finally:
        sink.close()
        hook.close()


def test_the_webhook_gets_json_batches_after_retrying_an_unavailable_receiver():
    hook = Webhook(refuse_first=1)
    url = hook.url
    sink, _ = make_sink(None, "w")
    sink.pager = Pager(PagingSettings(webhook_url=url, resend_ms=60_000, timeout_ms=2000, raised_by="m"))
    sink.set_lineage("q")
    try:
        sink.process([route_row(register()), expired_alert(AlertState.OPEN, T0 + 20_000)], 0)
        wait_until(hook.bodies, 15, "a delivery after the 503")
        (body,) = hook.bodies()
        assert body["version"] == 1 and body["monitor"] == "m"
        (alert,) = body["alerts"]
        assert (alert["id"], alert["state"], alert["endsAt"]) == (f"BROKER_EXPIRED|C|{ADDR}", "OPEN", None)
    finally:
        sink.close()
        hook.close()
