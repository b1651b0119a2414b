"""Prometheus metrics of a node, served over HTTP by prometheus_client (``metricsPort``; 0 = off).

Everything is read when Prometheus scrapes, from what the node keeps anyway: per-request counts from
:class:`~namesrv.request_stats.RequestStats`, and the route tables, connections, publisher, action
applier and monitor watchdog through their owners' public accessors (:class:`NodeCollector`), so
the request path copies and updates nothing for metrics.  A scrape runs on the threaded WSGI server's
thread (:class:`MetricsServer`) and reads only snapshots taken under their owner's lock or copies of
plain ints; a registry of our own holds the collectors and ``process_*``, nothing global.  Names
follow RocketMQ 5 where one exists (``rocketmq_rpc_latency`` in milliseconds, with finer buckets
below 1 ms), the rest are ``rocketmq_namesrv_*``; docs/operations.md lists them all.
``docs/internals/metrics.md`` has more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from common.metrics import histogram_buckets
from common.protocol.codes import RequestCode, ResponseCode
from namesrv.request_stats import ONEWAY, OTHER, RPC_LATENCY_BUCKETS_MS, SAMPLE_EVERY, RequestStats

if TYPE_CHECKING:
    from common.routes.manager import RouteInfoManager
    from namesrv.events.link import KafkaLink
    from namesrv.liveness import ExpiryScan


def _code_name(enum: type[RequestCode] | type[ResponseCode], code: int) -> str:
    """RocketMQ's label value: the code's constant name in lower case (its number if it has none)."""
    try:
        return enum(code).name.lower()
    except ValueError:
        return str(code)


def request_metrics(stats: RequestStats) -> Iterator[Metric]:
    """rocketmq_rpc_latency and rocketmq_namesrv_requests_total from the request path's counts."""
    latency = HistogramMetricFamily(
        "rocketmq_rpc_latency",
        f"Time the node spent on a request, in milliseconds (as RocketMQ 5's rocketmq_rpc_latency); one request"
        f" in {SAMPLE_EVERY} is timed, so count the requests with rocketmq_namesrv_requests_total",
        labels=["node_type", "protocol_type", "request_code", "response_code", "result"],
    )
    requests = CounterMetricFamily(
        "rocketmq_namesrv_requests",
        "Requests answered (or, oneway, handled) by request code and response code",
        labels=["request_code", "response_code"],
    )
    for code, rc, requests_seen, counts, seconds in stats.snapshot():
        request_name = "other" if code == OTHER else _code_name(RequestCode, code)
        response_name = "" if rc == ONEWAY else _code_name(ResponseCode, rc)
        result = "oneway" if rc == ONEWAY else "success"
        latency.add_metric(
            ["namesrv", "remoting", request_name, response_name, result],
            histogram_buckets(RPC_LATENCY_BUCKETS_MS, counts),
            seconds * 1000,
        )
        requests.add_metric([request_name, response_name], requests_seen)
    yield latency
    yield requests


@dataclass(eq=False)  # registries keep collectors in a dict: hashed by identity
class NodeCollector(Collector):
    """Everything else a node knows, read from its parts' accessors when Prometheus scrapes."""

    routes: RouteInfoManager
    connections: Callable[[], int]
    expiry: ExpiryScan
    requests: RequestStats | None = None
    kafka: KafkaLink | None = None

    def collect(self) -> Iterator[Metric]:
        counts = self.routes.counts()
        for name, doc, value in (
            ("brokers", "Live brokers in the route tables", counts.brokers),
            ("broker_groups", "Broker groups (broker names) in the route tables", counts.groups),
            ("topics", "Topics in the route tables", counts.topics),
            ("connections", "Open TCP connections (brokers, clients, admin tools)", self.connections()),
            (
                "local_scan_enabled",
                "1 while the node's own expiry scan is on (no monitor heard), 0 while the monitor decides",
                int(self.expiry.enabled),
            ),
        ):
            yield GaugeMetricFamily(f"rocketmq_namesrv_{name}", doc, value=value)
        if self.requests is not None:
            yield from request_metrics(self.requests)
            yield CounterMetricFamily(
                "rocketmq_namesrv_broker_registrations",
                "REGISTER_BROKER requests answered SUCCESS",
                value=self.requests.count(RequestCode.REGISTER_BROKER),
            )
            heartbeats = CounterMetricFamily(
                "rocketmq_namesrv_broker_heartbeats",
                "Broker heartbeats handled, by request code (QUERY_DATA_VERSION answered SUCCESS, oneway BROKER_HEARTBEAT)",
                labels=["request_code"],
            )
            heartbeats.add_metric(["query_data_version"], self.requests.count(RequestCode.QUERY_DATA_VERSION))
            heartbeats.add_metric(
                ["broker_heartbeat"],
                self.requests.count(RequestCode.BROKER_HEARTBEAT, ONEWAY)
                + self.requests.count(RequestCode.BROKER_HEARTBEAT),
            )
            yield heartbeats
        if self.kafka is not None:
            yield from self._kafka(self.kafka)

    def _kafka(self, kafka: KafkaLink) -> Iterator[Metric]:
        p = kafka.publisher_stats()
        yield CounterMetricFamily("rocketmq_namesrv_events_published", "Events acknowledged by Kafka", value=p.sent)
        yield GaugeMetricFamily("rocketmq_namesrv_events_queued", "Events waiting to be sent to Kafka", value=p.queued)
        dropped = CounterMetricFamily(
            "rocketmq_namesrv_events_dropped",
            "Events dropped because the queue was full: light (heartbeats, ticks) or heavy (everything else)",
            labels=["weight"],
        )
        dropped.add_metric(["light"], p.dropped_light)
        dropped.add_metric(["heavy"], p.dropped_heavy)
        yield dropped
        yield CounterMetricFamily(
            "rocketmq_namesrv_events_failed",
            "Events Kafka did not acknowledge and that were not retried",
            value=p.failed,
        )
        yield CounterMetricFamily(
            "rocketmq_namesrv_events_invalid", "Events outside the schema's bounds, never queued", value=p.invalid
        )
        if kafka.consumer is None:
            return
        a = kafka.action_stats()
        actions = CounterMetricFamily(
            "rocketmq_namesrv_actions",
            "Monitor actions read, by outcome (applied, stale, skipped as malformed, ...)",
            labels=["outcome"],
        )
        for outcome, value in (
            ("applied", a.applied),
            ("stale", a.stale),
            ("skipped", a.skipped),
            ("absent", a.absent),
            ("role_changed", a.role_changed),
            ("rejected", a.rejected),
            ("untrusted", a.untrusted),
            ("ahead", a.ahead),
            ("monitor_heartbeat", a.monitor_heartbeats),
        ):
            actions.add_metric([outcome], value)
        yield actions
        age = kafka.watchdog.silence_s()
        if age is not None:  # no monitor heard yet: no sample, rather than a made-up age
            yield GaugeMetricFamily(
                "rocketmq_namesrv_monitor_heartbeat_age_seconds",
                "Seconds since the node last heard the liveness monitor (an action or MONITOR_HEARTBEAT it obeyed)",
                value=age,
            )
