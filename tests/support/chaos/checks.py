"""What the chaos harness holds the system to, read only where users read: the nodes' answers, Redis,
Alertmanager's notifications, the RocketMQ clients' own results, and our processes' logs.

:class:`Observer` asks every live node for its cluster info and Redis for the job's cluster entry every
100 ms, in one thread, and keeps (a) each time a broker that must stay was missing somewhere (a wrong
removal), (b) each time a broker that left Redis was back in it, and (c) for each broker it was told is
dying, the first wall time each place stopped listing it. A place the harness marks faulty (a killed or
frozen node) is not asked: it cannot answer, and a frozen one would hold the round for its timeout.
:class:`Pager` is Debian's Prometheus Alertmanager with every alert its own group, notifying a webhook
receiver of the harness, so each incident's notifications can be counted. :func:`same_routes_everywhere`
waits until every live node answers every topic with the bytes Redis holds; :func:`tracebacks` finds the
tracebacks in our logs.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from common import redis_clients
from common.contract import wall_ms
from namesrv.client import NameServerClient
from tests.support.alertmanager import Alertmanager
from tests.support.liveness import known_in_redis, quick_lookup
from tests.support.routes import route_or_none
from tests.support.webhook import Webhook

__all__ = ["Observer", "Pager", "same_routes_everywhere", "tracebacks"]

REDIS = "redis"


class Observer:
    """See the module docstring. ``node_addrs`` in order name the places ``node-1``, ``node-2`` ...; a broker
    is named by its group's name or by its address."""

    def __init__(self, node_addrs: Sequence[str], redis_url: str, interval: float = 0.1) -> None:
        self.places = {f"node-{i + 1}": addr for i, addr in enumerate(node_addrs)}
        self.lookup = quick_lookup(redis_url)
        self.interval = interval
        #: places not asked now (killed or frozen by the harness)
        self.faulty: set[str] = set()
        self._keep: set[str] = set()
        self._left: set[str] = set()
        self._dying: dict[str, dict[str, int]] = {}
        #: (wall ms, broker, place): a broker that must stay was missing there
        self.missing: list[tuple[int, str, str]] = []
        #: (wall ms, broker): a broker that left Redis was back in it
        self.back: list[tuple[int, str]] = []
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
                        if place != REDIS:
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


# --------------------------------------------------------------------------- routes


def routes_everywhere(node_addrs: Iterable[str], redis_url: str) -> dict[str, list[bytes | None]]:
    """Every topic Redis or a node knows -> [Redis's bytes, then each node's answer]."""
    addrs = list(node_addrs)
    lookup = quick_lookup(redis_url)
    try:
        topics = set(lookup.topics())
        for addr in addrs:
            with NameServerClient(addr, timeout=3.0) as client:
                topics |= set(client.topic_list())
        return {t: [lookup.get_raw(t), *(route_or_none(a, t) for a in addrs)] for t in sorted(topics)}
    finally:
        lookup.close()


def same_routes_everywhere(node_addrs: Iterable[str], redis_url: str, timeout: float) -> tuple[float, dict]:
    """Wait until every node in ``node_addrs`` answers every topic with Redis's bytes: (seconds it took, or
    -1 when ``timeout`` passed first; the topics that differed last)."""
    addrs, t0 = list(node_addrs), time.monotonic()
    differing: dict[str, list[bytes | None]] = {}
    #: (seconds since t0, the topics that differed then), for each change of that set
    history: list[tuple[float, list[str]]] = []
    while time.monotonic() - t0 <= timeout:
        try:
            seen = routes_everywhere(addrs, redis_url)
        except (*redis_clients.failures(), AssertionError):
            time.sleep(0.1)
            continue
        differing = {t: a for t, a in seen.items() if len(set(a)) > 1}
        if not history or history[-1][1] != sorted(differing):
            history.append((round(time.monotonic() - t0, 2), sorted(differing)))
        if not differing:
            return time.monotonic() - t0, {"history": history}
        time.sleep(0.1)
    return -1.0, {"history": history, "last": differing}


# --------------------------------------------------------------------------- Alertmanager


PAGER_CONFIG = """\
route:
  receiver: harness
  group_by: ['...']
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 24h
receivers:
  - name: harness
    webhook_configs:
      - url: {url}
        send_resolved: true
"""


@dataclass
class Episodes:
    """Per alert (its labels), the notifications Alertmanager sent, in order."""

    sent: dict[tuple[tuple[str, str], ...], list[str]] = field(default_factory=dict)

    def broken(self) -> list[str]:
        """Alerts whose incidents were not each notified once firing, then once resolved. Incidents of a kind
        that names nothing (MONITOR_DOWN, MONITOR_LAGGING) share their labels, so one alert's notifications
        are firing, resolved, firing, resolved ...: anything else is an incident notified twice."""
        out = []
        for labels, states in self.sent.items():
            if any(state != ("firing", "resolved")[i % 2] for i, state in enumerate(states)):
                out.append(f"{dict(labels).get('alertname', '?')} {dict(labels)}: {states}")
        return out

    def incidents(self) -> int:
        return sum(states.count("firing") for states in self.sent.values())

    def still_firing(self) -> list[str]:
        return [f"{dict(labels)}" for labels, states in self.sent.items() if states[-1:] == ["firing"]]


class Pager:
    """Alertmanager notifying the harness's webhook of every alert on its own (see the module docstring)."""

    def __init__(self, tmp: Path) -> None:
        self.hook = Webhook()
        tmp.mkdir(parents=True, exist_ok=True)
        self.alertmanager = Alertmanager(tmp, config=PAGER_CONFIG.format(url=self.hook.url))

    @property
    def url(self) -> str:
        return self.alertmanager.url

    def start(self) -> Pager:
        self.alertmanager.start()
        return self

    def episodes(self) -> Episodes:
        out = Episodes()
        for body in self.hook.bodies():
            for alert in body.get("alerts", []):
                labels = tuple(sorted(alert.get("labels", {}).items()))
                out.sent.setdefault(labels, []).append(str(alert.get("status")))
        return out

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.alertmanager.stop()
        self.hook.close()


# --------------------------------------------------------------------------- logs


_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")


def tracebacks(logs: Iterable[Path]) -> dict[str, int]:
    """Log file -> how many tracebacks it holds, for the files that hold any."""
    found = {}
    for path in logs:
        with contextlib.suppress(OSError):
            n = len(_TRACEBACK.findall(path.read_text(errors="replace")))
            if n:
                found[str(path)] = n
    return found


def known_now(redis_url: str) -> set[str]:
    """The brokers the job's cluster entry in Redis lists now."""
    lookup = quick_lookup(redis_url)
    try:
        return known_in_redis(lookup)
    finally:
        lookup.close()
