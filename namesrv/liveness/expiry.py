"""The node's own expiry scan: the fallback that decides liveness while the monitor is away.

Every ``scanNotActiveBrokerInterval`` it removes the brokers silent for longer than their heartbeat
timeout, as Apache RocketMQ's scan does. While the streaming monitor is heard it decides expiry for
every node instead: the watchdog hands expiry to it (:meth:`ExpiryScan.hand_to_monitor`) and takes
it back after the monitor's silence (:meth:`ExpiryScan.take_back`). The removal runs on the node's
worker thread, the report (connections closed, events, notifications) on the loop; see
docs/internals/node-liveness.md for why the order of the two is safe.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from common.routes.manager import RouteInfoManager, UnregisterRequest
from common.routes.model import UnregisterOutcome
from namesrv.liveness.departure import LOCAL_EXPIRY, Departure
from namesrv.liveness.unregister_batcher import MinIdOutlet, forward_min_broker_id_changes

log = logging.getLogger("namesrv.liveness")


class ExpiryScan:
    """Every ``interval_ms``, expire brokers whose last heartbeat is older than their timeout.

    Expiry is applied at once rather than queued: the decision and its execution happen under the
    same lock, so there is nothing for a re-registration to race with.  Like Java, the expired
    broker's connection is closed, since a broker that stopped heartbeating is half-open at best.
    A report about a broker that registered again between the removal (on the worker) and the
    report (on the loop) is dropped, and the connection it is registered on again stays open.
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
        self._enabled = True

    @property
    def enabled(self) -> bool:
        """True while this node decides expiry itself; False while the streaming monitor decides."""
        return self._enabled

    def hand_to_monitor(self) -> bool:
        """The monitor decides expiry from now on; True if this scan was deciding until now."""
        was_on, self._enabled = self._enabled, False
        return was_on

    def take_back(self) -> bool:
        """This node decides expiry again (the monitor fell silent); True if the monitor was deciding."""
        was_on, self._enabled = self._enabled, True
        return not was_on

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

    async def expire_undecided(
        self, worker: Executor, grace_ms: int, decided_through: int | None, wall_now: int
    ) -> list[UnregisterRequest] | None:
        """Expire on ``worker`` the brokers more than ``grace_ms`` past their deadline that the monitor has
        not decided: whose deadline is after ``decided_through`` (wall ms at ``wall_now``; None: all of
        them). None if the tables were busy (the caller looks again soon)."""
        kept = None if decided_through is None else decided_through - wall_now + self.routes.now_ms()
        expire = functools.partial(self.routes.expire_inactive, wait=False, grace_ms=grace_ms, kept_through=kept)
        outcome = await asyncio.get_running_loop().run_in_executor(worker, expire)
        if outcome is None:
            return None
        return self._report(outcome, f"no monitor decided on them {grace_ms} ms past their deadline")

    def _expire_if_enabled(self) -> UnregisterOutcome | None:
        # read again on the worker: a busy worker may start this job after the monitor took over
        return self.routes.expire_inactive() if self.enabled else None

    def _report(self, outcome: UnregisterOutcome, why: str = "") -> list[UnregisterRequest]:
        if not outcome.applied:
            return outcome.applied
        log.warning(
            "expired silent brokers%s: %s",
            f" ({why})" if why else "",
            [f"{r.cluster_name}/{r.broker_addr}" for r in outcome.applied],
        )
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
        # Java waits one interval before the first scan (https://github.com/apache/rocketmq/pull/9683)
        while True:
            await asyncio.sleep(self.interval_ms / 1000)
            if self.enabled:
                await self.scan_on(worker)
