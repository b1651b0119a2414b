"""Every decided removal of a broker, queued and applied in batches on the node's worker thread.

UNREGISTER_BROKER, closed connections and the monitor's actions all end here: one bounded queue,
drained a batch at a time under one acquisition of the route tables' lock, off the event loop
(removing a large broker would stall every client). Each request carries the sequence number of the
moment it was decided, so the tables skip it when the broker registered again since: a stale
unregistration never wipes a fresh registration (https://github.com/apache/rocketmq/issues/11043).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from common.routes.manager import RouteInfoManager, UnregisterRequest
from common.routes.model import MinBrokerIdChange, UnregisterOutcome

#: where a removal's NOTIFY_MIN_BROKER_ID_CHANGE goes (``HandlerContext.min_broker_id_changed``)
MinIdOutlet = Callable[[MinBrokerIdChange], None]

log = logging.getLogger("namesrv.liveness")


def forward_min_broker_id_changes(changes: list[MinBrokerIdChange], outlet: MinIdOutlet | None) -> None:
    if outlet is not None:
        for change in changes:
            outlet(change)


class UnregisterBatcher:
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
