"""The Kafka data source's reader, called directly (as Spark calls it) on real brokers: noida-db and Tansu.

Its options and offset arithmetic are tested without a broker in tests/unit/test_streaming_kafka_io.py.
"""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from infra.services import KafkaService, TopicSpec, free_port
from namesrv import kafka_clients
from streaming.kafka_io import (
    KafkaDataSource,
    KafkaInputPartition,
    KafkaOptions,
    KafkaRanges,
    KafkaSourceError,
    KafkaStreamReader,
    read_range,
)


@pytest.fixture(scope="module", params=["noida", "tansu"])
def kafka(request, tmp_path_factory):
    run = tmp_path_factory.mktemp(request.param)
    svc = KafkaService(
        port=free_port(),
        run_dir=run,
        backend=request.param,
        data_dir=run / "data",
        topics=[TopicSpec("ev", 2), TopicSpec("out", 1)],
    )
    svc.start()
    yield svc
    svc.stop()


def reader(kafka, **options) -> KafkaStreamReader:
    src = KafkaDataSource(
        CaseInsensitiveDict({"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": "ev", **options})
    )
    return src.streamReader(src.schema())


def test_the_reader_plans_and_reads_exactly_the_new_records(kafka):
    r = reader(kafka)
    try:
        start = r.initialOffset()
        producer = kafka_clients.producer(kafka.bootstrap_servers)
        for i in range(30):
            producer.send("ev", key=b"k", value=b"v%d" % i, partition=i % 2)
        producer.flush()
        end = r.latestOffset(start, ReadAllAvailable())
        assert sum(end["ev"][p] - start["ev"][p] for p in ("0", "1")) == 30
        # a small batch is one task reading both ranges; a big one a task per partition
        (small,) = r.partitions(start, end)
        assert isinstance(small, KafkaRanges)
        assert [(p.partition, p.end - p.start) for p in small.ranges] == [(0, 15), (1, 15)]
        parts = reader(kafka, coalesceBelowRecords="30").partitions(start, end)
        assert [(p.partition, p.end - p.start) for p in parts] == [(0, 15), (1, 15)]
        # read() runs on a pickled copy in a worker
        import pickle

        worker = pickle.loads(pickle.dumps(r))
        for tasks in ([small], parts):
            rows = [row for p in tasks for b in worker.read(p) for row in b.to_pylist()]
            assert sorted(row["value"] for row in rows) == sorted(b"v%d" % i for i in range(30))
        assert {row["topic"] for row in rows} == {"ev"} and all(row["key"] == b"k" for row in rows)
        # nothing new: the end stays where it was
        assert r.latestOffset(end, ReadAllAvailable()) == end
        # a limit moves the end only part of the way
        for _ in range(10):
            producer.send("ev", value=b"w", partition=0)
        producer.flush()
        limited = r.latestOffset(end, ReadMaxRows(4))
        assert limited["ev"]["0"] - end["ev"]["0"] == 4
        producer.close()
    finally:
        r.stop()


def test_latest_starts_after_what_is_there(kafka):
    r = reader(kafka, startingOffsets="latest")
    try:
        first = r.initialOffset()
        assert r.latestOffset(first, ReadAllAvailable()) == first
    finally:
        r.stop()


def test_a_missing_topic_or_subscription_is_named(kafka):
    with pytest.raises(KafkaSourceError, match="subscribe is required"):
        KafkaStreamReader(KafkaOptions(bootstrap_servers=kafka.bootstrap_servers))
    r = reader(kafka, subscribe="no-such-topic", pollTimeoutMs="1000")
    try:
        with pytest.raises(KafkaSourceError, match="topic 'no-such-topic' does not exist"):
            r.initialOffset()
    finally:
        r.stop()


def test_a_range_the_broker_does_not_have_is_an_error_or_skipped_on_request(kafka):
    # what a checkpoint meets after Tansu restarts empty or a topic is recreated
    part = KafkaInputPartition("out", 0, 10_000, 10_001)
    opts = KafkaOptions(bootstrap_servers=kafka.bootstrap_servers, poll_timeout_ms=2_000)
    with pytest.raises(KafkaSourceError, match="not on the broker|no records past offset"):
        list(read_range(opts, part))
    lenient = KafkaOptions(bootstrap_servers=kafka.bootstrap_servers, poll_timeout_ms=2_000, fail_on_data_loss=False)
    if kafka.backend == "noida":  # Tansu answers nothing at all there, so only the timeout can tell
        assert list(read_range(lenient, part)) == []


def test_every_call_sees_the_records_produced_before_it(kafka):
    # regression: the high watermark of the previous call's fetch was reported as the end
    r = reader(kafka, startingOffsets="latest")
    producer = kafka_clients.producer(kafka.bootstrap_servers)
    try:
        end = r.initialOffset()
        for round_ in range(6):
            for i in range(20):
                producer.send("ev", value=b"r%d-%d" % (round_, i), partition=i % 2)
            producer.flush()
            new = r.latestOffset(end, ReadAllAvailable())
            assert sum(new["ev"][p] - end["ev"][p] for p in ("0", "1")) == 20, round_
            end = new
    finally:
        producer.close()
        r.stop()


def test_events_output_stamps_a_clock_on_a_moved_end_and_reads_bundles_against_it(kafka):
    """``output=events``: the end offset carries the driver's clock, which the read checks event times
    against (kept in Spark's offset log, so a replayed batch refuses what it refused the first time)."""
    import pickle
    import time

    import orjson

    from namesrv.events.schema import Event, EventType, encode_event
    from streaming.kafka_io import CLOCK_KEY, clock_of, topic_offsets

    r = reader(kafka, output="events", maxClockSkewMs="10000", coalesceBelowRecords="1000000", startingOffsets="latest")
    try:
        start = r.initialOffset()
        assert r.latestOffset(start, ReadAllAvailable()) == start  # nothing new: no new clock either
        now = int(time.time() * 1000)
        producer = kafka_clients.producer(kafka.bootstrap_servers)
        ticks = [Event(type=EventType.TICK, node="n1", event_time=now + i, seq=i) for i in range(5)]
        ahead = Event(type=EventType.TICK, node="n9", event_time=now + 60_000, seq=9)
        for i, e in enumerate([*ticks, ahead]):
            producer.send("ev", value=encode_event(e), partition=i % 2)
        producer.send("ev", value=b"junk", partition=0)
        producer.flush()
        before = int(time.time() * 1000)
        end = r.latestOffset(start, ReadAllAvailable())
        clock = clock_of(end)
        assert clock is not None and before <= clock <= int(time.time() * 1000) and set(end) == {"ev", CLOCK_KEY}
        assert sum(topic_offsets(end)["ev"][p] - start["ev"][p] for p in ("0", "1")) == 7
        assert r.latestOffset(end, ReadAllAvailable()) == end  # the same offset, clock and all
        (task,) = r.partitions(start, end)
        assert {p.clock_ms for p in task.ranges} == {clock}
        rows = [row for b in pickle.loads(pickle.dumps(r)).read(task) for row in b.to_pylist()]
        # a bundle per key and partition read: node n1's ticks in two, each at its latest event's time
        bundles = [row for row in rows if row["key"] is not None]
        assert {b["key"] for b in bundles} == {"node:n1"} and sum(b["count"] for b in bundles) == 5
        for b in bundles:
            inside = orjson.loads(b["events"])
            assert b["count"] == len(inside) and b["eventTime"] == max(e["eventTime"] for e in inside)
        assert sorted(e["seq"] for b in bundles for e in orjson.loads(b["events"])) == [0, 1, 2, 3, 4]
        # the junk and the tick from a minute ahead are in no bundle, only in the reads' reports
        reports = [row for row in rows if row["key"] is None]
        assert sum(x["bad"] for x in reports) == 1 and sum(x["ahead"] for x in reports) == 1
        assert [(x["aheadNode"], x["aheadMax"]) for x in reports if x["ahead"]] == [("n9", now + 60_000)]
        # a replay of the batch plans the same clock from the offset log's end
        (replayed,) = r.partitions(start, dict(end))
        assert {p.clock_ms for p in replayed.ranges} == {clock}
        producer.close()
    finally:
        r.stop()
