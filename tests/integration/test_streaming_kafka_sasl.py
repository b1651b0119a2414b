"""The job on Apache Kafka behind SASL: Spark's connector reads the events and the job decides; a wrong
password stops the job, saying so.

One Apache Kafka for the module with a single SASL_PLAINTEXT client listener (PLAIN; its users are in the
broker's JAAS line): ``admin`` (the broker itself, the test's clients) and ``monitor`` (the job).

1. The job in this process, as user ``monitor``: a broker registers through two nodes and falls silent;
   a TICK past its deadline makes the job publish one EXPIRE, read back from the actions topic over SASL.
2. ``python -m streaming`` with a wrong password: it exits 2 once Spark is up, saying that Kafka refuses
   the job's credentials and why (the broker's own answer, read as the node reads it) and what to fix,
   never the password; it does not wait for Kafka forever as for a broker that is down.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import TopicPartition

from common import kafka_clients, procfs
from common.contract import (
    ActionType,
    DataVersionInfo,
    Event,
    EventType,
    QueueInfo,
    decode_action,
    encode_event,
    event_key,
)
from common.kafka_security import KafkaSecurity
from infra.config import TopicSpec
from infra.kafka import KafkaService
from infra.processes import free_port, pid_alive
from streaming import job, session
from streaming.config import load_config
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(420)

REPO = Path(__file__).resolve().parents[2]
EVENTS, ACTIONS, ALERTS = "sasl-events", "sasl-actions", "sasl-alerts"
ADMIN_PASSWORD, MONITOR_PASSWORD = "admin-secret-1", "monitor-secret-2"
WRONG_PASSWORD = "not-the-password-3"
CLUSTER = "DefaultCluster"
BROKER = ("broker-s", "10.0.9.1:10911")
T0 = 1_700_000_000_000
TIMEOUT_MS = 10_000
#: Spark's start and first batches, on a shared 2-core machine
DEADLINE = 240.0


def plain(user: str, password: str) -> KafkaSecurity:
    return KafkaSecurity.from_settings(
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
         "sasl.password": password}
    )  # fmt: skip


ADMIN = plain("admin", ADMIN_PASSWORD)


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaService]:
    run = tmp_path_factory.mktemp("kafka-sasl")
    users = f'user_admin="{ADMIN_PASSWORD}" user_monitor="{MONITOR_PASSWORD}"'
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="admin" password="{ADMIN_PASSWORD}" {users};'
    )
    service = KafkaService(
        port=free_port(), run_dir=run, listener="SASL_PLAINTEXT", security=ADMIN,
        broker_properties={
            "sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        },
        topics=[TopicSpec(EVENTS, 2), TopicSpec(ACTIONS, 1), TopicSpec(ALERTS, 1)],
    )  # fmt: skip
    service.start()
    try:
        yield service
    finally:
        service.stop()


def job_settings(kafka: KafkaService, password: str, checkpoint: Path) -> dict[str, str]:
    return {
        "kafka.bootstrap": kafka.bootstrap_servers,
        "kafka.format": "kafka",
        "kafka.eventsTopic": EVENTS,
        "kafka.actionsTopic": ACTIONS,
        "kafka.alertsTopic": ALERTS,
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.username": "monitor",
        "kafka.sasl.password": password,
        "monitor.checkpointDir": str(checkpoint),
        "monitor.id": "sasl-monitor",
        "alerts.monitorLagMillis": str(10**12),  # synthetic event times are years behind the clock
        "redis.url": "",
        "spark.master": "local[2]",
    }


def event(etype: EventType, node: str, dt: int, seq: int, **kw) -> Event:
    if etype is not EventType.TICK:
        kw.update(cluster_name=CLUSTER, broker_name=BROKER[0], broker_addr=BROKER[1], broker_id=0)
    return Event(type=etype, node=node, event_time=T0 + dt, seq=seq, **kw)


def test_the_job_reads_events_over_sasl_with_spark_s_connector_and_expires_a_silent_broker(kafka, tmp_path):
    cfg = load_config(REPO / "conf" / "streaming.properties", job_settings(kafka, MONITOR_PASSWORD, tmp_path / "ckpt"))
    spark = session.build_spark(cfg)
    spark.sparkContext.setLogLevel("ERROR")
    producer = kafka_clients.producer(kafka.bootstrap_servers, security=ADMIN)
    actions = kafka_clients.consumer(kafka.bootstrap_servers, security=ADMIN, auto_offset_reset="earliest")
    actions.assign([TopicPartition(ACTIONS, 0)])
    seen: list = []

    def expired() -> list:
        for records in actions.poll(timeout_ms=200).values():
            seen.extend(decode_action(r.value) for r in records)
        return [a for a in seen if a.type is ActionType.EXPIRE]

    monitor = job.start(spark, cfg, trigger_ms=200)
    assert monitor is not None
    try:
        sent = [
            *(event(EventType.REGISTER, n, 0, 1, heartbeat_timeout_millis=TIMEOUT_MS,
                    data_version=DataVersionInfo(1, 0, 1), ha_server_addr=BROKER[1], enable_acting_master=False,
                    topics={t: QueueInfo(4, 4, 6) for t in ("TSasl", CLUSTER)}) for n in ("n1", "n2")),
            *(event(EventType.TICK, n, 1_000, 2) for n in ("n1", "n2")),
            # past the deadline (0 + 10 s): the job must expire the broker now
            event(EventType.TICK, "n1", TIMEOUT_MS + 1_000, 3),
        ]  # fmt: skip
        for e in sent:
            producer.send(EVENTS, key=event_key(e), value=encode_event(e))
        producer.flush(10)
        (expire,) = wait_until(
            lambda: monitor.query.isActive and expired(), DEADLINE, "the job's EXPIRE of the silent broker",
            interval=0, state=lambda: f"actions {[str(a.type) for a in seen]}; status {monitor.query.status}",
        )  # fmt: skip
        assert (expire.broker_addr, expire.last_heartbeat, expire.monitor) == (BROKER[1], T0, "sasl-monitor")
        progress = [p for p in monitor.query.recentProgress if p.numInputRows]
        # Spark's own Kafka source read them (the Python source reports bundles, not records)
        assert any("KafkaV2" in p.sources[0].description for p in progress), [
            p.sources[0].description for p in progress
        ]
        assert sum(p.numInputRows for p in progress) == len(sent)
    finally:
        monitor.stop()
        producer.close()
        actions.close()
    assert monitor.query.exception() is None


def _session(sid: int) -> list[int]:
    return [pid for pid, st in procfs.all_stats().items() if st.session == sid and pid_alive(pid)]


def test_a_wrong_password_stops_the_job_saying_kafka_refuses_its_credentials(kafka, tmp_path):
    settings = job_settings(kafka, WRONG_PASSWORD, tmp_path / "ckpt")
    args = [a for k, v in settings.items() for a in ("-D", f"{k}={v}")]
    log = tmp_path / "job.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streaming", "-c", "conf/streaming.properties", *args],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
        )  # fmt: skip
    try:
        started = time.monotonic()
        wait_until(lambda: proc.poll() is not None, DEADLINE, "the job to give up",
                   state=lambda: log.read_text(errors="replace")[-3000:])  # fmt: skip
        text = log.read_text(errors="replace")
        assert proc.returncode == 2, text[-3000:]
        assert "refuses the job's credentials" in text and "sasl.username='monitor'" in text, text[-3000:]
        # the broker's own answer, quoted, and the settings to fix
        assert "Kafka refused the login: 'Authentication failed: Invalid username or password'" in text, text[-3000:]
        assert "check kafka.sasl.username and kafka.sasl.password" in text, text[-3000:]
        assert WRONG_PASSWORD not in text
        said = [line for line in text.splitlines() if line.startswith("error:")]
        print(f"gave up after {time.monotonic() - started:.0f} s: {said}")
    finally:
        for pid in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.wait(20)
