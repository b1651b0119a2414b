"""Live cluster health alerts: what they say, how one incident stays one alert, and how they read.

An *incident* (:attr:`Alert.incident`: a kind and what it concerns) is announced once OPEN and once
RESOLVED, nothing in between.  The stateful step (:mod:`streaming.liveness`) opens the per-broker
and per-node kinds; the driver opens the others from the route model after each micro-batch
(:func:`route_incidents`) and from the query's progress (:func:`lag_incident`,
:func:`clock_incidents`), and :class:`AlertBook` turns "what is wrong now" into transitions.  One
failure is one incident: a topic without a writable queue is blamed on its broker group, which names
the topics it affects, and system topics that are unwritable by design open nothing.  Every alert
goes to the alerts topic as JSON (:func:`common.alerts.encode_alert` documents it) and to the ``streaming.alerts``
logger; open ones are kept in Redis.  ``docs/internals/alerts.md`` has the rules in full.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from common.alerts import (
    MAX_MESSAGE_CHARS,
    MAX_NAMED_TOPICS,
    Alert,
    AlertKind,
    AlertState,
    Severity,
    cut,
    decode_alert,
    encode_alert,
    incident_id,
    topic_class,
)

if TYPE_CHECKING:
    # only a type here: Spark's Python workers import this module, and need not import the route tables
    from common.routes import RouteHealth

log = logging.getLogger(__name__)

# the value and its JSON are the nodes' too (common.alerts); the monitor's modules take them from here
__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_NAMED_TOPICS",
    "MAX_STORED_TOPICS",
    "Alert",
    "AlertBook",
    "AlertKind",
    "AlertState",
    "Severity",
    "clock_incidents",
    "cut",
    "decode_alert",
    "encode_alert",
    "incident_id",
    "lag_incident",
    "log_alert",
    "log_line",
    "lost_topics",
    "route_incidents",
    "topic_class",
    "topics_summary",
]

#: topics of one incident kept in Redis (so a restarted job knows what it waits for); a group
#: serving more than this is rare, and what is past it is only forgotten across a restart
MAX_STORED_TOPICS = 10_000

_LOG_LEVEL = {Severity.INFO: logging.INFO, Severity.WARNING: logging.WARNING, Severity.CRITICAL: logging.ERROR}


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
    severity = alert.shown_severity
    return f"ALERT {alert.state} {severity} {alert.kind} {where}: {cut(alert.message, MAX_MESSAGE_CHARS)}"


def log_alert(alert: Alert) -> None:
    log.log(_LOG_LEVEL[alert.shown_severity], "%s", log_line(alert))


# --------------------------------------------------------------------------- driver-side incidents


def topics_summary(
    topics: Iterable[str], cluster_name: str | None, broker_name: str | None, names: frozenset[str] = frozenset()
) -> tuple[str, bool]:
    """A bounded sentence naming ordinary topics and counting the others; True when any is not a system topic."""
    by_class: dict[str, list[str]] = {"topic": [], "retry": [], "system": []}
    for t in sorted(topics):
        by_class[topic_class(t, cluster_name, broker_name, names)].append(t)
    plain, retry, system = by_class["topic"], by_class["retry"], by_class["system"]
    parts = []
    if plain:
        more = f" and {len(plain) - MAX_NAMED_TOPICS} more" if len(plain) > MAX_NAMED_TOPICS else ""
        parts.append(f"{len(plain)} topic(s): {', '.join(cut(t, 200) for t in plain[:MAX_NAMED_TOPICS])}{more}")
    if retry:
        parts.append(f"{len(retry)} %RETRY%/%DLQ% topic(s)")
    if system:
        parts.append(f"{len(system)} system topic(s)")
    return ("; ".join(parts) or "no topic"), bool(plain or retry)


def lost_topics(
    open_alerts: Iterable[Alert], lost_now: Mapping[tuple[str, str], Iterable[str]], deleted: Iterable[str] = ()
) -> dict[tuple[str, str], set[str]]:
    """Topics lost with each group: this batch's, plus those still named by open TOPIC_NOT_WRITABLE incidents.

    An incident from before the grouping (one per topic) carries over under the unknown group ("", "").
    """
    out: dict[tuple[str, str], set[str]] = {k: set(v) for k, v in lost_now.items()}
    for a in open_alerts:
        if a.kind is AlertKind.TOPIC_NOT_WRITABLE:
            topics = a.topics or ((a.topic,) if a.topic else ())
            out.setdefault((a.cluster_name or "", a.broker_name or ""), set()).update(topics)
    gone = set(deleted)
    return {k: v - gone for k, v in out.items() if v - gone}


def route_incidents(
    health: RouteHealth, at: int, lost: Mapping[tuple[str, str], Iterable[str]] | None = None
) -> dict[str, Alert]:
    """Open incidents the route tables show now, one per broker group at fault (``docs/internals/alerts.md``).

    ``health`` must have been asked about every topic in ``lost`` (its ``routeless_topics``): the
    topics lost with each (cluster, broker name), which stay lost while they have no route at all.
    """
    clusters = health.group_clusters
    names = frozenset(clusters) | frozenset(clusters.values())
    blamed: dict[tuple[str, str], set[str]] = {}
    for topic, qmap in health.unwritable_topics.items():
        for group in qmap:
            blamed.setdefault((clusters.get(group, ""), group), set()).add(topic)
    routeless = set(health.routeless_topics)
    for key, topics in (lost or {}).items():
        still = routeless.intersection(topics)
        if still:
            blamed.setdefault(key, set()).update(still)

    out: dict[str, Alert] = {}
    for name, bd in health.masterless_groups.items():
        topics = blamed.pop((bd.cluster, name), set())
        members = ", ".join(f"{i}={a}" for i, a in sorted(bd.broker_addrs.items()))
        summary, _ = topics_summary(topics, bd.cluster, name, names)
        alert = Alert(
            AlertKind.GROUP_WITHOUT_MASTER, AlertState.OPEN, Severity.CRITICAL,
            f"broker group {name} has no master (brokerId 0); members: {members}"
            + (f"; no writable queue left for {summary}" if topics else ""),
            at, cluster_name=bd.cluster, broker_name=name, topics=tuple(sorted(topics)),
        )  # fmt: skip
        out[alert.incident] = alert
    for (cluster, name), topics in sorted(blamed.items()):
        summary, pages = topics_summary(topics, cluster, name, names)
        if not pages:  # only system topics: some are never writable by design
            continue
        if name not in clusters:
            cause = (
                "is gone (its brokers expired or lost their connections)"
                if name
                else "is unknown (lost before" " alerts were grouped by broker group)"
            )
        else:
            cause = "has no queue producers may write to (write permission wiped, or no write queues)"
        alert = Alert(
            AlertKind.TOPIC_NOT_WRITABLE, AlertState.OPEN, Severity.CRITICAL,
            f"broker group {name or '?'} of cluster {cluster or '?'} {cause}: no writable queue left for {summary}",
            at, cluster_name=cluster or None, broker_name=name or None, topics=tuple(sorted(topics)),
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
        #: open incidents whose topics changed since announced (said again only to Redis and the pager)
        self.refreshed: dict[str, Alert] = {}

    def reconcile(self, kinds: Iterable[AlertKind], current: Mapping[str, Alert], at: int) -> list[Alert]:
        """Make the open incidents of ``kinds`` equal ``current``; returns the transitions.

        An open incident whose topics changed keeps its start and takes the new topics and
        message; it is no transition, but lands in :attr:`refreshed` until :meth:`take_refreshed`.
        """
        kinds = frozenset(kinds)
        out: list[Alert] = []
        for incident, alert in current.items():
            held = self.open.get(incident)
            if held is None:
                self.open[incident] = alert
                out.append(alert)
            elif held.topics != alert.topics:
                self.open[incident] = self.refreshed[incident] = replace(alert, event_time=held.event_time)
        for incident, alert in list(self.open.items()):
            if alert.kind in kinds and incident not in current:
                del self.open[incident]
                self.refreshed.pop(incident, None)
                out.append(alert.resolved(f"resolved: {alert.message}", at))
        return out

    def take_refreshed(self) -> list[Alert]:
        out, self.refreshed = list(self.refreshed.values()), {}
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
