"""Apache Kafka as local processes: one KRaft node (:class:`KafkaService`), or N of them (:class:`KafkaCluster`).

A node is broker and controller in one JVM, run from the jars ``make setup`` resolved (``infra/jvm/pom.xml``)
as a :class:`~infra.processes.ProcessService`: its data under ``kafka.dataDir``, formatted once with
``kafka-storage format``, its JVM recognised by ``java`` running ``kafka.Kafka``, a data directory another
Kafka holds refused before a second JVM could wedge it.  Readiness is a metadata request through kafka-python.
A cluster starts its nodes together (a broker answers only once a majority of the controllers runs), gives
them one cluster id and puts the topics on every node.  Topic admin (:func:`kafka_admin`,
:func:`ensure_topics`) works on any Kafka, a real cluster too.  ``docs/deploy.md`` says why the replicated
settings are what they are (:func:`replicated_properties`).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import fcntl
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from common import kafka_clients, procfs
from common.kafka_security import KafkaSecurity
from common.options import ConfigError
from common.properties import parse_properties
from infra.config import SOURCE, ServicesConfig, TopicSpec, format_topics
from infra.processes import (
    LOG_TAIL_BYTES,
    LOOPBACK,
    BinaryNotFoundError,
    ProcessService,
    ServiceError,
    ServiceStatus,
    free_port,
    java_binary,
    jvm_jars,
    tcp_answers,
)

if TYPE_CHECKING:
    from kafka.admin import KafkaAdminClient

log = logging.getLogger(__name__)

KAFKA_MAIN = "kafka.Kafka"
#: the broker JVM's options besides -Xmx, the log4j2 file and the class path (the container image's too)
KAFKA_JVM_OPTIONS = (
    "-Xms64m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
)  # fmt: skip
#: a quiet broker: warnings and errors only, on stdout (the service's log file)
KAFKA_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


# --------------------------------------------------------------------------- kafka topics


@contextlib.contextmanager
def kafka_admin(
    bootstrap_servers: str, timeout: float = 10.0, security: KafkaSecurity | None = None
) -> Iterator[KafkaAdminClient]:
    """A kafka-python admin client that is closed on exit."""
    admin = kafka_clients.admin(
        bootstrap_servers, timeout_ms=max(100, int(timeout * 1000)), client_id="infra-services", security=security
    )
    try:
        yield admin
    finally:
        admin.close()


def ensure_topics(
    bootstrap_servers: str,
    topics: Sequence[TopicSpec],
    *,
    replication_factor: int = 1,
    configs: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    security: KafkaSecurity | None = None,
) -> list[str]:
    """Create the topics that are missing on a Kafka cluster; return the names created.

    ``configs`` are topic settings given at creation (e.g. ``min.insync.replicas``). An existing topic
    is left as it is, with a warning when its partition count or replication factor differs.
    Uses kafka-python 3.x's dict form of ``create_topics`` (NewTopic is deprecated there).
    """
    from kafka.errors import TopicAlreadyExistsError

    wanted = {t.name: t.partitions for t in topics}
    if not wanted:
        return []
    ms = int(timeout * 1000)
    created: list[str] = []
    settings = {"replication_factor": replication_factor, "configs": dict(configs or {})}
    with kafka_admin(bootstrap_servers, timeout, security) as admin:
        response = admin.create_topics(
            {name: {"num_partitions": n, **settings} for name, n in wanted.items()},
            timeout_ms=ms,
            raise_errors=False,
        )
        for result in response["topics"]:
            code = result["error_code"]
            if code == 0:
                created.append(result["name"])
            elif code != TopicAlreadyExistsError.errno:
                raise ServiceError(
                    f"kafka: creating topic {result['name']} on {bootstrap_servers} failed: "
                    f"error {code} {result.get('error_message') or ''}".rstrip()
                )
        admin.wait_for_topics(list(wanted), timeout_ms=ms)
        for info in admin.describe_topics(list(wanted)):
            have, want = len(info["partitions"]), wanted[info["name"]]
            replicas = {len(p["replica_nodes"]) for p in info["partitions"]}
            if have != want or replicas != {replication_factor}:
                log.warning(
                    "kafka: topic %s has %d partitions of %s replicas, configured %d of %d; delete it (locally: "
                    "stop and remove kafka.dataDir) to recreate it",
                    info["name"],
                    have,
                    "/".join(map(str, sorted(replicas))),
                    want,
                    replication_factor,
                )
    if created:
        log.info("kafka: created topics %s on %s", ", ".join(created), bootstrap_servers)
    return created


# --------------------------------------------------------------------------- one node


def data_dir_locked(data_dir: Path) -> bool:
    """True while a Kafka process holds ``data_dir/.lock`` (Java's ``FileChannel.tryLock``: an fcntl lock)."""
    try:
        fd = os.open(data_dir / ".lock", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def kafka_cluster_id() -> str:
    """A fresh KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid form).

    Never one starting with ``-``, as Kafka's own Uuid.randomUuid: ``kafka-storage format -t`` would take it
    for an option and refuse to format (one id in 64).
    """
    while (cluster_id := base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()).startswith("-"):
        pass
    return cluster_id


class KafkaService(ProcessService):
    """Apache Kafka as one KRaft node (broker and controller in one JVM) on a loopback port, with our topics.

    ``listener`` is the client listener's security protocol; ``broker_properties`` are added to (and
    win over) the generated server.properties, for SASL and TLS settings; ``format_args`` go to
    ``kafka-storage format`` (e.g. ``--add-scram``). ``security`` is what our own probe and topic
    creation present. Alone it is node 1 and its own controller quorum; as one node of a
    :class:`KafkaCluster` it gets its ``node_id``, the quorum's ``voters`` (node id, controller
    address) and the cluster's ``cluster_id``.
    """

    name = "kafka"
    port_key = "kafka.port"
    backend_key = "kafka"

    def __init__(
        self,
        *,
        port: int,
        run_dir: Path,
        controller_port: int | None = None,
        data_dir: Path | None = None,
        topics: Sequence[TopicSpec] = (),
        host: str = LOOPBACK,
        start_timeout: float = 60.0,
        heap: str = "512m",
        listener: str = "PLAINTEXT",
        broker_properties: Mapping[str, str] | None = None,
        format_args: Sequence[str] = (),
        security: KafkaSecurity | None = None,
        node_id: int = 1,
        voters: Sequence[tuple[int, str]] = (),
        cluster_id: str | None = None,
        name: str = "kafka",
    ) -> None:
        super().__init__(port=port, run_dir=run_dir, host=host, start_timeout=start_timeout)
        self.name = name
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.controller_port = controller_port if controller_port is not None else free_port(host)
        self.voters = tuple(voters) or ((node_id, f"{host}:{self.controller_port}"),)
        self.data_dir = Path(data_dir) if data_dir is not None else self.run_dir / f"kafka-{port}"
        self.topics = tuple(topics)
        self.heap = heap
        self.listener = listener
        self.broker_properties = dict(broker_properties or {})
        self.format_args = tuple(format_args)
        self.security = security

    @classmethod
    def from_config(cls, config: ServicesConfig, **overrides: object) -> KafkaService:
        kwargs: dict[str, object] = dict(
            port=config.kafka_port,
            controller_port=config.kafka_controller_port,
            run_dir=config.run_dir,
            data_dir=config.kafka_data_dir,
            topics=config.kafka_topics,
            heap=config.kafka_heap,
        )
        kwargs.update(overrides)
        return cls(**kwargs)  # type: ignore[arg-type]

    @property
    def backend(self) -> str:
        return "apache-kafka"

    @property
    def bootstrap_servers(self) -> str:
        return self.address

    @property
    def config_file(self) -> Path:
        # the port in the name puts it in the command line, where _runs_as_configured looks for it
        return self.run_dir / f"kafka-{self.port}.properties"

    def _binary(self) -> Path:
        jvm_jars("kafka-broker")
        return java_binary()

    def _known_binaries(self) -> list[Path]:
        with contextlib.suppress(BinaryNotFoundError):
            return [java_binary()]
        return []

    def _tracked_pid(self) -> int | None:
        pid = super()._tracked_pid()
        # every JVM runs as java: ours is the one whose command line runs Kafka
        if pid is not None and KAFKA_MAIN not in (procfs.cmdline(pid) or [KAFKA_MAIN]):
            log.info("%s: pid %d is not Kafka any more; removing stale pidfile", self.name, pid)
            self.pidfile.unlink(missing_ok=True)
            return None
        return pid

    def server_properties(self) -> dict[str, str]:
        client, controller = f"{self.host}:{self.port}", f"{self.host}:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": ",".join(f"{node}@{address}" for node, address in self.voters),
            "controller.listener.names": "CONTROLLER",
            "listeners": f"{self.listener}://{client},CONTROLLER://{controller}",
            "advertised.listeners": f"{self.listener}://{client}",
            "inter.broker.listener.name": self.listener,
            "listener.security.protocol.map": f"{self.listener}:{self.listener},CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            # one node: every internal topic has one replica
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        props.update(self.broker_properties)
        return props

    def _write_config(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in self.server_properties().items()]
        self.config_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
        (self.run_dir / "kafka-log4j2.properties").write_text(KAFKA_LOG4J2, encoding="utf-8")

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            str(self._binary()), f"-Xmx{self.heap}", *KAFKA_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.run_dir / 'kafka-log4j2.properties'}",
            "-cp", f"{jvm_jars('kafka-broker')}/*",
            main, *args,
        ]  # fmt: skip

    def format_storage(self) -> None:
        """``kafka-storage format`` once per data directory (it keeps meta.properties there)."""
        self._write_config()
        if (self.data_dir / "meta.properties").is_file():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = self._java(
            "kafka.tools.StorageTool", "format", "--ignore-formatted",
            "-t", self.cluster_id or kafka_cluster_id(), "-c", str(self.config_file), *self.format_args,
        )  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise ServiceError(
                f"kafka: formatting {self.data_dir} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-LOG_TAIL_BYTES:]}"
            )

    def _command(self, binary: Path) -> list[str]:
        if data_dir_locked(self.data_dir):
            # a second broker+controller JVM writes the metadata log before its broker half finds the
            # lock taken: it would wedge the running one, so it is never started
            raise ServiceError(
                f"kafka: {self.data_dir} is in use by another Kafka process (it holds {self.data_dir / '.lock'}); "
                "stop that one or set kafka.dataDir to another directory"
            )
        self.format_storage()
        return self._java(KAFKA_MAIN, str(self.config_file))

    def _probe(self, timeout: float) -> bool:
        # A cheap TCP check first: kafka-python logs errors and backs off on refused
        # connections, which would slow the polling loop and clutter the output.
        if not tcp_answers(self.host, self.port, timeout):
            return False
        try:
            with kafka_admin(self.bootstrap_servers, timeout, security=self.security) as admin:
                admin.list_topics()  # a MetadataRequest round trip
            return True
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            log.debug("kafka probe on %s failed: %r", self.address, exc)
            return False

    def _after_ready(self) -> None:
        if self.topics:
            self.ensure_topics(self.topics)

    def ensure_topics(self, topics: Sequence[TopicSpec], timeout: float = 10.0) -> list[str]:
        """Create the missing topics on this broker; return the names created."""
        return ensure_topics(self.bootstrap_servers, topics, timeout=timeout, security=self.security)

    def _status_extra(self) -> dict[str, str]:
        extra = {"topics": format_topics(self.topics)} if self.topics else {}
        extra["controller"] = f"{self.host}:{self.controller_port}"
        extra["data_dir"] = str(self.data_dir)
        return extra


# --------------------------------------------------------------------------- a cluster of nodes


def replicated_properties(replicas: int, min_insync: int) -> dict[str, str]:
    """What each node of a replicated cluster adds to one node's server.properties (docs/deploy.md says why).

    Every topic, ours and Kafka's own, gets ``replicas`` copies, of which ``min_insync`` must hold a
    record before an ``acks=all`` producer is told it is written; a replica that fell out of sync never
    becomes leader (the default, stated): Kafka's documentation, "Availability and Durability Guarantees".
    """
    return {
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(min_insync),
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_insync),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_insync),
    }


def existing_cluster_id(data_dirs: Iterable[Path]) -> str | None:
    """The ``cluster.id`` a formatted KRaft data directory of these holds, if any (meta.properties)."""
    for data_dir in data_dirs:
        with contextlib.suppress(OSError, ValueError):
            found = parse_properties((data_dir / "meta.properties").read_text(encoding="utf-8")).get("cluster.id")
            if found:
                return found
    return None


class KafkaCluster:
    """N Apache Kafka KRaft nodes on loopback ports, each a broker and one of the N controllers, our topics
    on every node: the replicated layout of docs/deploy.md ("Kafka replicated").

    Node i (from 1) is a :class:`KafkaService` named ``kafka-i`` on client port ``ports[i-1]`` and
    controller port ``controller_ports[i-1]``, its data in ``<data_dir>-i``. Topics get N replicas and
    ``min.insync.replicas`` N - 1 (3 and 2 for three nodes), so one node may be down without a write
    failing or an acknowledged one being lost. The nodes start together, since a broker answers only once
    a majority of the controllers runs, and share one cluster id: the one their data directories already
    hold, else a fresh one.
    """

    def __init__(
        self,
        *,
        ports: Sequence[int],
        controller_ports: Sequence[int],
        run_dir: Path,
        data_dir: Path,
        topics: Sequence[TopicSpec] = (),
        heap: str = "512m",
        host: str = LOOPBACK,
        start_timeout: float = 90.0,
    ) -> None:
        if not ports or len(ports) != len(controller_ports):
            raise ValueError(f"one controller port per node: {list(ports)} and {list(controller_ports)}")
        if len({*ports, *controller_ports}) != 2 * len(ports):
            raise ConfigError(
                f"kafka: the nodes' ports {list(ports)} and controller ports {list(controller_ports)} overlap"
            )
        self.run_dir = Path(run_dir)
        self.host = host
        self.heap = heap
        self.start_timeout = start_timeout
        self.topics = tuple(topics)
        self.replicas = len(ports)
        self.min_insync = max(1, self.replicas - 1)
        self._ports = tuple(zip(ports, controller_ports, strict=True))
        self.voters = tuple((i, f"{host}:{c}") for i, (_, c) in enumerate(self._ports, 1))
        self.data_dirs = [Path(f"{data_dir}-{i}") for i in range(1, self.replicas + 1)]
        self.cluster_id = existing_cluster_id(self.data_dirs) or kafka_cluster_id()
        self.nodes = [self.node(i, self.run_dir) for i in range(1, self.replicas + 1)]

    @classmethod
    def from_config(cls, config: ServicesConfig, nodes: int) -> KafkaCluster:
        """``nodes`` nodes on ``kafka.port`` and ``kafka.controllerPort`` + 0, 2, 4 ... (19092/19093, 19094/19095, ...)."""
        ports = [config.kafka_port + 2 * i for i in range(nodes)]
        controllers = [config.kafka_controller_port + 2 * i for i in range(nodes)]
        if max(ports + controllers) > 65535:
            raise ConfigError(f"{SOURCE}: {nodes} Kafka nodes need ports up to {max(ports + controllers)}, past 65535")
        return cls(
            ports=ports, controller_ports=controllers, run_dir=config.run_dir, data_dir=config.kafka_data_dir,
            topics=config.kafka_topics, heap=config.kafka_heap,
        )  # fmt: skip

    def node(self, i: int, run_dir: Path) -> KafkaService:
        """Node ``i`` (from 1) as a service logging in ``run_dir``: a restarted node can log apart from its last run."""
        port, controller_port = self._ports[i - 1]
        return KafkaService(
            port=port, controller_port=controller_port, run_dir=run_dir, data_dir=self.data_dirs[i - 1],
            host=self.host, heap=self.heap, start_timeout=self.start_timeout, node_id=i, voters=self.voters,
            cluster_id=self.cluster_id, name=f"kafka-{i}",
            broker_properties=replicated_properties(self.replicas, self.min_insync),
        )  # fmt: skip

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def _each(self, action: Callable[[KafkaService], object]) -> None:
        """``action`` on every node at once; the first error, once all are done."""
        errors: list[BaseException] = []

        def run(node: KafkaService) -> None:
            try:
                action(node)
            except BaseException as exc:  # noqa: BLE001 - handed on below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(n,), name=f"{n.name}-control") for n in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def start(self) -> list[ServiceStatus]:
        """Start every node (reusing ours that run), then create the missing topics on N replicas."""
        try:
            self._each(lambda node: node.start())
        except BaseException:
            self.stop()
            raise
        self.ensure_topics(self.topics)
        return self.status()

    def ensure_topics(self, topics: Sequence[TopicSpec], timeout: float = 30.0) -> list[str]:
        return ensure_topics(
            self.bootstrap_servers, topics, replication_factor=self.replicas,
            configs={"min.insync.replicas": str(self.min_insync)}, timeout=timeout,
        )  # fmt: skip

    def describe_topics(self, topics: Sequence[str], skip: Iterable[int] = (), timeout: float = 30.0) -> list[dict]:
        """The topics' metadata (partitions, leaders, replicas in sync), asked of the running nodes not in ``skip``
        (ids from 1: frozen ones, say). An admin client sends its request to one node, which may be one that just
        died while the metadata still names it, and tries no other: so ask again until ``timeout``."""
        from kafka.errors import KafkaError

        skipped = set(skip)
        deadline = time.monotonic() + timeout
        while True:
            healthy = [n.address for i, n in enumerate(self.nodes, 1) if i not in skipped and n.running_pid()]
            try:
                with kafka_admin(",".join(healthy)) as admin:
                    return list(admin.describe_topics(list(topics)))
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop every node at once: the last of them stopping alone would wait for a controller majority that is gone."""
        self._each(lambda node: node.stop())

    def status(self) -> list[ServiceStatus]:
        return [node.status() for node in self.nodes]
