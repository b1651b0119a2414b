"""Unregistration, channel close and expiry over :class:`~common.routes.tables.RouteTables` (spec §3.4, §3.5).

Deciding and applying are separate, as in Java: :func:`on_channel_destroy`,
:func:`build_unregister_request` and :func:`scan_not_active_broker` return
:class:`UnregisterRequest` values and change nothing; :func:`unregister_brokers` applies a queued
batch later.  Unlike Java, a decision is fenced (https://github.com/apache/rocketmq/issues/11043): it carries the sequence
number it was decided at and is skipped when the broker registered or heartbeated since.  It is
also skipped as ``ROLE_CHANGED`` when the address now holds another id in the group, where Java
would remove a master that re-registered at a slave's address.  ``docs/internals/routes.md`` has
these and the other deliberate deviations.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from common.protocol.codes import MASTER_ID, Perm
from common.routes.model import (
    BrokerAddrInfo,
    FencedRequest,
    FenceReason,
    MinBrokerIdChange,
    RouteSettingsLike,
    UnregisterOutcome,
    UnregisterRequest,
)
from common.routes.tables import RouteTables, drop_live, groups_listing, with_perm

_WRITE = int(Perm.WRITE)
_NOT_WRITE = ~_WRITE


def unregister_brokers(
    t: RouteTables, settings: RouteSettingsLike, requests: Iterable[UnregisterRequest]
) -> UnregisterOutcome:
    """Apply a batch of unregistrations, skipping stale ones."""
    out = UnregisterOutcome()
    notify: dict[str, str] = {}
    for req in requests:
        fence = _fence(t, req)
        if fence is not None:
            out.fenced.append(FencedRequest(req, fence))
            continue
        out.applied.append(req)
        _unregister_one(t, req, out, notify)
    if out.applied:
        _clean_topics(t, out.removed_brokers, out.reduced_brokers)
        out.routes_changed = True
        t.changed()
    if notify and settings.notify_min_broker_id_changed:
        for name, offline in notify.items():
            bd = t.broker_addr_table.get(name)
            if bd is not None and bd.enable_acting_master and bd.broker_addrs:
                out.min_broker_id_changes.append(MinBrokerIdChange.of_group(name, bd.broker_addrs, offline, None))
    return out


def build_unregister_request(t: RouteTables, cluster_name: str, broker_addr: str) -> UnregisterRequest | None:
    """The request that removes a live (cluster, addr), decided now; None if it is not live."""
    key = BrokerAddrInfo(cluster_name, broker_addr)
    if key not in t.broker_live_table:
        return None
    return request_for(t, key, t.next_seq())


def on_channel_destroy(t: RouteTables, channel: Hashable) -> list[UnregisterRequest]:
    """Requests removing every broker registered on ``channel`` (not applied)."""
    keys = [k for k, live in t.broker_live_table.items() if live.channel is channel]
    if not keys:
        return []
    seq = t.next_seq()
    return [request_for(t, k, seq) for k in keys]


def scan_not_active_broker(t: RouteTables, now_ms: int, *, kept_through: int | None = None) -> list[UnregisterRequest]:
    """Requests removing every broker silent for longer than its timeout (not applied).

    Provisional entries are left to :mod:`common.routes.provisional`'s own deadline; ``kept_through``
    as :func:`overdue_brokers`.
    """
    keys = overdue_brokers(t, now_ms, kept_through=kept_through)
    if not keys:
        return []
    seq = t.next_seq()
    return [request_for(t, k, seq) for k in keys]


def overdue_brokers(t: RouteTables, now_ms: int, *, kept_through: int | None = None) -> list[BrokerAddrInfo]:
    """Brokers silent for longer than their timeout, provisional entries aside (nothing changes).

    ``kept_through``: leave out those whose deadline is at or before it (another party decided them).
    """
    prov = t.provisional
    return [
        k
        for k, live in t.broker_live_table.items()
        if live.expired(now_ms)
        and k not in prov
        and (kept_through is None or live.last_update_timestamp + live.heartbeat_timeout_millis > kept_through)
    ]


def request_for(t: RouteTables, key: BrokerAddrInfo, seq: int) -> UnregisterRequest:
    """The request removing ``key``: named after the group of its cluster that lists the address."""
    for bd in groups_listing(t, key.cluster_name, key.broker_addr):
        for i, a in bd.broker_addrs.items():
            if a == key.broker_addr:
                return UnregisterRequest(key.cluster_name, key.broker_addr, bd.broker_name, i, seq)
    return UnregisterRequest(key.cluster_name, key.broker_addr, None, None, seq)


def _fence(t: RouteTables, req: UnregisterRequest) -> FenceReason | None:
    live = t.broker_live_table.get(req.addr_info)
    if live is not None and live.refreshed_seq > req.decided_seq:
        return FenceReason.REFRESHED
    bd = t.broker_addr_table.get(req.broker_name) if req.broker_name is not None else None
    if bd is not None and req.broker_id is not None:
        for i, a in bd.broker_addrs.items():
            if a == req.broker_addr:
                return FenceReason.ROLE_CHANGED if i != req.broker_id else None
    return None


def _unregister_one(t: RouteTables, req: UnregisterRequest, out: UnregisterOutcome, notify: dict[str, str]) -> None:
    key = req.addr_info
    live = drop_live(t, key)
    if live is not None and live.channel is not None:
        out.removed_channels.append(live.channel)
    t.filter_server_table.pop(key, None)
    name = req.broker_name
    if name is None:
        return
    bd = t.broker_addr_table.get(name)
    if bd is None:
        return
    addrs = bd.broker_addrs
    was_min = bool(addrs) and req.broker_id == min(addrs)
    for i in [i for i, a in addrs.items() if a == req.broker_addr]:
        del addrs[i]
    if addrs:
        if was_min:
            notify[name] = req.broker_addr
        out.reduced_brokers.add(name)
        return
    del t.broker_addr_table[name]
    t.provisional_groups.discard(name)
    names = t.cluster_addr_table.get(req.cluster_name)
    if names is not None:
        names.discard(name)
        if not names:
            del t.cluster_addr_table[req.cluster_name]
    out.removed_brokers.add(name)
    out.reduced_brokers.discard(name)


def _clean_topics(t: RouteTables, removed: set[str], reduced: set[str]) -> None:
    # groups that are acting-master capable and lost their master become read-only
    wipe = set()
    for name in reduced:
        bd = t.broker_addr_table.get(name)
        if bd is not None and bd.enable_acting_master and (not bd.broker_addrs or min(bd.broker_addrs) > MASTER_ID):
            wipe.add(name)
    if not removed and not wipe:
        return
    tqt = t.topic_queue_table
    for topic in list(tqt):
        qmap = tqt[topic]
        # a topic lists a group or two, and a closed connection may remove thousands: walk the smaller
        # side, or one broker host's shutdown costs topics x groups (10^9 at 100,000 x 10,000)
        if len(removed) <= len(qmap):
            for name in removed:
                qmap.pop(name, None)
        else:
            for name in [name for name in qmap if name in removed]:
                del qmap[name]
        if not qmap:
            del tqt[topic]
            continue
        for name in wipe:
            qd = qmap.get(name)
            if qd is not None and qd.perm & _WRITE:
                qmap[name] = with_perm(qd, qd.perm & _NOT_WRITE)
