"""The asyncio TCP server around the sans-I/O core: connections, framing, dispatch, shutdown.

``data_received`` only feeds the decoder and dispatches complete commands; what a request does
happens in :mod:`namesrv.handlers` (or in :mod:`namesrv.repeats`, for a repeat of an answered
request).  A connection that closes, or stays idle past ``serverChannelMaxIdleTimeSeconds``,
unregisters the brokers registered on it and tells the observer why (a
:class:`~namesrv.liveness.Departure`); a node that stops reports none of its own closes.  Memory held
for peers has one node-wide budget, large frames are read at a node-wide pace, work off the loop has a
per-connection budget, and a peer that does not read its answers is held back rather than refused:
docs/internals/remoting-server.md says how and why.  Time comes from the injected ``clock``, so a
test drives the idle scan without waiting.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

from common.logs import LogThrottle, RateLimited
from common.protocol.codec import FrameDecoder, LocalProtocolError, RemoteProtocolError, TlsRecordError, encode
from common.protocol.codes import ResponseCode, SerializeType
from common.protocol.command import RemotingCommand
from namesrv.flow import Credit, large_holders, may_resume
from namesrv.handlers import (
    BODY_LIMITS,
    MAX_REQUEST_HEADER_BYTES,
    HandlerContext,
    Pending,
    dispatch,
)
from namesrv.handshake import Acceptor, TransportSecurity, plaintext_only
from namesrv.liveness import Departure, OnConnectionEnd, departure
from namesrv.process import tune_for_serving
from namesrv.repeats import Repeats
from namesrv.request_stats import ONEWAY, RequestStats

log = logging.getLogger("namesrv.server")

#: answers are written in batches of about this size, so one large read cannot queue without bound
_WRITE_BATCH_BYTES = 64 * 1024
#: node-wide bytes held for peers (unfinished frames, unread answers) before the largest holders wait
BUFFER_BUDGET_BYTES = 64 * 1024 * 1024
#: a connection holding less than this is never held back for the budget
BUDGET_OFFENDER_BYTES = 256 * 1024
#: how often the exact total is recounted while some connection is held back for the budget
_BUDGET_CHECK_S = 0.05
_DROP_LOG_PER_MINUTE = 20
#: a connection holding this much received and not yet answered is paced as if receiving a large frame
_LARGE_FRAME_BYTES = 256 * 1024
#: the most bytes one read takes (asyncio's and uvloop's own size), a piece of a large frame included
_READ_BYTES = 256 * 1024
#: node-wide, the bytes of large frames read per second, all connections receiving one together
LARGE_FRAME_BYTES_PER_S = 32 * 1024 * 1024
#: a large read may come this much ahead of the pace (the loop's timers fire to the millisecond, or
#: early: waiting for the rest would take a turn of the loop for nothing); later reads make it up
_PACE_SLACK_BYTES = LARGE_FRAME_BYTES_PER_S // 500
_REASON_MAX_CHARS = 300
#: while dropping a refused body, a connection is read once per this many seconds
_SKIP_READ_S = 0.01
#: a connection held back for the budget this long, with no broker registered on it, is closed
HELD_BACK_LIMIT_S = 5.0
#: a TLS client on a plaintext-only node is named once per address this often (its retries, silently)
TLS_CLIENT_WARNING_S = 3600.0
_TLS_CLIENTS_REMEMBERED = 1024
#: CPU seconds of work off the loop (inflating and parsing registrations, writing the configuration)
#: one connection may cause per second; past its credit it is not read until the credit is back
WORK_CPU_PER_S = 0.1
#: the most credit a connection holds: more than the largest plain registration (100,000 topics) costs
WORK_CPU_BURST_S = 1.0
#: how soon a closed connection's brokers are looked up again when the route tables were busy
_TABLES_BUSY_RETRY_S = 0.01
_drop_log = RateLimited(log, per_minute=_DROP_LOG_PER_MINUTE)


class Connection(asyncio.BufferedProtocol):
    """One TCP connection from a broker, a client or an admin tool.

    The transport receives into the memory :meth:`get_buffer` gives: a large frame's own (see
    :mod:`common.protocol.codec`), else the node's read buffer, fed to the decoder at once.
    :meth:`data_received` takes bytes as a plain protocol's would (the tests' fake transport).
    """

    __slots__ = (
        "server",
        "transport",
        "decoder",
        "peer",
        "last_active",
        "paused",
        "close_reason",
        "held_back",
        "pending",
        "reading",
        "held",
        "throttled",
        "held_back_since",
        "pending_started",
        "into_frame",
        "work",
        "resting",
    )

    def __init__(self, server: RemotingServer, peer: str | None = None) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(BODY_LIMITS, MAX_REQUEST_HEADER_BYTES)
        #: host:port of the peer; given when set-up learned it (the client's, from a PROXY preamble)
        self.peer = peer or "?"
        self.last_active = server.clock()
        #: the peer is not reading our answers
        self.paused = False
        #: why the node closed this connection itself (None: the peer closed it, or an error did)
        self.close_reason: Departure | None = None
        #: the node is over its buffer budget and this connection is one of the large holders
        self.held_back = False
        #: the answer being worked out off the loop; nothing else is answered here meanwhile
        self.pending: Pending | None = None
        #: whether the transport is reading (it is unless one of the three above says otherwise)
        self.reading = True
        #: bytes this connection was last counted for in the node's budget
        self.held = 0
        #: receiving a large frame: the next read waits for its turn (see _received)
        self.throttled = False
        #: when the node last stopped reading it for the budget (server clock)
        self.held_back_since = 0.0
        #: the request stats' clock when the pending request started (metrics on)
        self.pending_started = 0.0
        #: the last get_buffer gave the large frame's own memory (else the node's read buffer)
        self.into_frame = False
        #: CPU seconds of work off the loop this connection may still cause
        self.work = Credit.full(WORK_CPU_PER_S, WORK_CPU_BURST_S, self.last_active)
        #: it has caused more work off the loop than its credit: neither read nor answered until paid back
        self.resting = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream server's transport: typeshed's Protocol says BaseTransport, and uvloop's transports are
        # not asyncio.Transport subclasses, though they have every method of one
        self.transport = stream = cast(asyncio.Transport, transport)
        if self.peer == "?":
            peer = transport.get_extra_info("peername")
            self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)
        self.server.tune(stream)

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the transport receives next: up to _READ_BYTES of the large frame in progress, in
        its own memory (no copy), else the node's read buffer."""
        view = self.decoder.receive_buffer(_READ_BYTES)
        self.into_frame = view is not None
        return self.server.read_buffer if view is None else view

    def buffer_updated(self, nbytes: int) -> None:
        if self.into_frame:  # already in the frame's memory: only counted
            self._take(self.decoder.received, nbytes, nbytes)
        else:
            self.data_received(self.server.read_buffer[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        self._take(self.decoder.feed, data, len(data))

    def _take(self, store: Callable[[Any], None], what: Any, nbytes: int) -> None:
        """``store(what)`` into the decoder (``nbytes`` received), answer what is whole, pace what is not."""
        self.last_active = self.server.clock()
        try:
            store(what)
            self._answer_buffered()
        except Exception as e:  # a bug on our side must cost this connection, never the node's log or loop
            self.drop(departure.read_failed(e))
            return
        self._received(nbytes)

    def _received(self, nbytes: int) -> None:
        """After a read of ``nbytes``: count what we hold, and pace the reads of a large frame."""
        self.server.account(self)
        decoder = self.decoder
        if (
            decoder.receiving_large_frame or decoder.buffered >= _LARGE_FRAME_BYTES or decoder.skipping
        ) and not self.throttled:
            # libuv reads a ready socket up to 32 times in a row: a peer streaming a large frame (or a
            # refused body we drop) would take the loop for milliseconds each turn.  One read at a
            # time, then wait for a turn (RemotingServer.read_large_frame_later), from the read that
            # brought the frame's header: pacing from 256 KiB on only let every connection opened at
            # once read that much at full speed, just when the attacker's own sending is busiest.
            self.throttled = True
            self._update_reading()
            assert self.server.loop is not None  # set before the server accepts a connection
            if self.decoder.skipping:
                # a refused body is already answered: it drains at one read per _SKIP_READ_S (about
                # 25 MB/s), so a peer sending them back to back cannot keep the node's CPU busy
                self.server.loop.call_later(_SKIP_READ_S, self.unthrottle)
            else:
                self.server.read_large_frame_later(self, nbytes)

    def unthrottle(self) -> bool:
        """Read again after a large frame's read; True if the transport is reading now."""
        self.throttled = False
        if self.transport is not None and not self.transport.is_closing():
            self._update_reading()
            return self.reading
        return False

    def _answer_buffered(self) -> None:
        """Answer the whole frames received so far, until done, until the peer stops reading, or
        until an answer has to wait for work off the loop."""
        out: list[bytes] = []
        size = 0
        server = self.server
        # metrics (namesrv.request_stats): every request counted; one in SAMPLE_EVERY timed, from the
        # end of the one before (started > 0: the current request is being timed)
        stats = server.request_stats
        started = 0.0 if stats is None else stats.start()
        repeats = server.repeats
        decoder = self.decoder
        try:
            while not self.paused and self.pending is None and not self.resting:
                if repeats is not None:  # requests answered before, again (namesrv.repeats)
                    written, started = repeats.answer(decoder, out, _WRITE_BATCH_BYTES - size, stats, started)
                    size += written
                    if size >= _WRITE_BATCH_BYTES:
                        self._write(out)
                        out, size = [], 0
                        continue
                if (request := decoder.next_command()) is None:
                    break
                response = dispatch(server.context, request, self, wait=False)
                if response is None:
                    if stats is not None and not request.is_response:
                        started = stats.record(request.code, ONEWAY, started)
                    continue
                if isinstance(response, Pending):
                    self.pending = response
                    self.pending_started = started
                    self._update_reading()
                    response.future.add_done_callback(self._work_done)
                    break
                out.append(answer := server.encode_response(request, response))
                if repeats is not None:
                    repeats.learn(decoder, request, response, answer)
                if stats is not None:
                    started = stats.record(request.code, response.code, started)
                size += len(answer)
                if size >= _WRITE_BATCH_BYTES:  # may call pause_writing, which ends the loop
                    self._write(out)
                    out, size = [], 0
        except TlsRecordError as e:
            self._write(out)
            server.tls_client_refused(self.peer)
            self.close(departure.malformed_frame(e))
            return
        except RemoteProtocolError as e:
            self._write(out)
            self.drop(departure.malformed_frame(e))
            return
        self._write(out)

    def _work_done(self, future: object) -> None:
        # called on the worker thread that finished the work: the answer is built on the loop
        loop = self.server.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._answer_pending)

    def _answer_pending(self) -> None:
        pending, self.pending = self.pending, None
        if pending is None or self.transport is None or self.transport.is_closing():
            return
        try:
            response = pending.resolve()
            if response is not None:
                self._write([self.server.encode_response(pending.request, response)])
            if (stats := self.server.request_stats) is not None:
                stats.record(pending.request.code, ONEWAY if response is None else response.code, self.pending_started)
            self._charge_work(pending.cpu_seconds)
            self._update_reading()
            self._answer_buffered()  # frames that arrived before or with that request
        except Exception as e:
            self.drop(departure.read_failed(e))
        else:
            self.server.account(self)

    def _charge_work(self, cpu_seconds: float) -> None:
        """Spend credit on work done off the loop for this peer; in debt, it rests (neither read nor
        answered) until WORK_CPU_PER_S has earned the debt back.  That work's answer is already out:
        only the requests after it wait, and a peer sending bombs back to back gets its share of the
        worker thread and no more."""
        if self.work.spend(self.server.clock(), cpu_seconds) < 0 and not self.resting:
            self.resting = True
            assert self.server.loop is not None  # work is answered on the loop
            self.server.loop.call_later(self.work.wait_s(), self._rested)

    def _rested(self) -> None:
        self.resting = False
        self._carry_on()

    def _carry_on(self) -> None:
        """Read again if nothing else holds the connection back, and answer the frames already in."""
        if self.transport is None or self.transport.is_closing():
            return
        self._update_reading()
        try:
            self._answer_buffered()
        except Exception as e:
            self.drop(departure.read_failed(e))

    def _write(self, out: list[bytes]) -> None:
        if out:
            assert self.transport is not None  # answers follow connection_made
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _update_reading(self) -> None:
        reading = not (self.paused or self.held_back or self.throttled or self.resting or self.pending is not None)
        assert self.transport is not None  # the node and the transport hold a connection back after connection_made
        if reading != self.reading and not self.transport.is_closing():
            self.reading = reading
            if reading:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def hold_back(self, held_back: bool) -> None:
        """Stop (or resume) reading for the node's buffer budget."""
        if held_back and not self.held_back:
            self.held_back_since = self.server.clock()
        self.held_back = held_back
        self._update_reading()

    def pause_writing(self) -> None:
        self.paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self._carry_on()  # frames that arrived while we were held back

    def drop(self, why: Departure) -> None:
        """Close this connection for something its peer sent, with one (rate-limited) warning."""
        why = why.bounded(_REASON_MAX_CHARS)  # reasons may quote what the peer sent
        _drop_log.log(logging.WARNING, "closing connection from %s: %s", self.peer, why)
        self.close(why)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.release(self)
        # an unfinished frame of up to 16 MiB: freed now, whoever still refers to this connection
        self.decoder = FrameDecoder()
        # the transport refers to us too: without this cycle the connection goes by reference counting
        # at once, not at the next full collection (which may be far off)
        self.transport = None
        why = self.close_reason or (departure.PEER_CLOSED if exc is None else departure.connection_error(exc))
        self.server.channel_destroyed(self, why)

    def close(self, why: Departure | None = None) -> None:
        """Close from our side; ``why`` is what the brokers' CHANNEL_CLOSED events will say (None:
        as if the peer had closed it)."""
        if self.transport is not None and not self.transport.is_closing():
            if self.close_reason is None:
                self.close_reason = why
            self.transport.close()

    def __repr__(self) -> str:
        return f"Connection({self.peer})"


class RemotingServer:
    """The node's listening TCP server: its connections, their buffers and its background tasks."""

    def __init__(
        self,
        context: HandlerContext,
        clock: Callable[[], float] = time.monotonic,
        *,
        catching_up: Callable[[], bool] = lambda: False,
        repeats: Repeats | None = None,
        request_stats: RequestStats | None = None,
    ) -> None:
        self.context = context
        #: monotonic seconds, for the connections' idle limit
        self.clock = clock
        #: True while the node catches up after it stood still (:meth:`MonitorWatchdog.catching_up`)
        self.catching_up = catching_up
        self.connections: set[Connection] = set()
        #: set by stop(): closes from then on are the node's own shutdown, not the brokers'
        self._stopping = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.base_events.Server | None = None
        #: accepts and sets up connections itself when TLS or the PROXY protocol is on
        self._acceptor: Acceptor | None = None
        mode = context.config.response_serialize_type.upper()
        self._echo_type = mode == "ECHO"
        self._response_type = SerializeType.ROCKETMQ if mode == "ROCKETMQ" else SerializeType.JSON
        self.loop: asyncio.AbstractEventLoop | None = None
        #: bytes held for all connections as last counted (see Connection.held)
        self.held_total = 0
        #: connections receiving a large frame, each waiting for its next read, first come first read
        self._large_reads: collections.deque[Connection] = collections.deque()
        self._large_read_due = False
        #: bytes of large frames that may be read now (negative: read ahead of the pace)
        self._large_read = Credit.full(LARGE_FRAME_BYTES_PER_S, _READ_BYTES, clock())
        #: what connections not receiving a large frame read into; each read is fed to its decoder at once
        self.read_buffer = memoryview(bytearray(_READ_BYTES))
        self._budget_check: asyncio.TimerHandle | None = None
        #: (SO_SNDBUF, SO_RCVBUF) option values for each accepted socket, 0 = the OS default
        self._socket_buffers: tuple[tuple[int, int], ...] = ()
        #: (high, low) write-buffer marks for each transport; None = the transport's defaults
        self._water_marks: tuple[int, int] | None = None
        #: requests counted for the metrics endpoint (namesrv.metrics); None: not counted (metricsPort=0)
        self.request_stats = request_stats
        #: route lookups and heartbeats answered again from their bytes; None: every request takes the full path
        self.repeats = repeats
        #: addresses told they began a TLS handshake on this plaintext-only node, and when
        self._tls_clients = LogThrottle(TLS_CLIENT_WARNING_S, clock, max_keys=_TLS_CLIENTS_REMEMBERED)

    @property
    def port(self) -> int:
        if self._acceptor is not None:
            return self._acceptor.port
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def encode_response(self, request: RemotingCommand, response: RemotingCommand) -> bytes:
        response.serialize_type = request.serialize_type if self._echo_type else self._response_type
        try:
            return encode(response)
        except LocalProtocolError as e:  # e.g. an answer beyond the 16 MiB frame limit
            log.warning("cannot answer code %s: %s", request.code, e)
            failure = request.response(ResponseCode.SYSTEM_ERROR, f"the answer cannot be sent: {e}")
            failure.serialize_type = response.serialize_type
            return encode(failure)

    def tls_client_refused(self, peer: str) -> None:
        """``peer`` began a TLS handshake, which this plaintext-only node closes: say so, with the keys
        that would serve it, once per address (a client retrying must not fill the log)."""
        host = peer.rpartition(":")[0] or peer
        if self._tls_clients.allow(host):
            _drop_log.log(
                logging.WARNING,
                "closing connection from %s: a TLS client reached this plaintext-only node; %s, or start the"
                " client without TLS (said once per address every %g h)",
                peer,
                plaintext_only(self.context.config.tls_server_mode),
                TLS_CLIENT_WARNING_S / 3600,
            )
        else:
            log.debug("closing connection from %s: a TLS handshake again", peer)

    def read_large_frame_later(self, connection: Connection, read: int) -> None:
        """Queue ``connection``, which has just read ``read`` bytes of a large frame, for its next
        read: after the others receiving one have had theirs, at LARGE_FRAME_BYTES_PER_S node-wide."""
        self._large_read.spend(self.clock(), read)
        self._large_reads.append(connection)
        if not self._large_read_due:
            self._large_read_due = True
            self._schedule_large_read()

    def _schedule_large_read(self) -> None:
        assert self.loop is not None  # connections exist only once the server listens
        if self._large_read.balance > -_PACE_SLACK_BYTES:
            self.loop.call_soon(self._next_large_read)
        else:
            self.loop.call_later(self._large_read.wait_s(), self._next_large_read)

    def _next_large_read(self) -> None:
        # one read per turn at most, and no more bytes than the pace allows (see the module notes):
        # otherwise every connection streaming an unfinished frame reads in the same turn, and every
        # other client waits for all those reads (bench/RESULTS.md, "Large frames read at a node-wide
        # pace").  Those not reading anyway (held back for the budget, waiting for their answers to be
        # read, closed) do not use up the turn.
        if self._large_read.spend(self.clock(), 0) <= -_PACE_SLACK_BYTES:  # a read came in since this was scheduled
            self._schedule_large_read()
            return
        queue = self._large_reads
        while queue and not queue.popleft().unthrottle():
            pass
        self._large_read_due = bool(queue)
        if queue:
            self._schedule_large_read()

    # -- the node-wide buffer budget ---------------------------------------------------------

    def account(self, connection: Connection) -> None:
        """Count what ``connection`` holds now; past the budget, hold back the large holders."""
        transport = connection.transport
        held = connection.decoder.buffered + (0 if transport is None else transport.get_write_buffer_size())
        self.held_total += held - connection.held
        connection.held = held
        if self.held_total > BUFFER_BUDGET_BYTES:
            self._enforce_budget()

    def release(self, connection: Connection) -> None:
        self.held_total -= connection.held
        connection.held = 0

    def _recount(self) -> int:
        """The exact total: answers drain from write buffers without telling us."""
        total = 0
        for c in self.connections:
            t = c.transport
            c.held = c.decoder.buffered + (0 if t is None else t.get_write_buffer_size())
            total += c.held
        self.held_total = total
        return total

    def _enforce_budget(self) -> None:
        if self._recount() <= BUFFER_BUDGET_BYTES:
            return
        offenders = large_holders(((c, c.held) for c in self.connections if not c.held_back), BUDGET_OFFENDER_BYTES)
        if not offenders:
            return
        _drop_log.log(
            logging.WARNING,
            "%d bytes held for peers, over the budget of %d: no longer reading from %s",
            self.held_total,
            BUFFER_BUDGET_BYTES,
            ", ".join(f"{c.peer} ({c.held} bytes)" for c in offenders[:5])
            + (f" and {len(offenders) - 5} more" if len(offenders) > 5 else ""),
        )
        for c in offenders:
            c.hold_back(True)
        if self._budget_check is None and self.loop is not None:
            self._budget_check = self.loop.call_later(_BUDGET_CHECK_S, self._check_budget)

    def _check_budget(self) -> None:
        """While connections are held back: resume them once the total is under 3/4 of the budget."""
        self._budget_check = None
        held_back = [c for c in self.connections if c.held_back]
        if not held_back:
            return
        self._close_stalled(held_back)
        if may_resume(self._recount(), BUFFER_BUDGET_BYTES):
            for c in held_back:
                c.hold_back(False)
            return
        assert self.loop is not None  # this runs on the loop, scheduled by call_later
        self._budget_check = self.loop.call_later(_BUDGET_CHECK_S, self._check_budget)

    def _close_stalled(self, held_back: list[Connection]) -> None:
        """Close the connections held back for longer than HELD_BACK_LIMIT_S that carry no broker.

        Such a connection makes no progress and holds memory: an unfinished frame that cannot grow.
        Its peer may even be gone, unseen (its FIN waits behind the bytes we do not read).  Closing
        frees the memory now rather than at the idle limit.  A broker's connection is left alone:
        closing it would unregister the broker, which a peer filling the budget must not achieve.
        """
        deadline = self.clock() - HELD_BACK_LIMIT_S
        for c in held_back:
            closing = c.transport is None or c.transport.is_closing()
            # a broker's connection, or tables too busy to tell (try again at the next check): left alone
            if (
                not closing
                and c.held_back_since < deadline
                and self.context.routes.on_channel_destroy(c, wait=False) == []
            ):
                c.drop(departure.stalled(HELD_BACK_LIMIT_S, c.decoder.buffered))

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Every background task goes through here, so shutdown can find and cancel it."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    def channel_destroyed(self, connection: Connection, why: Departure) -> None:
        requests = self.context.routes.on_channel_destroy(connection, wait=self.loop is None or self._stopping)
        if requests is None:
            # the worker is applying a large registration, which may hold the tables for a second:
            # look again shortly rather than stall every client meanwhile
            assert self.loop is not None
            self.loop.call_later(_TABLES_BUSY_RETRY_S, self.channel_destroyed, connection, why)
            return
        if not requests:
            return
        addrs = [r.broker_addr for r in requests]
        policy = departure.on_connection_end(node_stopping=self._stopping, catching_up=self.catching_up())
        if policy is OnConnectionEnd.LEAVE_TO_DEADLINE:
            log.warning("%s from %s while this node catches up after standing still: %s %s", why, connection.peer,
                        addrs, policy.value)  # fmt: skip
            return
        log.info("%s from %s: unregistering %s", why, connection.peer, addrs)
        self.context.submit_unregister(requests)
        if policy is OnConnectionEnd.UNREGISTER:
            for r in requests:
                self.context.observer.broker_unregistered(r, why)

    def _read_socket_settings(self) -> None:
        """Netty reads these once, when it binds; so do we (an update at run time changes nothing)."""
        config = self.context.config
        self._socket_buffers = tuple(
            (option, size)
            for option, size in (
                (socket.SO_SNDBUF, config.server_socket_snd_buf_size),
                (socket.SO_RCVBUF, config.server_socket_rcv_buf_size),
            )
            if size > 0
        )
        high, low = config.write_buffer_high_water_mark, config.write_buffer_low_water_mark
        # as NettyRemotingServer: only when both are set (load_config refused low > high)
        self._water_marks = (high, low) if high > 0 and low > 0 else None

    def tune(self, transport: asyncio.Transport) -> None:
        """Apply the configured socket buffers and write-buffer marks to a new connection."""
        if self._socket_buffers:
            sock = transport.get_extra_info("socket")
            try:
                for option, size in self._socket_buffers:
                    sock.setsockopt(socket.SOL_SOCKET, option, size)
            except (OSError, AttributeError) as e:  # the peer is already gone: connection_lost follows
                log.debug("cannot set socket buffers for %s: %r", transport.get_extra_info("peername"), e)
        if self._water_marks is not None:
            high, low = self._water_marks
            transport.set_write_buffer_limits(high=high, low=low)

    async def start(self, host: str, port: int) -> None:
        self._read_socket_settings()
        tune_for_serving()
        self.loop = loop = asyncio.get_running_loop()
        backlog = self.context.config.server_socket_backlog
        security = TransportSecurity.from_config(self.context.config)  # ConfigError naming the key
        if security.sniffing:
            self._acceptor = Acceptor(security, lambda peer: Connection(self, peer), self.spawn)
            await self._acceptor.listen(host, port, backlog)
        else:
            self._server = await loop.create_server(
                lambda: Connection(self), host, port, reuse_address=True, backlog=backlog
            )
        # at the default level, as the node's other start-up lines: whether TLS and PROXY are on
        log.warning("remoting port %s:%d: %s", host, self.port, security.describe())
        self.spawn(self._close_idle_connections(), "idle-connections")

    async def _close_idle_connections(self) -> None:
        idle_limit = self.context.config.server_channel_max_idle_time_seconds
        if idle_limit <= 0:
            return
        while True:
            await asyncio.sleep(min(idle_limit, 1.0))
            self.close_idle_connections()

    def close_idle_connections(self) -> None:
        """Close every connection silent for longer than serverChannelMaxIdleTimeSeconds (0: never)."""
        idle_limit = self.context.config.server_channel_max_idle_time_seconds
        if idle_limit <= 0:
            return
        deadline = self.clock() - idle_limit
        for connection in [c for c in self.connections if c.last_active < deadline]:
            log.info("closing idle connection from %s (no traffic for %ss)", connection.peer, idle_limit)
            connection.close(departure.idle(idle_limit))

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop listening, close every connection, wait up to ``timeout``, then cancel what is left."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        if self._acceptor is not None:
            self._acceptor.close()
        for connection in list(self.connections):
            connection.close(departure.NODE_STOPPING)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout)
        if self._budget_check is not None:
            self._budget_check.cancel()
        # KV and config writes already acknowledged to no one may still be running: let them end
        await asyncio.wait_for(asyncio.to_thread(self.context.close), timeout)
        if self._server is not None:
            await asyncio.wait_for(self._server.wait_closed(), timeout)
