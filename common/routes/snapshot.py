"""The route model the streaming job keeps in Redis: key layout, what it writes, what it reads back.

The job (``streaming/routes.py``) writes a copy of the nodes' route tables after each micro-batch
under a key prefix ``P``: ``P:model:topics`` (:func:`encode_topic_entry`), ``P:model:brokers``
(:func:`encode_brokers`) and ``P:meta`` (:func:`encode_meta`), all documented in
``docs/redis-keys.md``.  Two readers take it back, a restarted job (:func:`restore`) and a node's
warm start (:mod:`common.routes.provisional`), and both go through :func:`decode_model`, the one
validation of that layout: it raises :class:`SnapshotError` naming the key and the field before any
table changes, and accepts models written before later fields existed.  Nothing here does I/O: the
callers read and write Redis with the keys of :class:`RedisKeys`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from common.protocol import fastjson
from common.protocol.codes import DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
from common.protocol.types import BrokerData, DataVersion, QueueData
from common.routes.model import BrokerAddrInfo, BrokerLiveInfo
from common.routes.tables import RouteTables, index_members

_JSON_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


class SnapshotError(ValueError):
    """A stored model that does not have the documented shape; the message names the key and field."""


# --------------------------------------------------------------------------- keys


# --------------------------------------------------------------------------- the model as values


class SnapshotBroker(NamedTuple):
    """A live entry as the snapshot recorded it."""

    #: the broker's own heartbeat timeout; None = DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
    timeout_millis: int | None
    data_version: DataVersion
    ha_server_addr: str | None
    #: the writer's clock (``now_ms``) at the broker's last registration or heartbeat
    last_update: int = 0


class OrderConf(NamedTuple):
    """A topic's ORDER_TOPIC_CONFIG value as its newest ORDER_TOPIC_CONF event reported it (the job's)."""

    #: None: the entry was deleted (or put without a value)
    conf: str | None
    event_time: int
    node: str
    seq: int

    @property
    def stamp(self) -> tuple[int, str, int]:
        """What decides which of two reports is newer: event time, then node name and seq."""
        return (self.event_time, self.node, self.seq)


@dataclass(frozen=True)
class ModelSnapshot:
    """The model as one consistent read of ``P:meta``, ``P:model:topics`` and ``P:model:brokers`` found it."""

    batch_id: int | None = None
    lineage: str | None = None
    #: event-time watermark of that batch (epoch ms), when the job knew one
    watermark: int | None = None
    #: wall clock (epoch ms) of the job's write
    updated_at: int | None = None
    topics: dict[str, dict[str, QueueData]] = field(default_factory=dict)
    groups: dict[str, BrokerData] = field(default_factory=dict)
    clusters: dict[str, set[str]] = field(default_factory=dict)
    live: dict[BrokerAddrInfo, SnapshotBroker] = field(default_factory=dict)
    #: as the writer held them; a consistent snapshot lists them for live brokers only, except
    #: after a stateVersion conflict (Java keeps the refused broker's filter servers)
    filter_servers: dict[BrokerAddrInfo, tuple[str, ...]] = field(default_factory=dict)
    #: topic -> bname -> static-topic mapping, as the node that wrote it held them
    mappings: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the job's own: each topic's newest ORDER_TOPIC_CONF report, and the setting routes were built with
    order_topic_conf: dict[str, OrderConf] = field(default_factory=dict)
    order_message_enable: bool = False

    @property
    def empty(self) -> bool:
        return not self.groups


# --------------------------------------------------------------------------- writing


def encode_topic_entry(qmap: Mapping[str, QueueData]) -> bytes:
    """A ``P:model:topics`` value: one topic's ``topicQueueTable`` row."""
    return orjson.dumps({name: qd.to_wire() for name, qd in qmap.items()}, option=_JSON_OPTS)


def encode_brokers(t: RouteTables, order_topic_conf: Mapping[str, OrderConf], order_message_enable: bool) -> bytes:
    """The ``P:model:brokers`` value for the tables and the job's order-conf state."""
    return orjson.dumps(
        {
            "groups": {name: bd.to_wire() for name, bd in t.broker_addr_table.items()},
            "clusters": {c: sorted(names) for c, names in t.cluster_addr_table.items()},
            "live": {
                _key_text(k): {
                    "dataVersion": v.data_version.to_wire(),
                    "timeoutMillis": v.heartbeat_timeout_millis,
                    "haServerAddr": v.ha_server_addr,
                    "lastUpdate": v.last_update_timestamp,
                }
                for k, v in t.broker_live_table.items()
            },
            "filterServers": {_key_text(k): v for k, v in t.filter_server_table.items()},
            # text in fastjson's dialect, as in the events: orjson would turn integer keys into strings
            "mappings": {
                topic: {b: fastjson.dumps_legacy(info).decode() for b, info in per.items()}
                for topic, per in t.topic_queue_mapping_info_table.items()
            },
            "orderTopicConf": {
                topic: {"conf": c.conf, "eventTime": c.event_time, "node": c.node, "seq": c.seq}
                for topic, c in order_topic_conf.items()
            },
            # what the written routes were built with, so a restart with the switch flipped rewrites them
            "orderMessageEnable": order_message_enable,
        },
        option=_JSON_OPTS,
    )


def encode_meta(lineage: str, batch_id: int, updated_at: int, watermark: int | None) -> dict[str, str | int]:
    """The ``P:meta`` fields of one batch's write."""
    meta: dict[str, str | int] = {"lineage": lineage, "batchId": batch_id, "updatedAt": updated_at}
    if watermark is not None:
        meta["watermark"] = watermark
    return meta


def _key_text(key: BrokerAddrInfo) -> str:
    return f"{key.cluster_name}|{key.broker_addr}"


# --------------------------------------------------------------------------- reading


def decode_model(
    meta: Mapping[Any, Any], topic_entries: Mapping[Any, Any], brokers: bytes | str | None
) -> ModelSnapshot:
    """The model from the raw values of ``P:meta``, ``P:model:topics`` and ``P:model:brokers``.

    Keys and values may be bytes (as redis-py returns them) or text.  Raises
    :class:`SnapshotError` naming the key whose value does not have the documented shape.
    """
    meta_text = {_text(k, "meta field name"): _text(v, "meta field") for k, v in meta.items()}
    topics = {}
    for raw_topic, entry in topic_entries.items():
        topic = _text(raw_topic, "model:topics field name")
        topics[topic] = decode_topic_entry(topic, entry)
    doc = _brokers_document(brokers)
    filters = {_addr_key(k): _addresses(v, f"filterServers[{k!r}]") for k, v in _obj(doc, "filterServers").items()}
    return ModelSnapshot(
        batch_id=_meta_int(meta_text, "batchId"),
        lineage=meta_text.get("lineage"),
        watermark=_meta_int(meta_text, "watermark"),
        updated_at=_meta_int(meta_text, "updatedAt"),
        topics=topics,
        groups={name: _group(name, d) for name, d in _obj(doc, "groups").items()},
        clusters={c: set(_strings(names, f"clusters[{c!r}]")) for c, names in _obj(doc, "clusters").items()},
        live={_addr_key(k): _live(k, info) for k, info in _obj(doc, "live").items()},
        filter_servers=filters,
        mappings={topic: _mappings(topic, per) for topic, per in _obj(doc, "mappings").items()},
        order_topic_conf={topic: _order_conf(topic, c) for topic, c in _obj(doc, "orderTopicConf").items()},
        order_message_enable=_bool(doc.get("orderMessageEnable", False), "orderMessageEnable"),
    )


def decode_topic_entry(topic: str, entry: bytes | str) -> dict[str, QueueData]:
    try:
        rows = orjson.loads(entry)
        if not isinstance(rows, dict):
            raise ValueError(f"a JSON {type(rows).__name__}")
        return {name: QueueData.from_wire(q) for name, q in rows.items()}
    except ValueError as exc:  # orjson.JSONDecodeError and BodyError are ValueErrors
        raise SnapshotError(f"model:topics field {topic!r} is not a {{brokerName: QueueData}} object: {exc}") from None


def _brokers_document(brokers: bytes | str | None) -> dict[str, Any]:
    if not brokers:
        return {}
    try:
        doc = orjson.loads(brokers)
    except orjson.JSONDecodeError as exc:
        raise SnapshotError(f"model:brokers is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise SnapshotError(f"model:brokers is a JSON {type(doc).__name__}, not the documented object")
    return doc


def _fail(what: str, problem: str) -> SnapshotError:
    return SnapshotError(f"model:brokers {what}: {problem}")


def _obj(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name)
    if value is None:  # absent from snapshots written before the field existed
        return {}
    if not isinstance(value, dict):
        raise _fail(name, f"a JSON {type(value).__name__}, not an object")
    return value


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            raise SnapshotError(f"{what} {value[:64]!r} is not UTF-8") from None
    if not isinstance(value, str):
        raise SnapshotError(f"{what} {value!r} is not text")
    return value


def _meta_int(meta: Mapping[str, str], key: str) -> int | None:
    raw = meta.get(key)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise SnapshotError(f"meta field {key}={raw!r} is not an integer") from None


def _addr_key(key: str) -> BrokerAddrInfo:
    cluster, sep, addr = key.partition("|")
    if not sep or not addr:
        raise _fail(f"key {key!r}", "not cluster|addr")
    return BrokerAddrInfo(cluster, addr)


def _strings(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise _fail(what, f"{value!r} is not a list of strings")
    return value


def _addresses(value: Any, what: str) -> tuple[str, ...]:
    return tuple(_strings(value, what))


def _int(value: Any, what: str) -> int:
    if type(value) is not int:
        raise _fail(what, f"{value!r} is not an integer")
    return value


def _bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise _fail(what, f"{value!r} is not true or false")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _fail(what, f"{value!r} is not a string")
    return value


def _optional_str(value: Any, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _fail(what, f"{value!r} is not a string")
    return value


def _group(name: str, d: Any) -> BrokerData:
    try:
        bd = BrokerData.from_wire(d)
    except ValueError as exc:
        raise _fail(f"groups[{name!r}]", str(exc)) from None
    _optional_str(bd.zone_name, f"groups[{name!r}].zoneName")
    return bd


def _live(key: str, info: Any) -> SnapshotBroker:
    what = f"live[{key!r}]"
    if not isinstance(info, dict):
        raise _fail(what, "not an object")
    timeout = info.get("timeoutMillis")
    try:
        dv = DataVersion.from_wire(info.get("dataVersion"))
    except ValueError as exc:
        raise _fail(f"{what}.dataVersion", str(exc)) from None
    return SnapshotBroker(
        timeout_millis=None if timeout is None else _int(timeout, f"{what}.timeoutMillis"),
        data_version=dv,
        ha_server_addr=_optional_str(info.get("haServerAddr"), f"{what}.haServerAddr"),
        last_update=_int(info.get("lastUpdate") or 0, f"{what}.lastUpdate"),
    )


def _mappings(topic: str, per: Any) -> dict[str, Any]:
    what = f"mappings[{topic!r}]"
    if not isinstance(per, dict):
        raise _fail(what, "not an object")
    out = {}
    for bname, text in per.items():
        if not isinstance(text, str):
            raise _fail(f"{what}[{bname!r}]", "not fastjson text")
        try:
            # fastjson's dialect: integer keys (currIdMap) must stay integers to encode as the node did
            out[bname] = fastjson.loads(text)
        except fastjson.FastjsonError as exc:
            raise _fail(f"{what}[{bname!r}]", f"not JSON ({exc})") from None
    return out


def _order_conf(topic: str, d: Any) -> OrderConf:
    what = f"orderTopicConf[{topic!r}]"
    if not isinstance(d, dict):
        raise _fail(what, "not an object")
    return OrderConf(
        conf=_optional_str(d.get("conf"), f"{what}.conf"),
        event_time=_int(d.get("eventTime"), f"{what}.eventTime"),
        node=_str(d.get("node"), f"{what}.node"),
        seq=_int(d.get("seq"), f"{what}.seq"),
    )


# --------------------------------------------------------------------------- restoring the job's copy


def restore(t: RouteTables, snap: ModelSnapshot) -> None:
    """Fill empty tables with an exact copy of ``snap`` (the job's model after a restart).

    Unlike a warm start nothing is provisional or left out: the job goes on from where it wrote.
    """
    if not t.is_empty():
        raise RuntimeError("restore needs empty route tables")
    for topic, qmap in snap.topics.items():
        t.topic_queue_table[topic] = dict(qmap)
    t.broker_addr_table = {name: bd.copy() for name, bd in snap.groups.items()}
    index_members(t)
    t.cluster_addr_table = {c: set(names) for c, names in snap.clusters.items()}
    for key, b in snap.live.items():
        timeout = DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS if b.timeout_millis is None else b.timeout_millis
        t.broker_live_table[key] = BrokerLiveInfo(b.last_update, timeout, b.data_version, None, b.ha_server_addr, 0)
    t.filter_server_table = {key: list(servers) for key, servers in snap.filter_servers.items()}
    t.topic_queue_mapping_info_table = {topic: dict(per) for topic, per in snap.mappings.items()}
    t.changed()
