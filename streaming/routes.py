"""Topic routes and cluster info in Redis: the model the job keeps, its store, and a lookup client.

:class:`RouteModel` owns a :class:`namesrv.routes.RouteInfoManager`, the node's own route tables,
fed with what the nodes fed theirs (REGISTER, ADMIN and ORDER_TOPIC_CONF events, and the job's own
EXPIRE/REMOVE actions), so a route read from Redis is byte for byte what a node answers; when nodes
disagree the newest event wins.  After each micro-batch :meth:`RouteModel.changes` finds what the
batch could have changed, and :class:`RedisRouteStore` writes the differences, the model, the open
alerts and the batch id in one MULTI/EXEC with the change notifications, skipping a batch already
written, so readers never see half a batch and a replay changes nothing.  :class:`RouteLookup` is
the reader side (``namesrv-monitor routes get|watch``).  The keys are documented in ``docs/redis-keys.md``;
``docs/internals/routes.md`` has how the model is kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from common import redis_clients
from common.redis_keys import RedisKeys
from namesrv.events.schema import AdminOp, Event, EventType, SchemaError, wall_ms
from namesrv.protocol import bodies, fastjson
from namesrv.protocol.types import DataVersion, QueueData, RegisterBrokerBody, TopicConfig, TopicRouteData
from namesrv.routes import RouteInfoManager, RouteSettings
from namesrv.routes.snapshot import ModelSnapshot, OrderConf, decode_model, encode_meta, encode_topic_entry
from streaming.alerts import MAX_STORED_TOPICS, Alert, decode_alert, encode_alert
from streaming.health import MAX_RESOLVED, BrokerHealth, HealthWrites, NodeHealth, load_entries

log = logging.getLogger(__name__)

__all__ = ["OrderConf", "RedisKeys", "RedisRouteStore", "RouteChanges", "RouteLookup", "RouteModel", "StoredState"]


# --------------------------------------------------------------------------- the model


@dataclass
class RouteChanges:
    """What one batch changed, ready to be written."""

    #: topic -> new route bytes, or None when the topic has no route any more
    routes: dict[str, bytes | None] = field(default_factory=dict)
    #: topic -> new model entry, or None when the topic left the model
    model_topics: dict[str, bytes | None] = field(default_factory=dict)
    cluster: bytes | None = None
    model_brokers: bytes | None = None
    #: topics gone because their last broker expired or dropped its connection
    lost_topics: set[str] = field(default_factory=set)
    #: the same topics by the group lost with them: (cluster, broker name) -> topics
    lost_by_group: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    #: topics an admin deleted in this batch
    deleted_topics: set[str] = field(default_factory=set)

    @property
    def empty(self) -> bool:
        return not (self.routes or self.model_topics or self.cluster is not None or self.model_brokers is not None)


def _register_body(event: Event) -> RegisterBrokerBody:
    dv = event.data_version
    topics = {
        name: TopicConfig(
            topic_name=name,
            read_queue_nums=q.read_queue_nums,
            write_queue_nums=q.write_queue_nums,
            perm=q.perm,
            topic_sys_flag=q.topic_sys_flag,
        )
        for name, q in (event.topics or {}).items()
    }
    filters = event.filter_server_list
    return RegisterBrokerBody(
        data_version=DataVersion(dv.counter, dv.state_version, dv.timestamp) if dv else DataVersion(),
        topic_config_table=topics,
        # None (an event from a node that predates the field) leaves the table alone, as an
        # ancient broker's registration does
        filter_server_list=None if filters is None else list(filters),
        topic_queue_mapping_info_map=_mappings(event.topic_queue_mapping_info_map or {}),
    )


def _mappings(texts: Mapping[str, str]) -> dict[str, Any]:
    out = {}
    for topic, text in texts.items():
        try:
            out[topic] = fastjson.loads(text)
        except fastjson.FastjsonError as exc:
            raise SchemaError(f"event.topicQueueMappingInfoMap[{topic!r}]: not JSON ({exc})") from None
    return out


class RouteModel:
    """The node's route tables, driven by events and the job's removal actions."""

    def __init__(self, settings: RouteSettings | None = None, *, order_message_enable: bool = False) -> None:
        self._event_time = 0
        self.manager = RouteInfoManager(settings or RouteSettings(), now_ms=lambda: self._event_time)
        #: the nodes' orderMessageEnable: routes carry their topic's orderTopicConf
        self.order_message_enable = order_message_enable
        #: topic -> its newest ORDER_TOPIC_CONF, deletions included (so an older put cannot
        #: bring a deleted entry back); kept whatever the switch, so turning it on needs no replay
        self._order_confs: dict[str, OrderConf] = {}
        #: what was last written, to find differences
        self._routes: dict[str, bytes] = {}
        self._entries: dict[str, bytes] = {}
        #: the broker groups of each written entry
        self._entry_groups: dict[str, frozenset[str]] = {}
        self._cluster: bytes | None = None
        self._brokers: bytes | None = None
        self._touched_groups: set[str] = set()
        self._touched_topics: set[str] = set()
        #: groups removed uncleanly in this batch -> their cluster
        self._unclean_groups: dict[str, str] = {}
        self._deleted: set[str] = set()
        #: anything applied since the last :meth:`changes`: without it, the cluster info and the brokers
        #: snapshot are what was last written (encoding them is costly with many brokers, and most
        #: batches carry heartbeats only)
        self._dirty = False

    # -- applying

    def apply_event(self, event: Event) -> None:
        """A REGISTER, ADMIN or ORDER_TOPIC_CONF event, as the node that reported it applied it.

        Nodes can disagree about a topic's order conf (one missed a PUT_KV_CONFIG while it was
        down, or an admin changed one node only): the report with the newest event time wins,
        ties going to the larger (node, seq), and a deletion is a report like any other. A
        route in Redis then shows the value most recently set at any node.
        """
        self._event_time = event.event_time
        self._dirty = True
        m = self.manager
        if event.type is EventType.REGISTER:
            assert event.cluster_name and event.broker_addr and event.broker_name is not None
            self._touched_groups |= self.manager.groups_with_member(event.cluster_name, event.broker_addr) | {
                event.broker_name
            }
            body = _register_body(event)
            # a mapping may name a topic the registering group does not serve
            self._touched_topics |= set(body.topic_queue_mapping_info_map)
            m.register_broker(
                event.cluster_name,
                event.broker_addr,
                event.broker_name,
                int(event.broker_id or 0),
                event.ha_server_addr,
                zone_name=event.zone_name,
                timeout_millis=event.heartbeat_timeout_millis,
                enable_acting_master=event.enable_acting_master,
                body=body,
            )
        elif event.type is EventType.ADMIN:
            op = event.op
            if op is AdminOp.WIPE_WRITE_PERM and event.broker_name:
                self._touched_groups.add(event.broker_name)
                m.wipe_write_perm_of_broker(event.broker_name)
            elif op is AdminOp.ADD_WRITE_PERM and event.broker_name:
                self._touched_groups.add(event.broker_name)
                m.add_write_perm_of_broker(event.broker_name)
            elif op is AdminOp.DELETE_TOPIC and event.topic:
                self._touched_topics.add(event.topic)
                if m.delete_topic(event.topic, event.cluster_name or None):
                    self._deleted.add(event.topic)
            elif op is AdminOp.REGISTER_TOPIC and event.topic:
                self._touched_topics.add(event.topic)
                m.register_topic(
                    event.topic,
                    [
                        QueueData(q.broker_name, q.queues.read_queue_nums, q.queues.write_queue_nums, q.queues.perm,
                                  q.queues.topic_sys_flag)
                        for q in event.queue_datas or []
                    ],
                )  # fmt: skip
        elif event.type is EventType.ORDER_TOPIC_CONF:
            assert event.topic is not None  # decode_event requires it
            self._apply_order_conf(
                event.topic, OrderConf(event.order_topic_conf, event.event_time, event.node, event.seq)
            )
        else:
            raise ValueError(f"the route model takes REGISTER, ADMIN and ORDER_TOPIC_CONF events, not {event.type}")

    def _apply_order_conf(self, topic: str, conf: OrderConf) -> None:
        held = self._order_confs.get(topic)
        if held is not None and held.stamp >= conf.stamp:
            return  # an older report (another node's, or a late one), or the same one again
        self._order_confs[topic] = conf
        self._touched_topics.add(topic)
        self._dirty = True

    def apply_removal(self, cluster_name: str, broker_addr: str, event_time: int, *, unclean: bool) -> bool:
        """An EXPIRE or REMOVE, as a node applies it; True when the broker was there to remove.

        ``unclean`` (expiry, lost connection) makes topics left without any broker count as lost.
        """
        self._event_time = event_time
        self._dirty = True
        m = self.manager
        groups = self.manager.groups_with_member(cluster_name, broker_addr)
        self._touched_groups |= groups
        request = m.build_unregister_request(cluster_name, broker_addr)
        if request is None:
            return False
        outcome = m.unregister_brokers([request])
        if unclean:
            self._unclean_groups.update(dict.fromkeys(outcome.removed_brokers, cluster_name))
        return bool(outcome.applied)

    # -- reading

    def route(self, topic: str, encoded: dict[bytes, bytes] | None = None) -> bytes | None:
        """What GET_ROUTEINFO_BY_TOPIC answers for ``topic`` (standard dialect), None for TOPIC_NOT_EXIST.

        ``encoded``: answers already made in this pass (see :func:`bodies.encode_route`).
        """
        route: TopicRouteData | None = self.manager.pickup_topic_route_data(topic)
        if route is None:
            return None
        if self.order_message_enable:  # as the node's handler: only topics with a route
            route.order_topic_conf = self.order_topic_conf(topic)
        return bodies.encode_route(route, standard=True, made=encoded)

    def order_topic_conf(self, topic: str) -> str | None:
        """The topic's ORDER_TOPIC_CONFIG value as last reported, whatever the switch."""
        held = self._order_confs.get(topic)
        return None if held is None else held.conf

    def cluster_info(self) -> bytes:
        return bodies.encode_cluster_info(*self.manager.get_all_cluster_info())

    def topics(self) -> list[str]:
        return self.manager.get_all_topic_list()

    def _brokers_snapshot(self) -> bytes:
        return self.manager.encode_model_brokers(self._order_confs, self.order_message_enable)

    # -- differences

    def changes(self, *, full: bool = False) -> RouteChanges:
        """Differences from what was last taken by :meth:`changes`; ``full`` re-checks every topic."""
        m = self.manager
        groups = self._touched_groups
        if full:
            candidates = set(m.get_all_topic_list()) | set(self._entries)
        else:
            candidates = set(self._touched_topics)
            if groups:
                candidates |= m.topics_served_by(groups)
                candidates |= {t for t, names in self._entry_groups.items() if not groups.isdisjoint(names)}
        rows = m.topic_queues(candidates)
        out = RouteChanges()
        encoded: dict[bytes, bytes] = {}
        for topic in sorted(candidates):
            qmap = rows.get(topic)
            entry = encode_topic_entry(qmap) if qmap else None
            if entry != self._entries.get(topic):
                out.model_topics[topic] = entry
            route = self.route(topic, encoded)
            if route != self._routes.get(topic):
                out.routes[topic] = route
            if qmap is None and topic in self._entries and topic not in self._deleted:
                for group in self._entry_groups[topic] & self._unclean_groups.keys():
                    out.lost_topics.add(topic)
                    out.lost_by_group.setdefault((self._unclean_groups[group], group), set()).add(topic)
        if full or self._dirty or self._cluster is None:
            cluster = self.cluster_info()
            if cluster != self._cluster:
                out.cluster = cluster
        if full or self._dirty or self._brokers is None:
            brokers = self._brokers_snapshot()
            if brokers != self._brokers:
                out.model_brokers = brokers
        out.deleted_topics = set(self._deleted)
        self._commit(out, rows)
        return out

    def _commit(self, out: RouteChanges, rows: Mapping[str, Mapping[str, QueueData]]) -> None:
        for topic, entry in out.model_topics.items():
            if entry is None:
                self._entries.pop(topic, None)
                self._entry_groups.pop(topic, None)
            else:
                self._entries[topic] = entry
                self._entry_groups[topic] = frozenset(rows[topic])
        for topic, route in out.routes.items():
            if route is None:
                self._routes.pop(topic, None)
            else:
                self._routes[topic] = route
        if out.cluster is not None:
            self._cluster = out.cluster
        if out.model_brokers is not None:
            self._brokers = out.model_brokers
        self._touched_groups = set()
        self._touched_topics = set()
        self._unclean_groups = {}
        self._deleted = set()
        self._dirty = False

    def forget_written(self) -> None:
        """Assume nothing was written: the next ``changes(full=True)`` covers every topic."""
        self._routes, self._entries, self._entry_groups = {}, {}, {}
        self._cluster = self._brokers = None

    # -- persistence

    @classmethod
    def from_snapshot(
        cls, snap: ModelSnapshot, settings: RouteSettings | None = None, *, order_message_enable: bool = False
    ) -> RouteModel:
        """The model as a store last wrote it (:func:`namesrv.routes.snapshot.decode_model` of its keys)."""
        model = cls(settings, order_message_enable=order_message_enable)
        m = model.manager
        m.restore(snap)
        model._order_confs = dict(snap.order_topic_conf)
        model.order_message_enable = snap.order_message_enable
        # what the store holds is what was last written
        rows = m.topic_queues(m.get_all_topic_list())
        model._entries = {t: encode_topic_entry(q) for t, q in rows.items()}
        model._entry_groups = {t: frozenset(q) for t, q in rows.items()}
        encoded: dict[bytes, bytes] = {}
        model._routes = {t: r for t in rows if (r := model.route(t, encoded)) is not None}
        model._cluster = model.cluster_info()
        model._brokers = model._brokers_snapshot()
        if model.order_message_enable != order_message_enable:
            # the stored routes were built with the other setting: their order confs come or go
            model.order_message_enable = order_message_enable
            model._touched_topics |= set(model._order_confs)
            model._dirty = True  # the brokers snapshot records the switch
        return model


# --------------------------------------------------------------------------- the store


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
                alerts[incident.decode()] = decode_alert(raw)
            except ValueError:
                log.warning("redis: ignoring malformed alert %r", incident)
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
    ) -> list[str]:
        """Write one batch atomically; returns the topics announced on the channel.

        ``replace`` first deletes everything under the prefix but the alerts' outbox, in the same
        transaction (a new query lineage, or catching up after a failed write; ``changes`` must then
        be full). ``outbox``: resolutions the pager has yet to deliver (:mod:`streaming.paging`).
        """
        k = self.keys
        now = wall_ms()
        changed = sorted(changes.routes)
        with self.client.pipeline(transaction=True) as pipe:
            if replace:
                self._delete_all(pipe)
            # a few variadic commands per thousand topics rather than four per topic: redis-py packs
            # each command in Python, and a new lineage writes every topic at once
            gone = [topic for topic, route in changes.routes.items() if route is None]
            routes = {k.route(topic): route for topic, route in changes.routes.items() if route is not None}
            for chunk in _chunks(gone):
                pipe.delete(*(k.route(topic) for topic in chunk))
                pipe.srem(k.topics, *chunk)
            for chunk in _chunks(list(routes.items())):
                # as a raw command: redis-py's cluster pipeline refuses its mset() method, though the
                # keys share the prefix's slot
                pipe.execute_command("MSET", *(part for pair in chunk for part in pair))
            for chunk in _chunks([topic for topic, route in changes.routes.items() if route is not None]):
                pipe.sadd(k.topics, *chunk)
            dropped = [topic for topic, entry in changes.model_topics.items() if entry is None]
            for chunk in _chunks(dropped):
                pipe.hdel(k.model_topics, *chunk)
            entries = [(topic, entry) for topic, entry in changes.model_topics.items() if entry is not None]
            for chunk in _chunks(entries):
                pipe.hset(k.model_topics, mapping=dict(chunk))
            if changes.cluster is not None:
                pipe.set(k.cluster, changes.cluster)
            if changes.model_brokers is not None:
                pipe.set(k.model_brokers, changes.model_brokers)
            self._alert_writes(pipe, alerts, monitor, now, outbox)
            if health is not None:
                health.apply(pipe, k)
            # redis-py asks for a Mapping keyed by its whole union of key types (Mapping is invariant in
            # its key), which no dict[str, ...] is
            pipe.hset(k.meta, mapping=encode_meta(lineage, batch_id, now, watermark))  # type: ignore[arg-type]
            # on a cluster, SPUBLISH: a sharded channel lives in the keys' slot, so it joins the transaction
            publish = "SPUBLISH" if k.hash_tag else "PUBLISH"
            for topic in changed:
                pipe.execute_command(publish, k.channel, topic)
            pipe.execute()
        return changed

    def _alert_writes(
        self, pipe: Any, alerts: Iterable[Alert], monitor: str, now: int, outbox: Mapping[str, bytes] | None = None
    ) -> None:
        k = self.keys
        resolved = 0
        for alert in alerts:
            if alert.state == "OPEN":
                value = encode_alert(alert, monitor=monitor, emitted_at=now, max_topics=MAX_STORED_TOPICS)
                pipe.hset(k.alerts, alert.incident, value)
                pipe.hdel(k.alerts_outbox, alert.incident)  # an older resolution of it is moot
            else:
                pipe.hdel(k.alerts, alert.incident)
                pipe.lpush(k.alerts_resolved, encode_alert(alert, monitor=monitor, emitted_at=now))
                resolved += 1
        if resolved:
            pipe.ltrim(k.alerts_resolved, 0, MAX_RESOLVED - 1)
        for incident, entry in (outbox or {}).items():
            pipe.hset(k.alerts_outbox, incident, entry)

    def write_alerts(
        self, alerts: Iterable[Alert], *, monitor: str = "", outbox: Mapping[str, bytes] | None = None
    ) -> None:
        """Alerts decided between batches (MONITOR_LAGGING)."""
        with self.client.pipeline(transaction=True) as pipe:
            self._alert_writes(pipe, alerts, monitor, wall_ms(), outbox)
            pipe.execute()


# --------------------------------------------------------------------------- the reader


def _chunks(items: list[Any], size: int = 1000) -> Iterator[list[Any]]:
    """``items`` a thousand at a time: one command each, none of them too long for Redis to answer at once."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


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
