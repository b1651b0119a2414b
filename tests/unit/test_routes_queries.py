"""Route lookups, lists and admin writes (spec §3.6, §3.7, §2.2 codes 205/206/216/224/304/311-313/322/901)."""

from __future__ import annotations

import pytest
from routes_support import (
    DEF_BROKER,
    DEF_CLUSTER,
    DV1,
    MASTER,
    MASTER_ADDR,
    SLAVE,
    SLAVE_ADDR,
    addrs_of,
    make_manager,
    members,
    register,
    topic_configs,
    unregister,
)

from common.protocol.bodies import encode_route
from common.protocol.codes import SYNC_BROKER_MEMBER_GROUP_PREFIX, Perm, TopicSysFlag
from common.protocol.types import BrokerData, DataVersion, QueueData, RegisterBrokerBody, TopicConfig
from common.routes.queries import pickup_topic_route_data
from common.routes.snapshot import decode_model
from common.routes.tables import RouteTables

READ = int(Perm.READ)
RW = int(Perm.READ | Perm.WRITE)


def test_unknown_topic_has_no_route():
    mgr, _ = make_manager()
    assert mgr.pickup_topic_route_data("unit_test") is None


def test_pickup_route_one_then_two_brokers():
    mgr, _ = make_manager(support_acting_master=True)
    register(mgr, MASTER, "TestTopic")
    route = mgr.pickup_topic_route_data("TestTopic")
    assert [(b.broker_name, b.broker_addrs) for b in route.broker_datas] == [(DEF_BROKER, {0: MASTER_ADDR})]
    assert route.queue_datas == [QueueData(DEF_BROKER, 8, 8, RW, 0)]
    assert route.order_topic_conf is None and route.filter_server_table == {}

    register(mgr, MASTER.but(name="AnotherBroker"), "TestTopic")
    route = mgr.pickup_topic_route_data("TestTopic")
    assert {b.broker_name for b in route.broker_datas} == {DEF_BROKER, "AnotherBroker"}
    assert {q.broker_name for q in route.queue_datas} == {DEF_BROKER, "AnotherBroker"}


def test_two_nodes_answer_the_same_route_whatever_order_brokers_registered_in():
    # two brokers registering at once reach the two nodes (and the job that writes Redis) in either
    # order; every copy of the route must still be the same bytes
    first, _ = make_manager()
    second, _ = make_manager()
    zeta = MASTER.but(name="zeta", addr="127.0.0.1:20911")
    alpha = MASTER.but(name="alpha", addr="127.0.0.1:30911")
    for mgr, order in ((first, (zeta, alpha)), (second, (alpha, zeta))):
        for broker in order:
            register(mgr, broker, "Shared")
    a, b = first.pickup_topic_route_data("Shared"), second.pickup_topic_route_data("Shared")
    assert [bd.broker_name for bd in a.broker_datas] == ["alpha", "zeta"]
    assert [qd.broker_name for qd in a.queue_datas] == ["alpha", "zeta"]
    for standard in (True, False):
        assert encode_route(a, standard=standard) == encode_route(b, standard=standard)


def test_route_whose_brokers_are_all_gone_is_none():
    # a topic left pointing at nothing (the job restores whatever its snapshot holds)
    t = RouteTables(topic_queue_table={"T": {DEF_BROKER: QueueData(DEF_BROKER, 8, 8, RW)}})
    assert pickup_topic_route_data(t, "T", support_acting_master=False) is None


def test_route_broker_datas_are_copies():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    route = mgr.pickup_topic_route_data("T")
    route.broker_datas[0].broker_addrs[9] = "x"
    assert addrs_of(mgr, "T") == {0: MASTER_ADDR}


@pytest.mark.parametrize("rq", [8, 1], ids=["partition-order", "global-order"])
def test_order_topic_acting_master(rq):
    mgr, _ = make_manager(support_acting_master=True)
    topic = "OrderTopicTest"

    def reg(broker):
        configs = {"baseTopic": TopicConfig("baseTopic", rq, rq, order=True)}
        configs[topic] = TopicConfig(topic, rq, rq, 6, order=True)
        register(mgr, broker, configs=configs)

    # case 1: only the slave registers
    reg(SLAVE)
    route = mgr.pickup_topic_route_data(topic)
    assert route.broker_datas[0].broker_addrs == {0: SLAVE_ADDR}
    assert not route.queue_datas[0].perm & Perm.WRITE
    unregister(mgr, SLAVE)

    # case 2: slave and master, then the master leaves
    reg(SLAVE)
    reg(MASTER)
    unregister(mgr, MASTER)
    route = mgr.pickup_topic_route_data(topic)
    assert route.broker_datas[0].broker_addrs == {0: SLAVE_ADDR}
    assert not route.queue_datas[0].perm & Perm.WRITE
    unregister(mgr, SLAVE)

    # case 3: two groups; only the default one loses its master
    reg(SLAVE)
    reg(MASTER)
    other = DEF_BROKER + "_ANOTHER"
    reg(MASTER.but(name=other))
    reg(SLAVE.but(name=other))
    assert len(mgr.pickup_topic_route_data(topic).broker_datas) == 2
    unregister(mgr, MASTER)
    route = mgr.pickup_topic_route_data(topic)
    assert len(route.broker_datas) == 2 and len(route.queue_datas) == 2
    by_name = {b.broker_name: b.broker_addrs for b in route.broker_datas}
    assert by_name == {DEF_BROKER: {0: SLAVE_ADDR}, other: {0: MASTER_ADDR, 1: SLAVE_ADDR}}


def test_acting_master_needs_the_setting_and_skips_sync_member_topics():
    mgr, _ = make_manager(support_acting_master=False)
    sync_topic = SYNC_BROKER_MEMBER_GROUP_PREFIX + DEF_BROKER
    register(mgr, SLAVE, "T", sync_topic)
    assert addrs_of(mgr, "T") == {1: SLAVE_ADDR}
    mgr.settings.support_acting_master = True  # read at use time
    assert addrs_of(mgr, "T") == {0: SLAVE_ADDR}
    assert addrs_of(mgr, sync_topic) == {1: SLAVE_ADDR}


def test_acting_master_only_for_read_only_groups():
    mgr, _ = make_manager(support_acting_master=True)
    register(mgr, SLAVE, "T")
    mgr.add_write_perm_of_broker(DEF_BROKER)
    assert addrs_of(mgr, "T") == {1: SLAVE_ADDR}


def test_filter_servers_appear_per_member_address():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T", filter_servers=["f1:1"])
    register(mgr, SLAVE, "T", filter_servers=["f2:1", "f3:1"])
    assert mgr.pickup_topic_route_data("T").filter_server_table == {MASTER_ADDR: ["f1:1"], SLAVE_ADDR: ["f2:1", "f3:1"]}


def test_cluster_info_two_clusters():
    mgr, _ = make_manager()
    register(mgr, MASTER, "TestTopic")
    register(mgr, MASTER.but(cluster="AnotherCluster", name="AnotherBroker", addr="127.0.0.1:30911"), "TestTopic1")
    brokers, clusters = mgr.get_all_cluster_info()
    assert clusters == {DEF_CLUSTER: {DEF_BROKER}, "AnotherCluster": {"AnotherBroker"}}
    assert {n: b.broker_addrs[0] for n, b in brokers.items()} == {
        DEF_BROKER: MASTER_ADDR,
        "AnotherBroker": "127.0.0.1:30911",
    }
    brokers[DEF_BROKER].broker_addrs.clear()
    clusters[DEF_CLUSTER].clear()
    assert mgr.get_all_cluster_info()[1][DEF_CLUSTER] == {DEF_BROKER}
    assert members(mgr) == {0: MASTER_ADDR}


def test_delete_topic_everywhere_and_per_cluster():
    mgr, _ = make_manager()
    register(mgr, MASTER, "TestTopic")
    assert mgr.delete_topic("TestTopic")
    assert mgr.pickup_topic_route_data("TestTopic") is None
    assert not mgr.delete_topic("TestTopic")

    register(mgr, MASTER.but(dv=DataVersion(2, 0, 0)), "TestTopic")
    register(mgr, MASTER.but(cluster="AnotherCluster", name="AnotherBroker"), "TestTopic")
    assert len(mgr.pickup_topic_route_data("TestTopic").broker_datas) == 2
    assert not mgr.delete_topic("TestTopic", "NoSuchCluster")
    v = mgr.version
    assert mgr.delete_topic("TestTopic", DEF_CLUSTER)
    assert mgr.version > v
    (bd,) = mgr.pickup_topic_route_data("TestTopic").broker_datas
    assert bd.broker_name == "AnotherBroker"
    assert mgr.delete_topic("TestTopic", "AnotherCluster")
    assert "TestTopic" not in mgr.get_all_topic_list()
    assert not mgr.delete_topic("TestTopic", "")  # empty cluster means everywhere


def test_all_topic_list():
    mgr, _ = make_manager()
    assert mgr.get_all_topic_list() == []
    register(mgr, MASTER, "TestTopic", "TestTopic1", "TestTopic2")
    assert set(mgr.get_all_topic_list()) == {"baseTopic", "TestTopic", "TestTopic1", "TestTopic2"}


def test_topics_by_cluster():
    mgr, _ = make_manager()
    register(mgr, MASTER, "A", "Shared")
    register(mgr, MASTER.but(name="B2", addr="x:1"), "B", "Shared")
    register(mgr, MASTER.but(cluster="C2", name="B3", addr="y:1"), "C")
    assert sorted(mgr.get_topics_by_cluster(DEF_CLUSTER)) == ["A", "B", "Shared", "baseTopic"]
    assert sorted(mgr.get_topics_by_cluster("C2")) == ["C", "baseTopic"]
    assert mgr.get_topics_by_cluster("unknown") == []


def test_system_topic_list_names_clusters_and_brokers_and_one_address():
    mgr, _ = make_manager()
    assert mgr.get_system_topic_list() == ([], None)
    register(mgr, SLAVE, "T")
    register(mgr, MASTER, "T")
    register(mgr, MASTER.but(cluster="C2", name="C2", addr="z:1"), "T")
    topics, addr = mgr.get_system_topic_list()
    assert sorted(topics) == ["C2", DEF_BROKER, DEF_CLUSTER]  # "C2" named twice, listed once
    assert addr == MASTER_ADDR  # lowest id of the first non-empty group


def test_system_topic_list_skips_empty_groups():
    mgr, _ = make_manager()
    register(mgr, MASTER, configs={"Only": TopicConfig("Only")})  # guard leaves an empty group
    register(mgr, MASTER.but(name="B2", addr="b2:1"), "T")
    assert mgr.get_system_topic_list()[1] == "b2:1"


def test_unit_topic_lists_look_at_the_first_queue_data():
    mgr, _ = make_manager()
    unit, sub = int(TopicSysFlag.UNIT), int(TopicSysFlag.UNIT_SUB)
    configs = {
        "plain": TopicConfig("plain"),
        "unit": TopicConfig("unit", topic_sys_flag=unit),
        "sub": TopicConfig("sub", topic_sys_flag=sub),
        "both": TopicConfig("both", topic_sys_flag=unit | sub),
    }
    register(mgr, MASTER, configs=configs)
    # a second broker disagrees about "plain"; only the first QueueData counts
    register(
        mgr,
        MASTER.but(name="B2", addr="b2:1"),
        configs={"plain": TopicConfig("plain", topic_sys_flag=unit), "x": TopicConfig("x")},
    )
    assert sorted(mgr.get_unit_topics()) == ["both", "unit"]
    assert sorted(mgr.get_has_unit_sub_topic_list()) == ["both", "sub"]
    assert mgr.get_has_unit_sub_ununit_topic_list() == ["sub"]


def test_broker_member_group():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    register(mgr, SLAVE, "T")
    assert mgr.get_broker_member_group("AskedCluster", DEF_BROKER) == BrokerData(
        "AskedCluster", DEF_BROKER, {0: MASTER_ADDR, 1: SLAVE_ADDR}
    )
    assert mgr.get_broker_member_group(DEF_CLUSTER, "nope") == BrokerData(DEF_CLUSTER, "nope", {})


def test_wipe_and_add_write_perm_count_topics():
    mgr, _ = make_manager()
    register(mgr, MASTER.but(acting=False, id=1234), configs=topic_configs("unit-test0", "unit-test1", base=False))
    v = mgr.version
    assert mgr.wipe_write_perm_of_broker(DEF_BROKER) == 2
    assert {q.perm for t in ("unit-test0", "unit-test1") for q in mgr.pickup_topic_route_data(t).queue_datas} == {READ}
    assert mgr.version > v
    v = mgr.version
    assert mgr.wipe_write_perm_of_broker(DEF_BROKER) == 2  # counted again, nothing changes
    assert mgr.version == v
    assert mgr.add_write_perm_of_broker(DEF_BROKER) == 2
    assert mgr.pickup_topic_route_data("unit-test0").queue_datas[0].perm == RW
    assert mgr.wipe_write_perm_of_broker("unknown") == 0


def test_add_write_perm_drops_inherit_and_priority_bits():
    mgr, _ = make_manager()
    register(mgr, MASTER, configs=topic_configs("T", perm=int(Perm.READ | Perm.INHERIT | Perm.PRIORITY)))
    assert mgr.add_write_perm_of_broker(DEF_BROKER) == 2
    assert mgr.pickup_topic_route_data("T").queue_datas[0].perm == RW


def test_earlier_routes_are_not_changed_by_later_writes():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    before = mgr.pickup_topic_route_data("T")
    mgr.wipe_write_perm_of_broker(DEF_BROKER)
    assert before.queue_datas[0].perm == RW


def test_query_data_version_answers_the_registered_data_version_of_that_cluster_and_address():
    mgr, _ = make_manager()
    assert mgr.touch(DEF_CLUSTER, MASTER_ADDR) is None
    register(mgr, MASTER, "TestTopic")
    assert mgr.touch(DEF_CLUSTER, MASTER_ADDR) == DV1
    assert mgr.touch("other", MASTER_ADDR) is None
    register(mgr, MASTER.but(dv=DataVersion(DV1.counter, 0, DV1.timestamp + 1000)), "TestTopic")
    assert mgr.touch(DEF_CLUSTER, MASTER_ADDR) == DataVersion(DV1.counter, 0, DV1.timestamp + 1000)


# --- a 3 x 3 cluster (RouteInfoManagerStaticRegisterTest / BrokerRegisterTest / BrokerPermTest) --


@pytest.fixture
def three_by_three():
    mgr, _ = make_manager()
    configs = {f"topic-{i}": TopicConfig(f"topic-{i}", 8, 8, 6) for i in range(10)}
    groups = {}
    for g in range(3):
        name = f"broker-{g}"
        groups[name] = {i: f"cluster-{name}:{i}" for i in range(3)}
        for i, addr in groups[name].items():
            # Java's test base uses the 10-argument overload: enableActingMaster = false
            body = RegisterBrokerBody(topic_config_table=dict(configs), filter_server_list=[])
            mgr.register_broker("cluster", addr, name, i, addr, None, None, False, body, object())
    return mgr, configs, groups


def test_three_by_three_cluster_info_and_lists(three_by_three):
    mgr, configs, groups = three_by_three
    _, clusters = mgr.get_all_cluster_info()
    assert clusters == {"cluster": set(groups)}
    assert set(mgr.get_all_topic_list()) == set(configs)
    assert set(mgr.get_topics_by_cluster("cluster")) == set(configs)


def test_three_by_three_route(three_by_three):
    mgr, configs, groups = three_by_three
    route = mgr.pickup_topic_route_data("topic-0")
    assert sorted((b.broker_name, b.broker_addrs) for b in route.broker_datas) == sorted(groups.items())
    assert {q.broker_name for q in route.queue_datas} == set(groups)
    assert all(
        (q.read_queue_nums, q.write_queue_nums, q.perm, q.topic_sys_flag) == (8, 8, 6, 0) for q in route.queue_datas
    )
    mgr.delete_topic("topic-0")
    assert mgr.pickup_topic_route_data("topic-0") is None


def test_three_by_three_perm_ops(three_by_three):
    mgr, configs, _ = three_by_three
    assert mgr.wipe_write_perm_of_broker("broker-0") == len(configs)
    assert mgr.add_write_perm_of_broker("broker-0") == len(configs)


def test_version_moves_only_with_answer_changes():
    mgr, _ = make_manager()
    v0 = mgr.version
    register(mgr, MASTER, "T")
    v1 = mgr.version
    assert v1 > v0
    register(mgr, MASTER, "T")
    mgr.next_seq()
    mgr.pickup_topic_route_data("T")
    assert mgr.version == v1
    register(mgr, SLAVE, "T")
    assert mgr.version > v1
    v2 = mgr.version
    mgr.register_topic("T", [QueueData(DEF_BROKER, 8, 8, RW)])  # identical: no change
    assert mgr.version == v2
    mgr.register_topic("T", [QueueData(DEF_BROKER, 4, 4, RW)])
    assert mgr.version > v2


def test_the_groups_listing_an_address_follow_registrations_unregistrations_and_restores():
    # a broker renamed in place stays listed by its old group too, as in Java, until it leaves it
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    register(mgr, MASTER.but(name="Renamed"), "T")
    register(mgr, MASTER.but(cluster="Other", name="Elsewhere"), "T")
    assert mgr.groups_with_member(DEF_CLUSTER, MASTER_ADDR) == {DEF_BROKER, "Renamed"}
    assert mgr.groups_with_member("Other", MASTER_ADDR) == {"Elsewhere"}
    assert mgr.groups_with_member(DEF_CLUSTER, SLAVE_ADDR) == set()
    # an expiry or a close is decided against the first group (in table order) that lists the address
    request = mgr.build_unregister_request(DEF_CLUSTER, MASTER_ADDR)
    assert request is not None and (request.broker_name, request.broker_id) == (DEF_BROKER, 0)

    unregister(mgr, MASTER)
    assert mgr.groups_with_member(DEF_CLUSTER, MASTER_ADDR) == {"Renamed"}

    # a model restored from its snapshot (the job after a restart) answers the same
    restored, _ = make_manager()
    restored.restore(decode_model({}, {}, mgr.encode_model_brokers()))
    assert restored.groups_with_member(DEF_CLUSTER, MASTER_ADDR) == {"Renamed"}
    assert restored.groups_with_member("Other", MASTER_ADDR) == {"Elsewhere"}
