"""Signed requests against a live node (aclEnable=true): refusals change nothing, signatures and
whitelists let requests through, reads stay open, and `namesrv admin` / `namesrv simulate` sign."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from common.protocol.codes import RequestCode, ResponseCode
from namesrv.acl import Credentials
from namesrv.client import NameServerClient
from namesrv.simulate import Fleet, FleetConfig
from tests.support.brokers import registration
from tests.support.node import REPO, running_node
from tests.support.wait import wait_until

ADMIN = Credentials("adminAccount", "admin-secret-0001")
BROKER = Credentials("brokerAccount", "broker-secret-0001")
ACCOUNTS = f"""
globalWhiteRemoteAddresses:
  - 10.255.255.*
accounts:
  - accessKey: {ADMIN.access_key}
    secretKey: {ADMIN.secret_key}
    admin: true
  - accessKey: {BROKER.access_key}
    secretKey: {BROKER.secret_key}
"""
KV = {"namespace": "NS", "key": "k", "value": "v"}


def acl_file(tmp_path: Path, text: str = ACCOUNTS) -> Path:
    path = tmp_path / "plain_acl.yml"
    path.write_text(text)
    return path


@pytest.fixture
def node(tmp_path):
    with running_node(tmp_path, aclEnable="true", aclFile=str(acl_file(tmp_path)), aclReloadIntervalMillis="100") as n:
        yield n


def test_unsigned_write_is_refused_and_changes_nothing(node):
    with NameServerClient(node.addr) as c:
        response = c.call(RequestCode.PUT_KV_CONFIG, KV)
        assert response.code == ResponseCode.NO_PERMISSION
        assert response.remark.startswith("No accessKey is configured") and "127.0.0.1" in response.remark
        assert c.get_kv("NS", "k") is None  # reads stay open

        ext, body = registration(broker_addr="127.0.0.1:10911", topics=["T1"])
        response = c.call(RequestCode.REGISTER_BROKER, ext, body)
        assert response.code == ResponseCode.NO_PERMISSION
        assert c.cluster_info().broker_addr_table == {}


def test_signed_admin_request_is_accepted(node):
    with NameServerClient(node.addr, credentials=ADMIN) as c:
        c.put_kv("NS", "k", "v")
        c.update_config({"orderMessageEnable": "true"})
    with NameServerClient(node.addr) as reader:
        assert reader.get_kv("NS", "k") == "v"
        assert reader.get_config()["orderMessageEnable"] == "true"


def test_wrong_secret_is_refused(node):
    with NameServerClient(node.addr, credentials=Credentials(ADMIN.access_key, "not-the-secret")) as c:
        response = c.call(RequestCode.PUT_KV_CONFIG, KV)
    assert response.code == ResponseCode.NO_PERMISSION
    assert response.remark.startswith("Check signature failed for accessKey='adminAccount'")


def test_a_broker_account_registers_but_may_not_use_admin_codes(node):
    with NameServerClient(node.addr, credentials=BROKER) as c:
        ext, body = registration(broker_addr="127.0.0.1:10911", topics=["T1"])
        assert c.call(RequestCode.REGISTER_BROKER, ext, body).code == ResponseCode.SUCCESS
        assert c.topic_route("T1").queue_datas[0].broker_name == "broker-a"
        response = c.call(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        assert response.code == ResponseCode.NO_PERMISSION
        assert response.remark == "Need admin permission for request code=205, but accessKey='brokerAccount' is not"
        assert c.topic_route("T1").queue_datas[0].perm == 6  # unchanged


def test_acl_keys_cannot_be_switched_off_remotely(node):
    with NameServerClient(node.addr, credentials=ADMIN) as c:
        response = c.call(RequestCode.UPDATE_NAMESRV_CONFIG, body=b"aclEnable=false\n")
    assert response.code == ResponseCode.NO_PERMISSION
    assert response.remark == "Can not update config in black list."


def test_a_whitelisted_address_needs_no_signature_and_the_file_reloads(node, tmp_path, caplog):
    with NameServerClient(node.addr) as c:
        assert c.call(RequestCode.PUT_KV_CONFIG, KV).code == ResponseCode.NO_PERMISSION
        acl_file(tmp_path, ACCOUNTS.replace("10.255.255.*", "127.0.0.1"))  # the reload picks it up
        wait_until(lambda: c.call(RequestCode.PUT_KV_CONFIG, KV).code == ResponseCode.SUCCESS, 10, "the reload")
        assert c.get_kv("NS", "k") == "v"

        acl_file(tmp_path, "accounts: [broken\n")  # an invalid file keeps the accounts loaded before
        wait_until(lambda: "aclFile changed but is not usable" in caplog.text, 10, "the refused reload")
        assert "not valid YAML" in caplog.text
        assert c.call(RequestCode.DELETE_KV_CONFIG, {"namespace": "NS", "key": "k"}).code == ResponseCode.SUCCESS


def test_reads_can_be_checked_too(tmp_path):
    with running_node(tmp_path, aclEnable="true", aclFile=str(acl_file(tmp_path)), aclCheckReads="true") as n:
        with NameServerClient(n.addr) as c:
            response = c.call(RequestCode.GET_BROKER_CLUSTER_INFO)
            assert response.code == ResponseCode.NO_PERMISSION
        with NameServerClient(n.addr, credentials=BROKER) as c:
            assert c.cluster_info().broker_addr_table == {}


def test_namesrv_admin_signs_with_credentials_from_the_environment(node):
    def admin(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "namesrv", "admin", "-n", node.addr, *args],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
            env={**os.environ, **env},
        )

    unsigned = admin("updateKvConfig", "-s", "NS", "-k", "k", "-v", "v", env={})
    assert unsigned.returncode == 1 and "NO_PERMISSION (16): No accessKey" in unsigned.stderr
    creds = {"ROCKETMQ_ACCESS_KEY": ADMIN.access_key, "ROCKETMQ_SECRET_KEY": ADMIN.secret_key}
    signed = admin("updateKvConfig", "-s", "NS", "-k", "k", "-v", "v", env=creds)
    assert signed.returncode == 0, signed.stderr
    flags = admin("--access-key", ADMIN.access_key, "deleteKvConfig", "-s", "NS", "-k", "k", env={})
    assert flags.returncode == 2 and "--secret-key (or ROCKETMQ_SECRET_KEY) is not set" in flags.stderr
    with NameServerClient(node.addr) as c:
        assert c.get_kv("NS", "k") == "v"


@pytest.mark.parametrize("credentials, registrations", [(BROKER, 2), (None, 0)])
def test_the_simulator_signs_registrations_and_heartbeats(node, credentials, registrations):
    fleet = Fleet(
        FleetConfig(namesrv=(node.addr,), brokers=2, heartbeat_interval=0.1, credentials=credentials),
        rng=random.Random(7),
    )
    try:
        fleet.tick(0)
        fleet.tick(0.2)
        assert fleet.counters["registrations"] == registrations
        with NameServerClient(node.addr) as c:
            assert len(c.cluster_info().broker_addr_table) == registrations
        if credentials is not None:
            assert fleet.counters["heartbeats"] == 2
            # a request on each member's own connection is answered after its oneway heartbeat was dispatched
            for member in fleet.members:
                member.links[node.addr].conn.call(RequestCode.GET_BROKER_CLUSTER_INFO)
        refused = node.call(lambda: node.running.context.acl.refused)
        assert refused == (0 if credentials is not None else 2)
    finally:
        fleet.close()
