"""Topic routes and cluster info in Redis: the job's store of its route model, and a lookup client.

The model itself (:class:`RouteModel`, fed with the nodes' events and the job's own EXPIRE/REMOVE
actions) lives in :mod:`common.routes.materialised`, which a node's fallback writer shares. After
each micro-batch :class:`RedisRouteStore` writes the model's differences, the open alerts and the
batch id in one MULTI/EXEC with the change notifications, skipping a batch already written, so
readers never see half a batch and a replay changes nothing.  :class:`RouteLookup` is the reader
side (``namesrv-monitor routes get|watch``).  The keys are documented in ``docs/redis-keys.md``;
``docs/internals/routes.md`` has how the model is kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from common import redis_clients
from common.alerts import NODE_OWNED_KINDS
from common.contract import wall_ms
from common.protocol import bodies
from common.protocol.types import TopicRouteData
from common.redis_keys import RedisKeys
from common.routes import RouteSettings
from common.routes.materialised import BrokerKey, RouteChanges, RouteModel, decode_removals, queue_route_writes
from common.routes.snapshot import OrderConf, decode_model, encode_meta
from streaming.alerts import MAX_STORED_TOPICS, Alert, decode_alert, encode_alert
from streaming.health import MAX_RESOLVED, BrokerHealth, HealthWrites, NodeHealth, load_entries

log = logging.getLogger(__name__)

__all__ = [
    "OrderConf", "RedisKeys", "RedisRouteStore", "RemovalsChanged", "RouteChanges", "RouteLookup", "RouteModel",
    "StoreChanged", "StoredState", "WritesLost",
]  # fmt: skip


# --------------------------------------------------------------------------- the store


class StoreChanged(Exception):
    """What Redis holds is not what the batch's differences were computed against: write everything again.

    Raised as is when a watched key changed or the connection holding the WATCH failed (a failover)."""


class RemovalsChanged(StoreChanged):
    """A node wrote a removal to ``P:model:removed`` since the batch read them: honour it, then write again."""


class WritesLost(StoreChanged):
    """``P:meta`` does not name the batch this job wrote last: Redis lost writes (a master that failed over
    before passing them to its replica, a restart without persistence), so differences would leave it behind."""

    def __init__(self, stored: tuple[str | None, int | None]) -> None:
        super().__init__(f"redis holds batch {stored[1]} of lineage {stored[0]}")
        self.stored = stored


@dataclass(frozen=True)
class StoredState:
    lineage: str | None
    batch_id: int
    model: RouteModel
    alerts: dict[str, Alert]
    #: the console's health entries (streaming.health), checked
    health: tuple[list[BrokerHealth], list[NodeHealth]] = field(default_factory=lambda: ([], []))


class RedisRouteStore:
    """Writes a batch's changes in one MULTI/EXEC; reads the model back after a restart."""

    def __init__(self, client: redis_clients.Client, keys: RedisKeys) -> None:
        self.client = client
        self.keys = keys

    @classmethod
    def from_url(cls, url: str, prefix: str = "namesrv") -> RedisRouteStore:
        # on a Redis Cluster every key of the prefix shares one hash slot, so the batch's MULTI/EXEC holds
        return cls(redis_clients.connect(url), RedisKeys(prefix, hash_tag=redis_clients.is_cluster(url)))

    def load(self, settings: RouteSettings | None = None, *, order_message_enable: bool = False) -> StoredState:
        """The stored model, alerts and batch; raises SnapshotError when the model is not the documented one."""
        k = self.keys
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(k.meta)
            pipe.hgetall(k.model_topics)
            pipe.get(k.model_brokers)
            pipe.hgetall(k.alerts)
            meta, entries, brokers, stored_alerts = pipe.execute()
        snap = decode_model(meta, entries, brokers)
        alerts = {}
        for incident, raw in stored_alerts.items():
            try:
                alert = decode_alert(raw)
            except ValueError:
                log.warning("redis: ignoring malformed alert %r", incident)
                continue
            if alert.kind not in NODE_OWNED_KINDS:  # the nodes resolve what they opened; the job must not re-send it
                alerts[incident.decode()] = alert
        model = RouteModel.from_snapshot(snap, settings, order_message_enable=order_message_enable)
        health = load_entries(self.client, k)
        return StoredState(snap.lineage, -1 if snap.batch_id is None else snap.batch_id, model, alerts, health)

    def _delete_all(self, pipe: Any) -> None:
        k = self.keys
        # only the job writes under the prefix, so the scan outside the transaction is safe
        stale = list(self.client.scan_iter(match=k.route_pattern, count=1000))
        for i in range(0, len(stale), 1000):
            pipe.delete(*stale[i : i + 1000])
        pipe.delete(k.topics, k.cluster, k.alerts, k.meta, k.model_topics, k.model_brokers)
        # not P:alerts:resolved: a rewrite after a failed write keeps the history of what ended
        pipe.delete(k.health_brokers, k.health_nodes, k.health_monitor)

    def reset(self) -> None:
        """Delete everything the job wrote under this prefix."""
        with self.client.pipeline(transaction=True) as pipe:
            self._delete_all(pipe)
            pipe.delete(self.keys.alerts_resolved)
            pipe.delete(self.keys.alerts_outbox)  # kept by a rewrite (it is delivery state), not by a reset
            pipe.delete(self.keys.model_removed)  # as is what the nodes removed while no monitor decided
            pipe.execute()

    def commit(
        self,
        lineage: str,
        batch_id: int,
        changes: RouteChanges,
        alerts: Iterable[Alert] = (),
        *,
        watermark: int | None = None,
        monitor: str = "",
        replace: bool = False,
        health: HealthWrites | None = None,
        outbox: Mapping[str, bytes] | None = None,
        removals: Mapping[BrokerKey, int] | None = None,
        written: int | None = None,
    ) -> list[str]:
        """Write one batch atomically; returns the topics announced on the channel.

        ``replace`` first deletes everything under the prefix but the alerts' outbox, in the same
        transaction (a new query lineage, or catching up after a failed write; ``changes`` must then
        be full). ``outbox``: resolutions the pager has yet to deliver (:mod:`streaming.paging`).
        ``removals``: the nodes' removals (:meth:`fallback_removals`) the batch's model honoured; if
        ``P:model:removed`` holds others by the time of the write, nothing is written and
        :class:`RemovalsChanged` is raised, so that a batch that was under way while a node removed a
        broker (the job was stalled, say) never writes that broker back. ``written``: the batch of
        ``lineage`` this job wrote last, which ``changes`` are the differences from; if ``P:meta`` names
        another, nothing is written and :class:`WritesLost` is raised. Either check watches what it
        read, so a change or a failed connection before the EXEC raises :class:`StoreChanged`.
        """
        from redis.exceptions import WatchError

        k = self.keys
        now = wall_ms()
        with self.client.pipeline(transaction=True) as pipe:
            try:
                if removals is not None or (written is not None and not replace):
                    pipe.watch(k.model_removed, k.meta)
                    if removals is not None and decode_removals(pipe.hgetall(k.model_removed)) != removals:
                        raise RemovalsChanged
                    if written is not None and not replace:
                        stored = _stored_batch(pipe.hmget(k.meta, "lineage", "batchId"))
                        if stored != (lineage, written):
                            raise WritesLost(stored)
                    pipe.multi()
            except WatchError:  # the connection holding the WATCH failed
                raise StoreChanged from None
            if replace:
                self._delete_all(pipe)
            changed = queue_route_writes(pipe, k, changes)
            self._alert_writes(pipe, alerts, monitor, now, outbox)
            if health is not None:
                health.apply(pipe, k)
            # redis-py asks for a Mapping keyed by its whole union of key types (Mapping is invariant in
            # its key), which no dict[str, ...] is
            pipe.hset(k.meta, mapping=encode_meta(lineage, batch_id, now, watermark))  # type: ignore[arg-type]
            try:
                pipe.execute()
            except WatchError:
                raise StoreChanged from None
        return changed

    def _alert_writes(
        self, pipe: Any, alerts: Iterable[Alert], monitor: str, now: int, outbox: Mapping[str, bytes] | None = None
    ) -> None:
        k = self.keys
        resolved = 0
        for alert in alerts:
            if alert.state == "OPEN":
                value = encode_alert(alert, raised_by=monitor, emitted_at=now, max_topics=MAX_STORED_TOPICS)
                pipe.hset(k.alerts, alert.incident, value)
                pipe.hdel(k.alerts_outbox, alert.incident)  # an older resolution of it is moot
            else:
                pipe.hdel(k.alerts, alert.incident)
                pipe.lpush(k.alerts_resolved, encode_alert(alert, raised_by=monitor, emitted_at=now))
                resolved += 1
        if resolved:
            pipe.ltrim(k.alerts_resolved, 0, MAX_RESOLVED - 1)
        for incident, entry in (outbox or {}).items():
            pipe.hset(k.alerts_outbox, incident, entry)

    def fallback_removals(self) -> dict[BrokerKey, int]:
        """What the nodes removed while no monitor decided (``P:model:removed``), for the model to honour."""
        return decode_removals(self.client.hgetall(self.keys.model_removed))

    def write_alerts(
        self, alerts: Iterable[Alert], *, monitor: str = "", outbox: Mapping[str, bytes] | None = None
    ) -> None:
        """Alerts decided between batches (MONITOR_LAGGING)."""
        with self.client.pipeline(transaction=True) as pipe:
            self._alert_writes(pipe, alerts, monitor, wall_ms(), outbox)
            pipe.execute()


def _stored_batch(reply: list[Any]) -> tuple[str | None, int | None]:
    """(lineage, batchId) from ``HMGET P:meta lineage batchId``; None for what is missing or unreadable."""
    lineage, batch = (None if v is None else _text(v) for v in reply)
    try:
        return lineage, None if batch is None else int(batch)
    except ValueError:
        return lineage, None


# --------------------------------------------------------------------------- the reader


def _text(reply: bytes | str) -> str:
    """A reply as text, whether or not the client (which a caller may pass in) decodes responses."""
    return reply if isinstance(reply, str) else reply.decode()


class RouteLookup:
    """Read routes the job materialised: ``RouteLookup(url).get("TopicTest")``."""

    def __init__(self, redis_url: str, prefix: str = "namesrv", client: redis_clients.Client | None = None) -> None:
        self.keys = RedisKeys(prefix, hash_tag=redis_clients.is_cluster(redis_url))
        self.client = client or redis_clients.connect(redis_url)

    def get_raw(self, topic: str) -> bytes | None:
        """The route exactly as GET_ROUTEINFO_BY_TOPIC answers it (standard JSON), None if there is none."""
        # cast: the client is made without decode_responses, so replies are bytes; redis-py types them
        # for either setting
        return cast(bytes | None, self.client.get(self.keys.route(topic)))

    def get(self, topic: str) -> TopicRouteData | None:
        raw = self.get_raw(topic)
        return None if raw is None else bodies.decode_route(raw)

    def topics(self) -> list[str]:
        return sorted(_text(t) for t in self.client.smembers(self.keys.topics))

    def cluster_info(self) -> bodies.ClusterInfo | None:
        raw = cast(bytes | None, self.client.get(self.keys.cluster))  # bytes, as in get_raw
        return None if raw is None else bodies.decode_cluster_info(raw)

    def alerts(self) -> list[Alert]:
        """The incidents open now."""
        out = []
        for raw in self.client.hvals(self.keys.alerts):
            try:
                out.append(decode_alert(raw))
            except ValueError:
                continue
        return sorted(out, key=lambda a: a.incident)

    def status(self) -> dict[str, str]:
        """The job's last write: lineage, batchId, watermark, updatedAt."""
        return {_text(k): _text(v) for k, v in self.client.hgetall(self.keys.meta).items()}

    def watch(self, timeout: float | None = None) -> Iterator[str]:
        """Names of topics whose route changes, as they change; stops after ``timeout`` s of silence."""
        pubsub: Any = self.client.pubsub(ignore_subscribe_messages=True)
        sharded = self.keys.hash_tag  # a cluster's channel is sharded (SPUBLISH): SSUBSCRIBE to it
        if sharded:
            pubsub.ssubscribe(self.keys.channel)
        else:
            pubsub.subscribe(self.keys.channel)
        quiet_until = None if timeout is None else time.monotonic() + timeout
        try:
            while quiet_until is None or time.monotonic() < quiet_until:
                wait = 1.0 if quiet_until is None else max(0.0, min(1.0, quiet_until - time.monotonic()))
                if sharded:
                    message = pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=wait)
                else:
                    message = pubsub.get_message(timeout=wait)
                data = None if message is None else message.get("data")
                if isinstance(data, bytes):
                    if timeout is not None:
                        quiet_until = time.monotonic() + timeout
                    yield data.decode()
        finally:
            pubsub.close()

    def close(self) -> None:
        self.client.close()
