"""Simulated brokers for the end-to-end suite: named fleets (:class:`namesrv.simulate.Fleet`) ticked in one thread."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from namesrv.simulate import Fleet, FleetConfig, State
from tests.support.system import Timing


class FleetRunner:
    """Ticks named fleets in one thread; a silenced fleet keeps its connections and sends nothing."""

    def __init__(self) -> None:
        self.fleets: dict[str, Fleet] = {}
        self.events: list[tuple[float, str, str, dict[str, Any]]] = []
        self._silent: set[str] = set()
        self._held: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-runner", daemon=True)
        self._thread.start()

    def add(self, name: str, namesrv: list[str], timing: Timing, **config: Any) -> Fleet:
        """A one-group fleet named ``name`` (broker ``<name>-0``) that registers on the next tick."""
        settings: dict[str, Any] = dict(
            namesrv=tuple(namesrv), brokers=1, broker_prefix=f"{name}-", topic_prefix=f"T{name.upper()}",
            heartbeat_interval=timing.broker_heartbeat_s, heartbeat_timeout_ms=timing.broker_timeout_ms,
            timeout=2.0, backoff_initial=0.3, backoff_max=1.0, summary_interval=3600.0,
        )  # fmt: skip
        settings.update(config)
        cfg = FleetConfig(**settings)
        fleet = Fleet(
            cfg,
            on_event=lambda kind, fields, n=name: self.events.append((time.monotonic(), n, kind, fields)),
            rng=random.Random(len(self.fleets)),
        )
        with self._lock:
            self.fleets[name] = fleet
        return fleet

    def broker(self, name: str) -> tuple[str, str]:
        """(brokerName, brokerAddr) of the fleet's master."""
        m = self.fleets[name].members[0]
        return m.name, m.addr

    def silence(self, name: str) -> float:
        """From now on the fleet sends nothing; returns the time of its last heartbeat round (monotonic)."""
        with self._lock:
            self._silent.add(name)
            self.fleets[name].on_event("silenced", {})
            return time.monotonic()

    def unregister(self, name: str) -> None:
        """UNREGISTER_BROKER at every node, then close (a broker's clean shutdown)."""
        with self._lock:
            self._silent.add(name)
            self.fleets[name].shutdown(unregister=True)

    def crash(self, name: str) -> None:
        """Close every connection of the fleet without a word, as a SIGKILLed broker's kernel does."""
        with self._lock:
            self._silent.add(name)
            self.fleets[name].shutdown(unregister=False)

    def drop_link(self, name: str, namesrv: str) -> None:
        """Close the fleet's connection to ``namesrv`` only (hold it first, or it reconnects)."""
        with self._lock:
            for m in self.fleets[name].members:
                m.links[namesrv].conn.close()

    def hold(self, namesrv: str) -> None:
        """No fleet reconnects to ``namesrv`` until :meth:`release` (links that are up stay up)."""
        with self._lock:
            self._held.add(namesrv)

    def release(self, namesrv: str) -> None:
        with self._lock:
            self._held.discard(namesrv)

    def links_up(self, namesrv: str) -> int:
        """How many brokers of the ticking fleets are registered at ``namesrv`` now."""
        with self._lock:
            return sum(
                m.links[namesrv].up
                for name, f in self.fleets.items()
                if name not in self._silent
                for m in f.members
                if m.state is State.LIVE
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                now = time.monotonic()
                due = now + 0.5
                for name, fleet in self.fleets.items():
                    if name in self._silent:
                        continue
                    for m in fleet.members:
                        for ns in self._held:
                            link = m.links.get(ns)
                            if link is not None and not link.up:
                                link.retry_at = max(link.retry_at, now + 0.2)
                    fleet.tick(now)
                    due = min(due, fleet.next_due())
            self._stop.wait(max(0.02, min(due - time.monotonic(), 0.25)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for fleet in self.fleets.values():
            fleet.close()
