"""An alert as the node and the monitor write it: kinds, severities, the value and its JSON (version 1).

The monitor decides most alerts (:mod:`streaming.alerts`); a name-server node decides the one no
monitor can, MONITOR_DOWN (:mod:`namesrv.liveness.monitor_down`).  Both write them to the same Redis
hash for the console and send them to the same receivers, so the value, its incident id and its
JSON live here, once.  :data:`NODE_OWNED_KINDS` are the kinds only a node opens and resolves: a
job leaves them alone.  ``docs/internals/alerts.md`` has the rules in full.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

import orjson

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
    #: no monitor decided for alerts.monitorLagMillis; opened and resolved by the name-server nodes
    MONITOR_DOWN = "MONITOR_DOWN"


class Severity(enum.StrEnum):
    INFO = "INFO"
    WARNING = "WARNING"
    CRITICAL = "CRITICAL"


class AlertState(enum.StrEnum):
    OPEN = "OPEN"
    RESOLVED = "RESOLVED"


#: an alert's message is cut to this many characters, so no alert can outgrow a Kafka record
MAX_MESSAGE_CHARS = 4096
#: ordinary topics an incident names one by one, in its message and on the alerts topic
MAX_NAMED_TOPICS = 20

#: the fixed names of TopicValidator's system set, 4.x to 5.5.0 (its RocksDB transaction and checkpoint
#: topics are 5.5's), and SCHEDULE_TOPIC_XXXX_V2; the one list the node and the job tell system topics by
SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "SCHEDULE_TOPIC_XXXX_V2", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC",
    "OFFSET_MOVED_EVENT", "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC", "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC",
    "CHECKPOINT_TOPIC",
    # not in TopicValidator: the topic RocketMQ 5's proxy syncs client heartbeats through (ProxyConfig's
    # heartbeatSyncerTopicName, under its default name)
    "DefaultHeartBeatSyncerTopic",
})  # fmt: skip
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
#: consumer groups' retry and dead-letter topics
RETRY_PREFIXES = ("%RETRY%", "%DLQ%")

#: kinds about one broker (by address) and about one name-server node
_BROKER_KINDS = frozenset({AlertKind.BROKER_EXPIRED, AlertKind.BROKER_REMOVED, AlertKind.BROKER_FLAPPING})
_NODE_KINDS = frozenset({AlertKind.NODE_SILENT, AlertKind.NODE_CLOCK_AHEAD})
#: kinds a name-server node opens and resolves (a job neither loads nor re-sends them)
NODE_OWNED_KINDS = frozenset({AlertKind.MONITOR_DOWN})
#: resolved alerts kept for the console (``P:alerts:resolved``), newest first
MAX_RESOLVED = 100


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
    #: GROUP_WITHOUT_MASTER, TOPIC_NOT_WRITABLE: every topic the group leaves without a writable queue, sorted
    topics: tuple[str, ...] = ()

    @property
    def incident(self) -> str:
        """What the alert is about; the OPEN and the RESOLVED of one incident share it."""
        return incident_id(self.kind, self.cluster_name, self.broker_addr, self.broker_name, self.topic, self.node)

    @property
    def subject(self) -> str:
        """What it concerns, in a few words: the broker, the broker group, the topic or the node."""
        if self.kind in _BROKER_KINDS:
            return " ".join(v for v in (self.broker_name, self.broker_addr) if v)
        if self.kind in _NODE_KINDS:
            return self.node or ""
        return self.topic or self.broker_name or self.cluster_name or ""

    @property
    def shown_severity(self) -> Severity:
        """The severity the log and the console give it: a resolution is news, not trouble (INFO); the
        alert itself keeps the incident's severity, as Alertmanager's labels do."""
        return Severity.INFO if self.state is AlertState.RESOLVED else self.severity

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
    if kind in _BROKER_KINDS:
        parts = (cluster_name, broker_addr)
    elif kind is AlertKind.GROUP_WITHOUT_MASTER or (kind is AlertKind.TOPIC_NOT_WRITABLE and not topic):
        parts = (cluster_name, broker_name)
    elif kind is AlertKind.TOPIC_NOT_WRITABLE:
        parts = (topic,)  # one alert per topic, as versions before the grouping wrote them
    elif kind in _NODE_KINDS:
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


def encode_alert(alert: Alert, *, raised_by: str, emitted_at: int, max_topics: int = MAX_NAMED_TOPICS) -> bytes:
    """The alert's JSON, version 1; fields without a value are not written, and the Kafka key is ``id``::

        {"v": 1, "id": "BROKER_EXPIRED|DefaultCluster|10.0.0.1:10911", "kind": "BROKER_EXPIRED",
         "state": "OPEN", "severity": "CRITICAL", "clusterName": "DefaultCluster",
         "brokerName": "broker-a", "brokerAddr": "10.0.0.1:10911", "eventTime": 1732240000000,
         "message": "...", "monitor": "host:123", "emittedAt": 1732240001234}

    Other fields: ``topic``, ``node``; for GROUP_WITHOUT_MASTER and TOPIC_NOT_WRITABLE, ``topics``
    (the topics the group leaves without a writable queue: at most ``max_topics`` names, ordinary ones
    first) and ``topicCount`` (how many there are in all).
    """
    out: dict[str, Any] = {"v": ALERT_VERSION, "id": alert.incident}
    for name, attr in _FIELDS:
        value = getattr(alert, attr)
        if value is not None:
            out[name] = str(value) if isinstance(value, enum.Enum) else value
    out["message"] = cut(alert.message, MAX_MESSAGE_CHARS)
    if alert.topics:
        rank = {"topic": 0, "retry": 1, "system": 2}
        named = sorted(alert.topics, key=lambda t: (rank[topic_class(t, alert.cluster_name, alert.broker_name)], t))
        out["topics"] = named[:max_topics]
        out["topicCount"] = len(alert.topics)
    out["monitor"] = raised_by  # the job's monitor id, or the node that raised MONITOR_DOWN
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
            topics=tuple(sorted(str(t) for t in raw.get("topics") or ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed alert {raw!r:.80}: {exc}") from None


def cut(text: str, limit: int) -> str:
    """``text`` shortened to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    note = f"... ({len(text) - limit} more characters)"
    return text[: max(0, limit - len(note))] + note


def topic_class(
    topic: str, cluster_name: str | None = None, broker_name: str | None = None, names: frozenset[str] = frozenset()
) -> str:
    """``retry`` (``%RETRY%``/``%DLQ%``), ``system`` (what brokers create for themselves) or ``topic``.

    ``names`` are the cluster and broker names known (brokers create topics named after them);
    the incident's own cluster and group count whether or not the tables still hold them.
    """
    if topic.startswith(RETRY_PREFIXES):
        return "retry"
    if (
        topic in SYSTEM_TOPICS
        or topic.startswith(SYSTEM_TOPIC_PREFIX)
        or topic in (cluster_name, broker_name, f"{cluster_name}_REPLY_TOPIC")
        or topic in names
    ):
        return "system"
    return "topic"
