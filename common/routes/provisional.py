"""Provisional entries: routes a warm-started node serves before the brokers register (:mod:`namesrv.warmstart`).

:func:`load_provisional` fills empty tables from the streaming job's model
(:mod:`common.routes.snapshot`), so routes are answered before the brokers register.  Until a
broker's own REGISTER_BROKER arrives its live entry is *provisional*: it answers clients but never
brokers, as if the broker had not registered here yet (the rules are in
:mod:`common.routes.register`), and the first registration of a group's writer rewrites that
group's copied topic rows in full.  The expiry scan skips provisional entries;
:func:`drop_unconfirmed_provisional` removes those unconfirmed one heartbeat timeout after loading,
even while the monitor has the scan switched off.  ``docs/internals/routes.md`` and
``docs/warm-start.md`` have the details.
"""

from __future__ import annotations

from common.protocol.codes import DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
from common.protocol.types import DataVersion
from common.routes.model import BrokerAddrInfo, BrokerLiveInfo, RouteSettingsLike, UnregisterOutcome
from common.routes.snapshot import ModelSnapshot
from common.routes.tables import RouteTables, index_members
from common.routes.unregister import request_for, unregister_brokers


def load_provisional(t: RouteTables, now_ms: int, snap: ModelSnapshot) -> None:
    """Fill the empty tables from ``snap``, every live entry provisional.

    Each group member gets a live entry (the snapshot's, else the default timeout) whose deadline
    is now + its timeout, and the snapshot's filter servers for it.  Rows of unknown groups and
    empty groups are skipped, since nothing would ever remove them.  Static-topic mappings are
    loaded whole: a node never removes one, so the node that wrote the snapshot held them all.
    Raises RuntimeError unless the tables are empty: call it before the node serves.
    """
    if not t.is_empty():
        raise RuntimeError("load_provisional needs empty route tables; call it before the node serves")
    kept = {name: bd.copy() for name, bd in snap.groups.items() if bd.broker_addrs}
    seq = t.next_seq()

    def add(key: BrokerAddrInfo, timeout: int | None, dv: DataVersion, ha: str | None) -> None:
        ms = DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS if timeout is None else timeout
        t.broker_live_table[key] = BrokerLiveInfo(now_ms, ms, dv, None, ha, seq)
        t.provisional.add(key)

    for key, info in snap.live.items():
        add(key, info.timeout_millis, info.data_version, info.ha_server_addr)
        servers = snap.filter_servers.get(key)
        if servers:
            t.filter_server_table[key] = list(servers)
    live_addrs = {k.broker_addr for k in t.broker_live_table}
    for bd in kept.values():
        for addr in bd.broker_addrs.values():
            if addr not in live_addrs:
                add(BrokerAddrInfo(bd.cluster, addr), None, DataVersion(), None)
    t.broker_addr_table = kept
    index_members(t)
    for cluster, names in snap.clusters.items():
        known = {n for n in names if n in kept}
        if known:
            t.cluster_addr_table[cluster] = known
    for topic, qmap in snap.topics.items():
        rows = {name: qd for name, qd in qmap.items() if name in kept}
        if rows:
            t.topic_queue_table[topic] = rows
    t.topic_queue_mapping_info_table = {topic: dict(per) for topic, per in snap.mappings.items() if per}
    t.provisional_groups = set(kept)
    t.provisional_stats.loaded += len(t.provisional)
    t.changed()


def next_provisional_deadline(t: RouteTables) -> int | None:
    """``now_ms`` after which the earliest unconfirmed entry is dropped; None when none is left."""
    table = t.broker_live_table
    return min(
        (table[k].last_update_timestamp + table[k].heartbeat_timeout_millis for k in t.provisional),
        default=None,
    )


def drop_unconfirmed_provisional(t: RouteTables, settings: RouteSettingsLike, now_ms: int) -> UnregisterOutcome:
    """Remove provisional entries whose broker did not register within their timeout."""
    keys = [k for k in t.provisional if t.broker_live_table[k].expired(now_ms)]
    if not keys:
        return UnregisterOutcome()
    seq = t.next_seq()
    return unregister_brokers(t, settings, [request_for(t, k, seq) for k in sorted(keys)])
