"""The monitor's metrics: what the sink, the progress listener and the alert book already see,
read back as Prometheus would (no Spark, no Redis, no server)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from streaming.metrics import MonitorCollector
from streaming.progress import _ProgressAsJson, progress_logger
from streaming.status import MonitorStatus
from tests.support.prometheus import scrape
from tests.support.streaming import T0, expire_row, make_sink, register, route_row

NOW = T0 + 100_000  # make_sink's clock
P = "rocketmq_namesrv_monitor_"


def value(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


class FakeStore:
    """What the sink asks of its Redis store; ``fail`` makes the next commit raise ``failure``."""

    def __init__(self, failure: Exception | None = None) -> None:
        self.fail = False
        self.failure = failure or RedisConnectionError("down")
        self.client = SimpleNamespace(close=lambda: None)

    def commit(self, *args, **kwargs) -> None:
        if self.fail:
            raise self.failure

    def fallback_removals(self) -> dict:
        return {}


def test_brokers_actions_and_open_alerts_follow_the_batches():
    sink, _ = make_sink(None, "m1")
    sink.set_lineage("q")
    collector = MonitorCollector(sink, sink.status, delay_ms=120_000, clock=lambda: NOW)
    before = scrape(collector)
    assert value(before, P + "brokers_alive") == 0 and value(before, P + "brokers_expired_total") == 0
    assert P + "watermark_lag_seconds" not in before  # no watermark yet: no sample rather than decades

    sink.process([route_row(register())], 0)
    assert value(scrape(collector), P + "brokers_alive") == 1

    sink.process([expire_row(T0 + 20_000)], 1)
    after = scrape(collector)
    assert value(after, P + "brokers_alive") == 0
    assert value(after, P + "brokers_expired_total") == 1 and value(after, P + "brokers_removed_total") == 0
    assert value(after, P + "actions_published_total", type="EXPIRE") == 1
    # whatever incidents the book holds (their grouping is the alerts module's), counted by kind and severity
    open_alerts = after[P + "open_alerts"]
    expected: dict[tuple, float] = {}
    for a in sink.book.open.values():
        key = (("kind", a.kind.value), ("severity", a.severity.value))
        expected[key] = expected.get(key, 0) + 1
    assert open_alerts == expected and sum(open_alerts.values()) > 0


def test_the_monitor_heartbeat_counts_as_an_action_published():
    sink, _ = make_sink(None, "m2")
    sink.set_lineage("q")
    status = sink.status
    status.watermark_ms, status.last_batch_done_at = NOW - 120_000, NOW  # deciding: event time is now
    sink.monitor_tick()
    got = scrape(MonitorCollector(sink, status, delay_ms=120_000, clock=lambda: NOW + 500))
    assert value(got, P + "actions_published_total", type="MONITOR_HEARTBEAT") == 1
    assert value(got, P + "watermark_lag_seconds") == 0.5
    assert value(got, P + "last_batch_age_seconds") == 0.5


@pytest.mark.parametrize(
    "failure",
    [RedisConnectionError("down"), RedisClusterException("Redis Cluster cannot be connected")],
    ids=["redis down", "no cluster node answers"],
)
def test_redis_writes_are_timed_and_failures_counted(failure):
    # a Redis Cluster none of whose nodes answers raises no RedisError: still a failure counted, not a crash
    sink, _ = make_sink(None, "m3")
    sink.set_lineage("q")
    store = sink.store = FakeStore(failure)  # type: ignore[assignment]
    sink.process([route_row(register())], 0)
    store.fail = True
    sink.process([route_row(register(t=T0 + 1, seq=2))], 1)
    got = scrape(MonitorCollector(sink, sink.status, delay_ms=120_000, clock=lambda: NOW))
    assert value(got, P + "redis_write_seconds_count") == 2
    assert value(got, P + "redis_write_seconds_bucket", le="+Inf") == 2
    assert value(got, P + "redis_write_failures_total") == 1


def test_the_progress_reaches_the_listener_as_json_from_one_jvm_call():
    """The JVM bridge asks the progress for its JSON once, and the listener gets what query.lastProgress would give."""
    status = MonitorStatus()
    listener = progress_logger(status, 120_000, 10_000, 100, lambda: "8d6e8a43-4f57-4b1b-9c54-000000000001")
    progress = {
        "id": "8d6e8a43-4f57-4b1b-9c54-000000000001", "runId": "8d6e8a43-4f57-4b1b-9c54-000000000002",
        "name": "namesrv-liveness", "timestamp": "2023-11-14T22:13:20.000Z", "batchId": 7, "batchDuration": 640,
        "numInputRows": 4, "inputRowsPerSecond": 2.0, "processedRowsPerSecond": 8.0,
        "durationMs": {"triggerExecution": 640}, "eventTime": {"watermark": "2023-11-14T22:13:20.000Z"},
        "stateOperators": [], "sources": [], "sink": {"description": "foreachBatch", "numOutputRows": -1},
        "observedMetrics": {"events": {"events": 100, "bad": 1, "ahead": 0, "aheadNode": None,
                                       "aheadOtherNode": None, "aheadMax": None}},
    }  # fmt: skip
    calls: list[str] = []

    class JProgress:
        def json(self) -> str:
            calls.append("json")
            return json.dumps(progress)

    class JEvent:
        def progress(self) -> JProgress:
            calls.append("progress")
            return JProgress()

    _ProgressAsJson(listener).onQueryProgress(JEvent())
    assert calls == ["progress", "json"]
    assert (status.batches, status.events, status.bad_events) == (1, 100, 1)
    assert status.batch_durations_ms == [640] and status.input_rate == 50.0  # 2 bundles/s of 25 events each
    assert status.watermark_ms == 1_700_000_000_000


def test_the_progress_listener_feeds_input_rate_batch_duration_and_counts():
    status = MonitorStatus()
    listener = progress_logger(status, 120_000, 10_000, 100, lambda: "q")
    # the source's rows are bundles of events: the rate and the counts are the events'
    for batch, (rows, events, rate, duration_ms) in enumerate([(2, 10, 1.0, 400), (3, 30, 1.5, 3000)]):
        progress = SimpleNamespace(
            id="q", batchId=batch, numInputRows=rows, inputRowsPerSecond=rate, processedRowsPerSecond=rate,
            batchDuration=duration_ms, eventTime={"watermark": "2023-11-14T22:13:20.000Z"},
            observedMetrics={"events": {"events": events, "bad": 0, "ahead": 0}},
        )  # fmt: skip
        listener.onQueryProgress(SimpleNamespace(progress=progress))
    sink, _ = make_sink(None, "m4")
    got = scrape(MonitorCollector(sink, status, delay_ms=120_000, clock=lambda: T0 + 130_000))
    assert value(got, P + "input_rows_per_second") == 15.0  # 1.5 bundles/s of 10 events each
    assert value(got, P + "events_total") == 40 and value(got, P + "batches_total") == 2
    assert value(got, P + "batch_duration_seconds_bucket", le="0.5") == 1
    assert value(got, P + "batch_duration_seconds_bucket", le="5.0") == 2
    assert value(got, P + "batch_duration_seconds_sum") == 3.4
    assert value(got, P + "watermark_lag_seconds") == 10.0  # T0 + 130 s - (watermark T0 + 120 s delay)
