"""Live cluster health alerts: what they say, how one incident stays one alert, and how they read.

Theory of operation
-------------------
An *incident* is identified by its kind and what it concerns (:attr:`Alert.incident`): the
broker expired, this topic has no writable queue, this node stopped ticking. An incident is
announced once with state OPEN and once more with state RESOLVED when it ends; nothing is
said while it lasts. Two places open and resolve incidents:

* the stateful step (:mod:`streaming.liveness`), per broker and per node, keeping the open
  flags in Spark state: BROKER_EXPIRED, BROKER_REMOVED, BROKER_FLAPPING, NODE_SILENT;
* the driver, from the whole route model after each micro-batch (:func:`route_incidents`) and
  from the query progress (:func:`lag_incident`, :func:`clock_incidents`): GROUP_WITHOUT_MASTER,
  TOPIC_NOT_WRITABLE, MONITOR_LAGGING, NODE_CLOCK_AHEAD. :class:`AlertBook` remembers which are open (restored from Redis after a
  restart) and turns "what is wrong now" into OPEN/RESOLVED transitions.

Every alert goes to the alerts topic as JSON (version 1, below; Kafka key = incident id) and to
the ``streaming.alerts`` logger as one line. The open ones are also kept in Redis
(``docs/redis-keys.md``).

Alert JSON, version 1 (absent fields are not written)::

    {"v": 1, "id": "BROKER_EXPIRED|DefaultCluster|10.0.0.1:10911", "kind": "BROKER_EXPIRED",
     "state": "OPEN", "severity": "CRITICAL", "clusterName": "DefaultCluster",
     "brokerName": "broker-a", "brokerAddr": "10.0.0.1:10911", "topic": null, "node": null,
     "eventTime": 1732240000000, "message": "...", "monitor": "host:123", "emittedAt": 1732240001234}
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from namesrv.routes import RouteHealth

log = logging.getLogger(__name__)

ALERT_VERSION = 1


class AlertKind(enum.StrEnum):
    BROKER_EXPIRED = "BROKER_EXPIRED"
    BROKER_REMOVED = "BROKER_REMOVED"
    BROKER_FLAPPING = "BROKER_FLAPPING"
    GROUP_WITHOUT_MASTER = "GROUP_WITHOUT_MASTER"
    TOPIC_NOT_WRITABLE = "TOPIC_NOT_WRITABLE"
    NODE_SILENT = "NODE_SILENT"
    MONITOR_LAGGING = "MONITOR_LAGGING"
    #: a node stamps events further ahead of the monitor's clock than monitor.maxClockSkewMillis
    NODE_CLOCK_AHEAD = "NODE_CLOCK_AHEAD"


class Severity(enum.StrEnum):
    INFO = "INFO"
    WARNING = "WARNING"
    CRITICAL = "CRITICAL"


class AlertState(enum.StrEnum):
    OPEN = "OPEN"
    RESOLVED = "RESOLVED"


#: an alert's message is cut to this many characters, so no alert can outgrow a Kafka record
MAX_MESSAGE_CHARS = 4096

_LOG_LEVEL = {Severity.INFO: logging.INFO, Severity.WARNING: logging.WARNING, Severity.CRITICAL: logging.ERROR}


@dataclass(frozen=True, slots=True)
class Alert:
    kind: AlertKind
    state: AlertState
    severity: Severity
    message: str
    #: event time the incident opened or ended at (epoch ms); wall clock for MONITOR_LAGGING
    event_time: int
    cluster_name: str | None = None
    broker_name: str | None = None
    broker_addr: str | None = None
    topic: str | None = None
    node: str | None = None

    @property
    def incident(self) -> str:
        """What the alert is about; the OPEN and the RESOLVED of one incident share it."""
        return incident_id(self.kind, self.cluster_name, self.broker_addr, self.broker_name, self.topic, self.node)

    def resolved(self, message: str, event_time: int) -> Alert:
        return replace(self, state=AlertState.RESOLVED, message=message, event_time=event_time)


def incident_id(
    kind: AlertKind | str,
    cluster_name: str | None = None,
    broker_addr: str | None = None,
    broker_name: str | None = None,
    topic: str | None = None,
    node: str | None = None,
) -> str:
    kind = AlertKind(kind)
    parts: tuple[str | None, ...]
    if kind in (AlertKind.BROKER_EXPIRED, AlertKind.BROKER_REMOVED, AlertKind.BROKER_FLAPPING):
        parts = (cluster_name, broker_addr)
    elif kind is AlertKind.GROUP_WITHOUT_MASTER:
        parts = (cluster_name, broker_name)
    elif kind is AlertKind.TOPIC_NOT_WRITABLE:
        parts = (topic,)
    elif kind in (AlertKind.NODE_SILENT, AlertKind.NODE_CLOCK_AHEAD):
        parts = (node,)
    else:
        parts = ()
    return "|".join([kind.value, *(p or "" for p in parts)])


_FIELDS = (
    ("kind", "kind"),
    ("state", "state"),
    ("severity", "severity"),
    ("clusterName", "cluster_name"),
    ("brokerName", "broker_name"),
    ("brokerAddr", "broker_addr"),
    ("topic", "topic"),
    ("node", "node"),
    ("eventTime", "event_time"),
    ("message", "message"),
)


def encode_alert(alert: Alert, *, monitor: str, emitted_at: int) -> bytes:
    out: dict[str, Any] = {"v": ALERT_VERSION, "id": alert.incident}
    for name, attr in _FIELDS:
        value = getattr(alert, attr)
        if value is not None:
            out[name] = str(value) if isinstance(value, enum.Enum) else value
    out["message"] = cut(alert.message, MAX_MESSAGE_CHARS)
    out["monitor"] = monitor
    out["emittedAt"] = emitted_at
    return orjson.dumps(out)


def decode_alert(data: bytes | str) -> Alert:
    """An alert from its JSON; ValueError when it is not a version-1 alert."""
    raw = orjson.loads(data)
    if not isinstance(raw, dict) or raw.get("v") != ALERT_VERSION:
        raise ValueError(f"not a version-{ALERT_VERSION} alert: {raw!r:.80}")
    try:
        return Alert(
            kind=AlertKind(raw["kind"]),
            state=AlertState(raw["state"]),
            severity=Severity(raw["severity"]),
            message=str(raw["message"]),
            event_time=int(raw["eventTime"]),
            cluster_name=raw.get("clusterName"),
            broker_name=raw.get("brokerName"),
            broker_addr=raw.get("brokerAddr"),
            topic=raw.get("topic"),
            node=raw.get("node"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed alert {raw!r:.80}: {exc}") from None


def cut(text: str, limit: int) -> str:
    """``text`` shortened to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    note = f"... ({len(text) - limit} more characters)"
    return text[: max(0, limit - len(note))] + note


def log_line(alert: Alert) -> str:
    where = " ".join(
        f"{label}={value}"
        for label, value in (
            ("cluster", alert.cluster_name),
            ("broker", alert.broker_name),
            ("addr", alert.broker_addr),
            ("topic", alert.topic),
            ("node", alert.node),
        )
        if value
    )
    return f"ALERT {alert.state} {alert.severity} {alert.kind} {where}: {cut(alert.message, MAX_MESSAGE_CHARS)}"


def log_alert(alert: Alert) -> None:
    log.log(_LOG_LEVEL[alert.severity], "%s", log_line(alert))


# --------------------------------------------------------------------------- driver-side incidents


def route_incidents(health: RouteHealth, at: int) -> dict[str, Alert]:
    """Open incidents the route tables show now: groups without a master, topics without a writable queue.

    ``health.routeless_topics`` are topics that disappeared because their last broker expired or
    dropped its connection; they stay incidents until they come back or an admin deletes them.
    """
    out: dict[str, Alert] = {}
    for name, bd in health.masterless_groups.items():
        slaves = ", ".join(f"{i}={a}" for i, a in sorted(bd.broker_addrs.items()))
        alert = Alert(
            AlertKind.GROUP_WITHOUT_MASTER, AlertState.OPEN, Severity.CRITICAL,
            f"broker group {name} has no master (brokerId 0); members: {slaves}", at,
            cluster_name=bd.cluster, broker_name=name,
        )  # fmt: skip
        out[alert.incident] = alert
    for topic, qmap in health.unwritable_topics.items():
        groups = ", ".join(f"{n}(perm={qd.perm}, write={qd.write_queue_nums})" for n, qd in qmap.items())
        alert = Alert(
            AlertKind.TOPIC_NOT_WRITABLE, AlertState.OPEN, Severity.CRITICAL,
            f"topic {topic} has no writable queue: {groups}", at, topic=topic,
        )  # fmt: skip
        out[alert.incident] = alert
    for topic in health.routeless_topics:
        alert = Alert(
            AlertKind.TOPIC_NOT_WRITABLE, AlertState.OPEN, Severity.CRITICAL,
            f"topic {topic} lost its last broker: no route at all", at, topic=topic,
        )  # fmt: skip
        out[alert.incident] = alert
    return out


def lag_incident(watermark_ms: int | None, delay_ms: int, now_ms: int, threshold_ms: int) -> dict[str, Alert]:
    """MONITOR_LAGGING when event time (watermark + delay) is more than ``threshold_ms`` behind the clock."""
    if not watermark_ms:  # no batch has set a watermark yet
        return {}
    lag = now_ms - (watermark_ms + delay_ms)
    if lag <= threshold_ms:
        return {}
    alert = Alert(
        AlertKind.MONITOR_LAGGING, AlertState.OPEN, Severity.WARNING,
        f"event time is {lag / 1000:.1f} s behind the wall clock (threshold {threshold_ms / 1000:.0f} s)", now_ms,
    )  # fmt: skip
    return {alert.incident: alert}


def clock_incidents(
    ahead: Mapping[str, tuple[int, int, int]], now_ms: int, quiet_ms: int, max_skew_ms: int
) -> dict[str, Alert]:
    """NODE_CLOCK_AHEAD for every node that sent events ahead of the clock within the last ``quiet_ms``.

    ``ahead`` maps a node to (wall time last seen ahead, events refused, furthest claim in epoch ms).
    """
    out: dict[str, Alert] = {}
    for node, (seen_at, refused, furthest) in ahead.items():
        if now_ms - seen_at > quiet_ms:
            continue
        alert = Alert(
            AlertKind.NODE_CLOCK_AHEAD, AlertState.OPEN, Severity.WARNING,
            f"name-server node {node} stamps events up to {(furthest - seen_at) / 1000:.1f} s ahead of the "
            f"monitor's clock (allowed: monitor.maxClockSkewMillis={max_skew_ms}); {refused} event(s) refused so "
            "far; check its clock (NTP)", now_ms, node=node,
        )  # fmt: skip
        out[alert.incident] = alert
    return out


class AlertBook:
    """The open incidents; turns observations into OPEN / RESOLVED alerts, each once."""

    def __init__(self, open_alerts: Mapping[str, Alert] | None = None) -> None:
        self.open: dict[str, Alert] = dict(open_alerts or {})

    def reconcile(self, kinds: Iterable[AlertKind], current: Mapping[str, Alert], at: int) -> list[Alert]:
        """Make the open incidents of ``kinds`` equal ``current``; returns the transitions."""
        kinds = frozenset(kinds)
        out: list[Alert] = []
        for incident, alert in current.items():
            if incident not in self.open:
                self.open[incident] = alert
                out.append(alert)
        for incident, alert in list(self.open.items()):
            if alert.kind in kinds and incident not in current:
                del self.open[incident]
                out.append(alert.resolved(f"resolved: {alert.message}", at))
        return out

    def record(self, alert: Alert) -> bool:
        """Note an alert decided elsewhere; False when it repeats what is already known."""
        incident = alert.incident
        if alert.state is AlertState.RESOLVED:
            # passed on even when unknown here: the stateful step deduplicates its own incidents
            self.open.pop(incident, None)
            return True
        if incident in self.open:
            return False
        self.open[incident] = alert
        return True
