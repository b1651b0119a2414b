"""How brokers leave the tables: batched unregistration and the local expiry scan.

Unregistrations (UNREGISTER_BROKER, closed connections, expiry) are queued and applied in batches
under one lock acquisition, as RocketMQ's BatchUnregistrationService does, on the node's worker
thread: removing a broker with 100,000 topics takes 60-90 ms, which on the event loop would stall
every client (route answers are served from the cache meanwhile, see ``NameServerNode.cached``).
Each request carries the sequence number of the moment it was decided; the route tables skip it
when the broker registered again after that moment, so a stale unregistration never wipes a fresh
registration (apache/rocketmq#11043).

The expiry scan is the node's own fallback: every ``scanNotActiveBrokerInterval`` it removes brokers
silent for longer than their heartbeat timeout.  When the streaming monitor is configured and alive
it decides expiry instead, and this scan is switched off (see :class:`ExpiryScan.enabled`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from namesrv.departure import LOCAL_EXPIRY, Departure
from namesrv.routes.manager import RouteInfoManager, UnregisterRequest
from namesrv.routes.model import MinBrokerIdChange, UnregisterOutcome

#: where an unregistration's NOTIFY_MIN_BROKER_ID_CHANGE goes (``NameServerNode.min_broker_id_changed``)
MinIdOutlet = Callable[[MinBrokerIdChange], None]

log = logging.getLogger("namesrv.liveness")


def forward_min_broker_id_changes(changes: list[MinBrokerIdChange], outlet: MinIdOutlet | None) -> None:
    if outlet is not None:
        for change in changes:
            outlet(change)


class BatchUnregistration:
    """A bounded queue of unregistrations drained by one task, a batch at a time."""

    def __init__(
        self, routes: RouteInfoManager, capacity: int, on_min_broker_id_change: MinIdOutlet | None = None
    ) -> None:
        self.routes = routes
        self.queue: asyncio.Queue[UnregisterRequest] = asyncio.Queue(maxsize=capacity)
        self.on_min_broker_id_change = on_min_broker_id_change

    def submit(self, requests: list[UnregisterRequest]) -> bool:
        """Queue requests; False if the queue is full (the caller answers SYSTEM_ERROR)."""
        if self.queue.maxsize and self.queue.qsize() + len(requests) > self.queue.maxsize:
            log.warning("unregistration queue full (%d): dropping %d request(s)", self.queue.maxsize, len(requests))
            return False
        for r in requests:
            self.queue.put_nowait(r)
        return True

    def drain_now(self, first: UnregisterRequest | None = None) -> None:
        """Apply everything queued as one batch, on this thread (a test can, with no loop turn)."""
        batch = self._take(first)
        if batch:
            self._applied(batch, self.routes.unregister_brokers(batch))

    async def run(self, worker: Executor) -> None:
        """Apply each batch on ``worker``; the queue and the notifications stay on the loop."""
        loop = asyncio.get_running_loop()
        while True:
            batch = self._take(await self.queue.get())
            self._applied(batch, await loop.run_in_executor(worker, self.routes.unregister_brokers, batch))

    def _take(self, first: UnregisterRequest | None) -> list[UnregisterRequest]:
        batch = [] if first is None else [first]
        while not self.queue.empty():
            batch.append(self.queue.get_nowait())
        return batch

    def _applied(self, batch: list[UnregisterRequest], outcome: UnregisterOutcome) -> None:
        log.debug("applied %d unregistration(s): %s", len(batch), outcome)
        forward_min_broker_id_changes(outcome.min_broker_id_changes, self.on_min_broker_id_change)


#: how soon the expiry scan tries again when the tables were busy
_BUSY_RETRY_S = 0.01


class ExpiryScan:
    """Every ``interval_ms``, expire brokers whose last heartbeat is older than their timeout.

    Expiry is applied at once rather than queued: the decision and its execution happen under the
    same lock, so there is nothing for a re-registration to race with.  Like Java, the expired
    broker's connection is closed, since a broker that stopped heartbeating is half-open at best.
    """

    def __init__(
        self,
        routes: RouteInfoManager,
        interval_ms: int,
        on_expired: Callable[[UnregisterRequest, Departure], None] | None = None,
        on_min_broker_id_change: MinIdOutlet | None = None,
    ) -> None:
        self.routes = routes
        self.interval_ms = interval_ms
        self.on_expired = on_expired
        self.on_min_broker_id_change = on_min_broker_id_change
        #: False while the streaming monitor decides expiry for every node
        self.enabled = True

    def scan_once(self, *, wait: bool = True) -> list[UnregisterRequest] | None:
        """Expire the silent brokers now; without ``wait``, None if the tables are busy (nothing done)."""
        outcome = self.routes.expire_inactive(wait=wait)
        if outcome is None:
            return None
        if outcome.applied:
            log.warning("expired silent brokers: %s", [f"{r.cluster_name}/{r.broker_addr}" for r in outcome.applied])
        for channel in outcome.removed_channels:
            close = getattr(channel, "close", None)
            if close is not None:
                close()
        if self.on_expired is not None:
            for r in outcome.applied:
                self.on_expired(r, LOCAL_EXPIRY)
        forward_min_broker_id_changes(outcome.min_broker_id_changes, self.on_min_broker_id_change)
        return outcome.applied

    async def run(self) -> None:
        # Java waits one interval before the first scan (apache/rocketmq PR #9683 fixed a 5 ms slip)
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            # the loop never waits for the tables: a large registration may hold them for a second
            while self.enabled and self.scan_once(wait=False) is None:
                await asyncio.sleep(_BUSY_RETRY_S)
