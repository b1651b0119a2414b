"""The route model against the node's own route tables (the Redis store against a real Redis: tests/integration)."""

from __future__ import annotations

import orjson
import pytest

from common.contract import (
    AdminOp,
    BrokerQueueInfo,
    Event,
    EventType,
    QueueInfo,
    decode_event,
    encode_event,
)
from common.protocol import bodies, fastjson
from common.protocol.codes import ORDER_TOPIC_CONFIG, RequestCode, ResponseCode
from common.protocol.command import request
from common.protocol.types import DataVersion, QueueData, RegisterBrokerBody, TopicConfig
from common.routes import RouteInfoManager, RouteSettings
from common.routes.snapshot import decode_model
from namesrv.config import load_config
from namesrv.events.publisher import EventPublisher, PublisherSettings
from namesrv.handlers import HandlerContext, dispatch
from namesrv.kvconfig import KVConfigManager
from streaming.routes import RedisKeys, RouteModel
from tests.support.brokers import mapping, registration
from tests.support.route_events import A0, A1, B0, CLUSTER, T0, reg_event


def restore(entries: dict[str, bytes], brokers: bytes | None, *, order_message_enable: bool = False) -> RouteModel:
    """The model a restarted job reads back from what ``changes`` wrote."""
    return RouteModel.from_snapshot(decode_model({}, entries, brokers), order_message_enable=order_message_enable)


def node_register(m: RouteInfoManager, e: Event) -> None:
    """What a node does for the registration the event reports (the handler's call)."""
    dv = e.data_version
    m.register_broker(
        e.cluster_name, e.broker_addr, e.broker_name, e.broker_id, e.ha_server_addr, None, e.heartbeat_timeout_millis,
        e.enable_acting_master,
        RegisterBrokerBody(
            DataVersion(dv.counter, dv.state_version, dv.timestamp),
            {n: TopicConfig(n, q.read_queue_nums, q.write_queue_nums, q.perm) for n, q in e.topics.items()},
            filter_server_list=e.filter_server_list,
            topic_queue_mapping_info_map={
                t: fastjson.loads(text) for t, text in (e.topic_queue_mapping_info_map or {}).items()
            },
        ),
    )  # fmt: skip


def same(model: RouteModel, node: RouteInfoManager) -> None:
    topics = set(node.get_all_topic_list())
    assert set(model.topics()) == topics
    for t in topics | {"nope"}:
        want = node.pickup_topic_route_data(t)
        assert model.route(t) == (None if want is None else bodies.encode_route(want, standard=True)), t
    assert model.cluster_info() == bodies.encode_cluster_info(*node.get_all_cluster_info())


@pytest.mark.parametrize("acting", [False, True])
def test_the_model_answers_what_a_node_answers_through_registrations_admin_and_removals(acting):
    settings = RouteSettings(support_acting_master=acting)
    node = RouteInfoManager(settings)
    model = RouteModel(settings)
    events = [
        reg_event(e.broker_name, e.broker_addr, e.broker_id, {n: (q.read_queue_nums, q.write_queue_nums, q.perm)
                                                              for n, q in e.topics.items()}, acting=acting)
        for e in (A0, A1, B0)
    ]  # fmt: skip
    for e in events:
        node_register(node, e)
        model.apply_event(decode_event(encode_event(e)))  # through JSON, as the job sees it
    same(model, node)

    wipe = Event(
        type=EventType.ADMIN,
        node="n1",
        event_time=T0 + 1,
        seq=2,
        op=AdminOp.WIPE_WRITE_PERM,
        broker_name="b",
        topic_count=2,
    )
    node.wipe_write_perm_of_broker("b")
    model.apply_event(wipe)
    same(model, node)

    reg_topic = Event(
        type=EventType.ADMIN,
        node="n1",
        event_time=T0 + 2,
        seq=3,
        op=AdminOp.REGISTER_TOPIC,
        topic="T9",
        queue_datas=[BrokerQueueInfo("a", QueueInfo(3, 3, 6))],
    )
    node.register_topic("T9", [QueueData("a", 3, 3, 6, 0)])
    model.apply_event(reg_topic)
    delete = Event(type=EventType.ADMIN, node="n1", event_time=T0 + 3, seq=4, op=AdminOp.DELETE_TOPIC, topic="T2")
    node.delete_topic("T2")
    model.apply_event(delete)
    same(model, node)

    # the master of "a" expires: the node unregisters it as for an UNREGISTER_BROKER
    node.unregister_brokers([node.build_unregister_request(CLUSTER, A0.broker_addr)])
    assert model.apply_removal(CLUSTER, A0.broker_addr, T0 + 4, unclean=True)
    same(model, node)
    assert not model.apply_removal(CLUSTER, A0.broker_addr, T0 + 5, unclean=True)  # twice changes nothing
    same(model, node)


def test_changes_cover_exactly_what_moved_and_topics_lost_with_their_last_broker():
    model = RouteModel()
    model.apply_event(A0)
    model.apply_event(B0)
    first = model.changes()
    assert set(first.routes) == {"T1", "T2", "T3", "C1"} and first.cluster is not None
    assert model.changes().empty  # nothing applied since

    # a slave joins "a": the routes of a's topics change (brokerDatas), b's T3 does not
    model.apply_event(A1)
    ch = model.changes()
    assert set(ch.routes) == {"T1", "T2", "C1"}
    assert ch.model_topics == {}  # queue data unchanged, only group membership

    model.apply_removal(CLUSTER, B0.broker_addr, T0 + 9, unclean=True)
    ch = model.changes()
    assert ch.routes["T3"] is None and ch.model_topics["T3"] is None
    assert ch.lost_topics == {"T3"}
    assert ch.routes["T1"] is not None  # still served by "a"


def test_cluster_info_and_brokers_are_written_again_after_a_lost_write_even_with_nothing_applied():
    model = RouteModel()
    model.apply_event(A0)
    written = model.changes()
    assert model.changes().empty
    model.forget_written()  # a failed Redis write: the next one (full, as the job asks) carries everything
    again = model.changes(full=True)
    assert (again.cluster, again.model_brokers, again.routes) == (
        written.cluster,
        written.model_brokers,
        written.routes,
    )
    assert model.changes().empty and model.changes(full=True).empty


def test_a_clean_unregistration_loses_no_topic():
    model = RouteModel()
    model.apply_event(B0)
    model.changes()
    model.apply_removal(CLUSTER, B0.broker_addr, T0 + 1, unclean=False)
    assert model.changes().lost_topics == set()


def test_keys_document_layout():
    k = RedisKeys("p")
    assert (k.route("T"), k.topics, k.cluster, k.alerts, k.meta, k.channel) == (
        "p:route:T", "p:topics", "p:cluster", "p:alerts", "p:meta", "p:routes:changed"
    )  # fmt: skip


def test_a_replayed_unchanged_registration_re_adds_a_topic_an_admin_deleted_as_a_node_does():
    node = RouteInfoManager(RouteSettings())
    model = RouteModel()
    node_register(node, A0)
    model.apply_event(A0)
    node.delete_topic("T1")
    model.apply_event(
        Event(type=EventType.ADMIN, node="n1", event_time=T0 + 1, seq=2, op=AdminOp.DELETE_TOPIC, topic="T1")
    )
    model.changes()
    node_register(node, A0)  # the broker's next periodic registration, DataVersion unchanged
    model.apply_event(A0)  # what the processor passes again (cause REREGISTER)
    same(model, node)
    assert "T1" in model.changes().routes


# --------------------------------------------------------------------------- filter servers and static topics


class NodeAndJob:
    """A node's handlers with the event publisher as observer, and the job's model fed what it publishes."""

    def __init__(self, tmp_path, **node_config: str) -> None:
        config = load_config(None, {"kvConfigPath": str(tmp_path / "kv.json"), "configStorePath": str(tmp_path / "p"),
                                    **node_config})  # fmt: skip
        routes = RouteInfoManager(config)
        self.publisher = EventPublisher(PublisherSettings("k:1", "events", "ns-1"), routes)
        self.node = HandlerContext(config, routes, KVConfigManager(tmp_path / "kv.json"), lambda _: True,
                                   observer=self.publisher)  # fmt: skip
        # the job's switch set as on the node, as conf/streaming.properties tells operators to
        self.model = RouteModel(RouteSettings(support_acting_master=config.support_acting_master),
                                order_message_enable=config.order_message_enable)  # fmt: skip

    def forward(self) -> list[Event]:
        """The job applies the route events the node published since the last call."""
        events = self.publisher.queue.take(100, 0)
        for event in events:
            if event.type in (EventType.REGISTER, EventType.ORDER_TOPIC_CONF):
                self.model.apply_event(decode_event(encode_event(event)))  # through JSON, as the job sees it
        return events

    def register(
        self,
        name: str,
        addr: str,
        bid: int,
        counter: int,
        topics: tuple[str, ...],
        filters: list[str],
        mappings: dict | None = None,
        compressed: bool = False,
        zone: str | None = None,
        acting: bool = False,
    ) -> EventType:
        """One REGISTER_BROKER through the handler; the job applies what the node published."""
        ext, raw = registration(
            broker_name=name, broker_addr=addr, cluster=CLUSTER, broker_id=bid, enable_acting_master=acting, zone=zone,
            configs={t: TopicConfig(t, 8, 8, 6) for t in topics}, data_version=DataVersion(counter, 0, T0 + counter),
            filter_servers=filters, mappings=mappings, compressed=compressed,
        )  # fmt: skip
        response = dispatch(self.node, request(RequestCode.REGISTER_BROKER, ext, raw), object())
        assert response.code == ResponseCode.SUCCESS
        (event,) = self.forward()
        return event.type

    def kv(
        self, code: RequestCode, key: str, value: str | None = None, namespace: str = ORDER_TOPIC_CONFIG
    ) -> list[Event]:
        """PUT_KV_CONFIG / DELETE_KV_CONFIG through the handler; the job applies what the node published."""
        ext = {"namespace": namespace, "key": key, **({} if value is None else {"value": value})}
        assert dispatch(self.node, request(code, ext), object()).code == ResponseCode.SUCCESS
        return self.forward()

    def answer(self, topic: str) -> bytes | None:
        """GET_ROUTEINFO_BY_TOPIC as a client from 4.9.4 on asks it (standard JSON)."""
        response = dispatch(self.node, request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), None)
        return response.body if response.code == ResponseCode.SUCCESS else None

    def check(self, *topics: str) -> None:
        for topic in (*topics, "nope"):
            assert self.model.route(topic) == self.answer(topic), topic
        cluster = dispatch(self.node, request(RequestCode.GET_BROKER_CLUSTER_INFO, {}), None)
        assert self.model.cluster_info() == cluster.body


A0_ADDR, A1_ADDR, B0_ADDR = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"


def test_filter_servers_and_static_topic_mappings_reach_the_model_as_the_node_answers_them(tmp_path):
    nj = NodeAndJob(tmp_path)
    assert nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), ["10.0.1.1:1", "10.0.1.1:2"],
                       {"T1": mapping("T1", "a", 12)}) is EventType.REGISTER  # fmt: skip
    nj.register("a", A1_ADDR, 1, 1, ("T1", "T2"), ["10.0.1.2:1"])
    nj.register("b", B0_ADDR, 0, 1, ("T1", "T3"), [], {"T1": mapping("T1", "b", 4)}, compressed=True)
    nj.check("T1", "T2", "T3")
    route = orjson.loads(nj.answer("T1"))
    assert route["filterServerTable"] == {A0_ADDR: ["10.0.1.1:1", "10.0.1.1:2"], A1_ADDR: ["10.0.1.2:1"]}
    assert set(route["topicQueueMappingByBroker"]) == {"a", "b"}
    assert b'"currIdMap":{"0":0,"1":1,"2":2,' in nj.answer("T1")  # numeric key order, not "0","1","10"

    # same DataVersion, empty list: the node drops a0's filter servers, and so does the model
    assert nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), [], {"T1": mapping("T1", "a", 12)}) is EventType.REGISTER
    nj.check("T1", "T2", "T3")
    assert orjson.loads(nj.answer("T1"))["filterServerTable"] == {A1_ADDR: ["10.0.1.2:1"]}
    assert nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), [], {"T1": mapping("T1", "a", 12)}) is EventType.HEARTBEAT

    # a new DataVersion brings a new mapping epoch
    nj.register("a", A0_ADDR, 0, 2, ("T1", "T2"), [], {"T1": mapping("T1", "a", 12, epoch=2)})
    nj.check("T1", "T2", "T3")
    assert orjson.loads(nj.answer("T1"))["topicQueueMappingByBroker"]["a"]["epoch"] == 2


def test_a_registration_event_from_an_older_node_leaves_filter_servers_and_mappings_alone():
    node, model = RouteInfoManager(RouteSettings()), RouteModel()
    first = reg_event("a", A0_ADDR, 0, {"T1": (4, 4, 6), "T2": (4, 4, 6)}, filters=["10.0.1.1:1"],
                      mappings={"T1": mapping("T1", "a", 2)})  # fmt: skip
    node_register(node, first)
    model.apply_event(decode_event(encode_event(first)))
    wire = orjson.loads(encode_event(reg_event("a", A0_ADDR, 0, {"T1": (4, 4, 6), "T2": (4, 4, 6)}, counter=2)))
    assert "filterServerList" not in wire and "topicQueueMappingInfoMap" not in wire
    legacy = decode_event(wire)
    node_register(node, legacy)  # a broker that sends no list at all: the node leaves the table alone too
    model.apply_event(legacy)
    same(model, node)
    assert orjson.loads(model.route("T1"))["filterServerTable"] == {A0_ADDR: ["10.0.1.1:1"]}


def test_a_restored_model_keeps_filter_servers_and_mappings():
    node, model = RouteInfoManager(RouteSettings()), RouteModel()
    events = [
        reg_event("a", A0_ADDR, 0, {"T1": (4, 4, 6), "T2": (4, 4, 6)}, filters=["10.0.1.1:1"],
                  mappings={"T1": mapping("T1", "a", 12)}),
        reg_event("a", A1_ADDR, 1, {"T1": (4, 4, 6), "T2": (4, 4, 6)}, filters=["10.0.1.2:1"]),
    ]  # fmt: skip
    for e in events:
        node_register(node, e)
        model.apply_event(e)
    # a deleted topic keeps its mapping (as on a node), so it must survive a restart without queue rows
    node.delete_topic("T1")
    model.apply_event(Event(type=EventType.ADMIN, node="n1", event_time=T0 + 1, seq=2, op=AdminOp.DELETE_TOPIC,
                            topic="T1"))  # fmt: skip
    written = model.changes(full=True)
    entries = {t: e for t, e in written.model_topics.items() if e is not None}
    assert b'"filterServers"' in written.model_brokers and b'"mappings"' in written.model_brokers

    restored = restore(entries, written.model_brokers)
    same(restored, node)
    assert restored.changes().empty  # it knows what is already written

    # after the restart: the topic comes back with its mapping, a1's filter servers go with it
    node.register_topic("T1", [QueueData("a", 4, 4, 6, 0)])
    restored.apply_event(Event(type=EventType.ADMIN, node="n1", event_time=T0 + 2, seq=3, op=AdminOp.REGISTER_TOPIC,
                               topic="T1", queue_datas=[BrokerQueueInfo("a", QueueInfo(4, 4, 6))]))  # fmt: skip
    node.unregister_brokers([node.build_unregister_request(CLUSTER, A1_ADDR)])
    restored.apply_removal(CLUSTER, A1_ADDR, T0 + 3, unclean=True)
    same(restored, node)
    route = orjson.loads(restored.route("T1"))
    assert route["filterServerTable"] == {A0_ADDR: ["10.0.1.1:1"]} and set(route["topicQueueMappingByBroker"]) == {"a"}


# --------------------------------------------------------------------------- orderTopicConf and BrokerData changes

PUT, DELETE = RequestCode.PUT_KV_CONFIG, RequestCode.DELETE_KV_CONFIG


def test_order_topic_conf_put_changed_and_deleted_reaches_the_routes_as_the_node_answers_them(tmp_path):
    nj = NodeAndJob(tmp_path, orderMessageEnable="true")
    nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), [])
    nj.model.changes()

    (put,) = nj.kv(PUT, "T1", "a:8")
    assert (put.type, put.topic, put.order_topic_conf) == (EventType.ORDER_TOPIC_CONF, "T1", "a:8")
    nj.check("T1", "T2")
    assert orjson.loads(nj.answer("T1"))["orderTopicConf"] == "a:8"
    assert set(nj.model.changes().routes) == {"T1"}  # written to Redis and announced

    nj.kv(PUT, "T1", "a:4;b:4")
    nj.check("T1", "T2")
    assert orjson.loads(nj.answer("T1"))["orderTopicConf"] == "a:4;b:4"
    assert set(nj.model.changes().routes) == {"T1"}

    (delete,) = nj.kv(DELETE, "T1")
    assert (delete.type, delete.topic, delete.order_topic_conf) == (EventType.ORDER_TOPIC_CONF, "T1", None)
    nj.check("T1", "T2")
    assert "orderTopicConf" not in orjson.loads(nj.answer("T1"))
    assert set(nj.model.changes().routes) == {"T1"}

    # a put without a value: the node stores null, which no route shows
    nj.kv(PUT, "T2", "a:1")
    nj.kv(PUT, "T2")
    nj.check("T1", "T2")
    assert "orderTopicConf" not in orjson.loads(nj.answer("T2"))
    # another namespace never shows in routes and is not published
    assert nj.kv(PUT, "T1", "x", namespace="OTHER") == []
    nj.model.changes()

    # a conf put before its topic has a route: it comes with the route
    nj.kv(PUT, "T9", "b:2")
    nj.check("T9")
    assert nj.model.changes().routes == {}
    nj.register("b", B0_ADDR, 0, 1, ("T9", "T3"), [])
    nj.check("T1", "T2", "T3", "T9")
    assert orjson.loads(nj.answer("T9"))["orderTopicConf"] == "b:2"


def test_with_order_messages_off_neither_the_node_nor_the_model_shows_order_conf(tmp_path):
    nj = NodeAndJob(tmp_path)  # orderMessageEnable defaults to false, on the node and in the job
    assert not nj.model.order_message_enable
    nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), [])
    nj.model.changes()
    # still published: the job may run with its switch on for nodes that have theirs on
    assert [e.type for e in nj.kv(PUT, "T1", "a:8")] == [EventType.ORDER_TOPIC_CONF]
    nj.check("T1", "T2")
    assert "orderTopicConf" not in orjson.loads(nj.answer("T1"))
    changes = nj.model.changes()
    assert changes.routes == {} and b'"T1":{"conf":"a:8"' in changes.model_brokers  # kept, not shown


def test_when_nodes_disagree_the_newest_report_wins_and_a_deletion_counts():
    model = RouteModel(order_message_enable=True)
    model.apply_event(A0)
    model.changes()

    def report(node: str, t: int, seq: int, conf: str | None = None) -> Event:
        return Event(type=EventType.ORDER_TOPIC_CONF, node=node, event_time=t, seq=seq, topic="T1",
                     order_topic_conf=conf)  # fmt: skip

    model.apply_event(report("n2", T0 + 10, 5, "a:4"))
    model.apply_event(report("n1", T0 + 5, 9, "a:8"))  # older, read later (n1 lagged or missed a change)
    assert model.order_topic_conf("T1") == "a:4"
    model.apply_event(report("n1", T0 + 10, 1, "a:8"))  # same time: the larger (node, seq) wins
    assert model.order_topic_conf("T1") == "a:4"
    assert set(model.changes().routes) == {"T1"}
    model.apply_event(report("n1", T0 + 20, 10))  # a deletion is a report too
    model.apply_event(report("n2", T0 + 15, 6, "a:4"))  # older than the deletion: does not bring it back
    assert model.order_topic_conf("T1") is None
    assert "orderTopicConf" not in orjson.loads(model.changes().routes["T1"])


def test_a_zone_or_acting_master_change_on_an_unchanged_data_version_reaches_the_model(tmp_path):
    nj = NodeAndJob(tmp_path)
    assert nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), [], zone="z1") is EventType.REGISTER
    assert nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), [], zone="z1") is EventType.HEARTBEAT
    nj.model.changes()

    assert nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), [], zone="z2") is EventType.REGISTER
    nj.check("T1", "T2")
    assert orjson.loads(nj.answer("T1"))["brokerDatas"][0]["zoneName"] == "z2"
    changes = nj.model.changes()
    assert set(changes.routes) == {"T1", "T2"} and changes.cluster is not None

    assert nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), [], zone="z2", acting=True) is EventType.REGISTER
    nj.check("T1", "T2")
    assert orjson.loads(nj.answer("T1"))["brokerDatas"][0]["enableActingMaster"] is True
    assert set(nj.model.changes().routes) == {"T1", "T2"}


def test_a_restored_model_keeps_order_conf_and_a_flipped_switch_rewrites_the_routes(tmp_path):
    nj = NodeAndJob(tmp_path, orderMessageEnable="true")
    nj.register("a", A0_ADDR, 0, 1, ("T1", "T2"), [])
    nj.kv(PUT, "T1", "a:8")
    nj.kv(PUT, "T2", "a:2")
    (deleted,) = nj.kv(DELETE, "T2")
    written = nj.model.changes(full=True)
    entries = {t: e for t, e in written.model_topics.items() if e is not None}

    restored = restore(entries, written.model_brokers, order_message_enable=True)
    assert restored.changes().empty  # it knows what is already written
    nj.model = restored
    nj.check("T1", "T2")
    assert orjson.loads(restored.route("T1"))["orderTopicConf"] == "a:8"
    # the deletion survived the restart: a late, older put does not bring T2's conf back
    restored.apply_event(Event(type=EventType.ORDER_TOPIC_CONF, node=deleted.node, event_time=deleted.event_time - 1,
                               seq=1, topic="T2", order_topic_conf="stale"))  # fmt: skip
    nj.check("T1", "T2")
    assert restored.changes().routes == {}
    # and it carries on with the node's next change
    nj.kv(PUT, "T1", "a:4")
    nj.check("T1", "T2")
    changes = restored.changes()
    assert set(changes.routes) == {"T1"} and changes.model_brokers is not None

    # restarted with the switch off: the next batch rewrites T1 without its conf
    off = restore(entries, changes.model_brokers, order_message_enable=False)
    changes = off.changes()
    assert set(changes.routes) == {"T1"} and "orderTopicConf" not in orjson.loads(changes.routes["T1"])
    # and back on: the conf comes back, though no ORDER_TOPIC_CONF event arrived meanwhile
    on = restore(entries, changes.model_brokers, order_message_enable=True)
    assert orjson.loads(on.changes().routes["T1"])["orderTopicConf"] == "a:4"
