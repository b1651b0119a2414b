"""Unregistration, channel close, expiry and fencing (spec §3.4, §3.5;
https://github.com/apache/rocketmq/issues/11043)."""

from __future__ import annotations

from routes_support import (
    DEF_BROKER,
    DEF_CLUSTER,
    MASTER,
    MASTER_ADDR,
    SLAVE,
    SLAVE_ADDR,
    addrs_of,
    dumped,
    live_entry,
    make_manager,
    members,
    perm_of,
    register,
    unregister,
)

from common.protocol.codes import Perm
from common.protocol.types import DataVersion
from common.routes import FenceReason, UnregisterRequest


def request(mgr, broker, seq=None):
    return UnregisterRequest(
        broker.cluster, broker.addr, broker.name, broker.id, mgr.next_seq() if seq is None else seq
    )


def test_unregister_only_master_removes_its_topics_sync_and_batched():
    mgr, _ = make_manager(support_acting_master=True)
    register(mgr, MASTER, "TestTopic", "TestTopic1", "TestTopic2")
    out = unregister(mgr, MASTER)
    assert out.removed_brokers == {DEF_BROKER} and out.routes_changed
    for t in ("TestTopic", "TestTopic1", "TestTopic2"):
        assert mgr.pickup_topic_route_data(t) is None
    assert mgr.get_all_cluster_info() == ({}, {})

    register(mgr, MASTER, "TestTopic", "TestTopic1", "TestTopic2")
    mgr.unregister_brokers([request(mgr, MASTER)])
    assert mgr.pickup_topic_route_data("TestTopic") is None


def test_unregister_slave_keeps_master():
    mgr, _ = make_manager(support_acting_master=True)
    register(mgr, MASTER, "TestTopic")
    register(mgr, SLAVE, "TestTopic")
    out = unregister(mgr, SLAVE)
    assert out.reduced_brokers == {DEF_BROKER} and not out.removed_brokers
    assert addrs_of(mgr, "TestTopic") == {0: MASTER_ADDR}
    assert perm_of(mgr, "TestTopic") == int(Perm.READ | Perm.WRITE)


def test_unregister_master_with_acting_master_shows_slave_as_read_only_master():
    mgr, _ = make_manager(support_acting_master=True)
    register(mgr, MASTER, "TestTopic")
    register(mgr, SLAVE, "TestTopic")
    unregister(mgr, MASTER)
    route = mgr.pickup_topic_route_data("TestTopic")
    assert len(route.broker_datas) == 1 and route.broker_datas[0].broker_addrs == {0: SLAVE_ADDR}
    assert [q.perm for q in route.queue_datas] == [int(Perm.READ)]
    # the table itself still says id 1: only the answer is rewritten
    assert members(mgr) == {1: SLAVE_ADDR}


def test_unregister_master_old_version_keeps_perm_and_no_id_zero():
    mgr, _ = make_manager(support_acting_master=True)
    register(mgr, MASTER.but(acting=False), "TestTopic")
    register(mgr, SLAVE.but(acting=False), "TestTopic")
    unregister(mgr, MASTER)
    route = mgr.pickup_topic_route_data("TestTopic")
    assert route.broker_datas[0].broker_addrs == {1: SLAVE_ADDR}
    assert [q.perm for q in route.queue_datas] == [int(Perm.READ | Perm.WRITE)]


def test_perm_wipe_on_master_loss_happens_even_without_support_acting_master():
    mgr, _ = make_manager(support_acting_master=False)
    register(mgr, MASTER, "TestTopic")
    register(mgr, SLAVE, "TestTopic")
    unregister(mgr, MASTER)
    assert addrs_of(mgr, "TestTopic") == {1: SLAVE_ADDR}  # no acting-master rewrite
    assert perm_of(mgr, "TestTopic") == int(Perm.READ)


def test_master_back_makes_route_writable_again():
    mgr, _ = make_manager(support_acting_master=True)
    register(mgr, MASTER, "TestTopic")
    register(mgr, SLAVE, "TestTopic")
    unregister(mgr, MASTER)
    assert len(addrs_of(mgr, "TestTopic")) == 1
    register(mgr, MASTER, "TestTopic")
    assert addrs_of(mgr, "TestTopic") == {0: MASTER_ADDR, 1: SLAVE_ADDR}
    assert perm_of(mgr, "TestTopic") & Perm.WRITE


def test_batch_of_two_masters_in_different_groups():
    mgr, _ = make_manager()
    m2 = MASTER.but(name=DEF_BROKER + "1", addr=MASTER_ADDR + "9")
    register(mgr, MASTER, "TestTopic1")
    register(mgr, m2, "TestTopic2")
    out = mgr.unregister_brokers([request(mgr, MASTER), request(mgr, m2)])
    assert len(out.applied) == 2 and out.removed_brokers == {DEF_BROKER, m2.name}
    assert mgr.pickup_topic_route_data("TestTopic1") is None
    assert mgr.pickup_topic_route_data("TestTopic2") is None


def test_duplicate_requests_in_a_batch_are_harmless():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    r = request(mgr, MASTER)
    out = mgr.unregister_brokers([r, r])
    assert len(out.applied) == 2 and mgr.pickup_topic_route_data("T") is None


def test_unregister_member_two_of_three():
    # RouteInfoManagerBrokerRegisterTest.testUnregisterBroker
    mgr, _ = make_manager()
    for i in range(3):
        register(mgr, MASTER.but(id=i, addr=f"cluster-broker-0:{i}", acting=False), "topic-0")
    unregister(mgr, MASTER.but(id=2, addr="cluster-broker-0:2"))
    assert set(addrs_of(mgr, "topic-0")) == {0, 1}


def test_same_addr_in_two_clusters_are_separate_brokers():
    mgr, _ = make_manager()
    b0 = MASTER.but(cluster="default-cluster", name="default-broker", id=1234, acting=False, dv=DataVersion(10, 0, 100))
    b1 = b0.but(cluster="default-cluster-1", name="default-broker-1", dv=DataVersion(20, 0, 200))
    register(mgr, b0, "unit-test0", "unit-test1")
    register(mgr, b1, "unit-test-0", "unit-test-1")
    assert live_entry(mgr, "default-cluster", MASTER_ADDR).data_version == DataVersion(10, 0, 100)
    assert live_entry(mgr, "default-cluster-1", MASTER_ADDR).data_version == DataVersion(20, 0, 200)
    unregister(mgr, b1)
    assert live_entry(mgr, "default-cluster", MASTER_ADDR).data_version == DataVersion(10, 0, 100)
    assert live_entry(mgr, "default-cluster-1", MASTER_ADDR) is None
    assert mgr.pickup_topic_route_data("unit-test0") is not None


def test_on_channel_destroy_builds_requests_and_client_channels_match_nothing():
    mgr, _ = make_manager()
    ch = object()
    register(mgr, MASTER, "TestTopic", "TestTopic1", channel=ch)
    assert mgr.on_channel_destroy(object()) == []
    assert mgr.on_channel_destroy(None) == []
    (req,) = mgr.on_channel_destroy(ch)
    assert (req.cluster_name, req.broker_addr, req.broker_name, req.broker_id) == (
        DEF_CLUSTER,
        MASTER_ADDR,
        DEF_BROKER,
        0,
    )
    assert mgr.pickup_topic_route_data("TestTopic") is not None  # not applied yet
    out = mgr.unregister_brokers([req])
    assert out.removed_channels == [ch]
    assert mgr.pickup_topic_route_data("TestTopic") is None
    assert mgr.pickup_topic_route_data("TestTopic1") is None


def test_on_channel_destroy_master_then_slave():
    mgr, _ = make_manager(support_acting_master=True)
    mch, sch = object(), object()
    register(mgr, MASTER.but(acting=False), "TestTopic", channel=mch)
    register(mgr, SLAVE.but(acting=False), "TestTopic", channel=sch)
    mgr.unregister_brokers(mgr.on_channel_destroy(mch))
    assert addrs_of(mgr, "TestTopic") == {1: SLAVE_ADDR}
    mgr.unregister_brokers(mgr.on_channel_destroy(sch))
    assert mgr.pickup_topic_route_data("TestTopic") is None


def test_on_channel_destroy_by_broker_info():
    mgr, _ = make_manager()
    register(mgr, MASTER, "TestTopic", "TestTopic1")
    req = mgr.build_unregister_request(DEF_CLUSTER, MASTER_ADDR)
    assert req is not None and req.broker_name == DEF_BROKER and req.broker_id == 0
    assert mgr.build_unregister_request(DEF_CLUSTER, "nowhere:1") is None
    mgr.unregister_brokers([req])
    assert mgr.pickup_topic_route_data("TestTopic") is None


def test_switch_broker_role_after_channel_destroy():
    mgr, _ = make_manager(support_acting_master=True)
    master, slave = MASTER.but(acting=False), SLAVE.but(acting=False)
    mch = object()
    register(mgr, master, "TestTopic", channel=mch)
    register(mgr, slave, "TestTopic")
    mgr.unregister_brokers(mgr.on_channel_destroy(mch))
    assert addrs_of(mgr, "TestTopic") == {1: SLAVE_ADDR}
    register(mgr, slave.but(id=0, dv=DataVersion(2, 0, 0)), "TestTopic")
    assert addrs_of(mgr, "TestTopic") == {0: SLAVE_ADDR}
    register(mgr, master.but(id=1, dv=DataVersion(2, 0, 0)), "TestTopic")
    assert addrs_of(mgr, "TestTopic") == {0: SLAVE_ADDR, 1: MASTER_ADDR}


# --- expiry -----------------------------------------------------------------------------------


def test_expiry_by_default_timeout_at_exactly_timeout_plus_one_ms():
    mgr, clock = make_manager()
    register(mgr, MASTER, "T")
    clock.advance(120_000)
    assert mgr.expire_inactive().applied == []
    clock.advance(1)
    out = mgr.expire_inactive()
    (req,) = out.applied
    assert (req.broker_addr, req.broker_name, req.broker_id) == (MASTER_ADDR, DEF_BROKER, 0)
    assert len(out.removed_channels) == 1
    assert mgr.pickup_topic_route_data("T") is None


def test_expiry_uses_the_per_broker_timeout_and_heartbeats_postpone_it():
    mgr, clock = make_manager()
    register(mgr, MASTER, "T", timeout=30_000)
    register(mgr, SLAVE, "T")
    clock.advance(20_000)
    assert mgr.update_broker_info_update_timestamp(DEF_CLUSTER, MASTER_ADDR)
    assert not mgr.update_broker_info_update_timestamp(DEF_CLUSTER, "unknown:1")
    clock.advance(30_000)
    assert mgr.expire_inactive().applied == []
    clock.advance(1)
    assert [r.broker_addr for r in mgr.expire_inactive().applied] == [MASTER_ADDR]
    assert mgr.last_seen(DEF_CLUSTER, SLAVE_ADDR) == clock.ms - 50_001


def test_a_pure_heartbeat_does_not_bump_the_route_version():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    v = mgr.version
    mgr.update_broker_info_update_timestamp(DEF_CLUSTER, MASTER_ADDR)
    assert mgr.version == v


def test_expiry_of_a_live_broker_outside_any_group_removes_the_live_entry():
    mgr, clock = make_manager()
    # the group was created under Default_Cluster; this member registers under another cluster
    register(mgr, MASTER, "T")
    register(mgr, SLAVE.but(cluster="Other"), "T")
    clock.advance(120_001)
    reqs = {r.broker_addr: r for r in mgr.expire_inactive().applied}
    assert reqs[SLAVE_ADDR].broker_name is None and reqs[SLAVE_ADDR].broker_id is None
    assert dumped(mgr).live == {}


# --- fencing ----------------------------------------------------------------------------------


def test_stale_unregister_decided_before_reregistration_is_fenced_fresh_one_applies():
    mgr, _ = make_manager()
    ch = object()
    register(mgr, MASTER, "T", channel=ch)
    stale = mgr.on_channel_destroy(ch)  # decided now...
    register(mgr, MASTER, "T")  # ...but the broker registers again before it is applied
    out = mgr.unregister_brokers(stale)
    assert out.applied == [] and out.fenced_count == 1
    assert out.fenced[0].reason is FenceReason.REFRESHED and not out.routes_changed
    assert mgr.pickup_topic_route_data("T") is not None

    fresh = request(mgr, MASTER)
    out = mgr.unregister_brokers([fresh])
    assert out.applied == [fresh] and out.fenced_count == 0
    assert mgr.pickup_topic_route_data("T") is None


def test_a_monitor_expiry_decision_is_fenced_by_a_later_heartbeat():
    mgr, clock = make_manager()
    register(mgr, MASTER, "T")
    clock.advance(120_001)
    decided = [mgr.build_unregister_request(DEF_CLUSTER, MASTER_ADDR)]  # as an EXPIRE action is applied
    mgr.update_broker_info_update_timestamp(DEF_CLUSTER, MASTER_ADDR)
    out = mgr.unregister_brokers(decided)
    assert out.fenced_count == 1 and mgr.pickup_topic_route_data("T") is not None


def test_queued_slave_unregister_does_not_remove_a_master_promoted_at_the_same_address():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    register(mgr, SLAVE, "T")
    old_slave = request(mgr, SLAVE)
    unregister(mgr, MASTER)
    register(mgr, SLAVE.but(id=0, dv=DataVersion(2, 0, 0)), "T")  # promoted: now id 0 at SLAVE_ADDR
    # even a request stamped after the promotion names the wrong id: Java would remove the master
    late = UnregisterRequest(DEF_CLUSTER, SLAVE_ADDR, DEF_BROKER, 1, mgr.next_seq())
    out = mgr.unregister_brokers([old_slave, late])
    assert [f.reason for f in out.fenced] == [FenceReason.REFRESHED, FenceReason.ROLE_CHANGED]
    assert addrs_of(mgr, "T") == {0: SLAVE_ADDR}


def test_unregister_of_unknown_group_or_address_only_clears_liveness():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    out = mgr.unregister_brokers([UnregisterRequest(DEF_CLUSTER, MASTER_ADDR, "NoSuchGroup", 0, mgr.next_seq())])
    assert out.applied and dumped(mgr).live == {}
    assert addrs_of(mgr, "T") == {0: MASTER_ADDR}


def test_min_broker_id_change_on_unregister_goes_to_the_remaining_members():
    mgr, _ = make_manager(notify_min_broker_id_changed=True)
    register(mgr, MASTER, "T")
    register(mgr, SLAVE, "T")
    register(mgr, SLAVE.but(id=2, addr="127.0.0.1:2"), "T")
    out = unregister(mgr, MASTER)
    (change,) = out.min_broker_id_changes
    assert (change.min_broker_id, change.min_broker_addr, change.offline_broker_addr) == (1, SLAVE_ADDR, MASTER_ADDR)
    assert set(change.notify_addrs) == {SLAVE_ADDR, "127.0.0.1:2"}
    # a non-minimum leaving notifies nobody; nor does a group without acting master
    assert unregister(mgr, SLAVE.but(id=2, addr="127.0.0.1:2")).min_broker_id_changes == []
    mgr2, _ = make_manager(notify_min_broker_id_changed=True)
    register(mgr2, MASTER.but(acting=False), "T")
    register(mgr2, SLAVE.but(acting=False), "T")
    assert unregister(mgr2, MASTER).min_broker_id_changes == []


def test_min_broker_id_change_on_unregister_carries_the_offline_address_and_no_ha_address():
    slave2 = SLAVE.but(id=2, addr="127.0.0.1:2")
    mgr, _ = make_manager(notify_min_broker_id_changed=True)
    for b in (MASTER, SLAVE, slave2):
        register(mgr, b, "T")
    (change,) = unregister(mgr, MASTER).min_broker_id_changes
    assert change.broker_name == DEF_BROKER and change.ha_broker_addr is None
    assert change.notify_addrs == (SLAVE_ADDR, "127.0.0.1:2")  # everyone left, ascending ids


def test_no_min_broker_id_change_on_unregister_when_the_switch_is_off():
    mgr, _ = make_manager()
    register(mgr, MASTER, "T")
    register(mgr, SLAVE, "T")
    assert unregister(mgr, MASTER).min_broker_id_changes == []


def test_a_batch_reports_one_change_per_group_after_all_its_departures():
    slave2 = SLAVE.but(id=2, addr="127.0.0.1:2")
    mgr, _ = make_manager(notify_min_broker_id_changed=True)
    for b in (MASTER, SLAVE, slave2):
        register(mgr, b, "T")
    (change,) = mgr.unregister_brokers([request(mgr, MASTER), request(mgr, SLAVE)]).min_broker_id_changes
    # the group as the batch left it; the offline address is the last departed minimum's
    assert (change.min_broker_id, change.min_broker_addr, change.offline_broker_addr) == (2, "127.0.0.1:2", SLAVE_ADDR)
    assert change.notify_addrs == ("127.0.0.1:2",)

    mgr, _ = make_manager(notify_min_broker_id_changed=True)
    register(mgr, MASTER, "T")
    register(mgr, SLAVE, "T")
    # the minimum left, then the group emptied: nobody is left to tell
    assert mgr.unregister_brokers([request(mgr, MASTER), request(mgr, SLAVE)]).min_broker_id_changes == []
