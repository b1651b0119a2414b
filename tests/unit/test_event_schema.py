"""The version-1 event/action JSON: round trips, the exact bytes, and strict rejection."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common import contract
from common.contract import (
    Action,
    ActionType,
    AdminOp,
    BrokerQueueInfo,
    DataVersionInfo,
    Event,
    EventType,
    QueueInfo,
    SchemaError,
    action_ddl,
    action_key,
    codec,
    decode_action,
    decode_event,
    encode_action,
    encode_event,
    event_ddl,
    event_field_types,
    event_key,
)

REGISTER = Event(
    EventType.REGISTER, "ns-1", 1_700_000_000_123, 7,
    cluster_name="DefaultCluster", broker_name="broker-a", broker_id=0, broker_addr="127.0.0.1:10911",
    ha_server_addr="127.0.0.1:10912", zone_name="zone-1", enable_acting_master=False,
    heartbeat_timeout_millis=120000, data_version=DataVersionInfo(3, 0, 1_700_000_000_000),
    topics={"TopicTest": QueueInfo(4, 4, 6, 0)},
)  # fmt: skip
EXPIRE = Action(
    ActionType.EXPIRE, "monitor-1", 1_700_000_130_000, cluster_name="DefaultCluster",
    broker_addr="127.0.0.1:10911", broker_name="broker-a", broker_id=0, last_heartbeat=1_700_000_000_123,
    watermark=1_700_000_010_000,
)  # fmt: skip


def test_register_event_bytes_are_the_documented_ones():
    assert encode_event(REGISTER) == (
        b'{"v":1,"type":"REGISTER","node":"ns-1","eventTime":1700000000123,"seq":7,'
        b'"clusterName":"DefaultCluster","brokerName":"broker-a","brokerId":0,"brokerAddr":"127.0.0.1:10911",'
        b'"haServerAddr":"127.0.0.1:10912","zoneName":"zone-1","enableActingMaster":false,'
        b'"heartbeatTimeoutMillis":120000,"dataVersion":{"counter":3,"stateVersion":0,"timestamp":1700000000000},'
        b'"topics":{"TopicTest":{"readQueueNums":4,"writeQueueNums":4,"perm":6,"topicSysFlag":0}}}'
    )
    assert event_key(REGISTER) == b"127.0.0.1:10911"


#: a registration with filter servers and one static-topic mapping (as fastjson text, integer keys bare)
REGISTER_STATIC = Event(
    EventType.REGISTER, "ns-1", 1_700_000_000_124, 8,
    cluster_name="DefaultCluster", broker_name="broker-a", broker_id=0, broker_addr="127.0.0.1:10911",
    heartbeat_timeout_millis=120000, data_version=DataVersionInfo(4, 0, 1_700_000_000_001),
    topics={"TopicTest": QueueInfo(4, 4, 6, 0)}, filter_server_list=["127.0.0.1:20001"],
    topic_queue_mapping_info_map={"TopicTest": '{"bname":"broker-a","currIdMap":{0:0},"epoch":1}'},
)  # fmt: skip

EVENTS = [
    REGISTER,
    REGISTER_STATIC,
    replace(REGISTER_STATIC, seq=9, filter_server_list=[], topic_queue_mapping_info_map=None),
    Event(EventType.HEARTBEAT, "ns-1", 5, 8, cluster_name="c", broker_addr="a:1", source="QUERY_DATA_VERSION"),
    Event(EventType.HEARTBEAT, "ns-1", 5, 9, cluster_name="c", broker_name="b", broker_id=1, broker_addr="a:1",
          source="REGISTER_BROKER", heartbeat_timeout_millis=30000, data_version=DataVersionInfo(1, 2, 3)),
    Event(EventType.UNREGISTER, "ns-1", 5, 10, cluster_name="c", broker_name="b", broker_id=0, broker_addr="a:1",
          source="EXPIRE"),
    Event(EventType.CHANNEL_CLOSED, "ns-1", 5, 11, cluster_name="c", broker_addr="a:1", reason="connection closed"),
    Event(EventType.ADMIN, "ns-1", 5, 12, op=AdminOp.WIPE_WRITE_PERM, broker_name="b", topic_count=3),
    Event(EventType.ADMIN, "ns-1", 5, 13, op=AdminOp.DELETE_TOPIC, topic="T", cluster_name="c"),
    Event(EventType.ADMIN, "ns-1", 5, 14, op=AdminOp.REGISTER_TOPIC, topic="T",
          queue_datas=[BrokerQueueInfo("b", QueueInfo(8, 8, 6, 0))]),
    Event(EventType.TICK, "ns-1", 5, 15),
    Event(EventType.ORDER_TOPIC_CONF, "ns-1", 5, 16, topic="TopicOrder", order_topic_conf="broker-a:4;broker-b:4"),
    Event(EventType.ORDER_TOPIC_CONF, "ns-1", 5, 17, topic="TopicOrder"),  # deleted
]  # fmt: skip


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: f"{e.type.value}-{e.seq}")
def test_every_event_kind_round_trips(event):
    assert decode_event(encode_event(event)) == event


def test_absent_fields_are_not_written_and_ticks_are_keyed_by_node():
    tick = Event(EventType.TICK, "ns-1", 5, 15)
    assert json.loads(encode_event(tick)) == {"v": 1, "type": "TICK", "node": "ns-1", "eventTime": 5, "seq": 15}
    scanning = Event(EventType.TICK, "ns-1", 5, 16, local_scan=True)
    assert json.loads(encode_event(scanning))["localScan"] is True
    assert decode_event(encode_event(scanning)).local_scan is True
    with pytest.raises(SchemaError, match="event.localScan: expected true or false"):
        decode_event({"v": 1, "type": "TICK", "node": "n", "eventTime": 1, "seq": 1, "localScan": 1})
    assert event_key(tick) == b"ns-1"


def test_an_order_topic_conf_event_is_keyed_by_topic_and_a_deletion_carries_no_value():
    put, delete = EVENTS[-2:]
    assert encode_event(put) == (
        b'{"v":1,"type":"ORDER_TOPIC_CONF","node":"ns-1","eventTime":5,"seq":16,"topic":"TopicOrder",'
        b'"orderTopicConf":"broker-a:4;broker-b:4"}'
    )
    assert (
        encode_event(delete)
        == b'{"v":1,"type":"ORDER_TOPIC_CONF","node":"ns-1","eventTime":5,"seq":17,"topic":"TopicOrder"}'
    )
    assert event_key(put) == event_key(delete) == b"TopicOrder"
    # an empty value is a value, not a deletion
    empty = replace(put, order_topic_conf="")
    assert decode_event(encode_event(empty)).order_topic_conf == ""


def test_actions_round_trip_and_key_by_broker():
    beat = Action(ActionType.MONITOR_HEARTBEAT, "monitor-1", 42, watermark=7)
    for action in (EXPIRE, beat):
        assert decode_action(encode_action(action)) == action
    assert action_key(EXPIRE) == b"127.0.0.1:10911"
    assert action_key(beat) == b"monitor-1"
    assert (
        encode_action(beat) == b'{"v":1,"type":"MONITOR_HEARTBEAT","monitor":"monitor-1","decidedAt":42,"watermark":7}'
    )


def test_unknown_fields_are_ignored_and_parsed_objects_accepted():
    d = json.loads(encode_event(REGISTER))
    d["addedLater"] = {"x": 1}
    assert decode_event(d) == REGISTER
    assert decode_event(json.dumps(d)) == REGISTER


def test_filter_servers_and_mappings_are_written_after_the_topics_and_an_empty_list_is_kept():
    assert encode_event(REGISTER_STATIC).endswith(
        b'"topics":{"TopicTest":{"readQueueNums":4,"writeQueueNums":4,"perm":6,"topicSysFlag":0}},'
        b'"filterServerList":["127.0.0.1:20001"],'
        b'"topicQueueMappingInfoMap":{"TopicTest":"{\\"bname\\":\\"broker-a\\",\\"currIdMap\\":{0:0},\\"epoch\\":1}"}}'
    )
    cleared = replace(REGISTER_STATIC, filter_server_list=[], topic_queue_mapping_info_map=None)
    wire = json.loads(encode_event(cleared))
    assert wire["filterServerList"] == [] and "topicQueueMappingInfoMap" not in wire


def test_a_registration_written_before_filter_servers_and_mappings_existed_still_decodes():
    old = encode_event(REGISTER)
    assert b"filterServerList" not in old and b"topicQueueMappingInfoMap" not in old
    event = decode_event(old)
    assert event == REGISTER
    assert event.filter_server_list is None and event.topic_queue_mapping_info_map is None


def _register(**changes):
    d = json.loads(encode_event(REGISTER))
    for k, v in changes.items():
        if v is ...:
            del d[k]
        else:
            d[k] = v
    return json.dumps(d).encode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[1,2]", "expected a JSON object"),
        (_register(v=2), "unsupported schema version 2"),
        (_register(v=True), "unsupported schema version True"),
        (_register(v=...), "unsupported schema version None"),
        (_register(type="REBOOT"), "event.type: unknown value 'REBOOT'"),
        (_register(eventTime="1"), "event.eventTime: expected an integer, got str"),
        (_register(eventTime=1.5), "event.eventTime: expected an integer, got float"),
        (_register(brokerId=True), "event.brokerId: expected an integer, got bool"),
        (_register(enableActingMaster="false"), "event.enableActingMaster: expected true or false"),
        (_register(node=...), "missing required field(s) node"),
        (_register(topics=...), "REGISTER event: missing required field(s) topics"),
        (_register(dataVersion={"counter": 1}), "event.dataVersion.stateVersion: missing"),
        (_register(topics={"T": {"readQueueNums": 1, "writeQueueNums": "1", "perm": 6}}),
         "event.topics['T'].writeQueueNums: expected an integer"),
        (_register(seq=-1), "event.seq: -1 is out of range [0, 9223372036854775807]"),
        (_register(filterServerList="a:1"), "event.filterServerList: expected a list, got str"),
        (_register(filterServerList=["a:1", 2]), "event.filterServerList[1]: expected a string, got int"),
        (_register(topicQueueMappingInfoMap=["x"]), "event.topicQueueMappingInfoMap: expected a JSON object"),
        (_register(topicQueueMappingInfoMap={"T": {"bname": "b"}}),
         "event.topicQueueMappingInfoMap['T']: expected a string, got dict"),
        (b'{"v":1,"type":"HEARTBEAT","node":"n","eventTime":1,"seq":1,"clusterName":"c","brokerAddr":"a",'
         b'"source":"PING"}', "HEARTBEAT event.source: unknown value 'PING'"),
        (b'{"v":1,"type":"HEARTBEAT","node":"n","eventTime":1,"seq":1,"clusterName":"c","brokerAddr":"a"}',
         "HEARTBEAT event: missing required field(s) source"),
        (b'{"v":1,"type":"ADMIN","node":"n","eventTime":1,"seq":1,"op":"REGISTER_TOPIC","topic":"T"}',
         "ADMIN REGISTER_TOPIC event: missing required field(s) queueDatas"),
        (b'{"v":1,"type":"ADMIN","node":"n","eventTime":1,"seq":1,"op":"REGISTER_TOPIC","topic":"T",'
         b'"queueDatas":[{"readQueueNums":1,"writeQueueNums":1,"perm":6}]}',
         "event.queueDatas[0].brokerName: expected a non-empty string"),
        (b'{"v":1,"type":"ORDER_TOPIC_CONF","node":"n","eventTime":1,"seq":1,"orderTopicConf":"a:4"}',
         "ORDER_TOPIC_CONF event: missing required field(s) topic"),
        (b'{"v":1,"type":"ORDER_TOPIC_CONF","node":"n","eventTime":1,"seq":1,"topic":"T","orderTopicConf":4}',
         "event.orderTopicConf: expected a string, got int"),
        (b'{"v":1,"type":"ORDER_TOPIC_CONF","node":"n","eventTime":1,"seq":1,"topic":["T"]}',
         "event.topic: expected a string, got list"),
        (b'{"v":1,"type":"ORDER_TOPIC_CONF","node":"n","eventTime":-1,"seq":1,"topic":"T"}',
         "event.eventTime: -1 is out of range [0, 253402300799999]"),
    ],
)  # fmt: skip
def test_bad_events_raise_one_schema_error_naming_the_field(data, message):
    with pytest.raises(SchemaError) as caught:
        decode_event(data)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"v":1,"type":"EXPIRE","monitor":"m","decidedAt":1,"clusterName":"c","brokerAddr":"a","watermark":0}',
         "EXPIRE action: missing required field(s) lastHeartbeat"),
        (b'{"v":1,"type":"SHUTDOWN","monitor":"m","decidedAt":1}', "action.type: unknown value 'SHUTDOWN'"),
        (b'{"v":1,"type":"MONITOR_HEARTBEAT","decidedAt":1}', "missing required field(s) monitor"),
        (b'{"v":1,"type":"REMOVE","monitor":"m","decidedAt":1,"clusterName":"c","brokerAddr":"a",'
         b'"lastHeartbeat":"5","watermark":0}', "action.lastHeartbeat: expected an integer, got str '5'"),
        (b"", "not JSON"),
        (b"null", "expected a JSON object, got NoneType"),
    ],
)  # fmt: skip
def test_bad_actions_raise_schema_error(data, message):
    with pytest.raises(SchemaError) as caught:
        decode_action(data)
    assert message in str(caught.value)


def test_schema_error_is_a_value_error_for_callers_that_catch_broadly():
    assert issubclass(SchemaError, ValueError)


def test_spark_ddl_names_every_field_once_in_schema_order():
    types = event_field_types()
    assert list(types) == [f.name for f in contract.EVENT_FIELDS]
    assert types["eventTime"] == "BIGINT" and types["enableActingMaster"] == "BOOLEAN"
    assert types["topics"].startswith("MAP<STRING, STRUCT<readQueueNums: INT")
    assert types["filterServerList"] == "ARRAY<STRING>"
    assert types["topicQueueMappingInfoMap"] == "MAP<STRING, STRING>"
    assert types["orderTopicConf"] == "STRING" and types["localScan"] == "BOOLEAN"
    assert list(types)[-2:] == ["orderTopicConf", "localScan"]  # appended: old columns keep their place
    ddl = event_ddl()
    assert ddl.startswith("`v` INT, `type` STRING, `node` STRING, `eventTime` BIGINT, `seq` BIGINT")
    assert ddl.count("`") == 2 * len(types)
    assert "`lastHeartbeat` BIGINT" in action_ddl()


def test_every_written_field_is_in_the_ddl():
    written = set(json.loads(encode_event(REGISTER))) | set(json.loads(encode_action(EXPIRE)))
    for event in EVENTS:
        written |= set(json.loads(encode_event(event)))
    assert written <= set(event_field_types()) | set(contract.action_field_types())


#: all the contract's modules import besides each other: Spark's Python workers import it
_CONTRACT_MAY_IMPORT = {"__future__", "enum", "collections", "dataclasses", "typing", "time", "orjson"}


def test_the_contract_imports_neither_kafka_nor_spark_nor_the_rest_of_the_project():
    for path in Path(contract.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        others = {m.split(".")[0] for m in imported if not m.startswith("common.contract.")}
        assert others <= _CONTRACT_MAY_IMPORT, (path.name, others - _CONTRACT_MAY_IMPORT)


# --- bounds: every value at its edge passes both ways, one past it fails both ways ---------------

_N = contract.MAX_NAME_CHARS
_I32, _I64 = 2**31 - 1, 2**63 - 1
HEARTBEAT = Event(EventType.HEARTBEAT, "ns-1", 5, 8, cluster_name="c", broker_name="b", broker_id=0,
                  broker_addr="a:1", source="REGISTER_BROKER", heartbeat_timeout_millis=30000,
                  data_version=DataVersionInfo(1, 2, 3))  # fmt: skip
ADMIN_TOPIC = Event(EventType.ADMIN, "ns-1", 5, 14, op=AdminOp.REGISTER_TOPIC, topic="T",
                    queue_datas=[BrokerQueueInfo("b", QueueInfo(8, 8, 6, 0))])  # fmt: skip
WIPE = Event(EventType.ADMIN, "ns-1", 5, 12, op=AdminOp.WIPE_WRITE_PERM, broker_name="b", topic_count=3)
ORDER = Event(EventType.ORDER_TOPIC_CONF, "ns-1", 5, 16, topic="T", order_topic_conf="a:4")
CLOSED = Event(EventType.CHANNEL_CLOSED, "ns-1", 5, 11, cluster_name="c", broker_addr="a:1", reason="closed")


def _wire(record, fields) -> bytes:
    """What a writer other than ours could send: stdlib JSON, which writes integers of any size."""
    values = {f.name: f.write(getattr(record, f.attr)) for f in fields if getattr(record, f.attr) is not None}
    return json.dumps(values).encode()


def _q(**kw) -> QueueInfo:
    return replace(QueueInfo(4, 4, 6, 0), **kw)


#: (id, base event, attribute, value at the edge, value just past it, what the error names)
EVENT_EDGES = [
    ("eventTime-max", HEARTBEAT, "event_time", contract.MAX_EPOCH_MILLIS, contract.MAX_EPOCH_MILLIS + 1,
     "event.eventTime: 253402300800000 is out of range [0, 253402300799999]"),
    ("eventTime-min", HEARTBEAT, "event_time", 0, -1, "event.eventTime: -1 is out of range"),
    ("seq-max", HEARTBEAT, "seq", _I64, _I64 + 1, "event.seq: 9223372036854775808 is out of range"),
    ("brokerId-max", HEARTBEAT, "broker_id", _I64, _I64 + 1, "event.brokerId: 9223372036854775808 is out of range"),
    ("brokerId-min", HEARTBEAT, "broker_id", -_I64 - 1, -_I64 - 2, "event.brokerId:"),
    ("heartbeatTimeout-min", HEARTBEAT, "heartbeat_timeout_millis", 1, 0,
     "event.heartbeatTimeoutMillis: 0 is out of range [1, 864000000]"),
    ("heartbeatTimeout-max", HEARTBEAT, "heartbeat_timeout_millis", 864_000_000, 864_000_001,
     "event.heartbeatTimeoutMillis: 864000001 is out of range [1, 864000000]"),
    ("dataVersion.counter", HEARTBEAT, "data_version", DataVersionInfo(_I64, 0, 0), DataVersionInfo(_I64 + 1, 0, 0),
     "event.dataVersion.counter: 9223372036854775808 is out of range"),
    ("dataVersion.timestamp", HEARTBEAT, "data_version", DataVersionInfo(0, 0, -_I64 - 1),
     DataVersionInfo(0, 0, -_I64 - 2), "event.dataVersion.timestamp:"),
    ("node", HEARTBEAT, "node", "n" * _N, "n" * (_N + 1), "event.node: 1025 characters, more than the 1024 allowed"),
    ("clusterName", HEARTBEAT, "cluster_name", "c" * _N, "c" * (_N + 1), "event.clusterName: 1025 characters"),
    ("brokerName", HEARTBEAT, "broker_name", "b" * _N, "b" * (_N + 1), "event.brokerName: 1025 characters"),
    ("brokerAddr", HEARTBEAT, "broker_addr", "a" * _N, "a" * (_N + 1), "event.brokerAddr: 1025 characters"),
    ("haServerAddr", REGISTER, "ha_server_addr", "h" * _N, "h" * (_N + 1), "event.haServerAddr: 1025 characters"),
    ("zoneName", REGISTER, "zone_name", "z" * _N, "z" * (_N + 1), "event.zoneName: 1025 characters"),
    ("reason", CLOSED, "reason", "r" * 4096, "r" * 4097, "event.reason: 4097 characters, more than the 4096 allowed"),
    ("topics-key", REGISTER, "topics", {"t" * _N: _q()}, {"t" * (_N + 1): _q()},
     "event.topics key 'tttt"),
    ("topics-queues", REGISTER, "topics", {"T": _q(read_queue_nums=_I32)}, {"T": _q(read_queue_nums=_I32 + 1)},
     "event.topics['T'].readQueueNums: 2147483648 is out of range [-2147483648, 2147483647]"),
    ("topics-perm", REGISTER, "topics", {"T": _q(perm=-(2**31))}, {"T": _q(perm=-(2**31) - 1)},
     "event.topics['T'].perm: -2147483649 is out of range"),
    ("filterServerList", REGISTER, "filter_server_list", ["f" * _N], ["ok", "f" * (_N + 1)],
     "event.filterServerList[1]: 1025 characters"),
    ("mapping-key", REGISTER, "topic_queue_mapping_info_map", {"t" * _N: "{}"}, {"t" * (_N + 1): "{}"},
     "event.topicQueueMappingInfoMap key"),
    ("mapping-value", REGISTER, "topic_queue_mapping_info_map", {"T": "x" * 65536}, {"T": "x" * 65537},
     "event.topicQueueMappingInfoMap['T']: 65537 characters, more than the 65536 allowed"),
    ("topic", ADMIN_TOPIC, "topic", "t" * _N, "t" * (_N + 1), "event.topic: 1025 characters"),
    ("queueDatas-brokerName", ADMIN_TOPIC, "queue_datas", [BrokerQueueInfo("b" * _N, _q())],
     [BrokerQueueInfo("b" * (_N + 1), _q())], "event.queueDatas[0].brokerName: 1025 characters"),
    ("queueDatas-queues", ADMIN_TOPIC, "queue_datas", [BrokerQueueInfo("b", _q(write_queue_nums=_I32))],
     [BrokerQueueInfo("b", _q(write_queue_nums=_I32 + 1))], "event.queueDatas[0].writeQueueNums: 2147483648"),
    ("topicCount-max", WIPE, "topic_count", _I32, _I32 + 1,
     "event.topicCount: 2147483648 is out of range [0, 2147483647]"),
    ("topicCount-min", WIPE, "topic_count", 0, -1, "event.topicCount: -1 is out of range"),
    ("orderTopicConf", ORDER, "order_topic_conf", "o" * 65536, "o" * 65537, "event.orderTopicConf: 65537 characters"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("base", "attr", "edge", "past", "message"), [e[1:] for e in EVENT_EDGES], ids=[e[0] for e in EVENT_EDGES]
)
def test_an_event_value_at_its_bound_passes_and_one_past_it_is_refused_both_ways(base, attr, edge, past, message):
    ok = replace(base, **{attr: edge})
    contract.check_event(ok)
    assert decode_event(encode_event(ok)) == ok
    bad = replace(base, **{attr: past})
    with pytest.raises(SchemaError) as by_check:
        contract.check_event(bad)
    with pytest.raises(SchemaError) as by_decode:
        decode_event(_wire(bad, contract.EVENT_FIELDS))
    assert message in str(by_check.value)
    assert message in str(by_decode.value)


#: (id, attribute, value at the edge, value just past it, what the error names)
ACTION_EDGES = [
    ("decidedAt", "decided_at", contract.MAX_EPOCH_MILLIS, contract.MAX_EPOCH_MILLIS + 1,
     "action.decidedAt: 253402300800000 is out of range [0, 253402300799999]"),
    ("lastHeartbeat-max", "last_heartbeat", contract.MAX_EPOCH_MILLIS, 2**64 - 1,
     "action.lastHeartbeat: 18446744073709551615 is out of range [0, 253402300799999]"),
    ("lastHeartbeat-min", "last_heartbeat", 0, -1, "action.lastHeartbeat: -1 is out of range"),
    ("watermark", "watermark", contract.MAX_EPOCH_MILLIS, contract.MAX_EPOCH_MILLIS + 1, "action.watermark:"),
    ("monitor", "monitor", "m" * _N, "m" * (_N + 1), "action.monitor: 1025 characters, more than the 1024 allowed"),
    ("brokerAddr", "broker_addr", "a" * _N, "a" * (_N + 1), "action.brokerAddr: 1025 characters"),
    ("clusterName", "cluster_name", "c" * _N, "c" * (_N + 1), "action.clusterName: 1025 characters"),
    ("brokerName", "broker_name", "b" * _N, "b" * (_N + 1), "action.brokerName: 1025 characters"),
    ("brokerId", "broker_id", _I64, _I64 + 1, "action.brokerId: 9223372036854775808 is out of range"),
    ("reason", "reason", "r" * 4096, "r" * 4097, "action.reason: 4097 characters, more than the 4096 allowed"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("attr", "edge", "past", "message"), [e[1:] for e in ACTION_EDGES], ids=[e[0] for e in ACTION_EDGES]
)
def test_an_action_value_at_its_bound_passes_and_one_past_it_is_refused_both_ways(attr, edge, past, message):
    ok = replace(EXPIRE, **{attr: edge})
    contract.check_action(ok)
    assert decode_action(encode_action(ok)) == ok
    bad = replace(EXPIRE, **{attr: past})
    with pytest.raises(SchemaError) as by_check:
        contract.check_action(bad)
    with pytest.raises(SchemaError) as by_decode:
        decode_action(_wire(bad, contract.ACTION_FIELDS))
    assert message in str(by_check.value)
    assert message in str(by_decode.value)


def test_poison_records_are_refused_with_a_short_message():
    long_max = b'{"v":1,"type":"TICK","node":"n","eventTime":9223372036854775807,"seq":1}'
    with pytest.raises(SchemaError, match=r"event.eventTime: 9223372036854775807 is out of range"):
        decode_event(long_max)
    huge_name = b'{"v":1,"type":"TICK","node":"' + b"x" * 900_000 + b'","eventTime":1,"seq":1}'
    with pytest.raises(SchemaError) as caught:
        decode_event(huge_name)
    assert str(caught.value) == "event.node: 900000 characters, more than the 1024 allowed"
    all_ones = (
        b'{"v":1,"type":"EXPIRE","monitor":"m","decidedAt":1,"clusterName":"c","brokerAddr":"a",'
        b'"lastHeartbeat":18446744073709551615,"watermark":0}'
    )
    with pytest.raises(SchemaError, match="action.lastHeartbeat: 18446744073709551615 is out of range"):
        decode_action(all_ones)
    # an already parsed record may hold any Python int: the message stays short
    with pytest.raises(SchemaError) as caught:
        decode_event({"v": 1, "type": "TICK", "node": "n", "eventTime": 10**5000, "seq": 1})
    assert len(str(caught.value)) < 200


def test_check_event_applies_the_decoders_rules_too():
    with pytest.raises(SchemaError, match="HEARTBEAT event.source: unknown value 'PING'"):
        contract.check_event(replace(HEARTBEAT, source="PING"))
    with pytest.raises(SchemaError, match="REGISTER event: missing required field"):
        contract.check_event(replace(REGISTER, topics=None))
    with pytest.raises(SchemaError, match="event.brokerId: expected an integer, got bool"):
        contract.check_event(replace(HEARTBEAT, broker_id=True))
    with pytest.raises(SchemaError, match="EXPIRE action: missing required field.s. lastHeartbeat"):
        contract.check_action(replace(EXPIRE, last_heartbeat=None))
    for event in EVENTS:
        contract.check_event(event)


def test_the_spark_schema_keeps_its_shape():
    # the bounds live in the Field rows; the columns, their order and types are what they were
    assert event_ddl() == (
        "`v` INT, `type` STRING, `node` STRING, `eventTime` BIGINT, `seq` BIGINT, `clusterName` STRING, "
        "`brokerName` STRING, `brokerId` BIGINT, `brokerAddr` STRING, `source` STRING, `reason` STRING, "
        "`haServerAddr` STRING, `zoneName` STRING, `enableActingMaster` BOOLEAN, `heartbeatTimeoutMillis` BIGINT, "
        "`dataVersion` STRUCT<counter: BIGINT, stateVersion: BIGINT, timestamp: BIGINT>, "
        "`topics` MAP<STRING, STRUCT<readQueueNums: INT, writeQueueNums: INT, perm: INT, topicSysFlag: INT>>, "
        "`filterServerList` ARRAY<STRING>, `topicQueueMappingInfoMap` MAP<STRING, STRING>, `op` STRING, "
        "`topic` STRING, `topicCount` INT, "
        "`queueDatas` ARRAY<STRUCT<brokerName: STRING, readQueueNums: INT, writeQueueNums: INT, perm: INT, "
        "topicSysFlag: INT>>, `orderTopicConf` STRING, `localScan` BOOLEAN"
    )
    assert action_ddl() == (
        "`v` INT, `type` STRING, `monitor` STRING, `decidedAt` BIGINT, `clusterName` STRING, `brokerAddr` STRING, "
        "`brokerName` STRING, `brokerId` BIGINT, `lastHeartbeat` BIGINT, `watermark` BIGINT, `reason` STRING, "
        "`decidedThrough` BIGINT"
    )


@pytest.mark.parametrize("field", [*contract.EVENT_FIELDS, *contract.ACTION_FIELDS], ids=lambda f: f.name)
def test_every_scalar_bound_fits_its_spark_column(field):
    sql_range = {"INT": (-(2**31), 2**31 - 1), "BIGINT": (-(2**63), 2**63 - 1)}
    if field.ddl in sql_range:
        lo, hi = sql_range[field.ddl]
        assert isinstance(field.bound, contract.IntRange) and lo <= field.bound.lo <= field.bound.hi <= hi
    elif field.ddl == "STRING":
        assert isinstance(field.bound, contract.MaxChars | contract.Member)
    if field.name in ("eventTime", "decidedAt", "lastHeartbeat", "watermark"):
        assert field.bound == contract.IntRange(0, contract.MAX_EPOCH_MILLIS)


# --- the decoder walks the fields a record carries; the table walk stays the reference ----------


_ENUM_TEXTS = [m.value for e in (EventType, ActionType, AdminOp, contract.HeartbeatSource, contract.UnregisterSource)
               for m in e]  # fmt: skip
_EDGE_INTS = [0, 1, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, -(2**63) - 1, contract.MAX_EPOCH_MILLIS,
              contract.MAX_EPOCH_MILLIS + 1, 864_000_000, 864_000_001, 10**40]  # fmt: skip
_EDGE_LENGTHS = [0, 1024, 1025, 4096, 4097, 65536, 65537]
#: what a hostile writer could put in a field: every JSON type, each bound's edges, enum texts
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(_EDGE_INTS) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.sampled_from(_ENUM_TEXTS) | st.sampled_from(_EDGE_LENGTHS).map(lambda n: "x" * n),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
_NAMES = sorted({f.name for f in (*contract.EVENT_FIELDS, *contract.ACTION_FIELDS)} | {"addedLater", ""})
_VALID_EVENTS = [json.loads(encode_event(e)) for e in EVENTS]
_VALID_ACTIONS = [json.loads(encode_action(a)) for a in (EXPIRE, Action(ActionType.MONITOR_HEARTBEAT, "m", 1))]


@st.composite
def _records(draw, valid):
    """A valid record, some of its fields dropped or replaced by hostile values, unknown ones added, keys shuffled."""
    d = dict(draw(st.sampled_from(valid)))
    for name in draw(st.lists(st.sampled_from(_NAMES), max_size=4)):
        if draw(st.booleans()):
            d[name] = draw(_VALUES)
        else:
            d.pop(name, None)
    keys = draw(st.permutations(list(d)))
    return {k: d[k] for k in keys}


def _outcome(decode, record):
    try:
        return "ok", repr(decode(record))
    except SchemaError as exc:
        return "refused", str(exc)


def _by_table_walk(fields, rules, make, what):
    """The decoder as it was: every field of the table, in table order, each row's read then bound."""

    def decode(record):
        values = codec._walk_fields(record, fields, what)
        rules(values)
        return make(**values)

    return decode


_EVENT_BY_TABLE = _by_table_walk(contract.EVENT_FIELDS, codec._event_rules, Event, "event")
_ACTION_BY_TABLE = _by_table_walk(contract.ACTION_FIELDS, codec._action_rules, Action, "action")


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(_records(_VALID_EVENTS))
def test_walking_the_present_fields_decides_every_event_as_the_table_walk_does(record):
    if record.get("v") != 1 or type(record.get("v")) is not int:
        record = {**record, "v": 1}  # (a wrong version is refused before either walk)
    assert _outcome(decode_event, record) == _outcome(_EVENT_BY_TABLE, record)
    # the same as bytes, as the source hands it over (orjson reads an integer past 64 bits as a float)
    wire = json.dumps(record).encode()
    try:
        parsed = orjson.loads(wire)
    except orjson.JSONDecodeError:
        assert "not JSON" in _outcome(decode_event, wire)[1]
    else:
        assert _outcome(decode_event, wire) == _outcome(_EVENT_BY_TABLE, parsed)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_records(_VALID_ACTIONS))
def test_walking_the_present_fields_decides_every_action_as_the_table_walk_does(record):
    record = {**record, "v": 1}
    assert _outcome(decode_action, record) == _outcome(_ACTION_BY_TABLE, record)


def test_of_several_refused_fields_the_first_in_table_order_is_named_whatever_the_key_order():
    good = json.loads(encode_event(HEARTBEAT))
    bad = {"brokerAddr": 7, "node": 7}  # node comes first in the table, last here
    for record in ({**good, **bad}, {**bad, **good, **bad}):
        with pytest.raises(SchemaError, match=r"^event\.node: expected a string, got int 7$"):
            decode_event(record)


def test_a_record_with_more_keys_than_the_table_has_fields_walks_the_table():
    good = json.loads(encode_event(HEARTBEAT))
    unknown = {f"x{i}": i for i in range(100)}
    assert decode_event({**unknown, **good}) == HEARTBEAT
    with pytest.raises(SchemaError, match=r"^event\.seq: expected an integer, got str '8'$"):
        decode_event({**unknown, **good, "seq": "8"})


def test_every_required_field_missing_is_named_in_table_order():
    with pytest.raises(SchemaError, match=r"^event: missing required field\(s\) node, seq$"):
        decode_event({"seq": None, "type": "TICK", "v": 1, "eventTime": 1})
    with pytest.raises(SchemaError, match=r"^REGISTER event: missing required field\(s\) brokerId, topics$"):
        decode_event(_register(brokerId=..., topics=None))
    with pytest.raises(SchemaError, match=r"^ADMIN WIPE_WRITE_PERM event: missing required field\(s\) brokerName"):
        decode_event({"v": 1, "type": "ADMIN", "node": "n", "eventTime": 1, "seq": 1, "op": "WIPE_WRITE_PERM"})
    with pytest.raises(SchemaError, match=r"^REMOVE action: missing required field\(s\) lastHeartbeat, watermark$"):
        decode_action({"v": 1, "type": "REMOVE", "monitor": "m", "decidedAt": 1, "clusterName": "c",
                       "brokerAddr": "a"})  # fmt: skip


def test_a_source_stays_text_and_an_unknown_one_is_named_with_the_known_ones():
    event = decode_event(encode_event(HEARTBEAT))
    assert event.source == "REGISTER_BROKER" and type(event.source) is str
    with pytest.raises(SchemaError) as caught:
        decode_event({**json.loads(encode_event(HEARTBEAT)), "source": "EXPIRE"})  # an UNREGISTER's source
    assert str(caught.value) == (
        "HEARTBEAT event.source: unknown value 'EXPIRE' (known: REGISTER_BROKER, QUERY_DATA_VERSION, BROKER_HEARTBEAT)"
    )


def test_an_enum_text_that_is_not_a_member_is_refused_and_shown_short():
    with pytest.raises(SchemaError) as caught:
        decode_event(_register(type="R" * 100_000))
    assert str(caught.value).startswith("event.type: unknown value 'RRRR") and len(str(caught.value)) < 200
    with pytest.raises(SchemaError, match=r"^event.type: unknown value \[\] \(known: REGISTER, HEARTBEAT, "):
        decode_event(_register(type=[]))
    with pytest.raises(SchemaError, match="event.type: unknown value <EventType.TICK: 'TICK'>"):
        decode_event({"v": 1, "type": EventType.TICK, "node": "n", "eventTime": 1, "seq": 1})


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ('"v":{nested}', "event.v: unsupported schema version <nested too deeply to show>"),
        ('"v":1,"type":"TICK","node":{nested},"eventTime":1,"seq":1', "event.node: expected a string, got list"),
        ('"v":1,"type":"TICK","node":"n","eventTime":1,"seq":1,"localScan":{nested}', "event.localScan: expected"),
        ('"v":1,"type":"ADMIN","node":"n","eventTime":1,"seq":1,"op":"REGISTER_TOPIC","topic":"T",'
         '"queueDatas":[{"brokerName":{nested}}]', "event.queueDatas[0].brokerName: expected a non-empty string"),
    ],
)  # fmt: skip
def test_a_value_nested_as_deep_as_json_allows_is_refused_not_a_recursion_error(where, message):
    # orjson parses 1,023 levels; repr of a value that deep once raised RecursionError out of the
    # decoder, which the job's source does not catch: one such record stopped the query
    record = ("{" + where.replace("{nested}", "[" * 1000 + "]" * 1000) + "}").encode()
    with pytest.raises(SchemaError) as caught:
        decode_event(record)
    assert message in str(caught.value)
