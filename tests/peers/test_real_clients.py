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

from namesrv.acl import Credentials
from namesrv.client import NameServerClient
from tests.peers.fake_broker import FakeBroker
from tests.support.brokers import register_broker
from tests.support.node import running_node

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


# --- signed requests (aclEnable): both clients sign as RocketMQ's ACL 1.0 does ------------------

ACL_ADMIN = Credentials("peerAdmin", "peer-admin-secret")
#: reads are checked too: the C++ producer only ever sends the name server route lookups
ACL_ACCOUNTS = (
    f"accounts:\n  - accessKey: {ACL_ADMIN.access_key}\n    secretKey: {ACL_ADMIN.secret_key}\n    admin: true\n"
)


@pytest.fixture
def acl_node(tmp_path):
    (tmp_path / "plain_acl.yml").write_text(ACL_ACCOUNTS)
    overrides = {"aclEnable": "true", "aclFile": str(tmp_path / "plain_acl.yml"), "aclCheckReads": "true"}
    with running_node(tmp_path, **overrides) as n:
        yield n


@pytest.fixture
def acl_broker(acl_node):
    with FakeBroker() as fake, NameServerClient(acl_node.addr, credentials=ACL_ADMIN) as connection:
        register_broker(connection, broker_addr=fake.address, topics=["PeerTopic"])
        yield fake


def run_result(cmd: list[str], timeout: float = 60) -> tuple[int, dict]:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{cmd[1]} printed no result (exit {done.returncode}): {done.stderr[-2000:]}"
    return done.returncode, json.loads(lines[-1])


def test_cpp_producer_signs_its_route_lookups(acl_node, acl_broker, tmp_path):
    def produce(secret: str) -> tuple[int, dict]:
        return run_result(
            [
                sys.executable,
                str(PEERS / "cpp_producer.py"),
                *("--namesrv", acl_node.addr, "--topic", "PeerTopic", "--log-home", str(tmp_path), "--hard-exit"),
                *("--access-key", ACL_ADMIN.access_key, "--secret-key", secret, "--send-timeout-ms", "2000"),
            ]
        )

    code, result = produce(ACL_ADMIN.secret_key)
    assert code == 0 and result["ok"] and result["signed"], result
    assert acl_broker.wait_for_send("PeerTopic", timeout=10).language == "CPP"
    assert acl_node.call(lambda: acl_node.running.context.acl.refused) == 0

    code, result = produce("not-the-secret")
    assert code == 1 and not result["ok"]
    assert any("Check signature failed for accessKey='peerAdmin'" in line for line in result["log_tail"]), result


def test_ali_ons_signs_name_server_requests(acl_node, acl_broker):
    probe = ["node", str(PEERS / "node" / "ons_probe.js"), "--namesrv", acl_node.addr, "--topic", "PeerTopic"]
    code, result = run_result([*probe, "--access-key", ACL_ADMIN.access_key, "--secret-key", ACL_ADMIN.secret_key])
    # route (105), PUT/GET/DELETE_KV_CONFIG (admin codes) and cluster info, all signed by ali-ons itself
    assert code == 0 and result["signed"], result
    assert result["route"]["brokerDatas"][0]["brokerAddrs"] == {"0": acl_broker.address}
    assert result["kv"]["delete"] == 0 and result["kv"]["get_after_delete"]["code"] == 22
    assert acl_node.call(lambda: acl_node.running.context.acl.refused) == 0

    code, result = run_result([*probe, "--access-key", ACL_ADMIN.access_key, "--secret-key", "not-the-secret"])
    assert code == 1 and result["code"] == 16 and result["error"].startswith("Check signature failed")
    code, result = run_result(probe)
    assert code == 1 and result["code"] == 16 and result["error"].startswith("No accessKey is configured")
