"""Connection set-up when TLS or the PROXY protocol is on: what comes before the first frame.

RocketMQ serves TLS and plaintext on one port and tells them apart by the first byte, after an
optional PROXY preamble.  A node configured for neither never comes here and listens with the
loop's own server.  Otherwise :class:`Acceptor` accepts each connection and works on the raw socket
before any transport exists: it peeks at the first byte, takes exactly the preamble's bytes off the
socket (:class:`~common.protocol.proxy.ProxyParser`) so that the client, not the proxy, becomes the
peer, then hands the socket to the loop with TLS (a ``0x16`` first byte) or as plaintext, as
``tls.server.mode`` allows.  Everything must finish within ``handshakeTimeoutMillis``, at most
:data:`MAX_PENDING` connections may be in set-up, and a failure closes that connection only, with a
rate-limited warning.  A plaintext-only node closes a TLS client in its decoder instead; what it
says then is :func:`plaintext_only`.  ``docs/internals/tls-and-proxy.md`` walks through each step.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from common.logs import RateLimited
from common.protocol.codec import TLS_RECORD_HANDSHAKE
from common.protocol.proxy import Detected, ProxyHeader, ProxyParser, ProxyProtocolError, detect
from namesrv.config import NamesrvConfig
from namesrv.tls import TlsSettings, server_context, tls_settings

__all__ = ["TransportSecurity", "Acceptor", "MAX_PENDING", "plaintext_only"]

log = logging.getLogger("namesrv.handshake")

#: connections in set-up at once; past it new ones are closed at once
MAX_PENDING = 1024
_LOG_PER_MINUTE = 20
#: bytes peeked at a time while reading a preamble: a v1 line, or a v2 header with its bound
_PEEK_BYTES = 16 + 4096
#: after EMFILE and the like, wait this long before accepting again (as asyncio's own server does)
_ACCEPT_BACKOFF_S = 0.1
_drop_log = RateLimited(log, per_minute=_LOG_PER_MINUTE)


@dataclass(frozen=True)
class TransportSecurity:
    """What the node does before the first frame, read once when it starts listening."""

    tls: TlsSettings
    #: None: plaintext only
    context: ssl.SSLContext | None
    #: disabled, optional or required
    proxy_mode: str
    timeout_s: float

    @classmethod
    def from_config(cls, cfg: NamesrvConfig) -> TransportSecurity:
        """Raises :class:`~common.options.ConfigError` naming the key when something cannot be used."""
        settings = tls_settings(cfg)
        return cls(settings, server_context(settings), cfg.proxy_protocol_mode, cfg.handshake_timeout_millis / 1000)

    @property
    def sniffing(self) -> bool:
        """Whether connections need set-up here before the node reads frames (else the loop's own server)."""
        return self.context is not None or self.proxy_mode != "disabled"

    def describe(self) -> str:
        """What the node serves, for its start-up line: TLS with its mode and client-auth, and PROXY."""
        mode = f"tls.server.mode={self.tls.mode}"
        if self.context is None:
            tls = f"off ({mode})" if self.tls.mode == "disabled" else f"off ({mode}, no certificate)"
        else:
            certificate = "self-signed, test mode" if self.tls.test_mode else self.tls.cert_path
            tls = f"on ({mode}, tls.server.need.client.auth={self.tls.need_client_auth}, certificate {certificate})"
        return f"TLS {tls}; proxyProtocolMode={self.proxy_mode}"


def plaintext_only(tls_mode: str) -> str:
    """Why a node with ``tls.server.mode=tls_mode`` and no TLS context closes a TLS handshake, and the
    keys that would let it serve one."""
    if tls_mode == "disabled":
        return (
            "tls.server.mode=disabled: to serve TLS, set tls.server.mode=permissive (or enforcing) with"
            " tls.server.certPath and tls.server.keyPath (docs/security.md)"
        )
    return (
        f"tls.server.mode={tls_mode} but no certificate: to serve TLS, set tls.server.certPath and"
        " tls.server.keyPath (docs/security.md)"
    )


class _Refused(Exception):
    """The connection is closed for the reason given (already phrased for the log)."""


class _Gone(Exception):
    """The peer closed before set-up finished: nothing worth a warning."""


def format_addr(addr: Any) -> str:
    """``host:port`` of a socket address (the same shape the node's log lines always used)."""
    try:
        return f"{addr[0]}:{addr[1]}"
    except (TypeError, IndexError):
        return "?"


class Acceptor:
    """Listens, sets each connection up (PROXY preamble, TLS or plaintext), then hands it to the loop."""

    def __init__(
        self,
        security: TransportSecurity,
        protocol_factory: Callable[[str], asyncio.BaseProtocol],
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
    ) -> None:
        self.security = security
        #: builds the connection's protocol for its peer address (the client's, when a proxy said so)
        self.protocol_factory = protocol_factory
        self.spawn = spawn
        self.pending = 0
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting: asyncio.Task[Any] | None = None

    @property
    def port(self) -> int:
        assert self._sock is not None
        return int(self._sock.getsockname()[1])

    async def listen(self, host: str, port: int, backlog: int) -> None:
        self._loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=backlog)  # SO_REUSEADDR, as create_server
        sock.setblocking(False)
        self._sock = sock
        self._accepting = self.spawn(self._accept_loop(sock), "accept")

    def close(self) -> None:
        """Stop accepting; connections in set-up are the node's tasks, which its stop() cancels."""
        if self._accepting is not None:
            self._accepting.cancel()
        if self._sock is not None and self._loop is not None:
            # once the cancelled accept has let go of the socket
            self._loop.call_soon(self._sock.close)

    async def _accept_loop(self, listener: socket.socket) -> None:
        assert self._loop is not None
        while True:
            try:
                sock, addr = await self._loop.sock_accept(listener)
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                continue
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS: the connections we hold must drain first
                _drop_log.log(logging.WARNING, "cannot accept connections: %s", e)
                await asyncio.sleep(_ACCEPT_BACKOFF_S)
                continue
            peer = format_addr(addr)
            if self.pending >= MAX_PENDING:
                _drop_log.log(
                    logging.WARNING, "closing connection from %s: %d connections in set-up", peer, MAX_PENDING
                )
                sock.close()
                continue
            self.pending += 1
            self.spawn(self._set_up(sock, peer), "connection-set-up")

    async def _set_up(self, sock: socket.socket, peer: str) -> None:
        sock.setblocking(False)
        handed_over = False
        try:
            async with asyncio.timeout(self.security.timeout_s):
                peer, use_tls = await self._before_first_frame(sock, peer)
                await self._hand_over(sock, peer, use_tls)
                handed_over = True
        except TimeoutError:
            _drop_log.log(
                logging.WARNING,
                "closing connection from %s: set-up (PROXY preamble, TLS handshake) not finished within %d ms"
                " (handshakeTimeoutMillis)",
                peer,
                round(self.security.timeout_s * 1000),
            )
        except (_Refused, ProxyProtocolError) as e:
            _drop_log.log(logging.WARNING, "closing connection from %s: %s", peer, e)
        except ssl.SSLError as e:
            _drop_log.log(logging.WARNING, "closing connection from %s: TLS handshake failed: %s", peer, e)
        except (_Gone, OSError) as e:  # reset, or closed mid-way: the peer left
            log.debug("connection from %s ended during set-up: %r", peer, e)
        except Exception as e:  # a bug on our side must cost this connection, never the node's loop
            _drop_log.log(logging.WARNING, "closing connection from %s: set-up failed: %r", peer, e)
        finally:
            self.pending -= 1
            if not handed_over:
                sock.close()

    async def _before_first_frame(self, sock: socket.socket, peer: str) -> tuple[str, bool]:
        """The peer to name and whether TLS follows, once any preamble is read off the socket."""
        sec = self.security
        first = await self._peek(sock, 1)
        if sec.proxy_mode != "disabled":
            if detect(first) is not Detected.NONE:
                header = await self._read_preamble(sock)
                if header.source is not None:
                    proxy, peer = peer, format_addr(header.source)
                    log.debug("connection from %s relayed by %s (PROXY v%d)", peer, proxy, header.version)
                first = await self._peek(sock, 1)
            elif sec.proxy_mode == "required":
                raise _Refused("no PROXY protocol preamble (proxyProtocolMode=required)")
        use_tls = first[0] == TLS_RECORD_HANDSHAKE and sec.context is not None
        if not use_tls and sec.tls.mode == "enforcing":
            raise _Refused("plaintext refused (tls.server.mode=enforcing)")
        return peer, use_tls

    async def _hand_over(self, sock: socket.socket, peer: str, use_tls: bool) -> None:
        assert self._loop is not None
        await self._loop.connect_accepted_socket(
            lambda: self.protocol_factory(peer),
            sock,
            ssl=self.security.context if use_tls else None,
            # a backstop only: the set-up's own deadline, around this call, normally ends it first
            ssl_handshake_timeout=self.security.timeout_s + 1.0 if use_tls else None,
        )

    async def _read_preamble(self, sock: socket.socket) -> ProxyHeader:
        parser = ProxyParser()
        while parser.header is None:
            taken = parser.feed(await self._peek(sock, _PEEK_BYTES))  # >= 1 byte, or it raises
            # the bytes are in the kernel's buffer (just peeked): this reads exactly them
            if len(sock.recv(taken)) != taken:
                raise _Gone("the peeked preamble could not be read")
        return parser.header

    async def _peek(self, sock: socket.socket, size: int) -> bytes:
        """At least one byte that has arrived, left in the socket; :class:`_Gone` at end of stream."""
        while True:
            try:
                data = sock.recv(size, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                await self._readable(sock)
                continue
            if not data:
                raise _Gone("closed by the peer")
            return data

    async def _readable(self, sock: socket.socket) -> None:
        assert self._loop is not None
        loop = self._loop
        ready = loop.create_future()
        fd = sock.fileno()
        loop.add_reader(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)
