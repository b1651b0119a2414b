"""The pager's decisions without a network: what Alertmanager is told, what the outbox keeps, the bounds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from streaming import paging
from streaming.alerts import Alert, AlertKind, AlertState, Severity
from streaming.config import ConfigError, load_config
from streaming.paging import ENDS_AT_RESENDS, Notice, Pager, PagingSettings, Refused, Target, iso, labels_of

T0 = 1_700_000_000_000
NOW = T0 + 60_000
SETTINGS = PagingSettings(alertmanager_urls=("http://127.0.0.1:1",), resend_ms=1000, raised_by="m")


def expired(state: AlertState = AlertState.OPEN, t: int = T0, severity: Severity = Severity.CRITICAL) -> Alert:
    return Alert(AlertKind.BROKER_EXPIRED, state, severity, f"{state} message", t, cluster_name="C",
                 broker_name="a", broker_addr="1.2.3.4:5")  # fmt: skip


class FakeOutbox:
    def __init__(self) -> None:
        self.removed: list[str] = []

    def remove(self, notice: Notice) -> None:
        self.removed.append(notice.incident)


def pager(outbox: FakeOutbox | None = None) -> Pager:
    return Pager(SETTINGS, outbox, clock=lambda: NOW)  # type: ignore[arg-type]


def test_a_resolution_carries_the_labels_and_start_of_the_alert_it_ends():
    p = pager()
    (opened,) = p.stage([expired()])
    p.submit([opened])
    assert opened.labels == {"alertname": "BROKER_EXPIRED", "severity": "critical", "cluster": "C", "broker": "a",
                             "broker_addr": "1.2.3.4:5"}  # fmt: skip
    sent = opened.for_alertmanager(NOW, 4000, "")
    assert (sent["startsAt"], sent["endsAt"]) == (iso(T0), iso(NOW + 4000))
    assert sent["annotations"]["summary"] == "BROKER_EXPIRED C a 1.2.3.4:5"
    (resolved,) = p.stage([expired(AlertState.RESOLVED, T0 + 30_000)])
    # Alertmanager tells alerts apart by their labels: another severity would be another alert, left firing
    assert resolved.labels == opened.labels and resolved.starts_at == T0
    assert labels_of(expired(AlertState.RESOLVED)) == opened.labels  # as the stateful step resolves it
    assert resolved.for_alertmanager(NOW, 4000, "http://console")["endsAt"] == iso(T0 + 30_000)
    assert resolved.for_alertmanager(NOW, 4000, "http://console")["generatorURL"] == "http://console"
    assert resolved.annotations["description"] == "RESOLVED message"


def test_the_webhook_s_resolution_says_what_its_open_said_even_when_the_resolution_says_otherwise():
    p = pager()
    p.submit(p.stage([expired()]))
    # a resolution an older version decided: severity INFO and the node that heard the broker again
    older = replace(expired(AlertState.RESOLVED, T0 + 30_000, Severity.INFO), node="node-9876")
    (resolved,) = p.stage([older])
    body = resolved.for_webhook(NOW, 4000)
    assert (body["state"], body["severity"], body["message"]) == ("RESOLVED", "CRITICAL", "RESOLVED message")
    assert "node" not in body and body["eventTime"] == T0 + 30_000
    assert resolved.labels["severity"] == "critical" and "node" not in resolved.labels


def test_an_open_and_its_resolution_in_one_batch_and_times_that_never_go_backwards():
    p = pager()
    opened, resolved = expired(), expired(AlertState.RESOLVED, T0 - 5)
    (n,) = p.stage([opened, resolved])  # the latest word on the incident wins
    assert n.state == "RESOLVED" and n.labels["severity"] == "critical"
    # a resolution stamped before its start (clocks) still ends at or after it: Alertmanager refuses the other
    assert n.for_alertmanager(NOW, 4000, "")["endsAt"] == iso(T0)
    # a resolution stamped ahead of the wall clock ends now
    (later,) = pager().stage([expired(AlertState.RESOLVED, NOW + 9_000)])
    assert later.ends_at == NOW


def test_only_resolutions_go_to_the_outbox_and_leave_it_once_every_target_has_them():
    outbox = FakeOutbox()
    p = Pager(PagingSettings(alertmanager_urls=("http://a:1", "http://b:1"), raised_by="m"), outbox, clock=lambda: NOW)  # type: ignore[arg-type]
    notices = p.stage([expired(), Alert(AlertKind.NODE_SILENT, AlertState.RESOLVED, Severity.INFO, "ok", T0, node="n")])
    assert set(p.outbox_entries(notices)) == {"NODE_SILENT|n"}
    assert Pager(SETTINGS).outbox_entries(notices) == {}  # without Redis there is no outbox
    p.submit(notices)
    resolved = [n for n in notices if n.state == "RESOLVED"]
    first, second = p.targets
    p.done(first, resolved)
    assert outbox.removed == []
    p.done(second, resolved)
    assert outbox.removed == ["NODE_SILENT|n"]
    # a reopened incident's older resolution is not waited for
    (again,) = p.stage([expired(AlertState.RESOLVED)])
    p.submit([again])
    p.submit(p.stage([expired()]))
    p.done(first, [again])
    p.done(second, [again])
    assert outbox.removed == ["NODE_SILENT|n"]
    assert "BROKER_EXPIRED|C|1.2.3.4:5" in p.open_notices()


def test_a_full_queue_drops_open_alerts_first_since_the_next_resend_carries_them(monkeypatch):
    monkeypatch.setattr(paging, "MAX_PENDING", 3)
    p = pager()
    (target,) = p.targets
    res = [paging.notice_of(Alert(AlertKind.NODE_SILENT, AlertState.RESOLVED, Severity.INFO, "", T0, node=f"r{i}"), "m",
                            NOW) for i in range(2)]  # fmt: skip
    opens = [paging.notice_of(Alert(AlertKind.NODE_SILENT, AlertState.OPEN, Severity.WARNING, "", T0, node=f"o{i}"),
                              "m", NOW) for i in range(2)]  # fmt: skip
    target.enqueue([res[0], opens[0], res[1], opens[1]])
    assert [n.incident for n in target.pending.values()] == ["NODE_SILENT|r0", "NODE_SILENT|r1", "NODE_SILENT|o1"]
    target.enqueue([opens[0]])  # still full: the oldest open goes, never a resolution while an open is there
    assert [n.incident for n in target.pending.values()] == ["NODE_SILENT|r0", "NODE_SILENT|r1", "NODE_SILENT|o0"]
    assert target.dropped == 2


def test_a_refused_batch_is_split_so_only_the_alert_refused_alone_is_dropped(caplog):
    p = pager()
    target = Target(p, "am", "http://x", "alertmanager")
    posted: list[list[str]] = []

    def post(notices):
        names = [n.incident for n in notices]
        if "NODE_SILENT|bad" in names:
            raise Refused("HTTP 400: 'bad label'")
        posted.append(names)

    target._post = post  # type: ignore[method-assign]
    notices = [paging.notice_of(Alert(AlertKind.NODE_SILENT, AlertState.OPEN, Severity.WARNING, "", T0, node=n), "m",
                                NOW) for n in ("a", "bad", "b")]  # fmt: skip
    target._send(notices)
    assert posted == [["NODE_SILENT|a"], ["NODE_SILENT|b"]]
    assert "refused NODE_SILENT|bad (dropped)" in caplog.text


def test_an_open_alert_ends_four_resend_intervals_ahead_and_outbox_entries_round_trip():
    (n,) = pager().stage([expired()])
    assert n.ends(NOW, ENDS_AT_RESENDS * SETTINGS.resend_ms) == NOW + 4000
    assert Notice.decode(n.encode()) == n
    with pytest.raises(ValueError):
        Notice.decode(b'{"incident": "x"}')


def test_paging_is_off_as_shipped_and_urls_are_checked(tmp_path):
    from pathlib import Path

    shipped = load_config(Path(__file__).resolve().parents[2] / "conf" / "streaming.properties", base_dir=tmp_path)
    assert paging.pager_for(shipped, None) is None
    cfg = load_config(
        None, {"alerts.alertmanagerUrl": "http://a:9093; https://b:9093/", "alerts.webhookUrl": "http://h/x"}
    )
    assert cfg.alertmanager_urls == ("http://a:9093", "https://b:9093/")
    p = paging.pager_for(cfg, None)
    assert p is not None and [t.url for t in p.targets] == [
        "http://a:9093/api/v2/alerts", "https://b:9093/api/v2/alerts", "http://h/x",
    ]  # fmt: skip
    for bad in ("ftp://a", "a:9093", "http://user:pw@a:9093", "http://a b"):
        with pytest.raises(ConfigError, match="alerts.alertmanagerUrl"):
            load_config(None, {"alerts.alertmanagerUrl": bad})
