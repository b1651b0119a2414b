"""How soon the running system forgets a broker, measured from outside, and the bounds that holds to.

:func:`gone_times` asks every node for its cluster info over TCP, as a client would, and reads the
job's cluster entry in Redis, every 25 ms, and stamps the first answer that no longer lists each
broker with the wall clock the nodes stamp their events with. The figures therefore compare with
event times read from the events topic (:func:`last_heard_ms`: a broker's last proof of life as the
system saw it). :func:`bounds_now` holds the figures to their targets while the machine is quiet
enough to meet them and to ``LOADED_FACTOR`` times them past that. :class:`Gone` runs
:func:`gone_times` in a thread, so a test can measure across a fault it is still causing, and
:class:`Watch` polls the same places throughout a test for what must never happen: a live broker
missing, or a broker that left Redis back in it. A :class:`Stack` is a running system with simulated
brokers to add to it, and :func:`running` starts and stops one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from common import redis_clients
from common.contract import Event, wall_ms
from namesrv.client import NameServerClient
from streaming.routes import RouteLookup
from tests.support.fleet import FleetRunner
from tests.support.routes import brokers_at
from tests.support.wait import wait_until

if TYPE_CHECKING:
    from tests.support.system import System

#: The targets hold while the machine runs at most this many runnable tasks per core (1-minute load
#: average; the stack itself, Spark's batches among them, keeps it near 1 per core). Past it every
#: micro-batch slows with the machine, and an expiry with it (docs/internals/testing.md, "Timing"), and
#: the figures are held to LOADED_FACTOR times the targets instead, which still catches a decision a
#: batch or a scan interval late.
QUIET_LOAD_PER_CORE, LOADED_FACTOR = 2.0, 3.0


def bounds_now(*targets_s: float) -> tuple[float, ...]:
    """The targets (ms) on a machine quiet enough to meet them, else LOADED_FACTOR times them; says which."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    factor = 1.0 if load <= QUIET_LOAD_PER_CORE * cores else LOADED_FACTOR
    print(f"\n1-minute load {load:.1f} on {cores} cores: bounds at {factor:g}x the targets")
    return tuple(t * 1000 * factor for t in targets_s)


def known_in_redis(lookup: RouteLookup) -> set[str]:
    """The broker names with an address in the cluster entry the job wrote to Redis."""
    info = lookup.cluster_info()
    return {n for n, b in info[0].items() if b.broker_addrs} if info is not None else set()


def gone_times(
    node_addrs: Sequence[str],
    lookup: RouteLookup,
    brokers: Iterable[str],
    timeout: float,
    unanswered: tuple[type[BaseException], ...] = (),
) -> dict[str, dict[str, int]]:
    """Per broker name, the wall time (ms) each place (``node-1``.., ``redis``) first stopped knowing it.

    One round asks each node once (on a connection kept open) and Redis once, every 25 ms, and
    stamps each answer when it arrives, so the figures are not the polling's own cost. A place whose
    question raises one of ``unanswered`` (Redis failing over, say) is asked again next round: not
    answering is not forgetting.
    """
    gone: dict[str, dict[str, int]] = {name: {} for name in brokers}
    clients = {f"node-{i + 1}": NameServerClient(addr, timeout=3.0) for i, addr in enumerate(node_addrs)}

    def known_at(place: str) -> set[str]:
        if place == "redis":
            return known_in_redis(lookup)
        return {n for n, b in clients[place].cluster_info()[0].items() if b.broker_addrs}

    def all_gone() -> bool:
        for place in (*clients, "redis"):
            try:
                known = known_at(place)
            except unanswered:
                continue
            now = wall_ms()
            for name in gone:
                if name not in known:
                    gone[name].setdefault(place, now)
        return all(len(g) == len(clients) + 1 for g in gone.values())

    try:
        wait_until(
            all_gone, timeout, f"{sorted(gone)} gone at every node and in Redis", interval=0.025, state=lambda: gone
        )
    finally:
        for client in clients.values():
            client.close()
    return gone


def last_heard_ms(events: Iterable[Event], broker_addr: str) -> int:
    """The newest event time any node stamped on a registration or heartbeat of ``broker_addr``."""
    times = [e.event_time for e in events if e.broker_addr == broker_addr and str(e.type) in ("REGISTER", "HEARTBEAT")]
    assert times, f"no event of {broker_addr} on the events topic"
    return max(times)


def quick_lookup(redis_url: str, prefix: str = "namesrv") -> RouteLookup:
    """A reader that answers or fails within a second (no retries): measuring, not waiting out a failover."""
    return RouteLookup(redis_url, prefix, client=redis_clients.connect(redis_url, timeout_s=1.0, retries=False))


class Gone:
    """:func:`gone_times` of one broker, measured in a thread from now on while the test goes on (Redis may
    not answer meanwhile: asked again)."""

    def __init__(self, node_addrs: Sequence[str], redis_url: str, broker: tuple[str, str], timeout: float) -> None:
        """``broker``: its name and address."""
        name = broker[0]
        self.name, self.addr = broker
        self._times: dict[str, int] = {}
        self._error: BaseException | None = None
        lookup = quick_lookup(redis_url)

        def measure() -> None:
            try:
                self._times = gone_times(node_addrs, lookup, [name], timeout, unanswered=redis_clients.failures())[name]
            except BaseException as exc:  # noqa: BLE001 - handed to the test in times()
                self._error = exc
            finally:
                lookup.close()

        self._thread = threading.Thread(target=measure, name=f"gone-{name}", daemon=True)
        self._thread.start()

    def times(self) -> dict[str, int]:
        """Per place, the wall time (ms) it first stopped knowing the broker; waits for every place."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._times


class Watch:
    """Every 100 ms, every node and Redis: when a broker in ``keep`` is missing, when one that left Redis is
    back in it, and when Redis did not answer."""

    def __init__(self, node_addrs: Sequence[str], redis_url: str, keep: Iterable[str]) -> None:
        self.node_addrs, self.keep = list(node_addrs), set(keep)
        self.lookup = quick_lookup(redis_url)
        #: (wall ms, broker, place) of each time a kept broker was missing
        self.missing: list[tuple[int, str, str]] = []
        #: (wall ms, broker) of each time a broker that left Redis was back in it
        self.back: list[tuple[int, str]] = []
        #: wall ms of each look Redis did not answer
        self.unanswered: list[int] = []
        self._left: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)
        self._thread.start()

    def left_redis(self, name: str) -> None:
        """From now on ``name`` must never be in Redis again."""
        self._left.add(name)

    def _run(self) -> None:
        failures = redis_clients.failures()
        clients = {f"node-{i + 1}": NameServerClient(a, timeout=2.0) for i, a in enumerate(self.node_addrs)}
        try:
            while not self._stop.wait(0.1):
                for place, client in clients.items():
                    with contextlib.suppress(OSError):
                        known = {n for n, b in client.cluster_info()[0].items() if b.broker_addrs}
                        self.missing += [(wall_ms(), n, place) for n in self.keep - known]
                try:
                    in_redis = known_in_redis(self.lookup)
                except failures:
                    self.unanswered.append(wall_ms())
                    continue
                self.missing += [(wall_ms(), n, "redis") for n in self.keep - in_redis]
                self.back += [(wall_ms(), n) for n in self._left & in_redis]
        finally:
            for client in clients.values():
                client.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.lookup.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self) -> None:
        assert self.missing == [], f"live brokers missing: {self.missing[:10]}"
        assert self.back == [], f"brokers back in Redis after they left it: {self.back[:10]}"


class Stack:
    """The system, simulated brokers, and where each broker is known."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.fleets = FleetRunner()
        self.lookup = RouteLookup(system.redis_url)
        self._addr_base = 42000

    def add(self, name: str) -> tuple[str, str]:
        """Broker ``<name>-0`` registered at both nodes and in Redis; returns (brokerName, brokerAddr)."""
        self._addr_base += 10
        self.fleets.add(name, self.system.node_addrs, self.system.timing, addr_base=f"127.0.0.1:{self._addr_base}")
        broker_name, addr = self.fleets.broker(name)
        wait_until(
            lambda: self.places(broker_name) == {"node-1": True, "node-2": True, "redis": True},
            90,
            f"{broker_name} at both nodes and in Redis",
        )
        return broker_name, addr

    def places(self, broker_name: str) -> dict[str, bool]:
        out = {}
        for i, addr in enumerate(self.system.node_addrs):
            try:
                out[f"node-{i + 1}"] = broker_name in brokers_at(addr)
            except OSError:
                out[f"node-{i + 1}"] = False
        out["redis"] = broker_name in known_in_redis(self.lookup)
        return out

    def close(self) -> None:
        self.fleets.stop()
        self.lookup.close()


@contextlib.contextmanager
def running(system: System, stack: Callable[[System], Stack] = Stack) -> Iterator[Stack]:
    """``system`` started, with simulated brokers to add (``stack``: a subclass of :class:`Stack` made of
    it); everything stopped afterwards."""
    system.start()
    try:
        s = stack(system)
        try:
            yield s
        finally:
            s.close()
    finally:
        system.stop()
