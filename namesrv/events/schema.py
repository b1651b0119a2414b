"""The JSON that name-server nodes and the streaming monitor exchange through Kafka, version 1.

An :class:`Event` (topic ``eventsTopic``) is what one node saw a broker do, or a TICK carrying its
clock; an :class:`Action` (topic ``actionsTopic``) is what the monitor decided (EXPIRE, REMOVE) or
its MONITOR_HEARTBEAT.  Each kind is described once, by a table of :class:`Field` rows
(``EVENT_FIELDS``, ``ACTION_FIELDS``), and encoding, strict decoding and the Spark schema
(:func:`event_ddl`, :func:`action_ddl`) all derive from those rows, so the node and the job cannot
drift apart.  Every value is bounded by its row, and the node (:func:`check_event`) and every
reader (:func:`decode_event`) apply the same bounds; a record that fails is one :class:`SchemaError`
naming the field.  Only the standard library and ``orjson`` are imported: Spark's Python workers
import this module.  ``docs/events.md`` is the reader's guide to the rules of version 1, and
``docs/internals/event-pipeline.md`` says why the schema is built this way.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

__all__ = [
    "VERSION",
    "SchemaError",
    "EventType",
    "HeartbeatSource",
    "UnregisterSource",
    "AdminOp",
    "ActionType",
    "DataVersionInfo",
    "QueueInfo",
    "BrokerQueueInfo",
    "Event",
    "Action",
    "Field",
    "IntRange",
    "MaxChars",
    "MAX_EPOCH_MILLIS",
    "MAX_NAME_CHARS",
    "MAX_REASON_CHARS",
    "MAX_TEXT_CHARS",
    "MIN_HEARTBEAT_TIMEOUT_MILLIS",
    "MAX_HEARTBEAT_TIMEOUT_MILLIS",
    "EVENT_FIELDS",
    "ACTION_FIELDS",
    "encode_event",
    "decode_event",
    "decode_event_values",
    "check_event",
    "check_action",
    "event_key",
    "encode_action",
    "decode_action",
    "action_key",
    "event_ddl",
    "action_ddl",
    "event_field_types",
    "action_field_types",
    "is_light",
    "wall_ms",
]

VERSION = 1

# --------------------------------------------------------------------------- bounds (docs/events.md)

#: 9999-12-31T23:59:59.999Z: every epoch-millisecond time (eventTime, decidedAt, lastHeartbeat,
#: watermark) is within [0, this]; the last instant with a 4-digit year, which Spark's
#: ``timestamp_millis`` and java.time hold (Long.MAX overflowed the job with DATETIME_OVERFLOW)
MAX_EPOCH_MILLIS = 253_402_300_799_999
#: Spark BIGINT (Java long) and INT (Java int)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: names and addresses (node, monitor, clusterName, brokerName, brokerAddr, haServerAddr, zoneName,
#: source, topic, filter servers): generous, RocketMQ's own topics are at most 127 characters
MAX_NAME_CHARS = 1024
#: free text for people (reason)
MAX_REASON_CHARS = 4096
#: text a node passes through: orderTopicConf, each value of topicQueueMappingInfoMap
MAX_TEXT_CHARS = 65_536
#: heartbeatTimeoutMillis: brokers send 10 000 (5.x, brokerNotActiveTimeoutMillis) or nothing, and the
#: node then applies 120 000; more than 10 days is a broker no one would ever expire
MIN_HEARTBEAT_TIMEOUT_MILLIS = 1
MAX_HEARTBEAT_TIMEOUT_MILLIS = 864_000_000


def wall_ms() -> int:
    """The wall clock in epoch milliseconds: the unit of every event and action time."""
    return time.time_ns() // 1_000_000


class SchemaError(ValueError):
    """A record that is not a valid version-1 event or action; the message says which field and why."""


class EventType(enum.StrEnum):
    #: a registration that carries the broker's topic table (first sight, DataVersion changed, or it
    #: changed the broker's filter servers or its group's zone / acting-master flag / members)
    REGISTER = "REGISTER"
    #: proof of life: an unchanged registration, QUERY_DATA_VERSION or BROKER_HEARTBEAT
    HEARTBEAT = "HEARTBEAT"
    #: the node queued the broker's removal (its request, local expiry, or an applied action)
    UNREGISTER = "UNREGISTER"
    #: the connection the broker registered on closed; the node queued its removal
    CHANNEL_CLOSED = "CHANNEL_CLOSED"
    #: an admin request changed routes (perm wipe/add, topic delete/register)
    ADMIN = "ADMIN"
    #: the node's clock, so event time moves while every broker is silent
    TICK = "TICK"
    #: a PUT_KV_CONFIG / DELETE_KV_CONFIG of namespace ORDER_TOPIC_CONFIG (a topic's orderTopicConf)
    ORDER_TOPIC_CONF = "ORDER_TOPIC_CONF"
    #: the node's clock passed the broker's deadline (its last REGISTER/HEARTBEAT here + its timeout)
    #: with nothing heard since: the monitor can decide in the batch that reads this, not one later
    SILENT = "SILENT"


class HeartbeatSource(enum.StrEnum):
    REGISTER_BROKER = "REGISTER_BROKER"
    QUERY_DATA_VERSION = "QUERY_DATA_VERSION"
    BROKER_HEARTBEAT = "BROKER_HEARTBEAT"


class UnregisterSource(enum.StrEnum):
    #: the broker asked (UNREGISTER_BROKER, code 104)
    UNREGISTER_BROKER = "UNREGISTER_BROKER"
    #: the node's own expiry scan (the fallback while the monitor is silent)
    LOCAL_EXPIRY = "LOCAL_EXPIRY"
    #: the node applied the monitor's EXPIRE / REMOVE action
    EXPIRE = "EXPIRE"
    REMOVE = "REMOVE"


class AdminOp(enum.StrEnum):
    WIPE_WRITE_PERM = "WIPE_WRITE_PERM"
    ADD_WRITE_PERM = "ADD_WRITE_PERM"
    DELETE_TOPIC = "DELETE_TOPIC"
    REGISTER_TOPIC = "REGISTER_TOPIC"


class ActionType(enum.StrEnum):
    #: the broker was silent past its timeout: remove it
    EXPIRE = "EXPIRE"
    #: the broker left (it unregistered or its connection closed somewhere): remove it everywhere
    REMOVE = "REMOVE"
    #: the monitor is alive; nodes keep their local expiry scan off while they hear it
    MONITOR_HEARTBEAT = "MONITOR_HEARTBEAT"


# --------------------------------------------------------------------------- value types


@dataclass(frozen=True, slots=True)
class DataVersionInfo:
    """The broker's topic-table version, as it registered it."""

    counter: int
    state_version: int
    timestamp: int

    def to_json(self) -> dict[str, int]:
        return {"counter": self.counter, "stateVersion": self.state_version, "timestamp": self.timestamp}

    @classmethod
    def from_json(cls, d: Any, where: str) -> DataVersionInfo:
        d = _object(d, where)
        return cls(_req_int(d, "counter", where), _req_int(d, "stateVersion", where), _req_int(d, "timestamp", where))


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One topic's queues on the registering broker group."""

    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_json(self) -> dict[str, int]:
        return {
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
        }

    @classmethod
    def from_json(cls, d: Any, where: str) -> QueueInfo:
        d = _object(d, where)
        return cls(
            _req_int(d, "readQueueNums", where),
            _req_int(d, "writeQueueNums", where),
            _req_int(d, "perm", where),
            _opt_int(d, "topicSysFlag", where, 0),
        )


@dataclass(frozen=True, slots=True)
class BrokerQueueInfo:
    """A topic's queues on a named broker group (REGISTER_TOPIC's queueDatas)."""

    broker_name: str
    queues: QueueInfo

    def to_json(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, **self.queues.to_json()}

    @classmethod
    def from_json(cls, d: Any, where: str) -> BrokerQueueInfo:
        d = _object(d, where)
        name = d.get("brokerName")
        if type(name) is not str or not name:
            raise SchemaError(f"{where}.brokerName: expected a non-empty string, got {_text(name)}")
        return cls(name, QueueInfo.from_json(d, where))


# --------------------------------------------------------------------------- records


@dataclass(slots=True)
class Event:
    """One thing a node saw; optional fields are None when the event type does not carry them."""

    type: EventType
    #: the node's name (``nodeName``, else host:port); the publisher fills it in when it sends
    node: str
    #: node wall clock, epoch milliseconds
    event_time: int
    #: per node, increasing from 1 at every start of the node
    seq: int
    cluster_name: str | None = None
    broker_name: str | None = None
    broker_id: int | None = None
    broker_addr: str | None = None
    #: HEARTBEAT: a HeartbeatSource; UNREGISTER: an UnregisterSource
    source: str | None = None
    #: free text for people (CHANNEL_CLOSED: how the connection ended)
    reason: str | None = None
    ha_server_addr: str | None = None
    zone_name: str | None = None
    enable_acting_master: bool | None = None
    heartbeat_timeout_millis: int | None = None
    data_version: DataVersionInfo | None = None
    #: REGISTER only: topic -> queues on this broker group
    topics: dict[str, QueueInfo] | None = None
    #: REGISTER only: the broker's filter servers, when its registration carried a list ([] clears them)
    filter_server_list: list[str] | None = None
    #: REGISTER only: topic -> the broker's static-topic mapping (TopicQueueMappingInfo) as JSON text in
    #: fastjson's dialect; text, because an object would lose which map keys were integers
    topic_queue_mapping_info_map: dict[str, str] | None = None
    #: ADMIN only
    op: AdminOp | None = None
    #: ADMIN; ORDER_TOPIC_CONF: the KV key, i.e. the topic
    topic: str | None = None
    topic_count: int | None = None
    queue_datas: list[BrokerQueueInfo] | None = None
    #: ORDER_TOPIC_CONF only: the topic's new value in ORDER_TOPIC_CONFIG; None: it has none (deleted)
    order_topic_conf: str | None = None
    #: TICK only: whether the node's own expiry scan is on (the monitor silent); None from older nodes
    local_scan: bool | None = None
    v: int = VERSION


@dataclass(slots=True)
class Action:
    """One decision of the monitor (or its heartbeat)."""

    type: ActionType
    #: which monitor instance decided (its query id or host)
    monitor: str
    #: monitor wall clock when it decided / sent, epoch milliseconds
    decided_at: int
    cluster_name: str | None = None
    broker_addr: str | None = None
    broker_name: str | None = None
    broker_id: int | None = None
    #: the latest event time seen for the broker when deciding; nodes that saw anything newer skip it
    last_heartbeat: int | None = None
    #: the monitor's event-time watermark when deciding
    watermark: int | None = None
    reason: str | None = None
    #: MONITOR_HEARTBEAT only: the latest event time the monitor has read and decided on, its actions sent
    #: and its routes written; None from older monitors (docs/events.md)
    decided_through: int | None = None
    v: int = VERSION


# --------------------------------------------------------------------------- bounds of values


class Bound(Protocol):
    """What a value of one field may be, checked on the Python value (decoded, or about to be encoded)."""

    def check(self, x: Any, where: str) -> None:
        """Raise SchemaError naming ``where`` and the bound if ``x`` is outside it."""


@dataclass(frozen=True, slots=True)
class IntRange:
    """An integer within [lo, hi] (booleans are not integers here)."""

    lo: int
    hi: int

    def check(self, x: Any, where: str) -> None:
        if type(x) is not int:
            raise SchemaError(f"{where}: expected an integer, got {_show(x)}")
        if not self.lo <= x <= self.hi:
            raise SchemaError(f"{where}: {_show_int(x)} is out of range [{self.lo}, {self.hi}]")


@dataclass(frozen=True, slots=True)
class MaxChars:
    """A string of at most ``chars`` characters."""

    chars: int

    def check(self, x: Any, where: str) -> None:
        if type(x) is not str:
            raise SchemaError(f"{where}: expected a string, got {_show(x)}")
        if len(x) > self.chars:
            raise SchemaError(f"{where}: {len(x)} characters, more than the {self.chars} allowed")


@dataclass(frozen=True, slots=True)
class IsBool:
    def check(self, x: Any, where: str) -> None:
        if type(x) is not bool:
            raise SchemaError(f"{where}: expected true or false, got {_show(x)}")


@dataclass(frozen=True, slots=True)
class Member:
    """A member of an enum (the decoder turned the text into one)."""

    enum_type: type[enum.Enum]

    def check(self, x: Any, where: str) -> None:
        if not isinstance(x, self.enum_type):
            raise SchemaError(f"{where}: expected a {self.enum_type.__name__}, got {_show(x)}")


@dataclass(frozen=True, slots=True)
class ListOf:
    item: Bound

    def check(self, x: Any, where: str) -> None:
        if type(x) is not list:
            raise SchemaError(f"{where}: expected a list, got {_show(x)}")
        for i, value in enumerate(x):
            self.item.check(value, f"{where}[{i}]")


@dataclass(frozen=True, slots=True)
class MapOf:
    key: MaxChars
    value: Bound

    def check(self, x: Any, where: str) -> None:
        if type(x) is not dict:
            raise SchemaError(f"{where}: expected a JSON object, got {_show(x)}")
        for k, value in x.items():
            self.key.check(k, f"{where} key {_key(k)}")
            self.value.check(value, f"{where}[{_key(k)}]")


@dataclass(frozen=True, slots=True)
class Struct:
    """A value object (:class:`QueueInfo`, ...): its type, and (JSON name, attribute path, bound) rows."""

    type: type
    members: tuple[tuple[str, str, Bound], ...]

    def check(self, x: Any, where: str) -> None:
        if not isinstance(x, self.type):
            raise SchemaError(f"{where}: expected a {self.type.__name__}, got {_show(x)}")
        for name, path, bound in self.members:
            value = x
            for attr in path.split("."):
                value = getattr(value, attr)
            bound.check(value, f"{where}.{name}")


EPOCH_MILLIS = IntRange(0, MAX_EPOCH_MILLIS)
LONG = IntRange(INT64_MIN, INT64_MAX)
INT = IntRange(INT32_MIN, INT32_MAX)
NAME = MaxChars(MAX_NAME_CHARS)
REASON = MaxChars(MAX_REASON_CHARS)
TEXT = MaxChars(MAX_TEXT_CHARS)
HEARTBEAT_TIMEOUT = IntRange(MIN_HEARTBEAT_TIMEOUT_MILLIS, MAX_HEARTBEAT_TIMEOUT_MILLIS)
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


# --------------------------------------------------------------------------- field tables


@dataclass(frozen=True, slots=True)
class Field:
    """One JSON field: its name, the dataclass attribute, its Spark SQL type and its bound."""

    name: str
    attr: str
    ddl: str
    #: JSON value, field path -> Python value of the right type (raises SchemaError)
    read: Callable[[Any, str], Any]
    #: what the Python value may be; decoding and :func:`check_event` both apply it
    bound: Bound
    #: Python value -> JSON value
    write: Callable[[Any], Any] = lambda x: x


def _read_str(x: Any, where: str) -> str:
    if type(x) is not str:
        raise SchemaError(f"{where}: expected a string, got {_show(x)}")
    return x


def _read_int(x: Any, where: str) -> int:
    if type(x) is not int:
        raise SchemaError(f"{where}: expected an integer, got {_show(x)}")
    return x


def _read_bool(x: Any, where: str) -> bool:
    if type(x) is not bool:
        raise SchemaError(f"{where}: expected true or false, got {_show(x)}")
    return x


class _EnumReader:
    """Reads a member of ``enum_type`` from its text; ``members`` maps each text to its member."""

    def __init__(self, enum_type: type[enum.StrEnum]) -> None:
        self.enum_type = enum_type
        self.members: dict[str, Any] = {m.value: m for m in enum_type}

    def __call__(self, x: Any, where: str) -> Any:
        member = self.members.get(x) if type(x) is str else None
        if member is None:  # not text at all included
            known = ", ".join(self.members)
            raise SchemaError(f"{where}: unknown value {_text(x)} (known: {known})")
        return member


def _reader_enum(enum_type: type[enum.StrEnum]) -> _EnumReader:
    return _EnumReader(enum_type)


def _read_topics(x: Any, where: str) -> dict[str, QueueInfo]:
    return {str(t): QueueInfo.from_json(q, f"{where}[{_key(t)}]") for t, q in _object(x, where).items()}


def _read_str_list(x: Any, where: str) -> list[str]:
    if type(x) is not list:
        raise SchemaError(f"{where}: expected a list, got {_show(x)}")
    return [_read_str(item, f"{where}[{i}]") for i, item in enumerate(x)]


def _read_str_map(x: Any, where: str) -> dict[str, str]:
    return {str(k): _read_str(v, f"{where}[{_key(k)}]") for k, v in _object(x, where).items()}


def _read_queue_datas(x: Any, where: str) -> list[BrokerQueueInfo]:
    if type(x) is not list:
        raise SchemaError(f"{where}: expected a list, got {_show(x)}")
    return [BrokerQueueInfo.from_json(q, f"{where}[{i}]") for i, q in enumerate(x)]


_QUEUE_DDL = "readQueueNums: INT, writeQueueNums: INT, perm: INT, topicSysFlag: INT"

EVENT_FIELDS: tuple[Field, ...] = (
    Field("v", "v", "INT", _read_int, IntRange(VERSION, VERSION)),
    Field("type", "type", "STRING", _reader_enum(EventType), Member(EventType), str),
    Field("node", "node", "STRING", _read_str, NAME),
    Field("eventTime", "event_time", "BIGINT", _read_int, EPOCH_MILLIS),
    Field("seq", "seq", "BIGINT", _read_int, IntRange(0, INT64_MAX)),
    Field("clusterName", "cluster_name", "STRING", _read_str, NAME),
    Field("brokerName", "broker_name", "STRING", _read_str, NAME),
    Field("brokerId", "broker_id", "BIGINT", _read_int, LONG),
    Field("brokerAddr", "broker_addr", "STRING", _read_str, NAME),
    Field("source", "source", "STRING", _read_str, NAME),
    Field("reason", "reason", "STRING", _read_str, REASON),
    Field("haServerAddr", "ha_server_addr", "STRING", _read_str, NAME),
    Field("zoneName", "zone_name", "STRING", _read_str, NAME),
    Field("enableActingMaster", "enable_acting_master", "BOOLEAN", _read_bool, IsBool()),
    Field("heartbeatTimeoutMillis", "heartbeat_timeout_millis", "BIGINT", _read_int, HEARTBEAT_TIMEOUT),
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
    Field("op", "op", "STRING", _reader_enum(AdminOp), Member(AdminOp), str),
    Field("topic", "topic", "STRING", _read_str, NAME),
    Field("topicCount", "topic_count", "INT", _read_int, IntRange(0, INT32_MAX)),
    Field(
        "queueDatas", "queue_datas", f"ARRAY<STRUCT<brokerName: STRING, {_QUEUE_DDL}>>",
        _read_queue_datas, ListOf(BROKER_QUEUE), lambda qs: [q.to_json() for q in qs],
    ),
    Field("orderTopicConf", "order_topic_conf", "STRING", _read_str, TEXT),
    Field("localScan", "local_scan", "BOOLEAN", _read_bool, IsBool()),
)  # fmt: skip

ACTION_FIELDS: tuple[Field, ...] = (
    Field("v", "v", "INT", _read_int, IntRange(VERSION, VERSION)),
    Field("type", "type", "STRING", _reader_enum(ActionType), Member(ActionType), str),
    Field("monitor", "monitor", "STRING", _read_str, NAME),
    Field("decidedAt", "decided_at", "BIGINT", _read_int, EPOCH_MILLIS),
    Field("clusterName", "cluster_name", "STRING", _read_str, NAME),
    Field("brokerAddr", "broker_addr", "STRING", _read_str, NAME),
    Field("brokerName", "broker_name", "STRING", _read_str, NAME),
    Field("brokerId", "broker_id", "BIGINT", _read_int, LONG),
    Field("lastHeartbeat", "last_heartbeat", "BIGINT", _read_int, EPOCH_MILLIS),
    Field("watermark", "watermark", "BIGINT", _read_int, EPOCH_MILLIS),
    Field("reason", "reason", "STRING", _read_str, REASON),
    Field("decidedThrough", "decided_through", "BIGINT", _read_int, EPOCH_MILLIS),
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
_SOURCES: Mapping[EventType, type[enum.StrEnum]] = {
    EventType.HEARTBEAT: HeartbeatSource,
    EventType.UNREGISTER: UnregisterSource,
}
ACTION_REQUIRED: Mapping[ActionType, tuple[str, ...]] = {
    ActionType.EXPIRE: (*_BROKER, "lastHeartbeat", "watermark"),
    ActionType.REMOVE: (*_BROKER, "lastHeartbeat", "watermark"),
    ActionType.MONITOR_HEARTBEAT: (),
}
_SOURCE_READERS = {etype: _reader_enum(source) for etype, source in _SOURCES.items()}
_COMMON_EVENT = ("v", "type", "node", "eventTime", "seq")
_COMMON_ACTION = ("v", "type", "monitor", "decidedAt")
#: JSON name -> attribute, of both tables (a name means the same in both)
_ATTRS = {f.name: f.attr for f in (*EVENT_FIELDS, *ACTION_FIELDS)}


def _pairs(names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The JSON names of required fields and their attributes: :func:`_require` looks the attributes up."""
    return names, tuple(_ATTRS[n] for n in names)


_COMMON_EVENT_PAIRS = _pairs(_COMMON_EVENT)
_COMMON_ACTION_PAIRS = _pairs(_COMMON_ACTION)
#: per event type: what its messages call it, its required fields and its source's reader (or None);
#: made once, since an enum member's ``.value`` is a property, dear on every event
_EVENT_TYPE_RULES = {
    etype: (f"{etype.value} event", _pairs(EVENT_REQUIRED[etype]), _SOURCE_READERS.get(etype)) for etype in EventType
}
_ADMIN = EventType.ADMIN  # (an enum's class attribute is dear to look up on every event)
_ADMIN_RULES = {op: (f"ADMIN {op.value} event", _pairs(names)) for op, names in ADMIN_REQUIRED.items()}
_ACTION_TYPE_RULES = {atype: (f"{atype.value} action", _pairs(ACTION_REQUIRED[atype])) for atype in ActionType}
#: (attribute, bound, path for messages) per field: check_event / check_action run on every event
_EVENT_CHECKS = tuple((f.attr, f.bound, f"event.{f.name}") for f in EVENT_FIELDS)
_ACTION_CHECKS = tuple((f.attr, f.bound, f"action.{f.name}") for f in ACTION_FIELDS)

#: event types the publisher may drop first when its queue is full
LIGHT_EVENT_TYPES = frozenset({EventType.HEARTBEAT, EventType.TICK})


def is_light(event: Event) -> bool:
    """Heartbeats and ticks: superseded by the next one, so they are dropped first under pressure."""
    return event.type in LIGHT_EVENT_TYPES


# --------------------------------------------------------------------------- encode / decode


def _to_json(record: Event | Action, fields: tuple[Field, ...]) -> bytes:
    out = {}
    for f in fields:
        value = getattr(record, f.attr)
        if value is not None:
            out[f.name] = f.write(value)
    return orjson.dumps(out)


# How the decoder checks one field's value, derived from its Field row (:func:`_decode_plan`): a
# plain string, integer or boolean within its bound, and an enum's text, are checked in the loop of
# :func:`_present_values` itself, without a call; anything else runs the row's ``read`` and ``bound``.
_STR, _INT, _BOOL, _ENUM, _OTHER = range(5)
#: (how, attribute, two parameters, path for messages): see :func:`_decode_plan`
_Step = tuple[int, str, Any, Any, str]


def _decode_plan(fields: tuple[Field, ...], what: str) -> dict[str, _Step]:
    """JSON name -> how :func:`_present_values` checks the field. The inline checks are the row's
    ``read`` and ``bound`` written out: they accept exactly the values those accept, unchanged, and
    what they refuse is handed to the rows themselves (:func:`_walk_fields`) for the message."""
    plan: dict[str, _Step] = {}
    for f in fields:
        b = f.bound
        step: tuple[int, Any, Any]
        if f.read is _read_str and type(b) is MaxChars:
            step = (_STR, b.chars, None)
        elif f.read is _read_int and type(b) is IntRange:
            step = (_INT, b.lo, b.hi)
        elif f.read is _read_bool and type(b) is IsBool:
            step = (_BOOL, None, None)
        elif type(f.read) is _EnumReader and type(b) is Member and b.enum_type is f.read.enum_type:
            step = (_ENUM, f.read.members, None)
        else:
            step = (_OTHER, f.read, b.check)
        how, p, q = step
        plan[f.name] = (how, f.attr, p, q, f"{what}.{f.name}")
    return plan


_EVENT_PLAN = _decode_plan(EVENT_FIELDS, "event")
_ACTION_PLAN = _decode_plan(ACTION_FIELDS, "action")


def _present_values(raw: dict[Any, Any], plan: dict[str, _Step]) -> dict[str, Any] | None:
    """The typed values (by attribute name) of the fields ``raw`` carries, walking its keys rather than
    the whole table (a heartbeat carries 10 of the event's 27 fields); None if any value is refused.

    Unknown keys and null values are skipped, as :func:`_walk_fields` skips them.
    """
    values: dict[str, Any] = {}
    for name, value in raw.items():
        step = plan.get(name)
        if step is None or value is None:
            continue
        how, attr, p, q, where = step
        if how == _STR:
            if type(value) is not str or len(value) > p:
                return None
        elif how == _INT:
            if type(value) is not int or not p <= value <= q:
                return None
        elif how == _ENUM:
            value = p.get(value) if type(value) is str else None
            if value is None:
                return None
        elif how == _BOOL:
            if type(value) is not bool:
                return None
        else:
            try:
                value = p(value, where)
                q(value, where)
            except SchemaError:
                return None
        values[attr] = value
    return values


def _walk_fields(raw: dict[Any, Any], fields: tuple[Field, ...], what: str) -> dict[str, Any]:
    """The typed values of ``raw`` field by field in table order, each row's ``read`` then ``bound``:
    the reference for :func:`_present_values`, and what names the refused field (the first in table
    order, however the record ordered its keys)."""
    values: dict[str, Any] = {}
    for f in fields:
        value = raw.get(f.name)
        if value is not None:
            where = f"{what}.{f.name}"
            value = f.read(value, where)
            f.bound.check(value, where)
            values[f.attr] = value
    return values


def _from_json(
    data: bytes | str | Mapping[str, Any], fields: tuple[Field, ...], plan: dict[str, _Step], what: str
) -> dict[str, Any]:
    """Field-by-field typed values (by attribute name) of one record, each checked against its bound."""
    if type(data) is not bytes and isinstance(data, Mapping):  # (an ABC's isinstance is dear: bytes first)
        raw = data
    else:
        try:
            raw = orjson.loads(data)
        except (orjson.JSONDecodeError, TypeError) as e:
            raise SchemaError(f"{what}: not JSON ({e})") from None
    if not isinstance(raw, dict):
        raise SchemaError(f"{what}: expected a JSON object, got {_show(raw)}")
    v = raw.get("v")
    if v != VERSION or type(v) is not int:
        raise SchemaError(f"{what}.v: unsupported schema version {_text(v)}; this reader knows {VERSION}")
    # more keys than the table has fields (unknown ones): the table is the shorter walk
    values = _present_values(raw, plan) if len(raw) <= len(fields) else None
    # a refused value: the table walk raises the error it always raised
    return _walk_fields(raw, fields, what) if values is None else values


def _values(record: Event | Action, checks: tuple[tuple[str, Bound, str], ...]) -> dict[str, Any]:
    """The record's present values (by attribute name), each checked against its bound."""
    values: dict[str, Any] = {}
    for attr, bound, where in checks:
        value = getattr(record, attr)
        if value is not None:
            bound.check(value, where)
            values[attr] = value
    return values


def _require(values: dict[str, Any], required: tuple[tuple[str, ...], tuple[str, ...]], what: str) -> None:
    """SchemaError naming every required field (see :func:`_pairs`) that ``values`` lacks."""
    names, attrs = required
    for attr in attrs:
        if values.get(attr) is None:
            missing = [n for n, a in zip(names, attrs, strict=True) if values.get(a) is None]
            raise SchemaError(f"{what}: missing required field(s) {', '.join(missing)}")


def _event_rules(values: dict[str, Any]) -> None:
    """What an event of its type must carry (``values`` are bounded already); ``source`` becomes text."""
    _require(values, _COMMON_EVENT_PAIRS, "event")
    etype: EventType = values["type"]
    what, required, read_source = _EVENT_TYPE_RULES[etype]
    _require(values, required, what)
    if read_source is not None:
        source = values["source"]  # stays text: a member's text is its value
        if type(source) is not str or source not in read_source.members:
            read_source(source, f"{what}.source")  # raises, naming the value and the known ones
    if etype is _ADMIN:
        admin_what, admin_required = _ADMIN_RULES[values["op"]]
        _require(values, admin_required, admin_what)


def _action_rules(values: dict[str, Any]) -> None:
    _require(values, _COMMON_ACTION_PAIRS, "action")
    what, required = _ACTION_TYPE_RULES[values["type"]]
    _require(values, required, what)


def encode_event(event: Event) -> bytes:
    """The event as compact JSON (absent fields are not written); see :func:`check_event`."""
    return _to_json(event, EVENT_FIELDS)


def check_event(event: Event) -> None:
    """SchemaError if :func:`decode_event` would refuse this event once encoded (a bound, a
    required field, an unknown source); the publisher calls it before it queues an event."""
    _event_rules(_values(event, _EVENT_CHECKS))


def decode_event(data: bytes | str | Mapping[str, Any]) -> Event:
    """A checked :class:`Event` from JSON bytes/text or an already parsed object; SchemaError if invalid."""
    return Event(**decode_event_values(data))


def decode_event_values(data: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`decode_event` makes its Event of: the checked values of the fields present, by
    attribute name (absent ones are missing, not None). For a reader that wants a few of them
    (the Spark job's source, per record) without building the Event."""
    values = _from_json(data, EVENT_FIELDS, _EVENT_PLAN, "event")
    _event_rules(values)
    return values


def event_key(event: Event) -> bytes:
    """Kafka key: the broker address, so one broker's events stay in order; TICK/ADMIN: the node;
    ORDER_TOPIC_CONF: the topic, so every node's changes of one topic share a partition."""
    if event.type is EventType.ORDER_TOPIC_CONF and event.topic is not None:
        return event.topic.encode()
    return (event.broker_addr or event.node).encode()


def encode_action(action: Action) -> bytes:
    """The action as compact JSON; see :func:`check_action`."""
    return _to_json(action, ACTION_FIELDS)


def check_action(action: Action) -> None:
    """SchemaError if :func:`decode_action` would refuse this action once encoded."""
    _action_rules(_values(action, _ACTION_CHECKS))


def decode_action(data: bytes | str | Mapping[str, Any]) -> Action:
    """A checked :class:`Action`; SchemaError if invalid (unknown types included)."""
    values = _from_json(data, ACTION_FIELDS, _ACTION_PLAN, "action")
    _action_rules(values)
    return Action(**values)


def action_key(action: Action) -> bytes:
    """Kafka key: the broker address; MONITOR_HEARTBEAT: the monitor id."""
    return (action.broker_addr or action.monitor).encode()


# --------------------------------------------------------------------------- Spark schema


def event_field_types() -> dict[str, str]:
    """JSON field name -> Spark SQL type of every event field, in schema order."""
    return {f.name: f.ddl for f in EVENT_FIELDS}


def action_field_types() -> dict[str, str]:
    return {f.name: f.ddl for f in ACTION_FIELDS}


def _ddl(fields: tuple[Field, ...]) -> str:
    return ", ".join(f"`{f.name}` {f.ddl}" for f in fields)


def event_ddl() -> str:
    """A DDL string for ``from_json``/``StructType.fromDDL`` covering every event field (all nullable)."""
    return _ddl(EVENT_FIELDS)


def action_ddl() -> str:
    return _ddl(ACTION_FIELDS)


# --------------------------------------------------------------------------- helpers


def _object(x: Any, where: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise SchemaError(f"{where}: expected a JSON object, got {_show(x)}")
    return x


def _req_int(d: dict[str, Any], key: str, where: str) -> int:
    if key not in d or d[key] is None:
        raise SchemaError(f"{where}.{key}: missing")
    return _read_int(d[key], f"{where}.{key}")


def _opt_int(d: dict[str, Any], key: str, where: str, default: int) -> int:
    value = d.get(key)
    return default if value is None else _read_int(value, f"{where}.{key}")


def _show(x: Any) -> str:
    return f"{type(x).__name__} {_text(x)}"


def _text(x: Any) -> str:
    """A value as an error message shows it: repr'd, at most 60 characters."""
    if type(x) is int:
        return _show_int(x)
    try:
        return _cut(repr(x))
    except RecursionError:
        # JSON nests up to 1024 deep (orjson's limit), deeper than repr may recurse: a hostile
        # record's value must still end in a SchemaError, not stop the caller
        return "<nested too deeply to show>"


def _show_int(x: int) -> str:
    # a record given as an already parsed object may hold an int of any size, and str() of one
    # past 4300 digits raises
    return str(x) if x.bit_length() <= 128 else f"<an integer of {x.bit_length()} bits>"


def _key(k: Any) -> str:
    """A map key as it appears in an error message: repr'd, at most 60 characters."""
    return _cut(repr(k))


def _cut(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."
