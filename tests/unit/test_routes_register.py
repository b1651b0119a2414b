"""REGISTER_BROKER semantics (spec §3.2), ported from RouteInfoManager*Test with an injected clock."""

from __future__ import annotations

import pytest
import routes_support
from routes_support import (
    DEF_BROKER,
    DEF_CLUSTER,
    DV1,
    MASTER,
    MASTER_ADDR,
    MASTER_HA,
    SLAVE,
    SLAVE_ADDR,
    addrs_of,
    dumped,
    live_entry,
    make_manager,
    members,
    perm_of,
    register,
    registration,
    topic_configs,
    unregister,
)

from common.protocol.codes import Perm
from common.protocol.types import DataVersion, QueueData, RegisterBrokerBody, TopicConfig
from common.routes import RouteSettings
from common.routes.register import register_broker
from common.routes.tables import RouteTables

WRITABLE = int(Perm.READ | Perm.WRITE)


@pytest.fixture(autouse=True, params=["own tables", "shared tables"])
def table_ids(request, monkeypatch):
    """Every test twice: each body its own parse, and equal tables shared as RegisterBodyCache shares them."""
    if request.param == "shared tables":
        monkeypatch.setattr(routes_support, "shared_table_ids", {})


def test_master_result_is_empty_and_slave_learns_master_ha_address():
    mgr, _ = make_manager(support_acting_master=True)
    master = register(mgr, MASTER, "TestTopic")
    assert master is not None and master.ha_server_addr is None and master.master_addr is None
    slave = register(mgr, SLAVE, "TestTopic")
    assert (slave.ha_server_addr, slave.master_addr) == (MASTER_HA, MASTER_ADDR)


def test_slave_gets_no_master_address_when_master_is_not_live():
    t, settings = RouteTables(), RouteSettings()
    register_broker(t, settings, 0, registration(MASTER, "TestTopic"))
    t.broker_live_table.clear()  # master's live entry gone, membership kept
    slave = register_broker(t, settings, 0, registration(SLAVE, "TestTopic"))
    assert slave.master_addr is None and slave.ha_server_addr is None


def test_register_slave_then_new_topic_from_master_lists_both_members():
    mgr, _ = make_manager(support_acting_master=True)
    register(mgr, MASTER, "TestTopic")
    assert set(addrs_of(mgr, "TestTopic")) == {0}
    register(mgr, SLAVE, "TestTopic")
    assert addrs_of(mgr, "TestTopic") == {0: MASTER_ADDR, 1: SLAVE_ADDR}
    register(mgr, MASTER.but(dv=DataVersion(2, 0, 1)), "TestTopic", "TestTopic1")
    assert addrs_of(mgr, "TestTopic1") == {0: MASTER_ADDR, 1: SLAVE_ADDR}


def test_first_registration_flags_and_unchanged_reregistration_is_a_heartbeat():
    mgr, clock = make_manager()
    first = register(mgr, MASTER, "TestTopic")
    assert first.register_first and first.data_version_changed and first.topic_config_changed and first.routes_changed
    v = mgr.version
    clock.advance(30_000)
    again = register(mgr, MASTER, "TestTopic")
    assert not again.register_first and not again.data_version_changed and not again.topic_config_changed
    assert not again.routes_changed and mgr.version == v
    assert mgr.last_seen(DEF_CLUSTER, MASTER_ADDR) == clock.ms
    bumped = register(mgr, MASTER.but(dv=DataVersion(2, 0, 5)), "TestTopic")
    assert bumped.data_version_changed and not bumped.routes_changed  # same topics: answers unchanged
    assert mgr.version == v


def test_switch_broker_role_without_acting_master():
    mgr, _ = make_manager(support_acting_master=True)
    master, slave = MASTER.but(acting=False), SLAVE.but(acting=False)
    register(mgr, master, "TestTopic")
    register(mgr, slave, "TestTopic")
    unregister(mgr, master)
    assert addrs_of(mgr, "TestTopic") == {1: SLAVE_ADDR}

    slave = slave.but(id=0, dv=DataVersion(2, 0, DV1.timestamp))
    register(mgr, slave, "TestTopic")
    assert addrs_of(mgr, "TestTopic") == {0: SLAVE_ADDR}

    master = master.but(id=1, dv=DataVersion(2, 0, DV1.timestamp))
    register(mgr, master, "TestTopic")
    assert addrs_of(mgr, "TestTopic") == {0: SLAVE_ADDR, 1: MASTER_ADDR}


def test_same_address_keeps_one_id_in_a_group():
    mgr, _ = make_manager()
    register(mgr, SLAVE, "TestTopic")
    register(mgr, SLAVE.but(id=0), "TestTopic")  # the slave is promoted in place
    assert members(mgr) == {0: SLAVE_ADDR}


def test_master_change_to_the_old_slave_address():
    # RouteInfoManagerBrokerRegisterTest.testMasterChangeFromSlave
    mgr, _ = make_manager()
    register(mgr, MASTER, "TestTopic")
    register(mgr, SLAVE, "TestTopic")
    register(mgr, SLAVE.but(id=0), "TestTopic")
    assert addrs_of(mgr, "TestTopic")[0] == SLAVE_ADDR
    assert MASTER_ADDR not in addrs_of(mgr, "TestTopic").values()


def test_state_version_conflict_ignores_the_registration_and_drops_its_live_entry():
    mgr, _ = make_manager()
    register(mgr, MASTER.but(dv=DataVersion(1, state_version=5, timestamp=1)), "TestTopic")
    intruder = SLAVE.but(addr="127.0.0.1:19999", dv=DataVersion(9, state_version=4, timestamp=2))
    register(mgr, intruder, "TestTopic")
    assert live_entry(mgr, DEF_CLUSTER, "127.0.0.1:19999") is not None
    res = register(mgr, intruder.but(id=0), "TestTopic", "Other")
    assert res is not None and res.conflict and res.master_addr is None and res.registered_seq is None
    # the role-switch step ran before the check and is not undone: its id-1 entry is gone too
    assert members(mgr) == {0: MASTER_ADDR}
    assert live_entry(mgr, DEF_CLUSTER, "127.0.0.1:19999") is None
    assert mgr.pickup_topic_route_data("Other") is None


def test_equal_or_newer_state_version_takes_over_the_id():
    mgr, _ = make_manager()
    register(mgr, MASTER.but(dv=DataVersion(1, state_version=5, timestamp=1)), "TestTopic")
    res = register(
        mgr, MASTER.but(addr="127.0.0.1:19999", dv=DataVersion(1, state_version=5, timestamp=2)), "TestTopic"
    )
    assert not res.conflict
    assert members(mgr) == {0: "127.0.0.1:19999"}


def test_single_topic_guard_rejects_and_leaves_an_empty_broker_data():
    mgr, _ = make_manager()
    res = register(mgr, MASTER, configs={"Only": TopicConfig("Only")})
    assert res is None
    assert members(mgr) == {}
    assert DEF_BROKER in mgr.get_all_cluster_info()[1][DEF_CLUSTER]
    assert live_entry(mgr, DEF_CLUSTER, MASTER_ADDR) is None
    assert mgr.pickup_topic_route_data("Only") is None
    # a registration with zero topics passes the guard, and later one-topic ones are fine
    assert register(mgr, MASTER, configs={}) is not None
    assert register(mgr, MASTER.but(dv=DataVersion(2, 0, 0)), configs={"Only": TopicConfig("Only")}) is not None
    assert mgr.pickup_topic_route_data("Only") is not None


def test_old_version_slave_topics_are_ignored_but_prime_slave_of_5x_contributes_read_only():
    mgr, _ = make_manager()
    register(mgr, SLAVE.but(acting=None), "Old")
    assert mgr.pickup_topic_route_data("Old") is None
    mgr2, _ = make_manager()
    register(mgr2, SLAVE, "New")
    assert perm_of(mgr2, "New") == int(Perm.READ)


def test_prime_slave_without_acting_master_keeps_write_perm():
    mgr, _ = make_manager()
    register(mgr, SLAVE.but(acting=False), "TestTopic")
    assert perm_of(mgr, "TestTopic") == WRITABLE


def test_slave_topics_ignored_when_master_present():
    mgr, _ = make_manager()
    register(mgr, MASTER, "TestTopic")
    register(mgr, SLAVE, "TestTopic", "SlaveOnly")
    assert mgr.pickup_topic_route_data("SlaveOnly") is None
    assert perm_of(mgr, "TestTopic") == WRITABLE


def test_register_only_slave_then_master_comes_and_goes():
    mgr, _ = make_manager(support_acting_master=True)
    register(mgr, SLAVE, "TestTopic")
    assert perm_of(mgr, "TestTopic") & Perm.WRITE == 0
    unregister(mgr, SLAVE)

    register(mgr, MASTER, "TestTopic")
    register(mgr, SLAVE, "TestTopic")
    assert perm_of(mgr, "TestTopic") & Perm.WRITE
    unregister(mgr, MASTER)
    assert perm_of(mgr, "TestTopic") & Perm.WRITE == 0
    register(mgr, MASTER, "TestTopic")
    assert perm_of(mgr, "TestTopic") & Perm.WRITE


def test_change_detection_is_per_broker_so_a_wipe_survives_same_data_version():
    mgr, _ = make_manager()
    register(mgr, MASTER, "TestTopic")
    assert mgr.wipe_write_perm_of_broker(DEF_BROKER) == 2
    register(mgr, MASTER, "TestTopic")
    assert perm_of(mgr, "TestTopic") == int(Perm.READ)
    register(mgr, MASTER.but(dv=DataVersion(2, 0, DV1.timestamp)), "TestTopic")
    assert perm_of(mgr, "TestTopic") == WRITABLE


def test_same_data_version_still_fills_a_missing_topic():
    mgr, _ = make_manager()
    register(mgr, MASTER, "TestTopic")
    mgr.delete_topic("TestTopic")
    res = register(mgr, MASTER, "TestTopic")
    assert res.routes_changed and mgr.pickup_topic_route_data("TestTopic") is not None


def test_queue_data_is_replaced_when_any_field_changes():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    register(mgr, MASTER.but(dv=DataVersion(2, 0, 0)), configs=topic_configs("T", rq=4, wq=4, sys_flag=1))
    (qd,) = mgr.pickup_topic_route_data("T").queue_datas
    assert qd == QueueData(DEF_BROKER, 4, 4, WRITABLE, 1)


def test_keep_topic_with_broker_registration_by_default():
    mgr, _ = make_manager()
    register(mgr, MASTER, "TestTopic", "TestTopic1")
    register(mgr, MASTER.but(dv=DataVersion(2, 0, 0)), "TestTopic1")
    assert mgr.pickup_topic_route_data("TestTopic") is not None
    assert mgr.pickup_topic_route_data("TestTopic1") is not None


def test_delete_topic_with_broker_registration():
    mgr, _ = make_manager(delete_topic_with_broker_registration=True)
    register(mgr, MASTER, "TestTopic", "TestTopic1")
    register(mgr, MASTER, "TestTopic1")  # same DataVersion: the cleanup still runs
    assert mgr.pickup_topic_route_data("TestTopic") is None
    assert mgr.pickup_topic_route_data("TestTopic1") is not None


def test_delete_topic_with_broker_registration_setting_is_read_live():
    mgr, _ = make_manager()
    register(mgr, MASTER, "TestTopic", "TestTopic1")
    mgr.settings.delete_topic_with_broker_registration = True
    register(mgr, MASTER, "TestTopic1")
    assert mgr.pickup_topic_route_data("TestTopic") is None


def test_delete_topic_with_broker_registration_two_groups():
    mgr, _ = make_manager(delete_topic_with_broker_registration=True)
    m1 = MASTER
    m2 = MASTER.but(name=DEF_BROKER + "1", addr=MASTER_ADDR + "9")
    register(mgr, m1, "TestTopic", "TestTopic1")
    register(mgr, m2, "TestTopic", "TestTopic1")
    assert len(mgr.pickup_topic_route_data("TestTopic").broker_datas) == 2

    register(mgr, m1, "TestTopic1")
    (only,) = mgr.pickup_topic_route_data("TestTopic").broker_datas
    assert only.broker_name == m2.name
    assert len(mgr.pickup_topic_route_data("TestTopic1").broker_datas) == 2

    register(mgr, m2, "TestTopic1")
    assert mgr.pickup_topic_route_data("TestTopic") is None
    assert len(mgr.pickup_topic_route_data("TestTopic1").broker_datas) == 2


def test_delete_topic_with_registration_is_skipped_for_static_topics():
    mgr, _ = make_manager(delete_topic_with_broker_registration=True)
    register(mgr, MASTER, "TestTopic", "TestTopic1")
    register(mgr, MASTER, "TestTopic1", mappings={"TestTopic1": {"bname": DEF_BROKER, "epoch": 1}})
    assert mgr.pickup_topic_route_data("TestTopic") is not None


def test_register_single_topic_with_broker_registration():
    mgr, _ = make_manager(delete_topic_with_broker_registration=True)
    single = [QueueData(DEF_BROKER, 8, 8, 6)]

    assert not mgr.register_topic("TestTopic", single)  # no such broker yet
    assert mgr.pickup_topic_route_data("TestTopic") is None

    register(mgr, MASTER, "TestTopic")
    assert mgr.pickup_topic_route_data("TestTopic") is not None
    assert mgr.register_topic("TestTopic1", single)
    assert mgr.pickup_topic_route_data("TestTopic1") is not None

    register(mgr, MASTER, "TestTopic", "TestTopic1")
    assert mgr.pickup_topic_route_data("TestTopic1") is not None

    register(mgr, MASTER, "TestTopic")
    assert mgr.pickup_topic_route_data("TestTopic") is not None
    assert mgr.pickup_topic_route_data("TestTopic1") is None

    mgr.register_topic("TestTopic1", single)
    assert mgr.pickup_topic_route_data("TestTopic1") is not None
    unregister(mgr, MASTER)
    assert mgr.pickup_topic_route_data("TestTopic") is None
    assert mgr.pickup_topic_route_data("TestTopic1") is None


def test_register_topic_existing_topic_stops_at_first_unknown_broker_new_topic_is_all_or_nothing():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    register(mgr, MASTER.but(name="B2", addr="127.0.0.1:1"), "X")
    qds = [QueueData("B2", 2, 2, 6), QueueData("Ghost", 1, 1, 6), QueueData(DEF_BROKER, 3, 3, 6)]
    assert mgr.register_topic("T", qds)
    route = mgr.pickup_topic_route_data("T")
    assert {q.broker_name: q.read_queue_nums for q in route.queue_datas} == {DEF_BROKER: 8, "B2": 2}
    assert not mgr.register_topic("New", qds)
    assert mgr.pickup_topic_route_data("New") is None
    assert not mgr.register_topic("New", [])


def test_static_topic_mappings_are_stored_by_bname_and_returned_in_routes():
    mgr, _ = make_manager()
    info = {"bname": DEF_BROKER, "epoch": 3, "totalQueues": 8, "currIdMap": {0: 0}}
    register(mgr, MASTER, "S", mappings={"S": info})
    route = mgr.pickup_topic_route_data("S")
    assert route.topic_queue_mapping_by_broker == {DEF_BROKER: info}
    assert mgr.pickup_topic_route_data("baseTopic").topic_queue_mapping_by_broker is None
    # deleting the topic keeps mappings, as Java does
    mgr.delete_topic("S")
    assert dumped(mgr).mappings["S"] == {DEF_BROKER: info}


def test_filter_servers_are_stored_per_cluster_and_addr_and_cleared_by_an_empty_list():
    mgr, _ = make_manager()
    assert register(mgr, MASTER, "T", filter_servers=["10.0.0.1:1"]).filter_servers_changed
    assert mgr.pickup_topic_route_data("T").filter_server_table == {MASTER_ADDR: ["10.0.0.1:1"]}
    assert not register(mgr, MASTER, "T", filter_servers=["10.0.0.1:1"]).filter_servers_changed
    assert register(mgr, MASTER, "T", filter_servers=[]).filter_servers_changed
    assert mgr.pickup_topic_route_data("T").filter_server_table == {}
    assert not register(mgr, MASTER, "T", filter_servers=[]).filter_servers_changed
    # None (ancient brokers) leaves the table alone
    register(mgr, MASTER, "T", filter_servers=["10.0.0.1:1"])
    body = RegisterBrokerBody(data_version=DV1, topic_config_table=topic_configs("T"), filter_server_list=None)
    mgr.register_broker(DEF_CLUSTER, MASTER_ADDR, DEF_BROKER, 0, MASTER_HA, None, None, True, body, object())
    assert mgr.pickup_topic_route_data("T").filter_server_table == {MASTER_ADDR: ["10.0.0.1:1"]}


def test_zone_and_acting_flag_follow_the_latest_registration():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T", zone="zone1")
    bd = mgr.pickup_topic_route_data("T").broker_datas[0]
    assert bd.zone_name == "zone1" and bd.enable_acting_master
    v = mgr.version
    register(mgr, SLAVE.but(acting=None), "T", zone=None)
    bd = mgr.pickup_topic_route_data("T").broker_datas[0]
    assert bd.zone_name is None and not bd.enable_acting_master
    assert mgr.version > v


def test_a_zone_or_acting_flag_change_with_the_same_data_version_reports_changed_broker_data():
    mgr, _ = make_manager()
    assert register(mgr, MASTER, "T", zone="zone1").broker_data_changed  # a new group
    same = register(mgr, MASTER, "T", zone="zone1")
    assert not same.broker_data_changed and not same.topic_config_changed
    moved = register(mgr, MASTER, "T", zone="zone2")
    assert moved.broker_data_changed and not moved.topic_config_changed
    flag = register(mgr, MASTER.but(acting=False), "T", zone="zone2")
    assert flag.broker_data_changed and not flag.topic_config_changed
    assert mgr.pickup_topic_route_data("T").broker_datas[0].enable_acting_master is False
    # a filter-server change alone is not a BrokerData change
    assert not register(mgr, MASTER.but(acting=False), "T", zone="zone2", filter_servers=["f:1"]).broker_data_changed


def test_broker_data_cluster_is_fixed_at_creation():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    register(mgr, SLAVE.but(cluster="Other"), "T")
    groups, clusters = mgr.get_all_cluster_info()
    assert groups[DEF_BROKER].cluster == DEF_CLUSTER
    assert DEF_BROKER in clusters["Other"]


def test_min_broker_id_change_is_reported_only_when_enabled():
    mgr, _ = make_manager()
    register(mgr, SLAVE.but(id=2, addr="127.0.0.1:2"), "T")
    assert register(mgr, SLAVE, "T").min_broker_id_change is None

    mgr, _ = make_manager(notify_min_broker_id_changed=True)
    assert register(mgr, SLAVE.but(id=2, addr="127.0.0.1:2"), "T").min_broker_id_change is None
    change = register(mgr, SLAVE, "T").min_broker_id_change
    assert change is not None
    assert (change.min_broker_id, change.min_broker_addr, change.offline_broker_addr) == (1, SLAVE_ADDR, None)
    assert change.ha_broker_addr == SLAVE.ha
    assert change.notify_addrs == ("127.0.0.1:2",)  # everyone but the new minimum


def test_registration_stamps_increasing_sequence_numbers():
    mgr, _ = make_manager()
    a = register(mgr, MASTER, "T").registered_seq
    s = mgr.next_seq()
    b = register(mgr, MASTER, "T").registered_seq
    assert a < s < b


def test_thousand_topic_registrations_from_five_groups_all_land():
    # speed of this path is measured by bench/, not here
    mgr, _ = make_manager()
    configs = {f"topic-{i}": TopicConfig(f"topic-{i}", 8, 8) for i in range(1000)}
    for round_ in range(5):
        broker = MASTER.but(name=f"b{round_}", addr=f"10.0.0.{round_}:10911")
        assert register(mgr, broker, configs=configs).register_first
    assert len(mgr.pickup_topic_route_data("topic-999").broker_datas) == 5


def test_a_master_arriving_below_its_slaves_tells_every_slave_with_its_ha_address():
    slave2 = SLAVE.but(id=2, addr="127.0.0.1:2")
    # the registration path does not look at enableActingMaster (a 4.x group is told too)
    for acting in (True, None):
        mgr, _ = make_manager(notify_min_broker_id_changed=True)
        register(mgr, slave2.but(acting=acting), "T")
        register(mgr, SLAVE.but(acting=acting), "T")
        change = register(mgr, MASTER.but(acting=acting), "T").min_broker_id_change
        assert change is not None
        assert (change.broker_name, change.min_broker_id, change.min_broker_addr) == (DEF_BROKER, 0, MASTER_ADDR)
        assert (change.offline_broker_addr, change.ha_broker_addr) == (None, MASTER_HA)
        assert change.notify_addrs == (SLAVE_ADDR, "127.0.0.1:2")  # ascending ids, the new minimum left out


def test_a_member_taking_a_lower_id_alone_in_its_group_is_told_itself():
    mgr, _ = make_manager(notify_min_broker_id_changed=True)
    register(mgr, SLAVE, "T")
    change = register(mgr, SLAVE.but(id=0), "T").min_broker_id_change  # role switch: same address, id 0
    assert change is not None and (change.min_broker_id, change.notify_addrs) == (0, (SLAVE_ADDR,))


def test_no_min_broker_id_change_for_a_registration_that_lowers_nothing():
    mgr, _ = make_manager(notify_min_broker_id_changed=True)
    assert register(mgr, MASTER, "T").min_broker_id_change is None  # a new group: the old minimum counts as 0
    assert register(mgr, SLAVE, "T").min_broker_id_change is None
    assert register(mgr, MASTER, "T").min_broker_id_change is None  # re-registration at the same id


# --- a shared table (RegisterBodyCache) whose rows were written is not walked again


def _walks(monkeypatch) -> list[str]:
    """The groups whose rows each registration from now on walks, in order."""
    import common.routes.register as register_module

    walked: list[str] = []
    rewrite, fill = register_module._rewrite_rows, register_module._create_and_update_queue_data

    def rewrite_rows(tqt, broker_name, configs, wipe_write):
        walked.append(broker_name)
        return rewrite(tqt, broker_name, configs, wipe_write)

    def create_and_update(t, broker_name, tc, wipe_write):
        walked.append(broker_name)
        return fill(t, broker_name, tc, wipe_write)

    monkeypatch.setattr(register_module, "_rewrite_rows", rewrite_rows)
    monkeypatch.setattr(register_module, "_create_and_update_queue_data", create_and_update)
    return walked


def _shared(broker, *topics: str, table_id: int = 7):
    reg = registration(broker, *topics)
    reg.body.table_id = table_id
    return reg


def test_rows_written_from_a_shared_table_are_not_walked_again_while_no_row_changes(monkeypatch):
    t, settings = RouteTables(), RouteSettings()
    walked = _walks(monkeypatch)
    register_broker(t, settings, 0, _shared(MASTER, "T"))
    for counter in (2, 3):  # new DataVersions: Java rewrites every row, these are the table's already
        res = register_broker(t, settings, 0, _shared(MASTER.but(dv=DataVersion(counter, 0, 1)), "T"))
        assert res.data_version_changed and not res.routes_changed
    register_broker(t, settings, 0, _shared(MASTER.but(dv=DataVersion(3, 0, 1)), "T"))  # and the same one
    assert walked == [DEF_BROKER]
    # another parse, or a body of its own (table_id 0), is walked
    register_broker(t, settings, 0, _shared(MASTER.but(dv=DataVersion(4, 0, 1)), "T", table_id=8))
    register_broker(t, settings, 0, _shared(MASTER.but(dv=DataVersion(5, 0, 1)), "T", table_id=0))
    assert walked == [DEF_BROKER] * 3


def test_any_change_to_the_tables_has_a_shared_table_walked_again():
    mgr, _ = make_manager()

    def register_shared(broker):
        r = _shared(broker, "T")
        mgr.register_broker(r.cluster_name, r.broker_addr, r.broker_name, r.broker_id, r.ha_server_addr,
                            r.zone_name, r.timeout_millis, r.enable_acting_master, r.body, r.channel)  # fmt: skip

    register_shared(MASTER)
    assert mgr.wipe_write_perm_of_broker(DEF_BROKER) == 2
    # the same DataVersion: the wipe stays, as with a body of its own, as in Java
    # (https://github.com/apache/rocketmq/issues/313)
    register_shared(MASTER)
    assert perm_of(mgr, "T") == int(Perm.READ)
    register_shared(MASTER.but(dv=DataVersion(2, 0, 1)))  # a new one: every row is the table's again
    assert perm_of(mgr, "T") == WRITABLE and perm_of(mgr, "baseTopic") == WRITABLE


def test_a_change_elsewhere_or_a_prime_slave_writing_the_same_table_walks_it_again(monkeypatch):
    t, settings = RouteTables(), RouteSettings()
    walked = _walks(monkeypatch)
    register_broker(t, settings, 0, _shared(MASTER, "T"))
    register_broker(t, settings, 0, registration(MASTER.but(name="other", addr="127.0.0.1:1"), "U"))
    register_broker(t, settings, 0, _shared(MASTER.but(dv=DataVersion(2, 0, 1)), "T"))
    assert walked == [DEF_BROKER, "other", DEF_BROKER]
    # the master leaves; the prime slave writes the group's rows read-only from a table with the same id
    t.broker_addr_table[DEF_BROKER].broker_addrs.pop(0)
    register_broker(t, settings, 0, _shared(SLAVE, "T"))
    assert walked[-1] == DEF_BROKER and len(walked) == 4
    assert t.topic_queue_table["T"][DEF_BROKER].perm == int(Perm.READ)
