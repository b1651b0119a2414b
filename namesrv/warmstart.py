"""Warm start: serve the routes the streaming job keeps in Redis until the brokers register.

A name server that restarts empty answers TOPIC_NOT_EXIST for every topic until each broker's next
registration (https://github.com/apache/rocketmq/issues/9411).  With ``warmStartFromRedis=true`` a node
reads, before it listens, the route model the job keeps under ``redisKeyPrefix`` in one MULTI/EXEC (so
all of it comes from one micro-batch; keys and validation are :mod:`common.routes.snapshot`'s) and
loads it with :meth:`RouteInfoManager.load_provisional`: every live broker is provisional until its own
registration replaces it, and :func:`drop_unconfirmed`, a task of its own so that it also runs while the
local expiry scan is off, drops those no registration confirms in time.  Nothing here may stop a node
from starting: any failure is a warning, the read is bounded by :data:`READ_TIMEOUT_S`, and the node
then starts empty.  ``docs/warm-start.md`` explains the trade-off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from common import redis_clients
from common.contract import wall_ms

# the one masking helper, kept importable from here for callers written before it moved
from common.redis_clients import redact_url
from common.redis_keys import RedisKeys
from common.routes.manager import RouteInfoManager
from common.routes.snapshot import ModelSnapshot, SnapshotError, decode_model
from namesrv.liveness import MinIdOutlet, forward_min_broker_id_changes

if TYPE_CHECKING:
    from namesrv.config import NamesrvConfig

__all__ = [
    "READ_TIMEOUT_S",
    "RedisModel",
    "WarmStartError",
    "WarmStartReport",
    "drop_unconfirmed",
    "load_model",
    "parse_model",
    "read_model",
    "redact_url",
    "warm_start",
]

log = logging.getLogger("namesrv.warmstart")

#: longest a node waits for Redis at start-up before it starts empty
READ_TIMEOUT_S = 3.0


class WarmStartError(Exception):
    """The model in Redis cannot be used; the message says what is wrong with it."""


#: the job's route model as one consistent read found it
RedisModel = ModelSnapshot


@dataclass(frozen=True)
class WarmStartReport:
    """What a warm start loaded; the node keeps it (``namesrv.app.Node.warm_start``)."""

    source: str
    batch_id: int | None
    lineage: str | None
    watermark: int | None
    #: how old the job's write was when read (ms), None when it recorded no time
    age_ms: int | None
    brokers: int
    groups: int
    clusters: int
    topics: int
    #: the longest time (ms) an unconfirmed entry is served
    longest_timeout_ms: int


# --------------------------------------------------------------------------- reading


def parse_model(meta: Mapping[Any, Any], topic_entries: Mapping[Any, Any], brokers: bytes | str | None) -> RedisModel:
    """The model from the raw values of ``P:meta``, ``P:model:topics`` and ``P:model:brokers``.

    Raises :class:`WarmStartError` naming the key whose value does not have the documented shape
    (the one validation of :func:`common.routes.snapshot.decode_model`, which the job shares).
    """
    try:
        return decode_model(meta, topic_entries, brokers)
    except SnapshotError as exc:
        raise WarmStartError(str(exc)) from None


def read_model(client: redis_clients.Client, prefix: str, *, hash_tag: bool = False) -> RedisModel:
    """One MULTI/EXEC of the three keys, so they come from one batch of the job's writes.

    ``hash_tag``: the keys of a Redis Cluster (``{prefix}:…``, one slot, so the transaction holds).
    """
    keys = RedisKeys(prefix, hash_tag=hash_tag)
    with client.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.meta)
        pipe.hgetall(keys.model_topics)
        pipe.get(keys.model_brokers)
        meta, entries, brokers = pipe.execute()
    return parse_model(meta, entries, brokers)


def _client(url: str, timeout_s: float) -> redis_clients.Client:
    # no retries: redis-py retries three times with backoff by default, too long for a start-up
    return redis_clients.connect(url, timeout_s=timeout_s, retries=False, key="redisUrl")


def _read(url: str, prefix: str, timeout_s: float) -> RedisModel:
    client = _client(url, timeout_s)
    try:
        return read_model(client, prefix, hash_tag=redis_clients.is_cluster(url))
    finally:
        client.close()


# --------------------------------------------------------------------------- loading


def load_model(routes: RouteInfoManager, model: RedisModel, source: str, wall_ms: int) -> WarmStartReport:
    """Load ``model`` into the empty ``routes`` as provisional entries, and log what was loaded."""
    loaded = routes.load_provisional(model)
    brokers, groups, clusters, topics = loaded.brokers, loaded.groups, loaded.clusters, loaded.topics
    longest = loaded.longest_timeout_ms
    age = None if model.updated_at is None else max(0, wall_ms - model.updated_at)
    report = WarmStartReport(
        source, model.batch_id, model.lineage, model.watermark, age, brokers, groups, clusters, topics, longest
    )
    watermark = "none" if model.watermark is None else _iso(model.watermark)
    log.warning(
        "warm start: %d provisional broker(s) in %d group(s) of %d cluster(s), %d topic(s) from %s "
        "batch %s (lineage %s, watermark %s, written %s ago); each is served until its broker registers, "
        "at most %.0f s",
        brokers, groups, clusters, topics, source, model.batch_id, model.lineage, watermark,
        "?" if age is None else f"{age / 1000:.1f} s", longest / 1000,
    )  # fmt: skip
    if age is not None and age > longest:
        log.warning(
            "warm start: the model in Redis is %.0f s old, older than the brokers' timeout: the streaming "
            "job has not written since; its routes may name brokers that are gone", age / 1000,
        )  # fmt: skip
    return report


def _iso(epoch_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_ms / 1000)) + f".{epoch_ms % 1000:03d}Z"


async def warm_start(
    config: NamesrvConfig,
    routes: RouteInfoManager,
    *,
    read: Callable[[str, str, float], RedisModel] = _read,
    timeout_s: float = READ_TIMEOUT_S,
    wall_ms: Callable[[], int] = wall_ms,
) -> WarmStartReport | None:
    """Load the routes in Redis as provisional entries; None (and a warning) when there are none.

    Never raises for Redis or its content; at most ``timeout_s`` passes before it gives up.
    """
    if not config.warm_start_from_redis:
        return None
    url = config.redis_url.strip()
    if not url:
        log.warning("warmStartFromRedis=true but redisUrl is empty: starting with empty route tables")
        return None
    prefix = config.redis_key_prefix
    source = f"{redact_url(url)} prefix {prefix!r}"
    try:
        # the blocking read in a thread: a Redis that accepts and never answers cannot hold the start
        model = await asyncio.wait_for(asyncio.to_thread(read, url, prefix, timeout_s), timeout_s + 0.5)
    except WarmStartError as exc:
        log.warning("warm start: unusable model in %s (%s): starting with empty route tables", source, exc)
        return None
    except (TimeoutError, asyncio.TimeoutError):
        log.warning("warm start: %s did not answer within %.1f s: starting with empty route tables", source, timeout_s)
        return None
    except Exception as exc:  # noqa: BLE001 - Redis errors of every kind mean "start empty", never "do not start"
        reason = redis_clients.describe_error(exc, url)
        log.warning("warm start: cannot read %s (%s): starting with empty route tables", source, reason)
        return None
    if model.empty:
        log.warning(
            "warm start: no route model under %s (has the streaming job written there?): "
            "starting with empty route tables",
            source,
        )
        return None
    try:
        return load_model(routes, model, source, wall_ms())
    except RuntimeError as exc:
        log.warning("warm start skipped: %s", exc)
        return None


# --------------------------------------------------------------------------- deadlines


async def drop_unconfirmed(
    routes: RouteInfoManager,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    on_min_broker_id_change: MinIdOutlet | None = None,
) -> None:
    """Drop each provisional entry its broker did not confirm within its timeout; ends when none is left.

    Independent of the expiry scan (which skips provisional entries), so it also runs while the
    monitor decides expiry.
    """
    while (deadline := routes.next_provisional_deadline()) is not None:
        # an entry expires strictly after its deadline, as a heartbeat timeout does
        await sleep(max(0, deadline + 1 - routes.now_ms()) / 1000)
        outcome = routes.drop_unconfirmed_provisional()
        forward_min_broker_id_changes(outcome.min_broker_id_changes, on_min_broker_id_change)
        if outcome.applied:
            log.warning(
                "warm start: dropped %d provisional broker(s) no registration confirmed in time: %s",
                len(outcome.applied), [f"{r.cluster_name}/{r.broker_addr}" for r in outcome.applied],
            )  # fmt: skip
    stats = routes.provisional_stats
    if stats.loaded:
        log.warning(
            "warm start over: of %d provisional broker(s), %d confirmed by registering, %d dropped",
            stats.loaded,
            stats.confirmed,
            stats.dropped,
        )
