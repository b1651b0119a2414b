"""The project's load generator (tools/rmq-loadgen): its own tests pass, and it drives a running node.

rmq-loadgen is a second implementation of the remoting protocol, in Rust, sharing no code with ours,
so a node it can register with, look routes up from and heartbeat is one more check of our wire
format; and ``make bench`` measures with it, so a build or a workload that stopped working shows up
here rather than in the middle of a benchmark.
"""

from __future__ import annotations

import re
import subprocess

from namesrv.client import NameServerClient
from tests.support import loadgen

SHORT = ["-c", "2", "-d", "4", "--warmup", "0", "--duration", "0.5"]


def test_the_crate_builds_offline_and_its_own_tests_pass():
    # the same offline build into the same target dir as install.sh: no registry is needed (std only)
    done = subprocess.run(
        [
            "cargo",
            "test",
            "--release",
            "--offline",
            "--manifest-path",
            str(loadgen.SOURCE / "Cargo.toml"),
            "--target-dir",
            str(loadgen.TARGET),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    passed = sum(int(n) for n in re.findall(r"test result: ok\. (\d+) passed", done.stdout))
    assert passed > 0, done.stdout[-3000:]  # the CRC32, header reader, frame and histogram tests ran


def test_loadgen_registers_looks_up_and_heartbeats_against_a_node(node):
    setup, summary = loadgen.hold_brokers(node.addr, brokers=2, topics_per_broker=3, hold_s=120)
    try:
        assert summary["ok"] == 2 and summary["errors"] == 0, summary
        with NameServerClient(node.addr) as c:  # what it registered is what our node now serves
            assert sorted(c.cluster_info().cluster_addr_table["DefaultCluster"]) == ["broker-0", "broker-1"]
            route = c.topic_route("T5")  # broker b owns T<3b> .. T<3b+2>
            assert [(b.broker_name, b.broker_addrs) for b in route.broker_datas] == [
                ("broker-1", {0: "127.0.0.1:30002"})
            ]
            assert [(q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas] == [(8, 8, 6)]

        # T0..T5 exist and T6 does not: the tool reads our successes and our TOPIC_NOT_EXIST answers alike
        route = loadgen.run(["route", "--addr", node.addr, "--topics", "7", *SHORT], timeout=60)
        assert route["ok"] > 0 and route["protocol_errors"] == 0 and route["unmatched"] == 0, route
        assert set(route["error_codes"]) == {"17"}, route
        assert route["first_remark_by_code"]["17"].startswith(
            "No topic route info in name server for the topic: T6"
        ), route

        heartbeat = loadgen.run(["heartbeat", "--addr", node.addr, "--brokers", "2", *SHORT], timeout=60)
        assert heartbeat["ok"] > 0 and heartbeat["errors"] == 0 and heartbeat["protocol_errors"] == 0, heartbeat

        register = loadgen.run(
            [
                "register",
                "--addr",
                node.addr,
                "--brokers",
                "2",
                "--topics-per-broker",
                "50",
                "-c",
                "1",
                "-d",
                "1",
                "--warmup",
                "0",
                "--duration",
                "0.5",
            ],
            timeout=60,
        )
        assert register["ok"] > 0 and register["errors"] == 0 and register["protocol_errors"] == 0, register
    finally:
        setup.kill()
        setup.wait()
