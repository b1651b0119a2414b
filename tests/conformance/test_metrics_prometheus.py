"""A node's metrics as an operator gets them: ``namesrv start`` with ``metricsPort``, scraped by
Debian's real Prometheus, values read back through Prometheus' query API.

The monitor's side needs Spark: tests/integration/test_streaming_job.py scrapes it the same way.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request

from common.protocol.codes import RequestCode
from namesrv.client import NameServerClient
from tests.support.brokers import register_broker
from tests.support.node import REPO, free_port
from tests.support.process import node_process
from tests.support.prometheus import running_prometheus


def test_prometheus_scrapes_a_node_s_requests_latency_and_tables(tmp_path):
    metrics_port = free_port()
    with node_process(tmp_path, metricsPort=str(metrics_port)) as node:
        # the start-up line says where the metrics are
        assert f"metrics http://127.0.0.1:{metrics_port}/metrics" in node.log_text()
        with running_prometheus(tmp_path, {"namesrv": f"127.0.0.1:{metrics_port}"}) as prom:
            with NameServerClient(node.addr) as client:
                register_broker(client, broker_addr="127.0.0.1:10911", topics=["T1", "T2"])
                for _ in range(40):  # one in SAMPLE_EVERY (16) is timed: a few timed ones
                    client.topic_route("T1")
                client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopic"})
                client.call(4242, {})  # a code the node does not know: counted as "other"
                prom.wait_for('rocketmq_namesrv_brokers{job="namesrv"}', lambda v: v == [1])
                prom.wait_for("rocketmq_namesrv_topics", lambda v: v == [3])  # T1, T2, DefaultCluster
                prom.wait_for("rocketmq_namesrv_connections", lambda v: v and v[0] >= 1)
                prom.wait_for("rocketmq_namesrv_broker_registrations_total", lambda v: v == [1])
                route_ok = 'request_code="get_routeinfo_by_topic",response_code="success"'
                prom.wait_for(f"rocketmq_namesrv_requests_total{{{route_ok}}}", lambda v: v == [40])
                prom.wait_for(f"rocketmq_rpc_latency_count{{{route_ok}}}", lambda v: v and v[0] >= 1)
                prom.wait_for(
                    'rocketmq_namesrv_requests_total{request_code="get_routeinfo_by_topic",'
                    'response_code="topic_not_exist"}',
                    lambda v: v == [1],
                )
                prom.wait_for('rocketmq_namesrv_requests_total{request_code="other"}', lambda v: v == [1])
                # a latency histogram Prometheus can compute quantiles from: under its largest bucket
                (p99_ms,) = prom.wait_for(
                    f"histogram_quantile(0.99, rocketmq_rpc_latency_bucket{{{route_ok}}})", lambda v: len(v) == 1
                )
                assert 0 < p99_ms <= 3000
                # standalone: the node's own expiry scan is on, and there is no Kafka figure
                prom.wait_for("rocketmq_namesrv_local_scan_enabled", lambda v: v == [1])
                assert prom.values("rocketmq_namesrv_events_queued") == []
            prom.wait_for("rocketmq_namesrv_brokers", lambda v: v == [0])  # the broker's connection closed
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            assert b"process_cpu_seconds_total" in r.read()


def test_a_taken_metrics_port_stops_the_node_at_start_naming_the_key(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "namesrv", "start", "--set", f"listenPort={free_port()}",
             "--set", "bindAddress=127.0.0.1", "--set", f"kvConfigPath={tmp_path / 'kv.json'}",
             "--set", f"configStorePath={tmp_path / 'p'}", "--set", f"metricsPort={port}"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
    assert done.returncode == 2 and f"metricsPort={port}" in done.stderr and "Traceback" not in done.stderr
