"""The chaos run: the replicated topology, brokers that die while each fault is in force, and the checks.

:class:`Chaos` starts :class:`infra.topology.Topology` (with Apache RocketMQ's controller-mode brokers and
a producer and a consumer when asked), Alertmanager in front of a webhook of its own
(:class:`~tests.support.chaos.checks.Pager`), a supervisor that restarts the job's driver as ``up``'s
does, and simulated brokers: one kept alive on every partition of the events topic throughout. Then, one
fault at a time (:mod:`tests.support.chaos.schedule`), :meth:`Chaos.run_fault`:

1. registers two more simulated brokers, on the partitions a faulty Kafka node leads when the fault is on
   Kafka (their events wait for that leader);
2. puts the fault on its part (SIGKILL, or SIGSTOP for the hold);
3. silences one of the two brokers as the fault begins and crashes the other (closes its connections)
   2 s later, and measures when each live node and Redis stop listing them, against the broker's
   deadline (its last heartbeat + its timeout; a crash's last heartbeat is its close at the latest);
4. heals the fault when its hold is over, and measures how soon every live node answers every topic
   with the bytes Redis holds;
5. starts the two dead brokers again, so that their incidents end.

Throughout, :class:`~tests.support.liveness.Observer` holds that no broker that lives is missing
from any live node or Redis, and that no broker that left Redis comes back before it is started again.
At the end (:meth:`Chaos.finish`): every message the RocketMQ producer had acknowledged was consumed,
every incident was notified once firing and once resolved at Alertmanager, every process runs, and our
logs hold no traceback. Every figure and every broken invariant goes into a :class:`FaultResult` or the
run's :class:`Outcome`, which :mod:`bench.chaos` prints and writes to ``bench/CHAOS_RESULTS.md``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kafka.partitioner.default import murmur2

from common import redis_clients
from common.contract import wall_ms
from infra.config import DEFAULT_TOPICS
from infra.processes import tcp_answers
from infra.supervisor import Supervisor
from infra.topology import Layout, Part, Topology
from tests.support.chaos.checks import Pager, same_routes_everywhere, tracebacks
from tests.support.chaos.schedule import BROKER_TIMEOUT_S, Fault, On
from tests.support.fleet import FleetRunner
from tests.support.liveness import Observer
from tests.support.system import Timing

__all__ = ["Chaos", "FaultResult", "Outcome"]

EVENTS, ACTIONS = DEFAULT_TOPICS[0].name, DEFAULT_TOPICS[1].name
#: the simulated brokers: the shipped system, brokers with a 10 s timeout of their own, heartbeating every second
BROKERS = Timing(broker_timeout_ms=int(BROKER_TIMEOUT_S * 1000), monitor_heartbeat_ms=None, monitor_fallback_ms=None)
#: after each heal: every live node answers every topic with Redis's bytes within this
CONSISTENT_S = 5.0
#: after a master's death: the clients route to the new master within this of the controller's election
ROUTE_AFTER_ELECTION_S = 5.0
#: a controller-mode broker sends no heartbeat timeout, so the NameServer's default applies; it registers
#: every registerNameServerPeriod (its default), so its deadline is within that of freeze + this
ROCKETMQ_BROKER_TIMEOUT_MS, ROCKETMQ_REGISTER_PERIOD_MS = 120_000, 30_000
#: the prefix's keys, whose slot's master the Redis fault kills
PREFIX_KEY = "{namesrv}:meta"


@dataclass
class FaultResult:
    fault: Fault
    target: str = ""
    started_at: float = 0.0
    #: seconds from the fault to its heal, and named figures (seconds)
    figures: dict[str, float] = field(default_factory=dict)
    #: invariant -> "" when held, else what broke it
    invariants: dict[str, str] = field(default_factory=dict)

    def held(self, name: str, broken: str = "") -> None:
        self.invariants[name] = broken

    @property
    def ok(self) -> bool:
        return not any(self.invariants.values())

    def line(self) -> str:
        figures = ", ".join(f"{k} {v:.2f} s" for k, v in self.figures.items())
        broken = [f"{k}: {v}" for k, v in self.invariants.items() if v]
        verdict = "ok" if not broken else "BROKEN " + "; ".join(broken)
        return f"{self.fault.name} ({self.target}): {verdict}; {figures}"


@dataclass
class Outcome:
    seed: int
    results: list[FaultResult] = field(default_factory=list)
    #: invariants of the whole run -> "" when held, else what broke it
    invariants: dict[str, str] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results) and not any(self.invariants.values())


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Chaos:
    def __init__(self, run_dir: Path, seed: int, *, rocketmq: bool, say: Callable[[str], None] = _say) -> None:
        self.run_dir, self.seed, self.say = run_dir, seed, say
        self.rng = random.Random(seed)
        self.pager = Pager(run_dir / "alertmanager")
        self.rocketmq = rocketmq
        self.topology: Topology | None = None
        self.observer: Observer | None = None
        self.flow = None
        #: broker name -> (its runner, its fleet's name)
        self.runners: dict[str, tuple[FleetRunner, str]] = {}
        self.addrs: dict[str, str] = {}
        self._ports = itertools.count(44000, 3)
        self._supervising = threading.Event()
        self._supervisor_thread: threading.Thread | None = None
        self.outcome = Outcome(seed)

    # -- the topology

    @property
    def topo(self) -> Topology:
        assert self.topology is not None, "start() first"
        return self.topology

    def start(self) -> None:
        self.pager.start()
        layout = Layout.free(self.run_dir, alertmanager_url=self.pager.url)
        self.topology = Topology(layout, rocketmq=self.rocketmq)
        t0 = time.monotonic()
        self.topo.start(self.say)
        self._supervise()
        self.observer = Observer(layout.node_addrs, self.topo.redis_url)
        self.say("waiting for the job's first batch ...")
        self.wait_committed(600)
        self.partitions = len(self.leaders(EVENTS))
        keep = [self.add_broker(f"keep{p}", p) for p in range(self.partitions)]
        self.wait_listed(keep, 60)
        self.observer.keep(*keep)
        if self.rocketmq:
            from infra import rocketmq

            groups = [g.name for g in self.topo.groups]
            rocketmq.create_topic(layout.node_addrs[0], "ChaosFlow", ["HaCluster"])
            self.flow = rocketmq.FlowClients.start(self.run_dir / "flow", layout.namesrv_addr, "ChaosFlow")
            members = [b.addr for g in self.topo.groups for b in g.brokers]
            self.wait_listed(groups + members, 60)
            self.observer.keep(*groups, *members)
        self.outcome.figures["start-up"] = time.monotonic() - t0
        self.say(f"topology up in {time.monotonic() - t0:.0f} s: {self.describe()}")

    def describe(self) -> str:
        t = self.topo
        return (
            f"Kafka {t.kafka_bootstrap}; Redis {t.redis_url}; Spark {t.spark.master_url if t.spark else '-'}; "
            f"nodes {t.layout.namesrv_addr}; Alertmanager {self.pager.url}; run dir {self.run_dir}"
        )

    def _supervise(self) -> None:
        """The job's driver restarted by the project's supervisor, as under ``up``; the rest the schedule heals."""
        supervisor = Supervisor([self.topo.streaming], out=sys.stderr)

        def loop() -> None:
            while not self._supervising.wait(supervisor.next_check_s()):
                supervisor.check(self._supervising.is_set)

        self._supervisor_thread = threading.Thread(target=loop, name="chaos-supervisor", daemon=True)
        self._supervisor_thread.start()

    def stop(self) -> None:
        self._supervising.set()
        if self._supervisor_thread is not None:
            self._supervisor_thread.join(30)
        for runner, _ in self.runners.values():
            with contextlib.suppress(Exception):
                runner.stop()
        if self.flow is not None:
            with contextlib.suppress(Exception):
                self.flow.stop()
        if self.observer is not None:
            self.observer.close()
        if self.topology is not None:
            self.topology.stop()
        self.pager.stop()

    # -- Kafka's view

    def _describe(self, topics: list[str]) -> list[dict]:
        return self.topo.kafka.describe_topics(topics)

    def leaders(self, topic: str) -> dict[int, int]:
        (info,) = self._describe([topic])
        return {p["partition_index"]: p["leader_id"] for p in info["partitions"]}

    def kafka_in_sync(self) -> bool:
        infos = self._describe([EVENTS, ACTIONS])
        return all(len(p["isr_nodes"]) == len(p["replica_nodes"]) for i in infos for p in i["partitions"])

    # -- simulated brokers

    def partition_of(self, addr: str) -> int:
        return (murmur2(addr.encode()) & 0x7FFFFFFF) % self.partitions

    def add_broker(self, name: str, partition: int | None = None, addr: str | None = None) -> str:
        """Broker ``<name>-0`` at every node, its events on ``partition`` (any when None); its name."""
        if addr is None:
            port = next(p for p in self._ports if partition is None or self.partition_of(f"127.0.0.1:{p}") == partition)
            addr = f"127.0.0.1:{port}"
        runner = FleetRunner()  # a thread of its own: a frozen node holds up no other broker's heartbeats
        runner.add(name, self.topo.layout.node_addrs, BROKERS, addr_base=addr)
        broker, self.addrs[broker] = runner.broker(name)
        self.runners[broker] = (runner, name)
        return broker

    def wait_listed(self, names: list[str], timeout: float) -> float:
        """Wait until every live node and Redis list every one of ``names``; the seconds it took."""
        assert self.observer is not None
        t0 = time.monotonic()
        while True:
            latest = dict(self.observer.latest)
            places = [p for p in (*self.observer.places, "redis") if p not in self.observer.faulty]
            if all(p in latest and set(names) <= _listed(latest[p]) for p in places):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                missing = {p: sorted(set(names) - _listed(latest.get(p, {}))) for p in places}
                raise AssertionError(f"not listed after {timeout:.0f} s: {missing}")
            time.sleep(0.1)

    def wait_committed(self, timeout: float, batches: int = 1) -> None:
        def batch() -> int:
            with contextlib.suppress(*redis_clients.failures(), ValueError):
                client = redis_clients.connect(self.topo.redis_url, timeout_s=2.0, retries=False)
                try:
                    return int(client.hget(PREFIX_KEY, "batchId") or -1)
                finally:
                    client.close()
            return -1

        start, deadline = batch(), time.monotonic() + timeout
        while batch() < start + batches:
            if time.monotonic() > deadline:
                raise AssertionError(f"the job wrote no batch in {timeout:.0f} s (log {self.topo.streaming.log_file})")
            time.sleep(0.5)

    # -- one fault

    def target(self, fault: Fault) -> tuple[str, Part, int | None]:
        """The part ``fault`` hits (name, part, and for Kafka the node id whose partitions wait)."""
        parts = self.topo.parts()
        name = fault.name
        if name == "kafka-leader-kill":
            counts = collections.Counter(self.leaders(EVENTS).values())
            node = min(counts, key=lambda n: (-counts[n], n))
            return f"kafka-{node}", parts[f"kafka-{node}"], node
        if name == "kafka-freeze":
            node = self.rng.randint(1, len(self.topo.kafka.nodes))
            return f"kafka-{node}", parts[f"kafka-{node}"], node
        if name == "redis-master-kill":
            port = self.topo.redis.owner(PREFIX_KEY)
            return f"redis-{port}", parts[f"redis-{port}"], None
        if name == "spark-worker-kill":
            i = self.rng.randint(1, 2)
            return f"spark-worker-{i}", parts[f"spark-worker-{i}"], None
        if name.startswith("driver-"):
            return "driver", parts["driver"], None
        if name.startswith("namesrv-"):
            i = self.rng.randint(1, len(self.topo.nodes))
            return f"node-{i}", parts[f"node-{i}"], None
        group = self.rng.choice(self.topo.groups)
        master = next(b for b in group.brokers if _listed_id(self, group.name, b.addr) == 0)
        if name == "rocketmq-master-kill":
            return (
                f"{group.name}-{group.brokers.index(master)}",
                parts[f"{group.name}-{group.brokers.index(master)}"],
                None,
            )
        slave = next(b for b in group.brokers if b is not master)
        j = group.brokers.index(slave)
        return f"{group.name}-{j}", parts[f"{group.name}-{j}"], None

    def run_fault(self, fault: Fault) -> FaultResult:
        """The fault, its dying brokers and its heal (see the module docstring); what the harness could not do
        is a broken invariant of its own, and the run goes on."""
        result = FaultResult(fault, started_at=time.time())
        try:
            self._run_fault(fault, result)
        except Exception as exc:  # noqa: BLE001 - recorded, with the run going on to the next fault
            result.held("the fault ran to its end", f"{type(exc).__name__}: {exc}")
        return result

    def _run_fault(self, fault: Fault, result: FaultResult) -> None:
        assert self.observer is not None
        obs = self.observer
        label, part, kafka_node = self.target(fault)
        result.target = label
        led = [p for p, leader in self.leaders(EVENTS).items() if leader == kafka_node] if kafka_node else []
        tag = f"{fault.name.replace('-', '')}{len(self.outcome.results)}"
        crash = self.add_broker(f"{tag}c", led[0] if led else None)
        quiet = self.add_broker(f"{tag}q", led[-1] if led else None)
        self.wait_listed([crash, quiet], 60)
        self.say(f"{fault.name}: {fault.what} -> {label}")
        before_master = self._masters() if fault.on is On.ROCKETMQ else {}
        node_place = label if label.startswith("node-") else None
        member = self._broker(label).addr if fault.on is On.ROCKETMQ else None
        if member is not None:
            obs.dying(member)  # the killed or frozen member may go from now on
        coming_back = functools.partial(obs.back_again, member) if member is not None else None
        with self._inflicted(fault, part, label, node_place, result, before_heal=coming_back) as began:
            obs.dying(quiet)
            runner, fleet = self.runners[quiet]
            runner.silence(fleet)
            quiet_deadline = wall_ms() + BROKER_TIMEOUT_S * 1000  # its last heartbeat was before now
            time.sleep(2)  # the schedule: the crash comes 2 s into the fault
            obs.dying(crash)
            closed = wall_ms()
            runner, fleet = self.runners[crash]
            runner.crash(fleet)
            crash_deadline = closed + BROKER_TIMEOUT_S * 1000
            self._gone(result, quiet, quiet_deadline, "silent broker", fault)
            self._gone(result, crash, crash_deadline, "crashed broker", fault, closed_ms=closed)
            if fault.name == "rocketmq-broker-freeze":
                # its last registration came at most a period before the freeze: its deadline is in between
                broker = self._broker(label)
                latest = began + ROCKETMQ_BROKER_TIMEOUT_MS
                earliest = latest - ROCKETMQ_REGISTER_PERIOD_MS
                self._gone(result, broker.addr, latest, "frozen RocketMQ broker", fault, earliest_ms=earliest)
            if fault.name == "rocketmq-master-kill":
                self._election(result, label, before_master, began)
                # killed: its connections closed at every node, so it goes long before its deadline
                self._gone(
                    result,
                    self._broker(label).addr,
                    began + ROCKETMQ_BROKER_TIMEOUT_MS,
                    "killed RocketMQ master",
                    fault,
                    closed_ms=began,
                )
            hold_s = fault.hold_s
            if fault.name == "rocketmq-broker-freeze":  # past the deadline the real broker sends
                hold_s = max(hold_s, self._broker_timeout_ms() / 1000 + 6)
            time.sleep(max(0.0, began / 1000 + hold_s - time.time()))
        # healed
        healed = time.monotonic()
        if fault.on is On.ROCKETMQ and fault.action == "kill":
            # a restarted member registers again and again while it syncs its topics from the master: the heal
            # is over once the nodes' answers stand still
            result.figures["restart -> its registration settled at the nodes"] = self._nodes_settled(60)
            healed = time.monotonic()
        took, differing = same_routes_everywhere(self._live_addrs(), self.topo.redis_url, 60)
        result.figures["heal -> same routes everywhere"] = took if took >= 0 else 60.0
        if took > CONSISTENT_S or took < 0:
            self.say(f"{fault.name}: routes differed after the heal: {differing['history'][:12]}")
        result.held(
            f"same routes at every node and in Redis within {CONSISTENT_S:.0f} s of the heal",
            ""
            if 0 <= took <= CONSISTENT_S
            else f"{took:.1f} s"
            if took >= 0
            else f"differ after 60 s: {sorted(differing['last'])[:5]}",
        )
        for name in (crash, quiet):
            self.revive(name)
        if member is not None:  # the killed or frozen member is back: it must stay from now on
            try:
                self.wait_listed([member], 180)
                obs.keep(member)
            except AssertionError as exc:
                result.held(f"{label} listed everywhere again after the heal", str(exc))
        # a restarted monitor lists them in Redis once it runs again (the nodes' fallback only removes)
        try:
            self.wait_listed([crash, quiet], 600)
        except AssertionError as exc:
            result.held("the dead brokers, started again, listed everywhere", str(exc))
        result.figures["heal -> dead brokers back everywhere"] = time.monotonic() - healed

    def _gone(
        self,
        result: FaultResult,
        name: str,
        deadline_ms: float,
        what: str,
        fault: Fault,
        closed_ms: int | None = None,
        earliest_ms: float | None = None,
    ) -> None:
        """``name`` gone from every live place within the fault's bound past ``deadline_ms`` (and, when given,
        none before ``earliest_ms``: its deadline at the earliest)."""
        assert self.observer is not None
        try:
            times = self.observer.gone(name, BROKER_TIMEOUT_S + 120)
        except AssertionError as exc:
            result.held(f"{what} gone everywhere within deadline + {fault.bound_s:.0f} s", str(exc))
            return
        if earliest_ms is not None and min(times.values()) < earliest_ms:
            result.held(
                f"{what} kept until its deadline", f"gone {(earliest_ms - min(times.values())) / 1000:.1f} s early"
            )
        late = max(times.values()) - deadline_ms
        result.figures[f"{what}: deadline -> gone everywhere"] = late / 1000
        if closed_ms is not None:
            result.figures[f"{what}: close -> gone everywhere"] = (max(times.values()) - closed_ms) / 1000
        result.held(
            f"{what} gone everywhere within deadline + {fault.bound_s:.0f} s",
            "" if late <= fault.bound_s * 1000 else f"{late / 1000:.2f} s past its deadline: {times}",
        )

    @contextlib.contextmanager
    def _inflicted(
        self,
        fault: Fault,
        part: Part,
        label: str,
        node_place: str | None,
        result: FaultResult,
        before_heal: Callable[[], None] | None = None,
    ) -> Iterator[float]:
        """The fault in force for the block (given its wall ms start), healed after it (``before_heal`` first)."""
        assert self.observer is not None
        if node_place:
            self.observer.faulty.add(node_place)
        began = wall_ms()
        if fault.action == "freeze":
            with part.frozen() as pids:
                if not pids:
                    result.held(f"{label} frozen", "it was not running")
                yield began
                if before_heal is not None:
                    before_heal()
        else:
            killed = part.kill()
            if not killed:
                result.held(f"{label} killed", "it was not running")
            _wait(lambda: not part.alive(), 30, f"{label} to die")
            yield began
            if before_heal is not None:
                before_heal()
            if part.restart is not None:
                t0 = time.monotonic()
                part.restart()
                result.figures["restart"] = time.monotonic() - t0
            elif label == "driver":
                _wait(part.alive, 120, "the supervisor to restart the driver")
        result.figures["fault held"] = (wall_ms() - began) / 1000
        if node_place:
            i = int(node_place.split("-")[1]) - 1
            addr = self.topo.layout.node_addrs[i]
            _wait(lambda: tcp_answers("127.0.0.1", int(addr.split(":")[1]), 1.0), 60, f"{node_place} to answer")
            t0 = time.monotonic()
            self.observer.faulty.discard(node_place)
            # warm: it lists every live broker again (from Redis at its start, then from their registrations)
            with contextlib.suppress(AssertionError):
                result.figures[f"{node_place} answers -> lists every live broker"] = self._all_kept_at(
                    node_place, 30
                ) or (time.monotonic() - t0)
        if fault.on is On.KAFKA:
            _wait(self.kafka_in_sync, 180, "every Kafka replica back in sync", interval=1.0)

    def _nodes_settled(self, timeout: float, still_s: float = 2.0) -> float:
        """Seconds until every live node's answers for every topic stayed the same for ``still_s``."""
        from tests.support.chaos.checks import routes_everywhere

        t0, last, since = time.monotonic(), None, time.monotonic()
        while time.monotonic() - t0 < timeout:
            with contextlib.suppress(*redis_clients.failures(), AssertionError):
                now = {t: a[1:] for t, a in routes_everywhere(self._live_addrs(), self.topo.redis_url).items()}
                if now != last:
                    last, since = now, time.monotonic()
                elif time.monotonic() - since >= still_s:
                    return since - t0
            time.sleep(0.25)
        return timeout

    def _all_kept_at(self, place: str, timeout: float) -> float:
        t0 = time.monotonic()
        assert self.observer is not None
        while time.monotonic() - t0 < timeout:
            if place in self.observer.latest and self.observer.kept() <= _listed(self.observer.latest[place]):
                return time.monotonic() - t0
            time.sleep(0.05)
        raise AssertionError(place)

    def revive(self, name: str) -> None:
        """Start a dead simulated broker again, on its address: it registers anew, and its incidents end."""
        assert self.observer is not None
        old, fleet = self.runners.pop(name)
        with contextlib.suppress(Exception):
            old.stop()
        self.observer.back_again(name)
        self.add_broker(fleet, addr=self.addrs[name])

    def _live_addrs(self) -> list[str]:
        assert self.observer is not None
        return [a for p, a in self.observer.places.items() if p not in self.observer.faulty]

    # -- RocketMQ

    def _broker(self, label: str):  # noqa: ANN202 - infra.rocketmq.JavaBroker
        group, j = label.rsplit("-", 1)
        return next(g for g in self.topo.groups if g.name == group).brokers[int(j)]

    def _group_of(self, label: str) -> str:
        return label.rsplit("-", 1)[0]

    def _broker_timeout_ms(self) -> float:
        """A controller-mode broker sends no timeout of its own: the nodes apply RocketMQ's default."""
        return float(ROCKETMQ_BROKER_TIMEOUT_MS)

    def _masters(self) -> dict[str, str | None]:
        return {g.name: _listed_master(self, g.name) for g in self.topo.groups}

    def _election(self, result: FaultResult, label: str, before: dict[str, str | None], killed_ms: int) -> None:
        """The controller elects a slave (its epoch moves on), which registers as id 0 at the nodes; the
        clients route to it soon after the election."""
        from infra import rocketmq

        group = self._group_of(label)
        old = before[group]
        assert self.topo.controller is not None

        def elected() -> rocketmq.ReplicaInfo | None:
            with contextlib.suppress(OSError, AssertionError):
                info = rocketmq.replica_info(self.topo.controller, group)  # type: ignore[arg-type]
                if info is not None and info.master_addr not in (None, old):
                    return info
            return None

        try:
            info = _wait(elected, 120, f"the controller to elect a new master of {group}", interval=0.05)
            elected_ms = wall_ms()
            new = info.master_addr
            result.figures["kill -> controller's election"] = (elected_ms - killed_ms) / 1000
            _wait(lambda: _listed_master(self, group) == new, 60, f"{new} listed as {group}'s master")
        except AssertionError as exc:
            result.held("the controller's new master at every node", str(exc))
            return
        result.figures["election -> new master listed at the nodes"] = (wall_ms() - elected_ms) / 1000
        if self.flow is None:
            return
        try:
            _wait(
                lambda: any(t >= elected_ms - 60_000 and r.get(group) == new for t, r in self.flow.routes()),
                30,
                "the clients' route to the new master",
            )
            routed = min(t for t, r in self.flow.routes() if r.get(group) == new)
            late = max(0, routed - elected_ms) / 1000
            result.figures["election -> clients route to the new master"] = late
            result.held(
                f"clients route to the new master within {ROUTE_AFTER_ELECTION_S:.0f} s",
                "" if late <= ROUTE_AFTER_ELECTION_S else f"{late:.1f} s",
            )
        except AssertionError as exc:
            result.held(f"clients route to the new master within {ROUTE_AFTER_ELECTION_S:.0f} s", str(exc))

    # -- the end

    def finish(self) -> Outcome:
        assert self.observer is not None
        out, obs = self.outcome, self.observer
        out.invariants["no live broker ever missing at a live node or in Redis (wrong removals)"] = (
            "" if not obs.missing else f"{len(obs.missing)} looks, first {obs.missing[:5]}"
        )
        out.invariants["no broker back in Redis after it left"] = "" if not obs.back else f"{obs.back[:5]}"
        if self.flow is not None:
            acked = self.flow.acked()
            try:
                _wait(lambda: acked <= self.flow.received(), 120, "every acknowledged message consumed", interval=1.0)
                lost = set()
            except AssertionError:
                lost = acked - self.flow.received()
            out.figures["messages acknowledged"] = len(acked)
            out.invariants["every acknowledged message consumed"] = (
                "" if not lost else f"{len(lost)} of {len(acked)} never consumed"
            )
        # every incident opened once and resolved once (each dead broker came back; give the pager time)
        try:
            _wait(
                lambda: not self.pager.episodes().still_firing(),
                180,
                "every alert resolved at Alertmanager",
                interval=1.0,
            )
        except AssertionError:
            pass
        episodes = self.pager.episodes()
        out.figures["incidents notified"] = episodes.incidents()
        broken = episodes.broken() + [f"still firing: {a}" for a in episodes.still_firing()]
        out.invariants["every incident alerted once and resolved once at Alertmanager"] = "; ".join(broken[:5])
        down = [name for name, part in self.topo.parts().items() if not part.alive()]
        out.invariants["every process of the topology up at the end"] = ", ".join(down)
        ours = [*self.run_dir.glob("node-*-run*/*.log"), *self.run_dir.glob("streaming-run*/*.log")]
        found = tracebacks(ours)
        out.invariants["no traceback in our logs"] = ", ".join(f"{k} ({v})" for k, v in found.items())
        return out


def _wait(check, timeout: float, what: str, interval: float = 0.1):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def _listed(known: dict[str, dict[int, str]]) -> set[str]:
    """The brokers one place lists, by group name and by address."""
    return set(known) | {a for members in known.values() for a in members.values()}


def _listed_master(chaos: Chaos, group: str) -> str | None:
    assert chaos.observer is not None
    for place, known in chaos.observer.latest.items():
        if place != "redis" and place not in chaos.observer.faulty and group in known:
            return known[group].get(0)
    return None


def _listed_id(chaos: Chaos, group: str, addr: str) -> int | None:
    assert chaos.observer is not None
    for place, known in chaos.observer.latest.items():
        if place != "redis" and group in known:
            return next((i for i, a in known[group].items() if a == addr), None)
    return None


def machine() -> str:
    load = os.getloadavg()
    return f"{os.cpu_count()} cores, load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}"
