"""The whole system for the end-to-end suite, as ``make run`` starts it, and a tap on its Kafka topics.

A :class:`System` is Apache Kafka and Redis (the *infra*: one of :mod:`tests.support.backends`), two
name-server nodes (:class:`infra.apps.NodeService`) and the Spark liveness monitor
(:class:`infra.apps.StreamingJob`), on free loopback ports, with a short broker timeout
(:class:`Timing`).  Nodes and the job are always local processes that tests restart, kill and read the
logs of, each incarnation in a run directory of its own; :class:`KafkaTap` reads the events, actions
and alerts topics.  The tools that drive it: :class:`tests.support.fleet.FleetRunner` (simulated
brokers), :mod:`tests.support.routes` (what the nodes answer) and :class:`tests.support.scenario.Scenario`
(all of them together, and the real C++ client).  ``docs/internals/testing.md`` has more.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import kafka_clients, procfs
from infra.apps import NodeService, StreamingJob, node_properties
from infra.config import DEFAULT_TOPICS
from infra.processes import ServiceError, free_port, pid_alive
from tests.support.wait import wait_until

if TYPE_CHECKING:
    from tests.support.backends import Infra

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
EVENTS, ACTIONS, ALERTS = (t.name for t in DEFAULT_TOPICS)


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


def _set(key: str, value: int | None) -> dict[str, str]:
    """``{key: value}`` as a setting, or nothing to keep the shipped value."""
    return {} if value is None else {key: str(value)}


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
        return {
            **node_properties(
                port=self.node_ports[i],
                name=f"node-{i + 1}",
                kafka_bootstrap=self.kafka_bootstrap,
                redis_url=self.redis_url,
                data_dir=self.run_dir / f"node-{i + 1}-data",
                metrics_port=self.metrics_ports[i] if self.metrics_ports else None,
                warm_start=warm_start,
            ),
            **_set("tickIntervalMillis", t.tick_ms),
            **_set("monitorSilenceFallbackMillis", t.monitor_fallback_ms),
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

        from common.contract import decode_action, decode_event
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
