"""The asyncio shell around the sans-I/O core: connections, framing, dispatch, shutdown.

``data_received`` only feeds the decoder and dispatches complete commands; everything a request
does happens in :mod:`namesrv.handlers`.  A frame the decoder rejects closes that connection and
nothing else.  A connection that closes, or stays silent for ``serverChannelMaxIdleTimeSeconds``,
unregisters the brokers that registered through it, as Netty's channel events do in Java, and the
observer hears why (the CHANNEL_CLOSED event's reason): ``connection closed`` (by the peer),
``connection error: ...``, ``idle for N s (serverChannelMaxIdleTimeSeconds)`` or ``malformed frame: ...``.
A node that stops closes every connection without reporting them: its brokers did not lose anything
the monitor should act on.

A peer that sends requests but does not read the answers gets no more answers buffered for it than
the transport's high-water mark: past it we stop reading from that peer until it catches up.  Java
queues such requests in its executors and answers SYSTEM_BUSY once they are full; holding back
lets TCP slow the peer down instead, and no request is refused or lost.

The node's only outbound traffic is NOTIFY_MIN_BROKER_ID_CHANGE (``notifyMinBrokerIdChanged``):
each one is a background task that connects to the broker's own address, writes the oneway frame
and closes.  Java keeps a pooled client connection per broker instead; notifications are rare
(a group's minimum id changes), so a connection each costs less than keeping them open.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Coroutine
from typing import Any

from namesrv.client import parse_addr
from namesrv.handlers import NameServerNode, dispatch, min_broker_id_change_request
from namesrv.protocol.codec import FrameDecoder, RemoteProtocolError, encode
from namesrv.protocol.codes import SerializeType
from namesrv.protocol.command import RemotingCommand
from namesrv.routes.model import MinBrokerIdChange

log = logging.getLogger("namesrv.server")

#: answers are written in batches of about this size, so one large read cannot queue without bound
_WRITE_BATCH_BYTES = 64 * 1024
#: how long Java's name-server client waits for a connection (NettyClientConfig.connectTimeoutMillis)
NOTIFY_CONNECT_TIMEOUT_S = 3.0
#: and for a oneway NOTIFY_MIN_BROKER_ID_CHANGE to be written (RouteInfoManager passes 300 ms)
NOTIFY_SEND_TIMEOUT_S = 0.3


class Connection(asyncio.Protocol):
    """One TCP connection from a broker, a client or an admin tool."""

    __slots__ = ("server", "transport", "decoder", "peer", "last_active", "paused", "close_reason")

    def __init__(self, server: NameServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder()
        self.peer = "?"
        self.last_active = time.monotonic()
        #: reading is paused because the peer is not reading our answers
        self.paused = False
        #: why the node closed this connection itself (None: the peer closed it, or an error did)
        self.close_reason: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # uvloop's transports are not asyncio.Transport subclasses
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        self.decoder.feed(data)
        self._answer_buffered()

    def _answer_buffered(self) -> None:
        """Answer the whole frames received so far, until done or until the peer stops reading."""
        out: list[bytes] = []
        size = 0
        try:
            while not self.paused and (request := self.decoder.next_command()) is not None:
                response = dispatch(self.server.node, request, self)
                if response is not None:
                    out.append(answer := self.server.encode_response(request, response))
                    size += len(answer)
                    if size >= _WRITE_BATCH_BYTES:  # may call pause_writing, which ends the loop
                        self._write(out)
                        out, size = [], 0
        except RemoteProtocolError as e:
            log.warning("closing connection from %s: malformed frame: %s", self.peer, e)
            self._write(out)
            self.close(f"malformed frame: {e}")
            return
        self._write(out)

    def _write(self, out: list[bytes]) -> None:
        if out:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def pause_writing(self) -> None:
        self.paused = True
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        if not self.transport.is_closing():
            self.transport.resume_reading()
            self._answer_buffered()  # frames that arrived while we were held back

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        reason = self.close_reason or ("connection closed" if exc is None else f"connection error: {exc}")
        self.server.channel_destroyed(self, reason)

    def close(self, reason: str | None = None) -> None:
        """Close from our side; ``reason`` is what the brokers' CHANNEL_CLOSED events will say."""
        if self.transport is not None and not self.transport.is_closing():
            if self.close_reason is None:
                self.close_reason = reason
            self.transport.close()

    def __repr__(self) -> str:
        return f"Connection({self.peer})"


class NameServer:
    """A listening name-server node and the background work that belongs to it."""

    def __init__(self, node: NameServerNode) -> None:
        self.node = node
        self.connections: set[Connection] = set()
        #: set by stop(): closes from then on are the node's own shutdown, not the brokers'
        self._stopping = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.base_events.Server | None = None
        mode = node.config.response_serialize_type.upper()
        self._echo_type = mode == "ECHO"
        self._response_type = SerializeType.ROCKETMQ if mode == "ROCKETMQ" else SerializeType.JSON
        self._opaque = itertools.count(1)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def encode_response(self, request: RemotingCommand, response: RemotingCommand) -> bytes:
        response.serialize_type = request.serialize_type if self._echo_type else self._response_type
        return encode(response)

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

    def channel_destroyed(self, connection: Connection, reason: str) -> None:
        requests = self.node.routes.on_channel_destroy(connection)
        if requests:
            log.info("%s from %s: unregistering %s", reason, connection.peer, [r.broker_addr for r in requests])
            self.node.submit_unregister(requests)
            if self._stopping:
                # the node is going away, not the broker's connection: reporting it would tell the
                # monitor the broker is gone here, and a fleet-wide restart would remove every broker
                return
            for r in requests:
                self.node.observer.broker_unregistered(r, reason)

    def notify_min_broker_id_change(self, change: MinBrokerIdChange) -> None:
        """Send the change to each of its targets in the background; failures are logged, never raised."""
        log.info("min broker id of %s is now %d (%s), offline %s: notifying %s", change.broker_name,
                 change.min_broker_id, change.min_broker_addr, change.offline_broker_addr, list(change.notify_addrs))
        for addr in change.notify_addrs:
            cmd = min_broker_id_change_request(change, next(self._opaque))
            cmd.serialize_type = self._response_type
            self.spawn(self._send_oneway(addr, encode(cmd)), f"notify-{addr}")

    async def _send_oneway(self, addr: str, frame: bytes) -> None:
        try:
            host, port = parse_addr(addr)
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), NOTIFY_CONNECT_TIMEOUT_S)
        except (OSError, ValueError, asyncio.TimeoutError) as e:
            log.info("could not connect to broker %s to notify it: %r", addr, e)
            return
        try:
            writer.write(frame)
            await asyncio.wait_for(writer.drain(), NOTIFY_SEND_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as e:
            log.info("could not notify broker %s: %r", addr, e)
        finally:
            writer.close()  # flushes what is buffered, then closes

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self), host, port, reuse_address=True, backlog=self.node.config.server_socket_backlog
        )
        self.spawn(self._close_idle_connections(), "idle-connections")

    async def _close_idle_connections(self) -> None:
        idle_limit = self.node.config.server_channel_max_idle_time_seconds
        if idle_limit <= 0:
            return
        while True:
            await asyncio.sleep(min(idle_limit, 1.0))
            deadline = time.monotonic() - idle_limit
            for connection in [c for c in self.connections if c.last_active < deadline]:
                log.info("closing idle connection from %s (no traffic for %ss)", connection.peer, idle_limit)
                connection.close(f"idle for {idle_limit} s (serverChannelMaxIdleTimeSeconds)")

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop listening, close every connection, wait up to ``timeout``, then cancel what is left."""
        self._stopping = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.close("node stopping")
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout)
        if self._server is not None:
            await asyncio.wait_for(self._server.wait_closed(), timeout)
