"""Cluster health for the console: what the monitor keeps in Redis besides routes, and how it reads back.

Writer (the job's driver): the stateful step (:mod:`streaming.liveness`) emits a :data:`KIND_HEALTH`
row per broker and node that had events in a batch; :class:`HealthBook` keeps the last value of
each, folds in the batch's actions and alerts, and hands only what changed
(:meth:`HealthBook.take`) to :meth:`streaming.routes.RedisRouteStore.commit`, which writes it in the
batch's MULTI/EXEC.  Brokers, nodes and resolved alerts are bounded (:data:`MAX_BROKERS`,
:data:`MAX_NODES`, :data:`MAX_RESOLVED`).  Reader (``namesrv-monitor console``): Redis is shared, so
:class:`HealthReader` treats every value as hostile, capping sizes before parsing and checking each
field with the event schema's bounds; a bad entry is skipped and counted, never fatal.  This module
imports neither Spark nor pandas: the console imports it.  ``docs/internals/console.md`` has the
states and bounds; ``docs/redis-keys.md`` the keys.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

import orjson

from common import redis_clients
from common.alerts import MAX_RESOLVED  # the nodes keep MONITOR_DOWN's resolutions there too
from common.contract import (
    EPOCH_MILLIS,
    HEARTBEAT_TIMEOUT,
    LONG,
    NAME,
    Bound,
    IntRange,
    IsBool,
    SchemaError,
)
from common.redis_keys import RedisKeys, broker_field
from streaming.alerts import MAX_MESSAGE_CHARS, Alert, AlertKind, AlertState, cut, decode_alert

log = logging.getLogger(__name__)

#: the stateful step's output kind of health rows (streaming.liveness imports it from here)
KIND_HEALTH = "HEALTH"
#: streaming.liveness.KIND_ACTION; not imported, as that module pulls in Spark (a test ties the two)
KIND_ACTION = "ACTION"
#: a health row's ``state`` for a node: its local expiry scan on or off (absent: the node does not say)
SCAN_ON, SCAN_OFF = "SCAN_ON", "SCAN_OFF"

MAX_BROKERS = 10_000
MAX_NODES = 1_000
#: open alerts the console reads (an incident storm can open thousands)
MAX_OPEN_ALERTS = 500
#: a health entry longer than this is not parsed (a real one is a few hundred bytes)
MAX_ENTRY_BYTES = 16 * 1024
#: an alert longer than this is not parsed (its message is cut to 4096 characters)
MAX_ALERT_BYTES = 64 * 1024
HEALTH_VERSION = 1


class BrokerStatus(enum.StrEnum):
    ALIVE = "alive"
    EXPIRED = "expired"
    REMOVED = "removed"
    FLAPPING = "flapping"


#: the state a health row carries (stateful step) -> the state shown
_ROW_STATES = {"ALIVE": BrokerStatus.ALIVE, "EXPIRED": BrokerStatus.EXPIRED, "REMOVED": BrokerStatus.REMOVED}


def scan_state(local_scan: bool | None) -> str | None:
    """The health row ``state`` of a node whose newest TICK says ``localScan``."""
    return None if local_scan is None else SCAN_ON if local_scan else SCAN_OFF


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class BrokerHealth:
    cluster_name: str
    broker_addr: str
    broker_name: str | None
    broker_id: int | None
    #: newest REGISTER/HEARTBEAT event time at any node
    last_heartbeat: int
    #: its own heartbeatTimeoutMillis; None when only a removal was seen
    timeout_ms: int | None
    #: ALIVE, EXPIRED or REMOVED (FLAPPING is :attr:`flapping` on an alive broker)
    state: BrokerStatus
    flapping: bool
    #: event time of the last change of ``state``
    since: int

    @property
    def key(self) -> str:
        return broker_field(self.cluster_name, self.broker_addr)

    @property
    def deadline(self) -> int | None:
        """Event time after which the broker is expired: ``lastHeartbeat + timeoutMillis``."""
        return None if self.timeout_ms is None else self.last_heartbeat + self.timeout_ms

    @property
    def shown_state(self) -> BrokerStatus:
        return BrokerStatus.FLAPPING if self.state is BrokerStatus.ALIVE and self.flapping else self.state


@dataclass(frozen=True, slots=True)
class NodeHealth:
    node: str
    #: newest TICK event time (the node's clock)
    last_tick: int
    #: its local expiry scan is on; None when its ticks do not say (an older node)
    local_scan: bool | None
    #: newest tick minus the monitor's clock when the batch was handled: the node's clock offset
    #: less the delivery delay (up to about one micro-batch), so slightly negative is normal
    clock_offset_ms: int
    #: its NODE_SILENT incident is open: no TICK for ``alerts.nodeSilentMillis``
    silent: bool


@dataclass(frozen=True, slots=True)
class MonitorHealth:
    monitor: str
    batch_id: int
    #: the monitor's wall clock when it handled the batch
    batch_at: int
    watermark: int | None
    #: watermark + watermark delay: the largest event time seen, "now" for every decision
    event_time: int | None
    #: ``batch_at - event_time``: how far decisions are behind the wall clock
    lag_ms: int | None
    batch_ms: int | None
    batches: int
    events: int
    bad_events: int


# --------------------------------------------------------------------------- encoding and checked decoding

#: (JSON name, attribute, bound, required) of each entry type; the decoders apply every bound
_Row = tuple[str, str, Bound, bool]
_COUNT = IntRange(0, 2**63 - 1)
_MILLIS = IntRange(-(2**53), 2**53)
_BROKER: tuple[_Row, ...] = (
    ("clusterName", "cluster_name", NAME, True),
    ("brokerAddr", "broker_addr", NAME, True),
    ("brokerName", "broker_name", NAME, False),
    ("brokerId", "broker_id", LONG, False),
    ("lastHeartbeat", "last_heartbeat", EPOCH_MILLIS, True),
    ("timeoutMillis", "timeout_ms", HEARTBEAT_TIMEOUT, False),
    ("flapping", "flapping", IsBool(), True),
    ("since", "since", EPOCH_MILLIS, True),
)
_NODE: tuple[_Row, ...] = (
    ("node", "node", NAME, True),
    ("lastTick", "last_tick", EPOCH_MILLIS, True),
    ("localScan", "local_scan", IsBool(), False),
    ("clockOffsetMillis", "clock_offset_ms", _MILLIS, True),
    ("silent", "silent", IsBool(), True),
)
_MONITOR: tuple[_Row, ...] = (
    ("monitor", "monitor", NAME, True),
    ("batchId", "batch_id", _COUNT, True),
    ("batchAt", "batch_at", EPOCH_MILLIS, True),
    ("watermark", "watermark", EPOCH_MILLIS, False),
    ("eventTime", "event_time", EPOCH_MILLIS, False),
    ("lagMillis", "lag_ms", _MILLIS, False),
    ("batchMillis", "batch_ms", _COUNT, False),
    ("batches", "batches", _COUNT, True),
    ("events", "events", _COUNT, True),
    ("badEvents", "bad_events", _COUNT, True),
)


def _encode(value: Any, rows: tuple[_Row, ...], **extra: Any) -> bytes:
    out: dict[str, Any] = {"v": HEALTH_VERSION}
    for name, attr, _, _ in rows:
        v = getattr(value, attr)
        if v is not None:
            out[name] = v
    out.update({k: v for k, v in extra.items() if v is not None})
    return orjson.dumps(out)


def _decode(data: bytes | str, rows: tuple[_Row, ...], what: str, limit: int = MAX_ENTRY_BYTES) -> dict[str, Any]:
    """Checked attribute values of one entry; SchemaError naming the field when anything is off."""
    if len(data) > limit:
        raise SchemaError(f"{what}: {len(data)} bytes, more than the {limit} allowed")
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(f"{what}: not JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("v") != HEALTH_VERSION:
        raise SchemaError(f"{what}: not a version-{HEALTH_VERSION} object")
    values: dict[str, Any] = {}
    for name, attr, bound, required in rows:
        v = raw.get(name)
        if v is None:
            if required:
                raise SchemaError(f"{what}.{name}: missing")
        else:
            bound.check(v, f"{what}.{name}")
        values[attr] = v
    values["_raw"] = raw
    return values


def encode_broker(b: BrokerHealth) -> bytes:
    return _encode(b, _BROKER, state=str(b.shown_state), deadline=b.deadline)


def decode_broker(data: bytes | str) -> BrokerHealth:
    values = _decode(data, _BROKER, "broker")
    state = values.pop("_raw").get("state")
    try:
        shown = BrokerStatus(state)
    except ValueError:
        raise SchemaError(f"broker.state: unknown value {str(state)[:40]!r}") from None
    if shown is BrokerStatus.FLAPPING:  # written for readers; kept as an alive broker with the flag
        shown, values["flapping"] = BrokerStatus.ALIVE, True
    return BrokerHealth(state=shown, **values)


def encode_node(n: NodeHealth) -> bytes:
    return _encode(n, _NODE)


def decode_node(data: bytes | str) -> NodeHealth:
    values = _decode(data, _NODE, "node")
    values.pop("_raw")
    return NodeHealth(**values)


def encode_monitor(m: MonitorHealth) -> bytes:
    return _encode(m, _MONITOR)


def decode_monitor(data: bytes | str) -> MonitorHealth:
    values = _decode(data, _MONITOR, "monitor")
    values.pop("_raw")
    return MonitorHealth(**values)


def checked_alert(data: bytes | str) -> Alert:
    """An alert read from Redis with every field bounded (``decode_alert`` checks kinds, not sizes)."""
    if len(data) > MAX_ALERT_BYTES:
        raise SchemaError(f"alert: {len(data)} bytes, more than the {MAX_ALERT_BYTES} allowed")
    try:
        alert = decode_alert(data)
    except ValueError as exc:
        raise SchemaError(f"alert: {str(exc)[:200]}") from None
    for name in ("cluster_name", "broker_name", "broker_addr", "topic", "node"):
        value = getattr(alert, name)
        if value is not None:
            NAME.check(value, f"alert.{name}")
    EPOCH_MILLIS.check(alert.event_time, "alert.eventTime")
    return replace(alert, message=cut(alert.message, MAX_MESSAGE_CHARS))


# --------------------------------------------------------------------------- the writer's book


@dataclass
class HealthWrites:
    """What one batch writes: field -> entry (None: delete the field), and the monitor's entry."""

    brokers: dict[str, bytes | None] = field(default_factory=dict)
    nodes: dict[str, bytes | None] = field(default_factory=dict)
    monitor: bytes | None = None
    #: replace both hashes (a full rewrite of everything under the prefix)
    full: bool = False

    def apply(self, pipe: Any, keys: RedisKeys) -> None:
        """Queue the writes on a MULTI/EXEC pipeline."""
        for key, entries in ((keys.health_brokers, self.brokers), (keys.health_nodes, self.nodes)):
            if self.full:
                pipe.delete(key)
            gone = [f for f, v in entries.items() if v is None]
            kept = {f: v for f, v in entries.items() if v is not None}
            if gone:
                pipe.hdel(key, *gone)
            if kept:
                pipe.hset(key, mapping=kept)
        if self.monitor is not None:
            pipe.set(keys.health_monitor, self.monitor)


class HealthBook:
    """The last health of every broker and node, and what changed since the last :meth:`take`."""

    def __init__(
        self, *, forget_after_ms: int = 86_400_000, max_brokers: int = MAX_BROKERS, max_nodes: int = MAX_NODES
    ) -> None:
        self.forget_after_ms = forget_after_ms
        self.max_brokers = max_brokers
        self.max_nodes = max_nodes
        self.brokers: dict[str, BrokerHealth] = {}
        self.nodes: dict[str, NodeHealth] = {}
        self.monitor: MonitorHealth | None = None
        self._changed_brokers: set[str] = set()
        self._changed_nodes: set[str] = set()

    def restore(self, brokers: Iterable[BrokerHealth], nodes: Iterable[NodeHealth]) -> None:
        """What the store holds for the query this job resumes (written before: nothing to write)."""
        self.brokers = {b.key: b for b in brokers}
        self.nodes = {n.node: n for n in nodes}
        self._changed_brokers.clear()
        self._changed_nodes.clear()

    # -- observing a batch

    def observe(
        self,
        rows: Iterable[Mapping[str, Any]],
        alerts: Iterable[Alert],
        at: int,
        *,
        batch_id: int,
        monitor: str,
        status: Any,
        delay_ms: int,
    ) -> None:
        """One batch's output rows (in order), its alerts, and the monitor's progress (``MonitorStatus``)."""
        now = 0
        for row in rows:
            now = max(now, int(row["orderTime"] or 0))
            if row["kind"] == KIND_HEALTH:
                if row["brokerAddr"] is not None:
                    self._broker_row(row)
                elif row["node"] is not None:
                    self._node_row(row, at)
            elif row["kind"] == KIND_ACTION and row["type"] in ("EXPIRE", "REMOVE"):
                gone = BrokerStatus.EXPIRED if row["type"] == "EXPIRE" else BrokerStatus.REMOVED
                self._set_broker(row, state=gone, since=int(row["orderTime"]))
        for alert in alerts:
            opened = alert.state is AlertState.OPEN
            if alert.kind is AlertKind.BROKER_FLAPPING and alert.cluster_name and alert.broker_addr:
                held = self.brokers.get(broker_field(alert.cluster_name, alert.broker_addr))
                if held is not None:
                    self._put_broker(replace(held, flapping=opened))
            elif alert.kind is AlertKind.NODE_SILENT and alert.node in self.nodes:
                self._put_node(replace(self.nodes[alert.node], silent=opened))
        wm = status.watermark_ms or None
        event_time = None if wm is None else wm + delay_ms
        durations = status.batch_durations_ms
        self.monitor = MonitorHealth(
            monitor=monitor, batch_id=batch_id, batch_at=at, watermark=wm, event_time=event_time,
            lag_ms=None if event_time is None else at - event_time, batch_ms=durations[-1] if durations else None,
            batches=status.batches, events=status.events, bad_events=status.bad_events,
        )  # fmt: skip
        if now:
            self._forget(now)
        self._bound()

    def _broker_row(self, row: Mapping[str, Any]) -> None:
        state = _ROW_STATES.get(row["state"] or "", BrokerStatus.ALIVE)
        timeout = row["timeoutMillis"]
        self._set_broker(
            row, state=state, last_heartbeat=int(row["lastHeartbeat"] or 0),
            timeout_ms=None if timeout is None else int(timeout), since=int(row["orderTime"] or 0),
        )  # fmt: skip

    def _set_broker(self, row: Mapping[str, Any], *, state: BrokerStatus, since: int, **values: Any) -> None:
        key = broker_field(row["clusterName"], row["brokerAddr"])
        held = self.brokers.get(key)
        name, broker_id = row["brokerName"], row["brokerId"]
        if held is None:
            held = BrokerHealth(
                row["clusterName"], row["brokerAddr"], name, None if broker_id is None else int(broker_id),
                last_heartbeat=int(row["lastHeartbeat"] or 0), timeout_ms=None, state=state, flapping=False,
                since=since,
            )  # fmt: skip
        new = replace(
            held,
            broker_name=name if name is not None else held.broker_name,
            broker_id=int(broker_id) if broker_id is not None else held.broker_id,
            state=state,
            since=held.since if state is held.state else since,
            **values,
        )
        self._put_broker(new)

    def _put_broker(self, new: BrokerHealth) -> None:
        if self.brokers.get(new.key) != new:
            self.brokers[new.key] = new
            self._changed_brokers.add(new.key)

    def _node_row(self, row: Mapping[str, Any], at: int) -> None:
        node, last = row["node"], int(row["lastHeartbeat"] or 0)
        held = self.nodes.get(node)
        scan = {SCAN_ON: True, SCAN_OFF: False}.get(row["state"] or "")
        silent = held.silent if held is not None else False
        self._put_node(NodeHealth(node, last, scan, last - at, silent))

    def _put_node(self, new: NodeHealth) -> None:
        if self.nodes.get(new.node) != new:
            self.nodes[new.node] = new
            self._changed_nodes.add(new.node)

    def _forget(self, now: int) -> None:
        """Drop what the stateful step forgets too: brokers gone, and nodes silent, for forget_after_ms."""
        horizon = now - self.forget_after_ms
        for key, b in list(self.brokers.items()):
            if b.state is not BrokerStatus.ALIVE and b.since < horizon:
                self._drop_broker(key)
        for name, n in list(self.nodes.items()):
            if n.last_tick < horizon:
                self._drop_node(name)

    def _bound(self) -> None:
        if len(self.brokers) > self.max_brokers:
            # gone ones first, longest gone first; then the ones silent longest
            order = sorted(
                self.brokers.values(), key=lambda b: (b.state is BrokerStatus.ALIVE, b.since, b.last_heartbeat)
            )
            for b in order[: len(self.brokers) - self.max_brokers]:
                self._drop_broker(b.key)
        if len(self.nodes) > self.max_nodes:
            for n in sorted(self.nodes.values(), key=lambda n: n.last_tick)[: len(self.nodes) - self.max_nodes]:
                self._drop_node(n.node)

    def _drop_broker(self, key: str) -> None:
        del self.brokers[key]
        self._changed_brokers.add(key)

    def _drop_node(self, name: str) -> None:
        del self.nodes[name]
        self._changed_nodes.add(name)

    # -- writing

    def take(self, *, full: bool = False) -> HealthWrites:
        """What to write: what changed since the last take, or everything (``full``)."""
        bkeys = set(self.brokers) if full else self._changed_brokers
        nkeys = set(self.nodes) if full else self._changed_nodes
        out = HealthWrites(
            brokers={k: encode_broker(self.brokers[k]) if k in self.brokers else None for k in sorted(bkeys)},
            nodes={k: encode_node(self.nodes[k]) if k in self.nodes else None for k in sorted(nkeys)},
            monitor=None if self.monitor is None else encode_monitor(self.monitor),
            full=full,
        )
        self._changed_brokers = set()
        self._changed_nodes = set()
        return out


# --------------------------------------------------------------------------- the reader


@dataclass
class HealthView:
    """Everything the console shows, as read from Redis and checked."""

    brokers: list[BrokerHealth] = field(default_factory=list)
    nodes: list[NodeHealth] = field(default_factory=list)
    monitor: MonitorHealth | None = None
    #: ``P:meta``: the job's last write (lineage, batchId, watermark, updatedAt), fields checked
    meta: dict[str, int | str] = field(default_factory=dict)
    open_alerts: list[Alert] = field(default_factory=list)
    resolved_alerts: list[Alert] = field(default_factory=list)
    #: entries left out: what was wrong with them (at most a few), and how many
    problems: list[str] = field(default_factory=list)
    skipped: int = 0
    #: entries in Redis beyond what was read (a cap reached), per key
    not_read: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def bounded_hash(client: redis_clients.Client, key: str, cap: int) -> tuple[dict[bytes, bytes], int]:
    """At most ``cap`` fields of hash ``key`` (all of them when it has no more), and how many were left."""
    total = int(client.hlen(key))
    if total <= cap:
        return dict(client.hgetall(key)), 0  # type: ignore[arg-type]
    out: dict[bytes, bytes] = {}
    for f, v in client.hscan_iter(key, count=min(cap, 1000)):
        out[f] = v
        if len(out) >= cap:
            break
    return out, total - len(out)


_META_INTS = ("batchId", "watermark", "updatedAt")


def checked_meta(raw: Mapping[bytes | str, bytes | str]) -> dict[str, int | str]:
    """``P:meta`` with each known field checked; unknown or malformed fields are left out."""
    out: dict[str, int | str] = {}
    for k, v in raw.items():
        name, text = _text(k), _text(v)
        if name in _META_INTS and len(text) <= 20 and text.lstrip("-").isdigit():
            out[name] = int(text)
        elif name == "lineage" and len(text) <= 200:
            out[name] = text
    return out


class HealthReader:
    """Reads the health keys under one prefix; re-reads the broker and node hashes only after a write."""

    def __init__(
        self, client: redis_clients.Client, prefix: str = "namesrv", *, max_brokers: int = MAX_BROKERS,
        hash_tag: bool = False,
    ) -> None:  # fmt: skip
        self.client = client
        #: ``hash_tag``: the keys of a Redis Cluster (``common.redis_clients.is_cluster``)
        self.keys = RedisKeys(prefix, hash_tag=hash_tag)
        self.max_brokers = max_brokers
        self._stamp: tuple[Any, ...] | None = None
        self._cached: tuple[list[BrokerHealth], list[NodeHealth], list[str], int, dict[str, int]] | None = None

    def read(self) -> HealthView:
        k = self.keys
        with self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(k.meta)
            pipe.get(k.health_monitor)
            pipe.hlen(k.health_brokers)
            pipe.hlen(k.health_nodes)
            pipe.lrange(k.alerts_resolved, 0, MAX_RESOLVED - 1)
            meta_raw, monitor_raw, n_brokers, n_nodes, resolved_raw = pipe.execute()
        view = HealthView(meta=checked_meta(meta_raw))
        problems: list[str] = []

        def skip(what: str, exc: Exception) -> None:
            view.skipped += 1
            if len(problems) < 5:
                problems.append(f"{what}: {str(exc)[:200]}")

        if monitor_raw is not None:
            try:
                view.monitor = decode_monitor(monitor_raw)
            except SchemaError as exc:
                skip(k.health_monitor, exc)
        # the job writes both hashes in the same transaction as P:meta: unchanged meta, unchanged hashes
        stamp = (view.meta.get("lineage"), view.meta.get("batchId"), view.meta.get("updatedAt"), n_brokers, n_nodes)
        if stamp != self._stamp or self._cached is None:
            self._cached = read_entries(self.client, self.keys, self.max_brokers)
            self._stamp = stamp
        brokers, nodes, entry_problems, entry_skipped, not_read = self._cached
        view.brokers, view.nodes = list(brokers), list(nodes)
        view.not_read.update(not_read)
        view.skipped += entry_skipped
        problems += entry_problems[: max(0, 5 - len(problems))]
        open_raw, left = bounded_hash(self.client, k.alerts, MAX_OPEN_ALERTS)
        if left:
            view.not_read[k.alerts] = left
        for incident, raw in open_raw.items():
            try:
                view.open_alerts.append(checked_alert(raw))
            except SchemaError as exc:
                skip(f"{k.alerts}[{_text(incident)[:80]!r}]", exc)
        view.open_alerts.sort(key=lambda a: (a.event_time, a.incident), reverse=True)
        for i, raw in enumerate(resolved_raw):
            try:
                view.resolved_alerts.append(checked_alert(raw))
            except SchemaError as exc:
                skip(f"{k.alerts_resolved}[{i}]", exc)
        view.problems = problems
        return view


E = TypeVar("E")


@dataclass
class _Entries:
    """What one read of the entry hashes found wrong: the first problems, entries skipped, fields not read."""

    problems: list[str] = field(default_factory=list)
    skipped: int = 0
    not_read: dict[str, int] = field(default_factory=dict)

    def decode_all(self, client: redis_clients.Client, key: str, cap: int, decode: Callable[[bytes], E]) -> list[E]:
        entries, left = bounded_hash(client, key, cap)
        if left:
            self.not_read[key] = left
        out = []
        for f, raw in entries.items():
            try:
                out.append(decode(raw))
            except SchemaError as exc:
                self.skipped += 1
                if len(self.problems) < 5:
                    self.problems.append(f"{key}[{_text(f)[:80]!r}]: {str(exc)[:200]}")
        return out


def read_entries(
    client: redis_clients.Client, keys: RedisKeys, max_brokers: int = MAX_BROKERS
) -> tuple[list[BrokerHealth], list[NodeHealth], list[str], int, dict[str, int]]:
    """The broker and node entries, checked: (brokers, nodes, first problems, entries skipped, fields not read)."""
    found = _Entries()
    brokers = found.decode_all(client, keys.health_brokers, max_brokers, decode_broker)
    nodes = found.decode_all(client, keys.health_nodes, MAX_NODES, decode_node)
    return brokers, nodes, found.problems, found.skipped, found.not_read


def load_entries(client: redis_clients.Client, keys: RedisKeys) -> tuple[list[BrokerHealth], list[NodeHealth]]:
    """The stored brokers and nodes for a job that resumes its query; malformed entries are logged and skipped."""
    brokers, nodes, problems, skipped, _ = read_entries(client, keys)
    if skipped:
        log.warning("redis: ignoring %d malformed health entr(ies), e.g. %s", skipped, "; ".join(problems))
    return brokers, nodes
