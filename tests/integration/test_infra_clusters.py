"""What a long-running topology needs of :mod:`infra.redis_cluster` and :mod:`infra.spark_cluster`.

A Redis node frozen by SIGSTOP keeps running but answers nothing, and serves again once thawed. A
cluster kept under a run directory on fixed ports, with appendonly, comes back from a stop with its
nodes' files and its data, without being created again. A Spark worker killed with its executors is
started again by ``restart_worker`` and the master lists it ALIVE, the cluster back to full capacity.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common import procfs, redis_clients
from infra.processes import pid_alive, port_is_free
from infra.redis_cluster import BUS_PORT_OFFSET
from infra.spark_cluster import SparkCluster
from tests.support.redis_cluster import RedisCluster, redis_cluster
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(300)


def answers(port: int) -> bool:
    return redis_clients.answers(f"redis://127.0.0.1:{port}/0", timeout_s=0.5)


def fixed_ports(n: int) -> list[int]:
    """``n`` consecutive ports that are free with their cluster-bus ports, as a topology would fix them."""
    for base in range(21_000, 30_000, n):
        ports = list(range(base, base + n))
        if all(port_is_free(p) and port_is_free(p + BUS_PORT_OFFSET) for p in ports):
            return ports
    raise AssertionError(f"no {n} consecutive free ports with their bus ports")


def test_a_frozen_redis_node_runs_but_answers_nothing_until_thawed(tmp_path: Path) -> None:
    with redis_cluster(tmp_path, masters=3) as c:
        assert c.master_ports() == sorted(c.ports)
        assert c.roles() == {p: "master" for p in c.ports}
        frozen, other = c.ports[0], c.ports[1]

        pid = c.freeze(frozen)
        assert pid == c.pid(frozen)
        assert procfs.stat(pid).state == "T"
        assert c.alive(frozen) and frozen in c.live_ports()
        assert not answers(frozen)
        assert answers(other)

        c.thaw(frozen)
        wait_until(lambda: answers(frozen), 10, f"{frozen} to answer again")
        wait_until(c.settled, 30, "the cluster settled again", 0.2)
        assert c.alive(frozen)

    assert not pid_alive(pid)


def test_a_cluster_under_a_run_dir_on_fixed_ports_comes_back_with_its_data(tmp_path: Path) -> None:
    ports = fixed_ports(3)

    def cluster() -> RedisCluster:
        return RedisCluster(run_dir=tmp_path, masters=3, ports=ports, appendonly=True)

    first = cluster().start()
    try:
        assert first.ports == ports
        client = redis_clients.connect(first.url)
        try:
            client.set("{kept}:key", "value")
        finally:
            client.close()
    finally:
        first.stop()
    pids = [p.pid for p in first.procs]
    assert not any(pid_alive(p) for p in pids)
    for port in ports:
        assert (tmp_path / "redis-cluster" / str(port) / "nodes.conf").is_file()
        assert (tmp_path / "redis-cluster" / str(port) / "appendonlydir").is_dir()

    again = cluster().start()  # the same node files: no `--cluster create`, which refuses nodes that know others
    try:
        client = redis_clients.connect(again.url)
        try:
            assert client.get("{kept}:key") == b"value"
        finally:
            client.close()
        assert again.master_ports() == ports
    finally:
        again.stop()


def test_a_killed_spark_worker_restarts_and_the_master_lists_it_alive(tmp_path: Path) -> None:
    cluster = SparkCluster.start(tmp_path, workers=2, cores=1, memory="512m")
    try:
        assert cluster.worker_alive(0) and cluster.worker_alive(1)
        killed = cluster.workers[0].pid

        cluster.kill_worker(0)
        assert not cluster.worker_alive(0) and not pid_alive(killed)
        wait_until(lambda: cluster.alive_workers() == 1, 60, "the master to count one worker ALIVE", 0.5,
                   state=cluster.alive_workers)  # fmt: skip
        assert cluster.worker_alive(1)

        cluster.restart_worker(0)
        assert cluster.workers[0].pid != killed
        assert cluster.worker_alive(0)
        assert cluster.alive_workers() == 2
    finally:
        cluster.stop()
    assert not any(pid_alive(d.pid) for d in (cluster.master, *cluster.workers))
