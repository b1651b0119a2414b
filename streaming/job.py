"""The liveness monitor job, top to bottom: source -> parse -> watermark -> state -> sinks, and :func:`start`.

One streaming query. Each step is a function that takes and returns a DataFrame, so a test
can run any of them on a small frame:

1. :func:`read_events` - the events topic, through Spark's own Kafka source (``format("kafka")``;
   its jars reach the driver when its JVM starts, :func:`streaming.session.build_spark`);
2. :func:`parse` - records to checked events, bundled in a ``mapInArrow``: one row per state key
   and Arrow batch (:mod:`streaming.events`); malformed ones and those stamped ahead of the
   micro-batch's clock are counted (query progress, metric ``events.bad``) and dropped, never fatal;
3. :func:`with_event_time` - ``eventTs`` from ``eventTime`` and the watermark (120 s by
   default). TICKs go through this step like any event: filtering them out after it would be
   pushed below the watermark by the optimizer and stop them from moving it;
4. :func:`decide` - ``transformWithState`` with :class:`LivenessProcessor` per
   bucket of brokers and per node, event-time timers on RocksDB;
5. :class:`~streaming.sink.BatchSink` (``foreachBatch``) on the driver: Kafka, Redis, the pager.

Restart: the checkpoint (``monitor.checkpointDir``) holds source offsets, the processor's state
and its pending timers, so a killed job carries on where it stopped (:func:`checkpoint_location`).
Around the query (:func:`start`): the progress logger (:mod:`streaming.progress`), the monitor's
heartbeat (:class:`~streaming.sink.MonitorHeartbeat`) and the metrics endpoint (:mod:`streaming.metrics`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import kafka_clients, kafka_refusals
from common.redis_clients import redact_url
from streaming.config import StreamingConfig
from streaming.events import PACKED, count_events, parse_events, valid_events
from streaming.liveness import OUTPUT_DDL, LivenessProcessor, LivenessSettings, state_layout
from streaming.metrics import serve_monitor_metrics
from streaming.paging import pager_for
from streaming.progress import progress_logger
from streaming.publisher import KafkaPublisher
from streaming.routes import RedisRouteStore
from streaming.sink import BatchSink, MonitorHeartbeat
from streaming.status import MonitorStatus

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from common.metrics import MetricsServer

log = logging.getLogger(__name__)

EVENT_TS = "eventTs"

# --------------------------------------------------------------------------- the steps


def read_events(spark: SparkSession, cfg: StreamingConfig) -> DataFrame:
    """1. The records of the events topic, as Spark's Kafka source gives them (``value`` binary), read by
    at most as many tasks as the job has cores.

    The source makes a task of every partition with records, and a steady batch's task is mostly its
    fixed cost (a fetch, a Python worker's round trip); more tasks than cores run in waves and cannot
    read a backlog faster (bench/STREAMING_RESULTS.md).
    """
    reader = spark.readStream.format(cfg.kafka_format)
    for key, value in cfg.source_options().items():
        reader = reader.option(key, value)
    return reader.load().coalesce(max(1, spark.sparkContext.defaultParallelism))


def parse(records: DataFrame, max_clock_skew_ms: int) -> DataFrame:
    """2. Checked events in bundles (``key``, ``eventTime``, ``events``: one row per state key and Arrow
    batch), parsed in a ``mapInArrow``; malformed records and events stamped ahead of the micro-batch's
    clock counted and dropped."""
    return valid_events(count_events(parse_events(records, max_clock_skew_ms)))


def with_event_time(events: DataFrame, delay_ms: int) -> DataFrame:
    """3. ``eventTs`` and the watermark: max event time seen minus ``delay_ms``."""
    from pyspark.sql import functions as F

    return events.withColumn(EVENT_TS, F.timestamp_millis("eventTime")).withWatermark(
        EVENT_TS, f"{delay_ms} milliseconds"
    )


def liveness_settings(cfg: StreamingConfig) -> LivenessSettings:
    return LivenessSettings(
        heartbeat_timeout_ms=cfg.heartbeat_timeout_millis,
        flap_threshold=cfg.flap_threshold,
        flap_window_ms=cfg.flap_window_millis,
        node_silent_ms=cfg.node_silent_millis,
        remove_on_channel_close=cfg.remove_on_channel_close,
        watermark_delay_ms=cfg.watermark_delay_millis,
        forget_after_ms=cfg.forget_after_millis,
    )


def decide(events: DataFrame, settings: LivenessSettings) -> DataFrame:
    """4. Actions, alerts and route events (:data:`streaming.liveness.OUTPUT_DDL`) per key.

    The processor gets a key's bundles (column :data:`PACKED`, a JSON array of events) beside
    ``eventTs``, which Spark needs to drop rows later than the watermark: PySpark makes a Python
    object of every input cell one by one, so it gets three cells a bundle instead of fourteen an
    event (docs/internals/monitor.md).
    """
    return (
        events.select("key", EVENT_TS, PACKED)
        .groupBy("key")
        .transformWithState(
            statefulProcessor=LivenessProcessor(settings),
            outputStructType=OUTPUT_DDL,
            outputMode="Append",
            timeMode="EventTime",
        )
    )


def build_pipeline(spark: SparkSession, cfg: StreamingConfig) -> DataFrame:
    """Steps 1-4: what :class:`BatchSink` receives each micro-batch."""
    events = parse(read_events(spark, cfg), cfg.max_clock_skew_millis)
    return decide(with_event_time(events, cfg.watermark_delay_millis), liveness_settings(cfg))


# --------------------------------------------------------------------------- around the query


@dataclass
class MonitorJob:
    """A running monitor: the query and what runs beside it."""

    spark: SparkSession
    query: StreamingQuery
    sink: BatchSink
    status: MonitorStatus
    listener: Any
    heartbeat: MonitorHeartbeat
    #: the Prometheus endpoint; None when monitor.metricsPort is 0
    metrics: MetricsServer | None = None

    def process_all_available(self) -> None:
        self.query.processAllAvailable()

    def stop(self) -> None:
        self.heartbeat.stop()
        try:
            self.query.stop()
        finally:
            self.spark.streams.removeListener(self.listener)
            self.sink.close()
            if self.metrics is not None:  # a restarted query (streaming.__main__) serves on the same port again
                self.metrics.stop()


def checkpoint_location(checkpoint_dir: Path) -> Path:
    """This job version's checkpoint: ``checkpoint_dir/state-<layout>``, created if missing.

    Checkpoints of other state layouts (older versions of the job) are left alone and named in
    a warning: a new layout starts from ``kafka.startingOffsets`` and rebuilds its state from
    the events still in the topic, while the nodes' fallback scan covers the start-up.
    """
    location = checkpoint_dir / f"state-{state_layout()}"
    if not location.exists():
        others = sorted(p.name for p in checkpoint_dir.glob("state-*")) if checkpoint_dir.is_dir() else []
        if checkpoint_dir.joinpath("offsets").is_dir():
            others.append("(an unversioned checkpoint in the directory itself)")
        if others:
            log.warning(
                "checkpoint %s: starting a new state layout %s; the state of %s was written by another "
                "version of the job and is not read (delete it once the new one runs)",
                checkpoint_dir,
                location.name,
                ", ".join(others),
            )
    location.mkdir(parents=True, exist_ok=True)
    return location


def start(
    spark: SparkSession, cfg: StreamingConfig, *, trigger_ms: int | None = None, stopping: threading.Event | None = None
) -> MonitorJob | None:
    """Start the monitor on ``spark`` (:func:`streaming.session.build_spark`) once Kafka answers.

    None if ``stopping`` is set first; :class:`~streaming.publisher.KafkaLoginRefused` if Kafka refuses the job.
    """
    # before the driver's first client: a refused start quotes why Kafka refused it (common.kafka_refusals)
    kafka_refusals.install_refusal_tracking()
    kafka_clients.demote_slow_step_warnings()
    publisher = KafkaPublisher.connect(cfg.kafka_bootstrap, stopping, cfg.kafka_security)
    if publisher is None:
        return None
    store = RedisRouteStore.from_url(cfg.redis_url, cfg.redis_prefix) if cfg.redis_url else None
    status = MonitorStatus()
    sink = BatchSink(cfg, publisher, store, status, pager=pager_for(cfg, store))
    query_id: list[str | None] = [None]
    trigger = trigger_ms or cfg.trigger_interval_millis
    listener = progress_logger(
        status, cfg.watermark_delay_millis, cfg.max_clock_skew_millis, trigger, lambda: query_id[0]
    )
    spark.streams.addListener(listener)
    checkpoint = checkpoint_location(cfg.checkpoint_dir)
    query = (
        build_pipeline(spark, cfg)
        .writeStream.foreachBatch(sink)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{trigger} milliseconds")
        .queryName("namesrv-liveness")
        .start()
    )
    query_id[0] = str(query.id)
    sink.set_lineage(str(query.id))
    heartbeat = MonitorHeartbeat(sink, cfg.monitor_heartbeat_interval_millis / 1000)
    heartbeat.start()
    monitor = MonitorJob(spark, query, sink, status, listener, heartbeat)
    if cfg.metrics_port > 0:
        try:
            monitor.metrics = serve_monitor_metrics(cfg, sink, status)
        except OSError as exc:  # a port taken is the operator's to fix; the monitor decides on without it
            log.error(
                "monitor.metricsPort=%d: cannot listen on %s (%s); running without metrics",
                cfg.metrics_port, cfg.metrics_bind_address, exc,
            )  # fmt: skip
    log.info(
        "monitor %s started: events %s on %s, checkpoint %s, redis %s, metrics %s",
        cfg.monitor_name,
        cfg.events_topic,
        cfg.kafka_bootstrap,
        checkpoint,
        redact_url(cfg.redis_url) if cfg.redis_url else "-",
        monitor.metrics.url if monitor.metrics is not None else "off",
    )
    return monitor
