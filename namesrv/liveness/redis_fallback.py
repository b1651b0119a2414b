"""Redis right while no monitor decides: the node that holds the lease removes dead brokers from the routes.

While the streaming monitor decides, only it writes the routes in Redis. While a node has taken
expiry back from it (:class:`~namesrv.liveness.MonitorWatchdog`), this writer looks every
``period_s`` for brokers that left the node's tables or passed their deadline there
(:class:`Departures`) and, if the node holds the fallback lease (:class:`RedisLease`: one writer at a
time among the nodes), removes them from the job's model and routes with the job's own code
(:func:`namesrv.routes.materialised.removal_changes`), recording each removal in ``P:model:removed``
so that a returning monitor honours it instead of bringing the broker back. The write watches the
lease and the model, so a job write or a lost lease in between aborts it and it is tried again.
``docs/monitor.md`` ("While the monitor is away") has the guarantees and their limits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, TypeVar

from common import redis_clients
from common.redis_keys import RedisKeys
from namesrv.events.schema import wall_ms
from namesrv.liveness.expiry import ExpiryScan
from namesrv.routes.manager import RouteInfoManager
from namesrv.routes.materialised import (
    BrokerKey,
    decode_removals,
    encode_removal,
    queue_route_writes,
    removal_changes,
)
from namesrv.routes.model import RouteSettingsLike
from namesrv.routes.snapshot import SnapshotError, decode_model

if TYPE_CHECKING:
    from namesrv.config import NamesrvConfig

log = logging.getLogger("namesrv.liveness")

_T = TypeVar("_T")

#: how often the writer looks, and renews the lease; a lease lasts LEASE_PERIODS of it, so a holder
#: that stopped is replaced within that
PERIOD_S = 0.25
LEASE_PERIODS = 8
#: how long ``P:model:removed`` is kept after its last write: a returning job reads it before it
#: replays its backlog, and no backlog is a day long
REMOVALS_KEPT_MS = 86_400_000
#: attempts of one write whose watched keys changed under it (the job wrote meanwhile)
WRITE_ATTEMPTS = 3

_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class Departures:
    """Brokers to remove from Redis: those that left this node's tables, or passed their deadline there.

    Each is reported once (with the wall time it was seen gone) until :meth:`written` or
    :meth:`discard`; one that is live again, and not overdue, before that is dropped.
    """

    def __init__(self) -> None:
        self._live: set[BrokerKey] | None = None
        #: to write: broker -> wall time it was seen gone
        self.pending: dict[BrokerKey, int] = {}
        #: written or discarded, and still overdue or just gone: not reported again
        self._done: set[BrokerKey] = set()

    def observe(self, live: set[BrokerKey], overdue: set[BrokerKey], now_ms: int) -> dict[BrokerKey, int]:
        """One look at the tables; returns what is pending now."""
        previous = live if self._live is None else self._live
        self._live = live
        for key in (previous - live) | overdue:
            if key not in self._done:
                self.pending.setdefault(key, now_ms)
        for key in [k for k in self.pending if k in live and k not in overdue]:
            del self.pending[key]  # heard again before it was written
        # what could be reported again: still overdue, or gone since the last look
        self._done = {k for k in self._done if k in overdue or (k in previous and k not in live)}
        return dict(self.pending)

    def written(self, keys: set[BrokerKey]) -> None:
        self._done |= keys
        for key in keys:
            self.pending.pop(key, None)

    def discard(self) -> None:
        """Another node writes (or a monitor decides): forget what is pending, look again from scratch."""
        self.written(set(self.pending))

    def restart(self) -> None:
        self._live = None
        self.pending.clear()
        self._done.clear()


class RedisLease:
    """A lease in one Redis key: its holder's name, with a time to live renewed by the holder."""

    def __init__(self, client: redis_clients.Client, key: str, owner: str, ttl_ms: int) -> None:
        self.client, self.key, self.owner, self.ttl_ms = client, key, owner, ttl_ms

    def hold(self) -> bool:
        """Renew the lease if this owner holds it, else take it if nobody does; True if held now."""
        if self.client.eval(_RENEW, 1, self.key, self.owner, self.ttl_ms):
            return True
        return bool(self.client.set(self.key, self.owner, nx=True, px=self.ttl_ms))

    def release(self) -> None:
        """Give the lease up if this owner holds it."""
        self.client.eval(_RELEASE, 1, self.key, self.owner)


def connect_node_redis(config: NamesrvConfig, without: str) -> tuple[redis_clients.Client, RedisKeys] | None:
    """A node's client of ``redisUrl`` and the key layout under its prefix; None, and a warning starting
    with ``without`` (what the node goes without), when the URL cannot work."""
    url = config.redis_url.strip()
    try:
        client = redis_clients.connect(url, timeout_s=2.0, retries=False, key="redisUrl")
    except redis_clients.RedisUrlError as exc:
        log.warning("%s: %s", without, exc)
        return None
    return client, RedisKeys(config.redis_key_prefix, hash_tag=redis_clients.is_cluster(url))


class RedisFallback:
    """The fallback writer of one node: runs while its expiry scan is on, writes while it holds the lease."""

    def __init__(
        self,
        client: redis_clients.Client,
        keys: RedisKeys,
        owner: str,
        routes: RouteInfoManager,
        expiry: ExpiryScan,
        settings: RouteSettingsLike,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.client, self.keys, self.routes, self.expiry, self.settings = client, keys, routes, expiry, settings
        self.lease = RedisLease(client, keys.fallback_lease, owner, int(PERIOD_S * 1000 * LEASE_PERIODS))
        self.departures = Departures()
        self.now_ms = now_ms
        self.holding = False

    @classmethod
    def from_config(
        cls, config: NamesrvConfig, owner: str, routes: RouteInfoManager, expiry: ExpiryScan
    ) -> RedisFallback | None:
        """The writer of a node with ``redisUrl``; None, and a warning, when the URL cannot work."""
        connected = connect_node_redis(config, "no fallback writer for the routes in Redis")
        return None if connected is None else cls(*connected, owner, routes, expiry, config)

    async def run(self, worker: Executor) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PERIOD_S)
            if not self.expiry.enabled:  # a monitor decides, and writes Redis
                if self.holding:
                    await self._io(self.lease.release)
                    self.holding = False
                self.departures.restart()
                continue
            live, overdue = await loop.run_in_executor(worker, self.routes.live_and_overdue)
            pending = self.departures.observe(live, overdue, self.now_ms())
            held = await self._io(self.lease.hold)
            if held != self.holding:
                self.holding = bool(held)
                log.warning(
                    "%s the fallback lease: %s removes dead brokers from the routes in Redis while no monitor decides",
                    "took" if held else "lost", "this node" if held else "another node",
                )  # fmt: skip
            if not held:
                self.departures.discard()
            elif pending:
                written = await self._io(functools.partial(self.remove, pending))
                if written is not None:
                    self.departures.written(written)

    def close(self) -> None:
        """Give the lease back if held (the next node takes over at once) and close the connection."""
        from redis.exceptions import RedisError

        try:
            if self.holding:
                self.lease.release()
        except (RedisError, OSError):
            pass  # the lease runs out by itself
        finally:
            self.client.close()

    async def _io(self, call: Callable[[], _T]) -> _T | None:
        """``call`` on a thread (redis-py blocks); None, and a warning, when Redis failed."""
        from redis.exceptions import RedisError  # imported by nodes that have Redis only

        try:
            return await asyncio.to_thread(call)
        except (RedisError, OSError) as exc:
            log.warning("fallback writer: redis failed (%r); trying again in %.2f s", exc, PERIOD_S)
            return None

    def remove(self, gone: dict[BrokerKey, int]) -> set[BrokerKey] | None:
        """Remove ``gone`` (broker -> wall time seen gone) from the routes in Redis; the brokers dealt with.

        None when the lease was lost or the job kept writing over every attempt (tried again later).
        """
        from redis.exceptions import WatchError

        k = self.keys
        for _ in range(WRITE_ATTEMPTS):
            try:
                with self.client.pipeline(transaction=True) as pipe:
                    pipe.watch(k.fallback_lease, k.meta, k.model_topics, k.model_brokers, k.model_removed)
                    if _text(pipe.get(k.fallback_lease)) != self.lease.owner:
                        return None
                    snap = decode_model(pipe.hgetall(k.meta), pipe.hgetall(k.model_topics), pipe.get(k.model_brokers))
                    removed = decode_removals(pipe.hgetall(k.model_removed))
                    for key, at in gone.items():
                        removed[key] = max(at, removed.get(key, at))
                    brokers, changes = removal_changes(snap, removed, self.settings)
                    pipe.multi()
                    queue_route_writes(pipe, k, changes)
                    for key in gone:
                        pipe.hset(k.model_removed, *encode_removal(*key, removed[key]))
                    pipe.pexpire(k.model_removed, REMOVALS_KEPT_MS)
                    pipe.execute()
            except WatchError:
                continue
            except SnapshotError as exc:
                log.warning("fallback writer: the route model in Redis is unreadable (%s); not written", exc)
                return set(gone)
            if brokers:
                log.warning(
                    "no monitor decides: removed %s from the routes in Redis (%d route(s) rewritten)",
                    [f"{c}/{a}" for c, a in brokers], len(changes.routes),
                )  # fmt: skip
            return set(gone)
        return None


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
