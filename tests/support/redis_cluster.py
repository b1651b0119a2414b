"""A Redis Cluster of three masters on loopback, from Debian's redis-server, for tests.

Theory of operation
-------------------
:func:`redis_cluster` starts three ``redis-server --cluster-enabled yes`` processes on free ports
(each with a free cluster-bus port, ``--cluster-port``, so no port + 10000 has to be free), their
node files in ``tmp``, no persistence; joins them with ``redis-cli --cluster create … --cluster-replicas 0
--cluster-yes`` (16384 slots split three ways); waits, polling with a deadline, until every node says
``cluster_state:ok``; and yields a :class:`RedisCluster` whose ``url`` is the project's cluster URL
(``redis+cluster://127.0.0.1:port/0``, ``docs/redis-keys.md``). Afterwards each server is
SIGTERMed by PID, then SIGKILLed if it lingers. Skips when redis-server or redis-cli is missing.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.services import LOOPBACK, free_port
from tests.support.wait import wait_until

__all__ = ["RedisCluster", "redis_cluster"]


@dataclass
class RedisCluster:
    ports: list[int]
    procs: list[subprocess.Popen]

    @property
    def url(self) -> str:
        """The project's URL for this cluster (any one node seeds the client)."""
        return f"redis+cluster://{LOOPBACK}:{self.ports[0]}/0"

    def node_url(self, i: int) -> str:
        """A plain URL of node ``i``: a client that does not follow the cluster's redirections."""
        return f"redis://{LOOPBACK}:{self.ports[i]}/0"


def _state_ok(port: int) -> bool:
    import redis

    client = redis.Redis(host=LOOPBACK, port=port, socket_timeout=2, socket_connect_timeout=2)
    try:
        return client.cluster("INFO").get("cluster_state") == "ok"
    except redis.RedisError:
        return False
    finally:
        client.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def redis_cluster(tmp: Path, masters: int = 3, timeout: float = 60.0) -> Iterator[RedisCluster]:
    """``masters`` cluster-enabled redis-servers joined into one cluster; stopped by PID afterwards."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        pytest.skip("Debian's redis-server and redis-cli are needed for a Redis Cluster (infra/install.sh)")
    cluster = RedisCluster([], [])
    try:
        for _ in range(masters):
            port = free_port()
            data = tmp / f"redis-{port}"
            data.mkdir(parents=True)
            log = (data / "redis.log").open("wb")
            cluster.ports.append(port)
            cluster.procs.append(subprocess.Popen(
                [server, "--port", str(port), "--bind", LOOPBACK, "--daemonize", "no", "--dir", str(data),
                 "--save", "", "--appendonly", "no", "--cluster-enabled", "yes",
                 "--cluster-config-file", "nodes.conf", "--cluster-port", str(free_port()),
                 "--cluster-node-timeout", "5000"],
                stdout=log, stderr=subprocess.STDOUT,
            ))  # fmt: skip
            log.close()

        def listening() -> bool:
            for proc in cluster.procs:
                if proc.poll() is not None:
                    raise AssertionError(f"a redis-server exited with {proc.returncode} (logs in {tmp})")
            return all(_ping(p) for p in cluster.ports)

        wait_until(listening, timeout, "the cluster's redis-servers to listen")
        created = subprocess.run(
            [cli, "--cluster", "create", *(f"{LOOPBACK}:{p}" for p in cluster.ports), "--cluster-replicas", "0",
             "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        assert created.returncode == 0, f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}"
        wait_until(lambda: all(_state_ok(p) for p in cluster.ports), timeout, "cluster_state:ok on every node")
        yield cluster
    finally:
        for proc in cluster.procs:
            _stop(proc)


def _ping(port: int) -> bool:
    from common import redis_clients

    return redis_clients.answers(f"redis://{LOOPBACK}:{port}/0", timeout_s=1)
