"""A stand-in RocketMQ broker for the peer tests: it listens, records, and answers just enough.

Theory of operation: a real client (the C++ producer, ali-ons) asks the name server for a route and
then connects to a broker address taken from that route.  There is no real broker here, so a test
registers this listener's address as the broker's and watches what arrives.  A SEND_MESSAGE for the
test topic on this socket proves the client parsed our route answer.  Every request frame is
recorded; SEND_MESSAGE variants get a minimal success reply so the producer returns, every other
two-way request gets a bare SUCCESS, and oneway frames get nothing, as a broker would do.

Threads, not asyncio, because the tests that use it block on subprocesses; ``wait_for`` is the
only way a test should wait for a frame.  Frames go through our own codec
(:mod:`common.protocol.codec`), which the conformance tests check against the spec's vectors.
"""

from __future__ import annotations

import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from common.protocol.codec import FrameDecoder, RemoteProtocolError, encode
from common.protocol.codes import ResponseCode
from common.protocol.command import RemotingCommand

log = logging.getLogger(__name__)


class BrokerCode(IntEnum):
    """Request codes a client sends to a broker (not handled by the name server)."""

    SEND_MESSAGE = 10
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320


SEND_CODES = frozenset({BrokerCode.SEND_MESSAGE, BrokerCode.SEND_MESSAGE_V2, BrokerCode.SEND_BATCH_MESSAGE})

#: SEND_MESSAGE_V2 abbreviates the header field names to single letters; ``b`` is the topic
_TOPIC_EXT_KEYS = ("topic", "b")


@dataclass(frozen=True, slots=True)
class Frame:
    """One received command, with where and when it arrived."""

    command: RemotingCommand
    peer: str
    received_at: float

    @property
    def code(self) -> int:
        return self.command.code

    @property
    def ext_fields(self) -> dict[str, str]:
        return self.command.ext_fields or {}

    @property
    def body(self) -> bytes:
        return self.command.body or b""

    @property
    def language(self) -> str:
        return self.command.language.name

    @property
    def version(self) -> int:
        return self.command.version

    @property
    def topic(self) -> str | None:
        for key in _TOPIC_EXT_KEYS:
            if key in self.ext_fields:
                return self.ext_fields[key]
        return None


@dataclass(frozen=True, slots=True)
class Reply:
    """What to send back; ``None`` from a responder means no reply at all."""

    code: int = ResponseCode.SUCCESS
    ext_fields: dict[str, str] | None = None
    body: bytes | None = None
    remark: str | None = None


Responder = Callable[[Frame], Reply | None]


def send_success(frame: Frame, *, queue_offset: int = 0) -> Reply:
    """A SendMessageResponseHeader as a broker fills it, enough for a producer to report SEND_OK."""
    queue_id = frame.ext_fields.get("queueId") or frame.ext_fields.get("e") or "0"
    # 16-byte store address + offset rendered as hex: only the shape matters to the client
    msg_id = f"7F00000100002A9F{queue_offset:016X}"
    return Reply(ext_fields={"msgId": msg_id, "queueId": queue_id, "queueOffset": str(queue_offset)})


def default_responder(frame: Frame) -> Reply | None:
    if frame.code in SEND_CODES:
        return send_success(frame)
    return Reply()


@dataclass
class _State:
    frames: list[Frame] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connections: int = 0
    open_sockets: set[socket.socket] = field(default_factory=set)
    cond: threading.Condition = field(default_factory=threading.Condition)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        peer = "%s:%d" % sock.getpeername()[:2]
        state = self.server.state
        with state.cond:
            state.connections += 1
            state.open_sockets.add(sock)
            state.cond.notify_all()
        try:
            self._serve(sock, peer)
        finally:
            with state.cond:
                state.open_sockets.discard(sock)

    def _serve(self, sock: socket.socket, peer: str) -> None:
        decoder = FrameDecoder()
        state = self.server.state
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            decoder.feed(chunk)
            while True:
                try:
                    cmd = decoder.next_command()
                except RemoteProtocolError as exc:
                    with state.cond:
                        state.errors.append(f"{peer}: {exc}")
                        state.cond.notify_all()
                    return  # a real broker closes the connection on a decode error
                if cmd is None:
                    break
                if not self._one(sock, Frame(cmd, peer, time.monotonic())):
                    return

    def _one(self, sock: socket.socket, frame: Frame) -> bool:
        state = self.server.state
        with state.cond:
            state.frames.append(frame)
            state.cond.notify_all()
        if frame.command.is_response or frame.command.is_oneway:
            return True
        reply = self.server.responder(frame)
        if reply is None:
            return True
        response = frame.command.response(reply.code, reply.remark, ext_fields=reply.ext_fields, body=reply.body)
        try:
            sock.sendall(encode(response))
        except OSError:
            return False
        return True


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], responder: Responder) -> None:
        self.state = _State()
        self.responder = responder
        super().__init__(addr, _Handler)


class FakeBroker:
    """A recording broker on ``host:port`` (port 0 picks a free one).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.  ``responder`` decides the
    reply to each two-way request; the default acknowledges sends and answers SUCCESS otherwise.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, responder: Responder = default_responder) -> None:
        self._bind = (host, port)
        self._responder = responder
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeBroker:
        if self._server is not None:
            raise RuntimeError("FakeBroker already started")
        self._server = _Server(self._bind, self._responder)
        # a short poll interval keeps stop() fast: shutdown() waits for the loop to notice
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-broker", daemon=True
        )
        self._thread.start()
        log.debug("fake broker listening on %s", self.address)
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        # like a broker process exiting: clients see their connections close
        with self._server.state.cond:
            live = list(self._server.state.open_sockets)
        for sock in live:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> FakeBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._require().server_address[1]

    @property
    def address(self) -> str:
        """``ip:port`` as a broker puts it in ``brokerAddr``."""
        host, port = self._require().server_address[:2]
        return f"{host}:{port}"

    @property
    def frames(self) -> list[Frame]:
        state = self._require().state
        with state.cond:
            return list(state.frames)

    @property
    def errors(self) -> list[str]:
        state = self._require().state
        with state.cond:
            return list(state.errors)

    @property
    def connections(self) -> int:
        state = self._require().state
        with state.cond:
            return state.connections

    def wait_for(self, predicate: Callable[[Frame], bool], timeout: float = 10.0) -> Frame:
        """The first recorded frame matching ``predicate``; TimeoutError names what did arrive."""
        state = self._require().state
        deadline = time.monotonic() + timeout
        with state.cond:
            while True:
                for frame in state.frames:
                    if predicate(frame):
                        return frame
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(f.code, f.topic) for f in state.frames]
                    raise TimeoutError(
                        f"no matching frame within {timeout}s at fake broker {self.address}; "
                        f"received (code, topic): {seen}; connections: {state.connections}; "
                        f"decode errors: {state.errors}"
                    )
                state.cond.wait(left)

    def wait_for_send(self, topic: str, timeout: float = 10.0) -> Frame:
        """The first SEND_MESSAGE / SEND_MESSAGE_V2 / batch for ``topic``."""
        return self.wait_for(lambda f: f.code in SEND_CODES and f.topic == topic, timeout)

    def _require(self) -> _Server:
        if self._server is None:
            raise RuntimeError("FakeBroker is not started; call start() or use it as a context manager")
        return self._server
