"""The whole system for the end-to-end suite, on two interchangeable backends, and the tools to drive it.

A :class:`System` is what ``make run`` starts: Apache Kafka and Redis (the *infra*), two name-server
nodes (:class:`infra.apps.NodeService`) and the Spark liveness monitor
(:class:`infra.apps.StreamingJob`), on free loopback ports, with a short broker timeout
(:class:`Timing`).  Only the infra differs between backends: :class:`ProcessInfra` runs Kafka and
redis-server as local processes, :class:`ContainerInfra` as testcontainers containers from images
built locally (:mod:`tests.integration.images.build`).  Nodes and the job are always local processes
that tests restart, kill and read the logs of, each incarnation in a run directory of its own.  The
tools: :class:`FleetRunner` (simulated brokers), :class:`KafkaTap` (reads the topics),
:class:`RouteProbe` (asks every node for a route) and :func:`run_cpp_producer` (the real C++
client).  ``docs/internals/testing.md`` has more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from common import kafka_clients
from infra.apps import NodeService, StreamingJob
from infra.services import (
    DEFAULT_TOPICS,
    KafkaCluster,
    KafkaService,
    RedisService,
    ServiceError,
    ensure_topics,
    free_port,
    kafka_admin,
    pid_alive,
    tcp_answers,
)
from namesrv import procfs
from namesrv.client import NameServerClient
from namesrv.protocol import bodies
from namesrv.protocol.codes import RequestCode, ResponseCode
from namesrv.simulate import Fleet, FleetConfig, State
from tests.integration.images import build
from tests.support.wait import wait_until

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
EVENTS, ACTIONS, ALERTS = (t.name for t in DEFAULT_TOPICS)
BACKENDS = ("processes", "containers")
ENV_BACKEND = "NAMESRV_IT_BACKEND"
ENV_KAFKA_IMAGE = "NAMESRV_IT_KAFKA_IMAGE"
ENV_REDIS_IMAGE = "NAMESRV_IT_REDIS_IMAGE"
ENV_STREAMING_SET = "NAMESRV_IT_STREAMING_SET"


def parse_settings(text: str) -> dict[str, str]:
    """``key=value,key=value`` (as ``-D`` takes them) into a dict; ValueError naming a bad item."""
    out = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


class SystemFailure(RuntimeError):
    """A part of the system did not start, stop or answer; the message names it and its log."""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# --------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Timing:
    """Liveness settings for a test run of minutes; None keeps the value of the shipped conf/ files.

    Only the brokers' own heartbeat timeout is short: that cannot hide how late the system acts on
    it. The watermark delay, trigger, ticks and the nodes' fallback are as shipped unless a module
    says otherwise (a shortened watermark delay can hide an expiry delay).
    """

    #: every simulated broker's heartbeatTimeoutMillis (as a registration carries it)
    broker_timeout_ms: int = 4_000
    broker_heartbeat_s: float = 1.0
    watermark_delay_ms: int | None = None
    trigger_ms: int | None = None
    tick_ms: int | None = None
    monitor_heartbeat_ms: int | None = 1_000
    #: the nodes never fall back to their own expiry scan during a run, so every removal the suite
    #: sees was decided by the streaming job (or asked for by the broker)
    monitor_fallback_ms: int | None = 600_000

    @property
    def expiry_bound_s(self) -> float:
        """How long after a broker's last heartbeat every place must have dropped it."""
        return self.broker_timeout_ms / 1000 + 6.0


#: every setting as ``conf/`` ships it; only simulated brokers send a short timeout of their own (real
#: brokers send theirs), which cannot hide how late the system acts on it
SHIPPED = Timing(broker_timeout_ms=10_000, monitor_heartbeat_ms=None, monitor_fallback_ms=None)


# --------------------------------------------------------------------------- infra: Kafka and Redis


def _set(key: str, value: int | None) -> dict[str, str]:
    """``{key: value}`` as a setting, or nothing to keep the shipped value."""
    return {} if value is None else {key: str(value)}


class Infra(Protocol):
    name: str

    @property
    def kafka_bootstrap(self) -> str: ...

    @property
    def redis_url(self) -> str: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def stop_kafka(self) -> None: ...

    def start_kafka(self) -> None: ...

    def describe(self) -> str: ...


def kafka_answers(bootstrap: str, timeout: float = 1.0) -> bool:
    host, _, port = bootstrap.rpartition(":")
    if not tcp_answers(host, int(port), timeout):
        return False
    try:
        with kafka_admin(bootstrap, timeout) as admin:
            admin.list_topics()
        return True
    except Exception:  # noqa: BLE001 - not ready yet, whatever the reason
        return False


class ProcessInfra:
    """Apache Kafka and redis-server as local processes on free loopback ports."""

    name = "processes"

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.kafka_port, self.kafka_controller_port = free_port(), free_port()
        self.kafka_data = run_dir / "kafka-data"
        self._kafka_runs = 0
        self.kafka = self._new_kafka()
        self.redis = RedisService(port=free_port(), run_dir=run_dir / "redis")

    def _new_kafka(self) -> KafkaService:
        self._kafka_runs += 1
        # same ports and data directory, a fresh run directory: the log of the previous run stays
        return KafkaService(
            port=self.kafka_port,
            controller_port=self.kafka_controller_port,
            run_dir=self.run_dir / f"kafka-{self._kafka_runs}",
            data_dir=self.kafka_data,
            topics=DEFAULT_TOPICS,
        )

    @property
    def kafka_bootstrap(self) -> str:
        return self.kafka.bootstrap_servers

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def start(self) -> None:
        self.kafka.start()
        self.redis.start()

    def stop(self) -> None:
        for service in (self.kafka, self.redis):
            with contextlib.suppress(ServiceError):
                service.stop()

    def stop_kafka(self) -> None:
        self.kafka.stop()

    def start_kafka(self) -> None:
        self.kafka = self._new_kafka()
        self.kafka.start()

    def describe(self) -> str:
        return f"processes: Apache Kafka {self.kafka_bootstrap} (log {self.kafka.log_file}), redis {self.redis_url}"


#: which node leads what at the start (a partition's first replica leads it): the actions and alerts on node 1,
#: the events partitions on nodes 2 and 3, so a test can fail the actions' leader or the events' leaders alone
REPLICATED_LAYOUT = {
    EVENTS: {0: [2, 3, 1], 1: [3, 2, 1], 2: [2, 1, 3], 3: [3, 1, 2]},
    ACTIONS: {0: [1, 2, 3]},
    ALERTS: {0: [1, 3, 2]},
}


class ReplicatedInfra:
    """Apache Kafka as three KRaft nodes and redis-server as local processes on free loopback ports.

    The replicated layout of docs/deploy.md (:class:`infra.services.KafkaCluster`: every node a broker and
    a controller, the topics on three replicas with ``min.insync.replicas`` 2), its leaders placed as
    :data:`REPLICATED_LAYOUT` says. A test kills, restarts and freezes its Kafka nodes one at a time, by
    node id (1..3); each run of a node logs in a directory of its own, so the log of the run that was
    killed stays.
    """

    name = "replicated"

    def __init__(self, run_dir: Path, kafka_nodes: int = 3) -> None:
        self.run_dir = run_dir
        self.cluster = KafkaCluster(
            ports=[free_port() for _ in range(kafka_nodes)],
            controller_ports=[free_port() for _ in range(kafka_nodes)],
            run_dir=run_dir / "kafka",
            data_dir=run_dir / "kafka-data",
        )
        self.redis = RedisService(port=free_port(), run_dir=run_dir / "redis")
        self._runs = dict.fromkeys(range(1, kafka_nodes + 1), 1)
        #: node ids killed or frozen now: our own admin requests go to the others
        self._faulty: set[int] = set()

    @property
    def kafka_bootstrap(self) -> str:
        return self.cluster.bootstrap_servers

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def start(self) -> None:
        self.cluster.start()
        with kafka_admin(self.kafka_bootstrap, 30) as admin:
            min_insync = {"min.insync.replicas": str(self.cluster.min_insync)}
            admin.create_topics(
                {t: {"assignments": a, "configs": min_insync} for t, a in REPLICATED_LAYOUT.items()},
                timeout_ms=30_000,
            )
            admin.wait_for_topics(list(REPLICATED_LAYOUT), timeout_ms=30_000)
        self.redis.start()

    def stop(self) -> None:
        for stop in (self.cluster.stop, self.redis.stop):
            with contextlib.suppress(ServiceError):
                stop()

    def stop_kafka(self) -> None:
        self.cluster.stop()

    def start_kafka(self) -> None:
        self.cluster.start()

    def describe(self) -> str:
        logs = ", ".join(str(n.log_file) for n in self.cluster.nodes)
        return f"replicated: Apache Kafka {self.kafka_bootstrap} (logs {logs}), redis {self.redis_url}"

    # -- one node at a time

    def kafka_node(self, node_id: int) -> KafkaService:
        return self.cluster.nodes[node_id - 1]

    def _describe(self, topics: list[str]) -> list[dict[str, Any]]:
        """The topics' metadata, asked of a node that is neither killed nor frozen."""
        return self.cluster.describe_topics(topics, skip=self._faulty, timeout=20.0)

    def leaders(self, topic: str) -> dict[int, int]:
        """partition -> the node id leading it now (-1: none), as the cluster's metadata says."""
        (info,) = self._describe([topic])
        return {p["partition_index"]: p["leader_id"] for p in info["partitions"]}

    def in_sync(self, topics: tuple[str, ...] = (EVENTS, ACTIONS)) -> bool:
        """Every partition of ``topics`` has every replica in sync (a restarted node has caught up)."""
        infos = self._describe(list(topics))
        return all(len(p["isr_nodes"]) == len(p["replica_nodes"]) for i in infos for p in i["partitions"])

    def kafka_pid(self, node_id: int) -> int:
        pid = self.kafka_node(node_id).running_pid()
        assert pid is not None, f"kafka node {node_id} is not running"
        return pid

    def kill_kafka_node(self, node_id: int) -> None:
        """SIGKILL one Kafka node (no controlled shutdown: its partitions wait for the controller to fence it)."""
        node, pid = self.kafka_node(node_id), self.kafka_pid(node_id)
        self._faulty.add(node_id)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: node.running_pid() is None, 10, f"kafka node {node_id} (pid {pid}) to die")

    def restart_kafka_node(self, node_id: int) -> None:
        """Start a node that was killed again, on its data directory, logging apart from its last run."""
        self._runs[node_id] += 1
        node = self.cluster.node(node_id, self.run_dir / f"kafka-{node_id}-run{self._runs[node_id]}")
        self.cluster.nodes[node_id - 1] = node
        node.start()
        self._faulty.discard(node_id)

    def heal(self) -> None:
        """Start again every Kafka node a test killed and left down."""
        for node_id in sorted(self._faulty):
            if self.kafka_node(node_id).running_pid() is None:
                self.restart_kafka_node(node_id)

    @contextlib.contextmanager
    def kafka_node_frozen(self, node_id: int) -> Iterator[None]:
        """One Kafka node stopped (SIGSTOP) for the block, as a long GC pause or a hung host is, then continued."""
        pid = self.kafka_pid(node_id)
        self._faulty.add(node_id)
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)
            self._faulty.discard(node_id)


# --------------------------------------------------------------------------- infra: containers


def docker_host_candidates() -> list[str]:
    """Where a Docker daemon may be listening: $DOCKER_HOST, then the standard socket."""
    found = [os.environ["DOCKER_HOST"]] if os.environ.get("DOCKER_HOST") else []
    if Path("/var/run/docker.sock").exists():
        found.append("unix:///var/run/docker.sock")
    return found


def docker_answers(host: str, timeout: float = 3.0) -> str | None:
    """None when the daemon at ``host`` answers a ping, else why not."""
    try:
        import docker
    except ImportError as exc:
        return f"the docker package is missing ({exc}); pip install -e '.[test]'"
    try:
        client = docker.DockerClient(base_url=host, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - any failure means "no daemon here"
        return f"{host}: {exc}"
    try:
        client.ping()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{host}: {type(exc).__name__}: {exc}"
    finally:
        client.close()


def find_docker() -> tuple[str | None, str]:
    """(host of a daemon that answers, or None; what was tried)."""
    tried = []
    for host in docker_host_candidates():
        why = docker_answers(host)
        if why is None:
            return host, f"{host} answers"
        tried.append(why)
    return None, "; ".join(tried) or "DOCKER_HOST is unset and /var/run/docker.sock does not exist"


@contextlib.contextmanager
def docker_env(host: str) -> Iterator[None]:
    """testcontainers' settings for a daemon it may not manage itself: no Ryuk, connect via DOCKER_HOST."""
    saved = {
        k: os.environ.get(k) for k in ("DOCKER_HOST", "TESTCONTAINERS_RYUK_DISABLED", "TESTCONTAINERS_CONNECTION_MODE")
    }
    os.environ["DOCKER_HOST"] = host
    # Ryuk is an image pulled from a registry, which may be unreachable; we remove our containers ourselves
    os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
    os.environ["TESTCONTAINERS_CONNECTION_MODE"] = "docker_host"
    from testcontainers.core.config import ConnectionMode, testcontainers_config

    old = (testcontainers_config.ryuk_disabled, testcontainers_config.connection_mode_override)
    testcontainers_config.ryuk_disabled = True
    testcontainers_config.connection_mode_override = ConnectionMode.docker_host
    try:
        yield
    finally:
        testcontainers_config.ryuk_disabled, testcontainers_config.connection_mode_override = old
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class ContainerInfra:
    """Apache Kafka and Redis as testcontainers containers.

    The Kafka image must listen on 9092 and take ``--override advertised.listeners=PLAINTEXT://H:P``
    as its arguments (an entrypoint running ``kafka.Kafka server.properties``, as the image built by
    :mod:`tests.integration.images.build` does): 9092 is published on a free loopback port P, which
    the broker advertises. The Redis image is any image testcontainers' RedisContainer can ping (the
    official ``redis`` image works too).
    """

    name = "containers"

    def __init__(self, docker_host: str, kafka_image: str, redis_image: str, *, build_missing: bool = True) -> None:
        self.docker_host = docker_host
        self.kafka_image = kafka_image
        self.redis_image = redis_image
        self.build_missing = build_missing
        self.kafka_port = free_port()
        self.kafka: Any = None
        self.redis: Any = None
        self._env: contextlib.ExitStack | None = None
        self._redis_port: int | None = None

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        assert self._redis_port is not None, "start() first"
        return f"redis://127.0.0.1:{self._redis_port}/0"

    def build_images(self) -> list[str]:
        """Build the default images that are missing; returns what was built."""
        import docker

        specs = []
        if self.kafka_image == build.KAFKA_IMAGE:
            specs.append(build.kafka_spec())
        if self.redis_image == build.REDIS_IMAGE:
            specs.append(build.redis_spec())
        client = docker.DockerClient(base_url=self.docker_host)
        try:
            return build.ensure_images(client, specs)
        finally:
            client.close()

    def start(self) -> None:
        from testcontainers.core.container import DockerContainer

        self._env = contextlib.ExitStack()
        self._env.enter_context(docker_env(self.docker_host))
        try:
            if self.build_missing:
                self.build_images()
            from testcontainers.community.redis import RedisContainer

            self.redis = RedisContainer(self.redis_image)
            self.redis.start()
            self._redis_port = int(self.redis.get_exposed_port(6379))
            self.kafka = DockerContainer(self.kafka_image).with_command(list(build.kafka_command(self.kafka_port)))
            # on loopback only, at the port the broker advertises
            self.kafka.ports[f"{build.KAFKA_CONTAINER_PORT}/tcp"] = ("127.0.0.1", self.kafka_port)
            self.kafka.start()
            self._kafka_ready()
        except BaseException:
            self.stop()
            raise

    def _kafka_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not kafka_answers(self.kafka_bootstrap):
            self.kafka.reload()
            if self.kafka.status not in ("created", "running") or time.monotonic() > deadline:
                logs = b"".join(self.kafka.get_logs()).decode(errors="replace")[-2000:]
                raise SystemFailure(
                    f"kafka container {self.kafka_image} on {self.kafka_bootstrap} is "
                    f"{self.kafka.status} and does not answer; its log:\n{logs}"
                )
            time.sleep(0.1)
        ensure_topics(self.kafka_bootstrap, DEFAULT_TOPICS)

    def stop(self) -> None:
        for container in (self.kafka, self.redis):
            if container is not None:
                with contextlib.suppress(Exception):
                    container.stop()
        self.kafka = self.redis = None
        if self._env is not None:
            self._env.close()
            self._env = None

    def stop_kafka(self) -> None:
        # stop, not remove: the container's /data (Kafka's log) survives, as a broker's disk would
        self.kafka.get_wrapped_container().stop(timeout=10)

    def start_kafka(self) -> None:
        self.kafka.get_wrapped_container().start()
        self._kafka_ready()

    def describe(self) -> str:
        return (
            f"containers on {self.docker_host}: {self.kafka_image} {self.kafka_bootstrap}, "
            f"{self.redis_image} {self.redis_url if self._redis_port else '(not started)'}"
        )


# --------------------------------------------------------------------------- a Docker daemon of our own


class DockerUnavailable(RuntimeError):
    """No Docker daemon can run here; the message says precisely why."""


@dataclass
class DockerDaemon:
    """Debian's dockerd started by hand, its state under a temporary directory, stopped by PID."""

    root: Path
    proc: subprocess.Popen[bytes]
    log_file: Path

    @property
    def host(self) -> str:
        return f"unix://{self.root}/docker.sock"

    @classmethod
    def start(cls, timeout: float = 60.0, install: bool = True) -> DockerDaemon:
        """Start dockerd (installing Debian's docker.io first if missing and we are root)."""
        if os.geteuid() != 0:
            raise DockerUnavailable(f"dockerd needs root and this process runs as uid {os.geteuid()}")
        dockerd = shutil.which("dockerd")
        if dockerd is None and install:
            install_docker_io()
            dockerd = shutil.which("dockerd")
        if dockerd is None:
            raise DockerUnavailable("dockerd is not installed (Debian package docker.io)")
        # a short path: containerd's socket goes under exec-root and unix socket paths are <108 bytes
        root = Path(tempfile.mkdtemp(prefix="nsdock-", dir="/tmp"))
        log_file = root / "dockerd.log"
        with log_file.open("wb") as out:
            proc = subprocess.Popen(
                [dockerd, "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
                 "--pidfile", str(root / "docker.pid"), "-H", f"unix://{root}/docker.sock"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        daemon = cls(root, proc, log_file)
        deadline = time.monotonic() + timeout
        while (why := docker_answers(daemon.host, timeout=2.0)) is not None:
            if proc.poll() is not None or time.monotonic() > deadline:
                state = (
                    f"exited with code {proc.returncode}"
                    if proc.poll() is not None
                    else f"did not answer in {timeout:.0f} s"
                )
                tail = log_tail(log_file, 15)
                daemon.stop()
                raise DockerUnavailable(f"dockerd {state} ({why}); the end of its log:\n{tail}")
            time.sleep(0.2)
        return daemon

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM dockerd (it stops its containers and its containerd), SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        # dockerd unmounts its layers on a clean exit; a leftover mount just keeps a directory behind
        shutil.rmtree(self.root, ignore_errors=True)


def install_docker_io(timeout: float = 900.0) -> None:
    """``apt-get install docker.io`` (root only); DockerUnavailable with apt's own words on failure."""
    apt = shutil.which("apt-get")
    if apt is None:
        raise DockerUnavailable("dockerd is missing and there is no apt-get to install docker.io")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = [apt, "install", "-y", "--no-install-recommends", "docker.io"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if done.returncode != 0 and "Unable to locate package" in done.stderr:
        subprocess.run([apt, "update"], capture_output=True, text=True, env=env, timeout=timeout, check=False)
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if done.returncode != 0:
        raise DockerUnavailable(f"apt-get install docker.io failed ({done.returncode}): {done.stderr.strip()[-800:]}")


# --------------------------------------------------------------------------- the system


class System:
    """Kafka, Redis, two nodes and the streaming job; see the module docstring."""

    def __init__(
        self,
        infra: Infra,
        run_dir: Path,
        timing: Timing | None = None,
        nodes: int = 2,
        streaming_set: dict[str, str] | None = None,
        node_metrics: bool = False,
    ) -> None:
        self.infra = infra
        #: extra ``-D key=value`` for the job (e.g. kafka.maxOffsetsPerTrigger=10000), after ours
        self.streaming_set = dict(streaming_set or {})
        self.run_dir = run_dir
        self.timing = timing or Timing()
        self.node_ports = [free_port() for _ in range(nodes)]
        #: each node's Prometheus endpoint (:meth:`node_metrics`), when asked for
        self.metrics_ports = [free_port() for _ in range(nodes)] if node_metrics else []
        self.checkpoint_dir = run_dir / "checkpoint"
        self.nodes: list[NodeService | None] = [None] * nodes
        self.streaming: StreamingJob | None = None
        self._runs: dict[str, int] = {}
        self._tap: KafkaTap | None = None

    # -- addresses

    @property
    def backend(self) -> str:
        return self.infra.name

    @property
    def kafka_bootstrap(self) -> str:
        return self.infra.kafka_bootstrap

    @property
    def redis_url(self) -> str:
        return self.infra.redis_url

    @property
    def node_addrs(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.node_ports]

    @property
    def namesrv_addr(self) -> str:
        """``host:port;host:port`` as brokers and clients take it."""
        return ";".join(self.node_addrs)

    def _run_dir(self, name: str) -> Path:
        self._runs[name] = self._runs.get(name, 0) + 1
        return self.run_dir / f"{name}-{self._runs[name]}"

    # -- whole system

    def start(self) -> None:
        try:
            self.infra.start()
            self._tap = KafkaTap(self.kafka_bootstrap)
            heard = self.launch_streaming()  # the nodes start while its JVM boots
            for i in range(len(self.nodes)):
                self.start_node(i)
            self.await_streaming(heard)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.streaming is not None:
            pid = self.streaming.status().pid
            children = descendants(pid) if pid is not None else []
            with contextlib.suppress(ServiceError):
                self.streaming.stop(timeout=20)
            reap(children)
        for i in range(len(self.nodes)):
            self.stop_node(i)
        if self._tap is not None:
            self._tap.close()
        self.infra.stop()

    def describe(self) -> str:
        lines = [self.infra.describe()]
        for i, node in enumerate(self.nodes):
            lines.append(f"node-{i + 1} {self.node_addrs[i]} log {node.log_file if node else '-'}")
        if self.streaming is not None:
            lines.append(
                f"streaming log {self.streaming.log_file}, checkpoint {self.checkpoint_dir}"
                + (f", extra settings {self.streaming_set}" if self.streaming_set else "")
            )
        return "\n".join(lines)

    # -- nodes

    def node_properties(self, i: int, *, warm_start: bool) -> dict[str, str]:
        t = self.timing
        data = self.run_dir / f"node-{i + 1}-data"
        return {
            "bindAddress": "127.0.0.1",
            "listenPort": str(self.node_ports[i]),
            "nodeName": f"node-{i + 1}",
            "kafkaBootstrapServers": self.kafka_bootstrap,
            "redisUrl": self.redis_url,
            "warmStartFromRedis": str(warm_start).lower(),
            **_set("tickIntervalMillis", t.tick_ms),
            **_set("monitorSilenceFallbackMillis", t.monitor_fallback_ms),
            "kvConfigPath": str(data / "kvConfig.json"),
            "configStorePath": str(data / "namesrv.properties"),
            **({"metricsPort": str(self.metrics_ports[i])} if self.metrics_ports else {}),
        }

    def start_node(self, i: int, *, warm_start: bool = False) -> float:
        """Start node ``i``; returns the seconds until it answered."""
        node = NodeService(
            port=self.node_ports[i],
            run_dir=self._run_dir(f"node-{i + 1}"),
            conf=REPO / "conf" / "namesrv.properties",
            properties=self.node_properties(i, warm_start=warm_start),
        )
        t0 = time.monotonic()
        node.start()
        self.nodes[i] = node
        return time.monotonic() - t0

    def stop_node(self, i: int) -> None:
        node = self.nodes[i]
        if node is not None:
            with contextlib.suppress(ServiceError):
                node.stop()

    def node_metrics(self, i: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
        """Node ``i``'s Prometheus metrics: sample name -> {sorted label items: value} (``node_metrics=True``)."""
        from prometheus_client.parser import text_string_to_metric_families

        assert self.metrics_ports, "System(node_metrics=True) gives the nodes a metrics endpoint"
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_ports[i]}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
        return out

    def node_log(self, i: int) -> str:
        node = self.nodes[i]
        return node.log_file.read_text(errors="replace") if node else ""

    # -- Kafka

    def stop_kafka(self) -> None:
        self.infra.stop_kafka()

    def start_kafka(self) -> None:
        self.infra.start_kafka()

    # -- the streaming job

    def streaming_overrides(self) -> dict[str, str]:
        t = self.timing
        return {
            "kafka.bootstrap": self.kafka_bootstrap,
            "redis.url": self.redis_url,
            "monitor.checkpointDir": str(self.checkpoint_dir),
            **_set("monitor.triggerIntervalMillis", t.trigger_ms),
            **_set("monitor.watermarkDelayMillis", t.watermark_delay_ms),
            **_set("monitor.heartbeatIntervalMillis", t.monitor_heartbeat_ms),
            "monitor.id": "it-monitor",
            **self.streaming_set,
        }

    @property
    def streaming_pid(self) -> int | None:
        return None if self.streaming is None else self.streaming.status().pid

    def committed_batch(self) -> int:
        """The last micro-batch the job wrote to Redis (-1 before the first)."""
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=5)
        try:
            return int(client.hget("namesrv:meta", "batchId") or -1)
        finally:
            client.close()

    def start_streaming(self, timeout: float = 240.0) -> float:
        """Start the job; returns the seconds until it wrote a micro-batch and sent a MONITOR_HEARTBEAT.

        Spark is slow to start and its first batch is the slowest; the system is ready only when a
        batch is committed, or the first scenario would wait for it on its own clock.
        """
        t0 = time.monotonic()
        self.await_streaming(self.launch_streaming(), timeout)
        return time.monotonic() - t0

    def launch_streaming(self) -> Callable[[], bool]:
        """Start the job's process; returns whether it has since sent a MONITOR_HEARTBEAT and committed a batch."""
        since_ms = int(time.time() * 1000)
        batch_before = self.committed_batch()
        self.streaming = StreamingJob(
            run_dir=self._run_dir("streaming"),
            conf=REPO / "conf" / "streaming.properties",
            overrides=self.streaming_overrides(),
        )
        self.streaming.start()
        assert self._tap is not None
        job, tap = self.streaming, self._tap

        def heard() -> bool:
            if job.status().pid is None:
                raise SystemFailure(
                    f"the streaming job exited; its log {job.log_file} ends with:\n" f"{log_tail(job.log_file)}"
                )
            return (
                any(a.type == "MONITOR_HEARTBEAT" and a.decided_at >= since_ms for a in tap.actions())
                and self.committed_batch() > batch_before
            )

        return heard

    def await_streaming(self, heard: Callable[[], bool], timeout: float = 240.0) -> None:
        wait_until(heard, timeout, "the streaming job's first MONITOR_HEARTBEAT and committed batch", interval=0.3)

    def kill_streaming(self) -> int:
        """SIGKILL the job (no shutdown, no final checkpoint); returns the PID killed."""
        assert self.streaming is not None
        pid = self.streaming.status().pid
        assert pid is not None, "the streaming job is not running"
        children = descendants(pid)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not pid_alive(pid), 10, f"streaming pid {pid} to die")
        self.streaming.status()  # reaps our child and drops the stale pidfile
        reap(children)
        return pid

    def streaming_signal(self, sig: signal.Signals) -> None:
        """``sig`` to the job's driver and every process under it (its JVM, its Python workers)."""
        assert self.streaming is not None
        pid = self.streaming.status().pid
        assert pid is not None, "the streaming job is not running"
        for p in [pid, *(p for p, _ in descendants(pid))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)

    @contextlib.contextmanager
    def streaming_frozen(self) -> Iterator[None]:
        """The job stopped (SIGSTOP) for the block, as a hung driver or a long pause is, and continued after it."""
        self.streaming_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.streaming_signal(signal.SIGCONT)

    @contextlib.contextmanager
    def streaming_slowed(self, stopped_s: float, running_s: float) -> Iterator[None]:
        """The job stopped for ``stopped_s`` in every ``stopped_s + running_s`` during the block, as a driver
        starved of CPU is: its batches take that many times longer, and its event time falls behind."""
        done = threading.Event()

        def throttle() -> None:
            while not done.is_set():
                self.streaming_signal(signal.SIGSTOP)
                done.wait(stopped_s)
                self.streaming_signal(signal.SIGCONT)
                done.wait(running_s)

        thread = threading.Thread(target=throttle, name="streaming-throttle", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(10)
            self.streaming_signal(signal.SIGCONT)

    def restart_streaming(self, *, kill: bool = True) -> float:
        """SIGKILL (or SIGTERM) the job and start it again from its checkpoint; returns the start-up seconds."""
        if kill:
            self.kill_streaming()
        else:
            assert self.streaming is not None
            pid = self.streaming.status().pid
            children = descendants(pid) if pid is not None else []
            self.streaming.stop(timeout=20)
            reap(children)
        return self.start_streaming()

    # -- what the system says

    @property
    def tap(self) -> KafkaTap:
        assert self._tap is not None, "start() first"
        return self._tap


def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), to tell it from a later one with its PID."""
    st = procfs.stat(pid)
    return None if st is None else st.start_time


def reap(procs: list[tuple[int, int]], grace: float = 15.0) -> None:
    """Wait for the job's children (the JVM and its Python workers) to go, SIGKILL those that stay.

    The JVM exits by itself when the pipe from its Python driver closes; this only helps it.
    A process counts as the same one only while its start time matches (PIDs get reused).
    """

    def alive() -> list[int]:
        return [pid for pid, started in procs if pid_alive(pid) and _start_time(pid) == started]

    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in alive():
        log.warning("streaming child pid %d outlived its parent by %.0f s; SIGKILL", pid, grace)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[tuple[int, int]]:
    """Every process below ``pid`` with its start time."""
    return [(st.pid, st.start_time) for st in procfs.descendants(pid)]


# --------------------------------------------------------------------------- reading Kafka


@dataclass(frozen=True)
class Seen:
    """A record and when the tap read it (monotonic seconds)."""

    value: Any
    at: float
    offset: int
    partition: int


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> end offset of ``topic`` (Kafka's ListOffsets)."""
    from kafka import TopicPartition

    consumer = kafka_clients.consumer(bootstrap, timeout_ms=5000)
    try:
        ids = wait_until(lambda: consumer.partitions_for_topic(topic), 15, f"topic {topic}")
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in sorted(ids)])
        return {tp.partition: int(offset) for tp, offset in ends.items()}
    finally:
        consumer.close()


class KafkaTap:
    """Every record of the events, actions and alerts topics, read from the beginning in a thread."""

    def __init__(self, bootstrap: str, topics: tuple[str, ...] = (EVENTS, ACTIONS, ALERTS)) -> None:
        from kafka import TopicPartition

        from namesrv.events.schema import decode_action, decode_event
        from streaming.alerts import decode_alert

        self._decoders = {EVENTS: decode_event, ACTIONS: decode_action, ALERTS: decode_alert}
        self._bootstrap = bootstrap
        self._consumer = kafka_clients.consumer(
            bootstrap,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            timeout_ms=5000,
            reconnect_backoff_max_ms=500,
        )
        parts = []
        for topic in topics:
            ids = wait_until(lambda t=topic: self._consumer.partitions_for_topic(t), 15, f"topic {topic}")
            parts += [TopicPartition(topic, p) for p in sorted(ids)]
        self._consumer.assign(parts)
        self._consumer.seek_to_beginning(*parts)
        self._records: dict[str, list[Seen]] = {t: [] for t in topics}
        #: (topic, partition) -> the offset after the last record read there
        self._next: dict[tuple[str, int], int] = {}
        self.malformed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kafka-tap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                polled = self._consumer.poll(timeout_ms=100)  # the broker holds an empty fetch up to 100 ms
            except Exception as exc:  # noqa: BLE001 - a restarting broker; kafka-python reconnects
                log.debug("tap poll failed: %r", exc)
                self._stop.wait(0.2)
                continue
            now = time.monotonic()
            with self._lock:
                for tp, records in polled.items():
                    if records:
                        self._next[(tp.topic, tp.partition)] = records[-1].offset + 1
                    for r in records:
                        try:
                            value = self._decoders[tp.topic](r.value)
                        except (ValueError, TypeError):  # TypeError: a null value
                            self.malformed += 1
                            continue
                        self._records[tp.topic].append(Seen(value, now, r.offset, tp.partition))

    def seen(self, topic: str) -> list[Seen]:
        with self._lock:
            return list(self._records[topic])

    def events(self) -> list[Any]:
        return [s.value for s in self.seen(EVENTS)]

    def reached(self, topic: str) -> bool:
        """True once the tap has read every partition of ``topic`` up to its end offset as of now."""
        ends = end_offsets(self._bootstrap, topic)
        with self._lock:
            return all(self._next.get((topic, p), 0) >= end for p, end in ends.items())

    def actions(self) -> list[Any]:
        return [s.value for s in self.seen(ACTIONS)]

    def alerts(self) -> list[Any]:
        return [s.value for s in self.seen(ALERTS)]

    def decisions(self, broker_addr: str) -> list[str]:
        """The EXPIRE / REMOVE actions published for ``broker_addr``, in order."""
        return [
            str(a.type) for a in self.actions() if a.broker_addr == broker_addr and str(a.type) in ("EXPIRE", "REMOVE")
        ]

    def alerts_for(self, broker_addr: str, kind: str) -> list[Any]:
        return [a for a in self.alerts() if a.broker_addr == broker_addr and str(a.kind) == kind]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


# --------------------------------------------------------------------------- simulated brokers


class FleetRunner:
    """Ticks named fleets in one thread; a silenced fleet keeps its connections and sends nothing."""

    def __init__(self) -> None:
        self.fleets: dict[str, Fleet] = {}
        self.events: list[tuple[float, str, str, dict[str, Any]]] = []
        self._silent: set[str] = set()
        self._held: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-runner", daemon=True)
        self._thread.start()

    def add(self, name: str, namesrv: list[str], timing: Timing, **config: Any) -> Fleet:
        """A one-group fleet named ``name`` (broker ``<name>-0``) that registers on the next tick."""
        settings: dict[str, Any] = dict(
            namesrv=tuple(namesrv), brokers=1, broker_prefix=f"{name}-", topic_prefix=f"T{name.upper()}",
            heartbeat_interval=timing.broker_heartbeat_s, heartbeat_timeout_ms=timing.broker_timeout_ms,
            timeout=2.0, backoff_initial=0.3, backoff_max=1.0, summary_interval=3600.0,
        )  # fmt: skip
        settings.update(config)
        cfg = FleetConfig(**settings)
        fleet = Fleet(
            cfg,
            on_event=lambda kind, fields, n=name: self.events.append((time.monotonic(), n, kind, fields)),
            rng=random.Random(len(self.fleets)),
        )
        with self._lock:
            self.fleets[name] = fleet
        return fleet

    def broker(self, name: str) -> tuple[str, str]:
        """(brokerName, brokerAddr) of the fleet's master."""
        m = self.fleets[name].members[0]
        return m.name, m.addr

    def silence(self, name: str) -> float:
        """From now on the fleet sends nothing; returns the time of its last heartbeat round (monotonic)."""
        with self._lock:
            self._silent.add(name)
            self.fleets[name].on_event("silenced", {})
            return time.monotonic()

    def unregister(self, name: str) -> None:
        """UNREGISTER_BROKER at every node, then close (a broker's clean shutdown)."""
        with self._lock:
            self._silent.add(name)
            self.fleets[name].shutdown(unregister=True)

    def crash(self, name: str) -> None:
        """Close every connection of the fleet without a word, as a SIGKILLed broker's kernel does."""
        with self._lock:
            self._silent.add(name)
            self.fleets[name].shutdown(unregister=False)

    def drop_link(self, name: str, namesrv: str) -> None:
        """Close the fleet's connection to ``namesrv`` only (hold it first, or it reconnects)."""
        with self._lock:
            for m in self.fleets[name].members:
                m.links[namesrv].conn.close()

    def hold(self, namesrv: str) -> None:
        """No fleet reconnects to ``namesrv`` until :meth:`release` (links that are up stay up)."""
        with self._lock:
            self._held.add(namesrv)

    def release(self, namesrv: str) -> None:
        with self._lock:
            self._held.discard(namesrv)

    def links_up(self, namesrv: str) -> int:
        """How many brokers of the ticking fleets are registered at ``namesrv`` now."""
        with self._lock:
            return sum(
                m.links[namesrv].up
                for name, f in self.fleets.items()
                if name not in self._silent
                for m in f.members
                if m.state is State.LIVE
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                now = time.monotonic()
                due = now + 0.5
                for name, fleet in self.fleets.items():
                    if name in self._silent:
                        continue
                    for m in fleet.members:
                        for ns in self._held:
                            link = m.links.get(ns)
                            if link is not None and not link.up:
                                link.retry_at = max(link.retry_at, now + 0.2)
                    fleet.tick(now)
                    due = min(due, fleet.next_due())
            self._stop.wait(max(0.02, min(due - time.monotonic(), 0.25)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for fleet in self.fleets.values():
            fleet.close()


# --------------------------------------------------------------------------- reading routes


@dataclass(frozen=True)
class Answer:
    at: float
    node: str
    #: "ok", a ResponseCode name, or "down"
    outcome: str
    broker_addrs: tuple[str, ...] = ()


def route_or_none(addr: str, topic: str, timeout: float = 3.0) -> bytes | None:
    """The route body ``addr`` answers for ``topic``, None for TOPIC_NOT_EXIST."""
    with NameServerClient(addr, timeout=timeout) as c:
        response = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert response is not None
    if response.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert response.code == ResponseCode.SUCCESS, (addr, topic, response.code, response.remark)
    return response.body


def same_route(a: bytes | None, b: bytes | None) -> bool:
    """Equal routes, whatever the order of their lists (clients sort them; two nodes that learnt the
    brokers in another order list them in another order, as Apache RocketMQ's HashMaps do)."""
    if a is None or b is None:
        return a is b
    ra, rb = bodies.decode_route(a), bodies.decode_route(b)
    for r in (ra, rb):
        r.queue_datas.sort(key=lambda q: q.broker_name)
        r.broker_datas.sort(key=lambda d: d.broker_name)
    return ra == rb


def brokers_at(addr: str, timeout: float = 3.0) -> dict[str, dict[int, str]]:
    """brokerName -> {brokerId: addr} from the node's cluster info (groups without addresses left out)."""
    with NameServerClient(addr, timeout=timeout) as c:
        table = c.cluster_info()[0]
    return {name: dict(b.broker_addrs) for name, b in table.items() if b.broker_addrs}


class RouteProbe:
    """Asks every node for ``topic``'s route every ``interval`` s, as a client would, and records the answers."""

    def __init__(self, addrs: list[str], topic: str, interval: float = 0.25) -> None:
        self.addrs = addrs
        self.topic = topic
        self.interval = interval
        self.answers: list[Answer] = []
        self._clients = {a: NameServerClient(a, timeout=2.0) for a in addrs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="route-probe", daemon=True)
        self._thread.start()

    def _ask(self, addr: str) -> Answer:
        client = self._clients[addr]
        try:
            response = client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": self.topic})
        except OSError:
            client.close()
            return Answer(time.monotonic(), addr, "down")
        assert response is not None
        if response.code != ResponseCode.SUCCESS:
            name = (
                ResponseCode(response.code).name
                if response.code in ResponseCode._value2member_map_
                else str(response.code)
            )
            return Answer(time.monotonic(), addr, name)
        route = bodies.decode_route(response.body)
        addrs = tuple(sorted(a for bd in route.broker_datas for a in bd.broker_addrs.values()))
        return Answer(time.monotonic(), addr, "ok", addrs)

    def _run(self) -> None:
        while not self._stop.is_set():
            for addr in self.addrs:
                answer = self._ask(addr)
                self.answers.append(answer)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for client in self._clients.values():
            client.close()


# --------------------------------------------------------------------------- the C++ client


@dataclass
class CppRun:
    label: str
    namesrv: str
    result: dict[str, Any]
    seconds: float
    #: the SEND_MESSAGE the fake broker received for this run, if any
    delivered: bool = False


def run_cpp_producer(namesrv: str, topic: str, log_home: Path, timeout: float = 60.0) -> tuple[dict[str, Any], float]:
    """Run ``tests/peers/cpp_producer.py`` (C++ client 1.0.1) once; its JSON result and how long it took."""
    log_home.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "peers" / "cpp_producer.py"), "--namesrv", namesrv, "--topic", topic,
         "--log-home", str(log_home), "--hard-exit", "--send-timeout-ms", "3000"],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = (
        json.loads(lines[-1])
        if lines
        else {"ok": False, "error": f"no result (exit {done.returncode})", "stderr": done.stderr[-1500:]}
    )
    return result, time.monotonic() - t0


#: lines printed in pytest's terminal summary (conftest), one block per scenario run
SUMMARY: list[str] = []


def report(line: str) -> None:
    """``line`` at once (under ``-s``) and again in the terminal summary."""
    SUMMARY.append(line)
    print("\n" + line)


@dataclass
class Record:
    """What a scenario measured, printed at the end of the run."""

    durations: dict[str, float] = field(default_factory=dict)
    cpp: list[CppRun] = field(default_factory=list)
    #: (node, start, end): windows in which a node was allowed not to know a topic
    allowed_gaps: list[tuple[str, float, float]] = field(default_factory=list)
    #: (node, start, end): windows in which a node was stopped on purpose
    down: list[tuple[str, float, float]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"  {k:<48} {v:6.1f} s" for k, v in self.durations.items()]
        out += [
            f"  C++ client [{r.label}] via {r.namesrv}: ok={r.result.get('ok')} delivered={r.delivered} "
            f"{r.seconds:.1f} s"
            for r in self.cpp
        ]
        return out


# --------------------------------------------------------------------------- a scenario's tools together


class Scenario:
    """A running :class:`System` with a fake broker, simulated brokers, a Kafka tap and Redis lookups.

    The fleet named ``live`` (add it first) gets the fake broker's address, so a real client that
    reads its topics' routes sends there.
    """

    def __init__(self, system: System, tmp: Path) -> None:
        from streaming.routes import RouteLookup
        from tests.peers.fake_broker import FakeBroker

        self.system = system
        self.tmp = tmp
        self.fake = FakeBroker().start()
        self.fleets = FleetRunner()
        self.lookup = RouteLookup(system.redis_url)
        self.record = Record()
        self.probe: RouteProbe | None = None

    @property
    def tap(self) -> KafkaTap:
        return self.system.tap

    def add_fleet(self, name: str, addr_base: str | None = None, **config: Any) -> tuple[str, str]:
        """Start broker ``<name>-0`` (topics ``T<NAME>0``…) at both nodes; returns (brokerName, brokerAddr)."""
        if addr_base is None:
            addr_base = self.fake.address if name == "live" else f"127.0.0.1:{41000 + 10 * len(self.fleets.fleets)}"
        self.fleets.add(name, self.system.node_addrs, self.system.timing, addr_base=addr_base, **config)
        return self.fleets.broker(name)

    # -- where a broker is known

    def at_nodes(self, broker_name: str) -> list[bool]:
        out = []
        for addr in self.system.node_addrs:
            try:
                out.append(broker_name in brokers_at(addr))
            except OSError:
                out.append(False)
        return out

    def in_redis(self, broker_name: str) -> bool:
        info = self.lookup.cluster_info()
        return info is not None and broker_name in {n for n, b in info[0].items() if b.broker_addrs}

    def everywhere(self, broker_name: str) -> bool:
        return all(self.at_nodes(broker_name)) and self.in_redis(broker_name)

    def nowhere(self, broker_name: str) -> bool:
        return not any(self.at_nodes(broker_name)) and not self.in_redis(broker_name)

    def batch_id(self) -> int:
        return int(self.lookup.status().get("batchId", -1))

    def let_the_job_run(self, batches: int = 3, timeout: float = 30.0) -> None:
        """Wait for ``batches`` more micro-batches written to Redis (for checks that something did not happen)."""
        start = self.batch_id()
        wait_until(lambda: self.batch_id() >= start + batches, timeout, f"{batches} more micro-batches", 0.2)

    def cpp(self, label: str, namesrv: str, topic: str = "TLIVE0") -> CppRun:
        """The C++ client sends one message to ``topic`` using the route it reads from ``namesrv``."""
        from tests.peers.fake_broker import SEND_CODES

        since = time.monotonic()
        result, seconds = run_cpp_producer(namesrv, topic, self.tmp / f"cpp-{len(self.record.cpp) + 1}")
        run = CppRun(label, namesrv, result, seconds)
        try:
            self.fake.wait_for(lambda f: f.code in SEND_CODES and f.topic == topic and f.received_at >= since, 5.0)
            run.delivered = True
        except TimeoutError:
            pass
        self.record.cpp.append(run)
        return run

    def close(self) -> None:
        if self.probe is not None:
            self.probe.stop()
        self.fleets.stop()
        self.fake.stop()
        self.lookup.close()
