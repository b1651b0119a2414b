"""The Spark schema of events and actions, from the field tables: what the job's ``from_json`` reads."""

from __future__ import annotations

from common.contract.fields import ACTION_FIELDS, EVENT_FIELDS, Field


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
