"""Events and actions to JSON bytes and back, each value checked against its field's bound.

:func:`encode_event` writes the fields present, compact; :func:`check_event` refuses before it is
sent what :func:`decode_event` would refuse once read (a bound, a required field, an unknown
source), so a node never writes a record a reader refuses; the same pair exists for actions.
Decoding walks the keys a record carries with a plan made once from the field table
(:func:`_decode_plan`): plain strings, integers, booleans and enum texts are checked inline, and a
refused value is handed to the table walk (:func:`_walk_fields`, the reference) for its message.
:func:`event_key` and :func:`action_key` are the records' Kafka keys.
``docs/internals/event-pipeline.md`` has the figures behind the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from common.contract.bounds import (
    Bound,
    EnumReader,
    IntRange,
    IsBool,
    MaxChars,
    Member,
    SchemaError,
    read_bool,
    read_int,
    read_str,
    show,
    show_value,
)
from common.contract.fields import (
    ACTION_FIELDS,
    ACTION_REQUIRED,
    ADMIN_REQUIRED,
    EVENT_FIELDS,
    EVENT_REQUIRED,
    SOURCES,
    Field,
)
from common.contract.records import VERSION, Action, ActionType, Event, EventType

# --------------------------------------------------------------------------- what each record must carry


_SOURCE_READERS = {etype: EnumReader(source) for etype, source in SOURCES.items()}
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
        if f.read is read_str and type(b) is MaxChars:
            step = (_STR, b.chars, None)
        elif f.read is read_int and type(b) is IntRange:
            step = (_INT, b.lo, b.hi)
        elif f.read is read_bool and type(b) is IsBool:
            step = (_BOOL, None, None)
        elif type(f.read) is EnumReader and type(b) is Member and b.enum_type is f.read.enum_type:
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
        raise SchemaError(f"{what}: expected a JSON object, got {show(raw)}")
    v = raw.get("v")
    if v != VERSION or type(v) is not int:
        raise SchemaError(f"{what}.v: unsupported schema version {show_value(v)}; this reader knows {VERSION}")
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
