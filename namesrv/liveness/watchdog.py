"""Who decides expiry for this node: the streaming monitor while it is heard, the node's own scan otherwise.

Every action the node accepts from the monitor (MONITOR_HEARTBEAT included) proves it alive:
:meth:`MonitorWatchdog.heard` then hands expiry to the monitor, and :meth:`MonitorWatchdog.check`
takes it back, with a warning, once the monitor has been silent for ``monitorSilenceFallbackMillis``.
Until the monitor is first heard the scan stays on, as in Apache RocketMQ: a node without a monitor
behaves exactly like Apache's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from namesrv.liveness.expiry import ExpiryScan

log = logging.getLogger("namesrv.liveness")


class MonitorWatchdog:
    """Keeps the local expiry scan off while the monitor is heard, on after it falls silent."""

    def __init__(self, expiry: ExpiryScan, silence_ms: int, now: Callable[[], float] = time.monotonic) -> None:
        self.expiry = expiry
        self.silence_ms = silence_ms
        self.now = now
        self.last_heard: float | None = None
        self.monitor: str | None = None

    @property
    def monitor_alive(self) -> bool:
        return self.last_heard is not None and (self.now() - self.last_heard) * 1000 < self.silence_ms

    def silence_s(self) -> float | None:
        """Seconds since the monitor was last heard; None if it never was (read by the metrics)."""
        last = self.last_heard
        return None if last is None else max(0.0, self.now() - last)

    def heard(self, monitor: str) -> None:
        handing_back = self.last_heard is not None  # the scan is on because the monitor fell silent
        self.last_heard = self.now()
        self.monitor = monitor
        if self.expiry.hand_to_monitor():
            # a hand-back pairs with the warning that switched the scan on, so it is one too
            log.log(
                logging.WARNING if handing_back else logging.INFO,
                "liveness monitor %r is alive: local expiry scan off, the monitor decides",
                monitor,
            )

    def check(self) -> None:
        if self.expiry.enabled or self.last_heard is None or self.monitor_alive:
            return
        self.expiry.take_back()
        log.warning(
            "liveness monitor %r silent for %d ms (monitorSilenceFallbackMillis): local expiry scan back on",
            self.monitor,
            self.silence_ms,
        )

    async def run(self) -> None:
        period = max(0.05, min(1.0, self.silence_ms / 4000))
        while True:
            await asyncio.sleep(period)
            self.check()
