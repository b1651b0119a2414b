"""Warm start: a model as the streaming job stores it -> provisional entries -> confirmed or dropped.

The clock is injected; nothing sleeps.  ``routes_support`` provides the brokers of RocketMQ's own
route-table tests (DEF master at :10911, slave at :30911).  The filter-server and static-topic
tests that go through a real Redis are in tests/integration/test_warmstart_snapshot.py.
"""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
from routes_support import (
    DEF_BROKER,
    DEF_CLUSTER,
    MASTER,
    MASTER_ADDR,
    MASTER_HA,
    SLAVE,
    SLAVE_ADDR,
    Broker,
    Clock,
    dumped,
    live_entry,
    make_manager,
    register,
    topic_configs,
    unregister,
)

from common.protocol.codes import DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
from common.protocol.types import DataVersion, QueueData
from common.routes import BrokerAddrInfo, RouteInfoManager
from namesrv.config import NamesrvConfig
from namesrv.warmstart import (
    RedisModel,
    WarmStartError,
    drop_unconfirmed,
    load_model,
    parse_model,
    redact_url,
    warm_start,
)

TIMEOUT = 10_000
DV = DataVersion(counter=7, state_version=3, timestamp=1_700_000_000_000)
OTHER = "broker-b"
OTHER_ADDR = "10.0.0.2:10911"


def model_values(*, master_timeout: int | None = TIMEOUT, with_slave: bool = True) -> tuple[dict, dict, bytes]:
    """Raw ``P:meta``, ``P:model:topics`` and ``P:model:brokers`` values, as docs/redis-keys.md shows them."""

    def q(name: str, perm: int = 6) -> dict:
        return QueueData(name, 8, 8, perm, 0).to_wire()

    topics = {
        b"TopicA": orjson.dumps({DEF_BROKER: q(DEF_BROKER), OTHER: q(OTHER)}),
        b"Gone": orjson.dumps({DEF_BROKER: q(DEF_BROKER)}),
        b"OnlyB": orjson.dumps({OTHER: q(OTHER)}),
        b"baseTopic": orjson.dumps({DEF_BROKER: q(DEF_BROKER)}),
    }
    addrs = {0: MASTER_ADDR, 1: SLAVE_ADDR} if with_slave else {0: MASTER_ADDR}
    live = {
        f"{DEF_CLUSTER}|{MASTER_ADDR}": {
            "dataVersion": DV.to_wire(),
            "haServerAddr": MASTER_HA,
            "lastUpdate": 5,
            "timeoutMillis": master_timeout,
        }
    }
    if master_timeout is None:
        del live[f"{DEF_CLUSTER}|{MASTER_ADDR}"]["timeoutMillis"]
    if with_slave:
        live[f"{DEF_CLUSTER}|{SLAVE_ADDR}"] = {
            "dataVersion": DV.to_wire(),
            "haServerAddr": None,
            "lastUpdate": 5,
            "timeoutMillis": TIMEOUT,
        }
    live[f"{DEF_CLUSTER}|{OTHER_ADDR}"] = {"dataVersion": DV.to_wire(), "timeoutMillis": 2 * TIMEOUT, "lastUpdate": 5}
    brokers = orjson.dumps(
        {
            "groups": {
                DEF_BROKER: {
                    "cluster": DEF_CLUSTER,
                    "brokerName": DEF_BROKER,
                    "brokerAddrs": addrs,
                    "enableActingMaster": True,
                },
                OTHER: {"cluster": DEF_CLUSTER, "brokerName": OTHER, "brokerAddrs": {0: OTHER_ADDR}},
            },
            "clusters": {DEF_CLUSTER: [DEF_BROKER, OTHER]},
            "live": live,
        },
        option=orjson.OPT_NON_STR_KEYS,
    )
    meta = {b"lineage": b"query-1", b"batchId": b"42", b"watermark": b"1700000000000", b"updatedAt": b"1700000001000"}
    return meta, topics, brokers


def warm(**kw) -> tuple[RouteInfoManager, Clock]:
    mgr, clock = make_manager()
    model = parse_model(*model_values(**kw))
    load_model(mgr, model, "test", wall_ms=1_700_000_002_000)
    return mgr, clock


def route_brokers(mgr: RouteInfoManager, topic: str) -> set[str] | None:
    route = mgr.pickup_topic_route_data(topic)
    return None if route is None else {q.broker_name for q in route.queue_datas}


# --------------------------------------------------------------------------- parsing and loading


def test_parse_reads_meta_rows_groups_and_live_entries():
    m = parse_model(*model_values())
    assert (m.batch_id, m.lineage, m.watermark, m.updated_at) == (42, "query-1", 1_700_000_000_000, 1_700_000_001_000)
    assert m.topics["TopicA"][OTHER] == QueueData(OTHER, 8, 8, 6, 0)
    assert m.groups[DEF_BROKER].broker_addrs == {0: MASTER_ADDR, 1: SLAVE_ADDR}
    assert m.clusters == {DEF_CLUSTER: {DEF_BROKER, OTHER}}
    master = m.live[BrokerAddrInfo(DEF_CLUSTER, MASTER_ADDR)]
    assert (master.timeout_millis, master.data_version, master.ha_server_addr) == (TIMEOUT, DV, MASTER_HA)


def test_loaded_routes_and_cluster_info_answer_at_once_and_every_entry_is_provisional():
    mgr, _ = warm()
    assert route_brokers(mgr, "TopicA") == {DEF_BROKER, OTHER}
    brokers, clusters = mgr.get_all_cluster_info()
    assert clusters == {DEF_CLUSTER: {DEF_BROKER, OTHER}}
    assert brokers[DEF_BROKER].broker_addrs == {0: MASTER_ADDR, 1: SLAVE_ADDR}
    assert mgr.is_provisional(DEF_CLUSTER, MASTER_ADDR) and mgr.is_provisional(DEF_CLUSTER, OTHER_ADDR)
    assert mgr.is_provisional(DEF_CLUSTER, SLAVE_ADDR) and mgr.provisional_stats.loaded == 3
    assert live_entry(mgr, DEF_CLUSTER, MASTER_ADDR).timeout_millis == TIMEOUT


def test_group_member_without_live_info_gets_the_default_timeout():
    meta, topics, brokers = model_values()
    snap = orjson.loads(brokers)
    del snap["live"][f"{DEF_CLUSTER}|{SLAVE_ADDR}"]
    mgr, _ = make_manager()
    load_model(mgr, parse_model(meta, topics, orjson.dumps(snap)), "test", 0)
    assert live_entry(mgr, DEF_CLUSTER, SLAVE_ADDR).timeout_millis == DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
    assert mgr.is_provisional(DEF_CLUSTER, SLAVE_ADDR)


def test_rows_of_unknown_groups_are_not_loaded():
    meta, topics, brokers = model_values()
    topics[b"Orphan"] = orjson.dumps({"nobody": QueueData("nobody", 1, 1, 6, 0).to_wire()})
    mgr, _ = make_manager()
    load_model(mgr, parse_model(meta, topics, brokers), "test", 0)
    assert "Orphan" not in mgr.get_all_topic_list()


def test_load_refuses_tables_that_are_not_empty():
    mgr, _ = make_manager()
    register(mgr, MASTER, "TopicA")
    with pytest.raises(RuntimeError, match="empty route tables"):
        load_model(mgr, parse_model(*model_values()), "test", 0)


# --------------------------------------------------------------------------- confirmation


def test_master_registration_replaces_its_rows_even_with_the_same_data_version():
    mgr, _ = warm()
    v = mgr.version
    # the broker's table no longer has "Gone"; its DataVersion is the one in Redis
    result = register(mgr, MASTER.but(dv=DV), "TopicA", "New")
    assert result.data_version_changed and result.register_first and result.routes_changed
    assert mgr.version > v
    assert mgr.pickup_topic_route_data("Gone") is None
    assert route_brokers(mgr, "New") == {DEF_BROKER}
    assert route_brokers(mgr, "TopicA") == {DEF_BROKER, OTHER}  # OTHER's copied row stays provisional
    assert not mgr.is_provisional(DEF_CLUSTER, MASTER_ADDR) and mgr.is_provisional(DEF_CLUSTER, OTHER_ADDR)
    assert mgr.provisional_stats.confirmed == 1
    # from now on it is an ordinary registration: unchanged DataVersion, nothing rewritten
    again = register(mgr, MASTER.but(dv=DV), "TopicA", "New")
    assert not again.data_version_changed and not again.routes_changed


def test_registration_replaces_copied_queue_numbers_and_perm():
    mgr, _ = warm()
    configs = topic_configs(rq=2, wq=2, perm=4)
    configs["TopicA"] = topic_configs("TopicA", rq=2, wq=2, perm=4)["TopicA"]
    register(mgr, MASTER.but(dv=DV), configs=configs)
    qd = next(q for q in mgr.pickup_topic_route_data("TopicA").queue_datas if q.broker_name == DEF_BROKER)
    assert (qd.read_queue_nums, qd.write_queue_nums, qd.perm) == (2, 2, 4)


def test_provisional_entries_answer_no_broker_request():
    mgr, _ = warm()
    # QUERY_DATA_VERSION / heartbeats: as if unregistered, so the broker registers even with an equal DataVersion
    assert mgr.touch(DEF_CLUSTER, MASTER_ADDR) is None
    assert not mgr.update_broker_info_update_timestamp(DEF_CLUSTER, MASTER_ADDR)
    # a slave is not sent to a master that has not registered here
    slave = register(mgr, SLAVE.but(dv=DV), "TopicA")
    assert slave.master_addr is None and slave.ha_server_addr is None
    assert not mgr.is_provisional(DEF_CLUSTER, SLAVE_ADDR) and mgr.is_provisional(DEF_CLUSTER, MASTER_ADDR)
    assert mgr.pickup_topic_route_data("Gone") is not None  # a slave does not rewrite the group's rows
    register(mgr, MASTER.but(dv=DV), "TopicA")
    assert register(mgr, SLAVE.but(dv=DV), "TopicA").master_addr == MASTER_ADDR


def test_a_provisional_holder_never_wins_the_state_version_check():
    mgr, _ = warm()
    newcomer = MASTER.but(addr="10.9.9.9:10911", dv=DataVersion(1, state_version=0, timestamp=1))
    result = register(mgr, newcomer, "TopicA")
    assert result is not None and not result.conflict
    assert mgr.get_all_cluster_info()[0][DEF_BROKER].broker_addrs[0] == newcomer.addr
    # the replaced provisional entry is gone at once
    assert mgr.last_seen(DEF_CLUSTER, MASTER_ADDR) is None
    assert mgr.provisional_stats.dropped == 1
    assert mgr.pickup_topic_route_data("Gone") is None


def test_one_topic_registration_over_a_provisional_entry_is_refused_like_a_first_one():
    mgr, _ = warm()
    assert register(mgr, MASTER.but(dv=DV), configs=topic_configs("Only", base=False)) is None
    assert mgr.is_provisional(DEF_CLUSTER, MASTER_ADDR)
    assert mgr.pickup_topic_route_data("Gone") is not None


# --------------------------------------------------------------------------- deadlines


def test_unconfirmed_entries_drop_strictly_after_their_own_timeout_and_the_scan_leaves_them_alone():
    mgr, clock = warm()
    assert mgr.next_provisional_deadline() == clock.ms + TIMEOUT
    register(mgr, MASTER.but(dv=DV), "TopicA")
    clock.advance(TIMEOUT)
    assert mgr.drop_unconfirmed_provisional().applied == []
    clock.advance(1)
    assert mgr.expire_inactive().applied == []  # the expiry scan never takes a provisional entry
    dropped = mgr.drop_unconfirmed_provisional()
    assert [r.broker_addr for r in dropped.applied] == [SLAVE_ADDR]
    assert mgr.get_all_cluster_info()[0][DEF_BROKER].broker_addrs == {0: MASTER_ADDR}
    # OTHER's own timeout is twice as long
    assert mgr.is_provisional(DEF_CLUSTER, OTHER_ADDR)
    clock.advance(TIMEOUT)
    assert [r.broker_addr for r in mgr.drop_unconfirmed_provisional().applied] == [OTHER_ADDR]
    assert mgr.pickup_topic_route_data("OnlyB") is None  # TOPIC_NOT_EXIST once its only broker is dropped
    assert route_brokers(mgr, "TopicA") == {DEF_BROKER}
    assert mgr.next_provisional_deadline() is None
    s = mgr.provisional_stats
    assert (s.loaded, s.confirmed, s.dropped) == (3, 1, 2)


def test_an_unregistration_of_a_provisional_broker_counts_as_dropped():
    mgr, _ = warm()
    unregister(mgr, Broker(name=OTHER, addr=OTHER_ADDR))
    assert not mgr.is_provisional(DEF_CLUSTER, OTHER_ADDR) and mgr.provisional_stats.dropped == 1
    assert mgr.pickup_topic_route_data("OnlyB") is None


def test_drop_task_sleeps_until_each_deadline_and_ends_when_nothing_is_provisional(caplog):
    mgr, clock = warm()
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(round(seconds * 1000))

    register(mgr, MASTER.but(dv=DV), "TopicA")
    with caplog.at_level(logging.WARNING, "namesrv.warmstart"):
        asyncio.run(drop_unconfirmed(mgr, sleep))
    assert slept == [(TIMEOUT + 1) / 1000, TIMEOUT / 1000]
    assert mgr.next_provisional_deadline() is None
    assert "1 confirmed by registering, 2 dropped" in caplog.text


# --------------------------------------------------------------------------- warm_start()


def config(**kw) -> NamesrvConfig:
    cfg = NamesrvConfig(warm_start_from_redis=True, redis_url="redis://:secret@127.0.0.1:1/0")
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def test_warm_start_loads_what_it_reads_and_logs_where_from(caplog):
    mgr, _ = make_manager()
    seen = []

    def read(url: str, prefix: str, timeout: float) -> RedisModel:
        seen.append((url, prefix))
        return parse_model(*model_values())

    with caplog.at_level(logging.WARNING, "namesrv.warmstart"):
        report = asyncio.run(
            warm_start(config(redis_key_prefix="east"), mgr, read=read, wall_ms=lambda: 1_700_000_003_500)
        )
    assert seen == [("redis://:secret@127.0.0.1:1/0", "east")]
    assert report is not None and (report.brokers, report.groups, report.topics, report.batch_id) == (3, 2, 4, 42)
    assert report.age_ms == 2_500 and report.longest_timeout_ms == 2 * TIMEOUT
    assert "3 provisional broker(s)" in caplog.text and "batch 42" in caplog.text and "2.5 s ago" in caplog.text
    assert "secret" not in caplog.text


def test_warm_start_is_off_by_default_and_needs_a_url(caplog):
    mgr, _ = make_manager()

    def read(*_):
        raise AssertionError("must not read")

    assert asyncio.run(warm_start(NamesrvConfig(redis_url="redis://x"), mgr, read=read)) is None
    with caplog.at_level(logging.WARNING, "namesrv.warmstart"):
        assert asyncio.run(warm_start(config(redis_url=" "), mgr, read=read)) is None
    assert "redisUrl is empty" in caplog.text


@pytest.mark.parametrize(
    ("error", "logged"),
    [(ConnectionError("refused"), "cannot read"), (WarmStartError("bad shape"), "unusable model")],
)
def test_warm_start_failures_start_empty_with_a_warning(caplog, error, logged):
    mgr, _ = make_manager()

    def read(*_):
        raise error

    with caplog.at_level(logging.WARNING, "namesrv.warmstart"):
        assert asyncio.run(warm_start(config(), mgr, read=read)) is None
    assert logged in caplog.text and "starting with empty route tables" in caplog.text
    assert mgr.get_all_cluster_info() == ({}, {}) and mgr.provisional_stats.loaded == 0


def test_warm_start_with_nothing_written_starts_empty(caplog):
    mgr, _ = make_manager()
    with caplog.at_level(logging.WARNING, "namesrv.warmstart"):
        assert asyncio.run(warm_start(config(), mgr, read=lambda *_: parse_model({}, {}, None))) is None
    assert "no route model" in caplog.text


def test_an_old_model_is_loaded_with_a_warning(caplog):
    mgr, _ = make_manager()
    with caplog.at_level(logging.WARNING, "namesrv.warmstart"):
        report = asyncio.run(
            warm_start(
                config(),
                mgr,
                read=lambda *_: parse_model(*model_values()),
                wall_ms=lambda: 1_700_000_001_000 + 3_600_000,
            )
        )
    assert report is not None and report.age_ms == 3_600_000
    assert "older than the brokers' timeout" in caplog.text


def test_redact_url_hides_only_the_password():
    assert redact_url("redis://:pw@h:6379/0") == "redis://:***@h:6379/0"
    assert redact_url("redis://u:pw@h/1") == "redis://u:***@h/1"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


def test_a_provisional_master_replaced_at_another_address_takes_its_filter_servers_with_it():
    meta, topics, brokers = model_values()
    snap = orjson.loads(brokers)
    snap["filterServers"] = {f"{DEF_CLUSTER}|{MASTER_ADDR}": ["10.0.1.1:1"]}
    mgr, _ = make_manager()
    load_model(mgr, parse_model(meta, topics, orjson.dumps(snap)), "test", 0)
    assert mgr.pickup_topic_route_data("TopicA").filter_server_table == {MASTER_ADDR: ["10.0.1.1:1"]}
    register(mgr, MASTER.but(addr="10.9.9.9:10911", dv=DataVersion(1, state_version=0, timestamp=1)), "TopicA")
    assert BrokerAddrInfo(DEF_CLUSTER, MASTER_ADDR) not in dumped(mgr).filter_servers
    assert mgr.provisional_stats.dropped == 1
