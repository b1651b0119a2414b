"""Third-party RocketMQ clients, run as separate programs, against a running node over TCP.

Nobody on this team wrote these clients: the C++ client 1.0.1 (PyPI ``rocketmq==0.4.4``, header
version 63, so it gets the legacy route dialect) and ali-ons 3.12.0 from npm.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from namesrv.client import NameServerClient
from tests.peers.fake_broker import FakeBroker
from tests.support.brokers import register_broker

PEERS = Path(__file__).resolve().parent
pytestmark = pytest.mark.peers


@pytest.fixture
def broker(node):
    """A fake broker listening on loopback, registered with the node as broker-a's master."""
    with FakeBroker() as fake, NameServerClient(node.addr) as connection:
        register_broker(connection, broker_addr=fake.address, topics=["PeerTopic"])
        yield fake


def run_json(cmd: list[str], timeout: float = 60) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{cmd[1]} printed no result (exit {done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(lines[-1])
    assert done.returncode == 0, result
    return result


def test_cpp_producer_sends_to_the_broker_our_route_names(node, broker, tmp_path):
    result = run_json(
        [
            sys.executable,
            str(PEERS / "cpp_producer.py"),
            "--namesrv",
            node.addr,
            "--topic",
            "PeerTopic",
            "--log-home",
            str(tmp_path),
            "--hard-exit",
        ]
    )
    assert result["ok"], result
    send = broker.wait_for_send("PeerTopic", timeout=10)
    assert send.language == "CPP"
    # the queue it picked exists in the route we gave (4 write queues)
    queue_id = send.ext_fields.get("queueId") or send.ext_fields.get("e")
    assert queue_id is not None and 0 <= int(queue_id) < 4


def test_ali_ons_route_kv_and_cluster_info(node, broker):
    result = run_json(
        [
            "node",
            str(PEERS / "node" / "ons_probe.js"),
            "--namesrv",
            node.addr,
            "--topic",
            "PeerTopic",
            "--namespace",
            "peer-ns",
            "--key",
            "k1",
            "--value",
            "v1",
        ]
    )
    assert result["route"]["brokerDatas"][0]["brokerAddrs"] == {"0": broker.address}
    assert result["route"]["queueDatas"][0]["writeQueueNums"] == 4
    assert result["kv"]["get"] == "v1"
    assert result["kv"]["get_after_delete"]["code"] == 22
    assert result["cluster"]["clusterAddrTable"] == {"DefaultCluster": ["broker-a"]}
    with NameServerClient(node.addr) as c:
        assert c.get_kv("peer-ns", "k1") is None  # the probe deleted what it put
        assert c.kv_namespace("peer-ns") == {}
