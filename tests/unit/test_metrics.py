"""The node's metrics: request counting in plain ints, the collectors, and what a scrape reads.

No server and no socket: the collectors go through a registry of their own and the text
Prometheus would receive is parsed back with prometheus_client's own parser.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from common.metrics import Buckets, histogram_buckets
from common.protocol.codes import RequestCode, ResponseCode
from common.protocol.command import request
from namesrv.app import build_node
from namesrv.config import load_config
from namesrv.events.actions import ActionStats
from namesrv.events.publisher import PublisherStats
from namesrv.handlers import HANDLERS, dispatch
from namesrv.metrics import NodeCollector
from namesrv.request_stats import ONEWAY, OTHER, RPC_LATENCY_BUCKETS_MS, SAMPLE_EVERY, RequestStats
from tests.support.brokers import registration
from tests.support.clock import Clock
from tests.support.prometheus import scrape

ROUTE, REGISTER = RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.REGISTER_BROKER


def one(samples: dict[str, dict[tuple, float]], name: str, **labels: str) -> float:
    for key, value in samples[name].items():
        if all(item in key for item in labels.items()):
            return value
    raise KeyError(f"{name} {labels} not in {samples[name]}")


# --------------------------------------------------------------------------- plain counting


def test_buckets_count_each_value_in_the_first_bucket_whose_bound_it_does_not_exceed():
    b = Buckets((1, 5))
    for v in (0.5, 1, 3, 5, 7):
        b.observe(v)
    assert b.snapshot() == ([2, 2, 1], 16.5)  # le=1 takes 1 itself, as Prometheus' le does
    assert histogram_buckets(b.bounds, [2, 2, 1], scale=1000) == [("1000.0", 2), ("5000.0", 4), ("+Inf", 5)]


def test_every_request_is_counted_and_one_in_sample_every_timed_from_the_end_of_the_one_before():
    clock = Clock()
    stats = RequestStats(HANDLERS, clock=clock.seconds)
    started = 0.0
    for _ in range(SAMPLE_EVERY - 1):  # counted, not timed: no clock read at all
        started = stats.record(ROUTE, ResponseCode.SUCCESS, started)
        assert started == 0.0
    assert clock.reads == 0
    started = stats.record(ROUTE, ResponseCode.SUCCESS, started)
    assert started == clock.seconds()  # the next request is timed from here
    clock.advance(seconds=0.002)  # 2 ms: the 3 ms bucket
    assert stats.record(REGISTER, ResponseCode.SUCCESS, started) == 0.0
    ((code, rc, n, counts, seconds), (code2, _, n2, counts2, seconds2)) = stats.snapshot()
    assert (code, rc, n, sum(counts), seconds) == (ROUTE, ResponseCode.SUCCESS, SAMPLE_EVERY, 0, 0.0)
    assert (code2, n2, seconds2) == (REGISTER, 1, pytest.approx(0.002))
    assert counts2[RPC_LATENCY_BUCKETS_MS.index(3)] == 1 and sum(counts2) == 1
    assert stats.count(ROUTE) == SAMPLE_EVERY and stats.count(ROUTE, ResponseCode.TOPIC_NOT_EXIST) == 0


def test_a_timing_due_when_a_connection_had_no_next_request_starts_on_the_next_one_answered():
    clock = Clock()
    stats = RequestStats(HANDLERS, clock=clock.seconds)
    assert stats.start() == 0.0 and clock.reads == 0  # nothing due: no clock read
    for _ in range(SAMPLE_EVERY):
        stats.record(ROUTE, ResponseCode.SUCCESS, 0.0)  # a client that sends one request at a time
    clock.advance(seconds=100)
    started = stats.start()
    assert started == clock.seconds()
    clock.advance(seconds=0.0004)
    stats.record(ROUTE, ResponseCode.SUCCESS, started)
    assert stats.start() == 0.0  # taken
    ((_, _, n, counts, seconds),) = stats.snapshot()
    assert n == SAMPLE_EVERY + 1 and sum(counts) == 1 and seconds == pytest.approx(0.0004)


def test_codes_the_node_does_not_handle_share_one_key_so_a_peer_cannot_grow_the_label_set():
    stats = RequestStats(HANDLERS, clock=Clock().seconds)
    for code in range(5000, 6000):
        stats.record(code, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 100.0)
    assert [(c, rc, n) for c, rc, n, _, _ in stats.snapshot()] == [
        (OTHER, ResponseCode.REQUEST_CODE_NOT_SUPPORTED, 1000)
    ]


# --------------------------------------------------------------------------- what a scrape reads


def test_rpc_latency_is_rocketmqs_histogram_in_milliseconds_with_its_labels(tmp_path):
    clock = Clock()
    stats = RequestStats(HANDLERS, clock=clock.seconds)
    started = clock.seconds()
    clock.advance(seconds=0.004)
    stats.record(ROUTE, ResponseCode.TOPIC_NOT_EXIST, started)  # a timed one: 4 ms
    stats.record(RequestCode.BROKER_HEARTBEAT, ONEWAY)
    stats.record(4242, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
    node, _, expiry = _node(tmp_path)
    got = scrape(NodeCollector(node.routes, lambda: 0, expiry, stats))
    route = {"request_code": "get_routeinfo_by_topic", "response_code": "topic_not_exist"}
    assert one(got, "rocketmq_rpc_latency_bucket", le="3.0", **route) == 0
    assert one(got, "rocketmq_rpc_latency_bucket", le="5.0", **route) == 1
    assert one(got, "rocketmq_rpc_latency_sum", **route) == pytest.approx(4.0)
    assert one(got, "rocketmq_rpc_latency_count", protocol_type="remoting", node_type="namesrv", **route) == 1
    assert one(got, "rocketmq_rpc_latency_count", request_code="broker_heartbeat", result="oneway") == 0  # not timed
    assert one(got, "rocketmq_namesrv_requests_total", request_code="broker_heartbeat") == 1
    assert one(got, "rocketmq_namesrv_requests_total", request_code="other") == 1
    assert one(got, "rocketmq_namesrv_broker_heartbeats_total", request_code="broker_heartbeat") == 1


def _node(tmp_path):
    config = load_config(None, {"kvConfigPath": str(tmp_path / "kv.json"), "configStorePath": str(tmp_path / "p")})
    parts = build_node(config)
    return parts.context, parts.unregistrations, parts.expiry


def test_node_gauges_are_read_from_the_tables_and_the_scan_at_scrape_time(tmp_path):
    node, _, expiry = _node(tmp_path)
    stats = RequestStats(HANDLERS, clock=Clock().seconds)
    connections = [1, 2, 3]
    collector = NodeCollector(node.routes, lambda: len(connections), expiry, stats)
    got = scrape(collector)
    assert one(got, "rocketmq_namesrv_brokers") == 0 and one(got, "rocketmq_namesrv_local_scan_enabled") == 1
    ext, body = registration(broker_addr="10.0.0.1:10911", topics=["T1", "T2"])
    assert dispatch(node, request(REGISTER, ext, body), object()).code == ResponseCode.SUCCESS
    stats.record(REGISTER, ResponseCode.SUCCESS, 100.0)
    expiry.hand_to_monitor()
    connections.append(4)
    got = scrape(collector)  # the same collector: nothing was pushed to it
    assert one(got, "rocketmq_namesrv_brokers") == 1 and one(got, "rocketmq_namesrv_broker_groups") == 1
    assert one(got, "rocketmq_namesrv_topics") == 3  # T1, T2 and the cluster's own topic
    assert one(got, "rocketmq_namesrv_connections") == 4
    assert one(got, "rocketmq_namesrv_local_scan_enabled") == 0
    assert one(got, "rocketmq_namesrv_broker_registrations_total") == 1
    assert "rocketmq_namesrv_events_queued" not in got  # no Kafka, no Kafka figures


@dataclass
class FakeWatchdog:
    silence: float | None

    def silence_s(self) -> float | None:
        return self.silence


@dataclass
class FakeKafka:
    """What NodeCollector reads of a KafkaLink: its public accessors."""

    watchdog: FakeWatchdog
    consumer: object | None = object()

    def publisher_stats(self) -> PublisherStats:
        return PublisherStats(emitted=9, sent=7, dropped_light=3, dropped_heavy=1, failed=2, requeued=0,
                              ignored=0, queued=5, invalid=4)  # fmt: skip

    def action_stats(self) -> ActionStats:
        return ActionStats(received=20, skipped=1, applied=2, stale=3, absent=4, role_changed=5, rejected=6,
                           monitor_heartbeats=7, untrusted=8, ahead=9)  # fmt: skip


def test_kafka_figures_come_from_the_publisher_the_applier_and_the_watchdog(tmp_path):
    node, _, expiry = _node(tmp_path)
    kafka = FakeKafka(FakeWatchdog(None))
    collector = NodeCollector(node.routes, lambda: 0, expiry, None, kafka)  # type: ignore[arg-type]
    got = scrape(collector)
    assert one(got, "rocketmq_namesrv_events_published_total") == 7
    assert one(got, "rocketmq_namesrv_events_queued") == 5
    assert one(got, "rocketmq_namesrv_events_dropped_total", weight="light") == 3
    assert one(got, "rocketmq_namesrv_events_dropped_total", weight="heavy") == 1
    assert one(got, "rocketmq_namesrv_events_invalid_total") == 4
    outcomes = {dict(k)["outcome"]: v for k, v in got["rocketmq_namesrv_actions_total"].items()}
    assert outcomes["applied"] == 2 and outcomes["stale"] == 3 and outcomes["skipped"] == 1
    assert outcomes["monitor_heartbeat"] == 7 and outcomes["untrusted"] == 8
    assert "rocketmq_namesrv_monitor_heartbeat_age_seconds" not in got  # never heard: no made-up age
    kafka.watchdog.silence = 2.5
    assert one(scrape(collector), "rocketmq_namesrv_monitor_heartbeat_age_seconds") == 2.5
