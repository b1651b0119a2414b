"""What the page shows, as one JSON document built from a checked :class:`streaming.health.HealthView`.

Pure functions, no I/O: :func:`build` groups brokers by cluster and broker group (master first,
then slaves by id), joins the nodes with their NODE_CLOCK_AHEAD incidents, and flattens alerts.
The page renders the document with ``textContent`` only; times stay epoch milliseconds (event
time for brokers and nodes, the monitor's wall clock for batches) and the page counts them down
against ``now``, the console's clock when the document was built.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from common.protocol.codes import MASTER_ID
from streaming.alerts import Alert, AlertKind
from streaming.health import BrokerHealth, BrokerStatus, HealthView, MonitorHealth, NodeHealth


def shown_redis_url(url: str) -> str:
    """The Redis URL without its password, for the page and the log."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _broker(b: BrokerHealth) -> dict[str, Any]:
    role = "?" if b.broker_id is None else "master" if b.broker_id == MASTER_ID else "slave"
    return {
        "cluster": b.cluster_name,
        "group": b.broker_name,
        "id": b.broker_id,
        "role": role,
        "addr": b.broker_addr,
        "state": str(b.shown_state),
        "flapping": b.flapping,
        "lastHeartbeat": b.last_heartbeat,
        "timeoutMillis": b.timeout_ms,
        "deadline": b.deadline,
        "since": b.since,
    }


def clusters(brokers: list[BrokerHealth]) -> list[dict[str, Any]]:
    """Clusters by name, each with its broker groups by name, each with its members (master, then slaves by id)."""
    by_cluster: dict[str, dict[str, list[BrokerHealth]]] = defaultdict(lambda: defaultdict(list))
    for b in brokers:
        by_cluster[b.cluster_name][b.broker_name or "?"].append(b)
    out = []
    for cluster in sorted(by_cluster):
        groups = []
        for name in sorted(by_cluster[cluster]):
            members = sorted(
                by_cluster[cluster][name],
                key=lambda b: (b.broker_id is None, b.broker_id if b.broker_id is not None else 0, b.broker_addr),
            )
            live_master = any(
                m.broker_id == MASTER_ID and m.state in (BrokerStatus.ALIVE, BrokerStatus.FLAPPING) for m in members
            )
            groups.append({"name": name, "hasMaster": live_master, "members": [_broker(m) for m in members]})
        out.append({"name": cluster, "groups": groups})
    return out


def _node(n: NodeHealth, clock_ahead: set[str]) -> dict[str, Any]:
    return {
        "node": n.node,
        "lastTick": n.last_tick,
        "localScan": n.local_scan,
        "clockOffsetMillis": n.clock_offset_ms,
        "silent": n.silent,
        "clockAhead": n.node in clock_ahead,
    }


def _alert(a: Alert) -> dict[str, Any]:
    return {
        "incident": a.incident,
        "kind": str(a.kind),
        "state": str(a.state),
        "severity": str(a.shown_severity),
        "subject": a.subject,
        "cluster": a.cluster_name,
        "eventTime": a.event_time,
        "message": a.message,
    }


def _monitor(m: MonitorHealth | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "monitor": m.monitor,
        "batchId": m.batch_id,
        "batchAt": m.batch_at,
        "watermark": m.watermark,
        "eventTime": m.event_time,
        "lagMillis": m.lag_ms,
        "batchMillis": m.batch_ms,
        "batches": m.batches,
        "events": m.events,
        "badEvents": m.bad_events,
    }


def build(view: HealthView) -> dict[str, Any]:
    """The page's document (without ``now``, which the caller adds when it sends it)."""
    clock_ahead = {a.node for a in view.open_alerts if a.kind is AlertKind.NODE_CLOCK_AHEAD and a.node}
    states = {s: 0 for s in BrokerStatus}
    for b in view.brokers:
        states[b.shown_state] += 1
    return {
        "clusters": clusters(view.brokers),
        "brokerStates": {str(s): n for s, n in states.items()},
        "nodes": [_node(n, clock_ahead) for n in sorted(view.nodes, key=lambda n: n.node)],
        "monitor": _monitor(view.monitor),
        "meta": view.meta,
        "alerts": {
            "open": [_alert(a) for a in view.open_alerts],
            "resolved": [_alert(a) for a in view.resolved_alerts],
        },
        "problems": view.problems,
        "skipped": view.skipped,
        "notRead": view.not_read,
    }
