"""A Redis Cluster on loopback, from Debian's redis-server: masters alone, or each with replicas.

:meth:`RedisCluster.start` (or :func:`redis_cluster`, its context manager) starts ``masters * (1 +
replicas)`` ``redis-server --cluster-enabled yes`` processes, each with its node file, log and data in
a directory of its own, ``<home>/<port>/``. The home is ``tmp`` for a throwaway cluster, or
``<run_dir>/redis-cluster`` for one a long-running stack keeps. The client ports are free ones picked at
start, or the fixed ``ports`` given; a fixed port's cluster-bus port is Redis's default, the port plus
10000, so the node files stay valid from one start to the next. A first start joins the nodes with
``redis-cli --cluster create … --cluster-replicas R --cluster-yes``; a start that finds every node's
file from an earlier run lets the nodes meet again from them instead. Either way it waits, polling with
a deadline, until every node says ``cluster_state:ok``, every replica's link is up and every replica
has acknowledged a write of its master (:meth:`RedisCluster.streaming`). Nothing is persisted unless
``appendonly`` is set. :meth:`RedisCluster.stop` SIGTERMs each server by PID, then SIGKILLs it if it
lingers. A missing redis-server or redis-cli is a :class:`~infra.processes.BinaryNotFoundError`.
:attr:`RedisCluster.url` is the project's cluster URL naming every node (``docs/redis-keys.md``).

Faults: :meth:`RedisCluster.owner` names the master serving a key's slot (``CLUSTER KEYSLOT``,
``CLUSTER SHARDS``), :meth:`RedisCluster.kill` SIGKILLs a node by its PID, :meth:`RedisCluster.promoted`
waits until another node serves that slot in every live node's view (the cluster's own failover),
and :meth:`RedisCluster.restart` starts a killed node again on its port and node file, so that it
rejoins as a replica of the master that replaced it. :meth:`RedisCluster.freeze` and
:meth:`RedisCluster.thaw` SIGSTOP and SIGCONT a node: a hung host, whose sockets stay open. Nodes are
named by their client port throughout. ``NODE_TIMEOUT_MS`` is the cluster-node-timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from common import procfs
from infra.processes import (
    LOOPBACK,
    BinaryNotFoundError,
    PortInUseError,
    ServiceError,
    free_port,
    pid_alive,
    poll_until,
    port_is_free,
)

__all__ = ["NODE_TIMEOUT_MS", "RedisCluster", "binaries", "redis_cluster"]

#: cluster-node-timeout, the one docs/deploy.md recommends. The slot has no master from a master's death
#: until its replica is promoted: one and a half times this and about a second more (the masters ping a
#: node quiet for half of it, wait all of it for the answer, agree it failed, and the replica waits half
#: a second or so before it asks for votes); and the system promises a dead broker gone from Redis
#: within 5 s of leaving the nodes while Redis fails over. Redis's default, 15 s, would leave every
#: write waiting over 20 s; much below 2 s, a loaded host's slow answer starts a needless failover.
NODE_TIMEOUT_MS = 2_000
#: a fixed client port's cluster-bus port is this far above it, as Redis picks by default
BUS_PORT_OFFSET = 10_000
_NODE_FILE = "nodes.conf"

T = TypeVar("T")


def binaries() -> tuple[str, str]:
    """The paths of redis-server and redis-cli, or BinaryNotFoundError saying how to install them."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise BinaryNotFoundError(
            "a Redis Cluster needs Debian's redis-server and redis-cli on PATH: run `make setup` (infra/install.sh)"
        )
    return server, cli


def _client(port: int, timeout: float = 2.0):  # noqa: ANN202 - redis is imported lazily
    import redis

    return redis.Redis(host=LOOPBACK, port=port, socket_timeout=timeout, socket_connect_timeout=timeout)


def _field(entry: list | dict, name: str) -> Any:
    """A field of one CLUSTER SHARDS entry (RESP2 gives a flat list of name, value, ...)."""
    if isinstance(entry, dict):
        return entry.get(name) if name in entry else entry.get(name.encode())
    pairs = dict(zip(entry[::2], entry[1::2], strict=True))
    return pairs.get(name) if name in pairs else pairs.get(name.encode())


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class RedisCluster:
    #: a throwaway home for the nodes' directories; give this or ``run_dir``
    tmp: Path | None = None
    masters: int = 3
    replicas: int = 0
    node_timeout_ms: int = NODE_TIMEOUT_MS
    #: every node's client port, in start order (which are masters is the cluster's choice: see roles());
    #: given, these fixed ports are used, else free ones are picked at start
    ports: list[int] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    #: a stack's run directory: the nodes live under ``run_dir/redis-cluster/<port>/``
    run_dir: Path | None = None
    #: ``--appendonly yes``: the data outlives a restart (else only the node files do)
    appendonly: bool = False
    _bus_ports: list[int] = field(default_factory=list)
    _fixed_ports: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if (self.tmp is None) == (self.run_dir is None):
            raise ValueError("give a RedisCluster either tmp or run_dir")
        if self.ports and len(self.ports) != self.size:
            raise ValueError(f"{len(self.ports)} ports given for {self.size} nodes")
        if any(p + BUS_PORT_OFFSET > 65_535 for p in self.ports):
            raise ValueError(f"fixed ports must leave room for their bus port {BUS_PORT_OFFSET} above: {self.ports}")
        self._fixed_ports = bool(self.ports)

    @property
    def size(self) -> int:
        return self.masters * (1 + self.replicas)

    @property
    def home(self) -> Path:
        """The directory holding every node's directory."""
        if self.tmp is not None:
            return self.tmp
        assert self.run_dir is not None, "__post_init__ checked"
        return self.run_dir / "redis-cluster"

    def node_dir(self, port: int) -> Path:
        """Node ``port``'s directory: its node file, log (redis.log) and, with appendonly, its data."""
        return self.home / str(port)

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
        """Start every node, join them into one cluster (or let them meet again from their node files), wait until
        it is settled and streaming; returns self. ServiceError (BinaryNotFoundError, PortInUseError) if it cannot."""
        _, cli = binaries()
        if not self._fixed_ports:
            picked = _free_ports(2 * self.size)
            self.ports, self._bus_ports = picked[: self.size], picked[self.size :]
        else:
            self._bus_ports = [p + BUS_PORT_OFFSET for p in self.ports]
        taken = [p for p in (*self.ports, *self._bus_ports) if not port_is_free(p)]
        if taken:
            raise PortInUseError(f"ports {taken} of the Redis Cluster are in use")
        known = [(self.node_dir(p) / _NODE_FILE).is_file() for p in self.ports]
        if any(known) and not all(known):
            raise ServiceError(
                f"only some nodes under {self.home} have a {_NODE_FILE}: remove {self.home} to start afresh"
            )
        self.procs = []
        try:
            for i in range(self.size):
                self.procs.append(self._launch(i))
            poll_until(self._listening, timeout, "the cluster's redis-servers to listen")
            if not all(known):
                created = subprocess.run(
                    [cli, "--cluster", "create", *(f"{LOOPBACK}:{p}" for p in self.ports), "--cluster-replicas",
                     str(self.replicas), "--cluster-yes"],
                    capture_output=True, text=True, timeout=timeout,
                )  # fmt: skip
                if created.returncode != 0:
                    raise ServiceError(f"redis-cli --cluster create failed:\n{created.stdout}\n{created.stderr}")
            poll_until(self.settled, timeout, "cluster_state:ok on every node, every replica's link up", 0.2)
            for port in self.live_ports():
                self.streaming(port, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, i: int) -> subprocess.Popen:
        port = self.ports[i]
        data = self.node_dir(port)
        data.mkdir(parents=True, exist_ok=True)
        appendonly = "yes" if self.appendonly else "no"
        with (data / "redis.log").open("ab") as log:
            return subprocess.Popen(
                [binaries()[0], "--port", str(port), "--bind", LOOPBACK,
                 "--daemonize", "no", "--dir", str(data), "--save", "", "--appendonly", appendonly,
                 "--cluster-enabled", "yes", "--cluster-config-file", _NODE_FILE,
                 "--cluster-port", str(self._bus_ports[i]), "--cluster-node-timeout", str(self.node_timeout_ms)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def _listening(self) -> bool:
        for port, proc in zip(self.ports, self.procs, strict=True):
            if proc.poll() is not None:
                raise ServiceError(f"redis-server on {port} exited with {proc.returncode} (log {self.node_dir(port)})")
        return all(_ping(p) for p in self.ports)

    def stop(self) -> None:
        for proc in self.procs:
            _stop(proc)

    # -- who serves what

    def live_ports(self) -> list[int]:
        """The nodes whose process runs (a frozen one included)."""
        return [p for i, p in enumerate(self.ports) if self.procs[i].poll() is None]

    def alive(self, port: int) -> bool:
        """Whether node ``port``'s process runs (frozen or not)."""
        return self._proc(port).poll() is None

    def pid(self, port: int) -> int:
        return self._proc(port).pid

    def _proc(self, port: int) -> subprocess.Popen:
        return self.procs[self.ports.index(port)]

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

    def roles(self) -> dict[int, str]:
        """Each answering node's own word on its role: port -> "master" or "slave" (INFO replication)."""
        import redis

        seen = {}
        for port in self.live_ports():
            client = _client(port)
            try:
                seen[port] = str(client.info("replication")["role"])
            except redis.RedisError:
                continue
            finally:
                client.close()
        return seen

    def master_ports(self) -> list[int]:
        """The masters not suspected of failure, in the view of a node that answers (CLUSTER NODES)."""
        return sorted(port for port, flags, _ in self._nodes() if "master" in flags and "fail" not in flags)

    def replicas_of(self, master: int) -> list[int]:
        """The ports of the nodes replicating ``master`` (CLUSTER NODES of a node that answers)."""
        return sorted(port for port, flags, of in self._nodes() if of == master and "fail" not in flags)

    def _nodes(self) -> list[tuple[int, str, int | None]]:
        """CLUSTER NODES of a node that answers: (port, flags, port of its master or None) per node."""
        nodes = self._ask(lambda c: c.execute_command("CLUSTER", "NODES"))
        rows = [line.split() for line in _text(nodes).splitlines() if line.strip()]
        ports = {r[0]: int(r[1].split("@")[0].rsplit(":", 1)[1]) for r in rows}
        return [(ports[r[0]], r[2], ports.get(r[3])) for r in rows]

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
            if acked != replicas:
                raise ServiceError(f"{acked} of {replicas} replica(s) of {port} acknowledged a write")
        finally:
            client.close()

    def _slots(self, master: int) -> set[int]:
        for shard in self._ask(lambda c: c.execute_command("CLUSTER", "SHARDS")):
            if any(int(_field(n, "port")) == master for n in _field(shard, "nodes") or []):
                slots = [int(s) for s in _field(shard, "slots") or []]
                return {s for lo, hi in zip(slots[::2], slots[1::2], strict=True) for s in range(lo, hi + 1)}
        return set()

    def keyslot(self, key: str) -> int:
        """The key's hash slot, as the cluster computes it (CLUSTER KEYSLOT)."""
        return self._ask(lambda c: int(c.execute_command("CLUSTER", "KEYSLOT", key)))

    def owner(self, key: str, asked: int | None = None) -> int:
        """The port of the master serving ``key``'s slot, in the view of node ``asked`` (default: any that answers);
        ServiceError if none is online."""
        slot = self.keyslot(key)
        for shard in self._ask(lambda c: c.execute_command("CLUSTER", "SHARDS"), asked):
            slots = [int(s) for s in _field(shard, "slots") or []]
            if not any(lo <= slot <= hi for lo, hi in zip(slots[::2], slots[1::2], strict=True)):
                continue
            for node in _field(shard, "nodes") or []:
                if _text(_field(node, "role")) == "master" and _text(_field(node, "health")) == "online":
                    return int(_field(node, "port"))
        raise ServiceError(f"no master online serves slot {slot} of {key!r}")

    def _ask(self, call: Callable[[Any], T], asked: int | None = None) -> T:
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
        raise ServiceError(f"no cluster node answered: {errors}")

    # -- faults

    def kill(self, port: int) -> int:
        """SIGKILL the node on ``port`` by its PID (no shutdown, as a crashed host's Redis); returns the PID."""
        proc = self._proc(port)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        poll_until(lambda: not pid_alive(proc.pid), 10, f"redis-server {proc.pid} to die")
        return proc.pid

    def freeze(self, port: int) -> int:
        """SIGSTOP the node on ``port`` (a hung host: its sockets stay open, nothing answers); returns the PID once
        the kernel has stopped it."""
        pid = self.pid(port)
        os.kill(pid, signal.SIGSTOP)
        poll_until(lambda: _state(pid) in ("T", None), 10, f"redis-server {pid} to stop")
        return pid

    def thaw(self, port: int) -> int:
        """SIGCONT the node on ``port`` that :meth:`freeze` stopped; returns the PID once it runs again."""
        pid = self.pid(port)
        os.kill(pid, signal.SIGCONT)
        poll_until(lambda: _state(pid) != "T", 10, f"redis-server {pid} to run again")
        return pid

    def promoted(self, old: int, key: str, timeout: float = 60.0) -> tuple[int, float]:
        """Wait until a node other than ``old`` serves ``key``'s slot as master in every live node's view
        and the cluster is settled; (its port, seconds waited)."""
        t0 = time.monotonic()

        def new_master() -> int | None:
            try:
                seen = {self.owner(key, asked=p) for p in self.live_ports()}
            except ServiceError:
                return None
            return seen.pop() if len(seen) == 1 and old not in seen and self.settled() else None

        port = poll_until(new_master, timeout, f"a replica of {old} promoted for {key!r}", 0.05)
        return port, time.monotonic() - t0

    def restart(self, port: int, timeout: float = 60.0) -> None:
        """Start the killed node on ``port`` again with its node file; it rejoins, as a replica now, and syncs."""
        i = self.ports.index(port)
        if self.procs[i].poll() is None:
            raise ServiceError(f"redis-server on {port} is still running")
        self.procs[i] = self._launch(i)
        poll_until(self._listening, timeout, f"redis-server on {port} to listen again")
        poll_until(self.settled, timeout, f"{port} back in the cluster, its link up", 0.2)
        for master in self.live_ports():
            self.streaming(master, timeout)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports that were free a moment ago."""
    picked: list[int] = []
    while len(picked) < n:
        if (port := free_port()) not in picked:
            picked.append(port)
    return picked


def _state(pid: int) -> str | None:
    st = procfs.stat(pid)
    return st.state if st is not None else None


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        # a frozen server keeps a SIGTERM pending until it runs again
        proc.send_signal(signal.SIGCONT)
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
