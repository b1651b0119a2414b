"""Value types of the route tables: keys, live entries, requests and results.

Results are values the caller inspects; nothing here logs or talks to the network.  The types the
wire carries (QueueData, BrokerData, DataVersion, ...) live in :mod:`common.protocol.types`.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from common.protocol.types import BrokerData, DataVersion, QueueData, RegisterBrokerBody


class BrokerAddrInfo(NamedTuple):  # a tuple: hashed and built in C, on every heartbeat
    """Liveness key: the same address in two clusters is two brokers."""

    cluster_name: str
    broker_addr: str


@dataclass(slots=True)
class BrokerLiveInfo:
    """What we know about one registered broker process (see :mod:`common.routes.tables` on who may mutate it)."""

    last_update_timestamp: int
    heartbeat_timeout_millis: int
    data_version: DataVersion
    #: the connection the broker registered on; compared by identity, never used here
    channel: Hashable | None
    ha_server_addr: str | None
    #: sequence number of the registration that created this entry
    registered_seq: int
    #: sequence number of the latest registration *or* heartbeat; unregister decisions older than
    #: this are stale (see ``RouteInfoManager`` on fencing)
    refreshed_seq: int = 0

    def __post_init__(self) -> None:
        if self.refreshed_seq < self.registered_seq:
            self.refreshed_seq = self.registered_seq

    def expired(self, now_ms: int) -> bool:
        # strictly after the deadline, as Java's ``last + timeout < now``
        return self.last_update_timestamp + self.heartbeat_timeout_millis < now_ms


@dataclass(frozen=True, slots=True)
class Registration:
    """One REGISTER_BROKER as the route tables take it (spec §3.2)."""

    cluster_name: str
    broker_addr: str
    broker_name: str
    broker_id: int
    ha_server_addr: str | None
    zone_name: str | None = None
    #: the broker's own heartbeat timeout; None = DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
    timeout_millis: int | None = None
    #: None: a 4.x broker, which does not send the flag
    enable_acting_master: bool | None = None
    body: RegisterBrokerBody | None = None
    #: the connection it came on; compared by identity, never used by the tables
    channel: Hashable | None = None

    @property
    def addr_info(self) -> BrokerAddrInfo:
        return BrokerAddrInfo(self.cluster_name, self.broker_addr)


@dataclass(frozen=True, slots=True)
class UnregisterRequest:
    """One broker to remove, and when (in manager sequence numbers) that was decided.

    ``broker_name``/``broker_id`` are None when the broker is live but belongs to no group of its
    cluster (then only its live entry and filter servers are removed).
    """

    cluster_name: str
    broker_addr: str
    broker_name: str | None
    broker_id: int | None
    #: ``RouteInfoManager.next_seq()`` taken when the decision was made
    decided_seq: int

    @property
    def addr_info(self) -> BrokerAddrInfo:
        return BrokerAddrInfo(self.cluster_name, self.broker_addr)


class FenceReason(enum.Enum):
    #: the broker registered or heartbeated after the decision
    REFRESHED = "refreshed"
    #: the address now holds another broker id in its group (role switch after the decision)
    ROLE_CHANGED = "role_changed"


@dataclass(frozen=True, slots=True)
class FencedRequest:
    request: UnregisterRequest
    reason: FenceReason


@dataclass(frozen=True, slots=True)
class MinBrokerIdChange:
    """A NOTIFY_MIN_BROKER_ID_CHANGE (905) the server may send, oneway, to ``notify_addrs``."""

    broker_name: str
    min_broker_id: int
    min_broker_addr: str
    offline_broker_addr: str | None
    ha_broker_addr: str | None
    notify_addrs: tuple[str, ...]

    @classmethod
    def of_group(cls, name: str, addrs: dict[int, str], offline: str | None, ha: str | None) -> MinBrokerIdChange:
        """The change a group's members (id -> addr, as left) are told about."""
        low = min(addrs)
        # a departure tells everyone left; an arrival tells everyone but the new minimum (a group of
        # one is told anyway).  Ascending ids, the order Java's HashMap<Long, String> yields small ids in.
        ids = sorted(addrs)
        if offline is None and len(ids) > 1:
            ids = ids[1:]
        return cls(name, low, addrs[low], offline, ha, tuple(addrs[i] for i in ids))


@dataclass(slots=True)
class RegisterBrokerResult:
    """Outcome of one REGISTER_BROKER; the handler answers SUCCESS for every instance of it."""

    #: the group master's HA address and address, for a slave whose master is live
    ha_server_addr: str | None = None
    master_addr: str | None = None
    #: first time this (group, id) got an address; the broker's topic table was (re)applied
    register_first: bool = False
    #: the DataVersion differs from the one held for (cluster, addr), or none was held
    data_version_changed: bool = False
    #: something a route / cluster-info / topic-list answer shows changed (``version`` bumped)
    routes_changed: bool = False
    #: the registration's filterServerList changed this address's filter servers (§3.2 step 11)
    filter_servers_changed: bool = False
    #: the group's BrokerData (zone, acting-master flag, member addresses) or its cluster's group
    #: list changed; a broker may change its zone or flag without changing its DataVersion
    broker_data_changed: bool = False
    #: the registration lost the stateVersion conflict check and was ignored (§3.2 step 6)
    conflict: bool = False
    registered_seq: int | None = None
    min_broker_id_change: MinBrokerIdChange | None = None

    @property
    def topic_config_changed(self) -> bool:
        """True when an event for this registration should carry the topic table."""
        return self.register_first or self.data_version_changed


@dataclass(slots=True)
class UnregisterOutcome:
    applied: list[UnregisterRequest] = field(default_factory=list)
    fenced: list[FencedRequest] = field(default_factory=list)
    #: broker groups left with no member (their queues were dropped)
    removed_brokers: set[str] = field(default_factory=set)
    #: broker groups that lost members but still exist
    reduced_brokers: set[str] = field(default_factory=set)
    #: channels of the live entries removed, for the server to close
    removed_channels: list[Hashable] = field(default_factory=list)
    min_broker_id_changes: list[MinBrokerIdChange] = field(default_factory=list)
    routes_changed: bool = False

    @property
    def fenced_count(self) -> int:
        return len(self.fenced)


@dataclass(slots=True)
class ProvisionalStats:
    """What became of the provisional entries: each loaded one is confirmed or dropped once."""

    loaded: int = 0
    #: replaced by the broker's own registration
    confirmed: int = 0
    #: removed unconfirmed: deadline passed, or an unregistration / monitor action removed it
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class RouteCounts:
    """How much the tables hold, for logs and stats."""

    #: live entries (registered or provisional brokers)
    brokers: int
    groups: int
    clusters: int
    topics: int
    #: the longest heartbeat timeout among the live entries (ms), 0 when there are none
    longest_timeout_ms: int


@dataclass(frozen=True, slots=True)
class RouteHealth:
    """What the tables show is wrong with the routes now (copies), for the monitor's alerts."""

    #: groups with members but none of id 0
    masterless_groups: dict[str, BrokerData]
    #: topics none of whose groups has a queue a producer can write to: write permission, write
    #: queues, and a master (id 0) in the group to send to
    unwritable_topics: dict[str, dict[str, QueueData]]
    #: of the topics asked about, those with no row at all, in the order asked
    routeless_topics: list[str]
    #: the cluster of every registered group (group name -> cluster name)
    group_clusters: dict[str, str] = field(default_factory=dict)


class RouteSettingsLike(Protocol):
    support_acting_master: bool
    delete_topic_with_broker_registration: bool
    notify_min_broker_id_changed: bool


@dataclass(slots=True)
class RouteSettings:
    """The settings the manager reads at use time; any object with these attributes will do."""

    support_acting_master: bool = False
    delete_topic_with_broker_registration: bool = False
    notify_min_broker_id_changed: bool = False
