"""The machinery behind every option table: the node's, the streaming job's and the local services'.

Each table stays next to what it configures, because the tables are the documentation
(:class:`namesrv.config.NamesrvConfig`, :data:`streaming.config.OPTIONS`,
:data:`infra.config.OPTIONS`).  What they share lives here, so that a value means the same thing
in every file: one error (:class:`ConfigError`), one message shape for a value that does not parse
(:func:`convert`), typed converters (:class:`Converter`), one boolean syntax (:func:`parse_bool`),
Java's integer syntax, and one way to keep a secret out of the file that names it
(:func:`resolve_secret`: ``${env:NAME}``, ``${file:PATH}``).  Each table keeps its own documented
policy for keys it does not know.  This module imports only the standard library.
``docs/internals/config.md`` has the details.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = [
    "ConfigError",
    "Converter",
    "Option",
    "BOOLEAN",
    "BOOLEAN_EXPECTED",
    "convert",
    "parse_bool",
    "parse_integer",
    "integer",
    "choice",
    "text",
    "port",
    "resolve_secret",
    "is_secret_reference",
    "MAX_SECRET_FILE_BYTES",
]

T = TypeVar("T")

#: how every boolean is described in an error and a table
BOOLEAN_EXPECTED = "boolean (true or false, any case)"
# Integer.parseInt / Long.parseLong: optional sign, digits, nothing else
_INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)
_LONG_MAX = 2**63 - 1
#: ``${env:NAME}`` / ``${file:PATH}``: where a secret comes from instead of the file that names it
_SECRET_REFERENCE = re.compile(r"\$\{(env|file):([^}]+)\}")
#: a secret file is a password or a URL, not a document
MAX_SECRET_FILE_BYTES = 64 * 1024


class ConfigError(ValueError):
    """A configuration file, key or value that cannot be used; the message names it and says what to fix."""


@dataclass(frozen=True)
class Converter(Generic[T]):
    """Text of a value to a typed value; ``parse`` raises ``ValueError`` for text it refuses."""

    parse: Callable[[str], T]
    #: what a valid value looks like, for the error message ("int (0..65535)", "milliseconds")
    expected: str

    def __call__(self, raw: str) -> T:
        return self.parse(raw)


@dataclass(frozen=True)
class Option:
    """A row of a table whose keys set attributes of a frozen config dataclass (the job's, the services').

    The node's table has richer rows (Java type, group, effect), derived from its dataclass fields.
    """

    key: str
    attr: str
    convert: Converter[Any]
    doc: str


def convert(source: str, key: str, raw: str, converter: Converter[T]) -> T:
    """``converter(raw)``, or a :class:`ConfigError` in the one message shape naming key, value and type."""
    try:
        return converter.parse(raw)
    except ValueError:
        raise ConfigError(f"{source}: {key}={raw!r} is not a valid {converter.expected}") from None


def parse_bool(raw: str) -> bool:
    """``true`` or ``false`` in any case, blanks around ignored; anything else raises ``ValueError``."""
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(raw)
    return value == "true"


BOOLEAN: Converter[bool] = Converter(parse_bool, BOOLEAN_EXPECTED)


def parse_integer(raw: str, low: int, high: int) -> int:
    """Java's integer syntax (``raw`` is not stripped: callers decide), within ``low..high``."""
    if not _INTEGER.fullmatch(raw):
        raise ValueError(raw)
    value = int(raw)
    if not low <= value <= high:
        raise ValueError(raw)
    return value


def integer(low: int, high: int = _LONG_MAX, expected: str | None = None) -> Converter[int]:
    """An integer in ``low..high``; ``expected`` names it (default: ``integer (low..high)``)."""
    return Converter(lambda raw: parse_integer(raw.strip(), low, high), expected or f"integer ({low}..{high})")


def choice(*values: str, fold: Callable[[str], str] = str.lower) -> Converter[str]:
    """One of ``values``, compared after ``fold`` (the values are written folded)."""

    def parse(raw: str) -> str:
        value = fold(raw.strip())
        if value not in values:
            raise ValueError(raw)
        return value

    return Converter(parse, "one of " + ", ".join(values))


def text(*, required: bool = False, max_chars: int | None = None, expected: str = "text") -> Converter[str]:
    """Any text, stripped; ``required`` refuses an empty one, ``max_chars`` a longer one."""

    def parse(raw: str) -> str:
        value = raw.strip()
        if required and not value:
            raise ValueError("empty")
        if max_chars is not None and len(value) > max_chars:
            raise ValueError("too long")
        return value

    return Converter(parse, expected)


def port(*, allow_zero: bool = False) -> Converter[int]:
    """A TCP port; 0 (the kernel picks one) only with ``allow_zero``."""
    low = 0 if allow_zero else 1
    return integer(low, 65535, f"TCP port ({low}..65535)")


def is_secret_reference(raw: str) -> bool:
    """True when ``raw`` is ``${env:NAME}`` or ``${file:PATH}`` (safe to show: it holds no secret)."""
    return _SECRET_REFERENCE.fullmatch(raw.strip()) is not None


def resolve_secret(raw: str, key: str, source: str) -> str:
    """``raw``, or what ``${env:NAME}`` / ``${file:PATH}`` points at; :class:`ConfigError` naming ``key``.

    The message never contains the secret itself, only where it was looked for.
    """
    match = _SECRET_REFERENCE.fullmatch(raw.strip())
    if match is None:
        return raw
    kind, where = match.group(1), match.group(2).strip()
    if kind == "env":
        value = os.environ.get(where)
        if value is None:
            raise ConfigError(f"{source}: {key} names environment variable {where}, which is not set")
        return value
    try:
        with open(where, "rb") as fh:
            data = fh.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{source}: {key} names file {where}, which cannot be read ({exc.strerror})") from None
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"{source}: {key} names file {where}, which is larger than {MAX_SECRET_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: {key} names file {where}, which is not UTF-8 text") from None
    # editors end files with a line break; a secret never does
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
