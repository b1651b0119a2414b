"""Liveness on the stack as shipped: gone everywhere within seconds of the broker's own deadline.

Kafka, Redis, two real nodes and the Spark job as processes, every setting as ``conf/`` ships it except
the simulated brokers' own ``heartbeatTimeoutMillis``, which cannot hide how late the system acts on
it.  A silent broker is gone at both nodes and in Redis within ``EXPIRY_MEDIAN_S`` (median) and
``EXPIRY_MAX_S`` (max) of its deadline; a crashed broker is gone in Redis within ``CLOSE_MAX_S`` of its
last close, through one REMOVE (the monitor's targets, docs/monitor.md "How fast", loosened only on an
overloaded machine: see ``bounds_now``).  Events no node should send change nothing, also after a
restart, and with the job killed the nodes fall back to their own scan until it decides again.  Times are
wall-clock milliseconds on this one machine, as the nodes stamp events.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import pytest

from common import kafka_clients
from common.contract import Action, ActionType, Event, EventType, encode_action, encode_event, wall_ms
from infra.processes import pid_alive
from tests.support import report as summary
from tests.support.backends import ProcessInfra
from tests.support.liveness import Stack, bounds_now, gone_times, last_heard_ms, running
from tests.support.system import ACTIONS, EVENTS, SHIPPED, System
from tests.support.wait import wait_until

pytestmark = [pytest.mark.alone, pytest.mark.timeout(900)]

BROKER_TIMEOUT_MS = SHIPPED.broker_timeout_ms
#: Deadline -> gone at every node and in Redis: the monitor's targets, a 1 s median and a 2 s max. A
#: node's SILENT report (the first tick past the deadline) is decided in the batch that reads it: the
#: wait for the running batch to end, then one batch, as for a close (docs/internals/testing.md, Timing).
EXPIRY_MEDIAN_S, EXPIRY_MAX_S = 1.0, 2.0
#: last close -> gone in Redis: one micro-batch after the last CHANNEL_CLOSED (the target: at most 2 s)
CLOSE_MAX_S = 2.0
#: A miss is measured once more, with fresh brokers, before it fails: a neighbour's burst on this shared
#: machine seldom lands on both tries, a delay of the system's own shows up in both. Every try is printed.
TRIES = 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("deadline")
    with running(System(ProcessInfra(run_dir), run_dir, timing=SHIPPED)) as s:
        yield s


def report(label: str, latencies_ms: list[int]) -> None:
    line = (
        f"{label}: median {statistics.median(latencies_ms):.0f} ms, max {max(latencies_ms)} ms "
        f"over {len(latencies_ms)} (broker x place)"
    )
    summary.report(line)


def silence_and_time(stack: Stack, attempt: int) -> tuple[dict[str, str], list[int], dict]:
    """Four fresh brokers silenced a little apart: (brokers, deadline -> gone per broker and place, gone)."""
    fleets = [f"quiet{attempt}x{i}" for i in range(4)]
    brokers = dict(stack.add(fleet) for fleet in fleets)
    for fleet in fleets:  # staggered, so the deadlines fall at different points of the ticks and batches
        stack.fleets.silence(fleet)
        time.sleep(0.37)
    gone = gone_times(stack.system.node_addrs, stack.lookup, brokers, BROKER_TIMEOUT_MS / 1000 + 30)
    latencies = []
    for name, addr in brokers.items():
        deadline = last_heard_ms(stack.system.tap.events(), addr) + BROKER_TIMEOUT_MS
        for place, at in gone[name].items():
            assert at >= deadline - 50, f"{name} gone at {place} {deadline - at} ms before its deadline"
            latencies.append(at - deadline)
    report(f"silent broker [try {attempt}]: deadline -> gone (shipped conf)", latencies)
    return brokers, latencies, gone


def test_a_silent_broker_is_gone_everywhere_within_seconds_of_its_own_deadline(stack: Stack):
    for attempt in range(1, TRIES + 1):
        brokers, latencies, gone = silence_and_time(stack, attempt)
        median_ms, max_ms = bounds_now(EXPIRY_MEDIAN_S, EXPIRY_MAX_S)
        if statistics.median(latencies) <= median_ms and max(latencies) <= max_ms:
            break
    assert statistics.median(latencies) <= median_ms, gone
    assert max(latencies) <= max_ms, gone
    tap = stack.system.tap
    for name, addr in brokers.items():
        wait_until(lambda a=addr: tap.alerts_for(a, "BROKER_EXPIRED"), 10, f"{name}'s BROKER_EXPIRED")
        assert tap.decisions(addr) == ["EXPIRE"]
        (alert,) = tap.alerts_for(addr, "BROKER_EXPIRED")
        silent_s = float(alert.message.split("no heartbeat at any node for ")[1].split(" s")[0])
        assert BROKER_TIMEOUT_MS / 1000 <= silent_s <= (BROKER_TIMEOUT_MS + max_ms) / 1000, alert.message


def crash_and_time(stack: Stack, attempt: int) -> tuple[dict[str, str], list[int], dict]:
    """Three fresh brokers crashed a little apart: (brokers, last close -> gone in Redis, gone)."""
    fleets = [f"crash{attempt}x{i}" for i in range(3)]
    brokers = dict(stack.add(fleet) for fleet in fleets)
    closed_at = {}
    for name, fleet in zip(brokers, fleets, strict=True):
        closed_at[name] = wall_ms()
        stack.fleets.crash(fleet)
        time.sleep(0.41)
    gone = gone_times(stack.system.node_addrs, stack.lookup, brokers, 30)
    redis_latency = [gone[name]["redis"] - closed_at[name] for name in brokers]
    node_latency = [gone[name][p] - closed_at[name] for name in brokers for p in ("node-1", "node-2")]
    report(f"crashed broker [try {attempt}]: last close -> gone in Redis", redis_latency)
    report(f"crashed broker [try {attempt}]: close -> gone at the node", node_latency)
    return brokers, redis_latency, gone


def test_a_crashed_broker_is_gone_in_redis_within_seconds_of_its_last_connection_closing(stack: Stack):
    for attempt in range(1, TRIES + 1):
        brokers, redis_latency, gone = crash_and_time(stack, attempt)
        (max_ms,) = bounds_now(CLOSE_MAX_S)
        if max(redis_latency) <= max_ms:
            break
    assert max(redis_latency) <= max_ms, gone
    tap = stack.system.tap
    for name, addr in brokers.items():
        wait_until(lambda a=addr: tap.alerts_for(a, "BROKER_REMOVED"), 10, f"{name}'s BROKER_REMOVED")
        assert tap.decisions(addr) == ["REMOVE"]
        (alert,) = tap.alerts_for(addr, "BROKER_REMOVED")
        assert "lost its connection at every node" in alert.message, alert.message


def test_a_close_at_one_node_only_drops_the_broker_there(stack: Stack):
    name, addr = stack.add("halfway")
    node1 = stack.system.node_addrs[0]
    stack.fleets.hold(node1)  # it must not reconnect to node 1 meanwhile
    try:
        stack.fleets.drop_link("halfway", node1)
        wait_until(lambda: not stack.places(name)["node-1"], 10, f"{name} dropped by node 1")
        wait_until(lambda: [e for e in stack.system.tap.events()
                            if e.broker_addr == addr and str(e.type) == "CHANNEL_CLOSED"],
                   10, "node 1's CHANNEL_CLOSED event")  # fmt: skip
        start = int(stack.lookup.status().get("batchId", -1))
        wait_until(lambda: int(stack.lookup.status().get("batchId", -1)) >= start + 3, 30, "three more batches")
        assert stack.places(name) == {"node-1": False, "node-2": True, "redis": True}
        assert stack.system.tap.decisions(addr) == []
    finally:
        stack.fleets.release(node1)


def poison(bootstrap: str) -> list[bytes]:
    """Schema-shaped events any buggy or misconfigured node could send."""
    year_2100 = 4_102_444_800_000
    events = [
        Event(type=EventType.TICK, node="clock-in-2100", event_time=year_2100, seq=1),
        Event(type=EventType.TICK, node="n" * 900_000, event_time=wall_ms(), seq=1),
        Event(type=EventType.TICK, node="long-max", event_time=2**63 - 1, seq=1),
    ]
    producer = kafka_clients.producer(bootstrap, max_request_size=4 * 1024 * 1024)
    try:
        for e in events:
            producer.send(EVENTS, key=b"poison", value=encode_event(e))
        producer.flush()
    finally:
        producer.close()
    return [encode_event(e) for e in events]


def poison_actions(bootstrap: str, live_addr: str) -> None:
    """Actions no trusted monitor sent: a lastHeartbeat of 2^64-1, and a REMOVE from a monitor nobody runs."""
    now = wall_ms()
    actions = [
        Action(type=ActionType.EXPIRE, monitor="it-monitor", decided_at=now, cluster_name="DefaultCluster",
               broker_addr=live_addr, last_heartbeat=2**64 - 1, watermark=now - 120_000),
        Action(type=ActionType.REMOVE, monitor="rogue", decided_at=now, cluster_name="DefaultCluster",
               broker_addr=live_addr, last_heartbeat=now + 60_000, watermark=now),
        Action(type=ActionType.MONITOR_HEARTBEAT, monitor="rogue", decided_at=now, watermark=now - 120_000),
    ]  # fmt: skip
    producer = kafka_clients.producer(bootstrap)
    try:
        for a in actions:
            producer.send(ACTIONS, key=live_addr.encode(), value=encode_action(a))
        producer.flush()
    finally:
        producer.close()


def expired_once(tap, brokers: dict[str, str]) -> None:
    """Each broker got exactly one EXPIRE (read once the tap has caught up with it)."""
    for name, addr in brokers.items():
        wait_until(lambda a=addr: tap.decisions(a), 10, f"{name}'s EXPIRE on the actions topic")
        assert tap.decisions(addr) == ["EXPIRE"], (name, tap.decisions(addr))


def test_poison_events_change_nothing_and_the_job_keeps_deciding_after_a_restart(stack: Stack):
    live = stack.add("steady")
    doomed = dict([stack.add("doomed0")])
    poison(stack.system.kafka_bootstrap)
    poison_actions(stack.system.kafka_bootstrap, live[1])
    stack.fleets.silence("doomed0")
    gone_times(
        stack.system.node_addrs, stack.lookup, doomed, BROKER_TIMEOUT_MS / 1000 + 30
    )  # still decided by the job...
    tap = stack.system.tap
    expired_once(tap, doomed)
    wait_until(
        lambda: [a for a in tap.alerts() if str(a.kind) == "NODE_CLOCK_AHEAD" and a.node == "clock-in-2100"],
        30,
        "NODE_CLOCK_AHEAD naming the node",
    )
    assert stack.places(live[0]) == {"node-1": True, "node-2": True, "redis": True}  # ...and nobody else
    assert tap.decisions(live[1]) == ["REMOVE"]  # only the rogue one (2^64-1 does not even decode): refused
    for i in range(2):
        wait_until(lambda i=i: "rogue" in stack.system.node_log(i), 10, f"node {i + 1} reporting the rogue monitor")

    # the poison is in the checkpointed offsets' past: a restart must not meet it and crash
    stack.system.restart_streaming(kill=True)
    again = dict([stack.add("doomed1")])
    stack.fleets.silence("doomed1")
    gone_times(stack.system.node_addrs, stack.lookup, again, BROKER_TIMEOUT_MS / 1000 + 30)
    expired_once(tap, again)
    assert tap.decisions(live[1]) == ["REMOVE"]
    assert stack.places(live[0]) == {"node-1": True, "node-2": True, "redis": True}


def test_with_the_job_killed_the_nodes_serve_and_expire_and_hand_back_once_it_decides(stack: Stack):
    system = stack.system
    live = stack.add("survivor")
    orphan_name, orphan_addr = stack.add("orphan")
    pid = system.kill_streaming()
    assert not pid_alive(pid)
    # the nodes keep serving...
    assert stack.places(live[0])["node-1"] and stack.places(live[0])["node-2"]
    # ...and once monitorSilenceFallbackMillis has passed, expire a silent broker themselves
    wait_until(
        lambda: all("local expiry scan back on" in system.node_log(i) for i in range(2)),
        60,
        "both nodes' fallback to their own expiry scan",
    )
    stack.fleets.silence("orphan")
    silenced = wall_ms()
    nodes = ("node-1", "node-2")
    wait_until(
        lambda: not any(stack.places(orphan_name)[n] for n in nodes),
        BROKER_TIMEOUT_MS / 1000 + 30,
        f"{orphan_name} expired by both nodes' own scan",
    )
    assert wall_ms() - silenced >= BROKER_TIMEOUT_MS - 1_500  # not before its timeout
    assert system.tap.decisions(orphan_addr) == []  # nobody but the nodes decided

    before = [system.node_log(i).count("is alive: local expiry scan off") for i in range(2)]
    system.start_streaming()
    # the scan goes off again only after the restarted job's first batch
    wait_until(
        lambda: all(system.node_log(i).count("is alive: local expiry scan off") > before[i] for i in range(2)),
        60,
        "both nodes hand expiry back to the job",
    )
    # the job catches up from its checkpoint: the orphan leaves Redis too, the survivor stays
    wait_until(lambda: not stack.places(orphan_name)["redis"], 60, f"{orphan_name} gone from Redis")
    assert stack.places(live[0]) == {"node-1": True, "node-2": True, "redis": True}
