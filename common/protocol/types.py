"""The data the name server keeps and answers with, as typed values.

These mirror RocketMQ's ``DataVersion``, ``TopicConfig``, ``QueueData``, ``BrokerData`` and
``TopicRouteData``.  ``to_wire`` gives a dict whose keys are the Java property names and whose
integer map keys stay integers, so one dict can be written in either fastjson dialect
(:mod:`common.protocol.fastjson`); ``from_wire`` accepts what fastjson peers send.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from common.protocol.codes import Perm


class BodyError(ValueError):
    """A request body that does not have the shape its request code needs."""


def _int(value: Any, default: int = 0) -> int:
    if value is None:
        return default
    if isinstance(value, bool):
        raise BodyError(f"expected a number, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise BodyError(f"expected a number, got {value!r}") from None


def _obj(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BodyError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class DataVersion:
    """A broker's topic-table version; equal only when all three parts are equal."""

    counter: int = 0
    state_version: int = 0
    timestamp: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"counter": self.counter, "stateVersion": self.state_version, "timestamp": self.timestamp}

    @classmethod
    def from_wire(cls, d: Any) -> DataVersion:
        if type(d) is dict:  # every heartbeat carries one: take the common shape without the checks
            c, sv, ts = d.get("counter", 0), d.get("stateVersion", 0), d.get("timestamp", 0)
            if type(c) is int and type(sv) is int and type(ts) is int:
                return cls(c, sv, ts)
        d = _obj(d, "dataVersion")
        return cls(_int(d.get("counter")), _int(d.get("stateVersion")), _int(d.get("timestamp")))


#: the attributes of every decoded topic that has none: shared (64 bytes a topic otherwise), so never
#: mutated; nothing mutates a decoded TopicConfig (RegisterBodyCache keeps and shares them)
_NO_ATTRIBUTES: dict[str, str] = {}


@dataclass(slots=True)  # not frozen: a frozen __init__ is several times dearer, and brokers send thousands of these
class TopicConfig:
    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = Perm.READ | Perm.WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "attributes": dict(self.attributes),
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_wire(cls, d: Any, name: str | None = None) -> TopicConfig:
        if type(d) is dict:
            # the shape every broker sends; anything else takes the checked path below
            topic, r, w, p = d.get("topicName") or name, d.get("readQueueNums"), d.get("writeQueueNums"), d.get("perm")
            if topic == name:  # one string for the table's key and the name: bodies are kept (RegisterBodyCache)
                topic = name
            flag, attrs = d.get("topicSysFlag", d.get("topicSynFlag", 0)), d.get("attributes")
            if (
                type(topic) is str
                and topic
                and type(r) is int
                and type(w) is int
                and type(p) is int
                and type(flag) is int
                and (not attrs or type(attrs) is dict and all(type(v) is str for v in attrs.values()))
            ):
                return cls(
                    topic,
                    r,
                    w,
                    p,
                    d.get("topicFilterType") or "SINGLE_TAG",
                    flag,
                    bool(d.get("order", False)),
                    dict(attrs) if attrs else _NO_ATTRIBUTES,
                )
        d = _obj(d, "topicConfig")
        topic = d.get("topicName") or name
        if not isinstance(topic, str) or not topic:
            raise BodyError("topicConfig without a topicName")
        attrs = d.get("attributes") or {}
        return cls(
            topic_name=topic,
            read_queue_nums=_int(d.get("readQueueNums"), 16),
            write_queue_nums=_int(d.get("writeQueueNums"), 16),
            perm=_int(d.get("perm"), 6),
            topic_filter_type=str(d.get("topicFilterType") or "SINGLE_TAG"),
            topic_sys_flag=_int(d.get("topicSysFlag", d.get("topicSynFlag")), 0),
            order=bool(d.get("order", False)),
            attributes={str(k): str(v) for k, v in _obj(attrs, "attributes").items()},
        )


class QueueData(NamedTuple):
    """One broker group's queues of one topic (a tuple: a broker registers thousands, and they compare in C)."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int
    topic_sys_flag: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_wire(cls, d: Any) -> QueueData:
        d = _obj(d, "queueData")
        name = d.get("brokerName")
        if not isinstance(name, str) or not name:
            raise BodyError("queueData without a brokerName")
        return cls(
            broker_name=name,
            read_queue_nums=_int(d.get("readQueueNums")),
            write_queue_nums=_int(d.get("writeQueueNums")),
            perm=_int(d.get("perm")),
            # brokers before 4.9.0 spelt it topicSynFlag
            topic_sys_flag=_int(d.get("topicSysFlag", d.get("topicSynFlag")), 0),
        )


@dataclass(slots=True)
class BrokerData:
    """A broker group: one name, its members by broker id (0 is the master)."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = field(default_factory=dict)
    zone_name: str | None = None
    enable_acting_master: bool = False

    def copy(self) -> BrokerData:
        return BrokerData(
            self.cluster, self.broker_name, dict(self.broker_addrs), self.zone_name, self.enable_acting_master
        )

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "brokerAddrs": dict(self.broker_addrs),
            "brokerName": self.broker_name,
            "cluster": self.cluster,
            "enableActingMaster": self.enable_acting_master,
        }
        if self.zone_name is not None:
            d["zoneName"] = self.zone_name
        return d

    @classmethod
    def from_wire(cls, d: Any) -> BrokerData:
        d = _obj(d, "brokerData")
        addrs = _obj(d.get("brokerAddrs"), "brokerAddrs")
        return cls(
            cluster=str(d.get("cluster") or ""),
            broker_name=str(d.get("brokerName") or ""),
            broker_addrs={_int(k): str(v) for k, v in addrs.items()},
            zone_name=d.get("zoneName"),
            enable_acting_master=bool(d.get("enableActingMaster", False)),
        )


@dataclass(slots=True)
class TopicRouteData:
    """The answer to GET_ROUTEINFO_BY_TOPIC."""

    queue_datas: list[QueueData] = field(default_factory=list)
    broker_datas: list[BrokerData] = field(default_factory=list)
    #: brokerAddr -> filter server addresses
    filter_server_table: dict[str, list[str]] = field(default_factory=dict)
    order_topic_conf: str | None = None
    #: brokerName -> TopicQueueMappingInfo, kept as the JSON the broker sent
    topic_queue_mapping_by_broker: dict[str, Any] | None = None

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "brokerDatas": [b.to_wire() for b in self.broker_datas],
            "filterServerTable": {k: list(v) for k, v in self.filter_server_table.items()},
        }
        if self.order_topic_conf is not None:
            d["orderTopicConf"] = self.order_topic_conf
        d["queueDatas"] = [q.to_wire() for q in self.queue_datas]
        if self.topic_queue_mapping_by_broker is not None:
            d["topicQueueMappingByBroker"] = self.topic_queue_mapping_by_broker
        return d

    @classmethod
    def from_wire(cls, d: Any) -> TopicRouteData:
        d = _obj(d, "topicRouteData")
        fst = _obj(d.get("filterServerTable"), "filterServerTable")
        return cls(
            queue_datas=[QueueData.from_wire(q) for q in d.get("queueDatas") or []],
            broker_datas=[BrokerData.from_wire(b) for b in d.get("brokerDatas") or []],
            filter_server_table={str(k): [str(a) for a in (v or [])] for k, v in fst.items()},
            order_topic_conf=d.get("orderTopicConf"),
            topic_queue_mapping_by_broker=d.get("topicQueueMappingByBroker"),
        )


@dataclass(slots=True)
class RegisterBrokerBody:
    """What a broker registers: its topic table, its DataVersion, filter servers, static-topic mappings."""

    data_version: DataVersion = field(default_factory=DataVersion)
    topic_config_table: dict[str, TopicConfig] = field(default_factory=dict)
    #: None when the broker sent no list at all (ancient brokers)
    filter_server_list: list[str] | None = None
    #: topic -> TopicQueueMappingInfo JSON (static topics, RIP-21)
    topic_queue_mapping_info_map: dict[str, Any] = field(default_factory=dict)
    #: not on the wire: bodies with the same nonzero id share one parse of one topic table, never
    #: mutated (RegisterBodyCache); 0: a parse of its own
    table_id: int = field(default=0, compare=False)
