"""The two interchangeable backends of the end-to-end suite's infra (Apache Kafka and Redis), and a third.

:class:`ProcessInfra` runs Kafka and redis-server as local processes, :class:`ContainerInfra` as
testcontainers containers from images built locally (:mod:`tests.integration.images.build`), on a Docker
daemon that answers or one started for the session (:class:`DockerDaemon`). :class:`ReplicatedInfra` is
Kafka as three KRaft nodes that a test fails one at a time. Each is the ``infra`` of a
:class:`tests.support.system.System`; ``tests/integration/conftest.py`` chooses between the first two.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from infra.config import DEFAULT_TOPICS
from infra.kafka import KafkaCluster, KafkaService, ensure_topics, kafka_admin
from infra.processes import ServiceError, free_port, tcp_answers
from infra.redis import RedisService
from tests.integration.images import build
from tests.support.system import ACTIONS, ALERTS, EVENTS, SystemFailure, log_tail
from tests.support.wait import wait_until

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


# --------------------------------------------------------------------------- infra: Kafka and Redis


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

    The replicated layout of docs/deploy.md (:class:`infra.kafka.KafkaCluster`: every node a broker and
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
