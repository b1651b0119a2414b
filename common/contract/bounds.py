"""What a value of an event or action may be, and how a refused one is named.

Every field of the contract has a :class:`Bound` (:mod:`common.contract.fields` gives each row its
own): an :class:`IntRange`, a :class:`MaxChars`, a :class:`Member` of an enum, or a container of
them (:class:`ListOf`, :class:`MapOf`, :class:`Struct`), checked on the Python value, so the writer
(before it sends) and every reader (after it decodes) apply the same rule.  The limits are version
1's (``docs/events.md``).  The readers (:func:`read_str`, :class:`EnumReader`, ...) turn a JSON
value into the Python value of a field's type; a value that fails either is one
:class:`SchemaError` naming the field, its value shown as :func:`show` shows it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol

# --------------------------------------------------------------------------- limits (docs/events.md)

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


class SchemaError(ValueError):
    """A record that is not a valid version-1 event or action; the message says which field and why."""


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
            raise SchemaError(f"{where}: expected an integer, got {show(x)}")
        if not self.lo <= x <= self.hi:
            raise SchemaError(f"{where}: {show_int(x)} is out of range [{self.lo}, {self.hi}]")


@dataclass(frozen=True, slots=True)
class MaxChars:
    """A string of at most ``chars`` characters."""

    chars: int

    def check(self, x: Any, where: str) -> None:
        if type(x) is not str:
            raise SchemaError(f"{where}: expected a string, got {show(x)}")
        if len(x) > self.chars:
            raise SchemaError(f"{where}: {len(x)} characters, more than the {self.chars} allowed")


@dataclass(frozen=True, slots=True)
class IsBool:
    def check(self, x: Any, where: str) -> None:
        if type(x) is not bool:
            raise SchemaError(f"{where}: expected true or false, got {show(x)}")


@dataclass(frozen=True, slots=True)
class Member:
    """A member of an enum (the decoder turned the text into one)."""

    enum_type: type[enum.Enum]

    def check(self, x: Any, where: str) -> None:
        if not isinstance(x, self.enum_type):
            raise SchemaError(f"{where}: expected a {self.enum_type.__name__}, got {show(x)}")


@dataclass(frozen=True, slots=True)
class ListOf:
    item: Bound

    def check(self, x: Any, where: str) -> None:
        if type(x) is not list:
            raise SchemaError(f"{where}: expected a list, got {show(x)}")
        for i, value in enumerate(x):
            self.item.check(value, f"{where}[{i}]")


@dataclass(frozen=True, slots=True)
class MapOf:
    key: MaxChars
    value: Bound

    def check(self, x: Any, where: str) -> None:
        if type(x) is not dict:
            raise SchemaError(f"{where}: expected a JSON object, got {show(x)}")
        for k, value in x.items():
            self.key.check(k, f"{where} key {show_key(k)}")
            self.value.check(value, f"{where}[{show_key(k)}]")


@dataclass(frozen=True, slots=True)
class Struct:
    """A value object (:class:`QueueInfo`, ...): its type, and (JSON name, attribute path, bound) rows."""

    type: type
    members: tuple[tuple[str, str, Bound], ...]

    def check(self, x: Any, where: str) -> None:
        if not isinstance(x, self.type):
            raise SchemaError(f"{where}: expected a {self.type.__name__}, got {show(x)}")
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


# --------------------------------------------------------------------------- reading JSON values


def read_str(x: Any, where: str) -> str:
    if type(x) is not str:
        raise SchemaError(f"{where}: expected a string, got {show(x)}")
    return x


def read_int(x: Any, where: str) -> int:
    if type(x) is not int:
        raise SchemaError(f"{where}: expected an integer, got {show(x)}")
    return x


def read_bool(x: Any, where: str) -> bool:
    if type(x) is not bool:
        raise SchemaError(f"{where}: expected true or false, got {show(x)}")
    return x


class EnumReader:
    """Reads a member of ``enum_type`` from its text; ``members`` maps each text to its member."""

    def __init__(self, enum_type: type[enum.StrEnum]) -> None:
        self.enum_type = enum_type
        self.members: dict[str, Any] = {m.value: m for m in enum_type}

    def __call__(self, x: Any, where: str) -> Any:
        member = self.members.get(x) if type(x) is str else None
        if member is None:  # not text at all included
            known = ", ".join(self.members)
            raise SchemaError(f"{where}: unknown value {show_value(x)} (known: {known})")
        return member


def read_object(x: Any, where: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise SchemaError(f"{where}: expected a JSON object, got {show(x)}")
    return x


def read_required_int(d: dict[str, Any], key: str, where: str) -> int:
    if key not in d or d[key] is None:
        raise SchemaError(f"{where}.{key}: missing")
    return read_int(d[key], f"{where}.{key}")


def read_optional_int(d: dict[str, Any], key: str, where: str, default: int) -> int:
    value = d.get(key)
    return default if value is None else read_int(value, f"{where}.{key}")


# --------------------------------------------------------------------------- how a refusal shows a value


def show(x: Any) -> str:
    return f"{type(x).__name__} {show_value(x)}"


def show_value(x: Any) -> str:
    """A value as an error message shows it: repr'd, at most 60 characters."""
    if type(x) is int:
        return show_int(x)
    try:
        return _cut(repr(x))
    except RecursionError:
        # JSON nests up to 1024 deep (orjson's limit), deeper than repr may recurse: a hostile
        # record's value must still end in a SchemaError, not stop the caller
        return "<nested too deeply to show>"


def show_int(x: int) -> str:
    # a record given as an already parsed object may hold an int of any size, and str() of one
    # past 4300 digits raises
    return str(x) if x.bit_length() <= 128 else f"<an integer of {x.bit_length()} bits>"


def show_key(k: Any) -> str:
    """A map key as it appears in an error message: repr'd, at most 60 characters."""
    return _cut(repr(k))


def _cut(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."
