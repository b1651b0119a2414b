"""The job's foreachBatch sink against a real Redis (publishing to a fake), and its Kafka
publisher's start-up wait with Kafka down."""

from __future__ import annotations

import logging

from common.contract import ActionType, Event, EventType, decode_action, encode_event
from common.routes.materialised import encode_removal
from infra.processes import free_port
from streaming.alerts import decode_alert
from streaming.liveness import KIND_ROUTE
from streaming.publisher import KafkaPublisher
from streaming.routes import RedisRouteStore, RouteLookup
from tests.support.streaming import T0, expire_row, make_sink, out_row, register, route_row


def test_the_sink_publishes_actions_then_writes_routes_and_skips_a_replayed_batch(redis_url):
    sink, pub = make_sink(redis_url, "s1")
    sink.set_lineage("q")
    lookup = RouteLookup(redis_url, prefix="s1")
    sink.process([route_row(register())], 0)
    assert lookup.get("T").broker_datas[0].broker_addrs == {0: "10.0.0.1:1"}

    alerts = sink.process([expire_row(T0 + 20_000)], 1)
    (action,) = [decode_action(v) for topic, _, v in pub.sent if topic == sink.cfg.actions_topic]
    assert (action.type, action.broker_addr, action.last_heartbeat, action.monitor) == (
        ActionType.EXPIRE,
        "10.0.0.1:1",
        T0,
        "m",
    )
    assert lookup.get("T") is None and lookup.topics() == []
    # the topics lost with their last broker are one incident of its group (C, named after the
    # cluster, is a system topic: counted, not named), published and kept open in Redis
    (lost,) = alerts
    assert (lost.incident, lost.topics) == ("TOPIC_NOT_WRITABLE|C|a", ("C", "T"))
    assert "1 topic(s): T;" in lost.message and "1 system topic(s)" in lost.message
    assert [decode_alert(v).incident for t, _, v in pub.sent if t == sink.cfg.alerts_topic] == [lost.incident]
    assert lookup.alerts() == [lost]

    # the same batch again (a replay after a crash): nothing is published or written
    sent = len(pub.sent)
    assert sink.process([route_row(register(t=T0 + 30_000))], 1) == []
    assert len(pub.sent) == sent and lookup.get("T") is None

    # a restarted driver with the same query carries on from Redis
    again, _ = make_sink(redis_url, "s1")
    again.set_lineage("q")
    assert again.process([route_row(register(t=T0 + 40_000))], 1) == []
    resolved = again.process([route_row(register(t=T0 + 40_000))], 2)
    assert [(a.incident, str(a.state)) for a in resolved] == [("TOPIC_NOT_WRITABLE|C|a", "RESOLVED")]
    assert lookup.get("T") is not None and lookup.alerts() == []


def test_the_sink_applies_order_conf_when_configured_and_a_restart_keeps_it(redis_url):
    conf = Event(type=EventType.ORDER_TOPIC_CONF, node="n1", event_time=T0 + 1, seq=2, topic="T",
                 order_topic_conf="a:4")  # fmt: skip
    conf_row = out_row(KIND_ROUTE, conf.event_time, node="n1", seq=2, type="ORDER_TOPIC_CONF",
                       raw=encode_event(conf).decode())  # fmt: skip
    lookup = RouteLookup(redis_url, prefix="s5")
    sink, _ = make_sink(redis_url, "s5", **{"routes.orderMessageEnable": "true"})
    sink.set_lineage("q")
    sink.process([route_row(register()), conf_row], 0)
    assert lookup.get("T").order_topic_conf == "a:4" and lookup.get("C").order_topic_conf is None

    again, _ = make_sink(redis_url, "s5", **{"routes.orderMessageEnable": "true"})
    again.set_lineage("q")
    assert again.model.order_topic_conf("T") == "a:4"
    again.process([route_row(register(t=T0 + 20_000, seq=3))], 1)  # the group changes nothing here
    assert lookup.get("T").order_topic_conf == "a:4"

    off, _ = make_sink(redis_url, "s6")  # the default, as on a node
    off.set_lineage("q")
    off.process([route_row(register()), conf_row], 0)
    assert RouteLookup(redis_url, prefix="s6").get("T").order_topic_conf is None


def test_a_new_query_lineage_replaces_what_redis_held(redis_url):
    old, _ = make_sink(redis_url, "s2")
    old.set_lineage("old")
    old.process([route_row(register(addr="10.0.0.9:1", name="z"))], 5)
    new, _ = make_sink(redis_url, "s2")
    new.set_lineage("new")
    new.process([route_row(register())], 0)
    lookup = RouteLookup(redis_url, prefix="s2")
    assert [b.broker_name for b in lookup.get("T").broker_datas] == ["a"]
    assert lookup.status()["lineage"] == "new"


def test_redis_down_does_not_stop_decisions_and_the_next_write_catches_up(redis_url, caplog):
    sink, pub = make_sink(redis_url, "s3")
    sink.set_lineage("q")
    good_client = sink.store.client
    sink.store.client = RedisRouteStore.from_url(f"redis://127.0.0.1:{free_port()}/0").client
    with caplog.at_level(logging.ERROR, logger="streaming.sink"):
        sink.process([route_row(register()), expire_row(T0 + 20_000, addr="10.0.0.7:1")], 0)
    assert "not written" in caplog.text
    assert [t for t, _, _ in pub.sent if t == sink.cfg.actions_topic]  # the action went out anyway
    sink.store.client = good_client
    sink.process([], 1)
    assert RouteLookup(redis_url, prefix="s3").get("T") is not None


def test_the_monitor_waits_for_kafka_at_start_and_can_be_stopped_meanwhile(caplog):
    """Kafka down at start-up is a wait with one warning, not a crash; a stop request ends the wait."""
    import threading

    stopping = threading.Event()
    threading.Timer(1.0, stopping.set).start()
    with caplog.at_level(logging.WARNING, logger="streaming.publisher"):
        assert KafkaPublisher.connect(f"127.0.0.1:{free_port()}", stopping) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "streaming.publisher"]
    assert len(warnings) == 1 and "does not answer yet" in warnings[0] and "kafka.bootstrap" in warnings[0]


def test_a_removal_a_node_writes_while_a_batch_is_under_way_is_not_written_over(redis_url):
    # the job read the nodes' removals, then stalled; meanwhile a node removed the broker from Redis. The
    # batch, which still holds the broker's (older) registration, must not write it back when it resumes.
    sink, _ = make_sink(redis_url, "s9")
    sink.set_lineage("q")
    lookup = RouteLookup(redis_url, prefix="s9")
    store = sink.store
    assert store is not None
    try:
        sink.process([route_row(register())], 0)
        publish = sink._publish_actions

        def node_removes_meanwhile(rows, at):
            publish(rows, at)
            store.client.hset(store.keys.model_removed, *encode_removal("C", "10.0.0.1:1", T0 + 5_000))

        sink._publish_actions = node_removes_meanwhile  # type: ignore[method-assign]
        sink.process([route_row(register(t=T0 + 1_000))], 1)
        assert lookup.get("T") is None
        assert lookup.status()["batchId"] == "1"  # written, again, with the removal in
        sink._publish_actions = publish  # type: ignore[method-assign]
        sink.process([route_row(register(t=T0 + 6_000))], 2)  # the broker back after its removal: written
        assert lookup.get("T") is not None
    finally:
        store.reset()
        lookup.close()


def test_a_batch_redis_lost_after_acknowledging_it_is_written_again_with_the_next(redis_url, caplog):
    # A master that fails over before passing its last write to its replica, or a Redis restarted without
    # persistence between two batches, acknowledged a batch it no longer holds. The next batch's differences
    # alone would leave that batch's changes out for good: the job sees P:meta behind and writes everything.
    sink, _ = make_sink(redis_url, "s10")
    sink.set_lineage("q")
    lookup = RouteLookup(redis_url, prefix="s10")
    store = sink.store
    assert store is not None
    try:
        sink.process([route_row(register())], 0)
        before = {key: store.client.dump(key) for key in store.client.scan_iter(match="s10:*")}
        sink.process([route_row(register(addr="10.0.0.2:1", name="b", seq=2))], 1)
        both = lookup.get_raw("T")
        assert {q.broker_name for q in lookup.get("T").queue_datas} == {"a", "b"}
        # the failover: the new master holds what the old one had passed on before batch 1
        store.client.delete(*store.client.scan_iter(match="s10:*"))
        for key, value in before.items():
            store.client.restore(key, 0, value)
        assert lookup.status()["batchId"] == "0"
        with caplog.at_level(logging.WARNING, logger="streaming.sink"):
            sink.process([], 2)
        assert lookup.get_raw("T") == both == sink.model.route("T")
        assert lookup.status()["batchId"] == "2"
        assert "not batch 1 that this job wrote last" in caplog.text
    finally:
        store.reset()
        lookup.close()
