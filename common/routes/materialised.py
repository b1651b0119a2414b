"""The route model the streaming job keeps in Redis, and the writes that put a change of it there.

:class:`RouteModel` owns a :class:`RouteInfoManager`, the node's own route tables, fed with what the
nodes fed theirs (REGISTER, ADMIN and ORDER_TOPIC_CONF events, and EXPIRE/REMOVE decisions), so a
route written to Redis is byte for byte what a node answers; :meth:`RouteModel.changes` finds what
changed since it was last asked and :func:`queue_route_writes` queues those writes on a Redis
transaction. Two writers share it: the job after each micro-batch (``streaming/routes.py``) and a
node's fallback writer while no monitor decides (:mod:`namesrv.liveness.redis_fallback`), whose
removals the job honours (:meth:`RouteModel.apply_fallback_removals`) so that a returning monitor
neither brings a removed broker back nor removes it twice. Keys: ``docs/redis-keys.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from common.contract import AdminOp, Event, EventType, SchemaError
from common.protocol import bodies, fastjson
from common.protocol.types import DataVersion, QueueData, RegisterBrokerBody, TopicConfig, TopicRouteData
from common.redis_keys import RedisKeys, broker_field
from common.routes.manager import RouteInfoManager
from common.routes.model import RouteSettings, RouteSettingsLike
from common.routes.snapshot import ModelSnapshot, OrderConf, encode_topic_entry

#: (cluster name, broker address)
BrokerKey = tuple[str, str]


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

    def __init__(self, settings: RouteSettingsLike | None = None, *, order_message_enable: bool = False) -> None:
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
        #: brokers a node's fallback writer removed while no monitor decided -> that node's clock then
        self._removed: dict[BrokerKey, int] = {}

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
            if self._removed.get((event.cluster_name, event.broker_addr), -1) >= event.event_time:
                return  # a heartbeat from before a node removed it (a backlog replayed): not a comeback
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

    def apply_fallback_removals(self, removed: Mapping[BrokerKey, int]) -> list[BrokerKey]:
        """Remove the brokers a node's fallback writer removed (:func:`decode_removals`); returns those removed.

        A broker registered again after its removal (newer than the removal's time) stays; one not yet
        registered again stays out, and :meth:`apply_event` skips its registrations stamped no later.
        """
        out = []
        for key, at in removed.items():
            if self._removed.get(key, -1) >= at:
                continue
            self._removed[key] = at
            seen = self.manager.last_seen(*key)
            if seen is not None and seen <= at and self.apply_removal(*key, self._event_time, unclean=False):
                out.append(key)
        return out

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
        cls, snap: ModelSnapshot, settings: RouteSettingsLike | None = None, *, order_message_enable: bool = False
    ) -> RouteModel:
        """The model as a store last wrote it (:func:`common.routes.snapshot.decode_model` of its keys)."""
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


# --------------------------------------------------------------------------- the writes


def queue_route_writes(pipe: Any, keys: RedisKeys, changes: RouteChanges) -> list[str]:
    """Queue on ``pipe`` (a transaction) the writes of ``changes`` and their announcements; returns the topics announced.

    Routes, ``P:topics``, the model and the cluster info; a few variadic commands per thousand
    topics rather than four per topic: redis-py packs each command in Python, and a new lineage
    writes every topic at once.
    """
    gone = [topic for topic, route in changes.routes.items() if route is None]
    routes = {keys.route(topic): route for topic, route in changes.routes.items() if route is not None}
    for chunk in _chunks(gone):
        pipe.delete(*(keys.route(topic) for topic in chunk))
        pipe.srem(keys.topics, *chunk)
    for chunk in _chunks(list(routes.items())):
        # as a raw command: redis-py's cluster pipeline refuses its mset() method, though the keys
        # share the prefix's slot
        pipe.execute_command("MSET", *(part for pair in chunk for part in pair))
    for chunk in _chunks([topic for topic, route in changes.routes.items() if route is not None]):
        pipe.sadd(keys.topics, *chunk)
    dropped = [topic for topic, entry in changes.model_topics.items() if entry is None]
    for chunk in _chunks(dropped):
        pipe.hdel(keys.model_topics, *chunk)
    entries = [(topic, entry) for topic, entry in changes.model_topics.items() if entry is not None]
    for chunk in _chunks(entries):
        pipe.hset(keys.model_topics, mapping=dict(chunk))
    if changes.cluster is not None:
        pipe.set(keys.cluster, changes.cluster)
    if changes.model_brokers is not None:
        pipe.set(keys.model_brokers, changes.model_brokers)
    changed = sorted(changes.routes)
    # on a cluster, SPUBLISH: a sharded channel lives in the keys' slot, so it joins the transaction
    publish = "SPUBLISH" if keys.hash_tag else "PUBLISH"
    for topic in changed:
        pipe.execute_command(publish, keys.channel, topic)
    return changed


def _chunks(items: list[Any], size: int = 1000) -> Iterator[list[Any]]:
    """``items`` a thousand at a time: one command each, none of them too long for Redis to answer at once."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


def encode_removal(cluster_name: str, broker_addr: str, at: int) -> tuple[str, bytes]:
    """The ``P:model:removed`` field and value of a fallback removal at ``at`` (the node's wall clock, ms)."""
    return broker_field(cluster_name, broker_addr), str(at).encode()


def decode_removals(raw: Mapping[Any, Any]) -> dict[BrokerKey, int]:
    """``P:model:removed`` as read; an entry that is not ``cluster|addr`` -> integer is skipped."""
    out: dict[BrokerKey, int] = {}
    for name, value in raw.items():
        name = name.decode() if isinstance(name, bytes) else str(name)
        cluster, sep, addr = name.partition("|")
        try:
            at = int(value)
        except (TypeError, ValueError):
            continue
        if sep and cluster and addr:
            out[(cluster, addr)] = at
    return out


def removal_changes(
    snap: ModelSnapshot, removed: Mapping[BrokerKey, int], settings: RouteSettingsLike | None = None
) -> tuple[list[BrokerKey], RouteChanges]:
    """What a fallback writer writes: the stored model ``snap`` less the ``removed`` brokers still in it."""
    model = RouteModel.from_snapshot(snap, settings, order_message_enable=snap.order_message_enable)
    gone = model.apply_fallback_removals(removed)
    return gone, (model.changes() if gone else RouteChanges())
