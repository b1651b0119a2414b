"""The monitor's stateful step on Spark: :class:`LivenessProcessor` runs the rules of :mod:`streaming.decide`.

The processor is a thin adapter. It keeps the rules' states in Spark's state store (RocksDB), wakes
them with Spark's event-time timers, and packs their outputs into the step's rows
(:data:`OUTPUT_COLUMNS`). What it adds is cost control: every state key costs JVM round trips a
batch and a timer delete is the dearest call of the state API, so brokers share
:data:`streaming.events.STATE_BUCKETS` keys (a :class:`Bucket`, read and written once a batch), and
a bucket or node key keeps one Spark timer at or before its earliest wake-up, left alone when a
heartbeat moves a deadline later. The state layout (:data:`STATE_COLUMNS`) is what checkpoints
hold (:func:`state_layout`). Design: docs/internals/monitor-liveness.md.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import astuple, fields
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

from streaming.decide import (
    NO_TIMER,
    ActionRow,
    BrokerState,
    HealthRow,
    LivenessSettings,
    NodeState,
    Output,
    PackedEvent,
    RouteRow,
    admin_events,
    broker_events,
    broker_timer,
    node_ticks,
    node_timer,
)
from streaming.events import ADMIN_KEY, BROKER_KEY, NODE_KEY, PACKED, STATE_BUCKETS, broker_id
from streaming.health import KIND_HEALTH
from streaming.spark_daemon import setup_driver_worker

log = logging.getLogger(__name__)

# Spark runs the processor's init at each query start in a Python worker of its own, not forked from
# streaming.spark_daemon, which imports this module first of the job's (unpickling the processor)
setup_driver_worker()

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
#: brokers one state key holds (262,144 in all): a stream of events for made-up addresses cannot make
#: every batch read and write an ever larger value; a new broker past it is skipped and logged
MAX_BROKERS_PER_BUCKET = 4_096

_SPARK_TYPES = {"str": "STRING", "int": "BIGINT", "bool": "BOOLEAN"}


def _columns_of(cls: type) -> tuple[tuple[str, str], ...]:
    """(name, Spark type) of a state dataclass's fields (annotations are strings: ``str | None`` -> STRING)."""
    return tuple((f.name, _SPARK_TYPES[str(f.type).split("|")[0].strip()]) for f in fields(cls))


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
        return [n for n, *times in self._wakeups() if any(t != NO_TIMER and t <= watermark for t in times)]

    def next_wakeup(self) -> int:
        """The earliest wake-up any of its brokers wants (watermark time), or -1."""
        return min((t for _, *times in self._wakeups() for t in times if t != NO_TIMER), default=NO_TIMER)


_BROKER_FIELDS = tuple(f.name for f in fields(BrokerState))
_DEADLINE, _FLAP_TIMER = _BROKER_FIELDS.index("deadline"), _BROKER_FIELDS.index("flap_timer")


def _state_values(st: BrokerState) -> list[Any]:
    # not dataclasses.astuple: it deep-copies field by field, and every field here is a scalar
    return [getattr(st, name) for name in _BROKER_FIELDS]


def _by_broker(events: list[PackedEvent]) -> dict[str, list[PackedEvent]]:
    """A bucket's events per broker, each in the order given."""
    out: dict[str, list[PackedEvent]] = {}
    for e in events:
        out.setdefault(broker_id(e["clusterName"], e["brokerAddr"]), []).append(e)
    return out


def events_of(rows: Iterator[Row], watermark: int) -> list[PackedEvent]:
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


def _rows(outputs: list[Output]) -> Iterator[Row]:
    """The outputs of one handler call as rows, numbered (``step``) so the driver can keep their order."""
    for step, o in enumerate(outputs):
        cells: dict[str, Any] = {"orderTime": o.at, "node": o.node, "step": step}
        if (b := o.broker) is not None:
            cells["clusterName"], cells["brokerAddr"] = b.cluster_name, b.broker_addr
            cells["brokerName"], cells["brokerId"] = b.broker_name, b.broker_id
        if isinstance(o, HealthRow):  # the commonest: one per broker and batch
            cells.update(kind=KIND_HEALTH, lastHeartbeat=o.last_heartbeat, state=o.state, timeoutMillis=o.timeout_ms)
        elif isinstance(o, ActionRow):
            cells.update(kind=KIND_ACTION, seq=o.seq, type=o.type, cause=o.cause, lastHeartbeat=o.last_heartbeat)
            cells.update(watermark=o.watermark, reason=o.reason)
        elif isinstance(o, RouteRow):
            cells.update(kind=KIND_ROUTE, seq=o.seq, type=o.type, cause=o.cause, raw=o.raw)
        else:
            cells.update(kind=KIND_ALERT, seq=o.seq, type=o.kind, severity=o.severity, state=o.state)
            cells["message"] = o.message
        yield _OUTPUT_ROW(*(cells.get(name) for name in _OUTPUT_NAMES))


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
    """:mod:`streaming.decide` on Spark's state and event-time timers, per broker bucket, node and admin key."""

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
        if k.startswith(BROKER_KEY):
            yield from _rows(self._brokers(k, events, watermark))
        elif k.startswith(NODE_KEY):
            yield from _rows(self._ticks(k[len(NODE_KEY) :], events))
        elif k.startswith(ADMIN_KEY):
            yield from _rows(admin_events(events))

    def _brokers(self, k: str, events: list[PackedEvent], watermark: int) -> list[Output]:
        bucket = Bucket.load(self.bucket.get())
        outputs: list[Output] = []
        refused = 0
        for name, group in _by_broker(events).items():
            held = bucket.get(name)
            if held is None and len(bucket) >= MAX_BROKERS_PER_BUCKET:
                refused += 1
                continue
            stored = functools.partial(self._stored_registration, name)
            st, out, registration = broker_events(held, group, watermark, self.settings, stored)
            if registration is not None:
                self.registrations.updateValue((name,), (registration,))
            if st is not None:
                bucket.put(name, st)
            outputs += out
        if refused:
            log.warning("state key %s holds %d brokers: %d new one(s) not monitored", k, len(bucket), refused)
        self._store(bucket)
        return outputs

    def _stored_registration(self, name: str) -> str | None:
        last = self.registrations.getValue((name,))
        return None if last is None else last[0]

    def _store(self, bucket: Bucket) -> None:
        """Write the bucket back, with a Spark timer at or before its earliest wake-up."""
        wake = bucket.next_wakeup()
        if wake != NO_TIMER and not any(t <= wake for t in bucket.timers):
            # an earlier timer, already set, is left alone: it wakes the bucket, which finds nothing due
            # and sets this one then. Later ones are not needed any more; they go, so the list stays
            # short (a wake-up only moves earlier on a comeback or a new broker)
            for later in bucket.timers:
                self.handle.deleteTimer(later)
            self.handle.registerTimer(wake)
            bucket.timers = [wake]
        if len(bucket):
            self.bucket.update(bucket.dump())
        else:
            self.bucket.clear()

    def _ticks(self, node: str, events: list[PackedEvent]) -> list[Output]:
        held = self.node.get()  # None when the state has no value
        st, outputs, wake = node_ticks(
            None if held is None else NodeState.from_tuple(held), node, events, self.settings
        )
        if wake is not None:
            st.deadline = self._arm_at(st.deadline, wake)
        self.node.update(astuple(st))
        return outputs

    # ------------------------------------------------------------------ timers

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        k: str = key[0]
        fired = expiredTimerInfo.getExpiryTimeInMs()
        watermark = timerValues.getCurrentWatermarkInMs()
        outputs: list[Output] = []
        if k.startswith(BROKER_KEY) and (held_bucket := self.bucket.get()) is not None:
            bucket = Bucket.load(held_bucket)
            if fired in bucket.timers:
                bucket.timers.remove(fired)  # Spark drops a timer once it fired
            for name in bucket.due(watermark):
                broker = bucket.get(name)
                assert broker is not None  # due() names only brokers it holds
                st, out = broker_timer(broker, watermark, self.settings)
                outputs += out
                if st is None:  # forgotten
                    bucket.remove(name)
                    self.registrations.removeKey((name,))
            self._store(bucket)
        elif k.startswith(NODE_KEY) and (held_node := self.node.get()) is not None:
            node = NodeState.from_tuple(held_node)
            if fired == node.deadline:
                node.deadline = NO_TIMER
                node, outputs, wake = node_timer(node, watermark, self.settings)
                if wake is not None:
                    node.deadline = self._arm_at(node.deadline, wake)
                self.node.update(astuple(node))
        yield from _rows(outputs)

    def _arm_at(self, current: int, wanted: int) -> int:
        """A node key's timer to keep, given the one set (``current``, or -1) and the wake-up now ``wanted``.

        A timer still earlier than the wanted wake-up is kept: when it fires, the handler finds the
        deadline not yet due and sets the next one. So ticks cost at most one wake-up per silence
        period instead of a timer delete and register each. A wake-up that moves *earlier* replaces it.
        """
        if current != NO_TIMER and current <= wanted:
            return current
        if current != NO_TIMER:
            self.handle.deleteTimer(current)
        self.handle.registerTimer(wanted)
        return wanted

    def close(self) -> None:
        pass
