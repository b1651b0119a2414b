"""REGISTER_BROKER and heartbeats over :class:`~common.routes.tables.RouteTables` (spec §3.2).

:func:`register_broker` reads as the spec's steps, in order, each a function below: join the group
(:func:`_join_group`), drop the address's other ids (:func:`_drop_other_ids`), refuse a stateVersion
conflict or a single-topic first registration before anything is written, take the id
(:func:`_take_id`), write the group's topic rows when this member is the one that writes them
(:func:`_apply_group_topics`), refresh the live entry with a new sequence number for fencing
(:func:`_refresh_live`), and build the answer (:func:`_answer`).  An id held only provisionally
(warm start) counts as unregistered: see :mod:`common.routes.provisional`.  :func:`touch` is the
heartbeat.  ``docs/internals/routes.md`` lists what each step decides.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from common.protocol.codes import DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS, MASTER_ID, Perm
from common.protocol.types import BrokerData, DataVersion, QueueData, RegisterBrokerBody, TopicConfig
from common.routes.model import (
    BrokerAddrInfo,
    BrokerLiveInfo,
    MinBrokerIdChange,
    RegisterBrokerResult,
    Registration,
    RouteSettingsLike,
)
from common.routes.tables import RouteTables, drop_live, drop_rows_missing_from, note_member, shared_queue_data

log = logging.getLogger(__name__)

_NOT_WRITE = ~int(Perm.WRITE)
_EMPTY_BODY = RegisterBrokerBody()


def register_broker(
    t: RouteTables, settings: RouteSettingsLike, now_ms: int, reg: Registration
) -> RegisterBrokerResult | None:
    """Apply one REGISTER_BROKER.

    Returns None only for the single-topic guard, which the handler answers with SYSTEM_ERROR.
    """
    body = reg.body or _EMPTY_BODY
    bd, created, changed = _join_group(t, reg)
    addrs = bd.broker_addrs
    min_id_changed = reg.broker_id < (min(addrs) if addrs else 0)
    changed |= _drop_other_ids(addrs, reg)

    old_addr = addrs.get(reg.broker_id)
    if old_addr is not None and old_addr != reg.broker_addr and _holder_is_newer(t, reg, old_addr, body.data_version):
        log.warning("ignoring %s registering as %s[%d] at stateVersion %d: %s holds that id with a newer one",
                    reg.broker_addr, reg.broker_name, reg.broker_id, body.data_version.state_version,
                    old_addr)  # fmt: skip
        drop_live(t, reg.addr_info)
        return _refused(t, changed, RegisterBrokerResult(conflict=True, routes_changed=changed))
    # an id held only provisionally counts as unregistered here, as on a node started empty
    holder_provisional = old_addr is not None and BrokerAddrInfo(reg.cluster_name, old_addr) in t.provisional
    fresh = old_addr is None or holder_provisional
    if fresh and len(body.topic_config_table) == 1:
        log.warning("rejecting a one-topic registration of %s[%d]=%s before its full one",
                    reg.broker_name, reg.broker_id, reg.broker_addr)  # fmt: skip
        return _refused(t, changed, None)

    if old_addr != reg.broker_addr:
        log.info("%s takes %s[%d] (held by %s), stateVersion %d",
                 reg.broker_addr, reg.broker_name, reg.broker_id, old_addr, body.data_version.state_version)  # fmt: skip
    changed |= _take_id(t, reg, addrs, old_addr, holder_provisional)
    broker_data_changed = changed  # so far only the group and its cluster listing changed
    register_first = created or fresh
    key = reg.addr_info
    held = t.broker_live_table.get(key)
    # a copied DataVersion proves nothing about the rows copied with it
    dv_changed = held is None or key in t.provisional or held.data_version != body.data_version
    rows_from = None
    if _writes_group_topics(reg, addrs):
        rows_changed, dv_changed, rows_from = _apply_group_topics(
            t, settings, reg, bd, body, register_first, dv_changed
        )
        changed |= rows_changed

    seq, filters_changed = _refresh_live(t, reg, body, now_ms)
    changed |= filters_changed
    result = RegisterBrokerResult(
        register_first=register_first,
        data_version_changed=dv_changed,
        routes_changed=changed,
        filter_servers_changed=filters_changed,
        broker_data_changed=broker_data_changed,
        registered_seq=seq,
    )
    _answer(t, settings, reg, addrs, min_id_changed, result)
    if changed:
        t.changed()
    if rows_from is not None:
        _note_rows_written(t, reg.broker_name, rows_from)
    return result


def _registered(t: RouteTables, cluster_name: str, broker_addr: str) -> BrokerLiveInfo | None:
    """The broker's live entry, None when it is not registered here (a provisional entry is not)."""
    key = (cluster_name, broker_addr)  # equal to, and cheaper than, a BrokerAddrInfo
    live = t.broker_live_table.get(key)  # type: ignore[call-overload]
    if live is None or (t.provisional and key in t.provisional):
        return None
    return live


def touch(t: RouteTables, cluster_name: str, broker_addr: str, now_ms: int) -> DataVersion | None:
    """A heartbeat (904, 322) or QUERY_DATA_VERSION: refresh a live entry, return its DataVersion.

    None when the broker is not registered here (see :func:`_registered`).
    """
    live = _registered(t, cluster_name, broker_addr)
    if live is None:
        return None
    live.last_update_timestamp = now_ms
    live.refreshed_seq = t.next_seq()
    return live.data_version


def held_data_version(t: RouteTables, cluster_name: str, broker_addr: str) -> DataVersion | None:
    """What :func:`touch` returns, read only."""
    live = _registered(t, cluster_name, broker_addr)
    return None if live is None else live.data_version


# --------------------------------------------------------------------------- the steps


def _join_group(t: RouteTables, reg: Registration) -> tuple[BrokerData, bool, bool]:
    """Spec §3.2 steps 1-3: list the group in its cluster, create it if new, take this member's flags.

    Returns (group, created, changed).  Every member overwrites zone and acting flag, even with
    None, as Java does; the group's cluster stays the one it was created with.
    """
    acting = reg.enable_acting_master is not None and bool(reg.enable_acting_master)
    changed = created = False
    names = t.cluster_addr_table.setdefault(reg.cluster_name, set())
    if reg.broker_name not in names:
        names.add(reg.broker_name)
        changed = True
    bd = t.broker_addr_table.get(reg.broker_name)
    if bd is None:
        bd = t.broker_addr_table[reg.broker_name] = BrokerData(reg.cluster_name, reg.broker_name, {})
        created = changed = True
    if bd.enable_acting_master != acting or bd.zone_name != reg.zone_name:
        bd.enable_acting_master = acting
        bd.zone_name = reg.zone_name
        changed = True
    return bd, created, changed


def _drop_other_ids(addrs: dict[int, str], reg: Registration) -> bool:
    """A role switch: the address leaves every other id of the group."""
    others = [i for i, a in addrs.items() if a == reg.broker_addr and i != reg.broker_id]
    for i in others:
        del addrs[i]
    return bool(others)


def _holder_is_newer(t: RouteTables, reg: Registration, holder_addr: str, dv: DataVersion) -> bool:
    key = BrokerAddrInfo(reg.cluster_name, holder_addr)
    holder = t.broker_live_table.get(key)
    if holder is None or key in t.provisional:
        return False
    return holder.data_version.state_version > dv.state_version


def _refused(t: RouteTables, changed: bool, result: RegisterBrokerResult | None) -> RegisterBrokerResult | None:
    # what the group and cluster listing already took stays, as in Java
    if changed:
        t.changed()
    return result


def _take_id(
    t: RouteTables, reg: Registration, addrs: dict[int, str], old_addr: str | None, holder_provisional: bool
) -> bool:
    """The id maps to this address from now on; True if it mapped to another one (or none)."""
    if holder_provisional and old_addr != reg.broker_addr:
        assert old_addr is not None
        drop_live(t, BrokerAddrInfo(reg.cluster_name, old_addr))
    addrs[reg.broker_id] = reg.broker_addr
    note_member(t, reg.broker_addr, reg.broker_name)
    return old_addr != reg.broker_addr


def _writes_group_topics(reg: Registration, addrs: dict[int, str]) -> bool:
    """The master, or the prime slave (lowest id) of a 5.x group, speaks for the group's topics."""
    if reg.broker_id == MASTER_ID:
        return True
    return reg.enable_acting_master is not None and reg.broker_id == min(addrs)


def _apply_group_topics(
    t: RouteTables,
    settings: RouteSettingsLike,
    reg: Registration,
    bd: BrokerData,
    body: RegisterBrokerBody,
    register_first: bool,
    dv_changed: bool,
) -> tuple[bool, bool, tuple[int, bool] | None]:
    """The group's topic rows and static mappings.

    Returns (rows changed, DataVersion counted as changed, what the rows now equal if that is known:
    see :func:`_apply_topic_configs`).
    """
    changed = False
    name = reg.broker_name
    if name in t.provisional_groups:
        # the group's own first word replaces every copied row, whatever the DataVersions say
        t.provisional_groups.discard(name)
        changed = drop_rows_missing_from(t, name, body.topic_config_table)
        dv_changed = True
    is_prime_slave = reg.broker_id != MASTER_ID
    rows_changed, rows_from = _apply_topic_configs(
        t, settings, name, body, rewrite_all=register_first or dv_changed,
        wipe_write=is_prime_slave and bd.enable_acting_master,
    )  # fmt: skip
    return changed or rows_changed, dv_changed, rows_from


def _apply_topic_configs(
    t: RouteTables, settings: RouteSettingsLike, broker_name: str, body: RegisterBrokerBody, rewrite_all: bool,
    wipe_write: bool,
) -> tuple[bool, tuple[int, bool] | None]:  # fmt: skip
    """(rows changed, (table_id, wipe_write) when the table's rows now equal a shared table, else None)."""
    tqt = t.topic_queue_table
    tct = body.topic_config_table
    mappings = body.topic_queue_mapping_info_map
    changed = False
    # static topics are not supported by this cleanup, as in Java
    if settings.delete_topic_with_broker_registration and not mappings:
        changed = drop_rows_missing_from(t, broker_name, tct)

    rows_from = (body.table_id, wipe_write) if body.table_id else None
    if rows_from is not None and _rows_written_from(t, broker_name) == rows_from:
        pass  # the rows are this table's already: none to check, none missing
    elif rewrite_all:
        changed |= _rewrite_rows(tqt, broker_name, tct.values(), wipe_write)
    else:
        rows_from = None  # a wiped perm stays: the rows need not be the table's
        for tc in tct.values():
            # change detection is per broker: an unchanged DataVersion only fills missing entries,
            # so a name-server-side perm wipe survives periodic re-registration
            qmap = tqt.get(tc.topic_name)
            if not qmap or broker_name not in qmap:
                changed |= _create_and_update_queue_data(t, broker_name, tc, wipe_write)

    if rewrite_all:
        changed |= _apply_mappings(t, broker_name, mappings)
    return changed, rows_from


def _rows_written_from(t: RouteTables, broker_name: str) -> tuple[int, bool] | None:
    """(table_id, wipe_write) the group's rows were made equal to, if no row changed since."""
    return t.rows_from.get(broker_name) if t.rows_version == t.version else None


def _note_rows_written(t: RouteTables, broker_name: str, rows_from: tuple[int, bool]) -> None:
    """The group's rows equal that table now; after the registration's own version bump."""
    if t.rows_version != t.version:
        t.rows_from.clear()  # stale since the bump, every group's
        t.rows_version = t.version
    t.rows_from[broker_name] = rows_from


def _rewrite_rows(
    tqt: dict[str, dict[str, QueueData]], broker_name: str, configs: Iterable[TopicConfig], wipe_write: bool
) -> bool:
    """Every row of ``configs`` for ``broker_name``; True if any changed.

    The loop a re-registration with a new DataVersion runs once per topic (unless the rows are
    known to be the table's already), so it is
    :func:`_create_and_update_queue_data` inlined: a row that is already right costs two dict
    lookups and five field reads, no call and no new tuple (building a QueueData through its
    NamedTuple constructor costs more than the rest of the loop together).
    """
    changed = False
    mask = _NOT_WRITE if wipe_write else -1
    get = tqt.get
    for tc in configs:
        perm = tc.perm & mask
        qmap = get(tc.topic_name)
        if qmap is not None:
            held = qmap.get(broker_name)
            if (
                held is not None
                and held.perm == perm
                and held.read_queue_nums == tc.read_queue_nums
                and held.write_queue_nums == tc.write_queue_nums
                and held.topic_sys_flag == tc.topic_sys_flag
                and held.broker_name == broker_name
            ):
                continue
        qd = shared_queue_data(broker_name, tc.read_queue_nums, tc.write_queue_nums, perm, tc.topic_sys_flag)
        if qmap is None:
            tqt[tc.topic_name] = {broker_name: qd}
        else:
            qmap[broker_name] = qd
        changed = True
    return changed


def _create_and_update_queue_data(t: RouteTables, broker_name: str, tc: TopicConfig, wipe_write: bool) -> bool:
    perm = tc.perm & _NOT_WRITE if wipe_write else tc.perm
    qd = shared_queue_data(broker_name, tc.read_queue_nums, tc.write_queue_nums, perm, tc.topic_sys_flag)
    qmap = t.topic_queue_table.get(tc.topic_name)
    if qmap is None:
        t.topic_queue_table[tc.topic_name] = {broker_name: qd}
        return True
    if qmap.get(broker_name) != qd:
        qmap[broker_name] = qd
        return True
    return False


def _apply_mappings(t: RouteTables, broker_name: str, mappings: Mapping[str, object]) -> bool:
    changed = False
    for topic, info in mappings.items():
        bname = info.get("bname", broker_name) if isinstance(info, dict) else broker_name
        per_topic = t.topic_queue_mapping_info_table.setdefault(topic, {})
        if per_topic.get(bname) != info:
            per_topic[bname] = info
            changed = True
    return changed


def _refresh_live(t: RouteTables, reg: Registration, body: RegisterBrokerBody, now_ms: int) -> tuple[int, bool]:
    """Confirm a provisional entry, write the live entry and filter servers; (seq, filters changed)."""
    key = reg.addr_info
    if key in t.provisional:
        t.provisional.discard(key)
        t.provisional_stats.confirmed += 1
        log.info("warm start: %s/%s confirmed by its own registration", reg.cluster_name, reg.broker_addr)
    seq = t.next_seq()
    timeout = DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS if reg.timeout_millis is None else reg.timeout_millis
    t.broker_live_table[key] = BrokerLiveInfo(now_ms, timeout, body.data_version, reg.channel, reg.ha_server_addr, seq)
    servers = body.filter_server_list
    return seq, servers is not None and _set_filter_servers(t, key, servers)


def _set_filter_servers(t: RouteTables, key: BrokerAddrInfo, servers: list[str]) -> bool:
    if not servers:
        return t.filter_server_table.pop(key, None) is not None
    if t.filter_server_table.get(key) == servers:
        return False
    t.filter_server_table[key] = list(servers)
    return True


def _answer(
    t: RouteTables, settings: RouteSettingsLike, reg: Registration, addrs: dict[int, str], min_id_changed: bool,
    result: RegisterBrokerResult,
) -> None:  # fmt: skip
    """A slave learns its live master; a new minimum id is announced to the group."""
    if reg.broker_id != MASTER_ID:
        result.ha_server_addr, result.master_addr = _live_master(t, reg.cluster_name, addrs)
    if min_id_changed and settings.notify_min_broker_id_changed:
        result.min_broker_id_change = MinBrokerIdChange.of_group(reg.broker_name, addrs, None, reg.ha_server_addr)


def _live_master(t: RouteTables, cluster_name: str, addrs: dict[int, str]) -> tuple[str | None, str | None]:
    """(HA address, address) of the group's master if it is live and registered here, else (None, None)."""
    master_addr = addrs.get(MASTER_ID)
    if master_addr is None:
        return None, None
    key = BrokerAddrInfo(cluster_name, master_addr)
    master = t.broker_live_table.get(key)
    if master is None or key in t.provisional:
        return None, None
    return master.ha_server_addr, master_addr
