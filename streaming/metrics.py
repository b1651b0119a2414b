"""Prometheus metrics of the liveness monitor, served by the driver (``monitor.metricsPort``; 0 = off).

Theory of operation
-------------------
The driver already sees everything an operator wants to graph: the query's progress (the
progress listener, :mod:`streaming.progress`, writes it into :class:`~streaming.status.MonitorStatus`),
what each batch published and how long its Redis write took (:class:`~streaming.sink.BatchSink`
notes both in the same status), the route model and the open incidents (the sink's alert book).
Nothing new is measured: :class:`MonitorCollector` reads those when Prometheus scrapes, through the
sink's and the status' read-only accessors, on the metrics server's thread (prometheus_client's, see
:class:`namesrv.metrics.MetricsServer`), without their locks (see :mod:`streaming.status`); the route
counts are taken under the route manager's own lock.

Names are ``rocketmq_namesrv_monitor_*`` in base units (seconds); docs/operations.md lists them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from common.contract import wall_ms
from common.metrics import Buckets, MetricsServer, histogram_buckets, serve

if TYPE_CHECKING:
    from streaming.config import StreamingConfig
    from streaming.sink import BatchSink
    from streaming.status import MonitorStatus

PREFIX = "rocketmq_namesrv_monitor_"


def _histogram(name: str, doc: str, buckets: Buckets) -> HistogramMetricFamily:
    counts, total = buckets.snapshot()
    return HistogramMetricFamily(name, doc, buckets=histogram_buckets(buckets.bounds, counts), sum_value=total)


class MonitorCollector(Collector):
    """The monitor's figures, read from the sink and its status at scrape time."""

    def __init__(self, sink: BatchSink, status: MonitorStatus, delay_ms: int, clock: Callable[[], int] = wall_ms):
        self.sink = sink
        self.status = status
        self.delay_ms = delay_ms
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        s, now = self.status, self.clock()
        yield GaugeMetricFamily(
            PREFIX + "input_rows_per_second", "Events per second read by the last micro-batch", value=s.input_rate
        )
        yield CounterMetricFamily(PREFIX + "events", "Events read from the events topic", value=s.events)
        yield CounterMetricFamily(PREFIX + "events_bad", "Malformed or out-of-range events skipped", value=s.bad_events)
        yield CounterMetricFamily(
            PREFIX + "events_ahead", "Events refused as stamped too far ahead of the job's clock", value=s.ahead_events
        )
        yield CounterMetricFamily(PREFIX + "batches", "Micro-batches finished by this run", value=s.batches)
        yield _histogram(PREFIX + "batch_duration_seconds", "Duration of each micro-batch", s.batch_seconds)
        if s.watermark_ms:  # no sample before the first watermark, rather than a lag of decades
            yield GaugeMetricFamily(
                PREFIX + "watermark_lag_seconds",
                "How far event time (watermark + monitor.watermarkDelayMillis) is behind the wall clock",
                value=(now - (s.watermark_ms + self.delay_ms)) / 1000,
            )
        if s.last_batch_done_at:
            yield GaugeMetricFamily(
                PREFIX + "last_batch_age_seconds",
                "Seconds since this run last finished a micro-batch",
                value=max(0, now - s.last_batch_done_at) / 1000,
            )
        yield GaugeMetricFamily(
            PREFIX + "brokers_alive", "Brokers in the monitor's route model (registered, not expired or removed)",
            value=self.sink.brokers_alive(),
        )  # fmt: skip
        published = Counter(s.actions_published)
        for kind, action in (("expired", "EXPIRE"), ("removed", "REMOVE")):
            yield CounterMetricFamily(
                PREFIX + f"brokers_{kind}", f"Brokers the monitor decided to {action.lower()} ({action} actions)",
                value=published[action],
            )  # fmt: skip
        actions = CounterMetricFamily(
            PREFIX + "actions_published", "Actions sent to the actions topic, by type", labels=["type"]
        )
        for action, count in sorted(published.items()):
            actions.add_metric([action], count)
        yield actions
        alerts = GaugeMetricFamily(
            PREFIX + "open_alerts", "Open health incidents, by kind and severity", labels=["kind", "severity"]
        )
        for (kind, severity), count in sorted(Counter(self.sink.open_alert_kinds()).items()):
            alerts.add_metric([kind, severity], count)
        yield alerts
        yield _histogram(
            PREFIX + "redis_write_seconds", "Time of each batch's Redis transaction (failed ones too)", s.redis_seconds
        )
        yield CounterMetricFamily(
            PREFIX + "redis_write_failures", "Batches whose Redis write failed", value=s.redis_failures
        )


def serve_monitor_metrics(cfg: StreamingConfig, sink: BatchSink, status: MonitorStatus) -> MetricsServer:
    """The driver's endpoint at ``monitor.metricsBindAddress:monitor.metricsPort``."""
    return serve(
        [MonitorCollector(sink, status, cfg.watermark_delay_millis)], cfg.metrics_bind_address, cfg.metrics_port
    )
