"""`namesrv start` and `namesrv admin` as an operator runs them: separate processes over TCP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from namesrv.client import NameServerClient
from tests.support.brokers import register_broker
from tests.support.node import REPO, free_port
from tests.support.process import node_answers
from tests.support.wait import wait_until

NAMESRV = [sys.executable, "-m", "namesrv"]


def wait_for_port(addr: str, proc: subprocess.Popen, timeout: float = 15) -> None:
    wait_until(lambda: node_answers(addr, proc), timeout, f"namesrv to listen on {addr}")


@pytest.fixture
def served(tmp_path):
    port = free_port()
    conf = tmp_path / "namesrv.properties"
    conf.write_text(f"listenPort={port}\nbindAddress=127.0.0.1\nkvConfigPath={tmp_path / 'kv.json'}\n")
    proc = subprocess.Popen([*NAMESRV, "start", "-c", str(conf)], cwd=REPO, stderr=subprocess.PIPE, text=True)
    addr = f"127.0.0.1:{port}"
    wait_for_port(addr, proc)
    yield addr, proc, conf
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def admin(addr: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NAMESRV, "admin", "-n", addr, *args], capture_output=True, text=True, timeout=30, cwd=REPO)


def test_admin_commands_against_a_running_node(served):
    addr, _, conf = served
    with NameServerClient(addr) as broker:
        register_broker(broker, broker_addr="127.0.0.1:10911", topics=["OrderTopic"])
        rows = json.loads(admin(addr, "--json", "clusterList").stdout)
        assert rows == [
            {"addr": "127.0.0.1:10911", "brokerId": 0, "brokerName": "broker-a", "cluster": "DefaultCluster"}
        ]
        route = json.loads(admin(addr, "--json", "topicRoute", "-t", "OrderTopic").stdout)
        assert route["queueDatas"][0]["writeQueueNums"] == 4
        assert "OrderTopic" in admin(addr, "topicList").stdout.split()
        assert json.loads(admin(addr, "--json", "wipeWritePerm", "-b", "broker-a").stdout)["wipeTopicCount"] == 2
        assert json.loads(admin(addr, "--json", "addWritePerm", "-b", "broker-a").stdout)["addTopicCount"] == 2
    assert admin(addr, "updateKvConfig", "-s", "ns", "-k", "k", "-v", "v").returncode == 0
    assert json.loads(admin(addr, "--json", "getKvConfig", "-s", "ns", "-k", "k").stdout)["value"] == "v"
    assert admin(addr, "deleteKvConfig", "-s", "ns", "-k", "k").returncode == 0
    assert admin(addr, "updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "true").returncode == 0
    assert json.loads(admin(addr, "--json", "getNamesrvConfig").stdout)["orderMessageEnable"] == "true"
    assert "orderMessageEnable=true" in conf.read_text()  # persisted to the -c file, as Java does


def test_admin_reports_errors_with_what_to_do(served):
    addr, _, _ = served
    missing = admin(addr, "topicRoute", "-t", "NoSuchTopic")
    assert missing.returncode == 1 and "TOPIC_NOT_EXIST" in missing.stderr
    down = admin(f"127.0.0.1:{free_port()}", "clusterList")
    assert down.returncode == 1 and "Is a name server listening there?" in down.stderr


def test_admin_options_are_accepted_after_the_command_as_mqadmin_users_type_them(served):
    addr, _, _ = served
    with NameServerClient(addr) as broker:
        register_broker(broker, broker_addr="127.0.0.1:10911", topics=["T"])
        done = subprocess.run(
            [*NAMESRV, "admin", "clusterList", "-n", addr, "--json", "--timeout", "3"],
            capture_output=True, text=True, timeout=30, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert [row["addr"] for row in json.loads(done.stdout)] == ["127.0.0.1:10911"]
        # given on both sides, the one after the command wins, as argparse reads left to right
        both = admin(f"127.0.0.1:{free_port()}", "--json", "clusterList", "-n", addr)
        assert both.returncode == 0 and json.loads(both.stdout)[0]["brokerName"] == "broker-a"


def test_get_kv_config_of_a_missing_key_says_so_and_exits_non_zero(served):
    addr, _, _ = served
    for extra in ([], ["--json"]):
        done = admin(addr, "getKvConfig", "-s", "ns", "-k", "nothing-here", *extra)
        assert done.returncode == 1 and done.stdout == ""
        assert "no value for key 'nothing-here' in namespace 'ns'" in done.stderr


SLOW_KAFKA_STEP = """
import logging, sys, time
logging.basicConfig(level=sys.argv[1], format="%(levelname)s %(name)s: %(message)s")  # as `make run`'s console
from common import kafka_clients; kafka_clients.demote_slow_step_warnings()  # as `make run` does before its Kafka probes
from kafka.net.selector import NetworkSelector

async def step():
    time.sleep(0.02)  # one step of kafka-python's I/O loop that takes long on the wall clock

NetworkSelector(slow_task_threshold_secs=0.001).run(step)
logging.getLogger("kafka.net.selector").warning("a real kafka-python warning")
"""


def test_kafka_pythons_wall_clock_slow_step_warning_stays_off_the_console_unless_debugging():
    def run(level: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", SLOW_KAFKA_STEP, level], capture_output=True, text=True, timeout=60, cwd=REPO
        )
        assert done.returncode == 0, done.stderr
        return done.stderr

    console = run("WARNING")
    assert "blocking the event loop" not in console and "WARNING kafka.net.selector: a real" in console
    assert "DEBUG kafka.net.selector: Task" in run("DEBUG")


def test_sigterm_stops_the_node_cleanly(served):
    _, proc, _ = served
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0


def test_bad_configuration_fails_at_start_naming_the_key(tmp_path):
    conf = tmp_path / "bad.properties"
    conf.write_text("listenPort=nine\n")
    done = subprocess.run([*NAMESRV, "start", "-c", str(conf)], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert done.returncode == 2 and "listenPort" in done.stderr and "nine" in done.stderr


def test_print_config_shows_rocketmq_keys_sorted(tmp_path):
    done = subprocess.run(
        [*NAMESRV, "start", "-p", "--set", "listenPort=19999"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    keys = [line.split("=", 1)[0] for line in done.stdout.splitlines()]
    assert done.returncode == 0 and keys == sorted(keys) and "listenPort=19999" in done.stdout.splitlines()
