"""The node<->monitor contract: the JSON that name-server nodes and the streaming monitor exchange
through Kafka (version 1), and its clock.

An :class:`Event` (topic ``eventsTopic``) is what one node saw a broker do, or a TICK carrying its
clock; an :class:`Action` (topic ``actionsTopic``) is what the monitor decided (EXPIRE, REMOVE) or
its MONITOR_HEARTBEAT.  One module per concern:

* :mod:`~common.contract.bounds`: what a value may be (:class:`IntRange`, :class:`MaxChars`, ...),
  the limits of version 1, and :class:`SchemaError`;
* :mod:`~common.contract.records`: the records, their enums and value types;
* :mod:`~common.contract.fields`: the field tables (``EVENT_FIELDS``, ``ACTION_FIELDS``), one
  :class:`Field` row per JSON field, from which everything else derives;
* :mod:`~common.contract.codec`: encoding, strict decoding and the Kafka keys;
* :mod:`~common.contract.ddl`: the Spark schema (:func:`event_ddl`, :func:`action_ddl`);
* :mod:`~common.contract.clock`: :func:`wall_ms`, the unit of every time in a record.

This package is the bottom layer: it imports only the standard library and ``orjson``, nothing of
the node (``namesrv``), the monitor (``streaming``) or the rest of ``common``, so Spark's Python
workers import it without the node (``tests/unit/test_shape.py`` holds it to that).  Callers import
from here; the contract's own tests reach into its modules.  ``docs/events.md`` is the reader's
guide to the rules of version 1, ``docs/internals/event-pipeline.md`` says why it is built this way.
"""

from common.contract.bounds import (
    EPOCH_MILLIS,
    HEARTBEAT_TIMEOUT,
    LONG,
    MAX_EPOCH_MILLIS,
    MAX_HEARTBEAT_TIMEOUT_MILLIS,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_TEXT_CHARS,
    MIN_HEARTBEAT_TIMEOUT_MILLIS,
    NAME,
    Bound,
    IntRange,
    IsBool,
    MaxChars,
    Member,
    SchemaError,
)
from common.contract.clock import wall_ms
from common.contract.codec import (
    action_key,
    check_action,
    check_event,
    decode_action,
    decode_event,
    decode_event_values,
    encode_action,
    encode_event,
    event_key,
)
from common.contract.ddl import action_ddl, action_field_types, event_ddl, event_field_types
from common.contract.fields import ACTION_FIELDS, EVENT_FIELDS, Field
from common.contract.records import (
    VERSION,
    Action,
    ActionType,
    AdminOp,
    BrokerQueueInfo,
    DataVersionInfo,
    Event,
    EventType,
    HeartbeatSource,
    QueueInfo,
    UnregisterSource,
    is_light,
)

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
    "Bound",
    "IntRange",
    "MaxChars",
    "IsBool",
    "Member",
    "EPOCH_MILLIS",
    "LONG",
    "NAME",
    "HEARTBEAT_TIMEOUT",
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
