"""Kafka replicated, under faults: the events' leader killed, then restarted; a Kafka node frozen for 30 s.

Apache Kafka as three KRaft nodes (:class:`tests.support.backends.ReplicatedInfra`: the events and
actions topics on three replicas, ``min.insync.replicas`` 2, the actions led by node 1 and the events
partitions by nodes 2 and 3), Redis, two real nodes and the Spark job as processes, every setting as
``conf/`` ships it (simulated brokers send a 10 s timeout of their own, which cannot hide how late anything
acts). A live broker is kept on every partition of the events topic, and the brokers that die during a
fault are put on the partitions the faulty Kafka node leads, where their events wait for the leader to
move. Faults: kill -9 the node leading the events partitions, hold it down past a broker's deadline and
start it again; SIGSTOP the actions' leader for 30 s; SIGSTOP the events' leader for 30 s. Throughout:

- no live broker is ever missing from a node or from Redis (no wrong expiry);
- a broker that crashes during a fault is gone from every node and Redis within ``FAULT_BOUND_S`` of its
  close, and one that falls silent within ``FAULT_BOUND_S`` of its deadline (the figures are printed);
- the monitor's MONITOR_HEARTBEATs reach every node: while the actions' leader is frozen, and once the
  events' leader has moved or come back (while an events partition's leader is frozen the monitor waits,
  and the nodes decide: docs/deploy.md, "Kafka replicated");

and afterwards every event a node's publisher says Kafka acknowledged is on the events topic (counted by
the node's ``seq`` against its Prometheus counters). The bounds hold to their targets on a quiet machine
and to three times them on a loaded one (:func:`tests.support.liveness.bounds_now`).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import time
from collections.abc import Iterator

import pytest
from kafka.partitioner.default import murmur2

from common.contract import wall_ms
from tests.support.backends import ReplicatedInfra
from tests.support.liveness import Gone, Observer, Stack, bounds_now, last_heard_ms, running
from tests.support.report import report
from tests.support.system import ACTIONS, EVENTS, SHIPPED, System
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(1800)

BROKER_TIMEOUT_MS = SHIPPED.broker_timeout_ms
#: while the fault is on Kafka: a crashed broker's close, or a silent one's deadline -> gone everywhere
FAULT_BOUND_S = 5.0
#: how long the frozen Kafka node stays stopped
FROZEN_S = 30.0
NODES = ("node-1", "node-2")
_PORTS = itertools.count(43000, 2)


class Replicated(Stack):
    """The stack on a replicated Kafka, with brokers placed on chosen partitions of the events topic."""

    infra: ReplicatedInfra

    def __init__(self, system: System, infra: ReplicatedInfra) -> None:
        super().__init__(system)
        self.infra = infra
        self.partitions = len(infra.leaders(EVENTS))

    def add_on(self, name: str, partition: int) -> tuple[str, str]:
        """Broker ``<name>-0`` at both nodes and in Redis, its events keyed to ``partition``; (brokerName, brokerAddr)."""
        port = next(p for p in _PORTS if self.partition_of(f"127.0.0.1:{p}") == partition)
        self._addr_base = port - 10  # Stack.add takes the next base
        return self.add(name)

    def partition_of(self, broker_addr: str) -> int:
        """The events partition a broker's events go to (Kafka's default partitioner: murmur2 of the key)."""
        return (murmur2(broker_addr.encode()) & 0x7FFFFFFF) % self.partitions

    def events_leader(self) -> tuple[int, list[int]]:
        """The Kafka node leading the most events partitions (the lowest id among equals), and those."""
        leaders = self.infra.leaders(EVENTS)
        counts = collections.Counter(leaders.values())
        node = min(counts, key=lambda n: (-counts[n], n))
        return node, sorted(p for p, leader in leaders.items() if leader == node)

    def heartbeats_heard(self) -> list[float]:
        """MONITOR_HEARTBEATs each node has obeyed so far."""
        return [
            self.system.node_metrics(i)["rocketmq_namesrv_actions_total"][(("outcome", "monitor_heartbeat"),)]
            for i in range(len(NODES))
        ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicated]:
    run_dir = tmp_path_factory.mktemp("kafka-replicated")
    infra = ReplicatedInfra(run_dir)
    with running(
        System(infra, run_dir, timing=SHIPPED, node_metrics=True), lambda system: Replicated(system, infra)
    ) as s:
        report(s.system.describe())
        yield s


@pytest.fixture(scope="module")
def watch(stack: Replicated) -> Iterator[Observer]:
    """A live broker on every partition of the events topic, watched at every node and in Redis throughout."""
    keep = {stack.add_on(f"keep{p}", p)[0] for p in range(stack.partitions)}
    w = Observer(stack.system.node_addrs, stack.system.redis_url, keep)
    try:
        yield w
    finally:
        w.close()


def gone_from_now(stack: Replicated, fleet: str, timeout: float) -> Gone:
    """When each node and Redis stop knowing ``fleet``'s broker, measured from now on in a thread."""
    return Gone(stack.system.node_addrs, stack.system.redis_url, stack.fleets.broker(fleet), timeout)


def crash_within_bound(stack: Replicated, watch: Observer, fleet: str, label: str) -> None:
    """Crash ``fleet``'s broker now: gone from both nodes and Redis within FAULT_BOUND_S of its close."""
    gone = gone_from_now(stack, fleet, 90)
    closed = wall_ms()
    stack.fleets.crash(fleet)
    times = gone.times()
    watch.left_redis(gone.name)
    figures = {place: at - closed for place, at in times.items()}
    report(f"{label}: crashed broker, close -> gone: " + ", ".join(f"{k} {v} ms" for k, v in figures.items()))
    (bound,) = bounds_now(FAULT_BOUND_S)
    assert all(v <= bound for v in figures.values()), figures


def silent_within_bound(stack: Replicated, watch: Observer, gone: Gone, label: str) -> None:
    """A broker silenced earlier: gone from both nodes and Redis within FAULT_BOUND_S of its deadline, not before it."""
    times = gone.times()
    watch.left_redis(gone.name)
    wait_until(lambda: stack.system.tap.reached(EVENTS), 120, "the tap at the end of the events topic")
    deadline = last_heard_ms(stack.system.tap.events(), gone.addr) + BROKER_TIMEOUT_MS
    figures = {place: at - deadline for place, at in times.items()}
    report(f"{label}: silent broker, deadline -> gone: " + ", ".join(f"{k} {v} ms" for k, v in figures.items()))
    (bound,) = bounds_now(FAULT_BOUND_S)
    assert all(-50 <= v <= bound for v in figures.values()), figures


def heartbeats_keep_coming(stack: Replicated, label: str, fault_ends: float | None = None) -> None:
    """Every node obeys a MONITOR_HEARTBEAT sent from now on, before ``fault_ends`` (monotonic) if given:
    the monitor's actions reach every node while the fault is on."""
    before, since = stack.heartbeats_heard(), time.monotonic()
    limit = 30.0 if fault_ends is None else fault_ends - since
    wait_until(
        lambda: all(now > was for now, was in zip(stack.heartbeats_heard(), before, strict=True)),
        limit,
        f"a MONITOR_HEARTBEAT at every node ({label})",
        interval=0.2,
        state=stack.heartbeats_heard,
    )
    report(f"{label}: a MONITOR_HEARTBEAT at every node {time.monotonic() - since:.1f} s after asking")


def caught_up(stack: Replicated, label: str, batches: int = 10) -> None:
    """The job has read to the end of the events topic and written ``batches`` batches more since (the watch
    goes on meanwhile: a live broker the monitor wrongly expired on catching up would show)."""
    start, t0 = stack.system.committed_batch(), time.monotonic()
    wait_until(lambda: stack.system.tap.reached(EVENTS), 120, "the tap at the end of the events topic")
    wait_until(lambda: stack.system.committed_batch() >= start + batches, 180, f"{batches} more batches written", 0.5)
    report(f"{label}: {batches} batches written in {time.monotonic() - t0:.1f} s after the fault")


def acknowledged_events_are_on_the_topic(stack: Replicated, label: str) -> None:
    """Every event a node's publisher counts as acknowledged is on the events topic (by the node's seq).

    ``seq`` numbers each event a node queues, 1, 2, 3 ... without a gap, so an acknowledged event missing
    from the topic is a gap below the highest seq there (beyond the events the node failed or dropped),
    or a count on the topic short of the acknowledged one; the counters are read before the topic, so
    events sent meanwhile only add to the topic's side.
    """
    for i, node in enumerate(NODES):
        seen: dict[str, float] = {}
        wait_until(
            lambda i=i, node=node, seen=seen: _on_the_topic(stack, i, node, seen),
            120,
            f"{node}'s acknowledged events on the events topic",
            interval=1.0,
            state=lambda seen=seen: seen,
        )
        report(f"{label}: {node} events " + ", ".join(f"{k} {v:.0f}" for k, v in seen.items()))


def _on_the_topic(stack: Replicated, i: int, node: str, seen: dict[str, float]) -> bool:
    m = stack.system.node_metrics(i)
    seen["acknowledged"] = m["rocketmq_namesrv_events_published_total"][()]
    seen["failed"] = m["rocketmq_namesrv_events_failed_total"][()]
    seen["dropped"] = sum(m["rocketmq_namesrv_events_dropped_total"].values())
    if not stack.system.tap.reached(EVENTS):
        return False
    seqs = {e.seq for e in stack.system.tap.events() if e.node == node}
    seen["on the topic"], seen["highest seq"] = len(seqs), max(seqs)
    seen["gaps"] = max(seqs) - len(seqs)
    return len(seqs) >= seen["acknowledged"] and seen["gaps"] <= seen["failed"] + seen["dropped"]


@contextlib.contextmanager
def frozen_for_30_s(stack: Replicated, watch: Observer, victim: int, led: list[int], label: str) -> Iterator[float]:
    """Kafka node ``victim`` SIGSTOPped for FROZEN_S; a broker on events partition ``led[-1]`` falls silent as
    it begins and one on ``led[0]`` crashes 2 s in. The block runs within the freeze (given when it began);
    afterwards the silent broker's deadline, the heartbeats, the catching up and the events are checked."""
    stack.add_on(f"{label}crash", led[0])
    stack.add_on(f"{label}quiet", led[-1])
    what = f"Kafka node {victim} frozen"
    with stack.infra.kafka_node_frozen(victim):
        frozen = time.monotonic()
        quiet = gone_from_now(stack, f"{label}quiet", BROKER_TIMEOUT_MS / 1000 + 90)
        stack.fleets.silence(f"{label}quiet")
        time.sleep(2)  # schedule: the crash comes 2 s into the fault
        crash_within_bound(stack, watch, f"{label}crash", what)
        quiet.times()  # gone everywhere; held against its deadline below, once the topic can be read to its end
        yield frozen
        time.sleep(max(0.0, frozen + FROZEN_S - time.monotonic()))
    silent_within_bound(stack, watch, quiet, what)
    wait_until(stack.infra.in_sync, 120, f"Kafka node {victim} back in sync", interval=1.0)
    report(f"{what}: back in sync {time.monotonic() - frozen:.1f} s after the freeze")
    heartbeats_keep_coming(stack, f"Kafka node {victim} continued")
    caught_up(stack, f"Kafka node {victim} continued")
    acknowledged_events_are_on_the_topic(stack, what)
    watch.check()


def test_the_actions_leader_frozen_for_30_s_passes_the_actions_on_and_removes_no_live_broker(
    stack: Replicated, watch: Observer
):
    """SIGSTOP the Kafka node leading the actions topic for 30 s: it keeps its connections until they time
    out. The monitor's actions reach every node again once the actions' leadership has moved, within the
    freeze."""
    stack.infra.heal()
    wait_until(stack.infra.in_sync, 120, "every Kafka node in sync", interval=1.0)
    (victim,) = stack.infra.leaders(ACTIONS).values()
    led = sorted(p for p, leader in stack.infra.leaders(EVENTS).items() if leader == victim)
    report(
        f"freezing Kafka node {victim} for {FROZEN_S:.0f} s, the leader of the actions and of events partitions {led}"
    )
    # the premise: no events partition waits for this node, so the monitor reads on and decides (docs/deploy.md)
    assert led == [], f"Kafka node {victim} leads events partitions {led} too"
    with frozen_for_30_s(stack, watch, victim, [0], "stopactions") as frozen:
        heartbeats_keep_coming(stack, f"Kafka node {victim} frozen", fault_ends=frozen + FROZEN_S)


def test_the_events_leader_killed_then_restarted_loses_nothing_and_removes_no_live_broker(
    stack: Replicated, watch: Observer
):
    """kill -9 the Kafka node leading the events partitions; a broker on its partitions crashes and one falls
    silent while it is down; it stays down past the silent broker's deadline, then starts again."""
    victim, led = stack.events_leader()
    report(f"killing Kafka node {victim}, the leader of events partitions {led}")
    stack.add_on("killcrash", led[0])
    stack.add_on("killquiet", led[-1])
    stack.infra.kill_kafka_node(victim)
    killed = time.monotonic()
    quiet = gone_from_now(stack, "killquiet", BROKER_TIMEOUT_MS / 1000 + 90)
    stack.fleets.silence("killquiet")
    time.sleep(2)  # schedule: the crash comes 2 s into the fault
    crash_within_bound(stack, watch, "killcrash", "events leader killed")
    wait_until(lambda: victim not in stack.infra.leaders(EVENTS).values(), 60, "the events partitions' new leaders")
    report(f"events leader killed: its partitions led by others {time.monotonic() - killed:.1f} s after the kill")
    silent_within_bound(stack, watch, quiet, "events leader killed")
    # held down past the silent broker's deadline, then started again on its data
    time.sleep(max(0.0, killed + BROKER_TIMEOUT_MS / 1000 + 8 - time.monotonic()))
    stack.infra.restart_kafka_node(victim)
    wait_until(stack.infra.in_sync, 120, f"Kafka node {victim} back in sync", interval=1.0)
    report(f"events leader killed: back in sync {time.monotonic() - killed:.1f} s after the kill")
    heartbeats_keep_coming(stack, "events leader restarted")
    caught_up(stack, "events leader restarted")
    acknowledged_events_are_on_the_topic(stack, "events leader killed and restarted")
    watch.check()


def test_the_events_leader_frozen_for_30_s_loses_nothing_and_removes_no_live_broker(stack: Replicated, watch: Observer):
    """SIGSTOP the Kafka node leading the most events partitions for 30 s. The monitor reads none of its
    batch until its Kafka clients give up on that node (their 30 s request timeout), so it waits and the
    nodes decide meanwhile; once it reads on, no live broker is expired."""
    stack.infra.heal()
    wait_until(stack.infra.in_sync, 120, "every Kafka node in sync", interval=1.0)
    victim, led = stack.events_leader()
    report(f"freezing Kafka node {victim} for {FROZEN_S:.0f} s, the leader of events partitions {led}")
    with frozen_for_30_s(stack, watch, victim, led, "stopevents"):
        pass
