"""The replicated topology on one machine: every part the way a deployment on several machines runs it.

``python -m infra.stack up --topology ha`` starts it and keeps it in the foreground; ``make chaos``
puts faults on it. It is the reference production layout of ``docs/deploy.md``, on loopback:

- Apache Kafka, three KRaft nodes (:class:`infra.kafka.KafkaCluster`): the topics on 3 replicas,
  ``min.insync.replicas`` 2; the nodes' and the monitor's producers write with ``acks=all`` and
  idempotence;
- Redis Cluster, three masters and three replicas (:class:`infra.redis_cluster.RedisCluster`), with
  append-only files, failing a dead master over by itself;
- Spark standalone, a master and two workers (:mod:`infra.spark_cluster`), the job's driver a
  :class:`infra.apps.StreamingJob` on that master, which the supervisor restarts when it dies;
- three name-server nodes, each warm-starting from Redis;
- optionally (``rocketmq=True``) Apache RocketMQ 5.5.0 from the manifest: its standalone controller
  and two broker groups, each a master and a slave in controller mode (:mod:`infra.rocketmq`).

Every process is a child in a session of its own, stopped by PID. :class:`Layout` holds every port:
:meth:`Layout.local` the fixed ones of ``up``, :meth:`Layout.free` free ones for the chaos harness and
tests. The faults a harness puts on a part go through :meth:`Topology.part`, by the part's name.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from common import procfs
from infra.apps import REPO, NodeService, StreamingJob, node_properties
from infra.config import DEFAULT_TOPICS
from infra.kafka import KafkaCluster
from infra.processes import LOOPBACK, ProcessService, ServiceError, free_port, pid_alive
from infra.redis_cluster import RedisCluster
from infra.spark_cluster import SparkCluster

__all__ = ["Layout", "Part", "Topology"]

KAFKA_NODES = 3
REDIS_MASTERS, REDIS_REPLICAS = 3, 1
SPARK_WORKERS = 2
NAME_SERVERS = 3


@dataclass(frozen=True)
class Layout:
    """Where everything listens, and where it keeps its files."""

    run_dir: Path
    kafka_ports: tuple[int, ...]
    kafka_controller_ports: tuple[int, ...]
    #: empty: free ones, picked as the cluster starts
    redis_ports: tuple[int, ...]
    node_ports: tuple[int, ...]
    #: the job's metrics port, then each node's (0: off)
    metrics_ports: tuple[int, ...] = ()
    console_port: int = 0
    #: where the job and the nodes page (empty: no receiver, alerts in Redis and on Kafka only)
    alertmanager_url: str = ""

    @classmethod
    def local(cls, run_dir: Path) -> Layout:
        """``up --topology ha``'s fixed ports: Kafka on 19092/19094/19096, Redis Cluster on 17000-17005, the
        nodes on 9876-9878, the console on 18080, metrics from 9470."""
        return cls(
            run_dir=run_dir,
            kafka_ports=tuple(19092 + 2 * i for i in range(KAFKA_NODES)),
            kafka_controller_ports=tuple(19093 + 2 * i for i in range(KAFKA_NODES)),
            redis_ports=tuple(17000 + i for i in range(REDIS_MASTERS * (1 + REDIS_REPLICAS))),
            node_ports=tuple(9876 + i for i in range(NAME_SERVERS)),
            metrics_ports=tuple(9470 + i for i in range(1 + NAME_SERVERS)),
            console_port=18080,
        )

    @classmethod
    def free(cls, run_dir: Path, *, alertmanager_url: str = "") -> Layout:
        """Free loopback ports for everything, metrics on (the harness reads the nodes' counters)."""

        def ports(n: int) -> tuple[int, ...]:
            return tuple(free_port() for _ in range(n))

        return cls(
            run_dir=run_dir,
            kafka_ports=ports(KAFKA_NODES),
            kafka_controller_ports=ports(KAFKA_NODES),
            redis_ports=(),  # the cluster picks free ones, each with a free bus port
            node_ports=ports(NAME_SERVERS),
            metrics_ports=ports(1 + NAME_SERVERS),
            alertmanager_url=alertmanager_url,
        )

    @property
    def node_addrs(self) -> list[str]:
        return [f"{LOOPBACK}:{p}" for p in self.node_ports]

    @property
    def namesrv_addr(self) -> str:
        """``host:port;host:port;...`` as brokers and clients take it."""
        return ";".join(self.node_addrs)


@dataclass
class Part:
    """One process of the topology as a fault sees it: its PIDs now, and how to bring it back after a kill."""

    name: str
    #: the PIDs a signal to this part goes to (a whole process tree where the part is one)
    pids: Callable[[], list[int]]
    #: start it again after a kill (None: something else does, e.g. the supervisor)
    restart: Callable[[], None] | None = None

    def alive(self) -> bool:
        return bool(self.pids())

    def signal(self, sig: signal.Signals) -> list[int]:
        """``sig`` to every PID of the part; the PIDs it went to."""
        sent = []
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                sent.append(pid)
        return sent

    def kill(self) -> list[int]:
        return self.signal(signal.SIGKILL)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[list[int]]:
        """SIGSTOP for the block, as a long pause or a hung host is; SIGCONT after it, whatever happens."""
        stopped = self.signal(signal.SIGSTOP)
        try:
            yield stopped
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


def _tree(pid: int | None) -> list[int]:
    """``pid`` and every live process below it."""
    if pid is None or not pid_alive(pid):
        return []
    return [pid, *(st.pid for st in procfs.descendants(pid))]


@dataclass
class Topology:
    layout: Layout
    rocketmq: bool = False
    namesrv_conf: Path = REPO / "conf" / "namesrv.properties"
    streaming_conf: Path = REPO / "conf" / "streaming.properties"
    kafka: KafkaCluster = field(init=False)
    redis: RedisCluster = field(init=False)
    spark: SparkCluster | None = field(init=False, default=None)
    streaming: StreamingJob = field(init=False)
    nodes: list[NodeService] = field(init=False, default_factory=list)
    #: the RocketMQ controller and broker groups, when ``rocketmq``
    controller: object | None = field(init=False, default=None)
    groups: list = field(init=False, default_factory=list)
    _runs: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        run = self.layout.run_dir
        self.kafka = KafkaCluster(
            ports=self.layout.kafka_ports,
            controller_ports=self.layout.kafka_controller_ports,
            run_dir=run / "kafka",
            data_dir=run / "kafka-data",
            topics=DEFAULT_TOPICS,
        )
        self.redis = RedisCluster(
            run_dir=run,
            masters=REDIS_MASTERS,
            replicas=REDIS_REPLICAS,
            ports=list(self.layout.redis_ports),
            appendonly=True,
        )

    # -- addresses

    @property
    def kafka_bootstrap(self) -> str:
        return self.kafka.bootstrap_servers

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def _run_dir(self, name: str) -> Path:
        """A directory of its own for each run of a part, so a killed run's log stays."""
        self._runs[name] = self._runs.get(name, 0) + 1
        return self.layout.run_dir / f"{name}-run{self._runs[name]}"

    # -- starting and stopping

    def start(self, say: Callable[[str], None] = lambda _: None) -> None:
        """Start every part, in the order each needs the others; on a failure, stop what started."""
        try:
            say(f"starting Kafka, {KAFKA_NODES} KRaft nodes ...")
            self.kafka.start()
            say(f"starting Redis Cluster, {REDIS_MASTERS} masters with {REDIS_REPLICAS} replica each ...")
            self.redis.start()
            say(f"starting Spark standalone, a master and {SPARK_WORKERS} workers ...")
            self.spark = SparkCluster.start(self.layout.run_dir / "spark", workers=SPARK_WORKERS, memory="1g")
            say("starting the streaming job on the Spark master ...")
            self.streaming = self._new_streaming()
            self.streaming.start()
            for i in range(NAME_SERVERS):
                say(f"starting name-server node-{i + 1} on {self.layout.node_addrs[i]} ...")
                self.nodes.append(self._new_node(i))
                self.nodes[i].start()
            if self.rocketmq:
                self._start_rocketmq(say)
        except BaseException:
            self.stop()
            raise

    def _start_rocketmq(self, say: Callable[[str], None]) -> None:
        from infra import rocketmq

        say("starting Apache RocketMQ's controller ...")
        base = self.layout.run_dir / "rocketmq"
        self.controller = rocketmq.start_controller(base, self.layout.node_addrs)
        for group in ("broker-a", "broker-b"):
            say(f"starting RocketMQ group {group}: a master and a slave in controller mode ...")
            self.groups.append(
                rocketmq.start_controller_group(
                    base, self.layout.node_addrs, self.controller, name=group, cluster="HaCluster", members=2
                )
            )

    def stop(self) -> None:
        """Stop everything that runs, the clients' side first; every error is passed over, the rest still stops."""
        for group in self.groups:
            for broker in group.brokers:
                with contextlib.suppress(Exception):
                    broker.stop()
        if self.controller is not None:
            with contextlib.suppress(Exception):
                self.controller.stop()  # type: ignore[attr-defined]
        for node in self.nodes:
            with contextlib.suppress(ServiceError):
                node.stop()
        if getattr(self, "streaming", None) is not None:
            with contextlib.suppress(ServiceError):
                self.streaming.stop()
        if self.spark is not None:
            self.spark.stop()
        self.redis.stop()
        with contextlib.suppress(ServiceError):
            self.kafka.stop()

    # -- the parts the system runs

    def _new_streaming(self) -> StreamingJob:
        assert self.spark is not None
        metrics = self.layout.metrics_ports[0] if self.layout.metrics_ports else 0
        overrides = {
            "spark.master": self.spark.master_url,
            # a worker's executor: one core, small, as each of the two workers offers
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "kafka.bootstrap": self.kafka_bootstrap,
            "redis.url": self.redis_url,
            "monitor.checkpointDir": str(self.layout.run_dir / "streaming-checkpoint"),
            "monitor.metricsPort": str(metrics),
            "monitor.metricsBindAddress": LOOPBACK,
            "alerts.alertmanagerUrl": self.layout.alertmanager_url,
        }
        return StreamingJob(run_dir=self._run_dir("streaming"), conf=self.streaming_conf, overrides=overrides)

    def _new_node(self, i: int) -> NodeService:
        port = self.layout.node_ports[i]
        metrics = self.layout.metrics_ports[1 + i] if self.layout.metrics_ports else 0
        return NodeService(
            port=port,
            run_dir=self._run_dir(f"node-{i + 1}"),
            conf=self.namesrv_conf,
            properties={
                **node_properties(
                    port=port,
                    name=f"node-{i + 1}",
                    kafka_bootstrap=self.kafka_bootstrap,
                    redis_url=self.redis_url,
                    data_dir=self.layout.run_dir / f"node-{i + 1}-data",
                    metrics_port=metrics,
                    warm_start=True,
                ),
                "alerts.alertmanagerUrl": self.layout.alertmanager_url,
            },
        )

    def restart_node(self, i: int) -> None:
        """Start node ``i`` again (after a kill), in a run directory of its own, warm from Redis."""
        self.nodes[i] = self._new_node(i)
        self.nodes[i].start()

    def restart_kafka_node(self, i: int) -> None:
        """Start Kafka node ``i`` (from 1) again on its data, logging apart from its last run."""
        node = self.kafka.node(i, self._run_dir(f"kafka-{i}"))
        self.kafka.nodes[i - 1] = node
        node.start()

    def supervised(self) -> list[ProcessService]:
        """What ``up``'s supervisor restarts when it dies: the driver, the nodes and Kafka's nodes."""
        kafka: list[ProcessService] = list(self.kafka.nodes)
        return [self.streaming, *self.nodes, *kafka]

    def parts(self) -> dict[str, Part]:
        """Every process of the topology by name: ``kafka-1``.., ``redis-<port>``, ``spark-master``,
        ``spark-worker-1``.., ``driver``, ``node-1``.., and with RocketMQ ``rocketmq-controller``, ``broker-a-0`` .."""
        parts = [
            *(Part(f"kafka-{i}", partial(self._kafka_pids, i), partial(self.restart_kafka_node, i))
              for i in range(1, len(self.kafka.nodes) + 1)),
            *(Part(f"redis-{port}", partial(self._redis_pids, port), partial(self.redis.restart, port))
              for port in self.redis.ports),
            # the driver: the job's process and everything below it (its JVM, its Python workers)
            Part("driver", lambda: _tree(self.streaming.running_pid())),
            *(Part(f"node-{i + 1}", partial(self._node_pids, i), partial(self.restart_node, i))
              for i in range(len(self.nodes))),
        ]  # fmt: skip
        if self.spark is not None:
            spark = self.spark
            parts.append(Part("spark-master", spark.master.session))
            parts += [
                Part(f"spark-worker-{i + 1}", partial(self._worker_pids, i), partial(spark.restart_worker, i))
                for i in range(len(spark.workers))
            ]
        if self.controller is not None:
            parts.append(Part("rocketmq-controller", partial(_controller_pids, self.controller)))
        if self.groups:
            from infra import rocketmq

            for group in self.groups:
                parts += [
                    Part(f"{group.name}-{j}", partial(_broker_pids, b), partial(rocketmq.restart_broker, b))
                    for j, b in enumerate(group.brokers)
                ]
        return {part.name: part for part in parts}

    def _kafka_pids(self, i: int) -> list[int]:
        return _tree(self.kafka.nodes[i - 1].running_pid())

    def _redis_pids(self, port: int) -> list[int]:
        return [self.redis.pid(port)] if self.redis.alive(port) else []

    def _node_pids(self, i: int) -> list[int]:
        return _tree(self.nodes[i].running_pid())

    def _worker_pids(self, i: int) -> list[int]:
        assert self.spark is not None
        return self.spark.workers[i].session()


def _controller_pids(controller) -> list[int]:  # noqa: ANN001 - infra.rocketmq.Controller, imported lazily
    return [controller.process.pid] if controller.process.alive() else []


def _broker_pids(broker) -> list[int]:  # noqa: ANN001 - infra.rocketmq.JavaBroker, imported lazily
    return [broker.process.pid] if broker.process.alive() else []
