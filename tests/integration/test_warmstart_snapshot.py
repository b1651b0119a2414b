"""Warm start of filter servers and static topics: the job's own store writes the model into a real
Redis (``RedisService``), and a warm-started node's answers are compared, byte for byte, with the
answers of the node the model came from.  The clock is injected; nothing sleeps.
"""

from __future__ import annotations

import orjson

from common.protocol.codes import DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
from common.protocol.types import DataVersion
from common.routes import BrokerAddrInfo, RouteInfoManager, RouteSettings
from namesrv.warmstart import load_model
from tests.support.brokers import mapping, registration
from tests.unit.routes_support import (
    Broker,
    Clock,
    dumped,
    unregister,
)

# --------------------------------------------------------------------------- filter servers and static topics


FILTERS_A0, FILTERS_A1 = ["10.0.1.1:1", "10.0.1.1:2"], ["10.0.1.2:1"]
A0, A1, B0 = ("a", "10.0.0.1:1", 0), ("a", "10.0.0.2:1", 1), ("b", "10.0.0.3:1", 0)


def as_broker(member: tuple[str, str, int]) -> Broker:
    name, addr, bid = member
    return Broker(cluster="C1", name=name, addr=addr, id=bid)


class Node:
    """A node's handlers over its own route tables and clock; ``publisher`` is set on the original only."""

    def __init__(self, tmp_path, name: str, clock: Clock, *, publish: bool) -> None:
        from namesrv.config import load_config
        from namesrv.events.publisher import EventPublisher, PublisherSettings
        from namesrv.handlers import HandlerContext
        from namesrv.kvconfig import KVConfigManager

        kv = tmp_path / f"{name}-kv.json"
        config = load_config(None, {"kvConfigPath": str(kv), "configStorePath": str(tmp_path / f"{name}-p")})
        self.routes = RouteInfoManager(config, now_ms=clock)
        self.publisher = EventPublisher(PublisherSettings("k:1", "events", name), self.routes) if publish else None
        observer = {} if self.publisher is None else {"observer": self.publisher}
        self.node = HandlerContext(config, self.routes, KVConfigManager(kv), lambda _: True, **observer)

    def register(
        self,
        broker: tuple[str, str, int],
        counter: int,
        topics: tuple[str, ...],
        filters: list[str],
        mappings: dict | None = None,
    ) -> list:
        """One REGISTER_BROKER through the handler; returns the events the node published."""
        from common.protocol.codes import RequestCode, ResponseCode
        from common.protocol.command import request
        from common.protocol.types import TopicConfig
        from namesrv.handlers import dispatch

        name, addr, bid = broker
        ext, raw = registration(
            broker_name=name, broker_addr=addr, cluster="C1", broker_id=bid,
            configs={t: TopicConfig(t, 8, 8, 6) for t in topics},
            data_version=DataVersion(counter, 0, 1_700_000_000_000 + counter), filter_servers=filters, mappings=mappings,
        )  # fmt: skip
        response = dispatch(self.node, request(RequestCode.REGISTER_BROKER, ext, raw), object())
        assert response.code == ResponseCode.SUCCESS, response.remark
        return [] if self.publisher is None else self.publisher.queue.take(10, 0)

    def answer(self, topic: str, version: int) -> bytes | None:
        """GET_ROUTEINFO_BY_TOPIC as a client of ``version`` asks it; None for TOPIC_NOT_EXIST."""
        from common.protocol.codes import RequestCode, ResponseCode
        from common.protocol.command import request
        from namesrv.handlers import dispatch

        response = dispatch(self.node, request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, version=version),
                            None)  # fmt: skip
        return response.body if response.code == ResponseCode.SUCCESS else None


TOPICS = ("T1", "T2", "T3", "nope")


def answers(node: Node) -> dict:
    from common.protocol.codes import Version

    # both dialects: the legacy one writes the mappings' integer keys as integers
    return {(t, v): node.answer(t, v) for t in TOPICS for v in (Version.V4_9_4, Version.V4_9_4 - 1)}


def original_and_snapshot(tmp_path, redis_url: str, prefix: str) -> tuple[Node, bytes]:
    """A node with filter servers and static mappings; the job's model of it, written to Redis by the job's store.

    Returns the node and the ``model:brokers`` value the store wrote.
    """
    import redis

    from common.contract import decode_event, encode_event
    from streaming.routes import RedisKeys, RedisRouteStore, RouteModel

    original = Node(tmp_path, "before", Clock(), publish=True)
    job = RouteModel(RouteSettings())
    regs = [
        (A0, ("T1", "T2"), FILTERS_A0, {"T1": mapping("T1", "a", 12)}),
        (A1, ("T1", "T2"), FILTERS_A1, None),
        (B0, ("T1", "T3"), [], {"T1": mapping("T1", "b", 4), "T3": mapping("T3", "b", 2)}),
    ]
    for broker, topics, filters, mappings in regs:
        for event in original.register(broker, 1, topics, filters, mappings):
            job.apply_event(decode_event(encode_event(event)))  # through JSON, as the job reads it
    client = redis.Redis.from_url(redis_url)
    store = RedisRouteStore(client, RedisKeys(prefix))
    try:
        store.commit("lineage-1", 1, job.changes(full=True), replace=True)
        brokers = client.get(store.keys.model_brokers)
    finally:
        client.close()
    assert b'"filterServers"' in brokers and b'"mappings"' in brokers
    return original, brokers


def warm_node(tmp_path, redis_url: str, prefix: str, clock: Clock) -> Node:
    from namesrv.warmstart import READ_TIMEOUT_S, _read

    node = Node(tmp_path, "after", clock, publish=False)
    load_model(node.routes, _read(redis_url, prefix, READ_TIMEOUT_S), "test", 0)
    return node


def test_a_warm_started_node_answers_routes_byte_for_byte_as_before_its_restart(tmp_path, redis_url):
    original, _ = original_and_snapshot(tmp_path, redis_url, "fs1")
    node = warm_node(tmp_path, redis_url, "fs1", Clock())
    before = answers(original)
    route = orjson.loads(before["T1", 401])
    assert route["filterServerTable"] == {A0[1]: FILTERS_A0, A1[1]: FILTERS_A1}
    assert set(route["topicQueueMappingByBroker"]) == {"a", "b"}
    assert answers(node) == before
    assert all(node.routes.is_provisional("C1", b[1]) for b in (A0, A1, B0))


def test_registrations_replace_copied_filter_servers_and_a_dropped_entry_takes_its_own(tmp_path, redis_url):
    original, _ = original_and_snapshot(tmp_path, redis_url, "fs2")
    clock = Clock()
    node = warm_node(tmp_path, redis_url, "fs2", clock)

    # a0's own registration lists none: its copied ones go; a new mapping epoch (and DataVersion)
    # replaces the copy
    for n in (original, node):
        n.register(A0, 2, ("T1", "T2"), [], {"T1": mapping("T1", "a", 12, epoch=2)})
    assert answers(node) == answers(original)
    t1 = orjson.loads(node.answer("T1", 401))
    assert t1["filterServerTable"] == {A1[1]: FILTERS_A1}
    assert t1["topicQueueMappingByBroker"]["a"]["epoch"] == 2
    assert BrokerAddrInfo("C1", A0[1]) not in dumped(node.routes).filter_servers

    # a1 never registers: dropped as the original unregisters it, filter servers included
    unregister(original.routes, as_broker(A1))
    clock.advance(DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS + 1)
    node.register(A0, 2, ("T1", "T2"), [], {"T1": mapping("T1", "a", 12, epoch=2)})  # a0 stays live
    node.register(B0, 1, ("T1", "T3"), [], {"T1": mapping("T1", "b", 4), "T3": mapping("T3", "b", 2)})
    assert [r.broker_addr for r in node.routes.drop_unconfirmed_provisional().applied] == [A1[1]]
    assert BrokerAddrInfo("C1", A1[1]) not in dumped(node.routes).filter_servers
    assert answers(node) == answers(original)

    # b unregisters: its mappings stay, on both, as Java keeps them (spec §3.4)
    for n in (original, node):
        unregister(n.routes, as_broker(B0))
    assert dumped(node.routes).mappings["T3"] == dumped(original.routes).mappings["T3"]
    assert answers(node) == answers(original)


def test_a_snapshot_older_than_filter_servers_and_mappings_loads_the_rest_as_before(tmp_path, redis_url):
    import redis

    original, brokers = original_and_snapshot(tmp_path, redis_url, "fs3")
    old = orjson.loads(brokers)
    del old["filterServers"], old["mappings"]
    client = redis.Redis.from_url(redis_url)
    try:
        client.set("fs3:model:brokers", orjson.dumps(old, option=orjson.OPT_SORT_KEYS))
    finally:
        client.close()
    node = warm_node(tmp_path, redis_url, "fs3", Clock())
    snap = dumped(node.routes)
    assert snap.filter_servers == {} and snap.mappings == {}
    assert all(node.routes.is_provisional("C1", b[1]) for b in (A0, A1, B0))
    for topic in TOPICS:
        want = original.answer(topic, 401)
        if want is None:
            assert node.answer(topic, 401) is None
            continue
        route = orjson.loads(want)
        route["filterServerTable"] = {}
        route.pop("topicQueueMappingByBroker", None)
        assert orjson.loads(node.answer(topic, 401)) == route, topic
