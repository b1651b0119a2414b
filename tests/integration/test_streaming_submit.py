"""The streaming job as the stack runs it, with either launcher: it keeps routes in Redis and stops completely.

``StreamingJob(launcher="spark-submit")`` runs the interpreter's ``spark-submit``: a bash script that
exec's the JVM (SparkSubmit), which runs ``streaming/__main__.py`` in a child Python, the driver.  The
test's environment has no activated venv (the venv's bin/ is not on PATH), as under ``make``.  Under
``python`` the tree is the other way round (the driver, its JVM below it).  Either way ``stop`` must
leave no process of the job behind and must let the driver stop the query itself (its SIGTERM handler
logs "stopping the monitor").  Each case starts Spark, so each is slow (docs/internals/testing.md, "Timing").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from common import kafka_clients, procfs
from common.contract import DataVersionInfo, Event, EventType, QueueInfo, encode_event, event_key
from infra.apps import REPO, StreamingJob
from infra.config import TopicSpec
from infra.processes import pid_alive
from streaming.routes import RouteLookup
from tests.support.system import _start_time, descendants, log_tail
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(300)

CLUSTER = "DefaultCluster"
BROKER = ("broker-s", "10.0.0.9:10911")
TOPIC = "TSubmit"
START_TIMEOUT = 180.0  # Spark's start-up and first batches, on a shared 2-core machine


@pytest.fixture
def no_venv_env(monkeypatch):
    """The environment of a shell that did not activate the venv (nor set up Spark)."""
    venv_bin = os.path.dirname(sys.executable)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and os.path.abspath(p) != venv_bin]
    monkeypatch.setenv("PATH", os.pathsep.join(path or ["/usr/bin", "/bin"]))
    for name in ("VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        monkeypatch.delenv(name, raising=False)


def register_event(broker: tuple[str, str], topic: str) -> Event:
    return Event(type=EventType.REGISTER, node="n1", event_time=int(time.time() * 1000), seq=1,
                 cluster_name=CLUSTER, broker_name=broker[0], broker_addr=broker[1], broker_id=0,
                 heartbeat_timeout_millis=600_000, data_version=DataVersionInfo(1, 0, 1), ha_server_addr=broker[1],
                 enable_acting_master=False,
                 # with the cluster's own topic, as a broker registers: a one-topic first registration is refused
                 topics={t: QueueInfo(4, 4, 6) for t in (topic, CLUSTER)})  # fmt: skip


def session_members(sid: int) -> list[int]:
    """Live processes of session ``sid``: the job is started as the leader of a session of its own."""
    return [pid for pid, st in procfs.all_stats().items() if st.session == sid and pid_alive(pid)]


def cmdline(pid: int) -> str:
    return "".join(arg + " " for arg in procfs.cmdline(pid) or [])


def wait_for(job: StreamingJob, check: Callable[[], object], what: str, timeout: float = START_TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if job.status().pid is None:
            pytest.fail(
                f"the job ({job.launcher}) exited before {what}; {job.log_file} ends with:\n"
                f"{log_tail(job.log_file, 40)}"
            )
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout:.0f} s waiting for {what} ({job.launcher}); {job.log_file} "
                f"ends with:\n{log_tail(job.log_file, 40)}"
            )
        time.sleep(0.5)
    return result


@pytest.mark.parametrize("launcher", ["spark-submit", "python"])
def test_the_job_keeps_routes_in_redis_and_stops_without_leftovers(launcher, services, no_venv_env, tmp_path):
    kafka, redis = services
    prefix = f"submit-{launcher}"
    events, actions, alerts = f"{prefix}-events", f"{prefix}-actions", f"{prefix}-alerts"
    kafka.ensure_topics([TopicSpec(events, 2), TopicSpec(actions, 1), TopicSpec(alerts, 1)])
    job = StreamingJob(run_dir=tmp_path / "run", conf=REPO / "conf" / "streaming.properties", launcher=launcher,
                       overrides={
                           "kafka.bootstrap": kafka.bootstrap_servers,
                           "kafka.eventsTopic": events,
                           "kafka.actionsTopic": actions,
                           "kafka.alertsTopic": alerts,
                           "redis.url": redis.url,
                           "redis.keyPrefix": prefix,
                           "monitor.checkpointDir": str(tmp_path / "checkpoint"),
                           "monitor.triggerIntervalMillis": "200",
                           "spark.master": "local[2]",
                           "spark.sql.shuffle.partitions": "2",
                       })  # fmt: skip
    lookup = RouteLookup(redis.url, prefix=prefix)
    producer = kafka_clients.producer(kafka.bootstrap_servers)
    try:
        job.start()
        top = job.status().pid
        assert top is not None
        event = register_event(BROKER, TOPIC)
        producer.send(events, key=event_key(event), value=encode_event(event))
        producer.flush()
        route = wait_for(job, lambda: lookup.get(TOPIC), f"the route of {TOPIC} in Redis")
        assert {q.broker_name for q in route.queue_datas} == {BROKER[0]}

        tree = [(top, _start_time(top)), *descendants(top)]
        assert len(tree) > 1, f"the job (pid {top}) has no child processes"
        below = [pid for pid, _ in tree[1:]]
        driver_below = [pid for pid in below if "streaming/__main__.py" in cmdline(pid)]
        jvm_below = [pid for pid in below if os.path.basename(cmdline(pid).split(" ")[0]) == "java"]
        if launcher == "spark-submit":
            assert "org.apache.spark.deploy.SparkSubmit" in cmdline(top), cmdline(top)[:300]
            assert len(driver_below) == 1, [cmdline(p)[:200] for p, _ in tree]
        else:
            assert " -m streaming " in cmdline(top), cmdline(top)[:300]
            # the gateway JVM; Spark's launcher may briefly run a second java: what matters is that
            # the JVMs are in the tree checked below, so none of them may outlive stop()
            assert len(jvm_below) >= 1, [cmdline(p)[:200] for p, _ in tree]
    finally:
        producer.close()
        lookup.close()
        stopped = job.stop()

    left = [pid for pid, started in tree if pid_alive(pid) and _start_time(pid) == started]
    assert stopped
    assert left == [], f"still running after stop: {[cmdline(p)[:200] for p in left]}"
    assert session_members(top) == [], [cmdline(p)[:200] for p in session_members(top)]
    assert not job.pidfile.exists()
    # the driver stopped the query itself, not the JVM's exit under it
    assert "stopping the monitor" in job.log_file.read_text(errors="replace"), log_tail(job.log_file, 40)


def test_spark_submit_without_the_connector_s_jars_says_how_to_give_them(no_venv_env, tmp_path):
    """The recipe without ``--jars``: the driver's JVM has no Spark Kafka connector, and the job says how to give it."""
    env = {
        **os.environ,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    log = tmp_path / "job.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("spark-submit")), "streaming/__main__.py", "-c",
             "conf/streaming.properties", "-D", f"monitor.checkpointDir={tmp_path / 'checkpoint'}",
             "-D", "spark.master=local[1]"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(
            lambda: proc.poll() is not None, START_TIMEOUT, "the job to give up", state=lambda: log_tail(log, 20)
        )
        text = log.read_text(errors="replace")
        assert proc.returncode == 2, log_tail(log, 40)
        (said,) = [line for line in text.splitlines() if line.startswith("error: kafka.format=kafka")]
        assert "not on the driver's class path" in said and "--jars" in said and "make setup" in said, said
    finally:
        for pid in session_members(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.wait(20)
