"""The field tables: every JSON field of an event and an action, described once, by a :class:`Field` row.

A row names the JSON field and the dataclass attribute and gives its Spark SQL type, its reader
and its :class:`~common.contract.bounds.Bound` (``EVENT_FIELDS``, ``ACTION_FIELDS``); encoding,
strict decoding (:mod:`common.contract.codec`) and the Spark schema (:mod:`common.contract.ddl`) all
derive from these rows, so the node and the job cannot drift apart.  Which fields a record of each
type must carry is here too (``EVENT_REQUIRED``, ``ADMIN_REQUIRED``, ``ACTION_REQUIRED``).  A new
field is appended: old columns keep their place.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from common.contract.bounds import (
    EPOCH_MILLIS,
    HEARTBEAT_TIMEOUT,
    INT,
    INT32_MAX,
    INT64_MAX,
    LONG,
    NAME,
    REASON,
    TEXT,
    Bound,
    EnumReader,
    IntRange,
    IsBool,
    ListOf,
    MapOf,
    Member,
    SchemaError,
    Struct,
    read_bool,
    read_int,
    read_object,
    read_str,
    show,
    show_key,
)
from common.contract.records import (
    VERSION,
    ActionType,
    AdminOp,
    BrokerQueueInfo,
    DataVersionInfo,
    EventType,
    HeartbeatSource,
    QueueInfo,
    UnregisterSource,
)


@dataclass(frozen=True, slots=True)
class Field:
    """One JSON field: its name, the dataclass attribute, its Spark SQL type and its bound."""

    name: str
    attr: str
    ddl: str
    #: JSON value, field path -> Python value of the right type (raises SchemaError)
    read: Callable[[Any, str], Any]
    #: what the Python value may be; decoding and :func:`~common.contract.codec.check_event` both apply it
    bound: Bound
    #: Python value -> JSON value
    write: Callable[[Any], Any] = lambda x: x


# --------------------------------------------------------------------------- readers of composite values


def _read_topics(x: Any, where: str) -> dict[str, QueueInfo]:
    return {str(t): QueueInfo.from_json(q, f"{where}[{show_key(t)}]") for t, q in read_object(x, where).items()}


def _read_str_list(x: Any, where: str) -> list[str]:
    if type(x) is not list:
        raise SchemaError(f"{where}: expected a list, got {show(x)}")
    return [read_str(item, f"{where}[{i}]") for i, item in enumerate(x)]


def _read_str_map(x: Any, where: str) -> dict[str, str]:
    return {str(k): read_str(v, f"{where}[{show_key(k)}]") for k, v in read_object(x, where).items()}


def _read_queue_datas(x: Any, where: str) -> list[BrokerQueueInfo]:
    if type(x) is not list:
        raise SchemaError(f"{where}: expected a list, got {show(x)}")
    return [BrokerQueueInfo.from_json(q, f"{where}[{i}]") for i, q in enumerate(x)]


# --------------------------------------------------------------------------- value objects

_QUEUE_MEMBERS: tuple[tuple[str, str, Bound], ...] = (
    ("readQueueNums", "read_queue_nums", INT),
    ("writeQueueNums", "write_queue_nums", INT),
    ("perm", "perm", INT),
    ("topicSysFlag", "topic_sys_flag", INT),
)
QUEUE = Struct(QueueInfo, _QUEUE_MEMBERS)
BROKER_QUEUE = Struct(
    BrokerQueueInfo,
    (("brokerName", "broker_name", NAME), *((n, f"queues.{a}", b) for n, a, b in _QUEUE_MEMBERS)),
)
DATA_VERSION = Struct(
    DataVersionInfo, (("counter", "counter", LONG), ("stateVersion", "state_version", LONG),
                      ("timestamp", "timestamp", LONG)),
)  # fmt: skip


# --------------------------------------------------------------------------- the tables

_QUEUE_DDL = "readQueueNums: INT, writeQueueNums: INT, perm: INT, topicSysFlag: INT"

EVENT_FIELDS: tuple[Field, ...] = (
    Field("v", "v", "INT", read_int, IntRange(VERSION, VERSION)),
    Field("type", "type", "STRING", EnumReader(EventType), Member(EventType), str),
    Field("node", "node", "STRING", read_str, NAME),
    Field("eventTime", "event_time", "BIGINT", read_int, EPOCH_MILLIS),
    Field("seq", "seq", "BIGINT", read_int, IntRange(0, INT64_MAX)),
    Field("clusterName", "cluster_name", "STRING", read_str, NAME),
    Field("brokerName", "broker_name", "STRING", read_str, NAME),
    Field("brokerId", "broker_id", "BIGINT", read_int, LONG),
    Field("brokerAddr", "broker_addr", "STRING", read_str, NAME),
    Field("source", "source", "STRING", read_str, NAME),
    Field("reason", "reason", "STRING", read_str, REASON),
    Field("haServerAddr", "ha_server_addr", "STRING", read_str, NAME),
    Field("zoneName", "zone_name", "STRING", read_str, NAME),
    Field("enableActingMaster", "enable_acting_master", "BOOLEAN", read_bool, IsBool()),
    Field("heartbeatTimeoutMillis", "heartbeat_timeout_millis", "BIGINT", read_int, HEARTBEAT_TIMEOUT),
    Field(
        "dataVersion", "data_version", "STRUCT<counter: BIGINT, stateVersion: BIGINT, timestamp: BIGINT>",
        DataVersionInfo.from_json, DATA_VERSION, DataVersionInfo.to_json,
    ),
    Field(
        "topics", "topics", f"MAP<STRING, STRUCT<{_QUEUE_DDL}>>",
        _read_topics, MapOf(NAME, QUEUE), lambda t: {name: q.to_json() for name, q in t.items()},
    ),
    Field("filterServerList", "filter_server_list", "ARRAY<STRING>", _read_str_list, ListOf(NAME), list),
    Field("topicQueueMappingInfoMap", "topic_queue_mapping_info_map", "MAP<STRING, STRING>", _read_str_map,
          MapOf(NAME, TEXT), dict),
    Field("op", "op", "STRING", EnumReader(AdminOp), Member(AdminOp), str),
    Field("topic", "topic", "STRING", read_str, NAME),
    Field("topicCount", "topic_count", "INT", read_int, IntRange(0, INT32_MAX)),
    Field(
        "queueDatas", "queue_datas", f"ARRAY<STRUCT<brokerName: STRING, {_QUEUE_DDL}>>",
        _read_queue_datas, ListOf(BROKER_QUEUE), lambda qs: [q.to_json() for q in qs],
    ),
    Field("orderTopicConf", "order_topic_conf", "STRING", read_str, TEXT),
    Field("localScan", "local_scan", "BOOLEAN", read_bool, IsBool()),
)  # fmt: skip

ACTION_FIELDS: tuple[Field, ...] = (
    Field("v", "v", "INT", read_int, IntRange(VERSION, VERSION)),
    Field("type", "type", "STRING", EnumReader(ActionType), Member(ActionType), str),
    Field("monitor", "monitor", "STRING", read_str, NAME),
    Field("decidedAt", "decided_at", "BIGINT", read_int, EPOCH_MILLIS),
    Field("clusterName", "cluster_name", "STRING", read_str, NAME),
    Field("brokerAddr", "broker_addr", "STRING", read_str, NAME),
    Field("brokerName", "broker_name", "STRING", read_str, NAME),
    Field("brokerId", "broker_id", "BIGINT", read_int, LONG),
    Field("lastHeartbeat", "last_heartbeat", "BIGINT", read_int, EPOCH_MILLIS),
    Field("watermark", "watermark", "BIGINT", read_int, EPOCH_MILLIS),
    Field("reason", "reason", "STRING", read_str, REASON),
    Field("decidedThrough", "decided_through", "BIGINT", read_int, EPOCH_MILLIS),
)  # fmt: skip

_BROKER = ("clusterName", "brokerAddr")
#: fields an event must carry, by type (on top of v, type, node, eventTime, seq)
EVENT_REQUIRED: Mapping[EventType, tuple[str, ...]] = {
    EventType.REGISTER: (*_BROKER, "brokerName", "brokerId", "heartbeatTimeoutMillis", "dataVersion", "topics"),
    EventType.HEARTBEAT: (*_BROKER, "source"),
    EventType.UNREGISTER: (*_BROKER, "source"),
    EventType.CHANNEL_CLOSED: _BROKER,
    EventType.ADMIN: ("op",),
    EventType.TICK: (),
    EventType.ORDER_TOPIC_CONF: ("topic",),
    EventType.SILENT: _BROKER,
}
ADMIN_REQUIRED: Mapping[AdminOp, tuple[str, ...]] = {
    AdminOp.WIPE_WRITE_PERM: ("brokerName", "topicCount"),
    AdminOp.ADD_WRITE_PERM: ("brokerName", "topicCount"),
    AdminOp.DELETE_TOPIC: ("topic",),
    AdminOp.REGISTER_TOPIC: ("topic", "queueDatas"),
}
#: the enum of the ``source`` text, by the event types that carry one
SOURCES: Mapping[EventType, type[enum.StrEnum]] = {
    EventType.HEARTBEAT: HeartbeatSource,
    EventType.UNREGISTER: UnregisterSource,
}
ACTION_REQUIRED: Mapping[ActionType, tuple[str, ...]] = {
    ActionType.EXPIRE: (*_BROKER, "lastHeartbeat", "watermark"),
    ActionType.REMOVE: (*_BROKER, "lastHeartbeat", "watermark"),
    ActionType.MONITOR_HEARTBEAT: (),
}
