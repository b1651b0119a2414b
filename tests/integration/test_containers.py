"""The container backend, for real: a Docker daemon, images built here with no registry, testcontainers.

``docker_host`` (conftest) is a daemon that already answers, or Debian's dockerd started by hand
for the session (installed with apt when missing, root only) and stopped by PID afterwards; when
none can run, every test here is skipped with the reason. The images are imported from root
filesystems made of this machine's own redis-server, and its JVM with the Apache Kafka jars of
``make setup`` (tests/integration/images/build.py). testcontainers runs with Ryuk off and connection
mode ``docker_host``.

The last test runs a short end-to-end scenario on the containers backend: nodes and the Spark job
as local processes, Kafka and Redis in containers, a broker that goes silent expires once, and a
Kafka container restart loses nothing the nodes queued meanwhile.
"""

from __future__ import annotations

import time

import pytest

from common import kafka_clients
from tests.integration.images import build
from tests.support.backends import ContainerInfra, docker_env, kafka_answers, parse_settings
from tests.support.report import SUMMARY
from tests.support.routes import route_or_none
from tests.support.scenario import Scenario
from tests.support.system import System
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def images(docker_host: str) -> dict[str, float]:
    """Both default images, rebuilt from this machine's binaries; seconds each build took."""
    import docker

    try:
        specs = [build.kafka_spec(), build.redis_spec()]
    except build.ImageBuildError as exc:
        pytest.skip(f"cannot build the images here: {exc}")
    client = docker.DockerClient(base_url=docker_host)
    took = {}
    try:
        for spec in specs:
            t0 = time.monotonic()
            build.build_image(client, spec)
            took[spec.name] = round(time.monotonic() - t0, 2)
    finally:
        client.close()
    return took


def test_images_are_built_locally_with_only_the_server_and_its_libraries(docker_host, images):
    import docker

    client = docker.DockerClient(base_url=docker_host)
    sizes = {}
    try:
        # Redis: one binary and its libraries; Kafka: a JVM without the JDK's tools, and the broker's jars
        for name, flavour, limit_mib in ((build.KAFKA_IMAGE, "apache-kafka", 320), (build.REDIS_IMAGE, "redis", 80)):
            image = client.images.get(name)
            assert image.labels[build.FLAVOUR_LABEL] == flavour
            assert image.attrs["RepoDigests"] == []  # never pushed or pulled: imported here
            sizes[name] = image.attrs["Size"] // 2**20
            assert sizes[name] < limit_mib, sizes
    finally:
        client.close()
    SUMMARY.append(f"image builds (s): {images}; sizes (MiB): {sizes}")


def test_testcontainers_runs_redis_and_apache_kafka_from_them(docker_host, images):
    from kafka import TopicPartition
    from testcontainers.community.redis import RedisContainer
    from testcontainers.core.container import DockerContainer

    from infra.config import TopicSpec
    from infra.kafka import ensure_topics
    from infra.processes import free_port

    with docker_env(docker_host):
        t0 = time.monotonic()
        with RedisContainer(build.REDIS_IMAGE) as redis_container:
            client = redis_container.get_client(socket_timeout=5)
            assert client.ping() is True
            client.set("k", "v")
            assert client.get("k") == b"v"
            client.close()
        redis_s = time.monotonic() - t0

        port = free_port()
        kafka = DockerContainer(build.KAFKA_IMAGE).with_command(list(build.kafka_command(port)))
        kafka.ports[f"{build.KAFKA_CONTAINER_PORT}/tcp"] = ("127.0.0.1", port)
        t0 = time.monotonic()
        with kafka:
            bootstrap = f"127.0.0.1:{port}"
            wait_until(lambda: kafka_answers(bootstrap), 60, f"Apache Kafka in its container on {bootstrap}")
            ensure_topics(bootstrap, [TopicSpec("it-probe", 2)])
            producer = kafka_clients.producer(bootstrap, acks="all")
            sent = [producer.send("it-probe", key=str(i).encode(), value=f"m{i}".encode()).get(10) for i in range(20)]
            producer.close()
            consumer = kafka_clients.consumer(bootstrap)
            tps = [TopicPartition("it-probe", p) for p in (0, 1)]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            got: list[bytes] = []
            deadline = time.monotonic() + 15
            while len(got) < 20 and time.monotonic() < deadline:
                got += [r.value for batch in consumer.poll(200).values() for r in batch]
            consumer.close()
            assert sorted(got) == sorted(f"m{i}".encode() for i in range(20))
            assert {m.partition for m in sent} == {0, 1}
        kafka_s = time.monotonic() - t0
    SUMMARY.append(f"redis container up, PING, down: {redis_s:.1f} s; kafka container produce/consume: {kafka_s:.1f} s")


@pytest.fixture(scope="module")
def container_world(docker_host, images, tmp_path_factory):
    import os

    from tests.support.backends import ENV_STREAMING_SET

    run_dir = tmp_path_factory.mktemp("containers-system")
    infra = ContainerInfra(docker_host, build.KAFKA_IMAGE, build.REDIS_IMAGE, build_missing=False)
    system = System(infra, run_dir, streaming_set=parse_settings(os.environ.get(ENV_STREAMING_SET, "")))
    t0 = time.monotonic()
    system.start()
    startup = time.monotonic() - t0
    world = Scenario(system, run_dir / "scenario")
    world.record.durations["containers system start-up"] = round(startup, 2)
    try:
        yield world
    finally:
        world.close()
        system.stop()
        SUMMARY.append(f"test_containers.py ({infra.describe()}):")
        SUMMARY.extend(world.record.lines())


def test_the_system_on_containers_expires_a_silent_broker_once_and_survives_a_kafka_restart(container_world):
    world = container_world
    system = world.system
    timing = system.timing
    assert system.backend == "containers"

    live = world.add_fleet("live")[0]
    name, addr = world.add_fleet("silent")
    t0 = time.monotonic()
    wait_until(lambda: world.everywhere(live) and world.everywhere(name), 60, "both brokers at the nodes and in Redis")
    world.record.durations["two brokers in Redis (container)"] = round(time.monotonic() - t0, 2)

    silenced_at = world.fleets.silence("silent")
    wait_until(lambda: world.nowhere(name), timing.expiry_bound_s + 10, f"{name} dropped by both nodes and Redis")
    dropped_after = time.monotonic() - silenced_at
    world.record.durations["silent broker dropped everywhere (container)"] = round(dropped_after, 2)
    assert dropped_after <= timing.expiry_bound_s + 2
    wait_until(lambda: world.tap.alerts_for(addr, "BROKER_EXPIRED"), 10, "the BROKER_EXPIRED alert")
    world.let_the_job_run()
    assert world.tap.decisions(addr) == ["EXPIRE"]
    assert len(world.tap.alerts_for(addr, "BROKER_EXPIRED")) == 1
    assert world.everywhere(live)

    # the Kafka container stops and starts again (same container, same disk); a broker registers meanwhile
    container_id = world.system.infra.kafka.get_container_id()
    system.stop_kafka()
    late = world.add_fleet("late")[0]
    wait_until(lambda: all(world.at_nodes(late)), 10, f"{late} at both nodes with Kafka down")
    assert all(route_or_none(a, "TLIVE0") is not None for a in system.node_addrs)
    t0 = time.monotonic()
    system.start_kafka()
    assert world.system.infra.kafka.get_container_id() == container_id
    wait_until(lambda: world.in_redis(late), 90, f"{late}, registered while Kafka was down, in Redis")
    world.record.durations["Kafka container restart until Redis had the missed broker"] = round(
        time.monotonic() - t0, 2
    )

    run = world.cpp("containers backend", system.namesrv_addr)
    assert run.result["ok"] and run.delivered, run.result
