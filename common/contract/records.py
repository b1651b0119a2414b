"""The records of the contract: an :class:`Event` a node publishes, an :class:`Action` the monitor decides.

Their kinds and sources are enums whose text is what travels (:class:`EventType`,
:class:`ActionType`, ...); the value types (:class:`QueueInfo`, :class:`DataVersionInfo`,
:class:`BrokerQueueInfo`) read themselves from JSON with the readers of :mod:`common.contract.bounds`.
Which JSON field holds which attribute, and its bound, is :mod:`common.contract.fields`'s table.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from common.contract.bounds import SchemaError, read_object, read_optional_int, read_required_int, show_value

VERSION = 1


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
        d = read_object(d, where)
        return cls(
            read_required_int(d, "counter", where),
            read_required_int(d, "stateVersion", where),
            read_required_int(d, "timestamp", where),
        )


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
        d = read_object(d, where)
        return cls(
            read_required_int(d, "readQueueNums", where),
            read_required_int(d, "writeQueueNums", where),
            read_required_int(d, "perm", where),
            read_optional_int(d, "topicSysFlag", where, 0),
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
        d = read_object(d, where)
        name = d.get("brokerName")
        if type(name) is not str or not name:
            raise SchemaError(f"{where}.brokerName: expected a non-empty string, got {show_value(name)}")
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


# --------------------------------------------------------------------------- what the publisher may drop

#: event types the publisher may drop first when its queue is full
LIGHT_EVENT_TYPES = frozenset({EventType.HEARTBEAT, EventType.TICK})


def is_light(event: Event) -> bool:
    """Heartbeats and ticks: superseded by the next one, so they are dropped first under pressure."""
    return event.type in LIGHT_EVENT_TYPES
