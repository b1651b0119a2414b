"""The two JSON dialects Java RocketMQ peers speak through fastjson 1.2.x.

fastjson is not JSON: by default it writes map keys that are not strings without quotes
(``{0:"127.0.0.1:10911"}``) and reads them back, and RocketMQ uses such maps for broker ids and
static-topic queue ids.  :func:`loads` parses standard JSON with orjson and, only when that fails,
with a small parser that also takes bare keys and trailing commas (a regex that quotes keys would
be wrong: string values may contain ``{0:``).  :func:`dumps_legacy` writes fastjson's default
output; :func:`dumps_standard` the dialect route answers use for clients from 4.9.4 on (ASCII only,
``/`` escaped, long integers as strings).  Both sort map keys and leave out ``None`` values, as
fastjson does.  ``docs/internals/codec.md`` has the details.
"""

from __future__ import annotations

import json
import re
from enum import Enum

# typeshed does not list json.decoder.scanstring, which the module defines (the C scanner or its Python twin)
from json.decoder import scanstring  # type: ignore[attr-defined]
from json.encoder import encode_basestring
from typing import Any

import orjson

__all__ = ["FastjsonError", "loads", "dumps_legacy", "dumps_standard", "dumps_standard_fastjson2"]

#: fastjson's BrowserCompatible writes longs outside +-(2^53-1) as strings
_JS_SAFE_MAX = 2**53 - 1
_INF = float("inf")
#: deeper nesting than any RocketMQ body has; guards the recursive parser against stack exhaustion
_MAX_DEPTH = 256
#: a Java long has 19 digits; fastjson reads longer ones as BigInteger, which no RocketMQ field is
_MAX_INT_DIGITS = 64


class FastjsonError(ValueError):
    """Text that neither JSON nor fastjson's dialect can parse; ``pos`` is the character offset."""

    def __init__(self, msg: str, pos: int | None = None) -> None:
        self.msg = msg
        self.pos = pos
        super().__init__(msg if pos is None else f"{msg} at character {pos}")


# ---------------------------------------------------------------------------------------------
# Reading

_WS = re.compile(r"[ \t\n\r\f\b]*")


def _skip_ws(text: str, pos: int) -> int:
    """Where the whitespace from ``pos`` ends (``_WS`` matches everywhere, the empty string included)."""
    m = _WS.match(text, pos)
    assert m is not None
    return m.end()


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_INT_KEY = re.compile(r"-?[0-9]+")
_NAME_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_LITERALS = {"true": True, "false": False, "null": None}


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON or fastjson output; raise :class:`FastjsonError` on anything else."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise FastjsonError(f"not UTF-8 ({e.reason})", e.start) from None
    try:
        value, end = _value(text, _skip_ws(text, 0), 0)
    except RecursionError:
        raise FastjsonError("nesting too deep") from None
    end = _skip_ws(text, end)
    if end != len(text):
        raise FastjsonError("extra data after the JSON value", end)
    return value


def _value(s: str, i: int, depth: int) -> tuple[Any, int]:
    """Parse one value starting exactly at ``s[i]``; return it and the index after it."""
    c = s[i : i + 1]
    if c == '"':
        try:
            return scanstring(s, i + 1, False)
        except json.JSONDecodeError as e:
            raise FastjsonError(e.msg, e.pos) from None
    if c == "{":
        return _object(s, i + 1, depth + 1)
    if c == "[":
        return _array(s, i + 1, depth + 1)
    m = _NUMBER.match(s, i)
    if m:
        text = m.group()
        if m.group(1) or m.group(2):
            return float(text), m.end()
        return _int(text, i), m.end()
    for word, value in _LITERALS.items():
        if s.startswith(word, i):
            return value, i + len(word)
    raise FastjsonError("expected a JSON value" if c else "unexpected end of text", i)


def _int(text: str, pos: int) -> int:
    if len(text) > _MAX_INT_DIGITS:  # Python refuses past 4,300 digits anyway, after a long parse
        raise FastjsonError(f"integer of {len(text)} digits is longer than any Java number", pos)
    return int(text)


def _object(s: str, i: int, depth: int) -> tuple[dict, int]:
    if depth > _MAX_DEPTH:
        raise FastjsonError("nesting too deep", i)
    out: dict[Any, Any] = {}
    i = _skip_ws(s, i)
    while s[i : i + 1] != "}":
        key, i = _key(s, i)
        i = _skip_ws(s, i)
        if s[i : i + 1] != ":":
            raise FastjsonError("expected ':' after an object key", i)
        i = _skip_ws(s, i + 1)
        out[key], i = _value(s, i, depth)
        i = _skip_ws(s, i)
        c = s[i : i + 1]
        if c == ",":
            i = _skip_ws(s, i + 1)  # a trailing comma is fine, as in fastjson
        elif c != "}":
            raise FastjsonError("expected ',' or '}' in an object", i)
    return out, i + 1


def _key(s: str, i: int) -> tuple[Any, int]:
    if s[i : i + 1] == '"':
        try:
            return scanstring(s, i + 1, False)
        except json.JSONDecodeError as e:
            raise FastjsonError(e.msg, e.pos) from None
    m = _INT_KEY.match(s, i)
    if m:
        return _int(m.group(), i), m.end()
    m = _NAME_KEY.match(s, i)
    if m:
        return m.group(), m.end()
    raise FastjsonError("expected an object key" if i < len(s) else "unexpected end of text", i)


def _array(s: str, i: int, depth: int) -> tuple[list, int]:
    if depth > _MAX_DEPTH:
        raise FastjsonError("nesting too deep", i)
    out: list[Any] = []
    i = _skip_ws(s, i)
    while s[i : i + 1] != "]":
        item, i = _value(s, i, depth)
        out.append(item)
        i = _skip_ws(s, i)
        c = s[i : i + 1]
        if c == ",":
            i = _skip_ws(s, i + 1)
        elif c != "]":
            raise FastjsonError("expected ',' or ']' in an array", i)
    return out, i + 1


# ---------------------------------------------------------------------------------------------
# Writing


def dumps_legacy(obj: Any) -> bytes:
    """fastjson's default output: integer map keys bare (``{0:"a"}``), raw UTF-8, ``/`` raw."""
    prepared = _prepare(obj, standard=False)
    try:
        return orjson.dumps(prepared)
    except orjson.JSONEncodeError:
        # orjson refuses integer keys (and lone surrogates, and ints beyond 64 bits): write it ourselves
        out: list[str] = []
        _emit_legacy(prepared, out)
        # a lone surrogate becomes '?', as Java's String.getBytes(UTF_8) does
        return "".join(out).encode("utf-8", "replace")


def dumps_standard(obj: Any) -> bytes:
    """Strict, browser-safe JSON as Java route answers for clients >= 4.9.4 (pure ASCII), up to 5.3.3:
    fastjson's BrowserCompatible (5.4.0 and later: :func:`dumps_standard_fastjson2`)."""
    prepared = _prepare(obj, standard=True)
    try:
        # orjson writes what json.dumps(ensure_ascii=True) writes whenever its output is ASCII without
        # DEL (the same short escapes, control characters as lower-case \u00xx), at a twentieth of the
        # cost; DEL (0x7f) it leaves raw, where json.dumps writes \u007f
        raw = orjson.dumps(prepared)
    except orjson.JSONEncodeError:  # a lone surrogate
        raw = b"\x80"
    fast = raw.isascii() and b"\x7f" not in raw
    text = raw.decode("ascii") if fast else json.dumps(prepared, ensure_ascii=True, separators=(",", ":"))
    if "\\u" in text:
        text = _LOWER_HEX_ESCAPE.sub(_upper_hex, text)
    # JSON text has '/' only inside strings, so escaping every one is safe
    return text.replace("/", "\\/").encode("ascii")


def dumps_standard_fastjson2(obj: Any) -> bytes:
    """The standard dialect as Apache RocketMQ 5.4.0 and later write it, with fastjson2's BrowserCompatible:
    maps sorted, integer keys and JavaScript-unsafe longs as strings, as :func:`dumps_standard`, but
    non-ASCII, ``/`` and DEL raw in UTF-8, control characters as lower-case ``\\u00xx``, and a lone
    surrogate as ``?``."""
    prepared = _prepare(obj, standard=True)
    try:
        return orjson.dumps(prepared)
    except orjson.JSONEncodeError:  # a lone surrogate
        text = json.dumps(prepared, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8", "replace")


#: a ``\\uxxxx`` escape, or an escaped backslash consumed first so ``\\\\u00e9`` (text) is skipped
_LOWER_HEX_ESCAPE = re.compile(r"\\\\|\\u([0-9a-f]{4})")


def _upper_hex(m: re.Match[str]) -> str:
    hexdigits = m.group(1)
    return m.group() if hexdigits is None else "\\u" + hexdigits.upper()


def _prepare(obj: Any, standard: bool) -> Any:
    """A copy with maps sorted and stripped of nulls, ready for a C encoder.

    ``standard`` also turns integer keys and JavaScript-unsafe longs into strings.
    """
    # exact types first: every route and cluster answer goes through here, and a type check is a
    # third of an isinstance chain; subclasses (IntEnum, str enums, sets) take the general path
    kind = type(obj)
    if kind is str or kind is bool or obj is None:
        return obj
    if kind is dict:
        items = [(k, v) for k, v in obj.items() if v is not None]
        try:
            items.sort()  # keys are unique, so the pairs compare by key alone
        except TypeError:  # mixed key types: integer keys numerically first, then string keys
            items.sort(key=lambda kv: (0, kv[0]) if _is_int(kv[0]) else (1, str(kv[0])))
        # string leaves, the most common value, skip the call
        return {
            k if type(k) is str else _prepare_key(k, standard): v if type(v) is str else _prepare(v, standard)
            for k, v in items
        }
    if kind is list or kind is tuple:
        return [v if type(v) is str else _prepare(v, standard) for v in obj]
    if kind is int:
        return str(obj) if standard and not -_JS_SAFE_MAX <= obj <= _JS_SAFE_MAX else obj
    return _prepare_other(obj, standard)


def _prepare_other(obj: Any, standard: bool) -> Any:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        return _prepare(dict(obj), standard)
    if isinstance(obj, (list, tuple)):
        return [_prepare(v, standard) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return [_prepare(v, standard) for v in sorted(obj)]
    if isinstance(obj, int):
        value = int(obj)  # IntEnum/IntFlag members are written as plain numbers
        return str(value) if standard and not -_JS_SAFE_MAX <= value <= _JS_SAFE_MAX else value
    if isinstance(obj, float):
        # fastjson writes NaN and infinities as null
        return obj if obj == obj and obj not in (_INF, -_INF) else None
    if isinstance(obj, Enum):
        return obj.name
    raise TypeError(f"cannot write {type(obj).__name__} as JSON; pass to_wire() dicts, lists and scalars")


def _prepare_key(k: Any, standard: bool) -> str | int:
    if isinstance(k, str):
        return k
    if _is_int(k):
        return int.__repr__(k) if standard else int(k)
    if isinstance(k, Enum):
        return k.name
    return str(k)


def _sorted_items(d: dict) -> list[tuple[Any, Any]]:
    """Non-null entries, integer keys numerically first, then string keys."""
    items = [(k, v) for k, v in d.items() if v is not None]
    try:
        items.sort(key=lambda kv: kv[0])
    except TypeError:  # mixed key types
        items.sort(key=lambda kv: (0, kv[0]) if _is_int(kv[0]) else (1, str(kv[0])))
    return items


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _emit_legacy(obj: Any, out: list[str]) -> None:
    """Write what :func:`_prepare` returned: only dicts, lists, str, int, float, bool and None remain."""
    if isinstance(obj, str):
        out.append(encode_basestring(obj))
    elif obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, (int, float)):
        out.append(repr(obj))
    elif isinstance(obj, dict):
        out.append("{")
        for n, (k, v) in enumerate(obj.items()):
            if n:
                out.append(",")
            out.append(f"{k}:" if isinstance(k, int) else encode_basestring(k) + ":")
            _emit_legacy(v, out)
        out.append("}")
    else:
        out.append("[")
        for n, v in enumerate(obj):
            if n:
                out.append(",")
            _emit_legacy(v, out)
        out.append("]")
