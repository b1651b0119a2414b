"""Kafka records to checked events in bundles: the job's first step after the source.

The event schema is :mod:`common.contract`, shared with the nodes; this module only
decides which of its fields the job carries and how records become rows. Validation is the
schema's own ``decode_event``, run in Python workers by :func:`bundled_rows`, through a
``mapInArrow`` behind Spark's Kafka source (:func:`parse_events`). A record that fails it is
counted in its Arrow batch's report row (:func:`count_events`, dropped by :func:`valid_events`),
never an exception that would stop the query. The checked events of one Arrow batch travel in
bundles, one row per state key.

Every event gets a grouping ``key`` for the stateful step: one of :data:`STATE_BUCKETS` buckets
for a broker's events (by its cluster and address: the same address in two clusters is two
brokers, as in the route tables), one per node for its TICKs, and one per node for its ADMIN and
ORDER_TOPIC_CONF events (they only need to reach the route materialisation, in order).
"""

from __future__ import annotations

import functools
import logging
import zlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import orjson

from common.contract import (
    EVENT_FIELDS,
    Event,
    EventType,
    SchemaError,
    decode_event_values,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: the event fields the stateful step reads, as columns (types come from the shared schema)
LIVENESS_FIELDS: tuple[str, ...] = (
    "type",
    "node",
    "eventTime",
    "seq",
    "clusterName",
    "brokerName",
    "brokerId",
    "brokerAddr",
    "source",
    "heartbeatTimeoutMillis",
    "localScan",
)
#: event types whose whole JSON travels on (the route materialisation replays them)
RAW_TYPES = frozenset({EventType.REGISTER, EventType.ADMIN, EventType.ORDER_TOPIC_CONF})
#: event types keyed by node that go to the route materialisation unchanged
ROUTE_ONLY_TYPES = frozenset({EventType.ADMIN, EventType.ORDER_TOPIC_CONF})

#: the fields of an event the stateful step gets, in each bundle's JSON objects: the liveness fields
#: and the registration's raw JSON (see :func:`bundled_batch`)
PACKED_FIELDS: tuple[str, ...] = (*LIVENESS_FIELDS, "raw")
#: the column holding a bundle's events, a JSON array of objects with :data:`PACKED_FIELDS` (nulls written)
PACKED = "events"

BROKER_KEY = "broker:"
NODE_KEY = "node:"
ADMIN_KEY = "admin:"


#: brokers share state keys, this many of them. Spark's Python stateful API costs a few JVM round trips
#: per key and batch (read, write, timers: about 1 ms each), and a fleet sends something for every
#: broker every few seconds: with a key per broker that was most of a batch at 10,000 brokers. A
#: bucket holds its brokers' states in one value (see streaming.liveness). Changing the count
#: changes the state layout, so the job then starts a checkpoint of its own.
STATE_BUCKETS = 64


def broker_id(cluster_name: str, broker_addr: str) -> str:
    """A broker's name in the processor's state: cluster and address, as the route tables key it."""
    return f"{cluster_name}|{broker_addr}"


#: (cluster, address) -> its bucket's state key, for the brokers seen lately: a worker parses the same
#: brokers' heartbeats over and over, and a look-up is cheaper than the text, encoding and CRC of
#: each. Emptied when full, so made-up addresses cannot grow it without bound
_BUCKET_KEYS: dict[tuple[str, str], str] = {}
_BUCKET_KEYS_MAX = 65_536


def broker_key(cluster_name: str, broker_addr: str) -> str:
    """The state key of a broker's bucket (a stable hash: Python's own differs between processes)."""
    key = _BUCKET_KEYS.get((cluster_name, broker_addr))
    if key is None:
        bucket = zlib.crc32(broker_id(cluster_name, broker_addr).encode("utf-8", "surrogatepass")) % STATE_BUCKETS
        key = f"{BROKER_KEY}{bucket}"
        if len(_BUCKET_KEYS) >= _BUCKET_KEYS_MAX:
            _BUCKET_KEYS.clear()
        _BUCKET_KEYS[(cluster_name, broker_addr)] = key
    return key


_TICK = EventType.TICK  # (an enum's class attribute is dear to look up per event)


def _group_key(etype: EventType, node: str, cluster_name: str | None, broker_addr: str | None) -> str:
    if etype is _TICK:
        return NODE_KEY + node
    if etype in ROUTE_ONLY_TYPES:
        return ADMIN_KEY + node
    # the schema requires clusterName and brokerAddr for every other type
    return broker_key(cluster_name or "", broker_addr or "")


def group_key(event: Event) -> str:
    """Which state an event belongs to: its broker, or its node (TICK; ADMIN, ORDER_TOPIC_CONF)."""
    return _group_key(event.type, event.node, event.cluster_name, event.broker_addr)


#: JSON name -> Event attribute, from the schema's field table
_ATTRS = {f.name: f.attr for f in EVENT_FIELDS}


#: the columns of a parsed event row (:func:`parse_values`), in order
PARSED_COLUMNS: tuple[str, ...] = ("key", *LIVENESS_FIELDS, "raw", "error")
_LIVENESS_ATTRS = tuple(_ATTRS[c] for c in LIVENESS_FIELDS)
_NOTHING = (None,) * (len(PARSED_COLUMNS) - 1)


def parse_values(value: bytes | str | None) -> tuple[Any, ...]:
    """One Kafka record value as a row, a tuple in :data:`PARSED_COLUMNS` order; ``error`` says why it is not an event."""
    if value is None:
        return (*_NOTHING, "record without a value")
    try:
        # the checked values (what decode_event builds its Event of): the row needs a few of them
        values = decode_event_values(value)
    except SchemaError as exc:
        return (*_NOTHING, str(exc))
    etype = values["type"]
    raw = None
    if etype in RAW_TYPES:
        raw = value.decode("utf-8") if isinstance(value, bytes) else value
    get = values.get  # absent fields are missing from the values: None, as the Event has them
    key = _group_key(etype, values["node"], get("cluster_name"), get("broker_addr"))
    # type is an EventType, a str: Arrow and Spark take it as its text
    return (key, *map(get, _LIVENESS_ATTRS), raw, None)


def parse_record(value: bytes | str | None) -> dict[str, Any]:
    """One Kafka record value as a row (column -> value); ``error`` says why it is not an event."""
    row = dict(zip(PARSED_COLUMNS, parse_values(value), strict=True))
    if row["type"] is not None:
        row["type"] = str(row["type"])
    return row


#: the columns of a bundle row (:func:`bundle_ddl`), in order. A row is either a bundle (``key`` set):
#: ``count`` checked events of one state key from one read, ``eventTime`` the latest of them; or a
#: read's report (``key`` null) of its malformed records and of those stamped ahead of the clock
BUNDLE_COLUMNS: tuple[str, ...] = (
    "key", "eventTime", PACKED, "count", "bad", "ahead", "aheadNode", "aheadOtherNode", "aheadMax",
)  # fmt: skip
_BUNDLE_TYPES = ("STRING", "BIGINT", "STRING", "INT", "INT", "INT", "STRING", "STRING", "BIGINT")
#: a bundle is closed at this many bytes of its events' records and another begun for the same key: a
#: row stays far below Arrow's 2 GiB per column whatever the records hold
BUNDLE_MAX_BYTES = 8 << 20
#: node names in a report are cut to this many characters (they only name the culprit in an alert)
_NODE_NAME_SHOWN = 200


def bundle_ddl() -> str:
    """Columns of a bundle row (:data:`BUNDLE_COLUMNS`)."""
    return ", ".join(f"`{c}` {t}" for c, t in zip(BUNDLE_COLUMNS, _BUNDLE_TYPES, strict=True))


@functools.cache
def bundle_arrow_schema() -> pa.Schema:
    """The Arrow schema of :func:`bundle_ddl`, built without a JVM (a Python worker has none); once per process."""
    import pyarrow as pa

    arrow = {"STRING": pa.string(), "BIGINT": pa.int64(), "INT": pa.int32()}
    return pa.schema([(c, arrow[t]) for c, t in zip(BUNDLE_COLUMNS, _BUNDLE_TYPES, strict=True)])


def bundled_rows(values: Iterable[bytes | str | None], clock_ms: int, max_clock_skew_ms: int) -> list[tuple[Any, ...]]:
    """Record values -> bundle rows (:data:`BUNDLE_COLUMNS`): each value checked, keyed and packed.

    Spark's row-based transformWithState makes a Python object of every cell it is given, one at a
    time, which cost more than everything the processor does with an event; a bundle carries all of
    one read's events for a state key in one cell. Which events share a bundle changes nothing the
    job decides: Spark drops a row only when its latest event is at or before the watermark, and the
    processor drops each event at or before it (:func:`streaming.liveness.events_of`).

    An event stamped more than ``max_clock_skew_ms`` after ``clock_ms`` goes in no bundle, so it
    cannot move the watermark (the largest event time any node claims: one node's clock running
    ahead would otherwise expire the whole fleet); it is counted in the report with malformed records.
    ``clock_ms`` is fixed per micro-batch and kept in Spark's offset log (see the callers), so a
    replayed batch refuses exactly what it refused the first time.
    """
    limit = clock_ms + max_clock_skew_ms
    bundles: dict[str, tuple[list[dict[str, Any]], list[int]]] = {}  # key -> (events, [latest, bytes])
    rows: list[tuple[Any, ...]] = []
    errors: list[str] = []
    ahead_nodes: list[str] = []
    ahead_max: int | None = None
    for value in values:
        parsed = parse_values(value)
        if parsed[-1] is not None:
            errors.append(parsed[-1])
            continue
        key: str = parsed[0]
        event_time: int = parsed[_EVENT_TIME_AT]
        if event_time > limit:
            ahead_nodes.append(parsed[_NODE_AT][:_NODE_NAME_SHOWN])
            ahead_max = event_time if ahead_max is None else max(ahead_max, event_time)
            continue
        held = bundles.get(key)
        if held is None:
            held = bundles[key] = ([], [event_time, 0])
        events, meta = held
        events.append(dict(zip(PACKED_FIELDS, parsed[1:-1], strict=True)))
        if event_time > meta[0]:
            meta[0] = event_time
        meta[1] += len(value) if value is not None else 0
        if meta[1] >= BUNDLE_MAX_BYTES:
            rows.append(_bundle_row(key, events, meta[0]))
            del bundles[key]
    rows.extend(_bundle_row(key, events, meta[0]) for key, (events, meta) in bundles.items())
    if errors:
        # one line per read: a flood of bad records must not flood the log
        log.warning("skipping %d malformed event(s) of this read; first: %s", len(errors), errors[0])
    if errors or ahead_nodes:
        nodes = (max(ahead_nodes), min(ahead_nodes)) if ahead_nodes else (None, None)
        rows.append((None, None, None, 0, len(errors), len(ahead_nodes), *nodes, ahead_max))
    return rows


#: where parse_values puts event time and the node
_EVENT_TIME_AT = PARSED_COLUMNS.index("eventTime")
_NODE_AT = PARSED_COLUMNS.index("node")


def _bundle_row(key: str, events: list[dict[str, Any]], latest: int) -> tuple[Any, ...]:
    # orjson's UTF-8 bytes go into the Arrow string column as they are: a str in between cost ten times more
    return (key, latest, orjson.dumps(events), len(events), 0, 0, None, None, None)


def bundled_batch(values: Iterable[bytes | str | None], clock_ms: int, max_clock_skew_ms: int) -> pa.RecordBatch:
    """:func:`bundled_rows` as one Arrow batch of :func:`bundle_arrow_schema`."""
    import pyarrow as pa

    schema = bundle_arrow_schema()
    rows = bundled_rows(values, clock_ms, max_clock_skew_ms)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(BUNDLE_COLUMNS)
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)], schema=schema
    )


def bundle_arrow_batches(batches: Iterator[pa.RecordBatch], max_clock_skew_ms: int) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: batches with ``value`` and ``clock`` (the batch's time) in, bundle rows out."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        clock = batch.column(batch.schema.get_field_index("clock"))[0].as_py()
        values = batch.column(batch.schema.get_field_index("value")).to_pylist()
        yield bundled_batch(values, clock, max_clock_skew_ms)


def parse_events(records: DataFrame, max_clock_skew_ms: int) -> DataFrame:
    """Kafka source rows (``value`` binary) -> bundle rows (:func:`bundle_ddl`), in a ``mapInArrow``.

    The clock events may not run ahead of is the micro-batch's timestamp, which Spark keeps in its
    offset log: a replayed batch refuses the same events.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    # DDL is parsed by the JVM: here on the driver, for Spark; the workers build the Arrow schema themselves
    struct = StructType.fromDDL(bundle_ddl())
    assert isinstance(struct, StructType)  # fromDDL is typed on DataType; a struct's DDL gives a StructType
    body = functools.partial(bundle_arrow_batches, max_clock_skew_ms=max_clock_skew_ms)
    clock = F.unix_millis(F.current_timestamp()).alias("clock")
    return records.select("value", clock).mapInArrow(body, struct)


#: name of the observed metric; its columns are ``events``, ``bad``, ``latest`` and the ``ahead*`` ones below
EVENTS_METRIC = "events"


def count_events(bundles: DataFrame) -> DataFrame:
    """Report, per micro-batch, how many records arrived, how many were malformed, how many were ahead.

    The counts reach the progress logger (:mod:`streaming.progress`) in the query progress
    (``observedMetrics``); Spark's ``observe`` is exact across task retries, unlike an accumulator.
    For events ahead of the clock it also names two of the nodes that sent them (the greatest and
    the least name: ``observe`` allows no distinct or collecting aggregates) and the furthest claim;
    ``latest`` is the newest event time the batch read, which the MONITOR_HEARTBEAT that follows the
    batch tells the nodes it has decided through.
    """
    from pyspark.sql import functions as F

    def total(col: Any) -> Any:
        return F.coalesce(F.sum(col), F.lit(0))

    return bundles.observe(
        EVENTS_METRIC,
        total(F.col("count") + F.col("bad") + F.col("ahead")).alias("events"),
        total(F.col("bad")).alias("bad"),
        total(F.col("ahead")).alias("ahead"),
        F.max("aheadNode").alias("aheadNode"),
        F.min("aheadOtherNode").alias("aheadOtherNode"),
        F.max("aheadMax").alias("aheadMax"),
        F.max("eventTime").alias("latest"),
    )


def valid_events(bundles: DataFrame) -> DataFrame:
    """The bundles (key, latest event time, events); the reads' reports, already counted, dropped."""
    from pyspark.sql import functions as F

    return bundles.filter(F.col("key").isNotNull()).select("key", "eventTime", PACKED)
