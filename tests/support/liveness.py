"""How soon the running system forgets a broker, measured from outside, and the bounds that holds to.

:func:`gone_times` asks every node for its cluster info over TCP, as a client would, and reads the
job's cluster entry in Redis, every 25 ms, and stamps the first answer that no longer lists each
broker with the wall clock the nodes stamp their events with. The figures therefore compare with
event times read from the events topic (:func:`last_heard_ms`: a broker's last proof of life as the
system saw it). :func:`bounds_now` holds the figures to their targets while the machine is quiet
enough to meet them and to ``LOADED_FACTOR`` times them past that. :class:`Gone` runs
:func:`gone_times` in a thread, so a test can measure across a fault it is still causing, and
:class:`Observer` polls the same places throughout a test for what must never happen (a live broker
missing, a broker that left Redis back in it) and for when each dying broker left each place. A :class:`Stack` is a running system with simulated
brokers to add to it, and :func:`running` starts and stops one.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
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


#: the place name of the job's Redis entry, beside node-1, node-2 ...
REDIS = "redis"


class Observer:
    """Every ``interval`` s, in one thread, every node not marked faulty (its cluster info over TCP, as a client
    reads it) and Redis (the job's cluster entry): each time a broker that must stay was missing somewhere
    (a wrong removal), each time a broker that left Redis was back in it, each look Redis did not answer,
    and for each broker said to be dying, the first wall ms each place stopped listing it. A place marked
    faulty (a killed or frozen node) is not asked: it cannot answer, and a frozen one would hold the round
    for its timeout. ``node_addrs`` in order name the places ``node-1``, ``node-2`` ...; a broker is named
    by its group's name or by its address."""

    def __init__(
        self, node_addrs: Sequence[str], redis_url: str, keep: Iterable[str] = (), interval: float = 0.1
    ) -> None:
        self.places = {f"node-{i + 1}": addr for i, addr in enumerate(node_addrs)}
        self.lookup = quick_lookup(redis_url)
        self.interval = interval
        #: places not asked now (killed or frozen by the harness)
        self.faulty: set[str] = set()
        self._keep: set[str] = set(keep)
        self._left: set[str] = set()
        self._dying: dict[str, dict[str, int]] = {}
        #: (wall ms, broker, place): a broker that must stay was missing there
        self.missing: list[tuple[int, str, str]] = []
        #: (wall ms, broker): a broker that left Redis was back in it
        self.back: list[tuple[int, str]] = []
        #: wall ms of each look Redis did not answer
        self.unanswered: list[int] = []
        #: the last answer of each place: broker name -> {id: addr}
        self.latest: dict[str, dict[str, dict[int, str]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-observer", daemon=True)
        self._thread.start()

    # -- what the harness says

    def keep(self, *names: str) -> None:
        """From now on these brokers must be listed at every live node and in Redis."""
        with self._lock:
            self._keep.update(names)

    def kept(self) -> set[str]:
        """The brokers that must be listed everywhere now."""
        with self._lock:
            return set(self._keep)

    def release(self, *names: str) -> None:
        """These brokers may go from now on (they are about to die)."""
        with self._lock:
            self._keep.difference_update(names)

    def dying(self, name: str) -> None:
        """Measure from now on when each live place stops listing ``name``."""
        with self._lock:
            self._keep.discard(name)
            self._dying[name] = {}

    def back_again(self, name: str) -> None:
        """``name`` is starting again: it may be back in Redis."""
        with self._lock:
            self._left.discard(name)
            self._dying.pop(name, None)

    def left_redis(self, name: str) -> None:
        """From now on ``name`` must never be in Redis again."""
        with self._lock:
            self._left.add(name)

    def gone(self, name: str, timeout: float) -> dict[str, int]:
        """Wait until every place not faulty has stopped listing ``name``; per place, the wall ms it did."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                times = dict(self._dying[name])
                expected = {p for p in (*self.places, REDIS) if p not in self.faulty}
            if expected <= set(times):
                with self._lock:
                    self._left.add(name)
                return {p: at for p, at in times.items() if p in expected}
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} still listed after {timeout:.0f} s at {sorted(expected - set(times))}")
            time.sleep(0.05)

    # -- the poller

    def _known(self, clients: dict[str, NameServerClient], place: str) -> dict[str, dict[int, str]]:
        if place == REDIS:
            info = self.lookup.cluster_info()
            return {} if info is None else {n: dict(b.broker_addrs) for n, b in info[0].items() if b.broker_addrs}
        return {n: dict(b.broker_addrs) for n, b in clients[place].cluster_info()[0].items() if b.broker_addrs}

    def _run(self) -> None:
        failures = redis_clients.failures()
        clients = {p: NameServerClient(a, timeout=1.0) for p, a in self.places.items()}
        try:
            while not self._stop.wait(self.interval):
                for place in (*self.places, REDIS):
                    if place in self.faulty:
                        continue
                    try:
                        known = self._known(clients, place)
                    except failures:  # OSError included: a node starting again, Redis failing over
                        if place == REDIS:
                            self.unanswered.append(wall_ms())
                        else:
                            clients[place].close()
                        continue
                    now = wall_ms()
                    with self._lock:
                        if place in self.faulty:  # marked while it was asked
                            continue
                        self.latest[place] = known
                        # brokers by name (a group) and by address (one member)
                        listed = set(known) | {a for members in known.values() for a in members.values()}
                        self.missing += [(now, n, place) for n in sorted(self._keep - listed)]
                        if place == REDIS:
                            self.back += [(now, n) for n in sorted(self._left & listed)]
                        for name, times in self._dying.items():
                            if name not in listed:
                                times.setdefault(place, now)
        finally:
            for client in clients.values():
                client.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.lookup.close()

    def __enter__(self) -> Observer:
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
