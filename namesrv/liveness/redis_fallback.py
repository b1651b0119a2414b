"""Redis follows the nodes whatever the monitor's state: the node that holds the lease writes what it has not.

While the streaming monitor keeps up, it writes the routes in Redis. Every node's writer looks every
``PERIOD_S`` for brokers that left its tables or passed their deadline there (:class:`Departures`).
A departure the monitor has decided on (its MONITOR_HEARTBEAT's ``decidedThrough`` reached the moment
it was seen: :meth:`MonitorWatchdog.covers`) is the monitor's to write. One it has not decided within
``monitorDecisionGraceMillis`` (it stalled, lags behind a backlog, died or is restarting) is written
by the node that holds the fallback lease (:class:`RedisLease`: one writer at a time among the nodes),
once no other node holds the broker (:class:`SharedHolds`: a close at one node only is that node's):
it removes the broker from the job's model and routes with the job's own code
(:func:`common.routes.materialised.removal_changes`) and records the removal in ``P:model:removed``,
so that a returning monitor honours it instead of bringing the broker back. The write watches the
lease and the model, so a job write or a lost lease in between aborts it and it is tried again.
Every node notes departures whether or not it holds the lease, so one that takes the lease over from
a node that froze or died writes what that node left. ``docs/monitor.md`` ("While the monitor is slow
or away") has the guarantees and their limits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, TypeVar

from common import redis_clients
from common.contract import wall_ms
from common.logs import LogThrottle
from common.redis_keys import RedisKeys, broker_field
from common.routes.manager import RouteInfoManager
from common.routes.materialised import (
    BrokerKey,
    decode_removals,
    encode_removal,
    queue_route_writes,
    removal_changes,
)
from common.routes.model import RouteSettingsLike
from common.routes.snapshot import SnapshotError, decode_model
from namesrv.liveness.watchdog import MonitorWatchdog

if TYPE_CHECKING:
    from namesrv.config import NamesrvConfig

log = logging.getLogger("namesrv.liveness")

_T = TypeVar("_T")

#: how often the writer looks, and renews the lease; a lease lasts LEASE_PERIODS of it, so a holder
#: that stopped is replaced within that
PERIOD_S = 0.25
LEASE_PERIODS = 8
#: the lease's time to live, and that of each node's shared holds: a node that stopped holds nothing after it
LEASE_TTL_MS = int(PERIOD_S * 1000 * LEASE_PERIODS)
#: how long ``P:model:removed`` is kept after its last write: a returning job reads it before it
#: replays its backlog, and no backlog is a day long
REMOVALS_KEPT_MS = 86_400_000
#: attempts of one write whose watched keys changed under it (the job wrote meanwhile)
WRITE_ATTEMPTS = 3
#: a departure not written this long after it was seen (another node wrote it, or it never needed to be)
#: is forgotten; so is the oldest past MAX_PENDING, so a flood of departures cannot fill memory
PENDING_KEPT_MS = 300_000
MAX_PENDING = 65_536
#: the most other nodes the lease holder asks what they hold (the newest in ``P:fallback:nodes``): a list
#: swollen by many node names, or by hostile entries, costs one look no more than that
MAX_SHARING_NODES = 64
#: taking or losing the lease is a warning at most this often; more often, news at INFO
LEASE_NEWS_INTERVAL_S = 60.0

_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class Departures:
    """Brokers to remove from Redis: those that left this node's tables, or passed their deadline there.

    Each is pending (with the wall time it was seen gone) until :meth:`written`, or until :meth:`settle`
    finds the monitor decided on it or it is too old; one that is live again, and not overdue, before
    that is dropped. The first look is the baseline: what the tables hold then is not a departure.
    """

    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending
        self._live: set[BrokerKey] | None = None
        #: to write: broker -> wall time it was seen gone
        self.pending: dict[BrokerKey, int] = {}
        #: written or settled, and still overdue or just gone: not reported again
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
        if len(self.pending) > self.max_pending:  # a flood of departures: the oldest are the likeliest written
            for key in sorted(self.pending, key=self.pending.__getitem__)[: len(self.pending) - self.max_pending]:
                del self.pending[key]
        return dict(self.pending)

    def settle(self, decided: Callable[[int], bool], seen_before: int) -> None:
        """Forget what the monitor has decided on (``decided(seen_at)``: it writes Redis itself) and what
        has been pending since before ``seen_before`` (another node wrote it, or nobody will)."""
        for key, at in list(self.pending.items()):
            if at < seen_before or decided(at):
                del self.pending[key]
                self._done.add(key)

    def due(self, seen_by: int) -> dict[BrokerKey, int]:
        """What has been pending since ``seen_by`` or earlier."""
        return {k: at for k, at in self.pending.items() if at <= seen_by}

    def written(self, keys: set[BrokerKey]) -> None:
        self._done |= keys
        for key in keys:
            self.pending.pop(key, None)


class SharedHolds:
    """What each node holds, shared in Redis, so that the lease holder leaves a broker another node holds.

    A close or a deadline at one node only is that node's to act on, as the monitor's own rule has it
    (REMOVE once no node holds a connection): the broker may be heard at the others all along. Each node
    keeps ``P:fallback:holds:<node>`` equal to the brokers in its tables and not overdue there, by the
    difference since its last look, and renews its time to live at every look: a dead or frozen node's set
    runs out and it holds nothing. ``P:fallback:nodes`` names the nodes that share one.
    """

    def __init__(self, keys: RedisKeys, node: str, ttl_ms: int) -> None:
        self.keys, self.node, self.ttl_ms = keys, node, ttl_ms
        #: what this node's set in Redis holds, as far as this node knows; None: unknown (rewritten whole)
        self._shared: set[BrokerKey] | None = None

    def publish(self, client: redis_clients.Client, holds: set[BrokerKey], now_ms: int) -> None:
        """Bring this node's set in Redis to ``holds`` and renew it; on a failure the next call rewrites it."""
        key = self.keys.fallback_holds(self.node)
        shared, self._shared = self._shared, None  # unknown until the write is through
        pipe = client.pipeline(transaction=False)
        if shared is None:
            pipe.delete(key)
            added, dropped = holds, set()
        else:
            added, dropped = holds - shared, shared - holds
        if added:
            pipe.sadd(key, *(broker_field(*k) for k in added))
        if dropped:
            pipe.srem(key, *(broker_field(*k) for k in dropped))
        pipe.pexpire(key, self.ttl_ms)
        pipe.hset(self.keys.fallback_nodes, self.node, now_ms)
        renewed = pipe.execute()[-2]
        if holds and not renewed:
            return  # the set ran out meanwhile (this node stood still): rewritten whole next time
        self._shared = set(holds)

    def withdraw(self, client: redis_clients.Client) -> None:
        """This node stops: it holds nothing, from now rather than once its set runs out."""
        self._shared = None
        client.delete(self.keys.fallback_holds(self.node))

    def held_elsewhere(self, client: redis_clients.Client, keys: set[BrokerKey], now_ms: int) -> set[BrokerKey]:
        """Those of ``keys`` that another node holds. The newest MAX_SHARING_NODES of the list are asked; a
        node not heard for a day, or an entry that is no node's (not a time), is dropped from the list."""
        nodes, bad = {}, []
        for field, value in client.hgetall(self.keys.fallback_nodes).items():
            node, at = _text(field), _int(value)
            if node is None or at is None:
                bad.append(field)
            elif node != self.node:
                nodes[node] = at
        bad += [n for n, at in nodes.items() if now_ms - at > REMOVALS_KEPT_MS]
        if bad:
            client.hdel(self.keys.fallback_nodes, *bad)
        others = sorted((n for n in nodes if n not in bad), key=nodes.__getitem__)[-MAX_SHARING_NODES:]
        order = sorted(keys)
        members = [broker_field(*k) for k in order]
        pipe = client.pipeline(transaction=False)
        for node in others:
            pipe.smismember(self.keys.fallback_holds(node), members)
        held: set[BrokerKey] = set()
        for answer in pipe.execute():
            held.update(k for k, is_member in zip(order, answer, strict=False) if is_member)
        return held


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
    """The fallback writer of one node: writes a departure the monitor has not decided in time, while it holds the lease."""

    #: After this node itself stood still (frozen, starved: looks further apart than the grace), what its tables
    #: call overdue or gone is partly its own doing: a broker whose connection to it broke meanwhile is heard
    #: again only at its next registration (RocketMQ's registerNameServerPeriod, 30 s by default), while the
    #: other nodes hear it all along. For this long after such a stall a departure is written only once no
    #: monitor is heard, and not before RESUME_WAIT_MS, so that a live monitor decides it (and keeps a broker
    #: other nodes hear) instead.
    POST_STALL_MS = 30_000
    RESUME_WAIT_MS = 5_000

    def __init__(
        self,
        client: redis_clients.Client,
        keys: RedisKeys,
        owner: str,
        routes: RouteInfoManager,
        monitor: MonitorWatchdog,
        settings: RouteSettingsLike,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.client, self.keys, self.routes, self.monitor, self.settings = client, keys, routes, monitor, settings
        self.lease = RedisLease(client, keys.fallback_lease, owner, LEASE_TTL_MS)
        self.holds = SharedHolds(keys, owner, LEASE_TTL_MS)
        self.departures = Departures()
        self.now_ms = now_ms
        self.holding = False
        self._lease_news = LogThrottle(LEASE_NEWS_INTERVAL_S)
        self._last_look_ms: int | None = None
        #: when this node last came back from standing still (wall ms), if it has
        self._resumed_ms: int | None = None

    @classmethod
    def from_config(
        cls, config: NamesrvConfig, owner: str, routes: RouteInfoManager, monitor: MonitorWatchdog
    ) -> RedisFallback | None:
        """The writer of a node with ``redisUrl``; None, and a warning, when the URL cannot work."""
        connected = connect_node_redis(config, "no fallback writer for the routes in Redis")
        return None if connected is None else cls(*connected, owner, routes, monitor, config)

    async def run(self, worker: Executor) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(PERIOD_S)
            live, overdue = await loop.run_in_executor(worker, self.routes.live_and_overdue)
            await self.look(live, overdue)

    async def look(self, live: set[BrokerKey], overdue: set[BrokerKey]) -> None:
        """One look: note the departures, and write those the monitor has not decided within its grace."""
        now = self.now_ms()
        if self._last_look_ms is not None and now - self._last_look_ms > self.monitor.grace_ms:
            self._resumed_ms = now
        self._last_look_ms = now
        await self._io(functools.partial(self.holds.publish, self.client, live - overdue, now), quiet=True)
        self.departures.observe(live, overdue, now)
        self.departures.settle(self.monitor.covers, now - PENDING_KEPT_MS)
        due = self._after_a_stall(self.departures.due(now - self.monitor.grace_ms), now)
        if not due and (not self.holding or self.monitor.decided_through() is not None):
            if self.holding:  # the monitor keeps up again: the next departure is its to write
                await self._io(self.lease.release)
                self.holding = False
            return
        held = await self._io(self.lease.hold)
        if held is None:
            return  # Redis failed (said by _io): the next look tries again
        if held != self.holding:
            self.holding = held
            # one warning per episode: a slow monitor can hand the lease back and forth every few seconds
            log.log(
                logging.WARNING if self._lease_news.allow(held) else logging.INFO,
                "%s the fallback lease: %s removes dead brokers from the routes in Redis while no monitor decides "
                "them in time",
                "took" if held else "lost", "this node" if held else "another node",
            )  # fmt: skip
        if held and due:
            elsewhere = await self._io(functools.partial(self.holds.held_elsewhere, self.client, set(due), now))
            if elsewhere is None:
                return
            due = {key: at for key, at in due.items() if key not in elsewhere}  # pending while another holds it
            written = await self._io(functools.partial(self.remove, due)) if due else set()
            if written is not None:
                self.departures.written(written)

    def _after_a_stall(self, due: dict[BrokerKey, int], now: int) -> dict[BrokerKey, int]:
        """``due`` less the departures seen since this node came back from a stall, while a monitor may still
        decide them (see :attr:`POST_STALL_MS`)."""
        resumed = self._resumed_ms
        if resumed is None or now - resumed > self.POST_STALL_MS:
            return due
        if now - resumed >= self.RESUME_WAIT_MS and self.monitor.decided_through() is None:
            return due  # no monitor heard since: the nodes are on their own
        return {key: at for key, at in due.items() if at < resumed}

    def close(self) -> None:
        """Give the lease back if held (the next node takes over at once), hold nothing any more, and close
        the connection."""
        try:
            if self.holding:
                self.lease.release()
            self.holds.withdraw(self.client)
        except redis_clients.failures():
            pass  # the lease and the set run out by themselves
        finally:
            self.client.close()

    async def _io(self, call: Callable[[], _T], *, quiet: bool = False) -> _T | None:
        """``call`` on a thread (redis-py blocks); None, and a warning (``quiet``: at DEBUG, where the lease's
        own call in the same look warns), when Redis failed."""
        try:
            return await asyncio.to_thread(call)
        except redis_clients.failures() as exc:
            level = logging.DEBUG if quiet else logging.WARNING
            log.log(level, "fallback writer: redis failed (%r); trying again in %.2f s", exc, PERIOD_S)
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
                    "no monitor decided them in time: removed %s from the routes in Redis (%d route(s) rewritten)",
                    [f"{c}/{a}" for c, a in brokers], len(changes.routes),
                )  # fmt: skip
            return set(gone)
        return None


def _text(value: bytes | str | None) -> str | None:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value


def _int(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
