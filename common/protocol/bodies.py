"""Request and response bodies: bytes to the typed values of :mod:`common.protocol.types` and back.

Theory of operation: bodies are fastjson JSON (spec 2.3), except a compressed REGISTER_BROKER body,
which is a zlib stream of length-prefixed pieces (spec 2.3.3).  Readers raise :class:`BodyError` for
anything malformed; the dispatcher answers that with SYSTEM_ERROR, as Java does.  Writers produce
fastjson's legacy dialect unless a caller asks for the standard one (route answers to new clients).
"""

from __future__ import annotations

import functools
import itertools
import re
import struct
import threading
import zlib
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, NamedTuple

import orjson

from common.protocol import fastjson
from common.protocol.codes import FRAME_MAX_LENGTH, Version
from common.protocol.types import BodyError, BrokerData, DataVersion, RegisterBrokerBody, TopicConfig, TopicRouteData

__all__ = [
    "TopicList",
    "RegisterBodyCache",
    "body_crc32",
    "decode_register_broker_body",
    "inflates",
    "encode_register_broker_body",
    "decode_data_version",
    "encode_data_version",
    "encode_route",
    "decode_route",
    "encode_kv_table",
    "decode_kv_table",
    "encode_topic_list",
    "decode_topic_list",
]

#: a registration inflating beyond this is a zip bomb, not a topic table.  Inflated, a topic is a text
#: line of ~40 bytes where the JSON body spends ~150, and the JSON body must fit one 16 MiB frame: so
#: 16 MiB inflated holds four times the topics any uncompressed registration can carry
MAX_INFLATED_SIZE = FRAME_MAX_LENGTH
#: compressed bytes given to zlib at a time while counting: deflate gives at most 1,032 bytes for each,
#: so no piece is over 66 KB (heap memory, reused) and a bomb is refused within a piece of the cap
_INFLATE_STEP_BYTES = 64
_I32 = struct.Struct(">i")
#: first byte of a zlib stream (deflate, 32 KiB window); a JSON body starts with '{'
_ZLIB_FIRST_BYTE = 0x78
_TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")


def body_crc32(body: bytes | None) -> int:
    """The ``bodyCrc32`` brokers send: CRC-32 masked to 31 bits, 0 for no body."""
    return zlib.crc32(body) & 0x7FFFFFFF if body else 0


def _json(body: bytes, what: str) -> Any:
    try:
        return fastjson.loads(body)
    except fastjson.FastjsonError as e:
        raise BodyError(f"{what} body is not JSON: {e}") from None


def _object(value: Any, what: str, *, optional: bool = False) -> dict:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise BodyError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


# ---------------------------------------------------------------------------------------------
# REGISTER_BROKER


def decode_register_broker_body(body: bytes | None, *, compressed: bool, version: int) -> RegisterBrokerBody:
    """What a broker registers, read the way Java's name server reads it for ``version``.

    ``compressed`` is the request header flag; a body that starts like a zlib stream is inflated even
    without it, because 5.x brokers with ``compressedRegister=true`` forget to set the flag.
    """
    ancient = version < Version.V3_0_11  # body is a bare TopicConfigSerializeWrapper, no filter list
    if not body:
        return RegisterBrokerBody(data_version=DataVersion(0, 0, 0), filter_server_list=None if ancient else [])
    if ancient:
        return _from_wrapper(_json(body, "TopicConfigSerializeWrapper"), filter_server_list=None)
    if inflates(body, compressed=compressed, version=version):
        return _decode_compressed(body, version)
    d = _object(_json(body, "RegisterBrokerBody"), "RegisterBrokerBody")
    filters = d.get("filterServerList", [])
    if filters is not None and not isinstance(filters, list):
        raise BodyError("filterServerList must be a JSON array")
    return _from_wrapper(
        _object(d.get("topicConfigSerializeWrapper"), "topicConfigSerializeWrapper", optional=True),
        filter_server_list=None if filters is None else [str(f) for f in filters],
    )


def inflates(body: bytes | None, *, compressed: bool, version: int) -> bool:
    """Whether :func:`decode_register_broker_body` inflates ``body`` (up to 16 MiB, whatever its size)."""
    if not body:
        return False
    return version >= Version.V3_0_11 and (compressed or body[0] == _ZLIB_FIRST_BYTE)


def _from_wrapper(wrapper: Any, *, filter_server_list: list[str] | None) -> RegisterBrokerBody:
    w = _object(wrapper, "topicConfigSerializeWrapper")
    table = _object(w.get("topicConfigTable"), "topicConfigTable", optional=True)
    mappings = _object(w.get("topicQueueMappingInfoMap"), "topicQueueMappingInfoMap", optional=True)
    return RegisterBrokerBody(
        data_version=DataVersion.from_wire(w.get("dataVersion")),
        topic_config_table={str(name): TopicConfig.from_wire(tc, str(name)) for name, tc in table.items()},
        filter_server_list=filter_server_list,
        topic_queue_mapping_info_map={str(k): v for k, v in mappings.items()},
    )


#: what a broker without filter servers sends first (fastjson sorts keys), up to the DataVersion's value
_PLAIN_PREFIX = b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":'
#: that DataVersion as fastjson writes it: no strings, no nesting, so its end is where the match ends
_PLAIN_DATA_VERSION = re.compile(rb'\{"counter":(\d{1,19}),"stateVersion":(\d{1,19}),"timestamp":(\d{1,19})\}')
#: a tail holding any of these is never remembered: an escape could spell either key, and either key
#: could give the document another DataVersion than the one the prefix led to
_REDEFINES = (b"\\", b'"dataVersion"', b'"topicConfigSerializeWrapper"')


class RegisterBodyCache:
    """The topic tables brokers registered last, so an unchanged one is not parsed again.

    Theory of operation: a broker re-registers its whole topic table every 30 s, and with it a
    DataVersion that changes whenever any topic does; parsing 1,000 topics into TopicConfig objects
    costs milliseconds, most of a registration.  A plain body (no filter servers: the common shape,
    ``_PLAIN_PREFIX``) is cut after its DataVersion, whose strict form (digits only) cannot hide a
    quote or brace; everything after it, the tail, is kept.  Same broker, same tail byte for byte
    (one memory comparison, cheaper than hashing the tail): the same document but for the
    DataVersion, so the parse of the last registration is reused with the new DataVersion and its
    ``table_id``.  A tail that could redefine the DataVersion (a later ``"dataVersion"`` key, or any
    escape, which could spell one) is never cached, so the reuse is exact.  Any other shape
    (compressed, filter servers, old versions) is parsed as before.

    Bounded: at most :data:`MAX_TAIL_BYTES` of tails are remembered (oldest out first), one entry
    per (cluster, address); a parsed body is read-only once returned (nothing mutates a decoded
    table), so entries are shared between registrations.  Thread-safe: the worker thread and the
    loop both decode.
    """

    #: sum of the tails of the remembered bodies; what each costs in memory beside its tail, and what the
    #: cache pays, is in docs/internals/caches.md
    MAX_TAIL_BYTES = 16 * 1024 * 1024

    def __init__(self, max_tail_bytes: int = MAX_TAIL_BYTES) -> None:
        self.max_tail_bytes = max_tail_bytes
        #: key -> (tail, its parse)
        self._entries: dict[Hashable, tuple[bytes, RegisterBrokerBody]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        #: registrations answered from the cache / parsed in full while cacheable (for tests and stats)
        self.hits = self.misses = 0

    def decode(self, key: Hashable, body: bytes | None, *, compressed: bool, version: int) -> RegisterBrokerBody:
        """:func:`decode_register_broker_body`, reusing ``key``'s last parse when only its DataVersion changed."""
        split = self._split(body, compressed, version)
        if split is None:
            return decode_register_broker_body(body, compressed=compressed, version=version)
        assert body is not None
        data_version, tail_at = split
        entry = self._entries.get(key)
        if entry is not None and _same_tail(body, tail_at, entry[0]):
            self.hits += 1
            return _with_data_version(entry[1], data_version)
        decoded = decode_register_broker_body(body, compressed=False, version=version)
        self.misses += 1
        # no escape, no second DataVersion or wrapper in the tail: nothing there can redefine the DataVersion
        exact = all(body.find(word, tail_at) < 0 for word in _REDEFINES)
        if exact and decoded.data_version == data_version:
            self._remember(key, body[tail_at:], decoded)
        return decoded

    def reuse(self, key: Hashable, body: bytes | None, *, compressed: bool, version: int) -> RegisterBrokerBody | None:
        """``key``'s last parse with this body's DataVersion if only that changed, else None (nothing parsed)."""
        split = self._split(body, compressed, version)
        if split is None:
            return None
        assert body is not None
        entry = self._entries.get(key)
        if entry is None or not _same_tail(body, split[1], entry[0]):
            return None
        self.hits += 1
        return _with_data_version(entry[1], split[0])

    @staticmethod
    def _split(body: bytes | None, compressed: bool, version: int) -> tuple[DataVersion, int] | None:
        """(DataVersion, where the tail starts) of a plain body; None for any other shape."""
        if compressed or not body or version < Version.V3_0_11 or not body.startswith(_PLAIN_PREFIX):
            return None
        m = _PLAIN_DATA_VERSION.match(body, len(_PLAIN_PREFIX))
        if m is None:
            return None
        return DataVersion(int(m[1]), int(m[2]), int(m[3])), m.end()

    def _remember(self, key: Hashable, tail: bytes, decoded: RegisterBrokerBody) -> None:
        if len(tail) > self.max_tail_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old[0])
            while self._entries and self._bytes + len(tail) > self.max_tail_bytes:
                evicted = self._entries.pop(next(iter(self._entries)))
                self._bytes -= len(evicted[0])
            # shared from now on: the route tables may skip rows already written from this table
            decoded.table_id = next(_TABLE_IDS)
            self._entries[key] = (tail, decoded)
            self._bytes += len(tail)

    def __len__(self) -> int:
        return len(self._entries)


#: RegisterBrokerBody.table_id of each remembered parse; never reused, 0 is "not shared"
_TABLE_IDS = itertools.count(1)


def _same_tail(body: bytes, tail_at: int, tail: bytes) -> bool:
    return len(body) - tail_at == len(tail) and body.startswith(tail, tail_at)


def _with_data_version(cached: RegisterBrokerBody, data_version: DataVersion) -> RegisterBrokerBody:
    return RegisterBrokerBody(
        data_version,
        cached.topic_config_table,
        cached.filter_server_list,
        cached.topic_queue_mapping_info_map,
        cached.table_id,
    )


class _Reader:
    """Length-prefixed pieces of an inflated registration; every short read is a BodyError."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def int32(self, what: str) -> int:
        if len(self.data) - self.pos < 4:
            raise BodyError(f"compressed RegisterBrokerBody ends before the {what}")
        (value,) = _I32.unpack_from(self.data, self.pos)
        self.pos += 4
        return value

    def chunk(self, what: str) -> bytes:
        length = self.int32(f"length of the {what}")
        if length < 0 or length > len(self.data) - self.pos:
            raise BodyError(f"compressed RegisterBrokerBody: {what} length {length} exceeds the data")
        self.pos += length
        return self.data[self.pos - length : self.pos]

    def count(self, what: str) -> int:
        n = self.int32(f"{what} count")
        if n < 0:
            raise BodyError(f"compressed RegisterBrokerBody: negative {what} count {n}")
        return n


def _inflate(body: bytes) -> bytes:
    """The inflated body, or a BodyError as soon as it passes MAX_INFLATED_SIZE.

    Inflated twice: first a few bytes at a time, each piece counted and dropped, so that refusing a
    bomb costs the cap's worth of inflating and never a large buffer to fill, copy or free (each of
    those holds the GIL); then, within the cap, at once into memory of the size counted.
    """
    inflater = zlib.decompressobj()
    view = memoryview(body)
    size = 0
    try:
        for start in range(0, len(body), _INFLATE_STEP_BYTES):
            size += len(inflater.decompress(view[start : start + _INFLATE_STEP_BYTES]))
            if size > MAX_INFLATED_SIZE:
                raise BodyError(f"compressed RegisterBrokerBody inflates beyond {MAX_INFLATED_SIZE} bytes")
            if inflater.eof:
                return zlib.decompress(body, bufsize=max(size, 1))
    except zlib.error as e:
        raise BodyError(f"compressed RegisterBrokerBody is not a zlib stream: {e}") from None
    raise BodyError("compressed RegisterBrokerBody is truncated")


def _decode_compressed(body: bytes, version: int) -> RegisterBrokerBody:
    r = _Reader(_inflate(body))
    data_version = DataVersion.from_wire(_json(r.chunk("dataVersion"), "dataVersion"))
    topics: dict[str, TopicConfig] = {}
    for _ in range(r.count("topic")):
        tc = _decode_topic_line(r.chunk("topic config"))
        topics[tc.topic_name] = tc
    filters = _json(r.chunk("filter server list"), "filterServerList")
    if not isinstance(filters, list):
        raise BodyError("filterServerList must be a JSON array")
    mappings: dict[str, Any] = {}
    # 5.0 added this section; a body that simply ends before it carries no mappings
    if version >= Version.V5_0_0 and not r.at_end():
        for _ in range(r.count("mapping")):
            info = _object(_json(r.chunk("mapping"), "TopicQueueMappingInfo"), "TopicQueueMappingInfo")
            topic = info.get("topic")
            if not isinstance(topic, str):
                raise BodyError("compressed RegisterBrokerBody: a TopicQueueMappingInfo without a topic")
            mappings[topic] = info
    return RegisterBrokerBody(data_version, topics, [str(f) for f in filters], mappings)


def _decode_topic_line(raw: bytes) -> TopicConfig:
    """``name read write perm filterType [attributesJSON]``, split on single spaces as Java does."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BodyError("compressed topic config line is not UTF-8") from None
    parts = line.split(" ")
    while parts and parts[-1] == "":  # Java's split drops trailing empty strings
        parts.pop()
    if len(parts) < 5:
        raise BodyError(f"compressed topic config line {line!r} has fewer than 5 fields")
    name, read, write, perm, filter_type = parts[:5]
    if filter_type not in _TOPIC_FILTER_TYPES:
        raise BodyError(f"compressed topic config line {line!r}: unknown topicFilterType {filter_type!r}")
    try:
        numbers = int(read), int(write), int(perm)
    except ValueError:
        raise BodyError(f"compressed topic config line {line!r}: queue numbers and perm must be integers") from None
    attributes: dict[str, str] = {}
    if len(parts) > 5:
        # Java ignores attributes it cannot parse (e.g. cut by a space inside them)
        try:
            parsed = fastjson.loads(parts[5])
        except fastjson.FastjsonError:
            parsed = None
        if isinstance(parsed, dict):
            attributes = {str(k): str(v) for k, v in parsed.items()}
    return TopicConfig(
        topic_name=name,
        read_queue_nums=numbers[0],
        write_queue_nums=numbers[1],
        perm=numbers[2],
        topic_filter_type=filter_type,
        attributes=attributes,
    )


def encode_register_broker_body(
    rb: RegisterBrokerBody, *, compressed: bool = False, version: int = Version.CURRENT
) -> bytes:
    """The body a broker of ``version`` sends (used by our test brokers and tools)."""
    if compressed:
        return zlib.compress(_compressed_plaintext(rb, version), 9)
    wrapper = {
        "dataVersion": rb.data_version.to_wire(),
        "topicConfigTable": {name: tc.to_wire() for name, tc in rb.topic_config_table.items()},
        "topicQueueMappingInfoMap": rb.topic_queue_mapping_info_map,
    }
    if version < Version.V3_0_11:
        return fastjson.dumps_legacy(wrapper)
    return fastjson.dumps_legacy(
        {"filterServerList": rb.filter_server_list or [], "topicConfigSerializeWrapper": wrapper}
    )


def _compressed_plaintext(rb: RegisterBrokerBody, version: int) -> bytes:
    out = bytearray()

    def chunk(data: bytes) -> None:
        out.extend(_I32.pack(len(data)))
        out.extend(data)

    chunk(encode_data_version(rb.data_version))
    out.extend(_I32.pack(len(rb.topic_config_table)))
    for tc in rb.topic_config_table.values():
        attributes = fastjson.dumps_legacy(tc.attributes).decode()
        fields = (tc.topic_name, tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_filter_type, attributes)
        chunk(" ".join(map(str, fields)).encode())
    chunk(fastjson.dumps_legacy(rb.filter_server_list or []))
    if version >= Version.V5_0_0:
        out.extend(_I32.pack(len(rb.topic_queue_mapping_info_map)))
        for info in rb.topic_queue_mapping_info_map.values():
            chunk(fastjson.dumps_legacy(info))
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Small bodies


def decode_data_version(body: bytes | None) -> DataVersion | None:
    """A QUERY_DATA_VERSION body; None when the request has none."""
    if not body:
        return None
    return _decode_data_version(body) if len(body) <= _SMALL_BODY else DataVersion.from_wire(_json(body, "DataVersion"))


#: a broker heartbeats with the same DataVersion until its topics change: remember small ones
_SMALL_BODY = 256


@functools.lru_cache(maxsize=4096)
def _decode_data_version(body: bytes) -> DataVersion:
    return DataVersion.from_wire(_json(body, "DataVersion"))


@functools.lru_cache(maxsize=4096)
def encode_data_version(dv: DataVersion) -> bytes:
    # three ASCII keys already in fastjson's order: orjson writes the same bytes, much faster
    return orjson.dumps(dv.to_wire())


def encode_route(
    route: TopicRouteData, *, standard: bool, made: dict[bytes, bytes] | None = None, fastjson2: bool = False
) -> bytes:
    """A GET_ROUTEINFO_BY_TOPIC answer; ``standard`` for request version >= 401 or acceptStandardJsonOnly,
    written as Apache 5.4.0 and later write it when ``fastjson2`` (request version >= 5.4.0's).

    ``made``: answers already encoded, for encoding many routes at once. A route does not name its
    topic, so the topics of a group with the same queue counts share one answer (a full write of
    the job's 100,000 topics encodes a few thousand). The key is orjson's rendering of the wire
    form, a sixth of the cost of encoding it: equal renderings are equal routes.
    """
    wire = route.to_wire()
    write = (
        (fastjson.dumps_standard_fastjson2 if fastjson2 else fastjson.dumps_standard)
        if standard
        else fastjson.dumps_legacy
    )
    if made is None:
        return write(wire)
    key = orjson.dumps(wire, option=orjson.OPT_NON_STR_KEYS) + (
        b"2" if standard and fastjson2 else b"s" if standard else b"l"
    )
    answer = made.get(key)
    if answer is None:
        answer = made[key] = write(wire)
    return answer


def decode_route(body: bytes | None) -> TopicRouteData:
    if not body:
        raise BodyError("a route answer needs a body")
    return TopicRouteData.from_wire(_json(body, "TopicRouteData"))


class ClusterInfo(NamedTuple):
    """GET_BROKER_CLUSTER_INFO: broker groups by name, and the group names of each cluster."""

    broker_addr_table: dict[str, BrokerData]
    cluster_addr_table: dict[str, list[str]]


def encode_cluster_info(
    broker_addr_table: Mapping[str, BrokerData], cluster_addr_table: Mapping[str, Iterable[str]]
) -> bytes:
    """Always the legacy dialect, for every client version (https://github.com/apache/rocketmq/issues/3369 is still open)."""
    return fastjson.dumps_legacy(
        {
            "brokerAddrTable": {name: b.to_wire() for name, b in broker_addr_table.items()},
            "clusterAddrTable": {name: sorted(members) for name, members in cluster_addr_table.items()},
        }
    )


def decode_cluster_info(body: bytes | None) -> ClusterInfo:
    d = _object(_json(body, "ClusterInfo"), "ClusterInfo") if body else {}
    brokers = _object(d.get("brokerAddrTable"), "brokerAddrTable", optional=True)
    clusters = _object(d.get("clusterAddrTable"), "clusterAddrTable", optional=True)
    return ClusterInfo(
        {str(name): BrokerData.from_wire(b) for name, b in brokers.items()},
        {str(name): [str(m) for m in members or []] for name, members in clusters.items()},
    )


def encode_broker_member_group(
    cluster_name: str | None, broker_name: str | None, broker_addrs: dict[int, str]
) -> bytes:
    """GET_BROKER_MEMBER_GROUP, legacy dialect (bare integer broker ids)."""
    group = {"brokerAddrs": dict(broker_addrs), "brokerName": broker_name, "cluster": cluster_name}
    return fastjson.dumps_legacy({"brokerMemberGroup": group})


def encode_kv_table(table: dict[str, str]) -> bytes:
    return fastjson.dumps_legacy({"table": table})


def decode_kv_table(body: bytes | None) -> dict[str, str]:
    if not body:
        return {}
    d = _object(_json(body, "KVTable"), "KVTable")
    table = _object(d.get("table"), "table", optional=True)
    return {str(k): str(v) for k, v in table.items() if v is not None}


class TopicList(NamedTuple):
    topics: list[str]
    #: only in GET_SYSTEM_TOPIC_LIST_FROM_NS answers
    broker_addr: str | None = None


def encode_topic_list(topics: Iterable[str], broker_addr: str | None = None) -> bytes:
    return fastjson.dumps_legacy({"brokerAddr": broker_addr, "topicList": list(topics)})


def decode_topic_list(body: bytes | None) -> TopicList:
    if not body:
        return TopicList([])
    d = _object(_json(body, "TopicList"), "TopicList")
    topics = d.get("topicList", [])
    if not isinstance(topics, list):
        raise BodyError("topicList must be a JSON array")
    addr = d.get("brokerAddr")
    return TopicList([str(t) for t in topics], None if addr is None else str(addr))
