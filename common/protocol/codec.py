"""RocketMQ remoting frames: bytes in, :class:`RemotingCommand` out, and back.  No I/O here.

Every frame is ``length:u32  type<<24|headerLen:u32  header  body``, with a JSON or ROCKETMQ
(binary) header; the body stays opaque bytes here (:mod:`common.protocol.bodies` reads it).
:class:`FrameDecoder` is fed whatever the socket delivered and hands out whole commands.  It judges
a frame by its first 8 bytes, so a peer can make us buffer neither more than the 16 MiB Java allows
nor a header over ``max_header``; anything that is not a frame raises :class:`RemoteProtocolError`
and the server closes the connection, as Java's ``NettyDecoder`` does.  Large frames get memory of
their own that fills as bytes arrive, bodies over their code's ``body_limits`` are counted off and
dropped, and headers are parsed and written once per shape (all but the opaque), since peers repeat
them.  ``docs/internals/codec.md`` explains each of these.
"""

from __future__ import annotations

import enum
import functools
import json
import mmap
import re
import struct
import threading
from collections.abc import Mapping
from typing import Any, Final

import orjson

from common.protocol import fastjson
from common.protocol.codes import FRAME_MAX_LENGTH, LanguageCode, SerializeType
from common.protocol.command import RemotingCommand

__all__ = [
    "RemoteProtocolError",
    "TlsRecordError",
    "LocalProtocolError",
    "FrameDecoder",
    "encode",
    "decode_frame",
    "MAX_LENGTH",
    "TLS_RECORD_HANDSHAKE",
]

#: the largest legal length word: Netty compares length + 4 with FRAME_MAX_LENGTH
MAX_LENGTH = FRAME_MAX_LENGTH - 4
#: first byte of a TLS handshake record (a ClientHello); RocketMQ's HANDSHAKE_MAGIC_CODE
TLS_RECORD_HANDSHAKE = 0x16
#: a length word's top two bytes when they are a handshake record's type and version (3.x: every TLS)
_TLS_HANDSHAKE_WORD = TLS_RECORD_HANDSHAKE << 8 | 0x03

_PREFIX = struct.Struct(">II")  # length word, type|headerLen word
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
#: ROCKETMQ header up to the remark length: code, language, version, opaque, flag, remarkLen
_RMQ_FIXED = struct.Struct(">hbhiii")
_RMQ_MIN_HEADER = _RMQ_FIXED.size + 4  # plus the ext-block length
_RMQ_OPAQUE_AT = 5  # code:i16, language:i8, version:i16, then the opaque

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_LANGUAGE_BY_NAME = {c.name: c for c in LanguageCode}
_LANGUAGE_BY_CODE = {c.value: c for c in LanguageCode}
#: header keys a JSON header may carry; anything else lands in ``RemotingCommand.unknown``
_JSON_KEYS = frozenset(
    ("code", "extFields", "flag", "language", "opaque", "remark", "serializeTypeCurrentRPC", "version")
)


class RemoteProtocolError(Exception):
    """The peer sent bytes that are not a RocketMQ frame.

    Suggested reaction: close the connection without answering (there is no trustworthy opaque to
    answer to), as Java does on any decode failure.
    """


class TlsRecordError(RemoteProtocolError):
    """Where a frame length was expected, a TLS handshake began: the peer speaks TLS to plaintext."""


class LocalProtocolError(Exception):
    """We asked for a frame the protocol cannot carry (a bug on our side, e.g. a body over 16 MiB)."""


# ---------------------------------------------------------------------------------------------
# Encoding


def encode(cmd: RemotingCommand) -> bytes:
    """The whole frame for ``cmd``, length word included, header in ``cmd.serialize_type``."""
    stype = cmd.serialize_type
    if stype == SerializeType.JSON:
        header = _encode_json_header(cmd)
    elif stype == SerializeType.ROCKETMQ:
        header = _encode_rocketmq_header(cmd)
    else:
        raise LocalProtocolError(f"unknown serialize type {stype!r}; use SerializeType.JSON or ROCKETMQ")
    body = cmd.body or b""
    length = 4 + len(header) + len(body)
    if length > MAX_LENGTH:
        raise LocalProtocolError(
            f"frame of {length + 4} bytes exceeds the {FRAME_MAX_LENGTH}-byte limit peers enforce; send less"
        )
    return b"".join((_PREFIX.pack(length, (int(stype) << 24) | len(header)), header, body))


#: shapes remembered in each direction; a shape is a few hundred bytes
_SHAPE_CACHE_SIZE = 4096


def _shape(cmd: RemotingCommand) -> tuple[Any, ...]:
    """A command's header fields other than the opaque: the key of the encoders' template caches."""
    ext = cmd.ext_fields
    items: tuple[tuple[str, Any], ...] | None = None
    if ext is not None:
        items = tuple(ext.items())
        try:
            hash(items)
        except TypeError:  # a list or map value: written as Java's String.valueOf would
            items = tuple(_wire_ext(ext).items())
    return cmd.code, cmd.flag, cmd.language, cmd.version, cmd.remark, items


def _memorable(cmd: RemotingCommand) -> bool:
    """Whether a header is small enough to remember: a remark may repeat a topic name of any length."""
    size = len(cmd.remark) if cmd.remark else 0
    if cmd.ext_fields:
        for k, v in cmd.ext_fields.items():
            size += len(k) + (len(v) if type(v) is str else 16)
    return size <= _MEMO_MAX_HEADER


def _encode_json_header(cmd: RemotingCommand) -> bytes:
    template = _json_template if _memorable(cmd) else _json_template.__wrapped__
    head, tail = template(*_shape(cmd))
    return b"%b%d%b" % (head, _int32(cmd.opaque, "opaque"), tail)


@functools.lru_cache(maxsize=_SHAPE_CACHE_SIZE)
def _json_template(
    code: int, flag: int, language: Any, version: int, remark: str | None, ext: tuple[tuple[str, str], ...] | None
) -> tuple[bytes, bytes]:
    """A JSON header in two halves, to be joined around the opaque's digits."""
    # insertion order is the wire order: fastjson sorts bean properties alphabetically
    before: dict[str, Any] = {"code": _int32(code, "code")}
    if ext is not None:
        before["extFields"] = _wire_ext(dict(ext))
    before["flag"] = _int32(flag, "flag")
    before["language"] = _language_name(language)
    after: dict[str, Any] = {}
    if remark is not None:
        after["remark"] = remark
    after["serializeTypeCurrentRPC"] = "JSON"
    after["version"] = _int32(version, "version")
    try:
        head, tail = orjson.dumps(before), orjson.dumps(after)
    except TypeError as e:
        try:  # a lone surrogate (a peer may send "\ud800"): written as '?', as Java's getBytes(UTF_8) does
            head, tail = (
                json.dumps(d, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")
                for d in (before, after)
            )
        except (TypeError, ValueError):
            raise LocalProtocolError(f"header of command code={code} cannot be written as JSON: {e}") from None
    return head[:-1] + b',"opaque":', b"," + tail[1:]


def _encode_rocketmq_header(cmd: RemotingCommand) -> bytes:
    template = _rocketmq_template if _memorable(cmd) else _rocketmq_template.__wrapped__
    header = template(*_shape(cmd))
    try:
        opaque = _I32.pack(cmd.opaque)
    except struct.error:
        raise LocalProtocolError(f"opaque={cmd.opaque} does not fit a Java int") from None
    return b"".join((header[:_RMQ_OPAQUE_AT], opaque, header[_RMQ_OPAQUE_AT + 4 :]))


@functools.lru_cache(maxsize=_SHAPE_CACHE_SIZE)
def _rocketmq_template(
    code: int, flag: int, language: Any, version: int, remark: str | None, ext: tuple[tuple[str, str], ...] | None
) -> bytes:
    """A ROCKETMQ header with opaque 0."""
    # a lone surrogate is written as '?', as Java's String.getBytes(UTF_8) does
    remark_bytes = remark.encode("utf-8", "replace") if remark else b""
    ext_block = bytearray()
    for key, value in _wire_ext(dict(ext or ())).items():
        k, v = str(key).encode("utf-8", "replace"), value.encode("utf-8", "replace")
        if len(k) > 0x7FFF:
            raise LocalProtocolError(f"ext key of {len(k)} bytes does not fit the ROCKETMQ int16 length")
        ext_block += _I16.pack(len(k)) + k + _I32.pack(len(v)) + v
    lang = _LANGUAGE_BY_CODE.get(language)
    if lang is None:
        raise LocalProtocolError(f"language {language!r} is not a LanguageCode")
    try:
        fixed = _RMQ_FIXED.pack(code, lang.value, version, 0, flag, len(remark_bytes))
    except struct.error as e:
        # Java would silently truncate code/version to 16 bits; we refuse instead
        raise LocalProtocolError(
            f"command code={code} version={version} does not fit the ROCKETMQ header (int16 fields): {e}"
        ) from None
    return b"".join((fixed, remark_bytes, _I32.pack(len(ext_block)), ext_block))


def _int32(value: int, name: str) -> int:
    if not isinstance(value, int) or not _INT32_MIN <= value <= _INT32_MAX:
        raise LocalProtocolError(f"{name}={value} does not fit a Java int")
    return int(value)


def _language_name(language: Any) -> str:
    lang = _LANGUAGE_BY_CODE.get(language)
    if lang is None:
        raise LocalProtocolError(f"language {language!r} is not a LanguageCode")
    return lang.name


def _wire_ext(ext: dict[str, str]) -> dict[str, str]:
    """extFields as Java's makeCustomHeaderToNet leaves them: nulls dropped, values as strings."""
    if all(type(v) is str for v in ext.values()):
        return ext
    return {k: v if type(v) is str else _java_text(v) for k, v in ext.items() if v is not None}


def _java_text(value: Any) -> str:
    """``String.valueOf`` of a JSON value, as Java puts it into a String field."""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (dict, list)):
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    return str(value)


# ---------------------------------------------------------------------------------------------
# Decoding


class FrameDecoder:
    """Accumulates received bytes and yields whole commands.

    Call :meth:`feed` with each chunk, then :meth:`next_command` until it returns ``None``.  A short
    buffer returns ``None`` and changes nothing.  After a :class:`RemoteProtocolError` the stream is
    out of step for good: every later call raises the same error.

    ``body_limits`` maps a request code to the most body bytes it may carry, ``max_header`` bounds
    every frame's header (see the module notes; None: only the frame limit does).
    """

    def __init__(self, body_limits: Mapping[int, int] | None = None, max_header: int | None = None) -> None:
        #: the large frame in progress, length word included, in memory of its own (see the module notes)
        self._frame: memoryview | None = None
        #: bytes of it received, and its length (0: none in progress)
        self._filled = self._frame_len = 0
        self._frame_header: tuple[SerializeType, int] = (SerializeType.JSON, 0)
        self._buf = bytearray()
        self._start = 0  # bytes before this offset are already handed out
        #: why the stream is out of step; the message only (an exception would keep its traceback's
        #: frames, which refer to this decoder: a cycle only the garbage collector could free)
        self._error: str | None = None
        self._limits = body_limits or {}
        #: no body is refused below this many bytes, so smaller frames are never looked at early
        self._least_limit = min(self._limits.values(), default=0)
        #: the header of the unfinished frame at _start, looked at (its body is within its code's
        #: limit): returned with the frame when it is whole, not parsed again
        self._vetted: RemotingCommand | None = None
        #: bytes of a refused body still to come: dropped as they arrive
        self._skip = 0
        self._max_header = MAX_LENGTH if max_header is None else max_header

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a command."""
        return len(self._buf) - self._start + self._filled

    @property
    def skipping(self) -> int:
        """Bytes of a refused body still to come (and to be dropped)."""
        return self._skip

    def feed(self, data: bytes | memoryview) -> None:
        if self._skip:
            if len(data) <= self._skip:
                self._skip -= len(data)
                return
            data = memoryview(data)[self._skip :]  # the end of a refused body, dropped; the rest appended below
            self._skip = 0
        if self._frame is not None:
            filled, size = self._filled, min(len(data), self._frame_len - self._filled)
            self._frame[filled : filled + size] = data if size == len(data) else memoryview(data)[:size]
            self._filled += size
            if size == len(data):
                return
            data = memoryview(data)[size:]  # the frame is whole: the rest is the next frames'
        if self._start:
            # drop consumed frames only now, so next_command never moves bytes it may not return
            del self._buf[: self._start]
            self._start = 0
        self._buf += data

    def receive_buffer(self, limit: int) -> memoryview | None:
        """Where up to ``limit`` more bytes of the large frame in progress go, for a reader that
        receives into memory it is given (then :meth:`received`); None when no such frame is in
        progress: pass what arrives to :meth:`feed`."""
        if self._frame is None or self._error is not None:
            return None
        return self._frame[self._filled : min(self._frame_len, self._filled + limit)]

    @property
    def receiving_large_frame(self) -> bool:
        """A frame of :data:`LARGE_FRAME_BYTES` or more has its header in and the rest to come."""
        return self._frame is not None

    def received(self, size: int) -> None:
        """Count ``size`` bytes as written into the memory :meth:`receive_buffer` gave."""
        self._filled += size

    def unread(self) -> tuple[bytearray, int] | None:
        """The buffer and the offset of its first byte not yet handed out, for a reader that answers
        some whole frames itself (:mod:`namesrv.repeats`); None while a large or refused frame is
        in progress, or after an error (then only :meth:`next_command` knows what to do)."""
        if self._frame is not None or self._skip or self._vetted is not None or self._error is not None:
            return None
        return self._buf, self._start

    def consume(self, end: int) -> None:
        """Count the bytes up to ``end`` of :meth:`unread`'s buffer as handed out: whole frames
        another reader answered."""
        self._start = end

    def next_command(self) -> RemotingCommand | None:
        if self._error is not None:
            raise RemoteProtocolError(self._error)
        try:
            return self._next()
        except RemoteProtocolError as e:
            self._error = str(e)
            raise

    def _next(self) -> RemotingCommand | None:
        if self._frame is not None:
            return self._whole_frame() if self._filled == self._frame_len else None
        buf, start = self._buf, self._start
        size = len(buf)
        if size - start < 8:
            if size - start >= 4:
                _check_length(_U32.unpack_from(buf, start)[0])
            return None
        length, word = _PREFIX.unpack_from(buf, start)
        if not 4 <= length <= MAX_LENGTH:
            _check_length(length)
        stype, header_len = _check_type_word(word, length)
        if header_len > self._max_header:
            raise RemoteProtocolError(f"header of {header_len} bytes exceeds the limit of {self._max_header}")
        end = start + 4 + length
        header_end = start + 8 + header_len
        if end - header_end > self._least_limit and self._limits and self._vetted is None and size >= header_end:
            refused = self._refuse_body(buf, start, header_end, end, stype)
            if refused is not None:
                return refused
        if size < end:
            if end - start >= LARGE_FRAME_BYTES and size >= header_end:
                # everything from start on belongs to this frame: it goes on in memory of its own
                frame = memoryview(mmap.mmap(-1, end - start, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
                with memoryview(buf) as view:
                    frame[: size - start] = view[start:]
                self._frame, self._filled, self._frame_len = frame, size - start, end - start
                self._frame_header = (stype, header_len)
                buf.clear()
                self._start = 0
            return None
        cmd = _decode_header(buf, start + 8, header_end, stype) if self._vetted is None else self._vetted
        self._vetted = None
        if header_end < end:
            with memoryview(buf) as view:  # one copy of a body of up to 16 MiB, not two
                cmd.body = bytes(view[header_end:end])
        if end == size:
            buf.clear()
            self._start = 0
        else:
            self._start = end
        return cmd

    def _whole_frame(self) -> RemotingCommand:
        """The large frame now all in; its memory goes back to the system once this returns."""
        frame, self._frame = self._frame, None
        assert frame is not None
        self._filled = self._frame_len = 0
        stype, header_len = self._frame_header
        header_end = 8 + header_len
        cmd = self._vetted
        self._vetted = None
        if cmd is None:
            cmd = _decode_header(frame[:header_end].tobytes(), 8, header_end, stype)
        if header_end < len(frame):
            cmd.body = frame[header_end:].tobytes()  # the one copy of the body
        return cmd

    def _refuse_body(
        self, buf: bytearray, start: int, header_end: int, end: int, stype: SerializeType
    ) -> RemotingCommand | None:
        """The frame at ``start`` without its body if that is over its code's limit, else None."""
        cmd = _decode_header(buf, start + 8, header_end, stype)
        limit = self._limits.get(cmd.code)
        if limit is None or end - header_end <= limit or cmd.is_response:
            self._vetted = cmd  # its header is not parsed again while the rest arrives, nor when it is whole
            return None
        cmd.body_dropped = end - header_end
        if end <= len(buf):
            self._start = end
        else:  # everything from start on belongs to this frame
            self._skip = end - len(buf)
            buf.clear()
            self._start = 0
        return cmd


#: frames at least this long are received into memory of their own (see the module notes)
LARGE_FRAME_BYTES = 256 * 1024


def decode_frame(frame: bytes) -> RemotingCommand:
    """The command in ``frame``: exactly one whole frame, length word included."""
    decoder = FrameDecoder()
    decoder.feed(frame)
    cmd = decoder.next_command()
    if cmd is None:
        raise RemoteProtocolError(f"incomplete frame: {len(frame)} bytes")
    if decoder.buffered:
        raise RemoteProtocolError(f"{decoder.buffered} bytes after the frame")
    return cmd


def _check_length(length: int) -> None:
    if length > MAX_LENGTH:
        if length >> 16 == _TLS_HANDSHAKE_WORD:
            raise TlsRecordError(f"frame length {length} exceeds the limit {MAX_LENGTH}: a TLS handshake record")
        raise RemoteProtocolError(f"frame length {length} exceeds the limit {MAX_LENGTH}")
    if length < 4:
        raise RemoteProtocolError(f"frame length {length} cannot hold the 4-byte header length")


def _check_type_word(word: int, length: int) -> tuple[SerializeType, int]:
    type_byte, header_len = word >> 24, word & 0xFFFFFF
    if type_byte == SerializeType.JSON:
        stype = SerializeType.JSON
    elif type_byte == SerializeType.ROCKETMQ:
        stype = SerializeType.ROCKETMQ
    else:
        raise RemoteProtocolError(f"unknown serialize type {type_byte}")
    if header_len > length - 4:
        raise RemoteProtocolError(f"header length {header_len} exceeds the frame's {length - 4} bytes")
    return stype, header_len


def _decode_header(buf: bytes | bytearray, start: int, end: int, stype: SerializeType) -> RemotingCommand:
    if stype == SerializeType.JSON:
        return _decode_json_header(buf, start, end)
    return _decode_rocketmq_header(buf, start, end)


#: a header longer than this is parsed in full every time rather than remembered
_MEMO_MAX_HEADER = 2048
#: the opaque as Java writes it: a canonical integer right after its key
_JSON_OPAQUE = re.compile(rb'"opaque":(-?[0-9]{1,10})(?=[,}])')


def _decode_json_header(buf: bytes | bytearray, start: int, end: int) -> RemotingCommand:
    if end - start <= _MEMO_MAX_HEADER and (m := _JSON_OPAQUE.search(buf, start, end)) is not None:
        digits = m.group(1)
        opaque = int(digits)
        if _INT32_MIN <= opaque <= _INT32_MAX and b"%d" % opaque == digits:
            shape = _JSON_SHAPES.lookup(bytes(buf[start : m.start(1)]), bytes(buf[m.end(1) : end]))
            if shape is not None:
                return _with_opaque(shape, opaque)
    return _parse_json_header(buf[start:end])


class _JsonShapes:
    """A bounded memo of JSON header shapes, keyed by the bytes around the opaque's digits.

    A shape is worked out (two parses) only when it comes back, so headers that never repeat, such
    as route lookups spread over more topics than the memo holds, cost one parse as without it.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._shapes: dict[tuple[bytes, bytes], RemotingCommand | None] = {}
        self._seen_once: dict[tuple[bytes, bytes], None] = {}
        self._lock = threading.Lock()

    def lookup(self, head: bytes, tail: bytes) -> RemotingCommand | None:
        """The remembered shape, or None: parse this header in full."""
        key = (head, tail)
        shape = self._shapes.get(key, _UNSEEN)
        if shape is not _UNSEEN:
            return shape
        with self._lock:  # decoders in several threads (a node and its clients in one process) share it
            if self._seen_once.pop(key, _UNSEEN) is _UNSEEN:
                self._remember(self._seen_once, key, None)
                return None
        shape = _json_shape(head, tail)
        with self._lock:
            self._remember(self._shapes, key, shape)
        return shape

    def _remember(self, table: dict, key: tuple[bytes, bytes], value: RemotingCommand | None) -> None:
        if len(table) >= self.size:
            del table[next(iter(table))]  # the oldest; a shape in use comes back within seconds anyway
        table[key] = value


class _Unseen(enum.Enum):
    """A one-member enum rather than ``object()``: mypy narrows ``is not _UNSEEN`` away only for an enum."""

    UNSEEN = enum.auto()


_UNSEEN: Final = _Unseen.UNSEEN
_JSON_SHAPES = _JsonShapes(_SHAPE_CACHE_SIZE)


def _json_shape(head: bytes, tail: bytes) -> RemotingCommand | None:
    """The header ``head + digits + tail`` with opaque 0; None when those digits are not (only) the opaque.

    Two parses prove it: with 0 and with 1 in the gap, only the top-level opaque may differ.  An
    ``"opaque":`` that is really an extFields key, say, changes something else and is refused.
    """
    zero, one = _parse_json_header(head + b"0" + tail), _parse_json_header(head + b"1" + tail)
    if zero.opaque != 0 or one.opaque != 1:
        return None
    one.opaque = 0
    return zero if zero == one and zero.unknown == one.unknown else None


def _with_opaque(shape: RemotingCommand, opaque: int) -> RemotingCommand:
    # fresh maps, so a handler that edits its request cannot edit the remembered shape
    return RemotingCommand(
        shape.code,
        opaque,
        shape.flag,
        shape.language,
        shape.version,
        shape.remark,
        None if shape.ext_fields is None else dict(shape.ext_fields),
        None,
        shape.serialize_type,
        dict(shape.unknown),
    )


def _parse_json_header(raw: bytes | bytearray) -> RemotingCommand:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # fastjson peers may write bare integer keys; the tolerant parser is only paid for then
        try:
            obj = fastjson.loads(raw)
        except fastjson.FastjsonError as e:
            raise RemoteProtocolError(f"JSON header is not JSON: {e}") from None
    if type(obj) is not dict:
        raise RemoteProtocolError(f"JSON header must be an object, got {type(obj).__name__}")
    cmd = RemotingCommand(
        code=_header_int(obj, "code"),
        opaque=_header_int(obj, "opaque"),
        flag=_header_int(obj, "flag"),
        version=_header_int(obj, "version"),
        serialize_type=SerializeType.JSON,
    )
    language = obj.get("language")
    if language is not None:
        cmd.language = _decode_language(cmd, language)
    remark = obj.get("remark")
    if remark is not None:
        cmd.remark = remark if type(remark) is str else _java_text(remark)
    ext = obj.get("extFields")
    if ext is not None:
        if type(ext) is not dict:
            raise RemoteProtocolError(f"extFields must be an object, got {type(ext).__name__}")
        # keys and values are usually strings already, and then the map is used as it is
        for k, v in ext.items():
            if type(v) is not str or type(k) is not str:
                ext = {
                    k if type(k) is str else str(k): v if type(v) is str else _java_text(v)
                    for k, v in ext.items()
                    if v is not None
                }
                break
        cmd.ext_fields = ext
    if not obj.keys() <= _JSON_KEYS:
        cmd.unknown.update((k, v) for k, v in obj.items() if k not in _JSON_KEYS)
    return cmd


def _header_int(obj: dict, key: str) -> int:
    value = obj.get(key)
    if value is None:
        return 0  # a missing key keeps the Java bean default
    digits = value.strip().lstrip("-") if type(value) is str and len(value) <= 16 else ""
    if digits.isascii() and digits.isdigit():  # "²" is a digit to str.isdigit, not to int() or fastjson
        value = int(value)  # fastjson reads "105" into an int field too
    if type(value) is not int or not _INT32_MIN <= value <= _INT32_MAX:
        raise RemoteProtocolError(f"header {key} must be a 32-bit integer, got {value!r}")
    return value


def _decode_language(cmd: RemotingCommand, value: Any) -> LanguageCode:
    # Java accepts the enum name or its ordinal; an unknown one is kept for inspection
    if type(value) is str:
        lang = _LANGUAGE_BY_NAME.get(value)
    elif type(value) is int:
        lang = _LANGUAGE_BY_CODE.get(value)
    else:
        raise RemoteProtocolError(f"header language must be a name or a number, got {value!r}")
    if lang is None:
        cmd.unknown["language"] = value
        return LanguageCode.OTHER
    return lang


def _decode_rocketmq_header(buf: bytes | bytearray, start: int, end: int) -> RemotingCommand:
    if _RMQ_MIN_HEADER <= end - start <= _MEMO_MAX_HEADER:
        (opaque,) = _I32.unpack_from(buf, start + _RMQ_OPAQUE_AT)
        at = start + _RMQ_OPAQUE_AT
        with memoryview(buf) as view:
            # the opaque sits at a fixed offset: zero it and the rest of the header is the shape
            key = b"".join((view[start:at], b"\0\0\0\0", view[at + 4 : end]))
        return _with_opaque(_rocketmq_shape(key), opaque)
    return _parse_rocketmq_header(buf, start, end)


@functools.lru_cache(maxsize=_SHAPE_CACHE_SIZE)
def _rocketmq_shape(header: bytes) -> RemotingCommand:
    return _parse_rocketmq_header(header, 0, len(header))


def _parse_rocketmq_header(buf: bytes | bytearray, start: int, end: int) -> RemotingCommand:
    if end - start < _RMQ_MIN_HEADER:
        raise RemoteProtocolError(f"ROCKETMQ header of {end - start} bytes is shorter than {_RMQ_MIN_HEADER}")
    code, lang_code, version, opaque, flag, remark_len = _RMQ_FIXED.unpack_from(buf, start)
    cmd = RemotingCommand(code=code, opaque=opaque, flag=flag, version=version, serialize_type=SerializeType.ROCKETMQ)
    language = _LANGUAGE_BY_CODE.get(lang_code)
    if language is None:
        cmd.unknown["language"] = lang_code
        language = LanguageCode.OTHER
    cmd.language = language
    pos = start + _RMQ_FIXED.size
    cmd.remark, pos = _rmq_string(buf, pos, remark_len, end - 4, "remark")
    (ext_len,) = _I32.unpack_from(buf, pos)
    pos += 4
    if ext_len < 0 or ext_len > end - pos:
        raise RemoteProtocolError(f"ROCKETMQ ext block of {ext_len} bytes exceeds the header")
    if ext_len:
        cmd.ext_fields = _rmq_ext(buf, pos, pos + ext_len)
    return cmd


def _rmq_ext(buf: bytes | bytearray, pos: int, end: int) -> dict[str, str]:
    ext: dict[str, str] = {}
    while pos < end:
        if end - pos < 2:
            raise RemoteProtocolError("ROCKETMQ ext block ends inside a key length")
        (key_len,) = _I16.unpack_from(buf, pos)
        key, pos = _rmq_string(buf, pos + 2, key_len, end, "ext key")
        if end - pos < 4:
            raise RemoteProtocolError("ROCKETMQ ext block ends inside a value length")
        (value_len,) = _I32.unpack_from(buf, pos)
        value, pos = _rmq_string(buf, pos + 4, value_len, end, "ext value")
        # Java reads "" as null, so an empty key or value is an absent field
        if key is not None and value is not None:
            ext[key] = value
    return ext


def _rmq_string(buf: bytes | bytearray, pos: int, length: int, limit: int, what: str) -> tuple[str | None, int]:
    """A length-prefixed UTF-8 string whose bytes start at ``pos`` and must end by ``limit``."""
    if length == 0:
        return None, pos
    if length < 0 or length > limit - pos:
        raise RemoteProtocolError(f"ROCKETMQ {what} length {length} exceeds the header")
    try:
        return buf[pos : pos + length].decode("utf-8"), pos + length
    except UnicodeDecodeError as e:
        raise RemoteProtocolError(f"ROCKETMQ {what} is not UTF-8: {e.reason}") from None
