"""Fixtures shared by the route-table tests: the brokers of RocketMQ's RouteInfoManagerNewTest.

DEF master = Default_Cluster/Default_Broker id 0 at 127.0.0.1:10911 (HA :20911), DEF slave = id 1
at :30911 (HA :40911).  Every registration also carries ``baseTopic`` so it never has exactly one
topic (the single-topic guard would reject it).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from common.protocol.types import DataVersion, RegisterBrokerBody, TopicConfig
from common.routes import BrokerAddrInfo, RegisterBrokerResult, RouteInfoManager, RouteSettings, UnregisterRequest
from common.routes.model import Registration
from common.routes.snapshot import ModelSnapshot, SnapshotBroker, decode_model
from tests.support.clock import Clock

DEF_CLUSTER = "Default_Cluster"
DEF_BROKER = "Default_Broker"
MASTER_ADDR = "127.0.0.1:10911"
MASTER_HA = "127.0.0.1:20911"
SLAVE_ADDR = "127.0.0.1:30911"
SLAVE_HA = "127.0.0.1:40911"
DV1 = DataVersion(counter=1, timestamp=1_700_000_000_000)


def make_manager(**settings: bool) -> tuple[RouteInfoManager, Clock]:
    clock = Clock()
    return RouteInfoManager(RouteSettings(**settings), now_ms=clock), clock


@dataclass
class Broker:
    cluster: str = DEF_CLUSTER
    name: str = DEF_BROKER
    addr: str = MASTER_ADDR
    ha: str | None = MASTER_HA
    id: int = 0
    #: None = a 4.x broker that does not send the flag
    acting: bool | None = True
    dv: DataVersion = DV1

    def but(self, **kw) -> Broker:
        return replace(self, **kw)


MASTER = Broker()
SLAVE = Broker(addr=SLAVE_ADDR, ha=SLAVE_HA, id=1)


def topic_configs(
    *topics: str, rq: int = 8, wq: int = 8, perm: int = 6, sys_flag: int = 0, base: bool = True
) -> dict[str, TopicConfig]:
    table = {"baseTopic": TopicConfig("baseTopic")} if base else {}
    for t in topics:
        table[t] = TopicConfig(t, read_queue_nums=rq, write_queue_nums=wq, perm=perm, topic_sys_flag=sys_flag)
    return table


#: when a dict, registrations carry table ids as RegisterBodyCache's contract allows: equal tables,
#: equal ids (the cache shares ids only between equal tables of one broker; by content is stricter)
shared_table_ids: dict[str, int] | None = None


def registration(
    broker: Broker,
    *topics: str,
    channel: object | None = None,
    timeout: int | None = None,
    zone: str | None = "",
    configs: dict[str, TopicConfig] | None = None,
    filter_servers: list[str] | None = None,
    mappings: dict | None = None,
) -> Registration:
    body = RegisterBrokerBody(
        data_version=broker.dv,
        topic_config_table=topic_configs(*topics) if configs is None else configs,
        filter_server_list=[] if filter_servers is None else filter_servers,
        topic_queue_mapping_info_map=mappings or {},
    )
    if shared_table_ids is not None:
        key = repr(list(body.topic_config_table.items()))
        body.table_id = shared_table_ids.setdefault(key, len(shared_table_ids) + 1)
    return Registration(broker.cluster, broker.addr, broker.name, broker.id, broker.ha, zone, timeout, broker.acting,
                        body, channel if channel is not None else object())  # fmt: skip


def register(mgr: RouteInfoManager, broker: Broker, *topics: str, **kw) -> RegisterBrokerResult | None:
    """One REGISTER_BROKER through the manager; ``kw`` as :func:`registration` takes them."""
    r = registration(broker, *topics, **kw)
    return mgr.register_broker(r.cluster_name, r.broker_addr, r.broker_name, r.broker_id, r.ha_server_addr,
                               r.zone_name, r.timeout_millis, r.enable_acting_master, r.body, r.channel)  # fmt: skip


def unregister(mgr: RouteInfoManager, broker: Broker):
    """An UNREGISTER_BROKER decided and applied now (so never fenced)."""
    return mgr.unregister_brokers(
        [UnregisterRequest(broker.cluster, broker.addr, broker.name, broker.id, mgr.next_seq())]
    )


def members(mgr: RouteInfoManager, broker_name: str = DEF_BROKER) -> dict[int, str]:
    """The group's id -> address, as GET_BROKER_CLUSTER_INFO shows it."""
    return mgr.get_all_cluster_info()[0][broker_name].broker_addrs


def dumped(mgr: RouteInfoManager) -> ModelSnapshot:
    """Groups, live entries, filter servers and mappings as the manager writes them for the job's model."""
    return decode_model({}, {}, mgr.encode_model_brokers())


def live_entry(mgr: RouteInfoManager, cluster: str, addr: str) -> SnapshotBroker | None:
    return dumped(mgr).live.get(BrokerAddrInfo(cluster, addr))


def addrs_of(mgr: RouteInfoManager, topic: str, broker_name: str = DEF_BROKER) -> dict[int, str]:
    route = mgr.pickup_topic_route_data(topic)
    assert route is not None, f"no route for {topic}"
    return next(bd.broker_addrs for bd in route.broker_datas if bd.broker_name == broker_name)


def perm_of(mgr: RouteInfoManager, topic: str, broker_name: str = DEF_BROKER) -> int:
    route = mgr.pickup_topic_route_data(topic)
    assert route is not None, f"no route for {topic}"
    return next(qd.perm for qd in route.queue_datas if qd.broker_name == broker_name)
