"""The event-time liveness decision: one stateful processor per bucket of brokers and per node.

Theory of operation
-------------------
The job groups events by :func:`streaming.events.group_key` and hands each group to
:class:`LivenessProcessor` (``transformWithState``, event-time timers, RocksDB state). It works on
plain rows, not pandas frames: PySpark's pandas conversion cost ~5 ms a key each way, more than
everything else the processor does. Brokers share keys (``STATE_BUCKETS`` of them): every key
costs a few round trips to the JVM's state server a batch, and one :class:`Bucket` value holds the
:class:`BrokerState` of each of its brokers, read and written once per batch. Each broker keeps
its own wake-up times in its state (``deadline``, ``flap_timer``); the bucket keeps one Spark
timer at or before the earliest of them, and when it fires every broker of the bucket whose
wake-up has come is looked at.
Time inside is only event time: the rows' ``eventTime`` and the watermark in ``timerValues``
(the watermark is the largest event time seen minus the configured delay; node TICKs keep it
moving while every broker is silent). Nothing here reads a clock.

Timers live in watermark time, decisions in event time. Spark fires a timer once the
watermark (max event time seen minus ``watermarkDelayMillis``) reaches it, so a decision due
at event time ``t`` is registered at ``t - delay`` (:meth:`LivenessProcessor._timer_at`): the
delay bounds how late an event may arrive, it is never added to a broker's timeout.

A broker's wake-up is at event time ``lastSeen + timeout + 1``: the broker is expired once event
time is *past* that deadline, as RocketMQ's ``last + timeout < now``. REGISTER and HEARTBEAT
events move ``lastSeen`` and the broker's wake-up, but not the bucket's Spark timer (a timer delete
is the dearest call of Spark's state API, and a heartbeat comes every few seconds): when the timer
fires, the handler looks at each deadline *now*, and either leaves it for the next wake-up or emits
EXPIRE once and marks the broker gone, after which a duplicate is ignored (``alive`` is false). Its
``lastHeartbeat`` is the newest event time seen for the broker: a node that saw anything newer
ignores the action. The per-broker ``heartbeatTimeoutMillis`` of the registration replaces the
default timeout.

The timer can only fire in the micro-batch after the one that read an event past the deadline
(Spark moves the watermark between batches). Nodes therefore report a SILENT event once their
own clock passes their deadline for a broker (:mod:`namesrv.events.silence`); it reaches the
broker's own group, and when its event time is past *this* deadline (every node's heartbeats
counted) the broker is expired there and then, a batch earlier. A SILENT that is not past it
(another node heard the broker later) changes nothing; the timer stays as the backstop.

REMOVE is emitted once when the broker unregisters (UNREGISTER with source UNREGISTER_BROKER)
or when its connection is gone at every node that held one, provided nothing newer than that
event was seen. The broker's ``links`` remember, per node, whether that node's last word was
proof of life (REGISTER, HEARTBEAT: it holds a connection) or CHANNEL_CLOSED (a close or an idle
close there); the close that leaves no node holding one removes the broker everywhere at once.
A close at only some nodes removes nothing centrally: the node that lost the connection has
already dropped the broker itself, as RocketMQ's NameServer does
(``monitor.removeOnChannelClose=true`` removes it everywhere at the first close instead).
UNREGISTER events whose source is the node's own expiry or one of our actions are echoes and
change nothing here.

The processor also passes on what the route materialisation needs (rows of kind ROUTE):
every REGISTER whose content differs from the last one passed (N nodes report each
registration; one copy is enough), every ADMIN and ORDER_TOPIC_CONF event, and the broker's
last registration again when it comes back with a mere heartbeat after being expired or
removed, or re-registers unchanged (a node then re-adds topics an admin deleted; at most once
per 10 s of event time).

Alerts opened and resolved here (kind ALERT): BROKER_EXPIRED and BROKER_REMOVED (open while
the broker is gone), BROKER_FLAPPING (more than N expiries or comebacks within a window; a
second timer re-checks when the oldest one leaves the window) and NODE_SILENT (a node key's
timer at ``lastTick + nodeSilentMillis + 1``).

Rows in a group are handled in event-time order; the driver orders the whole batch's output by
(``orderTime``, ``node``, ``seq``, ``step``) before applying it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import astuple, dataclass, fields
from typing import Any

import orjson
from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from namesrv.events.schema import ActionType, EventType, UnregisterSource
from namesrv.protocol.codes import MASTER_ID
from streaming.alerts import AlertKind, AlertState, Severity
from streaming.events import ADMIN_KEY, BROKER_KEY, NODE_KEY, PACKED, STATE_BUCKETS, broker_id
from streaming.health import KIND_HEALTH, scan_state

log = logging.getLogger(__name__)

#: what the processor emits: an action, an alert, or an event for the route materialisation; and
#: KIND_HEALTH (streaming.health): per key and batch, a broker's last heartbeat or a node's last tick
KIND_ACTION = "ACTION"
KIND_ALERT = "ALERT"
KIND_ROUTE = "ROUTE"

#: (column, Spark type) of every output row; unused columns are null
OUTPUT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("kind", "STRING"),
    ("orderTime", "BIGINT"),
    ("node", "STRING"),
    ("seq", "BIGINT"),
    ("step", "INT"),
    ("type", "STRING"),
    ("cause", "STRING"),
    ("clusterName", "STRING"),
    ("brokerName", "STRING"),
    ("brokerId", "BIGINT"),
    ("brokerAddr", "STRING"),
    ("lastHeartbeat", "BIGINT"),
    ("watermark", "BIGINT"),
    ("reason", "STRING"),
    ("severity", "STRING"),
    ("state", "STRING"),
    ("message", "STRING"),
    ("raw", "STRING"),
    ("timeoutMillis", "BIGINT"),
)
OUTPUT_DDL = ", ".join(f"`{name}` {ddl}" for name, ddl in OUTPUT_COLUMNS)
_OUTPUT_NAMES = tuple(name for name, _ in OUTPUT_COLUMNS)
_OUTPUT_ROW = Row(*_OUTPUT_NAMES)
_NO_TIMER = -1
#: nodes remembered per broker in ``links``; a fleet has a handful, this bounds what a bad stream can add
_MAX_LINKS = 64
#: brokers one state key holds (262,144 in all): a stream of events for made-up addresses cannot make
#: every batch read and write an ever larger value; a new broker past it is skipped and logged
MAX_BROKERS_PER_BUCKET = 4_096
#: N nodes report each periodic re-registration within moments; pass one of them
_REPLAY_GAP_MS = 10_000
#: registration fields that do not change what it says about the broker
_VOLATILE = ("node", "eventTime", "seq", "reason")


@dataclass(frozen=True)
class LivenessSettings:
    heartbeat_timeout_ms: int = 120_000
    flap_threshold: int = 3
    flap_window_ms: int = 600_000
    node_silent_ms: int = 30_000
    remove_on_channel_close: bool = False
    #: how late an event may arrive (Spark's watermark delay); timers are shifted by it, decisions are not
    watermark_delay_ms: int = 120_000
    #: a broker gone this long (event time) is forgotten: its state is dropped, its incidents resolved
    forget_after_ms: int = 86_400_000


_SPARK_TYPES = {"str": "STRING", "int": "BIGINT", "bool": "BOOLEAN"}


def _columns_of(cls: type) -> tuple[tuple[str, str], ...]:
    """(name, Spark type) of a state dataclass's fields (annotations are strings: ``str | None`` -> STRING)."""
    return tuple((f.name, _SPARK_TYPES[str(f.type).split("|")[0].strip()]) for f in fields(cls))


@dataclass
class BrokerState:
    cluster_name: str
    broker_addr: str
    broker_name: str | None = None
    broker_id: int | None = None
    #: newest REGISTER/HEARTBEAT event time
    last_seen: int = 0
    timeout_ms: int = 120_000
    #: its next wake-up (watermark time): the liveness deadline ``last_seen + timeout_ms + 1`` while
    #: alive, the forget deadline ``gone_at + forget_after_ms`` while gone; -1 for none. The bucket's
    #: Spark timer is at or before the earliest of its brokers' (see :class:`Bucket`)
    deadline: int = _NO_TIMER
    alive: bool = True
    #: event time of the EXPIRE/REMOVE
    gone_at: int = 0
    expired_open: bool = False
    removed_open: bool = False
    flapping_open: bool = False
    #: the flapping re-check wake-up (watermark time), or -1
    flap_timer: int = _NO_TIMER
    #: fingerprint of the last registration passed to the route materialisation
    registration: str = ""
    #: event time the last registration was passed again for an unchanged re-registration
    replayed_at: int = 0
    #: JSON ``{node: [eventTime, open]}``: each node's last word on its connection (see module doc)
    links: str = "{}"
    #: JSON list of the event times of its expiries and comebacks within the flapping window. Kept in
    #: this row rather than a list state: every state variable costs a JVM round trip per task to open
    #: and per key to read, and the list is at most ``flap_threshold + 1`` long
    flaps: str = "[]"

    @classmethod
    def from_tuple(cls, values: tuple) -> BrokerState:
        return cls(*values)


@dataclass
class NodeState:
    node: str
    last_tick: int = 0
    #: the earliest registered timer (watermark time), or -1; see :meth:`LivenessProcessor._arm`
    deadline: int = _NO_TIMER
    silent_open: bool = False

    @classmethod
    def from_tuple(cls, values: tuple) -> NodeState:
        return cls(*values)


class Bucket:
    """The brokers of one state key, by :func:`streaming.events.broker_id`, and its Spark timers.

    Stored as one value (JSON text): one read and one write per key and batch, however many of its
    brokers the batch brings. A broker's state is made into a :class:`BrokerState` only when the
    batch touches it; the others are written back as they were read.
    """

    def __init__(self, stored: dict[str, list[Any]], timers: list[int]) -> None:
        self._stored = stored
        self._states: dict[str, BrokerState] = {}
        #: timers registered for this key and not fired yet (watermark time)
        self.timers = timers

    @classmethod
    def load(cls, held: tuple | None) -> Bucket:
        if held is None:
            return cls({}, [])
        brokers, timers = held
        return cls(orjson.loads(brokers), [int(t) for t in orjson.loads(timers)])

    def dump(self) -> tuple[str, str]:
        brokers = {**self._stored, **{name: _state_values(st) for name, st in self._states.items()}}
        return orjson.dumps(brokers).decode(), orjson.dumps(sorted(self.timers)).decode()

    def __len__(self) -> int:
        return len(self._stored.keys() | self._states.keys())

    def get(self, name: str) -> BrokerState | None:
        st = self._states.get(name)
        if st is None and (values := self._stored.get(name)) is not None:
            st = self._states[name] = BrokerState.from_tuple(tuple(values))
        return st

    def put(self, name: str, st: BrokerState) -> None:
        self._states[name] = st

    def remove(self, name: str) -> None:
        self._stored.pop(name, None)
        self._states.pop(name, None)

    def _wakeups(self) -> Iterator[tuple[str, int, int]]:
        """(name, deadline, flap_timer) of every broker, without making states of the untouched ones."""
        for name, values in self._stored.items():
            if name not in self._states:
                yield name, int(values[_DEADLINE]), int(values[_FLAP_TIMER])
        for name, st in self._states.items():
            yield name, st.deadline, st.flap_timer

    def due(self, watermark: int) -> list[str]:
        """Brokers with a wake-up at or before ``watermark``."""
        return [n for n, *times in self._wakeups() if any(t != _NO_TIMER and t <= watermark for t in times)]

    def next_wakeup(self) -> int:
        """The earliest wake-up any of its brokers wants (watermark time), or -1."""
        return min((t for _, *times in self._wakeups() for t in times if t != _NO_TIMER), default=_NO_TIMER)


_BROKER_FIELDS = tuple(f.name for f in fields(BrokerState))
_DEADLINE, _FLAP_TIMER = _BROKER_FIELDS.index("deadline"), _BROKER_FIELDS.index("flap_timer")


def _state_values(st: BrokerState) -> list[Any]:
    # not dataclasses.astuple: it deep-copies field by field, and every field here is a scalar
    return [getattr(st, name) for name in _BROKER_FIELDS]


def registration_fingerprint(raw: str) -> str:
    """Equal for two reports of the same registration by different nodes or at different times."""
    d = orjson.loads(raw)
    for key in _VOLATILE:
        d.pop(key, None)
    return hashlib.sha1(orjson.dumps(d, option=orjson.OPT_SORT_KEYS)).hexdigest()


class _Out:
    """Collects output rows of one handler call, numbered so the driver can keep their order."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(self, kind: str, order_time: int, **values: Any) -> None:
        self.rows.append({"kind": kind, "orderTime": order_time, "step": len(self.rows), **values})

    def emit(self) -> Iterator[Row]:
        for r in self.rows:
            yield _OUTPUT_ROW(*(r.get(name) for name in _OUTPUT_NAMES))


def _flaps(st: BrokerState) -> list[int]:
    return [int(a) for a in orjson.loads(st.flaps)]


def _broker_fields(st: BrokerState) -> dict[str, Any]:
    return {
        "clusterName": st.cluster_name,
        "brokerAddr": st.broker_addr,
        "brokerName": st.broker_name,
        "brokerId": st.broker_id,
    }


#: event types as module constants: an enum's class attribute is dear to look up once per event
_REGISTER, _SILENT = EventType.REGISTER, EventType.SILENT
_UNREGISTER, _CHANNEL_CLOSED = EventType.UNREGISTER, EventType.CHANNEL_CLOSED
#: proof of life; a departure (compared with ==: the events' types are the JSON's text)
_ALIVE_TYPES = (_REGISTER, EventType.HEARTBEAT)
_GONE_TYPES = (_UNREGISTER, _CHANNEL_CLOSED)


def _where(e: dict[str, Any]) -> dict[str, Any]:
    """The output columns naming the event a row comes from (made only for the events that emit one)."""
    return {"node": e["node"], "seq": e["seq"]}


def _by_broker(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A bucket's events per broker, each in the order given."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        out.setdefault(broker_id(e["clusterName"], e["brokerAddr"]), []).append(e)
    return out


def events_of(rows: Iterator[Row], watermark: int) -> list[dict[str, Any]]:
    """One key's events as dicts in event-time order (then ``seq``; the sort is stable), late ones left out.

    The job hands events over in bundles (:data:`streaming.events.PACKED`, a JSON array; see
    :func:`streaming.events.bundled_rows`). Spark drops a bundle only when its latest event is at or
    before the watermark, so each event at or before ``watermark`` is dropped here: which events
    shared a bundle then changes nothing.
    """
    first = next(rows, None)
    if first is None:
        return []
    at = first.__fields__.index(PACKED)
    loads = orjson.loads
    out = loads(first[at])
    for r in rows:
        out.extend(loads(r[at]))
    out = [e for e in out if e["eventTime"] > watermark]
    out.sort(key=lambda e: (e["eventTime"], e["seq"]))
    return out


#: the processor's state variables and their columns, as the checkpoint stores them
STATE_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    #: a Bucket: {broker id: BrokerState as a list} and the registered timers, as JSON
    "brokers": (("brokers", "STRING"), ("timers", "STRING")),
    #: map state: broker id -> its last registration's JSON (read only to replay it)
    "registrationKey": (("broker", "STRING"),),
    "registration": (("raw", "STRING"),),
    "node": _columns_of(NodeState),
    #: what a Bucket's brokers hold; changing it changes the stored JSON, so it belongs to the layout
    "brokerState": _columns_of(BrokerState),
}
STATE_DDL = {name: ", ".join(f"{c} {t}" for c, t in cols) for name, cols in STATE_COLUMNS.items()}


def state_schema(name: str) -> StructType:
    """A state variable's schema, built here: a DDL string would be sent to the JVM to parse, once per task."""
    types = {"STRING": StringType(), "BIGINT": LongType(), "BOOLEAN": BooleanType()}
    return StructType([StructField(c, types[t], True) for c, t in STATE_COLUMNS[name]])


def state_layout() -> str:
    """A short name for the state and output schemas: a checkpoint written under another name cannot be read.

    Spark refuses to start a stateful query on a checkpoint whose state schema differs
    (STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE), so the job keeps each layout's checkpoint apart and a
    new version of it starts afresh by itself instead of failing after an upgrade.
    """
    text = repr((sorted(STATE_DDL.items()), OUTPUT_DDL, "transformWithState", STATE_BUCKETS))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class LivenessProcessor(StatefulProcessor):
    """EXPIRE/REMOVE decisions, route pass-through and per-broker/per-node alerts (see module doc)."""

    def __init__(self, settings: LivenessSettings | None = None) -> None:
        self.settings = settings or LivenessSettings()

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.bucket = handle.getValueState("brokers", state_schema("brokers"))
        self.registrations = handle.getMapState(
            "registration", state_schema("registrationKey"), state_schema("registration")
        )
        self.node = handle.getValueState("node", state_schema("node"))

    # ------------------------------------------------------------------ input

    def handleInputRows(self, key: Any, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        k: str = key[0]
        watermark = timerValues.getCurrentWatermarkInMs()
        events = events_of(rows, watermark)
        if not events:
            return
        out = _Out()
        if k.startswith(BROKER_KEY):
            bucket = Bucket.load(self.bucket.get())
            refused = 0
            for name, group in _by_broker(events).items():
                held = bucket.get(name)
                if held is None and len(bucket) >= MAX_BROKERS_PER_BUCKET:
                    refused += 1
                    continue
                st = self._broker_events(name, held, group, watermark, out)
                if st is not None:
                    bucket.put(name, st)
            if refused:
                log.warning("state key %s holds %d brokers: %d new one(s) not monitored", k, len(bucket), refused)
            self._store(bucket)
        elif k.startswith(NODE_KEY):
            self._ticks(k[len(NODE_KEY) :], events, out)
        elif k.startswith(ADMIN_KEY):
            for e in events:
                out.add(KIND_ROUTE, e["eventTime"], node=e["node"], seq=e["seq"], type=e["type"], raw=e["raw"])
        yield from out.emit()

    def _broker_events(
        self, name: str, held: BrokerState | None, events: list[dict[str, Any]], watermark: int, out: _Out
    ) -> BrokerState | None:
        """One broker's events of the batch; returns its state to keep, None when there is none."""
        s = self.settings
        first = events[0]
        st = (
            held
            if held is not None
            else BrokerState(first["clusterName"], first["brokerAddr"], timeout_ms=s.heartbeat_timeout_ms, alive=False)
        )
        known = held is not None
        flaps = _flaps(st)
        links = Links.load(st.links)
        for e in events:
            etype, t = e["type"], int(e["eventTime"])
            if etype in _ALIVE_TYPES:
                links.report(e["node"], t, connected=True)
                if e["brokerName"] is not None:
                    st.broker_name = e["brokerName"]
                if e["brokerId"] is not None:
                    st.broker_id = int(e["brokerId"])
                if e["heartbeatTimeoutMillis"] is not None:
                    st.timeout_ms = int(e["heartbeatTimeoutMillis"])
                comeback = not st.alive
                st.alive = True
                st.last_seen = max(st.last_seen, t)
                if etype == _REGISTER:
                    fingerprint = registration_fingerprint(e["raw"])
                    if comeback or fingerprint != st.registration:
                        st.registration = fingerprint
                        self.registrations.updateValue((name,), (e["raw"],))
                        out.add(KIND_ROUTE, t, type=etype, raw=e["raw"], **_where(e), **_broker_fields(st))
                elif (comeback or (e["source"] == "REGISTER_BROKER" and t - st.replayed_at >= _REPLAY_GAP_MS)) and (
                    last := self.registrations.getValue((name,))
                ) is not None:
                    # (the stored registration is read only here: a state read is a JVM round trip)
                    # A comeback: nodes that did not apply our removal send no topic table, so
                    # bring the last one back. An unchanged re-registration: nodes re-add topics
                    # an admin deleted meanwhile, so the route model must see it too.
                    (raw,) = last
                    st.replayed_at = t
                    cause = "COMEBACK" if comeback else "REREGISTER"
                    out.add(KIND_ROUTE, t, type=_REGISTER, cause=cause, raw=raw, **_where(e), **_broker_fields(st))
                if comeback and known:
                    flaps.append(t)
                    self._resolve_gone(st, t, out, _where(e))
                known = True
            elif etype == _SILENT:
                # a node's clock passed its own deadline for the broker; decide now if ours has passed
                # too (every node's heartbeats, not just that node's), rather than a batch later
                if st.alive and known and t > st.last_seen + st.timeout_ms:
                    self._expire(st, t, t, watermark, flaps, out)
            elif etype in _GONE_TYPES:
                closed = etype == _CHANNEL_CLOSED and links.report(e["node"], t, connected=False)
                if not st.alive or t < st.last_seen:
                    continue  # already gone, or the broker proved alive after this report
                asked = etype == _UNREGISTER and e["source"] == UnregisterSource.UNREGISTER_BROKER
                everywhere = closed and not links.holders()
                if not (asked or everywhere or (closed and s.remove_on_channel_close)):
                    continue  # an echo of an expiry or of our own action, or a close at only some nodes
                cause = str(UnregisterSource.UNREGISTER_BROKER) if asked else str(EventType.CHANNEL_CLOSED)
                if asked:
                    how, reason = "unregistered", f"{cause} reported by {e['node']} at {t}"
                elif everywhere:
                    how = "lost its connection at every node that held one"
                    reason = f"{cause} at {links.describe_closed()}"
                else:
                    how, reason = "lost its connection", f"{cause} reported by {e['node']} at {t}"
                st.alive = False
                st.gone_at = t
                where = _where(e)
                out.add(
                    KIND_ACTION, t, type=ActionType.REMOVE, cause=cause, lastHeartbeat=t, watermark=watermark,
                    reason=reason, **where, **_broker_fields(st),
                )  # fmt: skip
                if not st.removed_open:
                    st.removed_open = True
                    out.add(
                        KIND_ALERT, t, type=AlertKind.BROKER_REMOVED, state=AlertState.OPEN,
                        severity=Severity.INFO if asked else Severity.WARNING,
                        message=f"broker {_name(st)} {how} ({reason}); removed at every node",
                        **where, **_broker_fields(st),
                    )  # fmt: skip
        if not known:
            return None  # only reports of its departure: nothing to remember about this broker
        st.links = links.dump()
        gone = "REMOVED" if st.removed_open else "EXPIRED"
        out.add(KIND_HEALTH, events[-1]["eventTime"], lastHeartbeat=st.last_seen, timeoutMillis=st.timeout_ms,
                state="ALIVE" if st.alive else gone, **_broker_fields(st))  # fmt: skip
        self._check_flapping(st, flaps, events[-1]["eventTime"], out)
        self._arm(st)
        st.flaps = orjson.dumps(flaps).decode()
        return st

    def _store(self, bucket: Bucket) -> None:
        """Write the bucket back, with a Spark timer at or before its earliest wake-up."""
        wake = bucket.next_wakeup()
        if wake != _NO_TIMER and not any(t <= wake for t in bucket.timers):
            # an earlier timer, already set, is left alone: it wakes the bucket, which finds nothing due
            # and sets this one then. Later ones are not needed any more; they go, so the list stays
            # short (a wake-up only moves earlier on a comeback or a new broker: a delete is the
            # dearest call of the state API)
            for later in bucket.timers:
                self.handle.deleteTimer(later)
            self.handle.registerTimer(wake)
            bucket.timers = [wake]
        if len(bucket):
            self.bucket.update(bucket.dump())
        else:
            self.bucket.clear()

    def _ticks(self, node: str, events: list[dict[str, Any]], out: _Out) -> None:
        held = self.node.get()  # None when the state has no value
        st = NodeState.from_tuple(held) if held is not None else NodeState(node)
        last = max(int(e["eventTime"]) for e in events)
        if last > st.last_tick:
            st.last_tick = last
            if st.silent_open:
                st.silent_open = False
                out.add(
                    KIND_ALERT, last, type=AlertKind.NODE_SILENT, state=AlertState.RESOLVED, severity=Severity.WARNING,
                    message=f"name-server node {node} ticks again", node=node,
                )  # fmt: skip
            st.deadline = self._arm_at(st.deadline, self._timer_at(last + self.settings.node_silent_ms + 1))
        out.add(KIND_HEALTH, st.last_tick, node=node, lastHeartbeat=st.last_tick,
                state=scan_state(events[-1].get("localScan")))  # fmt: skip
        self.node.update(astuple(st))

    # ------------------------------------------------------------------ timers

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        k: str = key[0]
        fired = expiredTimerInfo.getExpiryTimeInMs()
        watermark = timerValues.getCurrentWatermarkInMs()
        now = self._event_time_at(watermark)
        out = _Out()
        if k.startswith(BROKER_KEY) and (held_bucket := self.bucket.get()) is not None:
            bucket = Bucket.load(held_bucket)
            if fired in bucket.timers:
                bucket.timers.remove(fired)  # Spark drops a timer once it fired
            for name in bucket.due(watermark):
                broker = bucket.get(name)
                assert broker is not None  # due() names only brokers it holds
                if self._broker_timer(broker, watermark, out) is None:
                    bucket.remove(name)
                    self.registrations.removeKey((name,))
            self._store(bucket)
        elif k.startswith(NODE_KEY) and (held_node := self.node.get()) is not None:
            st = NodeState.from_tuple(held_node)
            if fired == st.deadline:
                st.deadline = _NO_TIMER
                due = st.last_tick + self.settings.node_silent_ms + 1
                if due > now:  # ticks came since the timer was set: wake up at the new deadline
                    st.deadline = self._arm_at(st.deadline, self._timer_at(due))
                elif not st.silent_open:
                    st.silent_open = True
                    silent_for = now - st.last_tick
                    out.add(
                        KIND_ALERT, due, type=AlertKind.NODE_SILENT, state=AlertState.OPEN, severity=Severity.WARNING,
                        message=f"name-server node {st.node} sent no tick for {silent_for / 1000:.0f} s of event time",
                        node=st.node,
                    )  # fmt: skip
                self.node.update(astuple(st))
        yield from out.emit()

    def _broker_timer(self, st: BrokerState, watermark: int, out: _Out) -> BrokerState | None:
        """A broker whose wake-up has come; returns None when it is forgotten."""
        flaps = _flaps(st)
        now = self._event_time_at(watermark)
        if st.deadline != _NO_TIMER and st.deadline <= watermark:
            # a wake-up, not a verdict: look at the deadline as it is now
            st.deadline = _NO_TIMER
            due = self._due(st)
            if due <= now and not st.alive:
                self._forget(st, due, out)
                return None
            if due <= now:
                self._expire(st, due, now, watermark, flaps, out)
        if st.flap_timer != _NO_TIMER and st.flap_timer <= watermark:
            st.flap_timer = _NO_TIMER
        self._check_flapping(st, flaps, now, out)
        self._arm(st)
        st.flaps = orjson.dumps(flaps).decode()
        return st

    def _expire(self, st: BrokerState, due: int, now: int, watermark: int, flaps: list[int], out: _Out) -> None:
        """EXPIRE once, at event time ``due``: nothing was heard from the broker at any node since ``last_seen``."""
        st.alive = False
        st.gone_at = due
        reason = (
            f"no heartbeat at any node for {(now - st.last_seen) / 1000:.1f} s "
            f"(timeout {st.timeout_ms} ms, last heartbeat at {st.last_seen}, event time now {now})"
        )
        out.add(
            KIND_ACTION, due, type=ActionType.EXPIRE, cause="TIMEOUT", lastHeartbeat=st.last_seen,
            watermark=watermark, reason=reason, **_broker_fields(st),
        )  # fmt: skip
        flaps.append(due)
        if not st.expired_open:
            st.expired_open = True
            out.add(
                KIND_ALERT, due, type=AlertKind.BROKER_EXPIRED, state=AlertState.OPEN,
                severity=Severity.CRITICAL if st.broker_id == MASTER_ID else Severity.WARNING,
                message=f"broker {_name(st)} expired: {reason}", **_broker_fields(st),
            )  # fmt: skip

    # ------------------------------------------------------------------ helpers

    def _timer_at(self, event_time: int) -> int:
        """The watermark at which event time reaches ``event_time``: where a timer for it goes."""
        return event_time - self.settings.watermark_delay_ms

    def _event_time_at(self, watermark: int) -> int:
        """The event time (largest seen) that a watermark stands for."""
        return watermark + self.settings.watermark_delay_ms

    def _due(self, st: BrokerState) -> int:
        """Event time of the broker's next decision: expiry while alive, forgetting it while gone."""
        return st.last_seen + st.timeout_ms + 1 if st.alive else st.gone_at + self.settings.forget_after_ms

    def _arm(self, st: BrokerState) -> None:
        """The broker's wake-up at its next decision (:meth:`_due`); the bucket's timer follows (:meth:`_store`)."""
        st.deadline = self._timer_at(self._due(st))

    def _arm_at(self, current: int, wanted: int) -> int:
        """A node key's timer to keep, given the one set (``current``, or -1) and the deadline now ``wanted``.

        Every heartbeat moves a deadline later. Moving the timer with it would cost a delete and a
        register per key and batch, and a timer delete is the dearest call of the state API (about
        10 ms of the JVM here). So a timer that is still earlier than the deadline is kept: when it
        fires, the handler finds the deadline not yet due and sets the next one. At most one
        wake-up per timeout period, instead of two calls per heartbeat. A deadline that moves
        *earlier* (a comeback, a shorter timeout) replaces the timer.
        """
        if current != _NO_TIMER and current <= wanted:
            return current
        if current != _NO_TIMER:
            self.handle.deleteTimer(current)
        self.handle.registerTimer(wanted)
        return wanted

    def _forget(self, st: BrokerState, fired: int, out: _Out) -> None:
        """Gone for ``forget_after_ms``: end its incidents and drop everything kept about it."""
        days = self.settings.forget_after_ms / 86_400_000
        for flag, kind in (
            ("expired_open", AlertKind.BROKER_EXPIRED),
            ("removed_open", AlertKind.BROKER_REMOVED),
            ("flapping_open", AlertKind.BROKER_FLAPPING),
        ):
            if getattr(st, flag):
                out.add(
                    KIND_ALERT, fired, type=kind, state=AlertState.RESOLVED, severity=Severity.INFO,
                    message=f"broker {_name(st)} has been gone for {days:g} day(s); forgotten",
                    **_broker_fields(st),
                )  # fmt: skip
        # the caller drops its state and stored registration

    def _resolve_gone(self, st: BrokerState, t: int, out: _Out, where: dict[str, Any]) -> None:
        for flag, kind in (("expired_open", AlertKind.BROKER_EXPIRED), ("removed_open", AlertKind.BROKER_REMOVED)):
            if getattr(st, flag):
                setattr(st, flag, False)
                out.add(
                    KIND_ALERT, t, type=kind, state=AlertState.RESOLVED, severity=Severity.INFO,
                    message=f"broker {_name(st)} is back (event at {t} from {where['node']})",
                    **where, **_broker_fields(st),
                )  # fmt: skip

    def _check_flapping(self, st: BrokerState, flaps: list[int], now: int, out: _Out) -> None:
        """Open or resolve BROKER_FLAPPING from the expiries and comebacks within the window."""
        s = self.settings
        flaps[:] = [a for a in flaps if a > now - s.flap_window_ms]
        if len(flaps) > s.flap_threshold and not st.flapping_open:
            st.flapping_open = True
            out.add(
                KIND_ALERT, now, type=AlertKind.BROKER_FLAPPING, state=AlertState.OPEN, severity=Severity.WARNING,
                message=f"broker {_name(st)} expired or came back {len(flaps)} times within "
                f"{s.flap_window_ms / 1000:.0f} s (threshold {s.flap_threshold})",
                **_broker_fields(st),
            )  # fmt: skip
        elif len(flaps) <= s.flap_threshold and st.flapping_open:
            st.flapping_open = False
            out.add(
                KIND_ALERT, now, type=AlertKind.BROKER_FLAPPING, state=AlertState.RESOLVED, severity=Severity.INFO,
                message=f"broker {_name(st)} is stable again", **_broker_fields(st),
            )  # fmt: skip
        # re-check when the oldest counted change leaves the window
        st.flap_timer = self._timer_at(min(flaps) + s.flap_window_ms) if st.flapping_open and flaps else _NO_TIMER

    def close(self) -> None:
        pass


class Links:
    """Per node, its last word on the broker's connection: open (it heard the broker) or closed.

    Kept in :attr:`BrokerState.links` as JSON; a report older than the node's last word is ignored,
    so a late CHANNEL_CLOSED cannot undo a newer registration at the same node.
    """

    def __init__(self, by_node: dict[str, list[int]]) -> None:
        self.by_node = by_node

    @classmethod
    def load(cls, text: str) -> Links:
        return cls(orjson.loads(text) if text else {})

    def dump(self) -> str:
        if len(self.by_node) > _MAX_LINKS:  # keep the newest words
            newest = sorted(self.by_node.items(), key=lambda kv: kv[1][0])[-_MAX_LINKS:]
            self.by_node = dict(newest)
        return orjson.dumps(self.by_node, option=orjson.OPT_SORT_KEYS).decode()

    def report(self, node: str, t: int, *, connected: bool) -> bool:
        """Record a node's report; False if that node already said something newer."""
        prior = self.by_node.get(node)
        if prior is not None and prior[0] > t:
            return False
        self.by_node[node] = [t, 1 if connected else 0]
        return True

    def holders(self) -> list[str]:
        """Nodes whose last word is that they hold a connection."""
        return sorted(n for n, (_, is_open) in self.by_node.items() if is_open)

    def describe_closed(self) -> str:
        return ", ".join(f"{n} at {t}" for n, (t, is_open) in sorted(self.by_node.items()) if not is_open)


def _name(st: BrokerState) -> str:
    ident = f"{st.broker_name}[{st.broker_id}]" if st.broker_name is not None else "?"
    return f"{ident} {st.broker_addr} ({st.cluster_name})"
