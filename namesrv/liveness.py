"""How brokers leave the tables: batched unregistration and the local expiry scan.

Unregistrations (UNREGISTER_BROKER, closed connections, the monitor's actions) are queued and
applied in batches under one lock acquisition, as RocketMQ's BatchUnregistrationService does, on the
node's worker thread: removing a broker with 100,000 topics takes 60-90 ms, which on the event loop
would stall every client (route answers are served from the cache meanwhile, see ``NameServerNode.cached``).
Each request carries the sequence number of the moment it was decided; the route tables skip it
when the broker registered again after that moment, so a stale unregistration never wipes a fresh
registration (apache/rocketmq#11043).

The expiry scan is the node's own fallback: every ``scanNotActiveBrokerInterval`` it removes brokers
silent for longer than their heartbeat timeout, on the worker thread as well (it decides and removes
at once, see :class:`ExpiryScan`).  When the streaming monitor is configured and alive it decides
expiry instead, and this scan is switched off (see :class:`ExpiryScan.enabled`).
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


class ExpiryScan:
    """Every ``interval_ms``, expire brokers whose last heartbeat is older than their timeout.

    Expiry is applied at once rather than queued: the decision and its execution happen under the
    same lock, so there is nothing for a re-registration to race with.  Like Java, the expired
    broker's connection is closed, since a broker that stopped heartbeating is half-open at best.

    On a node (:meth:`run`) the decision and the removal run on the worker thread, as batched
    unregistrations do: removing a broker of 100,000 topics takes 60-90 ms, which on the loop would
    stall every client.  What follows stays on the loop (:meth:`_report`): closing the removed
    brokers' connections, the events and the NOTIFY_MIN_BROKER_ID_CHANGE.  Between the removal and
    the report the loop may have handled a registration of the same broker; a report about a
    broker that is live again is dropped (its registration's own event and notification are the
    newer word), and a connection a broker is registered on again is not closed, so the order of
    what the outside world hears is the order of what the tables did.
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
        """Expire the silent brokers now, on this thread; without ``wait``, None if the tables are busy."""
        outcome = self.routes.expire_inactive(wait=wait)
        if outcome is None:
            return None
        return self._report(outcome)

    async def scan_on(self, worker: Executor) -> list[UnregisterRequest] | None:
        """Expire the silent brokers on ``worker``, then report on the loop; None if the scan was off by then."""
        outcome = await asyncio.get_running_loop().run_in_executor(worker, self._expire_if_enabled)
        if outcome is None:
            return None
        return self._report(outcome)

    def _expire_if_enabled(self) -> UnregisterOutcome | None:
        # read again on the worker: a busy worker may start this job after the monitor took over
        return self.routes.expire_inactive() if self.enabled else None

    def _report(self, outcome: UnregisterOutcome) -> list[UnregisterRequest]:
        if not outcome.applied:
            return outcome.applied
        log.warning("expired silent brokers: %s", [f"{r.cluster_name}/{r.broker_addr}" for r in outcome.applied])
        back = self.routes.live_channels((r.cluster_name, r.broker_addr) for r in outcome.applied)
        registered_on = {id(c) for c in back.values() if c is not None}
        for channel in outcome.removed_channels:
            close = getattr(channel, "close", None)
            if close is not None and id(channel) not in registered_on:
                close()
        if self.on_expired is not None:
            for r in outcome.applied:
                if (r.cluster_name, r.broker_addr) not in back:
                    self.on_expired(r, LOCAL_EXPIRY)
        changes = outcome.min_broker_id_changes
        if back:
            returned = {addr for _, addr in back}
            changes = [c for c in changes if c.offline_broker_addr not in returned]
        forward_min_broker_id_changes(changes, self.on_min_broker_id_change)
        return outcome.applied

    async def run(self, worker: Executor) -> None:
        """The scan of a node: every interval, on ``worker`` (the node's worker thread)."""
        # Java waits one interval before the first scan (apache/rocketmq PR #9683 fixed a 5 ms slip)
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            if self.enabled:
                await self.scan_on(worker)
