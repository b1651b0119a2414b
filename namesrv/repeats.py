"""Answers to requests that come back byte for byte but for the opaque: route lookups and heartbeats.

Clients ask for the same route over and over and brokers send the same QUERY_DATA_VERSION or
BROKER_HEARTBEAT every few seconds, and the full path costs about fifteen Python calls per request.
:class:`Repeats` answers such a frame straight from the decoder's buffer: the bytes around the
opaque's digits must match what was learnt, and the answer is a remembered frame with the request's
digits put back in.  A frame is learnt the second time it is seen, only once parsing proves its
digits are the opaque, and an entry is dropped whenever what its answer depends on changes.
Nothing is repeated with ACL on, for non-JSON headers or for large frames; entries are bounded in
bytes, and everything runs on the event loop.  ``docs/internals/caches.md`` has the exact rules.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from typing import Any

from common.protocol.codec import FrameDecoder, LocalProtocolError, RemoteProtocolError, decode_frame, encode
from common.protocol.codes import RequestCode, ResponseCode, SerializeType
from common.protocol.command import RemotingCommand
from common.protocol.headers import BrokerIdentityHeader, HeaderError, decode_header
from namesrv.handlers import HandlerContext, NodeObserver, data_version_answer
from namesrv.request_stats import RequestStats

#: bytes of learnt requests and answers kept (keys, tails, answer headers and bodies, plus overhead)
REPEATS_MAX_BYTES = 16 * 1024 * 1024
#: a request frame larger than this is never learnt (heartbeats and route lookups are ~200 bytes)
MAX_FRAME_BYTES = 4096
#: an answer larger than this is not remembered (a route over every broker of a large cluster)
MAX_ANSWER_BYTES = REPEATS_MAX_BYTES // 16
#: request bytes seen once, by hash, before the second sighting learns them
_SEEN_MAX = 4096
#: a dict slot, the entry object and its bytes objects' headers, roughly
_ENTRY_OVERHEAD = 400

_PREFIX = struct.Struct(">II")
#: the opaque as our encoder and Java write it: canonical digits right after its key
_OPAQUE = re.compile(rb'"opaque":(0|-?[1-9][0-9]{0,9})(?=[,}])')
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

_ROUTE = int(RequestCode.GET_ROUTEINFO_BY_TOPIC)
_QUERY_DATA_VERSION = int(RequestCode.QUERY_DATA_VERSION)
_BROKER_HEARTBEAT = int(RequestCode.BROKER_HEARTBEAT)
_HEARTBEATS = {_QUERY_DATA_VERSION: RequestCode.QUERY_DATA_VERSION, _BROKER_HEARTBEAT: RequestCode.BROKER_HEARTBEAT}
_SUCCESS = int(ResponseCode.SUCCESS)


class _Any:
    """The DataVersion a BROKER_HEARTBEAT entry holds for: its answer does not depend on one."""


_ANY_HELD: Any = _Any()


@dataclasses.dataclass(slots=True, eq=False)
class Repeat:
    """One learnt request, by the bytes before its opaque's digits, and its answer."""

    #: the request's bytes after the digits, to the end of the frame (rest of the header, then body)
    tail: bytes
    #: how many of ``tail`` are header
    tail_header: int
    #: the answer's header up to its opaque's digits, and after them; then its body
    answer_head: bytes
    answer_tail: bytes
    body: bytes
    #: the answer's length word and header length without the digits
    length: int
    header_len: int
    code: int
    response_code: int
    #: heartbeats: (cluster, broker address) to refresh, the observer's source, and the DataVersion
    #: the broker's entry must still hold (identity) for the answer to hold
    broker: tuple[str, str] | None
    source: RequestCode | None
    held: Any
    #: bytes counted against the bound
    cost: int


class Repeats:
    """The node's learnt requests, shared by its connections (see the module notes)."""

    def __init__(self, context: HandlerContext, max_bytes: int = REPEATS_MAX_BYTES) -> None:
        self.context = context
        self.max_bytes = max_bytes
        self._table: dict[bytes, Repeat] = {}
        self._bytes = 0
        self._seen: dict[int, None] = {}
        self._generation: tuple[Any, ...] | None = None
        #: the frame the last :meth:`answer` stopped at: (buffer, its end, the buffer's size then, the
        #: bytes before the digits, the bytes after them, header length less the digits)
        self._missed: tuple[bytearray, int, int, bytes, bytes, int] | None = None

    @property
    def size(self) -> int:
        """Bytes held, as counted against ``max_bytes``."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._table)

    def _current_generation(self) -> tuple[Any, ...]:
        context = self.context
        config = context.config
        return (
            context.answer_generation(),
            config.need_wait_for_service,
            config.wait_seconds_for_service,
            context.acl is None,
        )

    def _check_generation(self) -> None:
        """Forget every entry once something an answer depends on has changed."""
        generation = self._current_generation()
        if generation != self._generation:
            self._table.clear()
            self._bytes = 0
            self._generation = generation

    def answer(
        self, decoder: FrameDecoder, out: list[bytes], limit: int, stats: RequestStats | None, started: float
    ) -> tuple[int, float]:
        """Answer the learnt frames at the head of ``decoder``'s buffer, until one is not or ``limit``
        bytes are appended to ``out``; returns the bytes appended and the stats' ``started``."""
        self._missed = None
        unread = decoder.unread()
        if unread is None:
            return 0, started
        buf, pos = unread
        size = len(buf)
        if size - pos < 8:
            return 0, started
        self._check_generation()
        if self.context.acl is not None:
            return 0, started
        table = self._table
        search = _OPAQUE.search
        unpack = _PREFIX.unpack_from
        pack = _PREFIX.pack
        first = len(out)
        written = 0
        # heartbeats, as (entry, its answer's index in out, start, digits start): their brokers are
        # refreshed after the loop, under one lock acquisition, and their answers kept if still true
        beats: list[tuple[Repeat, int, int, int]] = []
        #: with metrics on: the entries answered, in order, to be counted once they are sure
        counted: list[Repeat] | None = None if stats is None else []
        while size - pos >= 8 and written < limit:
            length, word = unpack(buf, pos)
            end = pos + 4 + length
            # not whole yet, too large to have been learnt, or not a JSON header (its type byte is set)
            if end > size or length > MAX_FRAME_BYTES or word > length - 4:
                break
            header_end = pos + 8 + word
            m = search(buf, pos + 8, header_end)
            if m is None:
                break
            a, b = m.span(1)
            key = bytes(buf[pos + 8 : a])
            entry = table.get(key)
            if (
                entry is None
                or header_end - b != entry.tail_header
                or end - b != len(entry.tail)
                or not buf.startswith(entry.tail, b)
            ):
                self._missed = (buf, end, size, key, bytes(buf[b:end]), word - (b - a))
                break
            if b - a > 9 and not _INT32_MIN <= int(buf[a:b]) <= _INT32_MAX:
                break  # the decoder refuses it
            if entry.broker is not None:
                beats.append((entry, len(out), pos, a))
            if counted is not None:
                counted.append(entry)
            n = b - a
            answer = b"".join(
                (
                    pack(entry.length + n, entry.header_len + n),
                    entry.answer_head,
                    buf[a:b],
                    entry.answer_tail,
                    entry.body,
                )
            )
            out.append(answer)
            written += len(answer)
            pos = end
        if beats:
            pos, written = self._heartbeats(beats, buf, size, out, pos, written)
        if stats is not None and counted is not None:
            for entry in counted[: len(out) - first]:
                started = stats.record(entry.code, entry.response_code, started)
        if pos != unread[1]:
            decoder.consume(pos)
        return written, started

    def _heartbeats(
        self,
        beats: list[tuple[Repeat, int, int, int]],
        buf: bytearray,
        size: int,
        out: list[bytes],
        pos: int,
        written: int,
    ) -> tuple[int, int]:
        """Refresh the brokers of the heartbeats answered, as their handler would; from the first whose
        answer no longer holds on, the answers are taken back (the full path answers them).  Returns
        the end of the frames answered, and the bytes of their answers."""
        heard_at_ms = self.context.heard_at_ms()
        held = self.context.routes.touch_each([entry.broker for entry, _, _, _ in beats], heard_at_ms)  # type: ignore[misc]
        for i, (entry, index, start, a) in enumerate(beats):
            if held[i] is not entry.held and entry.held is not _ANY_HELD:
                # the later frames' brokers were refreshed too, and will be again: harmless
                self._missed = (buf, start + 4 + _PREFIX.unpack_from(buf, start)[0], size, bytes(buf[start + 8 : a]),
                                entry.tail, entry.tail_header + a - start - 8)  # fmt: skip
                written -= sum(map(len, out[index:]))
                del out[index:]
                pos = start
                beats = beats[:i]
                break
        observer = self.context.observer
        if type(observer).broker_heartbeat is not NodeObserver.broker_heartbeat:
            for entry, _, _, _ in beats:
                broker = entry.broker
                observer.broker_heartbeat(broker[0], broker[1], entry.source, heard_at_ms)  # type: ignore[arg-type,index]
        return pos, written

    def learn(self, decoder: FrameDecoder, request: RemotingCommand, response: RemotingCommand, frame: bytes) -> None:
        """After the full path answered ``request`` with ``frame``: remember it if it may be repeated."""
        missed, self._missed = self._missed, None
        if missed is None or (request.code != _ROUTE and request.code not in _HEARTBEATS):
            return
        buf, end, size, key, tail, header_len = missed
        unread = decoder.unread()
        # the decoder handed out that frame: it is at its end, or it emptied the buffer it ended
        if unread is None or unread[0] is not buf or unread[1] != (0 if end == size else end):
            return  # not the frame the last answer() stopped at
        known = self._table.get(key)
        if known is None or known.tail != tail:
            seen = hash((key, tail))
            if seen not in self._seen:  # the first sighting
                if len(self._seen) >= _SEEN_MAX:
                    del self._seen[next(iter(self._seen))]
                self._seen[seen] = None
                return
            del self._seen[seen]
        if self._current_generation() != self._generation:
            return  # the tables changed since answer() looked: the handler may have seen either
        entry = self._entry(request, response, frame, key, tail, header_len)
        if entry is None:
            return
        if known is not None:
            self._drop(key)
        if entry.cost > self.max_bytes // 4:
            return
        while self._bytes + entry.cost > self.max_bytes:
            self._drop(next(iter(self._table)))
        self._table[key] = entry
        self._bytes += entry.cost

    def _drop(self, key: bytes) -> None:
        self._bytes -= self._table.pop(key).cost

    def _entry(
        self,
        request: RemotingCommand,
        response: RemotingCommand,
        frame: bytes,
        key: bytes,
        tail: bytes,
        header_len: int,
    ) -> Repeat | None:
        """The entry for this request and answer, or None when they must not be repeated."""
        if len(frame) > MAX_ANSWER_BYTES or response.serialize_type != SerializeType.JSON:
            return None
        if not _opaque_only(request, key, tail, header_len - len(key)):
            return None
        context = self.context
        broker: tuple[str, str] | None = None
        source: RequestCode | None = None
        held: Any = _ANY_HELD
        if request.code == _ROUTE:
            config = context.config
            if config.need_wait_for_service and context.now() - context.started_at < config.wait_seconds_for_service:
                return None  # "not ready" holds until the clock says otherwise
        else:
            if response.code != _SUCCESS:
                return None
            try:
                h = decode_header(BrokerIdentityHeader, request.ext_fields)
            except HeaderError:
                return None
            broker, source = (h.cluster_name, h.broker_addr), _HEARTBEATS[request.code]
            if request.code == _QUERY_DATA_VERSION:
                held = context.routes.data_version(*broker)
                # as the handler answers for the DataVersion held now (the worker thread may have
                # registered the broker since the handler ran)
                expected = data_version_answer(request, held)
                expected.serialize_type = response.serialize_type
                if expected != response:
                    return None
        template = _answer_template(response, frame)
        if template is None:
            return None
        answer_head, answer_tail, body, length, answer_header_len = template
        return Repeat(
            tail=tail,
            tail_header=header_len - len(key),
            answer_head=answer_head,
            answer_tail=answer_tail,
            body=body,
            length=length,
            header_len=answer_header_len,
            code=request.code,
            response_code=response.code,
            broker=broker,
            source=source,
            held=held,
            cost=len(key) + len(tail) + len(answer_head) + len(answer_tail) + len(body) + _ENTRY_OVERHEAD,
        )


def _opaque_only(request: RemotingCommand, key: bytes, tail: bytes, tail_header: int) -> bool:
    """Whether every frame ``key + digits + tail`` is ``request`` with those digits as its opaque.

    Two parses prove it, with 0 and with 1 as the digits: only the opaque may differ.  A
    ``"opaque":`` inside a string, say, changes something else, and is refused.
    """
    parsed = []
    for digit in (b"0", b"1"):
        header_len = len(key) + 1 + tail_header
        frame = _PREFIX.pack(4 + len(key) + 1 + len(tail), header_len) + key + digit + tail
        try:
            cmd = decode_frame(frame)
        except RemoteProtocolError:
            return False
        if cmd.opaque != int(digit):
            return False
        cmd.opaque = request.opaque
        parsed.append(cmd)
    return all(cmd == request and cmd.unknown == request.unknown for cmd in parsed)


def _answer_template(response: RemotingCommand, frame: bytes) -> tuple[bytes, bytes, bytes, int, int] | None:
    """``frame`` around its opaque's digits: (header before, header after, body, length and header
    length without the digits); None unless the same answer with another opaque proves it."""
    length, header_len = _PREFIX.unpack_from(frame, 0)
    header_end = 8 + header_len
    m = _OPAQUE.search(frame, 8, header_end)
    if m is None:
        return None
    a, b = m.span(1)
    body = response.body or b""  # the answer cache's own object, when the answer came from it
    if frame[header_end:] != body:
        return None
    template = (frame[8:a], frame[b:header_end], body, length - (b - a), header_len - (b - a))
    other = dataclasses.replace(response, opaque=0 if response.opaque else 1)
    try:
        if encode(other) != _fill(template, b"%d" % other.opaque) or frame != _fill(template, frame[a:b]):
            return None
    except LocalProtocolError:
        return None
    return template


def _fill(template: tuple[bytes, bytes, bytes, int, int], digits: bytes) -> bytes:
    head, tail, body, length, header_len = template
    n = len(digits)
    return b"".join((_PREFIX.pack(length + n, header_len + n), head, digits, tail, body))
