"""The Kafka data source's options and offset arithmetic (its reader on real brokers: tests/integration)."""

from __future__ import annotations

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from streaming.kafka_io import KafkaOptions, KafkaSourceError, parse_offsets, split_limit


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
    # no skew allowed is a setting; a negative or wordy one is not
    assert KafkaOptions.from_options({"kafka.bootstrap.servers": "h:1", "maxClockSkewMs": "0"}).max_clock_skew_ms == 0
    for bad in ("-1", "ten"):
        with pytest.raises(KafkaSourceError, match=rf"option maxClockSkewMs: '{bad}' is not an integer \(0\.\.\d+\)"):
            KafkaOptions.from_options({"kafka.bootstrap.servers": "h:1", "maxClockSkewMs": bad})


def test_the_clock_of_an_end_offset_is_an_integer_or_none():
    from streaming.kafka_io import CLOCK_KEY, clock_of, topic_offsets

    end = {"t": {"0": 5}, CLOCK_KEY: {"ms": 1_700_000_000_000}}
    assert clock_of(end) == 1_700_000_000_000 and topic_offsets(end) == {"t": {"0": 5}}
    # an offset of a version without the clock, or an entry that is not one, reads as no clock
    for junk in ({"t": {"0": 5}}, {CLOCK_KEY: "soon"}, {CLOCK_KEY: {"ms": True}}, {CLOCK_KEY: {"ms": "1"}}):
        assert clock_of(junk) is None


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


def test_kafka_python_checks_record_crcs_in_c():
    # kafka-python falls back to a pure-Python CRC-32C when the crc32c package is missing; that was
    # most of the monitor's time reading the events topic (pyproject pins crc32c for it)
    from kafka.record import util

    assert util.crc32c_c is not None
    assert util.calc_crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
