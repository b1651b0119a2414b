"""Kafka as a Spark streaming source, through PySpark 4's Python Data Source API.

Theory of operation
-------------------
Spark's own Kafka connector (``format("kafka")``) is a JVM jar that is not always on the
classpath; this module gives the same shape in Python over kafka-python, registered as
``format("namesrv-kafka")``, with the connector's option names, so a job switches between
the two by changing one word (``streaming.config`` key ``source.format``).

Reading. The stream offset is a JSON object ``{topic: {partition: next offset}}`` (the shape
the native connector checkpoints). On the driver, ``latestOffset`` asks where each partition
ends; ``partitions`` cuts ``[start, end)`` ranges, one Spark task per partition (one task for all
of them while a batch holds fewer than ``coalesceBelowRecords`` records); ``read`` runs
in a Python worker, assigns one partition, seeks to ``start`` and yields Arrow record batches
until ``end``. Nothing is ever committed to Kafka and no consumer group is joined: Spark's
checkpoint is the only record of progress (Tansu's group join takes ~23 s and never splits
partitions). The end of a partition is the high watermark returned by a fetch, not
ListOffsets(LATEST), which Tansu answers wrongly; ``endOffsets=listoffsets`` switches to the
latter for brokers that answer it properly.

The job writes to Kafka from its ``foreachBatch`` sink on the driver (:mod:`streaming.job`), so
there is no writer here.

Options are read case-insensitively (Spark hands us lower-cased keys), and every
``kafka.<name>`` option is passed to kafka-python as ``<name>`` with dots turned into
underscores (``kafka.client.id`` -> ``client_id``), except the security settings
(``kafka.security.protocol``, ``kafka.sasl.*``, ``kafka.ssl.*``: the keys of
:data:`namesrv.kafka_clients.SECURITY_KEYS`, ``kafka.sasl.jaas.config`` included), which are read
and checked by :class:`~namesrv.kafka_clients.KafkaSecurity`, the one mapping to kafka-python's
arguments the nodes use too.  They travel to the workers inside :class:`KafkaOptions`, whose
``repr`` shows no secret.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

# both import only the standard library: this module runs inside Spark's Python workers
from namesrv import kafka_clients
from namesrv.kafka_clients import SECURITY_KEYS, KafkaSecurity, bootstrap_list
from namesrv.options import BOOLEAN_EXPECTED, ConfigError, integer, parse_bool

if TYPE_CHECKING:
    import pyarrow as pa
    from kafka import KafkaConsumer
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: the name this module registers; ``spark.readStream.format(FORMAT)``
FORMAT = "namesrv-kafka"
#: the columns of the native connector's source, in its order
SOURCE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset bigint, " "timestamp timestamp, timestampType int"
)

#: a stream offset: topic -> partition (as a string, JSON keys are strings) -> next offset; with
#: ``output=events`` an end offset also holds :data:`CLOCK_KEY`
Offsets = dict[str, dict[str, int]]
#: the end offset's entry for the driver's clock when it chose the batch (``{"ms": ...}``): the time
#: ``output=events`` checks event times against, kept with the offsets in Spark's offset log so a
#: replayed batch is read against the same time. ``@`` is no letter of a Kafka topic's name
CLOCK_KEY = "@clock"

_ARROW_BATCH_ROWS = 8192
#: ...or once the records read hold this many bytes: a batch's columns stay far below Arrow's 2 GiB
_ARROW_BATCH_BYTES = 256 << 20
_EARLIEST = "earliest"
_LATEST = "latest"
_END_OFFSET_MODES = ("highwater", "listoffsets")
_RECORDS, EVENTS = "records", "events"
_OUTPUTS = (_RECORDS, EVENTS)
_SECURITY_OPTIONS = frozenset(f"kafka.{k}" for k in SECURITY_KEYS)


class KafkaSourceError(RuntimeError):
    """The Kafka source cannot go on; the message says what to check or change."""


# --------------------------------------------------------------------------- options


def _flag(text: str, name: str) -> bool:
    try:
        return parse_bool(text)  # the one boolean syntax of every option table
    except ValueError:
        raise KafkaSourceError(f"option {name}={text!r} is not a valid {BOOLEAN_EXPECTED}") from None


def _int_option(text: str, name: str, minimum: int = 1) -> int:
    convert = integer(minimum)  # the one integer syntax of every option table
    try:
        return convert(text)
    except ValueError:
        raise KafkaSourceError(f"option {name}: {text!r} is not an {convert.expected}") from None


def _client_value(text: str) -> Any:
    # kafka-python wants ints for sizes and timeouts; the option map carries only strings
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        return int(stripped)
    if stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    return text


@dataclass(frozen=True)
class KafkaOptions:
    """The options of ``format("namesrv-kafka")``; names as in Spark's Kafka connector."""

    bootstrap_servers: str
    #: ``subscribe``: topics to read (comma separated)
    topics: tuple[str, ...] = ()
    #: ``startingOffsets``: earliest | latest | JSON {"topic": {"0": 42}} (-2 earliest, -1 latest)
    starting_offsets: str = _EARLIEST
    #: ``maxOffsetsPerTrigger``: records per micro-batch over all partitions (None: no limit)
    max_offsets_per_trigger: int | None = None
    #: ``endOffsets``: highwater (a fetch; safe on Tansu) | listoffsets
    end_offsets: str = "highwater"
    #: ``pollTimeoutMs``: give up reading a range when the broker returns nothing this long
    poll_timeout_ms: int = 30_000
    #: ``failOnDataLoss``: a range that is gone from the broker (retention) is an error
    fail_on_data_loss: bool = True
    #: ``coalesceBelowRecords``: a batch with fewer records than this is read by one task (see :meth:`partitions`)
    coalesce_below_records: int = 10_000
    #: ``output``: records (Spark's Kafka source columns, :data:`SOURCE_SCHEMA`) | events (each value parsed
    #: as a name-server event in the read and bundled, :func:`streaming.events.bundle_ddl`: the job's step 2
    #: done in the same Python worker, one JVM round trip fewer)
    output: str = "records"
    #: ``maxClockSkewMs`` (``output=events``): events stamped further ahead of the batch's clock are refused
    max_clock_skew_ms: int = 10_000
    #: every ``kafka.*`` option but bootstrap.servers and security, as kafka-python keyword arguments
    client_config: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    #: ``kafka.security.protocol``, ``kafka.sasl.*``, ``kafka.ssl.*``: TLS and SASL
    security: KafkaSecurity = KafkaSecurity()

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaOptions:
        # Spark lower-cases option names; normalise again so any mapping works the same way.
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        try:
            servers = bootstrap_list(opts.get("kafka.bootstrap.servers", ""), "option kafka.bootstrap.servers")
        except ConfigError as exc:
            raise KafkaSourceError(f"{exc}; e.g. .option('kafka.bootstrap.servers', '127.0.0.1:19092')") from None
        bootstrap = ",".join(servers)
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        end_mode = opts.get("endoffsets", "highwater").strip().lower()
        if end_mode not in _END_OFFSET_MODES:
            raise KafkaSourceError(f"option endOffsets: {end_mode!r} is not one of {_END_OFFSET_MODES}")
        max_per_trigger = opts.get("maxoffsetspertrigger")
        output = opts.get("output", _RECORDS).strip().lower() or _RECORDS
        if output not in _OUTPUTS:
            raise KafkaSourceError(f"option output: {output!r} is not one of {_OUTPUTS}")
        try:
            security = KafkaSecurity.from_settings(opts, prefix="kafka.", source="option")
        except ConfigError as exc:
            raise KafkaSourceError(str(exc)) from None
        client = tuple(
            sorted(
                (k[len("kafka.") :].replace(".", "_"), _client_value(v))
                for k, v in opts.items()
                if k.startswith("kafka.") and k != "kafka.bootstrap.servers" and k not in _SECURITY_OPTIONS
            )
        )
        return cls(
            bootstrap_servers=bootstrap,
            topics=topics,
            starting_offsets=opts.get("startingoffsets", _EARLIEST).strip() or _EARLIEST,
            max_offsets_per_trigger=(_int_option(max_per_trigger, "maxOffsetsPerTrigger") if max_per_trigger else None),
            end_offsets=end_mode,
            poll_timeout_ms=_int_option(opts.get("polltimeoutms", "30000"), "pollTimeoutMs"),
            fail_on_data_loss=_flag(opts.get("failondataloss", "true"), "failOnDataLoss"),
            coalesce_below_records=_int_option(opts.get("coalescebelowrecords", "10000"), "coalesceBelowRecords"),
            output=output,
            max_clock_skew_ms=_int_option(opts.get("maxclockskewms", "10000"), "maxClockSkewMs", minimum=0),
            client_config=client,
            security=security,
        )


def parse_offsets(text: str) -> Offsets:
    """A ``startingOffsets`` JSON value: ``{"topic": {"0": 42, "1": -2}}``."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise KafkaSourceError(
            f"startingOffsets {text!r} is neither earliest, latest nor JSON like " '{"namesrv-events": {"0": 0}}'
        ) from None
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise KafkaSourceError(f"startingOffsets {text!r}: expected {{topic: {{partition: offset}}}}")
    try:
        return {str(t): {str(int(p)): int(o) for p, o in parts.items()} for t, parts in raw.items()}
    except (TypeError, ValueError):
        raise KafkaSourceError(f"startingOffsets {text!r}: partitions and offsets must be integers") from None


def topic_offsets(offsets: Mapping[str, Any]) -> Offsets:
    """``offsets`` without the clock entry: topic -> partition -> offset."""
    return {t: parts for t, parts in offsets.items() if t != CLOCK_KEY}


def clock_of(offsets: Mapping[str, Any]) -> int | None:
    """The clock an end offset was stamped with (ms), or None (an offset from a version without it)."""
    entry = offsets.get(CLOCK_KEY)
    value = entry.get("ms") if isinstance(entry, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def split_limit(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Move ``end`` back so at most ``max_rows`` records lie between ``start`` and it.

    Each partition gets a share proportional to what it has waiting (at least one record when it
    has any and the budget allows), so a busy partition cannot starve the others.
    """
    pending = [
        (t, p, start.get(t, {}).get(p, 0), e)
        for t, parts in sorted(end.items())
        for p, e in sorted(parts.items(), key=lambda kv: int(kv[0]))
    ]
    total = sum(max(0, e - s) for _, _, s, e in pending)
    out: Offsets = {t: dict(parts) for t, parts in end.items()}
    if total <= max_rows:
        return out
    budget = max_rows
    for t, p, s, e in pending:
        waiting = max(0, e - s)
        share = min(waiting, budget, max(1, waiting * max_rows // total)) if waiting else 0
        out[t][p] = s + share
        budget -= share
    return out


# --------------------------------------------------------------------------- clients


def _consumer(opts: KafkaOptions, **overrides: Any) -> KafkaConsumer:
    config: dict[str, Any] = {
        "auto_offset_reset": "none",
        # Tansu answers a fetch with max wait 0 with no records at all; 10 ms works on both.
        "fetch_max_wait_ms": 10,
    }
    config.update(dict(opts.client_config))
    config.update(overrides)
    return kafka_clients.consumer(
        opts.bootstrap_servers, key="kafka.bootstrap.servers", security=opts.security, **config
    )


class _ClientPool:
    """Kafka clients kept per Python worker between tasks: a connection costs more than a batch.

    Python workers are reused across tasks, so a consumer made for one micro-batch serves the
    next; nothing about a partition's position is kept, each task seeks explicitly.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._consumers: dict[KafkaOptions, list[KafkaConsumer]] = {}

    def take_consumer(self, opts: KafkaOptions) -> KafkaConsumer:
        with self._lock:
            idle = self._consumers.get(opts)
            if idle:
                return idle.pop()
        return _consumer(opts)

    def give_back(self, opts: KafkaOptions, consumer: KafkaConsumer) -> None:
        with self._lock:
            self._consumers.setdefault(opts, []).append(consumer)


_POOL = _ClientPool()


# --------------------------------------------------------------------------- source


@dataclass(frozen=True)
class KafkaInputPartition(InputPartition):
    """One Spark task: records ``[start, end)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int
    #: the batch's clock (``output=events``; see :data:`CLOCK_KEY`), None to read the worker's
    clock_ms: int | None = None


@dataclass(frozen=True)
class KafkaRanges(InputPartition):
    """One Spark task reading several ranges one after the other (a small batch; see ``partitions``)."""

    ranges: tuple[KafkaInputPartition, ...]


def _topic_partitions(consumer: KafkaConsumer, topics: Sequence[str], timeout_s: float) -> list[Any]:
    from kafka import TopicPartition

    deadline = time.monotonic() + timeout_s
    out: list[Any] = []
    for topic in topics:
        parts = consumer.partitions_for_topic(topic)
        while not parts and time.monotonic() < deadline:
            # metadata for a topic arrives asynchronously the first time it is asked for
            consumer.poll(timeout_ms=50)
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise KafkaSourceError(
                f"topic {topic!r} does not exist on {consumer.config['bootstrap_servers']}; "
                "create it (python -m infra.services topics) or fix the subscribe option"
            )
        out.extend(TopicPartition(topic, p) for p in sorted(parts))
    return out


def _to_offsets(by_tp: Mapping[Any, int]) -> Offsets:
    out: Offsets = {}
    for tp, offset in by_tp.items():
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offset)
    return out


def _fresh_highwaters(consumer: Any, tps: list[Any], deadline: float) -> dict[Any, int | None]:
    """High watermarks from fetch responses that arrive after this call (None: none came in time)."""
    for tp in tps:
        # kafka-python keeps the last response's mark across a seek; forget it so we see the next one
        # (kafka-python 3.0.12, pinned: TopicPartitionState.highwater)
        consumer._subscription.assignment[tp].highwater = None
    while True:
        consumer.poll(timeout_ms=50, max_records=1)
        marks = {tp: consumer.highwater(tp) for tp in tps}
        if all(m is not None for m in marks.values()) or time.monotonic() >= deadline:
            return marks
        # A response's records stay buffered and are handed out one a poll, and the next response
        # (the other partitions' marks) is looked at only once they are: a backlog of 100,000
        # records took 100,000 polls (6-13 s of every batch that found one). Past a partition's
        # mark nothing is wanted from it: the seek drops what is buffered, and a response to a fetch
        # from before the seek is discarded without touching the mark.
        for tp, mark in marks.items():
            if mark is not None and consumer.position(tp) < mark:
                consumer.seek(tp, mark)


class KafkaStreamReader(DataSourceStreamReader):
    """The driver side of the source (offsets, planning) plus ``read``, which runs in workers."""

    def __init__(self, opts: KafkaOptions) -> None:
        if not opts.topics:
            raise KafkaSourceError("option subscribe is required: the topic(s) to read, comma separated")
        self.opts = opts
        self._consumer: KafkaConsumer | None = None
        #: the last end offset learnt per partition; a fetch from there only returns new records
        self._known_end: dict[Any, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        # read() runs on a pickled copy in a worker; the driver's consumer stays behind
        state = dict(self.__dict__)
        state["_consumer"] = None
        state["_known_end"] = {}
        return state

    # -- driver side

    def _driver_consumer(self) -> KafkaConsumer:
        if self._consumer is None:
            # it fetches only for the high watermark and never reads the records: no CRC to check
            self._consumer = _consumer(self.opts, max_partition_fetch_bytes=64 * 1024, check_crcs=False)
        return self._consumer

    def _partitions(self) -> list[Any]:
        consumer = self._driver_consumer()
        tps = _topic_partitions(consumer, self.opts.topics, self.opts.poll_timeout_ms / 1000)
        if set(tps) != consumer.assignment():
            consumer.assign(tps)
        return tps

    def _end_offsets(self, tps: list[Any], start: Mapping[Any, int]) -> dict[Any, int]:
        consumer = self._driver_consumer()
        if self.opts.end_offsets == "listoffsets":
            return {tp: int(o) for tp, o in consumer.end_offsets(tps).items()}
        # The high watermark rides on every fetch response. Fetch from the furthest point
        # known, so only records that arrived since the last call travel; the first
        # response for a partition may take a poll or two.
        for tp in tps:
            consumer.seek(tp, max(self._known_end.get(tp, 0), start.get(tp, 0)))
        deadline = time.monotonic() + self.opts.poll_timeout_ms / 1000
        # A fetch sent before this call may still be in flight and answer with an old mark, so
        # wait for two rounds of answers: the second round's fetches were all sent after we began.
        marks = _fresh_highwaters(consumer, tps, deadline)
        if all(m is not None for m in marks.values()):
            for tp in tps:  # drop what the first round left buffered (see _fresh_highwaters)
                consumer.seek(tp, max(int(marks[tp] or 0), start.get(tp, 0)))
            marks = _fresh_highwaters(consumer, tps, deadline)
        ends = {}
        for tp in tps:
            mark = marks[tp]
            # no answer yet: report no progress rather than guess
            end = start.get(tp, 0) if mark is None else max(int(mark), start.get(tp, 0))
            self._known_end[tp] = end
            ends[tp] = end
        return ends

    def _as_tp_map(self, offsets: Offsets, tps: list[Any]) -> dict[Any, int]:
        return {tp: offsets.get(tp.topic, {}).get(str(tp.partition), 0) for tp in tps}

    def initialOffset(self) -> dict:
        tps = self._partitions()
        consumer = self._driver_consumer()
        mode = self.opts.starting_offsets.lower()
        if mode == _EARLIEST:
            return _to_offsets(consumer.beginning_offsets(tps))
        if mode == _LATEST:
            return _to_offsets(self._end_offsets(tps, {}))
        wanted = parse_offsets(self.opts.starting_offsets)
        begin = consumer.beginning_offsets(tps)
        latest = self._end_offsets(tps, {})
        chosen = {}
        for tp in tps:
            o = wanted.get(tp.topic, {}).get(str(tp.partition), -2)
            chosen[tp] = begin[tp] if o == -2 else latest[tp] if o == -1 else o
        return _to_offsets(chosen)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        tps = self._partitions()
        begin = self._as_tp_map(start, tps)
        end: dict[str, Any] = _to_offsets(self._end_offsets(tps, begin))
        if isinstance(limit, ReadMaxRows):
            end = split_limit(topic_offsets(start), end, limit.max_rows)
        if self.opts.output != EVENTS:
            return end
        if end == topic_offsets(start):
            return start  # nothing new: the same offset, clock and all, or Spark would run an empty batch
        return {**end, CLOCK_KEY: {"ms": int(time.time() * 1000)}}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        """One task per partition with new records; a single task for them all in a small batch.

        A steady monitor's batch holds a few hundred records: one task reads them faster than
        several, each of which Spark must schedule and hand to a Python worker, and the batch's
        duration is what expiry latency is made of. A backlog is still read in parallel.
        """
        out = []
        clock = clock_of(end)
        for topic, parts in sorted(topic_offsets(end).items()):
            for p, e in sorted(parts.items(), key=lambda kv: int(kv[0])):
                s = start.get(topic, {}).get(p, 0)
                if e > s:
                    out.append(KafkaInputPartition(topic, int(p), int(s), int(e), clock))
        if len(out) > 1 and sum(r.end - r.start for r in out) < self.opts.coalesce_below_records:
            return [KafkaRanges(tuple(out))]
        return out

    def commit(self, end: dict) -> None:
        # Spark's checkpoint holds progress; Kafka is never told (no consumer group).
        pass

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # -- worker side

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, KafkaRanges):
            for part in partition.ranges:
                yield from read_range(self.opts, part)
            return
        assert isinstance(partition, KafkaInputPartition)
        yield from read_range(self.opts, partition)


def _record_batch(records: list[Any], part: KafkaInputPartition, opts: KafkaOptions) -> pa.RecordBatch:
    """Kafka records as Spark's Kafka source columns (:data:`SOURCE_SCHEMA`)."""
    import pyarrow as pa

    n = len(records)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.key for r in records], pa.binary()),
            pa.array([r.value for r in records], pa.binary()),
            pa.array([part.topic] * n, pa.string()),
            pa.array([part.partition] * n, pa.int32()),
            pa.array([r.offset for r in records], pa.int64()),
            # Spark wants microseconds in the session time zone; the job runs in UTC
            pa.array(
                [None if r.timestamp is None else r.timestamp * 1000 for r in records], pa.timestamp("us", tz="UTC")
            ),
            pa.array([r.timestamp_type for r in records], pa.int32()),
        ],
        names=["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"],
    )


def _event_batch(records: list[Any], part: KafkaInputPartition, opts: KafkaOptions) -> pa.RecordBatch:
    """Kafka records as bundles of checked name-server events (``output=events``; :func:`streaming.events.bundle_ddl`)."""
    from streaming import events  # the job's parse step; imports only the event schema

    clock = part.clock_ms if part.clock_ms is not None else int(time.time() * 1000)
    return events.bundled_batch([r.value for r in records], clock, opts.max_clock_skew_ms)


def schema_of(opts: KafkaOptions) -> str:
    """The source's columns for these options (DDL)."""
    if opts.output == EVENTS:
        from streaming.events import bundle_ddl

        return bundle_ddl()
    return SOURCE_SCHEMA


def read_range(opts: KafkaOptions, part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Records ``[part.start, part.end)`` of one partition, as Arrow batches in offset order."""
    from kafka import TopicPartition
    from kafka.errors import OffsetOutOfRangeError

    tp = TopicPartition(part.topic, part.partition)
    consumer = _POOL.take_consumer(opts)
    healthy = False
    try:
        consumer.assign([tp])
        consumer.seek(tp, part.start)
        records: list[Any] = []
        held_bytes = 0
        to_batch = _event_batch if opts.output == EVENTS else _record_batch
        position = part.start
        last_progress = time.monotonic()
        while position < part.end:
            try:
                polled = consumer.poll(timeout_ms=200, max_records=_ARROW_BATCH_ROWS)
            except OffsetOutOfRangeError:
                earliest = consumer.beginning_offsets([tp])[tp]
                if position < earliest < part.end:
                    if opts.fail_on_data_loss:
                        raise KafkaSourceError(
                            f"{part.topic}[{part.partition}]: offsets {position}..{earliest} are gone from "
                            f"the broker (retention); set failOnDataLoss=false to skip them"
                        ) from None
                    log.warning(
                        "%s[%d]: offsets %d..%d are gone; skipping them", part.topic, part.partition, position, earliest
                    )
                    consumer.seek(tp, earliest)
                    continue
                if opts.fail_on_data_loss:
                    raise KafkaSourceError(
                        f"{part.topic}[{part.partition}]: offsets {position}..{part.end} are not on the "
                        f"broker {opts.bootstrap_servers} (its earliest is {earliest}): was the topic recreated "
                        "or the broker's data wiped (Tansu keeps nothing across restarts)? Start with a new "
                        "checkpoint, or set failOnDataLoss=false to skip the range"
                    ) from None
                log.warning(
                    "%s[%d]: offsets %d..%d are not on the broker; skipping them",
                    part.topic,
                    part.partition,
                    position,
                    part.end,
                )
                break
            for record in polled.get(tp, ()):
                if record.offset >= part.end:
                    break
                records.append(record)
                held_bytes += len(record.value or b"")
            # the position also moves over gaps (compaction, transaction markers)
            new_position = consumer.position(tp)
            if new_position > position:
                position = new_position
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > opts.poll_timeout_ms / 1000:
                raise KafkaSourceError(
                    f"{part.topic}[{part.partition}]: no records past offset {position} for "
                    f"{opts.poll_timeout_ms} ms though the range ends at {part.end}; is the broker "
                    f"{opts.bootstrap_servers} up? (option pollTimeoutMs)"
                )
            if len(records) >= _ARROW_BATCH_ROWS or held_bytes >= _ARROW_BATCH_BYTES:
                yield to_batch(records, part, opts)
                records = []
                held_bytes = 0
        if records:
            yield to_batch(records, part, opts)
        healthy = True
    finally:
        if healthy:
            _POOL.give_back(opts, consumer)
        else:
            consumer.close()


# --------------------------------------------------------------------------- the data source


class KafkaDataSource(DataSource):
    """``format("namesrv-kafka")``: Kafka records over kafka-python, options as Spark's connector."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return schema_of(KafkaOptions.from_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(KafkaOptions.from_options(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("namesrv-kafka")`` available in this session (workers import this module)."""
    spark.dataSource.register(KafkaDataSource)
