"""Apache RocketMQ's own 5.5.0 brokers, frozen and killed, under the system as shipped: the job decides.

What ``test_liveness_deadline.py`` proves with simulated brokers, proved with real ones: Kafka, Redis,
two nodes and the Spark job as processes with every ``conf/`` value (started once for the module),
and per test one broker registered with both nodes.

* frozen with SIGSTOP (its connections stay open, nothing more is sent), the broker is gone at both
  nodes (their cluster info, read over TCP as a client does) and from the job's Redis entry within
  ``EXPIRY_MAX_S`` of its deadline and never before it: the last REGISTER/HEARTBEAT event time any
  node published for it plus its timeout. The timeout is short only because the broker sends it: a
  5.x broker that may act as master puts ``brokerNotActiveTimeoutMillis`` in every registration (and
  heartbeats every second), and the nodes' REGISTER events show the value they apply. A 4.x broker
  sends none, and the nodes' 120 s default is too long to wait for here;
* killed with SIGKILL (the kernel closes its connections), the broker is gone everywhere within
  ``CLOSE_MAX_S`` of the last close a node reported, long before its timeout (120 s: it sends none).

Each removal must be the job's own decision: one EXPIRE, one REMOVE on the actions topic. The bounds
hold as they are while the machine is quiet enough to meet them (:func:`tests.support.liveness.bounds_now`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streaming.routes import RouteLookup
from tests.support import report as summary
from tests.support.backends import ProcessInfra
from tests.support.liveness import bounds_now, gone_times, known_in_redis, last_heard_ms
from tests.support.rocketmq import ROCKETMQ_5, JavaBroker, java_broker
from tests.support.system import EVENTS, SHIPPED, KafkaTap, System
from tests.support.wait import wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(900)]

#: the frozen broker's timeout; not 5.x's default (10 s), so the nodes applying it shows it came from the broker
FROZEN_TIMEOUT_MS = 15_000
#: a 5.x broker sends its timeout (and a heartbeat every second) only while it may act as master
SENDS_ITS_TIMEOUT = {"enableSlaveActingMaster": "true", "brokerNotActiveTimeoutMillis": str(FROZEN_TIMEOUT_MS)}
#: gone at both nodes and in Redis within 3 s of the deadline (frozen) or of the last close (killed); and,
#: with the job stalled, gone from Redis within 3 s of leaving the nodes
EXPIRY_MAX_S = CLOSE_MAX_S = STALLED_REDIS_MAX_S = 3.0
#: a broker's JVM shares the machine's cores with Kafka, Spark, the nodes and other people's tests
BROKER_START_S = 240.0


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    run_dir = tmp_path_factory.mktemp("rocketmq-liveness")
    system = System(ProcessInfra(run_dir), run_dir, timing=SHIPPED)
    system.start()
    try:
        yield system
    finally:
        system.stop()


@pytest.fixture
def lookup(system: System) -> Iterator[RouteLookup]:
    lookup = RouteLookup(system.redis_url)
    try:
        yield lookup
    finally:
        lookup.close()


def node_names(system: System) -> set[str]:
    return {f"node-{i + 1}" for i in range(len(system.node_addrs))}


def closes(tap: KafkaTap, addr: str) -> dict[str, int]:
    """node -> the event time of its latest CHANNEL_CLOSED of ``addr``."""
    out: dict[str, int] = {}
    for e in tap.events():
        if e.broker_addr == addr and str(e.type) == "CHANNEL_CLOSED":
            out[e.node] = max(out.get(e.node, e.event_time), e.event_time)
    return out


def timeouts_applied(tap: KafkaTap, addr: str) -> dict[str, int | None]:
    """node -> the heartbeatTimeoutMillis of its REGISTER of ``addr``: the timeout the node applies."""
    return {e.node: e.heartbeat_timeout_millis for e in tap.events()
            if e.broker_addr == addr and str(e.type) == "REGISTER"}  # fmt: skip


def everywhere(lookup: RouteLookup, broker: JavaBroker) -> None:
    """At every node (start_broker waited for that) and in the job's Redis entry."""
    wait_until(lambda: broker.name in known_in_redis(lookup), 60, f"{broker.name} in Redis")


def report(label: str, figures: dict[str, int]) -> None:
    line = f"{label}: " + ", ".join(f"{place} {ms:+d} ms" for place, ms in sorted(figures.items()))
    summary.report(line)


def test_a_frozen_broker_is_gone_everywhere_within_seconds_of_its_own_deadline(
    system: System, lookup: RouteLookup, tmp_path: Path
):
    tap = system.tap
    nodes = node_names(system)
    # leaving the block SIGKILLs the broker, which ends a stopped process too
    with java_broker(
        ROCKETMQ_5, tmp_path, system.node_addrs, name="frozen", extra=SENDS_ITS_TIMEOUT, timeout=BROKER_START_S
    ) as broker:
        everywhere(lookup, broker)
        wait_until(lambda: timeouts_applied(tap, broker.addr).keys() == nodes, 30, "a REGISTER from every node")
        assert timeouts_applied(tap, broker.addr) == dict.fromkeys(nodes, FROZEN_TIMEOUT_MS)

        os.kill(broker.process.pid, signal.SIGSTOP)
        gone = gone_times(system.node_addrs, lookup, [broker.name], FROZEN_TIMEOUT_MS / 1000 + 60)[broker.name]
        wait_until(lambda: tap.reached(EVENTS), 30, "the tap at the end of the events topic")
        deadline = last_heard_ms(tap.events(), broker.addr) + FROZEN_TIMEOUT_MS
        late = {place: at - deadline for place, at in gone.items()}
        report(f"frozen {ROCKETMQ_5.server_version} broker (SIGSTOP): deadline -> gone", late)
        (max_ms,) = bounds_now(EXPIRY_MAX_S)
        assert all(0 <= ms <= max_ms for ms in late.values()), late
        wait_until(lambda: tap.decisions(broker.addr), 10, f"the job's decision on {broker.addr}")
        assert tap.decisions(broker.addr) == ["EXPIRE"]


def test_a_killed_broker_is_gone_everywhere_within_seconds_of_its_last_connection_closing(
    system: System, lookup: RouteLookup, tmp_path: Path
):
    tap = system.tap
    nodes = node_names(system)
    with java_broker(ROCKETMQ_5, tmp_path, system.node_addrs, name="killed", timeout=BROKER_START_S) as broker:
        everywhere(lookup, broker)
        os.kill(broker.process.pid, signal.SIGKILL)
        gone = gone_times(system.node_addrs, lookup, [broker.name], 60)[broker.name]
    wait_until(lambda: closes(tap, broker.addr).keys() == nodes, 30, f"CHANNEL_CLOSED of {broker.addr} from every node")
    last_close = max(closes(tap, broker.addr).values())
    after = {place: at - last_close for place, at in gone.items()}
    report(f"killed {ROCKETMQ_5.server_version} broker (SIGKILL): last close -> gone", after)
    (max_ms,) = bounds_now(CLOSE_MAX_S)
    # a node drops the broker at its own close, which may come a little before the other node's
    assert max(after.values()) <= max_ms, after
    wait_until(lambda: tap.decisions(broker.addr), 10, f"the job's decision on {broker.addr}")
    assert tap.decisions(broker.addr) == ["REMOVE"]


def test_with_the_job_stalled_a_killed_broker_leaves_redis_within_seconds_and_stays_out(
    system: System, lookup: RouteLookup, tmp_path: Path
):
    # the driver frozen (SIGSTOP of it and everything under it), as a hung driver or a long pause is: the
    # nodes drop the broker at its close, and the node that holds the fallback lease takes it out of Redis
    tap = system.tap
    with java_broker(ROCKETMQ_5, tmp_path, system.node_addrs, name="stalled", timeout=BROKER_START_S) as broker:
        everywhere(lookup, broker)
        with system.streaming_frozen():
            time.sleep(2)  # schedule: the broker dies 2 s into the stall
            os.kill(broker.process.pid, signal.SIGKILL)
            gone = gone_times(system.node_addrs, lookup, [broker.name], 60)[broker.name]
    left_nodes = max(at for place, at in gone.items() if place != "redis")
    report(
        f"killed {ROCKETMQ_5.server_version} broker, job stalled: left the nodes -> gone from Redis",
        {"redis": gone["redis"] - left_nodes},
    )
    (max_ms,) = bounds_now(STALLED_REDIS_MAX_S)
    assert gone["redis"] - left_nodes <= max_ms, gone
    # the resumed job neither brings it back nor removes it a second time
    start, back = system.committed_batch(), []

    def three_batches_later() -> bool:
        if broker.name in known_in_redis(lookup):
            back.append(time.time())
        return system.committed_batch() >= start + 3

    wait_until(three_batches_later, 120, "three more batches written", interval=0.05)
    assert back == []
    assert len(tap.decisions(broker.addr)) <= 1
