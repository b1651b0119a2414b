"""Every read of :class:`~common.routes.tables.RouteTables` (spec §3.6, §3.7, §2.2 list codes).

Reads return copies of mutable parts (BrokerData, lists, dicts) and share immutable ones
(QueueData, DataVersion), so callers encode and keep them after the lock is released.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

from common.protocol.codes import MASTER_ID, SYNC_BROKER_MEMBER_GROUP_PREFIX, Perm, TopicSysFlag
from common.protocol.types import BrokerData, QueueData, TopicRouteData
from common.routes.model import BrokerAddrInfo, RouteCounts, RouteHealth
from common.routes.tables import RouteTables, groups_listing

_WRITE = int(Perm.WRITE)
_UNIT = int(TopicSysFlag.UNIT)
_UNIT_SUB = int(TopicSysFlag.UNIT_SUB)


# --------------------------------------------------------------------------- what clients ask


def pickup_topic_route_data(t: RouteTables, topic: str, support_acting_master: bool) -> TopicRouteData | None:
    """The route of ``topic``, or None for TOPIC_NOT_EXIST; ``order_topic_conf`` is left unset."""
    qmap = t.topic_queue_table.get(topic)
    if qmap is None:
        return None
    # Groups in broker-name order, not registration order: Java answers in HashMap order, the same on
    # every node holding the same groups; registration order differs between nodes (and the job, which
    # writes Redis) whenever two brokers register at once, and clients sort both lists before comparing.
    names = sorted(qmap) if len(qmap) > 1 else list(qmap)
    broker_datas = []
    filter_map: dict[str, list[str]] = {}
    fst = t.filter_server_table
    for name in names:
        bd = t.broker_addr_table.get(name)
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
    mapping = t.topic_queue_mapping_info_table.get(topic)
    route = TopicRouteData(
        queue_datas=[qmap[name] for name in names],
        broker_datas=broker_datas,
        filter_server_table=filter_map,
        topic_queue_mapping_by_broker=None if mapping is None else dict(mapping),
    )
    if support_acting_master and not topic.startswith(SYNC_BROKER_MEMBER_GROUP_PREFIX):
        _apply_acting_master(route)
    return route


def _apply_acting_master(route: TopicRouteData) -> None:
    """Show the lowest-id slave of a masterless, read-only, acting-master group as id 0 (on the copy)."""
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


def get_all_cluster_info(t: RouteTables) -> tuple[dict[str, BrokerData], dict[str, set[str]]]:
    return (
        {name: bd.copy() for name, bd in t.broker_addr_table.items()},
        {c: set(names) for c, names in t.cluster_addr_table.items()},
    )


def get_broker_member_group(t: RouteTables, cluster_name: str, broker_name: str) -> BrokerData:
    """Members of a group, labelled with the *requested* cluster (as Java); empty if unknown."""
    bd = t.broker_addr_table.get(broker_name)
    return BrokerData(cluster_name, broker_name, dict(bd.broker_addrs) if bd is not None else {})


def get_all_topic_list(t: RouteTables) -> list[str]:
    return list(t.topic_queue_table)


def get_topics_by_cluster(t: RouteTables, cluster_name: str) -> list[str]:
    names = t.cluster_addr_table.get(cluster_name)
    if not names:
        return []
    return [topic for topic, qmap in t.topic_queue_table.items() if not names.isdisjoint(qmap)]


def get_system_topic_list(t: RouteTables) -> tuple[list[str], str | None]:
    """Cluster and broker names (brokers create topics named after them), and one broker address."""
    topics: dict[str, None] = {}
    for cluster, names in t.cluster_addr_table.items():
        topics[cluster] = None
        topics.update(dict.fromkeys(names))
    addr = None
    for bd in t.broker_addr_table.values():
        if bd.broker_addrs:
            # Java's HashMap<Long> iterates small ids in ascending order
            addr = bd.broker_addrs[min(bd.broker_addrs)]
            break
    return list(topics), addr


def _topics_by_first_flag(t: RouteTables, test: Callable[[int], bool]) -> list[str]:
    # Java looks at the first QueueData only (HashMap order; ours is insertion order)
    return [
        topic for topic, qmap in t.topic_queue_table.items() if qmap and test(next(iter(qmap.values())).topic_sys_flag)
    ]


def get_unit_topics(t: RouteTables) -> list[str]:
    return _topics_by_first_flag(t, lambda f: bool(f & _UNIT))


def get_has_unit_sub_topic_list(t: RouteTables) -> list[str]:
    return _topics_by_first_flag(t, lambda f: bool(f & _UNIT_SUB))


def get_has_unit_sub_ununit_topic_list(t: RouteTables) -> list[str]:
    return _topics_by_first_flag(t, lambda f: bool(f & _UNIT_SUB) and not f & _UNIT)


# --------------------------------------------------------------------------- what the node itself asks


def last_seen(t: RouteTables, cluster_name: str, broker_addr: str) -> int | None:
    """``now_ms`` of the latest registration or heartbeat; None if not live."""
    live = t.broker_live_table.get(BrokerAddrInfo(cluster_name, broker_addr))
    return None if live is None else live.last_update_timestamp


def live_channels(t: RouteTables, brokers: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Hashable | None]:
    """The live ones among the (cluster, address) pairs, each with the channel it registered on."""
    live = t.broker_live_table
    found = {}
    for b in brokers:
        entry = live.get(BrokerAddrInfo(*b))
        if entry is not None:
            found[b] = entry.channel
    return found


def zone_of(t: RouteTables, broker_name: str) -> str | None:
    """The group's zone: every member's registration overwrites it, so it is the latest one sent."""
    bd = t.broker_addr_table.get(broker_name)
    return None if bd is None else bd.zone_name


def is_provisional(t: RouteTables, cluster_name: str, broker_addr: str) -> bool:
    """True while (cluster, addr) is a loaded entry its broker has not confirmed by registering."""
    return BrokerAddrInfo(cluster_name, broker_addr) in t.provisional


def counts(t: RouteTables) -> RouteCounts:
    return RouteCounts(
        brokers=len(t.broker_live_table),
        groups=len(t.broker_addr_table),
        clusters=len(t.cluster_addr_table),
        topics=len(t.topic_queue_table),
        longest_timeout_ms=max((v.heartbeat_timeout_millis for v in t.broker_live_table.values()), default=0),
    )


# --------------------------------------------------------------------------- what the streaming job asks


def groups_with_member(t: RouteTables, cluster_name: str, broker_addr: str) -> set[str]:
    """Names of the groups of ``cluster_name`` that list ``broker_addr``."""
    return {bd.broker_name for bd in groups_listing(t, cluster_name, broker_addr)}


def topics_served_by(t: RouteTables, groups: set[str]) -> set[str]:
    """Topics with a row of at least one of ``groups``."""
    return {topic for topic, qmap in t.topic_queue_table.items() if not groups.isdisjoint(qmap)}


def topic_queues(t: RouteTables, topics: Iterable[str]) -> dict[str, dict[str, QueueData]]:
    """The rows (broker name -> QueueData) of each of ``topics`` that has any."""
    tqt = t.topic_queue_table
    return {topic: dict(qmap) for topic in topics if (qmap := tqt.get(topic))}


def route_health(t: RouteTables, topics: Iterable[str]) -> RouteHealth:
    """Groups without a master, topics without a writable queue, and which of ``topics`` have no row.

    Producers send to a group's master only, so the queues of a group without one (or of a group
    no broker registered) are not writable, whatever their permission says.
    """
    tqt = t.topic_queue_table
    bat = t.broker_addr_table
    with_master = {name for name, bd in bat.items() if MASTER_ID in bd.broker_addrs}
    return RouteHealth(
        masterless_groups={
            name: bd.copy() for name, bd in bat.items() if bd.broker_addrs and MASTER_ID not in bd.broker_addrs
        },
        unwritable_topics={
            topic: dict(qmap)
            for topic, qmap in tqt.items()
            if not any(
                qd.perm & _WRITE and qd.write_queue_nums > 0 and name in with_master for name, qd in qmap.items()
            )
        },
        routeless_topics=[topic for topic in topics if topic not in tqt],
        group_clusters={name: bd.cluster for name, bd in bat.items()},
    )
