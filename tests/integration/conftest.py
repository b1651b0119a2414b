"""Fixtures of the end-to-end suite: the whole system on the process or the container backend.

``system`` (module scope) starts Kafka, Redis, two name-server nodes and the streaming job and stops
them afterwards (:mod:`tests.support.system`).  ``--backend=processes`` runs Kafka and Redis
as local processes, ``--backend=containers`` as testcontainers containers (starting a Docker daemon
for the session when root and none answers), and ``--backend=auto`` (the default, or
``$NAMESRV_IT_BACKEND``) picks containers only when a Docker daemon already answers.  The images
(``--kafka-image``, ``--redis-image``) are built locally when missing.  Modules that drive the
streaming job directly use ``services`` instead: a local Kafka and Redis per module.
``docs/internals/testing.md`` has more.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from infra.kafka import KafkaService
from infra.processes import free_port
from infra.redis import RedisService
from tests.integration.images import build
from tests.support import alertmanager
from tests.support.backends import (
    BACKENDS,
    ENV_BACKEND,
    ENV_KAFKA_IMAGE,
    ENV_REDIS_IMAGE,
    ENV_STREAMING_SET,
    ContainerInfra,
    DockerDaemon,
    DockerUnavailable,
    ProcessInfra,
    find_docker,
    parse_settings,
)
from tests.support.report import SUMMARY
from tests.support.system import System
from tests.support.webhook import Webhook


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("namesrv-integration", "name-server end-to-end suite (tests/integration)")
    group.addoption(
        "--backend",
        choices=("auto", *BACKENDS),
        default=None,
        help=f"where Kafka and Redis run (default: ${ENV_BACKEND} or auto: containers when "
        "a Docker daemon answers, else processes)",
    )
    group.addoption(
        "--kafka-image",
        default=None,
        help=f"Apache Kafka image for the containers backend (default: ${ENV_KAFKA_IMAGE} "
        f"or {build.KAFKA_IMAGE}, built locally)",
    )
    group.addoption(
        "--redis-image",
        default=None,
        help=f"Redis image for the containers backend (default: ${ENV_REDIS_IMAGE} or "
        f"{build.REDIS_IMAGE}, built locally)",
    )
    group.addoption("--docker-host", default=None, help="Docker daemon URL (default: $DOCKER_HOST or the local socket)")
    group.addoption(
        "--streaming-set",
        default=None,
        metavar="KEY=VALUE[,KEY=VALUE]",
        help=f"extra settings of the streaming job, e.g. kafka.maxOffsetsPerTrigger=10000 "
        f"(default: ${ENV_STREAMING_SET})",
    )


def _option(config: pytest.Config, name: str, env: str | None, default: str | None) -> str | None:
    # getoption with a default: this conftest's options exist only when pytest loaded it early
    # (its folder or a file in it on the command line); the environment works either way
    value = config.getoption(name, default=None)
    return value or (os.environ.get(env) if env else None) or default


@dataclass(frozen=True)
class BackendChoice:
    name: str
    why: str


@pytest.fixture(scope="session")
def backend_choice(pytestconfig: pytest.Config) -> BackendChoice:
    wanted = _option(pytestconfig, "--backend", ENV_BACKEND, "auto")
    if wanted not in ("auto", *BACKENDS):
        raise pytest.UsageError(f"{ENV_BACKEND}={wanted!r}: use auto, processes or containers")
    if wanted != "auto":
        return BackendChoice(wanted, "asked for")
    if _option(pytestconfig, "--docker-host", None, None):
        return BackendChoice("containers", "--docker-host given")
    host, why = find_docker()
    return BackendChoice("containers", why) if host else BackendChoice("processes", f"no Docker daemon: {why}")


@pytest.fixture(scope="session")
def docker_host(pytestconfig: pytest.Config) -> Iterator[str]:
    """A Docker daemon that answers: the configured one, else one started here (skips when none can run)."""
    explicit = _option(pytestconfig, "--docker-host", None, None)
    if explicit:
        yield explicit
        return
    host, tried = find_docker()
    if host is not None:
        yield host
        return
    try:
        daemon = DockerDaemon.start()
    except DockerUnavailable as exc:
        pytest.skip(f"no Docker daemon answers ({tried}) and none can be started here: {exc}")
    try:
        yield daemon.host
    finally:
        daemon.stop()


def container_images(config: pytest.Config) -> tuple[str, str]:
    return (
        _option(config, "--kafka-image", ENV_KAFKA_IMAGE, build.KAFKA_IMAGE) or build.KAFKA_IMAGE,
        _option(config, "--redis-image", ENV_REDIS_IMAGE, build.REDIS_IMAGE) or build.REDIS_IMAGE,
    )


@pytest.fixture(scope="module")
def system(
    request: pytest.FixtureRequest, backend_choice: BackendChoice, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[System]:
    """The whole system, started once per module, on the chosen backend."""
    run_dir = tmp_path_factory.mktemp("system")
    if backend_choice.name == "containers":
        kafka_image, redis_image = container_images(request.config)
        infra = ContainerInfra(request.getfixturevalue("docker_host"), kafka_image, redis_image)
    else:
        infra = ProcessInfra(run_dir)
    try:
        extra = parse_settings(_option(request.config, "--streaming-set", ENV_STREAMING_SET, "") or "")
    except ValueError as exc:
        raise pytest.UsageError(f"--streaming-set / ${ENV_STREAMING_SET}: {exc}") from None
    system = System(infra, run_dir, streaming_set=extra)
    system.start()
    SUMMARY.append(f"backend {backend_choice.name} ({backend_choice.why})")
    SUMMARY.extend(system.describe().splitlines())
    try:
        yield system
    finally:
        system.stop()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaService, RedisService]]:
    """Apache Kafka (one KRaft node) and a Redis for one module, stopped by PID afterwards."""
    run = tmp_path_factory.mktemp("services")
    kafka = KafkaService(port=free_port(), run_dir=run, data_dir=run / "kafka")
    redis = RedisService(port=free_port(), run_dir=run)
    kafka.start()
    redis.start()
    yield kafka, redis
    kafka.stop()
    redis.stop()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis alone for one module (for the modules that need no Kafka), stopped by PID afterwards."""
    redis = RedisService(port=free_port(), run_dir=tmp_path_factory.mktemp("redis"))
    redis.start()
    yield redis.url
    redis.stop()


@pytest.fixture
def am(tmp_path) -> Iterator[alertmanager.Alertmanager]:
    """A real Alertmanager of its own for one test (skip the module where none is installed)."""
    server = alertmanager.Alertmanager(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    """A webhook receiver of its own for one test, on a free loopback port."""
    with Webhook() as hook:
        yield hook
