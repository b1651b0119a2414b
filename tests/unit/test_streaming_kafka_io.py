"""The Kafka data source's reader and writer, called directly (as Spark calls them) on real brokers."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from infra.services import KafkaService, TopicSpec, free_port
from namesrv import kafka_clients
from streaming.kafka_io import (
    KafkaDataSource,
    KafkaInputPartition,
    KafkaOptions,
    KafkaSourceError,
    KafkaStreamReader,
    parse_offsets,
    produce_batches,
    read_range,
    split_limit,
)


def test_options_are_case_insensitive_and_kafka_keys_reach_kafka_python():
    # Spark hands a data source a case-insensitive map with lower-cased keys
    opts = KafkaOptions.from_options(CaseInsensitiveDict({
        "kafka.bootstrap.servers": "h:1", "subscribe": "a, b", "startingOffsets": "latest",
        "maxOffsetsPerTrigger": "100", "kafka.client.id": "x", "kafka.request.timeout.ms": "5000",
        "failOnDataLoss": "false",
    }))  # fmt: skip
    assert opts.topics == ("a", "b") and opts.starting_offsets == "latest"
    assert opts.max_offsets_per_trigger == 100 and not opts.fail_on_data_loss
    assert dict(opts.client_config) == {"client_id": "x", "request_timeout_ms": 5000}
    assert KafkaOptions.from_options({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "SUBSCRIBE": "t"}).topics == ("t",)
    with pytest.raises(KafkaSourceError, match="kafka.bootstrap.servers='' .* names no server"):
        KafkaOptions.from_options({})
    assert KafkaOptions.from_options({"kafka.bootstrap.servers": " h:1, ,h:2 "}).bootstrap_servers == "h:1,h:2"
    # the one boolean syntax of every option table: yes and 1 are refused, as in the node's and the job's files
    for flag in ("yes", "1", "no", "0"):
        with pytest.raises(KafkaSourceError, match=f"failOnDataLoss='{flag}' is not a valid boolean"):
            KafkaOptions.from_options({"kafka.bootstrap.servers": "h:1", "failOnDataLoss": flag})
    lenient = KafkaOptions.from_options({"kafka.bootstrap.servers": "h:1", "failOnDataLoss": " FALSE "})
    assert lenient.fail_on_data_loss is False
    with pytest.raises(KafkaSourceError, match="maxOffsetsPerTrigger"):
        KafkaOptions.from_options({"kafka.bootstrap.servers": "h:1", "maxOffsetsPerTrigger": "-1"})


def test_starting_offsets_json():
    assert parse_offsets('{"t": {"0": 5, "1": -2}}') == {"t": {"0": 5, "1": -2}}
    with pytest.raises(KafkaSourceError, match="neither earliest"):
        parse_offsets("soon")


def test_a_limit_is_shared_between_partitions_by_what_they_have_waiting():
    start = {"t": {"0": 0, "1": 10, "2": 5}}
    end = {"t": {"0": 100, "1": 10, "2": 25}}
    limited = split_limit(start, end, 60)
    waiting = sum(limited["t"][p] - start["t"][p] for p in "012")
    assert waiting <= 60 and limited["t"]["0"] > limited["t"]["2"] - 5 > 0 and limited["t"]["1"] == 10
    assert split_limit(start, end, 1000) == end


@pytest.fixture(scope="module", params=["noida", "tansu"])
def kafka(request, tmp_path_factory):
    run = tmp_path_factory.mktemp(request.param)
    svc = KafkaService(port=free_port(), run_dir=run, backend=request.param, data_dir=run / "data",
                       topics=[TopicSpec("ev", 2), TopicSpec("out", 1)])
    svc.start()
    yield svc
    svc.stop()


def reader(kafka, **options) -> KafkaStreamReader:
    src = KafkaDataSource(CaseInsensitiveDict({"kafka.bootstrap.servers": kafka.bootstrap_servers,
                                               "subscribe": "ev", **options}))
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
        parts = r.partitions(start, end)
        assert [(p.partition, p.end - p.start) for p in parts] == [(0, 15), (1, 15)]
        # read() runs on a pickled copy in a worker
        import pickle

        worker = pickle.loads(pickle.dumps(r))
        rows = [row for p in parts for b in worker.read(p) for row in b.to_pylist()]
        assert sorted(row["value"] for row in rows) == sorted(b"v%d" % i for i in range(30))
        assert {row["topic"] for row in rows} == {"ev"} and all(row["key"] == b"k" for row in rows)
        # nothing new: the end stays where it was
        assert r.latestOffset(end, ReadAllAvailable()) == end
        # a limit moves the end only part of the way
        for i in range(10):
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


def test_the_writer_produces_every_row_and_the_reader_reads_them_back(kafka):
    opts = KafkaOptions(bootstrap_servers=kafka.bootstrap_servers, topic="out")
    batch = pa.RecordBatch.from_pylist([{"key": "a", "value": "1"}, {"key": None, "value": "2"}])
    assert produce_batches(opts, iter([batch])) == 2
    probe = reader(kafka, subscribe="out")
    try:
        start = {"out": {"0": 0}}
        end = probe.latestOffset(start, ReadAllAvailable())
        (part,) = probe.partitions(start, end)
        values = [row["value"] for b in read_range(opts, part) for row in b.to_pylist()]
        assert values[-2:] == [b"1", b"2"]
    finally:
        probe.stop()


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
