"""The route tables (RocketMQ's ``RouteInfoManager``) and every operation on them.

Theory of operation
-------------------
Six tables, named as in RocketMQ:

* ``topic_queue_table``   topic -> broker name -> QueueData (frozen; replaced, never mutated)
* ``broker_addr_table``   broker name -> BrokerData (group membership, id -> addr; 0 is master)
* ``cluster_addr_table``  cluster -> set of broker names
* ``broker_live_table``   BrokerAddrInfo(cluster, addr) -> BrokerLiveInfo
* ``filter_server_table`` BrokerAddrInfo -> filter server addresses
* ``topic_queue_mapping_info_table`` topic -> bname -> static-topic mapping JSON

Locking: one ``threading.RLock`` guards all six tables and the counters.  Every public method
takes it for its whole duration and private ``_helpers`` assume it is held.  The asyncio server
calls from its loop thread and the Kafka action consumer from another thread; holding the lock
never spans I/O (notifications are returned, not sent).  Reads return copies of mutable parts
(BrokerData) and share immutable ones (QueueData, DataVersion), so callers encode outside the lock.

``version`` is bumped on every change that can alter a route, cluster-info or topic-list answer,
never on a pure heartbeat or an unchanged re-registration, so answers can be cached by it.

Fencing unregistrations (apache/rocketmq#11043)
-----------------------------------------------
Java decides an unregistration (UNREGISTER_BROKER, channel close, expiry) and applies it later
from a queue; a broker that re-registered in between is wiped.  Here every decision carries
``decided_seq = next_seq()`` and every registration and heartbeat stamps the live entry with a
newer sequence number.  A request is skipped when the live entry's ``refreshed_seq`` is newer than
the decision.  Heartbeats count too: a broker that proved it is alive after the decision is not
removed.

Java also removes *every* id mapped to the address, ignoring the request's broker id, so a queued
slave unregister removes a master that re-registered at the same address as id 0.  Here, when the
address is in the group under an id other than the request's, the request is skipped as
``ROLE_CHANGED``: the address now plays a role the decision was not about.  (An address appears at
most once per group, because registration removes its other ids.)  When the address is not in the
group, the live entry and filter servers are still removed, as in Java.

Deviations from Java, all deliberate: requests for a live broker that belongs to no group of its
cluster (possible when a group's fixed cluster differs from the registering one) remove the live
entry instead of leaving it to be re-expired forever; the acting-master wipe on unregister skips
groups no longer in ``broker_addr_table`` (Java would throw and abort the batch).

Provisional entries (warm start, :mod:`namesrv.warmstart`)
---------------------------------------------------------
:meth:`load_provisional` fills empty tables from a snapshot taken elsewhere (the streaming job's
model in Redis), so routes are answered before the brokers register.  Until a broker's own
REGISTER_BROKER arrives, its live entry is *provisional*: it answers clients but never brokers, as
if the broker had not registered here yet.  QUERY_DATA_VERSION and heartbeats find no entry (so a
broker is told to register even when its DataVersion equals the copied one), a provisional holder
never wins the stateVersion conflict check, and a slave is not told a provisional master's address.
The first registration of a group's master (or prime slave) rewrites that group's topic rows in
full and drops the copied rows its table no longer has, whatever the DataVersions say.  The expiry
scan skips provisional entries: :meth:`drop_unconfirmed_provisional` removes those still
unconfirmed one heartbeat timeout after loading, even while the monitor has the scan switched off.
Copied filter servers belong to their entry: the broker's registration replaces them (an empty
list removes them) and every drop removes them.  Copied static-topic mappings follow the ordinary
rules: registrations overwrite them and nothing removes them (spec §3.4).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from namesrv.protocol.codes import (
    DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS,
    MASTER_ID,
    SYNC_BROKER_MEMBER_GROUP_PREFIX,
    Perm,
    TopicSysFlag,
)
from namesrv.protocol.types import BrokerData, DataVersion, QueueData, RegisterBrokerBody, TopicConfig, TopicRouteData
from namesrv.routes.model import (
    BrokerAddrInfo,
    BrokerLiveInfo,
    FencedRequest,
    FenceReason,
    MinBrokerIdChange,
    RegisterBrokerResult,
    UnregisterOutcome,
    UnregisterRequest,
)

log = logging.getLogger(__name__)

_WRITE = int(Perm.WRITE)
_NOT_WRITE = ~_WRITE
_READ_WRITE = int(Perm.READ | Perm.WRITE)
_UNIT = int(TopicSysFlag.UNIT)
_UNIT_SUB = int(TopicSysFlag.UNIT_SUB)
_EMPTY_BODY = RegisterBrokerBody()


class RouteSettingsLike(Protocol):
    support_acting_master: bool
    delete_topic_with_broker_registration: bool
    notify_min_broker_id_changed: bool


class ProvisionalBroker(NamedTuple):
    """A live broker as a snapshot recorded it, for :meth:`RouteInfoManager.load_provisional`."""

    #: the broker's own heartbeat timeout; None = DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
    timeout_millis: int | None
    data_version: DataVersion
    ha_server_addr: str | None
    #: the filter servers its last registration listed
    filter_servers: tuple[str, ...] = ()


@dataclass(slots=True)
class ProvisionalStats:
    """What became of the provisional entries: each loaded one is confirmed or dropped once."""

    loaded: int = 0
    #: replaced by the broker's own registration
    confirmed: int = 0
    #: removed unconfirmed: deadline passed, or an unregistration / monitor action removed it
    dropped: int = 0


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _notify_targets(addrs: dict[int, str], offline_addr: str | None) -> tuple[str, ...]:
    # a departure tells everyone left; an arrival tells everyone but the new minimum (a group of one
    # is told anyway).  Ascending ids, the order Java's HashMap<Long, String> yields small ids in.
    ids = sorted(addrs)
    if offline_addr is None and len(ids) > 1:
        ids = ids[1:]
    return tuple(addrs[i] for i in ids)


def _with_perm(qd: QueueData, perm: int) -> QueueData:
    return QueueData(qd.broker_name, qd.read_queue_nums, qd.write_queue_nums, perm, qd.topic_sys_flag)


def _min_change(name: str, addrs: dict[int, str], offline: str | None, ha: str | None) -> MinBrokerIdChange:
    low = min(addrs)
    return MinBrokerIdChange(name, low, addrs[low], offline, ha, _notify_targets(addrs, offline))


class RouteInfoManager:
    def __init__(self, settings: RouteSettingsLike, now_ms: Callable[[], int] = monotonic_ms) -> None:
        self.settings = settings
        self.now_ms = now_ms
        self.lock = threading.RLock()
        self.topic_queue_table: dict[str, dict[str, QueueData]] = {}
        self.broker_addr_table: dict[str, BrokerData] = {}
        self.cluster_addr_table: dict[str, set[str]] = {}
        self.broker_live_table: dict[BrokerAddrInfo, BrokerLiveInfo] = {}
        self.filter_server_table: dict[BrokerAddrInfo, list[str]] = {}
        self.topic_queue_mapping_info_table: dict[str, dict[str, Any]] = {}
        self._version = 0
        self._seq = 0
        #: live entries loaded by warm start that no registration of their broker confirmed yet
        self._provisional: set[BrokerAddrInfo] = set()
        #: broker groups whose topic rows were loaded and not yet rewritten by their own broker
        self._provisional_groups: set[str] = set()
        self.provisional_stats = ProvisionalStats()

    # ------------------------------------------------------------------ counters

    @property
    def version(self) -> int:
        return self._version

    def next_seq(self) -> int:
        """A number newer than every registration, heartbeat or decision so far."""
        with self.lock:
            self._seq += 1
            return self._seq

    def _changed(self) -> None:
        self._version += 1

    # ------------------------------------------------------------------ registration

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
    ) -> RegisterBrokerResult | None:
        """Apply one REGISTER_BROKER (spec §3.2).

        Returns None only for the single-topic guard (a first registration of this id carrying
        exactly one topic), which the handler answers with SYSTEM_ERROR.
        """
        body = body or _EMPTY_BODY
        dv = body.data_version
        old_version_broker = enable_acting_master is None  # 4.x brokers do not send the flag
        with self.lock:
            acting = not old_version_broker and bool(enable_acting_master)
            bd, register_first, changed = self._join_group(cluster_name, broker_name, zone_name, acting)
            addrs = bd.broker_addrs
            min_id_changed = broker_id < (min(addrs) if addrs else 0)

            # role switch: one address has one id in a group
            for i in [i for i, a in addrs.items() if a == broker_addr and i != broker_id]:
                del addrs[i]
                changed = True

            key = BrokerAddrInfo(cluster_name, broker_addr)
            old_addr = addrs.get(broker_id)
            if old_addr is not None and old_addr != broker_addr and self._holder_is_newer(cluster_name, old_addr, dv):
                log.warning("ignoring %s registering as %s[%d]: %s holds that id with a newer stateVersion",
                            broker_addr, broker_name, broker_id, old_addr)
                self._drop_live(key)
                if changed:
                    self._changed()
                return RegisterBrokerResult(conflict=True, routes_changed=changed)

            # an id held only provisionally counts as unregistered here, as on a node started empty
            holder_provisional = old_addr is not None and BrokerAddrInfo(cluster_name, old_addr) in self._provisional
            fresh = old_addr is None or holder_provisional
            if fresh and len(body.topic_config_table) == 1:
                log.warning("rejecting a one-topic registration of %s[%d]=%s before its full one",
                            broker_name, broker_id, broker_addr)
                if changed:
                    self._changed()
                return None
            if holder_provisional and old_addr != broker_addr:
                self._drop_live(BrokerAddrInfo(cluster_name, old_addr))

            addrs[broker_id] = broker_addr
            changed |= old_addr != broker_addr
            broker_data_changed = changed  # so far only the group and its cluster listing changed
            register_first = register_first or fresh
            is_master = broker_id == MASTER_ID
            is_prime_slave = not old_version_broker and not is_master and broker_id == min(addrs)

            held = self.broker_live_table.get(key)
            # a copied DataVersion proves nothing about the rows copied with it
            dv_changed = held is None or key in self._provisional or held.data_version != dv
            if is_master or is_prime_slave:
                if broker_name in self._provisional_groups:
                    self._provisional_groups.discard(broker_name)
                    changed |= self._drop_rows_missing_from(broker_name, body.topic_config_table)
                    dv_changed = True
                changed |= self._apply_topic_configs(
                    broker_name, body, rewrite_all=register_first or dv_changed,
                    wipe_write=is_prime_slave and bd.enable_acting_master,
                )
            if key in self._provisional:
                self._provisional.discard(key)
                self.provisional_stats.confirmed += 1
                log.info("warm start: %s/%s confirmed by its own registration", cluster_name, broker_addr)

            self._seq += 1
            timeout = DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS if timeout_millis is None else timeout_millis
            self.broker_live_table[key] = BrokerLiveInfo(self.now_ms(), timeout, dv, channel, ha_server_addr, self._seq)
            filters_changed = body.filter_server_list is not None and self._set_filter_servers(
                key, body.filter_server_list
            )
            changed |= filters_changed

            result = RegisterBrokerResult(
                register_first=register_first,
                data_version_changed=dv_changed,
                routes_changed=changed,
                filter_servers_changed=filters_changed,
                broker_data_changed=broker_data_changed,
                registered_seq=self._seq,
            )
            if not is_master:
                result.ha_server_addr, result.master_addr = self._live_master(cluster_name, addrs)
            if min_id_changed and self.settings.notify_min_broker_id_changed:
                result.min_broker_id_change = _min_change(broker_name, addrs, None, ha_server_addr)
            if changed:
                self._changed()
            return result

    def _join_group(
        self, cluster_name: str, broker_name: str, zone_name: str | None, acting: bool
    ) -> tuple[BrokerData, bool, bool]:
        """Steps 1-3: list the group in its cluster, create it if new, take this member's flags.

        Returns (group, created, changed).  Every member overwrites zone and acting flag, even with
        None, as Java does; the group's cluster stays the one it was created with.
        """
        changed = created = False
        names = self.cluster_addr_table.setdefault(cluster_name, set())
        if broker_name not in names:
            names.add(broker_name)
            changed = True
        bd = self.broker_addr_table.get(broker_name)
        if bd is None:
            bd = self.broker_addr_table[broker_name] = BrokerData(cluster_name, broker_name, {})
            created = changed = True
        if bd.enable_acting_master != acting or bd.zone_name != zone_name:
            bd.enable_acting_master = acting
            bd.zone_name = zone_name
            changed = True
        return bd, created, changed

    def _holder_is_newer(self, cluster_name: str, holder_addr: str, dv: DataVersion) -> bool:
        key = BrokerAddrInfo(cluster_name, holder_addr)
        holder = self.broker_live_table.get(key)
        if holder is None or key in self._provisional:
            return False
        return holder.data_version.state_version > dv.state_version

    def _drop_rows_missing_from(self, broker_name: str, kept: Mapping[str, TopicConfig]) -> bool:
        """Remove ``broker_name``'s queues of topics not in ``kept``; True if any went."""
        tqt = self.topic_queue_table
        gone = [t for t, qmap in tqt.items() if broker_name in qmap and t not in kept]
        for topic in gone:
            qmap = tqt[topic]
            del qmap[broker_name]
            if not qmap:
                del tqt[topic]
        return bool(gone)

    def _drop_live(self, key: BrokerAddrInfo) -> BrokerLiveInfo | None:
        live = self.broker_live_table.pop(key, None)
        if key in self._provisional:
            self._provisional.discard(key)
            self.provisional_stats.dropped += 1
            # copied filter servers go with their entry on every drop path, as on unregistration;
            # a registered broker's stay where Java leaves them (the stateVersion conflict)
            if self.filter_server_table.pop(key, None) is not None:
                self._changed()
        return live

    def _set_filter_servers(self, key: BrokerAddrInfo, servers: list[str]) -> bool:
        if not servers:
            return self.filter_server_table.pop(key, None) is not None
        if self.filter_server_table.get(key) == servers:
            return False
        self.filter_server_table[key] = list(servers)
        return True

    def _live_master(self, cluster_name: str, addrs: dict[int, str]) -> tuple[str | None, str | None]:
        """(HA address, address) of the group's master if it is live, else (None, None)."""
        master_addr = addrs.get(MASTER_ID)
        if master_addr is None:
            return None, None
        key = BrokerAddrInfo(cluster_name, master_addr)
        master = self.broker_live_table.get(key)
        if master is None or key in self._provisional:
            return None, None
        return master.ha_server_addr, master_addr

    def _apply_topic_configs(
        self, broker_name: str, body: RegisterBrokerBody, rewrite_all: bool, wipe_write: bool
    ) -> bool:
        tqt = self.topic_queue_table
        tct = body.topic_config_table
        mappings = body.topic_queue_mapping_info_map
        changed = False
        # static topics are not supported by this cleanup, as in Java
        if self.settings.delete_topic_with_broker_registration and not mappings:
            changed = self._drop_rows_missing_from(broker_name, tct)

        for tc in tct.values():
            if rewrite_all:
                changed |= self._create_and_update_queue_data(broker_name, tc, wipe_write)
                continue
            # change detection is per broker: an unchanged DataVersion only fills missing entries,
            # so a name-server-side perm wipe survives periodic re-registration (issue #313)
            qmap = tqt.get(tc.topic_name)
            if not qmap or broker_name not in qmap:
                changed |= self._create_and_update_queue_data(broker_name, tc, wipe_write)

        if rewrite_all:
            for topic, info in mappings.items():
                bname = info.get("bname", broker_name) if isinstance(info, dict) else broker_name
                per_topic = self.topic_queue_mapping_info_table.setdefault(topic, {})
                if per_topic.get(bname) != info:
                    per_topic[bname] = info
                    changed = True
        return changed

    def _create_and_update_queue_data(self, broker_name: str, tc: TopicConfig, wipe_write: bool) -> bool:
        perm = tc.perm & _NOT_WRITE if wipe_write else tc.perm
        qd = QueueData(broker_name, tc.read_queue_nums, tc.write_queue_nums, perm, tc.topic_sys_flag)
        qmap = self.topic_queue_table.get(tc.topic_name)
        if qmap is None:
            self.topic_queue_table[tc.topic_name] = {broker_name: qd}
            return True
        if qmap.get(broker_name) != qd:
            qmap[broker_name] = qd
            return True
        return False

    # ------------------------------------------------------------------ unregistration

    def unregister_brokers(self, requests: Iterable[UnregisterRequest]) -> UnregisterOutcome:
        """Apply a batch of unregistrations under one lock (spec §3.4), skipping stale ones."""
        out = UnregisterOutcome()
        with self.lock:
            notify: dict[str, str] = {}
            for req in requests:
                fence = self._fence(req)
                if fence is not None:
                    out.fenced.append(FencedRequest(req, fence))
                    continue
                out.applied.append(req)
                self._unregister_one(req, out, notify)
            if out.applied:
                self._clean_topics(out.removed_brokers, out.reduced_brokers)
                out.routes_changed = True
                self._changed()
            if notify and self.settings.notify_min_broker_id_changed:
                for name, offline in notify.items():
                    bd = self.broker_addr_table.get(name)
                    if bd is not None and bd.enable_acting_master and bd.broker_addrs:
                        out.min_broker_id_changes.append(_min_change(name, bd.broker_addrs, offline, None))
        return out

    def unregister_broker(
        self, cluster_name: str, broker_addr: str, broker_name: str, broker_id: int
    ) -> UnregisterOutcome:
        """Remove one broker now (a decision taken at this instant, so never fenced)."""
        with self.lock:
            now = self.next_seq()
            return self.unregister_brokers([UnregisterRequest(cluster_name, broker_addr, broker_name, broker_id, now)])

    def _fence(self, req: UnregisterRequest) -> FenceReason | None:
        live = self.broker_live_table.get(req.addr_info)
        if live is not None and live.refreshed_seq > req.decided_seq:
            return FenceReason.REFRESHED
        bd = self.broker_addr_table.get(req.broker_name) if req.broker_name is not None else None
        if bd is not None and req.broker_id is not None:
            for i, a in bd.broker_addrs.items():
                if a == req.broker_addr:
                    return FenceReason.ROLE_CHANGED if i != req.broker_id else None
        return None

    def _unregister_one(self, req: UnregisterRequest, out: UnregisterOutcome, notify: dict[str, str]) -> None:
        key = req.addr_info
        live = self._drop_live(key)
        if live is not None and live.channel is not None:
            out.removed_channels.append(live.channel)
        self.filter_server_table.pop(key, None)
        name = req.broker_name
        if name is None:
            return
        bd = self.broker_addr_table.get(name)
        removed_group = False
        if bd is not None:
            addrs = bd.broker_addrs
            was_min = bool(addrs) and req.broker_id == min(addrs)
            for i in [i for i, a in addrs.items() if a == req.broker_addr]:
                del addrs[i]
            if not addrs:
                del self.broker_addr_table[name]
                self._provisional_groups.discard(name)
                removed_group = True
            elif was_min:
                notify[name] = req.broker_addr
        if removed_group:
            names = self.cluster_addr_table.get(req.cluster_name)
            if names is not None:
                names.discard(name)
                if not names:
                    del self.cluster_addr_table[req.cluster_name]
            out.removed_brokers.add(name)
            out.reduced_brokers.discard(name)
        elif bd is not None:
            out.reduced_brokers.add(name)

    def _clean_topics(self, removed: set[str], reduced: set[str]) -> None:
        # groups that are acting-master capable and lost their master become read-only
        wipe = set()
        for name in reduced:
            bd = self.broker_addr_table.get(name)
            if bd is not None and bd.enable_acting_master and (not bd.broker_addrs or min(bd.broker_addrs) > MASTER_ID):
                wipe.add(name)
        if not removed and not wipe:
            return
        tqt = self.topic_queue_table
        for topic in list(tqt):
            qmap = tqt[topic]
            for name in removed:
                qmap.pop(name, None)
            if not qmap:
                del tqt[topic]
                continue
            for name in wipe:
                qd = qmap.get(name)
                if qd is not None and qd.perm & _WRITE:
                    qmap[name] = _with_perm(qd, qd.perm & _NOT_WRITE)

    def _request_for(self, key: BrokerAddrInfo, seq: int) -> UnregisterRequest:
        for bd in self.broker_addr_table.values():
            if bd.cluster != key.cluster_name:
                continue
            for i, a in bd.broker_addrs.items():
                if a == key.broker_addr:
                    return UnregisterRequest(key.cluster_name, key.broker_addr, bd.broker_name, i, seq)
        return UnregisterRequest(key.cluster_name, key.broker_addr, None, None, seq)

    def build_unregister_request(self, cluster_name: str, broker_addr: str) -> UnregisterRequest | None:
        """The request that removes a live (cluster, addr), decided now; None if it is not live."""
        with self.lock:
            key = BrokerAddrInfo(cluster_name, broker_addr)
            if key not in self.broker_live_table:
                return None
            return self._request_for(key, self.next_seq())

    def on_channel_destroy(self, channel: Hashable | None) -> list[UnregisterRequest]:
        """Requests removing every broker registered on ``channel`` (not applied)."""
        if channel is None:
            return []
        with self.lock:
            keys = [k for k, live in self.broker_live_table.items() if live.channel is channel]
            if not keys:
                return []
            seq = self.next_seq()
            return [self._request_for(k, seq) for k in keys]

    def scan_not_active_broker(self) -> list[UnregisterRequest]:
        """Requests removing every broker silent for longer than its timeout (not applied)."""
        with self.lock:
            now = self.now_ms()
            prov = self._provisional
            keys = [k for k, live in self.broker_live_table.items() if live.expired(now) and k not in prov]
            if not keys:
                return []
            seq = self.next_seq()
            return [self._request_for(k, seq) for k in keys]

    def expire_inactive(self) -> UnregisterOutcome:
        """Scan and apply in one step; the outcome's ``removed_channels`` are for the caller to close."""
        with self.lock:
            return self.unregister_brokers(self.scan_not_active_broker())

    # ------------------------------------------------------------------ liveness

    def update_broker_info_update_timestamp(self, cluster_name: str, broker_addr: str) -> bool:
        """A heartbeat (904, 322): refresh a live entry; False if the broker is not registered."""
        return self.touch(cluster_name, broker_addr) is not None

    def touch(self, cluster_name: str, broker_addr: str) -> DataVersion | None:
        """Refresh a live entry and return the DataVersion it holds (None: not registered).

        QUERY_DATA_VERSION needs both, and one lock acquisition is cheaper than two on that hot path.
        """
        with self.lock:
            key = (cluster_name, broker_addr)  # equal to, and cheaper than, a BrokerAddrInfo
            live = self.broker_live_table.get(key)
            if live is None or (self._provisional and key in self._provisional):
                return None
            live.last_update_timestamp = self.now_ms()
            self._seq += 1
            live.refreshed_seq = self._seq
            return live.data_version

    def query_broker_topic_config(self, cluster_name: str, broker_addr: str) -> DataVersion | None:
        with self.lock:
            key = BrokerAddrInfo(cluster_name, broker_addr)
            live = self.broker_live_table.get(key)
            return None if live is None or key in self._provisional else live.data_version

    def is_broker_topic_config_changed(
        self, cluster_name: str, broker_addr: str, data_version: DataVersion | None
    ) -> bool:
        prev = self.query_broker_topic_config(cluster_name, broker_addr)
        return prev is None or prev != data_version

    def is_topic_config_changed(
        self, cluster_name: str, broker_addr: str, data_version: DataVersion, broker_name: str, topic: str
    ) -> bool:
        with self.lock:
            if self.is_broker_topic_config_changed(cluster_name, broker_addr, data_version):
                return True
            qmap = self.topic_queue_table.get(topic)
            return not qmap or broker_name not in qmap

    def last_seen(self, cluster_name: str, broker_addr: str) -> int | None:
        """``now_ms()`` of the latest registration or heartbeat; None if not live."""
        with self.lock:
            live = self.broker_live_table.get(BrokerAddrInfo(cluster_name, broker_addr))
            return None if live is None else live.last_update_timestamp

    def live_brokers(self) -> list[tuple[BrokerAddrInfo, BrokerLiveInfo]]:
        """A snapshot of the live table (entries are copies)."""
        with self.lock:
            return [
                (k, BrokerLiveInfo(v.last_update_timestamp, v.heartbeat_timeout_millis, v.data_version, v.channel,
                                   v.ha_server_addr, v.registered_seq, v.refreshed_seq))
                for k, v in self.broker_live_table.items()
            ]

    # ------------------------------------------------------------------ provisional entries (warm start)

    def load_provisional(
        self,
        topics: Mapping[str, Mapping[str, QueueData]],
        groups: Mapping[str, BrokerData],
        clusters: Mapping[str, Iterable[str]],
        live: Mapping[BrokerAddrInfo, ProvisionalBroker],
        mappings: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> int:
        """Fill the empty tables from a snapshot, every live entry provisional; returns how many.

        Each group member gets a live entry (the snapshot's, else the default timeout) whose
        deadline is now + its timeout, and the snapshot's filter servers for it.  Rows of unknown
        groups and empty groups are skipped, since nothing would ever remove them.  ``mappings``
        (topic -> bname -> static-topic mapping) are loaded whole: a node never removes one, so the
        node that wrote the snapshot held them all.  Raises RuntimeError unless the tables are
        empty: call it before the node serves.
        """
        with self.lock:
            tables = (self.broker_addr_table, self.broker_live_table, self.topic_queue_table,
                      self.filter_server_table, self.topic_queue_mapping_info_table)
            if any(tables):
                raise RuntimeError("load_provisional needs empty route tables; call it before the node serves")
            kept = {name: bd.copy() for name, bd in groups.items() if bd.broker_addrs}
            now = self.now_ms()
            self._seq += 1

            def add(key: BrokerAddrInfo, timeout: int | None, dv: DataVersion, ha: str | None) -> None:
                ms = DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS if timeout is None else timeout
                self.broker_live_table[key] = BrokerLiveInfo(now, ms, dv, None, ha, self._seq)
                self._provisional.add(key)

            for key, info in live.items():
                add(key, info.timeout_millis, info.data_version, info.ha_server_addr)
                if info.filter_servers:
                    self.filter_server_table[key] = list(info.filter_servers)
            live_addrs = {k.broker_addr for k in self.broker_live_table}
            for bd in kept.values():
                for addr in bd.broker_addrs.values():
                    if addr not in live_addrs:
                        add(BrokerAddrInfo(bd.cluster, addr), None, DataVersion(), None)
            self.broker_addr_table = kept
            for cluster, names in clusters.items():
                known = {n for n in names if n in kept}
                if known:
                    self.cluster_addr_table[cluster] = known
            for topic, qmap in topics.items():
                rows = {name: qd for name, qd in qmap.items() if name in kept}
                if rows:
                    self.topic_queue_table[topic] = rows
            self.topic_queue_mapping_info_table = {t: dict(per) for t, per in (mappings or {}).items() if per}
            self._provisional_groups = set(kept)
            self.provisional_stats.loaded += len(self._provisional)
            self._changed()
            return len(self._provisional)

    def is_provisional(self, cluster_name: str, broker_addr: str) -> bool:
        """True while (cluster, addr) is a loaded entry its broker has not confirmed by registering."""
        with self.lock:
            return BrokerAddrInfo(cluster_name, broker_addr) in self._provisional

    def provisional_brokers(self) -> list[BrokerAddrInfo]:
        with self.lock:
            return sorted(self._provisional)

    def next_provisional_deadline(self) -> int | None:
        """``now_ms()`` after which the earliest unconfirmed entry is dropped; None when none is left."""
        with self.lock:
            table = self.broker_live_table
            return min(
                (table[k].last_update_timestamp + table[k].heartbeat_timeout_millis for k in self._provisional),
                default=None,
            )

    def drop_unconfirmed_provisional(self) -> UnregisterOutcome:
        """Remove provisional entries whose broker did not register within their timeout."""
        with self.lock:
            now = self.now_ms()
            keys = [k for k in self._provisional if self.broker_live_table[k].expired(now)]
            if not keys:
                return UnregisterOutcome()
            seq = self.next_seq()
            return self.unregister_brokers([self._request_for(k, seq) for k in sorted(keys)])

    # ------------------------------------------------------------------ reads

    def pickup_topic_route_data(self, topic: str) -> TopicRouteData | None:
        """The route of ``topic`` (spec §3.6), or None for TOPIC_NOT_EXIST; ``order_topic_conf`` is left unset."""
        with self.lock:
            qmap = self.topic_queue_table.get(topic)
            if qmap is None:
                return None
            broker_datas = []
            filter_map: dict[str, list[str]] = {}
            fst = self.filter_server_table
            for name in qmap:
                bd = self.broker_addr_table.get(name)
                if bd is None:
                    continue
                copy = bd.copy()
                broker_datas.append(copy)
                if fst:
                    for addr in copy.broker_addrs.values():
                        servers = fst.get(BrokerAddrInfo(copy.cluster, addr))
                        if servers is not None:
                            filter_map[addr] = list(servers)
            if not broker_datas:
                return None
            mapping = self.topic_queue_mapping_info_table.get(topic)
            route = TopicRouteData(
                queue_datas=list(qmap.values()),
                broker_datas=broker_datas,
                filter_server_table=filter_map,
                topic_queue_mapping_by_broker=None if mapping is None else dict(mapping),
            )
            support_acting = self.settings.support_acting_master
        if support_acting and not topic.startswith(SYNC_BROKER_MEMBER_GROUP_PREFIX):
            _apply_acting_master(route)
        return route

    def get_all_cluster_info(self) -> tuple[dict[str, BrokerData], dict[str, set[str]]]:
        with self.lock:
            return (
                {name: bd.copy() for name, bd in self.broker_addr_table.items()},
                {c: set(names) for c, names in self.cluster_addr_table.items()},
            )

    def get_broker_member_group(self, cluster_name: str, broker_name: str) -> BrokerData:
        """Members of a group, labelled with the *requested* cluster (as Java); empty if unknown."""
        with self.lock:
            bd = self.broker_addr_table.get(broker_name)
            return BrokerData(cluster_name, broker_name, dict(bd.broker_addrs) if bd is not None else {})

    def get_all_topic_list(self) -> list[str]:
        with self.lock:
            return list(self.topic_queue_table)

    def get_topics_by_cluster(self, cluster_name: str) -> list[str]:
        with self.lock:
            names = self.cluster_addr_table.get(cluster_name)
            if not names:
                return []
            return [t for t, qmap in self.topic_queue_table.items() if not names.isdisjoint(qmap)]

    def get_system_topic_list(self) -> tuple[list[str], str | None]:
        """Cluster and broker names (brokers create topics named after them), and one broker address."""
        with self.lock:
            topics: dict[str, None] = {}
            for cluster, names in self.cluster_addr_table.items():
                topics[cluster] = None
                topics.update(dict.fromkeys(names))
            addr = None
            for bd in self.broker_addr_table.values():
                if bd.broker_addrs:
                    # Java's HashMap<Long> iterates small ids in ascending order
                    addr = bd.broker_addrs[min(bd.broker_addrs)]
                    break
            return list(topics), addr

    def _topics_by_first_flag(self, test: Callable[[int], bool]) -> list[str]:
        with self.lock:
            # Java looks at the first QueueData only (HashMap order; ours is insertion order)
            return [
                t for t, qmap in self.topic_queue_table.items() if qmap and test(next(iter(qmap.values())).topic_sys_flag)
            ]

    def get_unit_topics(self) -> list[str]:
        return self._topics_by_first_flag(lambda f: bool(f & _UNIT))

    def get_has_unit_sub_topic_list(self) -> list[str]:
        return self._topics_by_first_flag(lambda f: bool(f & _UNIT_SUB))

    def get_has_unit_sub_ununit_topic_list(self) -> list[str]:
        return self._topics_by_first_flag(lambda f: bool(f & _UNIT_SUB) and not f & _UNIT)

    # ------------------------------------------------------------------ admin writes

    def wipe_write_perm_of_broker(self, broker_name: str) -> int:
        """Clear PERM_WRITE on every queue of ``broker_name``; returns how many topics it has."""
        return self._operate_write_perm(broker_name, lambda p: p & _NOT_WRITE)

    def add_write_perm_of_broker(self, broker_name: str) -> int:
        """Set perm to READ|WRITE outright (drops INHERIT/PRIORITY, as Java); returns the topic count."""
        return self._operate_write_perm(broker_name, lambda p: _READ_WRITE)

    def _operate_write_perm(self, broker_name: str, op: Callable[[int], int]) -> int:
        count = 0
        changed = False
        with self.lock:
            for qmap in self.topic_queue_table.values():
                qd = qmap.get(broker_name)
                if qd is None:
                    continue
                count += 1
                perm = op(qd.perm)
                if perm != qd.perm:
                    qmap[broker_name] = _with_perm(qd, perm)
                    changed = True
            if changed:
                self._changed()
        return count

    def delete_topic(self, topic: str, cluster_name: str | None = None) -> bool:
        """Drop a topic, or only its queues on ``cluster_name``'s brokers; True if anything went."""
        with self.lock:
            if not cluster_name:
                gone = self.topic_queue_table.pop(topic, None) is not None
            else:
                names = self.cluster_addr_table.get(cluster_name)
                qmap = self.topic_queue_table.get(topic)
                if not names or qmap is None:
                    return False
                gone = False
                for name in names:
                    gone |= qmap.pop(name, None) is not None
                if not qmap:
                    del self.topic_queue_table[topic]
                    gone = True
            # static-topic mappings are kept, as Java does (spec §2.2 code 216)
            if gone:
                self._changed()
            return gone

    def register_topic(self, topic: str, queue_datas: Iterable[QueueData]) -> bool:
        """REGISTER_TOPIC_IN_NAMESRV: every QueueData's broker must be known; True if anything changed.

        For an existing topic entries are applied one by one and the first unknown broker stops
        the loop (earlier ones stay); a new topic is all or nothing.
        """
        queue_datas = list(queue_datas)
        if not queue_datas:
            return False
        with self.lock:
            known = self.broker_addr_table
            qmap = self.topic_queue_table.get(topic)
            changed = False
            if qmap is not None:
                for qd in queue_datas:
                    if qd.broker_name not in known:
                        log.warning("register topic %s: unknown broker %s", topic, qd.broker_name)
                        break
                    if qmap.get(qd.broker_name) != qd:
                        qmap[qd.broker_name] = qd
                        changed = True
            else:
                if any(qd.broker_name not in known for qd in queue_datas):
                    log.warning("register topic %s: unknown broker among %s", topic,
                                [q.broker_name for q in queue_datas])
                    return False
                self.topic_queue_table[topic] = {qd.broker_name: qd for qd in queue_datas}
                changed = True
            if changed:
                self._changed()
            return changed


def _apply_acting_master(route: TopicRouteData) -> None:
    """Show the lowest-id slave of a masterless, read-only, acting-master group as id 0."""
    if not any(bd.broker_addrs and MASTER_ID not in bd.broker_addrs for bd in route.broker_datas):
        return
    perms = {qd.broker_name: qd.perm for qd in route.queue_datas}
    for bd in route.broker_datas:
        addrs = bd.broker_addrs
        if not addrs or MASTER_ID in addrs or not bd.enable_acting_master:
            continue
        perm = perms.get(bd.broker_name)
        if perm is not None and not perm & _WRITE:
            addrs[MASTER_ID] = addrs.pop(min(addrs))
