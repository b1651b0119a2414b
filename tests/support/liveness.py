"""How soon the running system forgets a broker, measured from outside, and the bounds that holds to.

:func:`gone_times` asks every node for its cluster info over TCP, as a client would, and reads the
job's cluster entry in Redis, every 25 ms, and stamps the first answer that no longer lists each
broker with the wall clock the nodes stamp their events with. The figures therefore compare with
event times read from the events topic (:func:`last_heard_ms`: a broker's last proof of life as the
system saw it). :func:`bounds_now` holds the figures to their targets while the machine is quiet
enough to meet them and to ``LOADED_FACTOR`` times them past that.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from namesrv.client import NameServerClient
from namesrv.events.schema import Event, wall_ms
from streaming.routes import RouteLookup
from tests.support.wait import wait_until

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
