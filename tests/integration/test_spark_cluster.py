"""The job on a Spark standalone cluster, launched as docs/deploy.md says: a lost worker, SIGTERM, a restart.

A master and two 1-core workers from the pip-installed pyspark on loopback
(:mod:`tests.support.spark_cluster`), the local Kafka and Redis, and ``spark-submit --jars
'build/jvm/spark-kafka/*.jar' streaming/__main__.py ...`` from a shell without the venv, with only
``PYSPARK_DRIVER_PYTHON`` set: the job must give the executors the project's Python itself.  The test
plays a node, publishing six brokers' REGISTERs, then TICKs and heartbeats every second.  (1) Every
route reaches Redis; (2) two brokers fall silent and a worker is SIGKILLed with its executor: each
still gets exactly one EXPIRE; (3) SIGTERM to spark-submit's JVM stops the job cleanly, exit 0;
(4) restarted from its checkpoint, the job expires a broker that fell silent meanwhile, exactly once,
and repeats no earlier EXPIRE.  Spark is slow on a shared machine, so the deadlines are generous
(``docs/internals/testing.md``, "Timing").
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common import kafka_clients
from common.contract import (
    DataVersionInfo,
    Event,
    EventType,
    HeartbeatSource,
    QueueInfo,
    encode_event,
    event_key,
)
from infra.config import TopicSpec
from streaming.routes import RouteLookup
from tests.support.spark_cluster import SparkCluster, spark_cluster
from tests.support.system import ACTIONS, ALERTS, EVENTS, KafkaTap, log_tail
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(1800)

REPO = Path(__file__).resolve().parents[2]
CLUSTER = "DefaultCluster"
TIMEOUT_MS = 20_000
BROKERS = [(f"bk-{i}", f"10.0.1.{i}:10911", f"TC{i}") for i in range(6)]
#: Spark's start and a batch or two, on a shared and loaded 2-core machine
DEADLINE = 480.0


class Fleet:
    """The test's name-server node: REGISTERs once, then a TICK and a heartbeat per live broker every second."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = kafka_clients.producer(bootstrap)
        self.seq = itertools.count(1)
        self.silent: set[str] = set()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="fleet", daemon=True)

    def _send(self, event: Event) -> None:
        self.producer.send(EVENTS, key=event_key(event), value=encode_event(event))

    def _broker(self, kind: EventType, name: str, addr: str, **kw) -> Event:
        return Event(type=kind, node="n1", event_time=int(time.time() * 1000), seq=next(self.seq),
                     cluster_name=CLUSTER, broker_name=name, broker_id=0, broker_addr=addr, **kw)  # fmt: skip

    def start(self) -> None:
        for name, addr, topic in BROKERS:
            self._send(self._broker(
                EventType.REGISTER, name, addr, heartbeat_timeout_millis=TIMEOUT_MS, ha_server_addr=addr,
                enable_acting_master=False, data_version=DataVersionInfo(1, 0, 1),
                # with the cluster's own topic, as a broker registers: a one-topic first registration is refused
                topics={t: QueueInfo(4, 4, 6) for t in (topic, CLUSTER)},
            ))  # fmt: skip
        self.producer.flush()
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(1.0):
            self._send(Event(type=EventType.TICK, node="n1", event_time=int(time.time() * 1000), seq=next(self.seq)))
            for name, addr, _ in BROKERS:
                if addr not in self.silent:
                    self._send(self._broker(EventType.HEARTBEAT, name, addr, source=HeartbeatSource.BROKER_HEARTBEAT))
            self.producer.flush()

    def silence(self, *addrs: str) -> None:
        self.silent.update(addrs)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        self.producer.close()


class SubmittedJob:
    """``spark-submit --jars … streaming/__main__.py`` as docs/deploy.md's recipe runs it; ``pid`` is the JVM's."""

    def __init__(self, master: str, kafka: str, redis: str, checkpoint: Path, log: Path) -> None:
        venv_bin = os.path.dirname(sys.executable)
        path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and os.path.abspath(p) != venv_bin]
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON")}
        # docs/deploy.md: "Without activating the venv, set PYSPARK_DRIVER_PYTHON=.venv/bin/python"; PYTHONPATH is the
        # test run's (this tree), as for every process a test starts
        env.update(PATH=os.pathsep.join(path or ["/usr/bin", "/bin"]), PYSPARK_DRIVER_PYTHON=sys.executable,
                   SPARK_LOCAL_IP="127.0.0.1")  # fmt: skip
        sets = {
            "spark.master": master,
            "spark.executor.memory": "512m",
            "kafka.bootstrap": kafka,
            "redis.url": redis,
            "monitor.checkpointDir": str(checkpoint),
            "monitor.triggerIntervalMillis": "500",
        }
        self.log = log
        with log.open("ab") as out:
            # nice, spark-submit, spark-class: each exec's the next, so the PID ends up the JVM's
            self.proc = subprocess.Popen(
                ["nice", "-n", "10", str(Path(sys.executable).with_name("spark-submit")),
                 "--jars", "build/jvm/spark-kafka/*.jar", "streaming/__main__.py",
                 "-c", "conf/streaming.properties", *(a for k, v in sets.items() for a in ("-D", f"{k}={v}"))],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the job exited with {self.proc.returncode}:\n{log_tail(self.log, 60)}")
        return True

    def terminate(self, timeout: float = 180.0) -> int:
        """SIGTERM to the JVM, as a supervisor sends it; the exit code."""
        os.kill(self.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the job still runs {timeout:.0f} s after SIGTERM:\n{log_tail(self.log, 60)}"
            ) from None

    def kill(self) -> None:
        """Whatever is left of the job's session (it leads one of its own), by PID."""
        from common import procfs

        for pid, st in procfs.all_stats().items():
            if st.session == self.pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    with spark_cluster(tmp_path_factory.mktemp("spark"), workers=2, cores=1, memory="1g") as c:
        yield c


def actions_end(bootstrap: str) -> int:
    """How many records the one-partition actions topic holds."""
    from kafka import TopicPartition

    consumer = kafka_clients.consumer(bootstrap)
    try:
        tp = TopicPartition(ACTIONS, 0)
        return int(consumer.end_offsets([tp])[tp])
    finally:
        consumer.close()


def test_the_job_on_a_standalone_cluster_survives_a_lost_worker_a_sigterm_and_a_restart(
    cluster: SparkCluster, services, tmp_path: Path
) -> None:
    kafka, redis = services
    kafka.ensure_topics([TopicSpec(EVENTS, 2), TopicSpec(ACTIONS, 1), TopicSpec(ALERTS, 1)])
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "job.log"
    lookup = RouteLookup(redis.url)
    fleet = Fleet(kafka.bootstrap_servers)
    tap = KafkaTap(kafka.bootstrap_servers, topics=(ACTIONS,))
    job = SubmittedJob(cluster.master_url, kafka.bootstrap_servers, redis.url, checkpoint, log)
    restarted: SubmittedJob | None = None

    def decided() -> dict[str, list[str]]:
        return {addr: tap.decisions(addr) for _, addr, _ in BROKERS}

    try:
        fleet.start()
        # 1. every route in Redis, from executors on both workers
        wait_until(lambda: job.running() and all(lookup.get(t) for _, _, t in BROKERS), DEADLINE,
                   "every broker's route in Redis", interval=1.0,
                   state=lambda: f"topics {lookup.topics()}; log:\n{log_tail(log, 30)}")  # fmt: skip
        wait_until(lambda: all(cluster.executors_of(w) for w in cluster.workers), DEADLINE,
                   "an executor on each worker", interval=1.0, state=cluster.logs)  # fmt: skip
        first_lineage = lookup.status()["lineage"]

        # 2. two brokers fall silent; a worker dies with its executor mid-stream
        lost = [addr for _, addr, _ in BROKERS[:2]]
        fleet.silence(*lost)
        cluster.kill_worker(cluster.workers[0])
        wait_until(lambda: job.running() and all(tap.decisions(a) for a in lost) and not any(
            lookup.get(t) for _, a, t in BROKERS if a in lost), DEADLINE,
            "EXPIRE of both silent brokers and their routes gone from Redis", interval=1.0,
            state=lambda: f"{decided()}; topics {lookup.topics()}; log:\n{log_tail(log, 30)}")  # fmt: skip
        assert all(lookup.get(t) for _, a, t in BROKERS if a not in lost), lookup.topics()

        # 3. SIGTERM to spark-submit's JVM
        code = job.terminate()
        text = log.read_text(errors="replace")
        assert code == 0, log_tail(log, 80)
        assert "StackOverflowError" not in text, log_tail(log, 80)
        assert "SIGTERM to the JVM: stopping the monitor" in text, log_tail(log, 80)
        stopped_at = int(lookup.status()["batchId"])

        # 4. a broker falls silent while the job is down; the job resumes from its checkpoint
        late = BROKERS[2][1]
        fleet.silence(late)
        restarted = SubmittedJob(cluster.master_url, kafka.bootstrap_servers, redis.url, checkpoint, log)
        wait_until(lambda: restarted.running() and tap.decisions(late) and not lookup.get(BROKERS[2][2]),
                   DEADLINE, "the restarted job to expire the broker silenced while it was down", interval=1.0,
                   state=lambda: f"{decided()}; status {lookup.status()}; log:\n{log_tail(log, 30)}")  # fmt: skip
        status = lookup.status()
        assert status["lineage"] == first_lineage, "the restart did not resume the checkpointed query"
        assert int(status["batchId"]) > stopped_at
        assert restarted.terminate() == 0, log_tail(log, 80)
        # no expiry missed, none twice, no live broker touched: read the actions topic to its end first
        end = actions_end(kafka.bootstrap_servers)
        wait_until(lambda: len(tap.seen(ACTIONS)) >= end, 30, f"the tap to read all {end} actions")
        assert decided() == {addr: (["EXPIRE"] if addr in (*lost, late) else []) for _, addr, _ in BROKERS}
        assert "StackOverflowError" not in log.read_text(errors="replace")
    finally:
        fleet.close()
        tap.close()
        lookup.close()
        for j in (job, restarted):
            if j is not None and j.proc.poll() is None:
                j.kill()
