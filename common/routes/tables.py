"""The route tables as plain data: RocketMQ's ``RouteInfoManager`` fields, and nothing else.

Six tables named as in RocketMQ (``topic_queue_table``, ``broker_addr_table``,
``cluster_addr_table``, ``broker_live_table``, ``filter_server_table``,
``topic_queue_mapping_info_table``), plus ``version`` (bumped on every change an answer can show,
so answers can be cached by it), ``seq`` (which fences unregistrations) and a warm start's
provisional entries.  The operations are functions over a :class:`RouteTables`, one module per
concern (register, unregister, provisional, queries, admin, snapshot); they never lock, await or do
I/O, reads hand out copies, and a mutation returns what the caller must do (channels to close,
brokers to notify) for after the lock is released.  A ``RouteTables`` belongs to one
:class:`~common.routes.manager.RouteInfoManager`, which calls one function per lock acquisition.
``docs/internals/routes.md`` describes each table and module.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from common.protocol.types import BrokerData, QueueData
from common.routes.model import BrokerAddrInfo, BrokerLiveInfo, ProvisionalStats


@dataclass(slots=True, eq=False)
class RouteTables:
    topic_queue_table: dict[str, dict[str, QueueData]] = field(default_factory=dict)
    broker_addr_table: dict[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: dict[str, set[str]] = field(default_factory=dict)
    broker_live_table: dict[BrokerAddrInfo, BrokerLiveInfo] = field(default_factory=dict)
    filter_server_table: dict[BrokerAddrInfo, list[str]] = field(default_factory=dict)
    topic_queue_mapping_info_table: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: bumped on every change an answer can show (see the module docstring)
    version: int = 0
    #: the latest registration, heartbeat or unregistration decision (see ``next_seq``)
    seq: int = 0
    #: live entries loaded by warm start that no registration of their broker confirmed yet
    provisional: set[BrokerAddrInfo] = field(default_factory=set)
    #: broker groups whose topic rows were loaded and not yet rewritten by their own broker
    provisional_groups: set[str] = field(default_factory=set)
    provisional_stats: ProvisionalStats = field(default_factory=ProvisionalStats)
    #: broker address -> names of the groups that listed it: a superset (a member leaving its group
    #: is not taken out here), checked and pruned by :func:`groups_listing`, so that finding an
    #: address's groups costs its own groups rather than a scan of every group
    addr_groups: dict[str, set[str]] = field(default_factory=dict)
    #: broker group -> (table_id, write wiped) of the registered topic table its rows were last made
    #: equal to; true while ``version`` is still ``rows_version`` (every change to a row bumps
    #: ``version``), so a re-registration of that same table has no row to check
    rows_from: dict[str, tuple[int, bool]] = field(default_factory=dict)
    rows_version: int = -1

    def changed(self) -> None:
        self.version += 1

    def next_seq(self) -> int:
        """A number newer than every registration, heartbeat or decision so far."""
        self.seq += 1
        return self.seq

    def is_empty(self) -> bool:
        """True when no table holds anything (the cluster table follows the group table)."""
        return not (self.broker_addr_table or self.broker_live_table or self.topic_queue_table
                    or self.filter_server_table or self.topic_queue_mapping_info_table)  # fmt: skip


def note_member(t: RouteTables, broker_addr: str, broker_name: str) -> None:
    """``broker_addr`` is now listed by group ``broker_name`` (every path that adds a member calls this)."""
    t.addr_groups.setdefault(broker_addr, set()).add(broker_name)


def index_members(t: RouteTables) -> None:
    """Rebuild :attr:`RouteTables.addr_groups` after ``broker_addr_table`` was replaced whole."""
    t.addr_groups = {}
    for name, bd in t.broker_addr_table.items():
        for addr in bd.broker_addrs.values():
            note_member(t, addr, name)


def groups_listing(t: RouteTables, cluster_name: str, broker_addr: str) -> list[BrokerData]:
    """The groups of ``cluster_name`` whose members include ``broker_addr``, in the group table's order."""
    names = t.addr_groups.get(broker_addr)
    if not names:
        return []
    found = []
    for name in list(names):
        bd = t.broker_addr_table.get(name)
        if bd is None or broker_addr not in bd.broker_addrs.values():
            names.discard(name)  # it left: prune the superset
        elif bd.cluster == cluster_name:
            found.append(bd)
    if not names:
        del t.addr_groups[broker_addr]
    if len(found) > 1:  # an address in several groups of one cluster (a renamed broker): keep table order
        order = {name: i for i, name in enumerate(t.broker_addr_table)}
        found.sort(key=lambda bd: order[bd.broker_name])
    return found


def drop_live(t: RouteTables, key: BrokerAddrInfo) -> BrokerLiveInfo | None:
    """Remove a live entry; a provisional one takes its copied filter servers with it."""
    live = t.broker_live_table.pop(key, None)
    if key in t.provisional:
        t.provisional.discard(key)
        t.provisional_stats.dropped += 1
        # copied filter servers go with their entry on every drop path, as on unregistration;
        # a registered broker's stay where Java leaves them (the stateVersion conflict)
        if t.filter_server_table.pop(key, None) is not None:
            t.changed()
    return live


def drop_rows_missing_from(t: RouteTables, broker_name: str, kept: Any) -> bool:
    """Remove ``broker_name``'s queues of topics not in ``kept`` (a mapping or set); True if any went."""
    tqt = t.topic_queue_table
    gone = [topic for topic, qmap in tqt.items() if broker_name in qmap and topic not in kept]
    for topic in gone:
        qmap = tqt[topic]
        del qmap[broker_name]
        if not qmap:
            del tqt[topic]
    return bool(gone)


@functools.lru_cache(maxsize=4096)
def shared_queue_data(broker_name: str, read: int, write: int, perm: int, sys_flag: int) -> QueueData:
    """One QueueData per distinct value, shared by every topic that has it.

    A broker's topics mostly have the same queues (8/8, perm 6): a 100,000-topic registration makes
    a handful of QueueData instead of 100,000, and the garbage collector, whose full collections walk
    every tracked object with the GIL held, has half as many objects to walk (each topic's row map is
    the other half).  QueueData is a tuple, so sharing it is safe.
    """
    return QueueData(broker_name, read, write, perm, sys_flag)


def with_perm(qd: QueueData, perm: int) -> QueueData:
    return shared_queue_data(qd.broker_name, qd.read_queue_nums, qd.write_queue_nums, perm, qd.topic_sys_flag)
