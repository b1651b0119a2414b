"""Kafka records to checked events: the job's first step after the source.

The event schema is :mod:`namesrv.events.schema`, shared with the nodes; this module only
decides which of its fields the job carries as columns and how a record becomes a row.
Validation is the schema's own ``decode_event``, run in Python workers by :func:`parsed_batch`:
inside the ``namesrv-kafka`` source's own read (option ``output=events``, what the job uses), or
through ``mapInArrow`` behind Spark's ``kafka`` format. A record that fails it becomes a row with
``error`` set (counted by :func:`count_events` and dropped by :func:`valid_events`), never an
exception that would stop the query.

Every row gets a grouping ``key`` for the stateful step: one of :data:`STATE_BUCKETS` buckets
for a broker's events (by its cluster and address: the same address in two clusters is two
brokers, as in the route tables), one per node for its TICKs, and one per node for its ADMIN and
ORDER_TOPIC_CONF events (they only need to reach the route materialisation, in order).
"""

from __future__ import annotations

import functools
import logging
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from namesrv.events.schema import (
    EVENT_FIELDS,
    Event,
    EventType,
    SchemaError,
    decode_event_values,
    event_field_types,
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

#: the column that carries an event's fields to the stateful step as one JSON object (see
#: :func:`streaming.job.decide`): Spark's row-based transformWithState turns every cell of its input
#: into a Python object on its own (a pyarrow scalar and ``as_py``), which cost more than everything
#: the processor does with the event
PACKED = "event"
#: the fields packed: the liveness fields and the registration's raw JSON
PACKED_FIELDS: tuple[str, ...] = (*LIVENESS_FIELDS, "raw")

BROKER_KEY = "broker:"
NODE_KEY = "node:"
ADMIN_KEY = "admin:"


def parsed_ddl() -> str:
    """Columns of a parsed event row: key, the liveness fields, raw JSON, and error."""
    types = event_field_types()
    cols = [f"`{name}` {types[name]}" for name in LIVENESS_FIELDS]
    return ", ".join(["`key` STRING", *cols, "`raw` STRING", "`error` STRING"])


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


#: the columns of a parsed event row (:func:`parsed_ddl`), in order
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


def parsed_batch(values: list[bytes | str | None], schema: pa.Schema) -> pa.RecordBatch:
    """Record values -> one Arrow batch of ``schema`` (:func:`parsed_ddl`), bad ones flagged; logs them once."""
    import pyarrow as pa

    rows = [parse_values(v) for v in values]
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(PARSED_COLUMNS)
    errors = columns[-1]
    if rows and any(e is not None for e in errors):
        bad = [e for e in errors if e is not None]
        # one line per batch: a flood of bad records must not flood the log
        log.warning("skipping %d malformed event(s) of %d; first: %s", len(bad), len(rows), bad[0])
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)], schema=schema
    )


def parse_arrow_batches(batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` body: batches with a ``value`` column in, rows of ``schema`` (:func:`parsed_ddl`) out."""
    for batch in batches:
        yield parsed_batch(batch.column(batch.schema.get_field_index("value")).to_pylist(), schema)


@functools.cache
def parsed_arrow_schema() -> pa.Schema:
    """The Arrow schema of :func:`parsed_ddl`, built without a JVM (a Python worker has none); once
    per process, not once per batch the source reads."""
    import pyarrow as pa

    arrow = {"STRING": pa.string(), "BIGINT": pa.int64(), "INT": pa.int32(), "BOOLEAN": pa.bool_()}
    types = event_field_types()
    return pa.schema([(c, arrow["STRING" if c in ("key", "raw", "error") else types[c]]) for c in PARSED_COLUMNS])


def is_parsed(records: DataFrame) -> bool:
    """True for rows the source parsed already (``format("namesrv-kafka")`` with ``output=events``)."""
    return tuple(records.columns) == PARSED_COLUMNS


def parse_events(records: DataFrame) -> DataFrame:
    """Kafka source rows (``value`` binary) -> parsed rows (:func:`parsed_ddl`), bad ones flagged.

    Rows the source parsed in its own read (:func:`is_parsed`: the job's ``namesrv-kafka`` source)
    pass as they are: the same :func:`parsed_batch` ran there, a JVM-Python round trip earlier.
    """
    if is_parsed(records):
        return records
    from pyspark.sql.types import StructType

    # DDL is parsed by the JVM: here on the driver, for Spark; the workers build the Arrow schema themselves
    struct = StructType.fromDDL(parsed_ddl())
    assert isinstance(struct, StructType)  # fromDDL is typed on DataType; a struct's DDL gives a StructType
    body = functools.partial(parse_arrow_batches, schema=parsed_arrow_schema())
    return records.select("value").mapInArrow(body, struct)


#: name of the observed metric; its columns are ``events``, ``bad`` and the ``ahead*`` ones below
EVENTS_METRIC = "events"
#: node names in the metric are cut to this many characters (they only name the culprit in an alert)
_NODE_NAME_SHOWN = 200


def ahead_of_clock(max_clock_skew_ms: int) -> Any:
    """True for a valid event stamped more than ``max_clock_skew_ms`` after the job's clock.

    The clock is the micro-batch's timestamp (``current_timestamp()``), which Spark keeps in the
    offset log, so a replayed batch refuses exactly what it refused the first time. Event time is
    the largest time any node claims: one node's clock running ahead (a TICK stamped in 2100)
    would otherwise move the watermark for everyone and expire the whole fleet.
    """
    from pyspark.sql import functions as F

    limit = F.unix_millis(F.current_timestamp()) + F.lit(max_clock_skew_ms)
    return F.col("error").isNull() & (F.col("eventTime") > limit)


def count_events(parsed: DataFrame, max_clock_skew_ms: int) -> DataFrame:
    """Report, per micro-batch, how many records arrived, how many were malformed, how many were ahead.

    The counts reach :class:`streaming.job.ProgressLogger` in the query progress
    (``observedMetrics``); Spark's ``observe`` is exact across task retries, unlike an accumulator.
    For events ahead of the clock it also names two of the nodes that sent them (the greatest and
    the least name: ``observe`` allows no distinct or collecting aggregates) and the furthest claim.
    """
    from pyspark.sql import functions as F

    ahead = ahead_of_clock(max_clock_skew_ms)
    node = F.substring(F.col("node"), 1, _NODE_NAME_SHOWN)
    return parsed.observe(
        EVENTS_METRIC,
        F.count(F.lit(1)).alias("events"),
        F.count(F.col("error")).alias("bad"),
        F.count(F.when(ahead, F.lit(1))).alias("ahead"),
        F.max(F.when(ahead, node)).alias("aheadNode"),
        F.min(F.when(ahead, node)).alias("aheadOtherNode"),
        F.max(F.when(ahead, F.col("eventTime"))).alias("aheadMax"),
    )


def valid_events(parsed: DataFrame, max_clock_skew_ms: int) -> DataFrame:
    """Drop the malformed rows and those stamped ahead of the job's clock (both already counted)."""
    from pyspark.sql import functions as F

    return parsed.filter(F.col("error").isNull() & ~ahead_of_clock(max_clock_skew_ms)).drop("error")
