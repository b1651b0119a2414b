"""Who decides expiry for this node: the streaming monitor while it keeps up, the node itself otherwise.

Two questions, both answered from what the monitor last said:

* **Which scan runs.** Every action the node accepts from the monitor (MONITOR_HEARTBEAT included)
  proves it alive: :meth:`MonitorWatchdog.heard` then hands expiry to the monitor, and
  :meth:`MonitorWatchdog.check` takes it back, with a warning, once the monitor has been silent for
  ``monitorSilenceFallbackMillis``. Until the monitor is first heard the scan stays on, as in Apache
  RocketMQ: a node without a monitor behaves exactly like Apache's.
* **Whether the monitor got there in time.** A MONITOR_HEARTBEAT says how far the monitor has decided
  (``decidedThrough``, an event time). A broker more than ``monitorDecisionGraceMillis`` past its
  deadline here, whose deadline that word, heard within the same grace, does not reach, is one the
  monitor is not deciding in time (stalled, slow behind a backlog, killed, restarting): the node
  expires it itself (:meth:`MonitorWatchdog.expire_undecided`), whatever the scan's state. A broker
  whose deadline the monitor has passed and kept is one another node still hears: it stays.

A node that itself stood still (SIGSTOP, a host frozen or starved of CPU) heard nothing meanwhile. The
first look after a gap longer than the grace moves the monitor's clocks on by the gap (the silence was
the node's: no scan taken back, no MONITOR_DOWN), and for one grace, while the node reads what queued
up, it decides nothing; connections closed meanwhile are not departures (:meth:`~MonitorWatchdog.catching_up`);
and what it reads counts as heard when it stopped, the earliest it can have been sent
(:meth:`~MonitorWatchdog.heard_at_ms`): a broker that died meanwhile keeps the deadline the other nodes
gave it, and its queued heartbeats neither fence the monitor's removal nor bring it back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor

from common.contract import wall_ms
from namesrv.liveness.expiry import ExpiryScan

log = logging.getLogger("namesrv.liveness")

#: how often the watchdog looks (at most): at the scan's hand-over, and at brokers the monitor has not decided
PERIOD_S = 0.25


class MonitorWatchdog:
    """Keeps the local expiry scan off while the monitor is heard, and decides what the monitor does not in time."""

    def __init__(
        self,
        expiry: ExpiryScan,
        silence_ms: int,
        now: Callable[[], float] = time.monotonic,
        *,
        grace_ms: int = 1500,
        wall_clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.expiry = expiry
        self.silence_ms = silence_ms
        self.grace_ms = grace_ms
        self.now = now
        self.wall_clock_ms = wall_clock_ms
        self.last_heard: float | None = None
        self.monitor: str | None = None
        #: the last heartbeat's ``decidedThrough`` (event time) and when it was heard (``now``)
        self._decided: tuple[int, float] | None = None
        #: when this watchdog last read its clock, and until when it decides nothing after the node stood still
        self._observed: float | None = None
        self._settling_until = 0.0
        #: when the node last began to stand still (wall ms), once a reading found it
        self._stood_since_ms: int | None = None
        self._clock_lock = threading.Lock()

    def _now(self) -> float:
        """``now()``, after making up for a gap since the last reading in which the node itself stood still.

        Readings count once :meth:`run` has started reading every PERIOD_S: only then is a long gap between
        two of them the node standing still (whoever reads first after it, the pager say, makes up for it)."""
        with self._clock_lock:  # the metrics read silence_s() from their own thread: one of them makes up for a gap
            return self._caught_up_now()

    def _caught_up_now(self) -> float:
        now = self.now()
        last = self._observed
        if last is None:
            return now
        self._observed = now
        if (now - last) * 1000 > self.grace_ms + PERIOD_S * 1000:
            stood = now - last
            if self.last_heard is not None:
                self.last_heard += stood
            if self._decided is not None:
                self._decided = (self._decided[0], self._decided[1] + stood)
            self._settling_until = now + self.grace_ms / 1000
            self._stood_since_ms = self.wall_clock_ms() - round(stood * 1000)
            log.warning(
                "this node stood still for %.1f s (frozen or starved of CPU): deciding no expiry for %d ms "
                "while it reads what queued up",
                stood,
                self.grace_ms,
            )
        return now

    @property
    def monitor_alive(self) -> bool:
        now = self._now()
        return self.last_heard is not None and (now - self.last_heard) * 1000 < self.silence_ms

    def silence_s(self) -> float | None:
        """Seconds since the monitor was last heard; None if it never was (read by the metrics)."""
        now = self._now()
        last = self.last_heard
        return None if last is None else max(0.0, now - last)

    def heard(self, monitor: str, decided_through: int | None = None) -> None:
        handing_back = self.last_heard is not None  # the scan is on because the monitor fell silent
        self.last_heard = self._now()
        self.monitor = monitor
        if decided_through is not None:
            self._decided = (decided_through, self.last_heard)
        if self.expiry.hand_to_monitor():
            # a hand-back pairs with the warning that switched the scan on, so it is one too
            log.log(
                logging.WARNING if handing_back else logging.INFO,
                "liveness monitor %r is alive: local expiry scan off, the monitor decides",
                monitor,
            )

    def decided_through(self) -> int | None:
        """The event time the monitor has decided through, while its word is fresh (heard within the
        grace); None when it is not: the monitor stalled, died, or never said."""
        now = self._now()
        decided = self._decided
        if decided is None or (now - decided[1]) * 1000 > self.grace_ms:
            return None
        return decided[0]

    def covers(self, at_ms: int) -> bool:
        """True if the monitor has decided on what happened by ``at_ms`` (wall ms), and said so lately."""
        through = self.decided_through()
        return through is not None and through >= at_ms

    def check(self) -> None:
        if self.expiry.enabled or self.last_heard is None or self.monitor_alive:
            return
        self.expiry.take_back()
        log.warning(
            "liveness monitor %r silent for %d ms (monitorSilenceFallbackMillis): local expiry scan back on",
            self.monitor,
            self.silence_ms,
        )

    def catching_up(self) -> bool:
        """True for one grace after the node itself stood still (this reading may be the one that finds it):
        what it reads then queued up meanwhile, and a broker's connection that ended then may have ended
        because this node did not answer it, not because the broker went away."""
        return self._now() < self._settling_until

    def heard_at_ms(self) -> int | None:
        """When what the node reads now was heard, if not now: while it catches up after standing still,
        the moment it stopped (wall ms), since what queued up for it was sent then or later; else None."""
        return self._stood_since_ms if self.catching_up() else None

    async def expire_undecided(self, worker: Executor) -> None:
        """Expire the brokers past their deadline by the grace that the monitor has not decided."""
        if self.catching_up():
            return
        await self.expiry.expire_undecided(worker, self.grace_ms, self.decided_through(), self.wall_clock_ms())

    async def run(self, worker: Executor) -> None:
        period = max(0.05, min(PERIOD_S, self.silence_ms / 4000))
        self._observed = self.now()
        while True:
            await asyncio.sleep(period)
            self.check()
            await self.expire_undecided(worker)
