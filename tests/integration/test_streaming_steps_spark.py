"""The job's steps on small static DataFrames, on a local Spark session."""

from __future__ import annotations

import orjson
import pytest

from common.contract import Event, EventType, encode_event
from streaming import job
from streaming.config import load_config
from streaming.events import broker_key
from streaming.health import KIND_HEALTH
from streaming.liveness import KIND_ROUTE, OUTPUT_COLUMNS
from streaming.session import build_spark
from tests.support.streaming import SKEW, T0, YEAR_2100, register


@pytest.fixture(scope="module")
def spark():
    cfg = load_config(None, {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "2"})
    session = build_spark(cfg)
    session.sparkContext.setLogLevel("ERROR")
    # A batch (non-streaming) transformWithState loads its state store through the coordinator that
    # Spark's streaming query manager starts; a job always has one, this static test must ask for it.
    _ = session.streams
    return session


@pytest.fixture(scope="module")
def parsed(spark):
    tick = Event(type=EventType.TICK, node="n2", event_time=T0 + 5, seq=9)
    future = Event(type=EventType.TICK, node="n3", event_time=YEAR_2100, seq=1)
    records = spark.createDataFrame(
        [(encode_event(register()),), (b"junk",), (encode_event(tick),), (b'{"v":1,"type":"TICK"}',),
         (encode_event(future),)],
        "value binary",
    )  # fmt: skip
    return job.parse(records, SKEW)


def test_parse_keeps_checked_events_bundled_by_broker_bucket_or_node(parsed):
    rows = sorted(parsed.collect(), key=lambda r: r.eventTime)
    got = [(r.key, r.eventTime, [(e["type"], e["eventTime"]) for e in orjson.loads(r.events)]) for r in rows]
    assert got == [
        (broker_key("C", "10.0.0.1:1"), T0, [("REGISTER", T0)]),  # a broker's events go to its bucket
        ("node:n2", T0 + 5, [("TICK", T0 + 5)]),  # junk and the TICK from 2100 are in no bundle
    ]
    register_event, tick = (orjson.loads(r.events)[0] for r in rows)
    assert register_event["raw"].startswith('{"v":1,"type":"REGISTER"') and tick["raw"] is None
    assert parsed.columns == ["key", "eventTime", "events"]


def test_event_time_is_a_timestamp_with_a_watermark(parsed):
    timed = job.with_event_time(parsed, 2_000)
    (row,) = timed.filter("key = 'node:n2'").collect()
    assert int(row.eventTs.timestamp() * 1000) == T0 + 5


def test_decide_passes_one_copy_of_a_registration_reported_by_two_nodes(spark):
    records = spark.createDataFrame(
        [(encode_event(register("n1")),), (encode_event(register("n2", T0 + 3, seq=4)),)], "value binary"
    )
    out = job.decide(job.with_event_time(job.parse(records, SKEW), 2_000), job.liveness_settings(load_config(None, {})))
    assert out.columns == [c for c, _ in OUTPUT_COLUMNS]
    rows = [r for r in out.collect() if r.kind != KIND_HEALTH]  # the console's per-broker health row aside
    assert [(r.kind, r.type, r.node) for r in rows] == [(KIND_ROUTE, "REGISTER", "n1")]
