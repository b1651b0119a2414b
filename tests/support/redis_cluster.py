"""A Redis Cluster on loopback, from Debian's redis-server, for tests: masters alone, or each with a replica.

Theory of operation
-------------------
:func:`redis_cluster` (or :meth:`RedisCluster.start` / :meth:`RedisCluster.stop` for a fixture that
outlives a ``with``) starts ``masters * (1 + replicas)`` ``redis-server --cluster-enabled yes``
processes on free ports (each with a free cluster-bus port, ``--cluster-port``), their node files in
``tmp``, no persistence; joins them with ``redis-cli --cluster create … --cluster-replicas R
--cluster-yes``; waits, polling with a deadline, until every node says ``cluster_state:ok``, every
replica's link is up and every replica has acknowledged a write of its master
(:meth:`RedisCluster.streaming`); and yields a :class:`RedisCluster` whose ``url`` is the project's
cluster URL naming every node (``docs/redis-keys.md``). Afterwards each server is SIGTERMed by PID,
then SIGKILLed if it lingers. Skips when redis-server or redis-cli is missing.

Failover: :meth:`RedisCluster.owner` names the master serving a key's slot (``CLUSTER KEYSLOT``,
``CLUSTER SHARDS``), :meth:`RedisCluster.kill` SIGKILLs a node by its PID, :meth:`RedisCluster.promoted`
waits until another node serves that slot in every live node's view (the cluster's own failover),
and :meth:`RedisCluster.restart` starts a killed node again on its port and node file, so that it
rejoins as a replica of the master that replaced it. ``NODE_TIMEOUT_MS`` is the cluster-node-timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra.services import LOOPBACK, free_port, pid_alive
from tests.support.wait import wait_until

__all__ = ["NODE_TIMEOUT_MS", "RedisCluster", "redis_cluster"]

#: cluster-node-timeout, the one docs/deploy.md recommends. The slot has no master from a master's death
#: until its replica is promoted: one and a half times this and about a second more (the masters ping a
#: node quiet for half of it, wait all of it for the answer, agree it failed, and the replica waits half
#: a second or so before it asks for votes); and the system promises a dead broker gone from Redis
#: within 5 s of leaving the nodes while Redis fails over. Redis's default, 15 s, would leave every
#: write waiting over 20 s; much below 2 s, a loaded host's slow answer starts a needless failover.
NODE_TIMEOUT_MS = 2_000


def _client(port: int, timeout: float = 2.0):  # noqa: ANN202 - redis is imported lazily
    import redis

    return redis.Redis(host=LOOPBACK, port=port, socket_timeout=timeout, socket_connect_timeout=timeout)


def _field(entry: list | dict, name: str) -> object:
    """A field of one CLUSTER SHARDS entry (RESP2 gives a flat list of name, value, ...)."""
    if isinstance(entry, dict):
        return entry.get(name) if name in entry else entry.get(name.encode())
    pairs = dict(zip(entry[::2], entry[1::2], strict=True))
    return pairs.get(name) if name in pairs else pairs.get(name.encode())


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class RedisCluster:
    tmp: Path
    masters: int = 3
    replicas: int = 0
    node_timeout_ms: int = NODE_TIMEOUT_MS
    #: every node's client port, in start order (which are masters is the cluster's choice: see roles())
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    _bus_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The project's URL for this cluster, naming every node (any one that answers seeds the client)."""
        return self.url_first(self.ports[0])

    def url_first(self, port: int) -> str:
        """The cluster's URL with ``port`` as its first node, the others after it."""
        seeds = [port, *(p for p in self.ports if p != port)]
        return "redis+cluster://" + ",".join(f"{LOOPBACK}:{p}" for p in seeds) + "/0"

    def node_url(self, i: int) -> str:
        """A plain URL of node ``i``: a client that does not follow the cluster's redirections."""
        return f"redis://{LOOPBACK}:{self.ports[i]}/0"

    # -- starting and stopping

    def start(self, timeout: float = 60.0) -> RedisCluster:
        server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
        if server is None or cli is None:
            pytest.skip("Debian's redis-server and redis-cli are needed for a Redis Cluster (infra/install.sh)")
        try:
            for i in range(self.masters * (1 + self.replicas)):
                self.ports.append(free_port())
                self._bus_ports.append(free_port())
                self.procs.append(self._launch(i))
            wait_until(self._listening, timeout, "the cluster's redis-servers to listen")
            created = subprocess.run(
                [cli, "--cluster", "create", *(f"{LOOPBACK}:{p}" for p in self.ports), "--cluster-replicas",
                 str(self.replicas), "--cluster-yes"],
                capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
            assert created.returncode == 0, f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}"
            wait_until(self.settled, timeout, "cluster_state:ok on every node, every replica's link up", 0.2)
            for port in self.live_ports():
                self.streaming(port, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, i: int) -> subprocess.Popen:
        port = self.ports[i]
        data = self.tmp / f"redis-{port}"
        data.mkdir(parents=True, exist_ok=True)
        with (data / "redis.log").open("ab") as log:
            return subprocess.Popen(
                [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", LOOPBACK,
                 "--daemonize", "no", "--dir", str(data), "--save", "", "--appendonly", "no",
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-port", str(self._bus_ports[i]), "--cluster-node-timeout", str(self.node_timeout_ms)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def _listening(self) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"a redis-server exited with {proc.returncode} (logs in {self.tmp})")
        return all(_ping(p) for p in self.ports)

    def stop(self) -> None:
        for proc in self.procs:
            _stop(proc)

    # -- who serves what

    def live_ports(self) -> list[int]:
        return [p for i, p in enumerate(self.ports) if self.procs[i].poll() is None]

    def settled(self) -> bool:
        """Every live node says cluster_state:ok, and every live replica's link to its master is up."""
        import redis

        for port in self.live_ports():
            client = _client(port)
            try:
                if client.cluster("INFO").get("cluster_state") != "ok":
                    return False
                info = client.info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") != "up":
                    return False
            except redis.RedisError:
                return False
            finally:
                client.close()
        return True

    def streaming(self, port: int, timeout: float = 60.0) -> None:
        """If ``port`` is a master, wait until each of its replicas has acknowledged a write made now (a key of its
        own slots, gone in a second: ``SET … PX``, then ``WAIT``). A replica whose link is up may not be sent
        writes yet: just after a full sync its master holds them back until the replica's first
        acknowledgement, and a master killed then loses them."""
        from redis.crc import key_slot

        client = _client(port)
        try:
            info = client.info("replication")
            if info.get("role") != "master" or not info.get("connected_slaves"):
                return
            mine = self._slots(port)
            probe = next(k for k in (f"probe-{i}" for i in range(100_000)) if key_slot(k.encode()) in mine)
            client.set(probe, "1", px=1000)
            replicas = int(info["connected_slaves"])
            acked = int(client.execute_command("WAIT", replicas, int(timeout * 1000)))
            assert acked == replicas, f"{acked} of {replicas} replica(s) of {port} acknowledged a write"
        finally:
            client.close()

    def _slots(self, master: int) -> set[int]:
        for shard in self._ask(lambda c: c.execute_command("CLUSTER", "SHARDS")):
            if any(int(_field(n, "port")) == master for n in _field(shard, "nodes") or []):  # type: ignore[call-overload]
                slots = [int(s) for s in _field(shard, "slots") or []]
                return {s for lo, hi in zip(slots[::2], slots[1::2], strict=True) for s in range(lo, hi + 1)}
        return set()

    def keyslot(self, key: str) -> int:
        """The key's hash slot, as the cluster computes it (CLUSTER KEYSLOT)."""
        return self._ask(lambda c: int(c.execute_command("CLUSTER", "KEYSLOT", key)))

    def owner(self, key: str, asked: int | None = None) -> int:
        """The port of the master serving ``key``'s slot, in the view of node ``asked`` (default: any that answers)."""
        slot = self.keyslot(key)
        for shard in self._ask(lambda c: c.execute_command("CLUSTER", "SHARDS"), asked):
            slots = [int(s) for s in _field(shard, "slots") or []]
            if not any(lo <= slot <= hi for lo, hi in zip(slots[::2], slots[1::2], strict=True)):
                continue
            for node in _field(shard, "nodes") or []:
                if _text(_field(node, "role")) == "master" and _text(_field(node, "health")) == "online":
                    return int(_field(node, "port"))  # type: ignore[call-overload]
        raise AssertionError(f"no master online serves slot {slot} of {key!r}")

    def replicas_of(self, master: int) -> list[int]:
        """The ports of the nodes replicating ``master`` (CLUSTER NODES of a node that answers)."""
        nodes = self._ask(lambda c: c.execute_command("CLUSTER", "NODES"))
        rows = [line.split() for line in _text(nodes).splitlines() if line.strip()]
        ids = {r[0]: int(r[1].split("@")[0].rsplit(":", 1)[1]) for r in rows}
        return sorted(ids[r[0]] for r in rows if r[3] != "-" and ids.get(r[3]) == master and "fail" not in r[2])

    def pid(self, port: int) -> int:
        return self.procs[self.ports.index(port)].pid

    def _ask(self, call, asked: int | None = None):  # noqa: ANN001, ANN202
        import redis

        errors = []
        for port in [asked] if asked is not None else self.live_ports():
            client = _client(port)
            try:
                return call(client)
            except redis.RedisError as exc:
                errors.append(f"{port}: {exc!r}")
            finally:
                client.close()
        raise AssertionError(f"no cluster node answered: {errors}")

    # -- faults

    def kill(self, port: int) -> int:
        """SIGKILL the node on ``port`` by its PID (no shutdown, as a crashed host's Redis); returns the PID."""
        proc = self.procs[self.ports.index(port)]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not pid_alive(proc.pid), 10, f"redis-server {proc.pid} to die")
        return proc.pid

    def promoted(self, old: int, key: str, timeout: float = 60.0) -> tuple[int, float]:
        """Wait until a node other than ``old`` serves ``key``'s slot as master in every live node's view
        and the cluster is settled; (its port, seconds waited)."""
        t0 = time.monotonic()

        def new_master() -> int | None:
            try:
                seen = {self.owner(key, asked=p) for p in self.live_ports()}
            except AssertionError:
                return None
            return seen.pop() if len(seen) == 1 and old not in seen and self.settled() else None

        port = wait_until(new_master, timeout, f"a replica of {old} promoted for {key!r}", 0.05)
        return port, time.monotonic() - t0

    def restart(self, port: int, timeout: float = 60.0) -> None:
        """Start the killed node on ``port`` again with its node file; it rejoins, as a replica now, and syncs."""
        i = self.ports.index(port)
        assert self.procs[i].poll() is not None, f"redis-server on {port} is still running"
        self.procs[i] = self._launch(i)
        wait_until(self._listening, timeout, f"redis-server on {port} to listen again")
        wait_until(self.settled, timeout, f"{port} back in the cluster, its link up", 0.2)
        for master in self.live_ports():
            self.streaming(master, timeout)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def redis_cluster(
    tmp: Path, masters: int = 3, replicas: int = 0, timeout: float = 60.0, node_timeout_ms: int = NODE_TIMEOUT_MS
) -> Iterator[RedisCluster]:
    """``masters`` cluster-enabled redis-servers (each with ``replicas`` replicas) in one cluster; stopped by PID afterwards."""
    cluster = RedisCluster(tmp, masters, replicas, node_timeout_ms).start(timeout)
    try:
        yield cluster
    finally:
        cluster.stop()


def _ping(port: int) -> bool:
    from common import redis_clients

    return redis_clients.answers(f"redis://{LOOPBACK}:{port}/0", timeout_s=1)
