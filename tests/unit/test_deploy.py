"""The deployment description (infra/deploy/docker-compose.yml) uses the project's own configuration keys."""

from __future__ import annotations

import re
from pathlib import Path

from namesrv.config import OPTIONS_BY_KEY as NODE_KEYS
from streaming.config import OPTIONS_BY_KEY as JOB_KEYS
from streaming.config import load_config, parse_overrides

COMPOSE = (Path(__file__).resolve().parents[2] / "infra" / "deploy" / "docker-compose.yml").read_text()


def _service_command(name: str) -> str:
    block = re.search(rf"^  {name}:\n(.*?)(?=^  \S|\Z)", COMPOSE, re.M | re.S)
    assert block, f"no service {name} in the compose file"
    command = re.search(r"command: >-\n((?:\s{6}.*\n)+)", block.group(1))
    assert command, f"service {name} has no folded command"
    return " ".join(command.group(1).split())


def test_node_commands_set_only_node_keys_and_point_at_the_deployment():
    for node in ("namesrv-1", "namesrv-2"):
        sets = dict(re.findall(r"--set (\w+)=(\S+)", _service_command(node)))
        assert set(sets) <= set(NODE_KEYS), set(sets) - set(NODE_KEYS)
        assert sets["kafkaBootstrapServers"] == "kafka:19092" and sets["redisUrl"] == "redis://redis:6379/0"


def test_the_monitor_overrides_every_loopback_address_of_the_shipped_conf(tmp_path):
    command = _service_command("monitor")
    overrides = parse_overrides(re.findall(r"-D (\S+)", command))
    assert set(overrides) <= set(JOB_KEYS) | {"spark.master", "spark.driver.host", "spark.jars"}
    cfg = load_config(
        Path(__file__).resolve().parents[2] / "conf" / "streaming.properties", overrides, base_dir=tmp_path
    )
    assert cfg.spark["spark.master"] == "spark://spark-master:7077"  # not the shipped local[*]
    assert cfg.kafka_bootstrap == "kafka:19092" and cfg.redis_url == "redis://redis:6379/0"
    assert str(cfg.checkpoint_dir).startswith("/checkpoints/")  # the volume the worker shares
