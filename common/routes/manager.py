"""The route tables behind one lock: the only way into them from outside ``common/routes/``.

:class:`RouteInfoManager` keeps RocketMQ's name and its public operations but holds no logic: the
tables are plain data (:mod:`common.routes.tables`), every operation is a function of one concern
module, and each method here takes the lock, calls one of them, and returns a value that shares
nothing mutable with the tables.  On a node exactly two threads use the tables: the event loop and
the node's one worker thread, which applies large registrations, batched unregistrations and the
expiry scan's removals so that they do not stall the loop.  One ``threading.Lock`` makes each
operation atomic against the other thread; it is never held across I/O or an ``await``, and no
method calls another while holding it, so it need not be re-entrant.  ``version`` is read without
it: an int that only grows.  ``tests/unit/test_routes_boundary.py`` keeps everyone else out of the
tables; ``docs/internals/routes.md`` has the rest.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping

from common.protocol.types import BrokerData, DataVersion, QueueData, RegisterBrokerBody, TopicRouteData
from common.routes import admin, provisional, queries, register, snapshot, unregister
from common.routes.model import (
    ProvisionalStats,
    RegisterBrokerResult,
    Registration,
    RouteCounts,
    RouteHealth,
    RouteSettingsLike,
    UnregisterOutcome,
    UnregisterRequest,
)
from common.routes.snapshot import ModelSnapshot, OrderConf
from common.routes.tables import RouteTables

__all__ = ["RouteInfoManager", "RouteSettingsLike", "UnregisterRequest", "monotonic_ms"]


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class RouteInfoManager:
    def __init__(self, settings: RouteSettingsLike, now_ms: Callable[[], int] = monotonic_ms) -> None:
        #: read at use time: UPDATE_NAMESRV_CONFIG may change it
        self.settings = settings
        self.now_ms = now_ms
        self._lock = threading.Lock()
        self._tables = RouteTables()

    # ------------------------------------------------------------------ counters

    @property
    def version(self) -> int:
        """Bumped on every change a route, cluster-info or topic-list answer can show (read lock-free)."""
        return self._tables.version

    def next_seq(self) -> int:
        """A number newer than every registration, heartbeat or decision so far."""
        with self._lock:
            return self._tables.next_seq()

    # ------------------------------------------------------------------ registration and heartbeats

    def register_broker(
        self,
        cluster_name: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str | None,
        zone_name: str | None = None,
        timeout_millis: int | None = None,
        enable_acting_master: bool | None = None,
        body: RegisterBrokerBody | None = None,
        channel: Hashable | None = None,
        heard_at_ms: int | None = None,
    ) -> RegisterBrokerResult | None:
        """Apply one REGISTER_BROKER (spec §3.2); None only for the single-topic guard (see :mod:`.register`).

        ``heard_at_ms``, here and in the heartbeats' methods: when the broker was heard, if not now (a node
        catching up after it stood still, :meth:`namesrv.liveness.MonitorWatchdog.heard_at_ms`)."""
        reg = Registration(cluster_name, broker_addr, broker_name, broker_id, ha_server_addr, zone_name,
                           timeout_millis, enable_acting_master, body, channel)  # fmt: skip
        with self._lock:
            return register.register_broker(self._tables, self.settings, self._heard_ms(heard_at_ms), reg)

    def touch(self, cluster_name: str, broker_addr: str, heard_at_ms: int | None = None) -> DataVersion | None:
        """Refresh a live entry and return the DataVersion it holds (None: not registered).

        QUERY_DATA_VERSION needs both, and one lock acquisition is cheaper than two on that hot path.
        """
        with self._lock:
            return register.touch(self._tables, cluster_name, broker_addr, self._heard_ms(heard_at_ms))

    def touch_each(
        self, brokers: Iterable[tuple[str, str]], heard_at_ms: int | None = None
    ) -> list[DataVersion | None]:
        """:meth:`touch` each (cluster, address) in turn, under one lock acquisition."""
        with self._lock:
            t, now_ms = self._tables, self._heard_ms(heard_at_ms)
            return [register.touch(t, cluster_name, broker_addr, now_ms) for cluster_name, broker_addr in brokers]

    def _heard_ms(self, heard_at_ms: int | None) -> int:
        """When a registration or heartbeat counts as heard: ``heard_at_ms`` if given, else now."""
        return self.now_ms() if heard_at_ms is None else heard_at_ms

    def data_version(self, cluster_name: str, broker_addr: str) -> DataVersion | None:
        """The DataVersion :meth:`touch` would return, without refreshing anything."""
        with self._lock:
            return register.held_data_version(self._tables, cluster_name, broker_addr)

    def update_broker_info_update_timestamp(
        self, cluster_name: str, broker_addr: str, heard_at_ms: int | None = None
    ) -> bool:
        """A heartbeat (904, 322): refresh a live entry; False if the broker is not registered."""
        return self.touch(cluster_name, broker_addr, heard_at_ms) is not None

    # ------------------------------------------------------------------ unregistration and expiry

    def unregister_brokers(self, requests: Iterable[UnregisterRequest]) -> UnregisterOutcome:
        """Apply a batch of unregistrations at once (spec §3.4), skipping stale ones."""
        with self._lock:
            return unregister.unregister_brokers(self._tables, self.settings, requests)

    def build_unregister_request(self, cluster_name: str, broker_addr: str) -> UnregisterRequest | None:
        """The request that removes a live (cluster, addr), decided now; None if it is not live."""
        with self._lock:
            return unregister.build_unregister_request(self._tables, cluster_name, broker_addr)

    def on_channel_destroy(self, channel: Hashable | None, *, wait: bool = True) -> list[UnregisterRequest] | None:
        """Requests removing every broker registered on ``channel`` (not applied).

        Without ``wait``, None when the tables are busy (see :meth:`expire_inactive`).
        """
        if channel is None:
            return []
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            return unregister.on_channel_destroy(self._tables, channel)
        finally:
            self._lock.release()

    def expire_inactive(
        self, *, wait: bool = True, grace_ms: int = 0, kept_through: int | None = None
    ) -> UnregisterOutcome | None:
        """Remove every broker silent past its timeout; the outcome's ``removed_channels`` are for the caller to close.

        ``grace_ms``: only those past it by more than that; ``kept_through`` (this manager's clock): not
        those whose deadline is at or before it.  Without ``wait``, None when the tables are busy
        (another thread is changing them).  A node runs its scan on the worker thread, where waiting
        stalls no client (``liveness.ExpiryScan``).
        """
        if not self._lock.acquire(blocking=wait):
            return None
        try:
            t = self._tables
            requests = unregister.scan_not_active_broker(t, self.now_ms() - grace_ms, kept_through=kept_through)
            return unregister.unregister_brokers(t, self.settings, requests)
        finally:
            self._lock.release()

    def live_and_overdue(self) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        """(cluster, address) of every live broker, and of those among them past their deadline; changes nothing."""
        with self._lock:
            t = self._tables
            return set(t.broker_live_table), set(unregister.overdue_brokers(t, self.now_ms()))

    # ------------------------------------------------------------------ provisional entries (warm start)

    def load_provisional(self, snap: ModelSnapshot) -> RouteCounts:
        """Fill the empty tables from a snapshot, every live entry provisional; what they then hold."""
        with self._lock:
            provisional.load_provisional(self._tables, self.now_ms(), snap)
            return queries.counts(self._tables)

    def is_provisional(self, cluster_name: str, broker_addr: str) -> bool:
        with self._lock:
            return queries.is_provisional(self._tables, cluster_name, broker_addr)

    def next_provisional_deadline(self) -> int | None:
        """``now_ms()`` after which the earliest unconfirmed entry is dropped; None when none is left."""
        with self._lock:
            return provisional.next_provisional_deadline(self._tables)

    def drop_unconfirmed_provisional(self) -> UnregisterOutcome:
        """Remove provisional entries whose broker did not register within their timeout."""
        with self._lock:
            return provisional.drop_unconfirmed_provisional(self._tables, self.settings, self.now_ms())

    @property
    def provisional_stats(self) -> ProvisionalStats:
        """How many provisional entries were loaded, confirmed and dropped so far (a copy)."""
        with self._lock:
            return dataclasses.replace(self._tables.provisional_stats)

    # ------------------------------------------------------------------ reads

    def pickup_topic_route_data(self, topic: str) -> TopicRouteData | None:
        """The route of ``topic`` (spec §3.6), or None for TOPIC_NOT_EXIST; ``order_topic_conf`` is left unset."""
        with self._lock:
            return queries.pickup_topic_route_data(self._tables, topic, self.settings.support_acting_master)

    def get_all_cluster_info(self) -> tuple[dict[str, BrokerData], dict[str, set[str]]]:
        with self._lock:
            return queries.get_all_cluster_info(self._tables)

    def get_broker_member_group(self, cluster_name: str, broker_name: str) -> BrokerData:
        with self._lock:
            return queries.get_broker_member_group(self._tables, cluster_name, broker_name)

    def get_all_topic_list(self) -> list[str]:
        with self._lock:
            return queries.get_all_topic_list(self._tables)

    def get_topics_by_cluster(self, cluster_name: str) -> list[str]:
        with self._lock:
            return queries.get_topics_by_cluster(self._tables, cluster_name)

    def get_system_topic_list(self) -> tuple[list[str], str | None]:
        with self._lock:
            return queries.get_system_topic_list(self._tables)

    def get_unit_topics(self) -> list[str]:
        with self._lock:
            return queries.get_unit_topics(self._tables)

    def get_has_unit_sub_topic_list(self) -> list[str]:
        with self._lock:
            return queries.get_has_unit_sub_topic_list(self._tables)

    def get_has_unit_sub_ununit_topic_list(self) -> list[str]:
        with self._lock:
            return queries.get_has_unit_sub_ununit_topic_list(self._tables)

    def last_seen(self, cluster_name: str, broker_addr: str) -> int | None:
        """``now_ms()`` of the latest registration or heartbeat; None if not live."""
        with self._lock:
            return queries.last_seen(self._tables, cluster_name, broker_addr)

    def live_channels(self, brokers: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Hashable | None]:
        """The live ones (registered or provisional) among the (cluster, address) pairs, with their channels."""
        with self._lock:
            return queries.live_channels(self._tables, brokers)

    def zone_of(self, broker_name: str) -> str | None:
        """The zone the group's latest registration named; None for an unknown group."""
        with self._lock:
            return queries.zone_of(self._tables, broker_name)

    def counts(self) -> RouteCounts:
        """How many brokers, groups, clusters and topics the tables hold."""
        with self._lock:
            return queries.counts(self._tables)

    # ------------------------------------------------------------------ admin writes

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        """Clear PERM_WRITE on every queue of ``broker_name``; returns how many topics it has."""
        with self._lock:
            return admin.wipe_write_perm_of_broker(self._tables, broker_name)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        """Set perm to READ|WRITE outright (drops INHERIT/PRIORITY, as Java); returns the topic count."""
        with self._lock:
            return admin.add_write_perm_of_broker(self._tables, broker_name)

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> bool:
        """Drop a topic, or only its queues on ``cluster_name``'s brokers; True if anything went."""
        with self._lock:
            return admin.delete_topic(self._tables, topic, cluster_name)

    def register_topic(self, topic: str, queue_datas: Iterable[QueueData]) -> bool:
        """REGISTER_TOPIC_IN_NAMESRV (see :func:`common.routes.admin.register_topic`)."""
        with self._lock:
            return admin.register_topic(self._tables, topic, queue_datas)

    # ------------------------------------------------------------------ the streaming job's model

    def groups_with_member(self, cluster_name: str, broker_addr: str) -> set[str]:
        with self._lock:
            return queries.groups_with_member(self._tables, cluster_name, broker_addr)

    def topics_served_by(self, groups: set[str]) -> set[str]:
        with self._lock:
            return queries.topics_served_by(self._tables, groups)

    def topic_queues(self, topics: Iterable[str]) -> dict[str, dict[str, QueueData]]:
        """The rows of each of ``topics`` that has any (copies)."""
        with self._lock:
            return queries.topic_queues(self._tables, topics)

    def route_health(self, topics: Iterable[str]) -> RouteHealth:
        """Masterless groups, unwritable topics, and which of ``topics`` have no route (copies)."""
        with self._lock:
            return queries.route_health(self._tables, topics)

    def encode_model_brokers(
        self, order_topic_conf: Mapping[str, OrderConf] | None = None, order_message_enable: bool = False
    ) -> bytes:
        """The ``P:model:brokers`` value of these tables (:mod:`common.routes.snapshot`)."""
        with self._lock:
            return snapshot.encode_brokers(self._tables, order_topic_conf or {}, order_message_enable)

    def restore(self, snap: ModelSnapshot) -> None:
        """Fill the empty tables with an exact copy of ``snap`` (the job's model after a restart)."""
        with self._lock:
            snapshot.restore(self._tables, snap)
