"""Alerts to people: Prometheus Alertmanager's v2 API and a generic JSON webhook, as both senders speak them.

The monitor's pager (:mod:`streaming.paging`: queues, resends, an outbox in Redis) and a node that
pages when no monitor decides (:mod:`namesrv.liveness.monitor_down`) send the same notices to the
same receivers, so what a receiver gets lives here once: :func:`notice_of` turns an alert into a
:class:`Notice` (labels identical on its OPEN and its RESOLVED), :func:`payload` is the body of one
POST for each kind of receiver, and :func:`post_json` sends it, telling a retry from a refusal.
``docs/internals/alerts.md`` has what each receiver receives.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from common.alerts import Alert, AlertState, cut, encode_alert

#: an open alert's endsAt is this many resend intervals ahead (Prometheus: 4)
ENDS_AT_RESENDS = 4
#: characters of a refusing answer quoted in the log
_MAX_QUOTE = 300
#: where an Alertmanager takes alerts
API_PATH = "/api/v2/alerts"
#: longest URL accepted; anything longer is a mistake
_MAX_URL_CHARS = 2048


class DeliveryError(Exception):
    """A target did not take a batch and may take it later (retried)."""


class Refused(Exception):
    """A target refused a payload as malformed; sending it again would not help."""


@dataclass(frozen=True)
class PagingSettings:
    alertmanager_urls: tuple[str, ...] = ()
    webhook_url: str = ""
    resend_ms: int = 60_000
    timeout_ms: int = 10_000
    generator_url: str = ""
    #: who sends: the job's monitor id, or the name of the node that pages MONITOR_DOWN itself (the
    #: notices' and the webhook's ``monitor`` field)
    raised_by: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.alertmanager_urls or self.webhook_url)

    def targets(self) -> list[tuple[str, str, str]]:
        """(name, URL to POST to, kind) of every receiver: each Alertmanager, then the webhook."""
        out = [(f"alertmanager {u}", u.rstrip("/") + API_PATH, "alertmanager") for u in self.alertmanager_urls]
        if self.webhook_url:
            out.append(("webhook", self.webhook_url, "webhook"))
        return out


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Notice:
    """One alert as the targets receive it; a resolution carries the labels of the OPEN it ends."""

    incident: str
    state: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: int
    #: when a resolution ended (epoch ms); None while open (endsAt is then set at each send)
    ends_at: int | None
    #: the alerts topic's JSON of the alert, for the webhook
    alert: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return orjson.dumps(
            {"incident": self.incident, "state": self.state, "labels": self.labels, "annotations": self.annotations,
             "startsAt": self.starts_at, "endsAt": self.ends_at, "alert": self.alert}
        )  # fmt: skip

    @classmethod
    def decode(cls, data: bytes | str) -> Notice:
        raw = orjson.loads(data)
        try:
            return cls(
                str(raw["incident"]), str(raw["state"]), {str(k): str(v) for k, v in raw["labels"].items()},
                {str(k): str(v) for k, v in raw["annotations"].items()}, int(raw["startsAt"]),
                None if raw["endsAt"] is None else int(raw["endsAt"]), dict(raw.get("alert") or {}),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed outbox entry: {exc}") from None

    def ends(self, now: int, horizon_ms: int) -> int:
        """endsAt as sent at ``now``: the resolution's, or ``horizon_ms`` ahead while open; never before startsAt."""
        return max(self.starts_at, self.ends_at if self.ends_at is not None else now + horizon_ms)

    def for_alertmanager(self, now: int, horizon_ms: int, generator_url: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "labels": self.labels,
            "annotations": self.annotations,
            "startsAt": iso(self.starts_at),
            "endsAt": iso(self.ends(now, horizon_ms)),
        }
        if generator_url:
            out["generatorURL"] = generator_url
        return out

    def for_webhook(self, now: int, horizon_ms: int) -> dict[str, Any]:
        return {
            **self.alert,
            "startsAt": iso(self.starts_at),
            "endsAt": iso(self.ends(now, horizon_ms)) if self.ends_at is not None else None,
        }


def labels_of(alert: Alert) -> dict[str, str]:
    """What identifies the alert in Alertmanager (its fingerprint): the same for an incident's OPEN and RESOLVED."""
    out = {"alertname": str(alert.kind), "severity": str(alert.severity).lower()}
    for label, value in (
        ("cluster", alert.cluster_name),
        ("broker", alert.broker_name),
        ("broker_addr", alert.broker_addr),
        ("node", alert.node),
        ("topic", alert.topic),
    ):
        if value:
            out[label] = cut(value, 1024)
    return out


def notice_of(alert: Alert, raised_by: str, now: int, opened: Notice | None = None) -> Notice:
    """The notice for ``alert``; a resolution takes labels, annotations, start and the webhook's fields
    (severity included) from ``opened`` when known."""
    what = " ".join(v for v in (alert.cluster_name, alert.broker_name, alert.broker_addr, alert.node, alert.topic) if v)
    annotations = {
        "summary": cut(f"{alert.kind} {what}".strip(), 300),
        "description": alert.message,
        "incident": alert.incident,
        "monitor": raised_by,
    }
    body = orjson.loads(encode_alert(alert, raised_by=raised_by, emitted_at=now))
    if alert.state is AlertState.OPEN:
        return Notice(alert.incident, "OPEN", labels_of(alert), annotations, alert.event_time, None, body)
    ended = min(alert.event_time, now)
    if opened is None:
        return Notice(alert.incident, "RESOLVED", labels_of(alert), annotations, alert.event_time, ended, body)
    annotations = {**opened.annotations, "description": alert.message}
    # the webhook's copy, too, is the OPEN's (its severity, its fields) with the resolution's news
    news = {key: body[key] for key in ("state", "message", "eventTime", "emittedAt")}
    body = {**(opened.alert or body), **news}
    return Notice(alert.incident, "RESOLVED", opened.labels, annotations, opened.starts_at, ended, body)


def post_json(url: str, payload: Any, timeout_s: float) -> None:
    """POST ``payload`` as JSON; DeliveryError when worth retrying, Refused when the target says it is malformed."""
    request = urllib.request.Request(
        url, data=orjson.dumps(payload), method="POST",
        headers={"Content-Type": "application/json", "User-Agent": "namesrv-py-liveness-monitor"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310 - http(s) checked by config
            answer.read(4096)
    except urllib.error.HTTPError as exc:
        text = exc.read(_MAX_QUOTE).decode("utf-8", "replace")
        if exc.code >= 500 or exc.code in (408, 429):
            raise DeliveryError(f"HTTP {exc.code}: {text!r}") from None
        raise Refused(f"HTTP {exc.code}: {text!r}") from None
    except (urllib.error.URLError, OSError) as exc:  # refused, unreachable, time-out
        raise DeliveryError(str(getattr(exc, "reason", exc))) from None


def request_body(kind: str, notices: Iterable[Notice], now: int, settings: PagingSettings) -> Any:
    """The body of one POST to a receiver of ``kind`` (``alertmanager`` or ``webhook``)."""
    horizon = ENDS_AT_RESENDS * settings.resend_ms
    if kind == "alertmanager":
        return [n.for_alertmanager(now, horizon, settings.generator_url) for n in notices]
    return {"version": 1, "monitor": settings.raised_by, "alerts": [n.for_webhook(now, horizon) for n in notices]}


def http_url(raw: str) -> str:
    """An http(s) URL with a host and no credentials, or empty; ValueError otherwise (the config keys' check)."""
    from urllib.parse import urlsplit

    url = raw.strip()
    if not url:
        return ""
    parts = urlsplit(url)
    if len(url) > _MAX_URL_CHARS or parts.scheme not in ("http", "https") or not parts.hostname or parts.username:
        raise ValueError(raw)
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ValueError(raw)
    return url
