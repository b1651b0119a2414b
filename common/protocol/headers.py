"""Typed request headers, decoded from ``extFields`` the way Java's ``CommandCustomHeader`` is.

Each header is a frozen dataclass whose fields carry the Java field name.  Decoding follows
``RemotingCommand.decodeCommandCustomHeader``: values are strings on the wire; a number that does
not parse is treated as absent, and a boolean is true only for "true" in any case.  Unlike Java,
a missing required field is reported by name (:class:`HeaderError`) instead of surfacing later as
a NullPointerException; it still becomes SYSTEM_ERROR, so the response code is the same.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast, get_type_hints

T = TypeVar("T")


class HeaderError(ValueError):
    """A request lacks a header field its request code requires."""


def _java(name: str, *, required: bool = False) -> Any:
    # a required field is typed without None: decode_header never builds a header that lacks it
    return field(default=None, metadata={"java": name, "required": required})


def _parse(kind: type, raw: str) -> Any:
    if kind is str:
        return raw
    if kind is bool:
        return raw.strip().lower() == "true"
    if kind is int:
        try:
            return int(raw.strip())
        except ValueError:
            return None
    raise TypeError(kind)


_FIELD_CACHE: dict[type, list[tuple[str, str, type, bool]]] = {}


def _fields(cls: type) -> list[tuple[str, str, type, bool]]:
    cached = _FIELD_CACHE.get(cls)
    if cached is None:
        hints = get_type_hints(cls)
        cached = []
        for f in dataclasses.fields(cls):
            kind = next(t for t in (str, bool, int) if t in getattr(hints[f.name], "__args__", (hints[f.name],)))
            cached.append((f.name, f.metadata["java"], kind, f.metadata["required"]))
        _FIELD_CACHE[cls] = cached
    return cached


def decode_header(cls: type[T], ext_fields: dict[str, str] | None) -> T:
    """Build header ``cls`` from a request's extFields; raise HeaderError naming a missing required field."""
    # a broker sends the same header with every heartbeat: decode each one once (headers are frozen);
    # a large header (a client chooses its topic name's length) is not worth remembering
    if not ext_fields:
        # cast: a class is hashable, but mypy does not see type[T] as Hashable, which lru_cache asks for
        return _decode_header_memo(cast(Hashable, cls), ())
    if sum(map(len, ext_fields.values())) > _MEMO_MAX_CHARS:
        return _decode_header(cls, ext_fields)
    return _decode_header_memo(cast(Hashable, cls), tuple(ext_fields.items()))


#: the remembered headers then hold at most 4,096 x this many characters of values
_MEMO_MAX_CHARS = 1024


@functools.lru_cache(maxsize=4096)
def _decode_header_memo(cls: type[T], items: tuple[tuple[str, str], ...]) -> T:
    return _decode_header(cls, dict(items))


def _decode_header(cls: type[T], ext: dict[str, str]) -> T:
    values: list[Any] = []
    for _name, java, kind, required in _fields(cls):
        value = ext.get(java)
        if value is not None and kind is not str:
            value = _parse(kind, value)
        if value is None and required:
            raise HeaderError(f"the request header field {java} is missing or not a valid {kind.__name__}")
        values.append(value)
    return cls(*values)


def encode_header(header: Any) -> dict[str, str]:
    """The extFields of a header value: non-None fields as Java's ``String.valueOf`` writes them."""
    out: dict[str, str] = {}
    for name, java, _kind, _required in _fields(type(header)):
        value = getattr(header, name)
        if value is not None:
            out[java] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


@dataclass(frozen=True, slots=True)
class KVConfigHeader:
    """PUT/GET/DELETE_KV_CONFIG and GET_KVLIST_BY_NAMESPACE."""

    namespace: str | None = _java("namespace")
    key: str | None = _java("key")
    value: str | None = _java("value")


@dataclass(frozen=True, slots=True)
class BrokerIdentityHeader:
    """UNREGISTER_BROKER, QUERY_DATA_VERSION and BROKER_HEARTBEAT name a broker the same way."""

    broker_name: str | None = _java("brokerName")
    broker_addr: str = _java("brokerAddr", required=True)
    cluster_name: str = _java("clusterName", required=True)
    broker_id: int | None = _java("brokerId")


@dataclass(frozen=True, slots=True)
class RegisterBrokerHeader:
    broker_name: str = _java("brokerName", required=True)
    broker_addr: str = _java("brokerAddr", required=True)
    cluster_name: str = _java("clusterName", required=True)
    ha_server_addr: str | None = _java("haServerAddr")
    broker_id: int = _java("brokerId", required=True)
    heartbeat_timeout_millis: int | None = _java("heartbeatTimeoutMillis")
    #: absent for 4.x brokers, which is how the name server tells them apart
    enable_acting_master: bool | None = _java("enableActingMaster")
    compressed: bool | None = _java("compressed")
    body_crc32: int | None = _java("bodyCrc32")


@dataclass(frozen=True, slots=True)
class TopicHeader:
    """GET_ROUTEINFO_BY_TOPIC, DELETE_TOPIC_IN_NAMESRV and REGISTER_TOPIC_IN_NAMESRV."""

    topic: str = _java("topic", required=True)
    cluster_name: str | None = _java("clusterName")
    accept_standard_json_only: bool | None = _java("acceptStandardJsonOnly")


@dataclass(frozen=True, slots=True)
class BrokerNameHeader:
    """WIPE/ADD_WRITE_PERM_OF_BROKER."""

    broker_name: str = _java("brokerName", required=True)


@dataclass(frozen=True, slots=True)
class ClusterHeader:
    """GET_TOPICS_BY_CLUSTER."""

    cluster: str = _java("cluster", required=True)


@dataclass(frozen=True, slots=True)
class BrokerMemberGroupHeader:
    cluster_name: str | None = _java("clusterName")
    broker_name: str = _java("brokerName", required=True)


@dataclass(frozen=True, slots=True)
class NotifyMinBrokerIdChangeHeader:
    """NOTIFY_MIN_BROKER_ID_CHANGE, the one request the name server sends (to brokers, oneway).

    Java's header also has ``brokerName``, which the name server never sets and brokers never read.
    """

    min_broker_id: int | None = _java("minBrokerId")
    min_broker_addr: str | None = _java("minBrokerAddr")
    #: the member whose departure changed the minimum; None for a registration
    offline_broker_addr: str | None = _java("offlineBrokerAddr")
    #: the registering member's HA address; None for a departure
    ha_broker_addr: str | None = _java("haBrokerAddr")
