"""The asyncio adapter without sockets or waiting: a fake transport, a fake loop and a fake clock.

As uvicorn tests its protocol classes (``MockTransport`` / ``MockLoop``): raw frame bytes go into
``Connection.data_received`` and the test reads what the node wrote back.  The fake transport
calls ``pause_writing`` / ``resume_writing`` around its high- and low-water marks as asyncio's do,
and delivers ``connection_lost`` on the next turn of the fake loop, as asyncio does after ``close``.
Time moves only when a test moves it, so the idle limit (120 s) and the budget check are instant.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from common.logs import RateLimited
from common.protocol.codec import encode
from common.protocol.codes import FRAME_MAX_LENGTH, RequestCode, ResponseCode
from common.protocol.command import RemotingCommand, request
from namesrv import server as server_mod
from namesrv.app import build_node
from namesrv.config import load_config
from namesrv.handlers import MAX_REQUEST_HEADER_BYTES, NodeObserver
from namesrv.kvconfig import MAX_NAME_CHARS, MAX_VALUE_CHARS
from namesrv.liveness import Cause, Departure
from namesrv.repeats import Repeats
from namesrv.server import Connection, RemotingServer
from tests.support.attacks import SMALL_BOMB, zip_bomb_registration
from tests.support.brokers import registration
from tests.support.clock import Clock
from tests.support.frames import commands, json_frame
from tests.support.wait import wait_until

KiB = 1024
IDLE_LIMIT_S = 120
BROKER = "127.0.0.1:10911"


@dataclass
class _Timer:
    when: float
    callback: Callable[..., Any]
    args: tuple[Any, ...]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """What the server asks of its loop: callbacks now, callbacks later (on the fake clock)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.ready: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.timers: list[_Timer] = []

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        self.ready.append((callback, args))

    call_soon_threadsafe = call_soon

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> _Timer:
        timer = _Timer(self.clock.seconds() + delay, callback, args)
        self.timers.append(timer)
        return timer

    def is_closed(self) -> bool:
        return False

    def run_turn(self) -> None:
        """One turn of the loop: the callbacks ready now (what they schedule waits for the next turn)."""
        ready, self.ready = self.ready, []
        for callback, args in ready:
            callback(*args)

    def run_ready(self) -> None:
        while self.ready:
            callback, args = self.ready.pop(0)
            callback(*args)

    def advance(self, seconds: float) -> None:
        """Move the clock, then run the timers that came due and what they scheduled."""
        self.clock.advance(seconds=seconds)
        self.run_ready()
        now = self.clock.seconds()
        due = [t for t in self.timers if t.when <= now and not t.cancelled]
        self.timers = [t for t in self.timers if t not in due]
        for timer in sorted(due, key=lambda t: t.when):
            timer.callback(*timer.args)
            self.run_ready()


class FakeTransport:
    """Records what is written; the 'peer' reads it with :meth:`peer_reads`."""

    def __init__(
        self, loop: FakeLoop, peer: tuple[str, int], high_water: int = 64 * KiB, low_water: int = 16 * KiB
    ) -> None:
        self.loop = loop
        self.peer = peer
        self.high_water, self.low_water = high_water, low_water
        self.protocol: Connection | None = None
        #: written by the node and not yet read by the peer
        self.unread = bytearray()
        #: every pause_reading / resume_reading call, in order
        self.reading_calls: list[str] = []
        self.closing = False
        self._writing_paused = False

    def get_extra_info(self, name: str) -> Any:
        return self.peer if name == "peername" else None

    def write(self, data: bytes) -> None:
        assert not self.closing, "write after close"
        self.unread += data
        if len(self.unread) > self.high_water and not self._writing_paused:
            self._writing_paused = True
            self.protocol.pause_writing()

    def get_write_buffer_size(self) -> int:
        return len(self.unread)

    def pause_reading(self) -> None:
        self.reading_calls.append("pause")

    def resume_reading(self) -> None:
        self.reading_calls.append("resume")

    @property
    def reading(self) -> bool:
        return not self.reading_calls or self.reading_calls[-1] == "resume"

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.loop.call_soon(self.protocol.connection_lost, None)

    def peer_reads(self) -> list[RemotingCommand]:
        """The peer takes everything written so far; the node may resume writing."""
        answers = commands(bytes(self.unread))
        self.unread.clear()
        if self._writing_paused and len(self.unread) <= self.low_water:
            self._writing_paused = False
            self.protocol.resume_writing()
        return answers


class Departures(NodeObserver):
    def __init__(self) -> None:
        self.seen: dict[str, Departure] = {}

    def broker_unregistered(self, request, departure):
        self.seen[request.broker_addr] = departure


@dataclass
class Harness:
    server: RemotingServer
    loop: FakeLoop
    clock: Clock
    observer: Departures
    drain_unregistrations: Callable[[], None]
    connections: list[tuple[Connection, FakeTransport]] = field(default_factory=list)

    def connect(self, port: int, host: str = "10.0.0.1", **transport: Any) -> tuple[Connection, FakeTransport]:
        connection = Connection(self.server)
        fake = FakeTransport(self.loop, (host, port), **transport)
        fake.protocol = connection
        connection.connection_made(fake)
        return connection, fake


@pytest.fixture
def harness(tmp_path, monkeypatch) -> Harness:
    config = load_config(None, {
        "kvConfigPath": str(tmp_path / "kv.json"), "configStorePath": str(tmp_path / "namesrv.properties"),
        "serverChannelMaxIdleTimeSeconds": str(IDLE_LIMIT_S),
    })  # fmt: skip
    observer = Departures()
    parts = build_node(config, observer=observer)
    clock = Clock()
    server = RemotingServer(parts.context, clock=clock.seconds, repeats=Repeats(parts.context))
    loop = FakeLoop(clock)
    server.loop = loop  # type: ignore[assignment]
    # the drop warnings are rate-limited per process: give this test its own budget
    monkeypatch.setattr(server_mod, "_drop_log", RateLimited(server_mod.log, per_minute=20))
    yield Harness(server, loop, clock, observer, parts.unregistrations.drain_now)
    parts.context.close()


def register_frame(broker_addr: str = BROKER, opaque: int = 1) -> bytes:
    ext, body = registration(broker_addr=broker_addr, topics=["TopicTest"])
    return encode(request(RequestCode.REGISTER_BROKER, ext, body, opaque=opaque))


def route_frame(opaque: int, topic: str = "TopicTest") -> bytes:
    return encode(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, opaque=opaque))


def routes_of(harness: Harness) -> Any:
    return harness.server.context.routes


# --------------------------------------------------------------------------- framing


def test_a_request_split_across_reads_is_answered_once_it_is_whole(harness):
    connection, transport = harness.connect(5000)
    connection.data_received(register_frame())
    assert [a.code for a in transport.peer_reads()] == [ResponseCode.SUCCESS]
    second, third = route_frame(2), route_frame(3)
    for i in range(len(second) - 1):  # one byte at a time: nothing until the frame is whole
        connection.data_received(second[i : i + 1])
        assert transport.unread == b""
    connection.data_received(second[-1:] + third[:5])  # its last byte, and the start of the next
    assert [(a.opaque, a.code) for a in transport.peer_reads()] == [(2, ResponseCode.SUCCESS)]
    assert connection.decoder.buffered == 5
    connection.data_received(third[5:])
    assert [(a.opaque, a.code) for a in transport.peer_reads()] == [(3, ResponseCode.SUCCESS)]
    assert connection.decoder.buffered == 0 and not transport.closing


# --------------------------------------------------------------------------- idle limit


def test_a_connection_silent_past_the_idle_limit_is_closed_and_its_broker_reported_idle(harness):
    broker, broker_transport = harness.connect(5000)
    client, client_transport = harness.connect(5001)
    broker.data_received(register_frame())
    harness.clock.advance(seconds=IDLE_LIMIT_S / 2)
    client.data_received(route_frame(1))
    harness.clock.advance(seconds=IDLE_LIMIT_S / 2)
    harness.server.close_idle_connections()  # exactly the limit: not yet
    assert not broker_transport.closing
    harness.clock.advance(seconds=0.001)
    harness.server.close_idle_connections()
    assert broker_transport.closing and not client_transport.closing
    assert harness.observer.seen == {}  # reported when the transport says it is gone
    harness.loop.run_ready()
    why = harness.observer.seen[BROKER]
    assert (why.cause, why.reason) == (Cause.IDLE, "idle for 120 s (serverChannelMaxIdleTimeSeconds)")
    assert broker not in harness.server.connections and client in harness.server.connections
    harness.drain_unregistrations()
    assert routes_of(harness).last_seen("DefaultCluster", BROKER) is None
    harness.clock.advance(seconds=IDLE_LIMIT_S / 2 + 0.001)
    harness.server.close_idle_connections()
    assert client_transport.closing


def test_an_idle_limit_of_zero_closes_nothing(harness):
    harness.server.context.config.server_channel_max_idle_time_seconds = 0
    _, transport = harness.connect(5000)
    harness.clock.advance(seconds=10 * IDLE_LIMIT_S)
    harness.server.close_idle_connections()
    assert not transport.closing


def test_a_peer_that_closes_reports_connection_closed(harness):
    broker, _ = harness.connect(5000)
    broker.data_received(register_frame())
    broker.connection_lost(None)
    assert str(harness.observer.seen[BROKER]) == "connection closed"
    assert harness.observer.seen[BROKER].cause is Cause.PEER_CLOSED


def test_a_close_read_while_the_node_catches_up_after_standing_still_leaves_its_broker_to_its_deadline(
    harness, monkeypatch
):
    """A broker closes a connection whose requests time out, as every one does on a node that stood still:
    read on waking, that end is not the broker's departure (it registers again on a new connection)."""
    broker, _ = harness.connect(5000)
    broker.data_received(register_frame())
    monkeypatch.setattr(harness.server, "catching_up", lambda: True)
    broker.connection_lost(None)
    harness.drain_unregistrations()
    assert BROKER not in harness.observer.seen
    assert routes_of(harness).pickup_topic_route_data("TopicTest") is not None  # still registered
    again, _ = harness.connect(5001)
    again.data_received(register_frame())
    monkeypatch.setattr(harness.server, "catching_up", lambda: False)
    again.connection_lost(None)  # an end once the node has caught up is the broker's
    assert harness.observer.seen[BROKER].cause is Cause.PEER_CLOSED


def test_a_close_while_the_tables_are_busy_is_reported_once_they_are_free(harness, monkeypatch):
    routes = routes_of(harness)
    broker, _ = harness.connect(5000)
    broker.data_received(register_frame())
    lookup = routes.on_channel_destroy
    busy = [True]

    def on_channel_destroy(channel, *, wait=True):
        assert not wait  # the loop never waits for the worker thread's registration
        return None if busy[0] else lookup(channel, wait=wait)

    monkeypatch.setattr(routes, "on_channel_destroy", on_channel_destroy)
    broker.connection_lost(None)
    harness.loop.advance(server_mod._TABLES_BUSY_RETRY_S)
    assert BROKER not in harness.observer.seen  # still busy: looked at again later
    busy[0] = False
    harness.loop.advance(server_mod._TABLES_BUSY_RETRY_S)
    assert harness.observer.seen[BROKER].cause is Cause.PEER_CLOSED


# --------------------------------------------------------------------------- back-pressure


def test_a_peer_that_does_not_read_is_paused_above_the_high_water_mark_and_loses_nothing(harness):
    connection, transport = harness.connect(5000)
    connection.data_received(register_frame())
    transport.peer_reads()
    n = 2_000  # ~0.6 MB of answers: far more than the 64 KiB high-water mark
    connection.data_received(b"".join(route_frame(i) for i in range(10, 10 + n)))
    assert connection.paused and transport.reading_calls == ["pause"]
    held = len(transport.unread)
    assert transport.high_water < held <= transport.high_water + server_mod._WRITE_BATCH_BYTES + 1 * KiB
    assert connection.decoder.buffered > 0  # the rest waits in the decoder, unanswered
    answered: list[int] = []
    for _ in range(n):
        answered += [a.opaque for a in transport.peer_reads()]  # resume_writing answers the next batch
        if len(answered) == n:
            break
        assert transport.unread, "resumed but wrote nothing"
    assert answered == list(range(10, 10 + n))
    assert not connection.paused and transport.reading and connection.decoder.buffered == 0
    assert transport.reading_calls[-1] == "resume"


# --------------------------------------------------------------------------- malformed frames


def test_a_malformed_frame_closes_only_its_connection_with_one_warning(harness, caplog):
    caplog.set_level(logging.INFO, logger="namesrv")
    bad, bad_transport = harness.connect(6000)
    good, good_transport = harness.connect(6001)
    bad.data_received(register_frame())
    bad_transport.peer_reads()
    too_long = struct.pack(">II", FRAME_MAX_LENGTH - 3, 0x10)  # one byte over the limit, judged from 8 bytes
    bad.data_received(route_frame(7) + too_long)
    assert [a.opaque for a in bad_transport.peer_reads()] == [7]  # what came before it is still answered
    assert bad_transport.closing
    good.data_received(route_frame(8))
    assert [a.opaque for a in good_transport.peer_reads()] == [8] and not good_transport.closing
    harness.loop.run_ready()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "closing connection from 10.0.0.1:6000: malformed frame:" in warnings[0].getMessage()
    why = harness.observer.seen[BROKER]
    assert why.cause is Cause.MALFORMED_FRAME and why.reason.startswith("malformed frame: ")
    assert good in harness.server.connections and bad not in harness.server.connections


#: the start of a TLS ClientHello record, as a Java client with -Dtls.enable=true sends it
CLIENT_HELLO = bytes.fromhex("16030100f4010000f00303") + bytes(32)


def tls_client(harness: Harness, port: int, host: str = "10.0.0.1") -> FakeTransport:
    connection, transport = harness.connect(port, host)
    connection.data_received(CLIENT_HELLO)
    assert transport.closing and transport.peer_reads() == []
    return transport


def test_a_tls_client_on_a_plaintext_node_is_named_once_per_address_with_the_keys_to_set(harness, caplog):
    caplog.set_level(logging.INFO, logger="namesrv")
    for port in range(7000, 7010):  # a client retrying, from new ports
        tls_client(harness, port)
    tls_client(harness, 7000, host="10.0.0.2")
    harness.loop.run_ready()

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    first, other = warnings()
    assert first.startswith("closing connection from 10.0.0.1:7000: a TLS client reached this plaintext-only node")
    assert "tls.server.mode=permissive but no certificate: to serve TLS, set tls.server.certPath and" in first
    assert other.startswith("closing connection from 10.0.0.2:7000: a TLS client")
    assert "malformed" not in first + other
    harness.clock.advance(seconds=server_mod.TLS_CLIENT_WARNING_S - 1)
    tls_client(harness, 7010)
    assert len(warnings()) == 2
    harness.clock.advance(seconds=1)  # an hour after it was named, the address is named again
    tls_client(harness, 7011)
    assert len(warnings()) == 3


def test_a_tls_client_on_a_node_with_tls_disabled_is_told_the_mode_to_set(harness, caplog):
    harness.server.context.config.tls_server_mode = "disabled"
    tls_client(harness, 7000)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "tls.server.mode=disabled: to serve TLS, set tls.server.mode=permissive (or enforcing) with" in warning


def test_a_header_over_the_limit_closes_its_connection_before_it_is_buffered(harness, caplog):
    connection, transport = harness.connect(6000)
    huge = encode(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "u" * MAX_REQUEST_HEADER_BYTES}, opaque=1))
    connection.data_received(huge[: 64 * KiB])  # a socket read's worth: enough to judge it
    assert transport.closing and transport.peer_reads() == []
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"exceeds the limit of {MAX_REQUEST_HEADER_BYTES}" in warning


def test_the_largest_header_a_request_may_have_is_read(harness):
    """PUT_KV_CONFIG at every limit, each character written as a 6-byte \\uXXXX escape (as a JSON
    library with ensure_ascii does), fits the header limit and is stored."""
    fields = {
        "namespace": "\u00e9" * MAX_NAME_CHARS,
        "key": "\u00e8" * MAX_NAME_CHARS,
        "value": "\u00ea" * MAX_VALUE_CHARS,
    }
    frame = json_frame({"code": int(RequestCode.PUT_KV_CONFIG), "flag": 0, "opaque": 9, "extFields": fields})
    assert len(frame) > 6 * MAX_VALUE_CHARS
    connection, transport = harness.connect(6000)
    connection.data_received(frame)
    wait_until(lambda: harness.loop.ready, 10, "the KV write to finish")
    harness.loop.run_ready()
    assert [(a.opaque, a.code) for a in transport.peer_reads()] == [(9, ResponseCode.SUCCESS)]
    assert harness.server.context.kv.get(fields["namespace"], fields["key"]) == fields["value"]


def test_a_failure_on_our_side_while_answering_costs_only_that_connection(harness, monkeypatch, caplog):
    connection, transport = harness.connect(6000)
    connection.data_received(register_frame())
    transport.peer_reads()

    def broken(*args: Any) -> bytes:
        raise KeyError("a bug")

    monkeypatch.setattr(harness.server, "encode_response", broken)
    connection.data_received(route_frame(2))
    assert transport.closing and transport.unread == b""
    harness.loop.run_ready()
    assert harness.observer.seen[BROKER] == Departure(Cause.READ_FAILED, "KeyError: 'a bug'")
    assert sum(r.levelno == logging.WARNING for r in caplog.records) == 1


# --------------------------------------------------------------------------- the node-wide budget


def unfinished_frame(size: int) -> bytes:
    """The first ``size`` bytes of a 2 MiB frame: the decoder must hold them until the rest comes."""
    whole = encode(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, b"x" * (2048 * KiB), opaque=1))
    return whole[:size]


def test_past_the_budget_the_large_holders_stop_being_read_until_the_total_is_back_under_three_quarters(
    harness, monkeypatch, caplog
):
    monkeypatch.setattr(server_mod, "BUFFER_BUDGET_BYTES", 1024 * KiB)
    large, large_t = harness.connect(7000)
    small, small_t = harness.connect(7001)
    larger, larger_t = harness.connect(7002)
    large.data_received(unfinished_frame(400 * KiB))
    small.data_received(unfinished_frame(100 * KiB))  # under BUDGET_OFFENDER_BYTES: never held back
    harness.loop.advance(0.01)  # the pace of large frames' reads lets both read on
    assert not large.held_back and large_t.reading
    larger.data_received(unfinished_frame(600 * KiB))  # 1100 KiB in all
    harness.loop.run_ready()
    assert large.held_back and larger.held_back and not small.held_back
    assert not large_t.reading and not larger_t.reading and small_t.reading
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.index("10.0.0.1:7002") < warning.index("10.0.0.1:7000")  # the largest first
    assert "7001" not in warning
    harness.loop.advance(server_mod._BUDGET_CHECK_S)  # still 1100 KiB: checked again later
    assert large.held_back and larger.held_back
    small.connection_lost(None)  # 1000 KiB: under the budget, but not under 3/4 of it
    harness.loop.advance(server_mod._BUDGET_CHECK_S)
    assert large.held_back and larger.held_back
    larger.connection_lost(None)  # 400 KiB left
    harness.loop.advance(server_mod._BUDGET_CHECK_S)
    assert not large.held_back and large_t.reading
    assert harness.server.held_total == 400 * KiB
    assert not [t for t in harness.loop.timers if not t.cancelled]  # nothing held back: no more checks


def test_connections_receiving_large_frames_take_turns_at_one_read_per_turn_of_the_loop(harness):
    # 64 KiB reads: 4 of them are within what the pace allows at once (one 256 KiB read's worth)
    first, second, third = [harness.connect(7000 + i) for i in range(3)]
    for connection, _ in (first, second, third):
        connection.data_received(unfinished_frame(64 * KiB))  # a large frame's header: it waits for its next read
    assert not any(t.reading for _, t in (first, second, third))

    def reading() -> list[bool]:
        return [t.reading for _, t in (first, second, third)]

    harness.loop.run_turn()
    assert reading() == [True, False, False]
    first[0].data_received(unfinished_frame(128 * KiB)[64 * KiB :])  # its read: to the back of the line
    harness.loop.run_turn()
    assert reading() == [False, True, False]
    third[0].hold_back(True)  # not reading anyway: does not use up the turn
    harness.loop.run_turn()
    assert reading() == [True, True, False]
    assert harness.loop.ready == []  # no one left waiting: nothing scheduled
    third[0].hold_back(False)
    assert third[1].reading


READ = server_mod._READ_BYTES
#: seconds of the node-wide pace one 256 KiB read of a large frame takes, and the slack it may come early by
READ_PACE_S = READ / server_mod.LARGE_FRAME_BYTES_PER_S
SLACK_S = server_mod._PACE_SLACK_BYTES / server_mod.LARGE_FRAME_BYTES_PER_S


def stream(harness: Harness, peers: list[tuple[Connection, FakeTransport, bytes]], seconds: float) -> list[int]:
    """Each peer sends its bytes as fast as the node takes them, for ``seconds`` of the fake clock
    (or until all is sent): the transport receives into get_buffer's memory, as uvloop's does,
    whenever it is reading.  The bytes each peer got in."""
    sent = [0] * len(peers)
    end = harness.clock.seconds() + seconds
    while harness.clock.seconds() < end and any(n < len(data) for n, (_, _, data) in zip(sent, peers, strict=True)):
        for i, (connection, transport, data) in enumerate(peers):
            if transport.reading and not transport.closing and sent[i] < len(data):
                view = connection.get_buffer(-1)
                size = min(len(view), len(data) - sent[i])
                view[:size] = data[sent[i] : sent[i] + size]
                connection.buffer_updated(size)
                sent[i] += size
        harness.loop.advance(0.0005)
    return sent


def endless_frame() -> bytes:
    """The first 15 MiB of a frame announcing 16 MiB (the rest never comes)."""
    return struct.pack(">II", FRAME_MAX_LENGTH - 4, 2) + b"{}" + bytes(15 * 1024 * KiB)


def test_large_frames_are_read_at_a_node_wide_pace_in_turns(harness):
    peers = [(*harness.connect(7000 + i), endless_frame()) for i in range(3)]
    got = stream(harness, peers, 0.25)
    # a quarter of a second's worth, whatever the number of peers, give or take the read in flight
    assert abs(sum(got) - 0.25 * server_mod.LARGE_FRAME_BYTES_PER_S) <= 2 * READ
    assert max(got) - min(got) <= 2 * READ  # the line is fair
    assert harness.server.held_total == sum(got)


def test_the_pace_starts_with_the_header_of_a_large_frame(harness):
    large, large_t = harness.connect(7000)
    large.data_received(unfinished_frame(8 * KiB))  # 8 KiB of a 2 MiB frame: already waiting for its turn
    assert not large_t.reading
    harness.loop.run_ready()
    assert large_t.reading
    small, small_t = harness.connect(7001)
    small.data_received(encode(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, b"x" * (200 * KiB))))
    assert small_t.reading  # a frame under 256 KiB is read as any other
    assert [a.opaque for a in small_t.peer_reads()] == [0]


def test_a_large_frame_is_received_into_its_own_memory_and_the_next_frame_through_the_read_buffer(harness):
    connection, transport = harness.connect(7000)
    large = encode(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, b"y" * (300 * KiB), opaque=1))
    assert connection.get_buffer(-1) is harness.server.read_buffer
    got = stream(harness, [(connection, transport, large[: 64 * KiB])], 1)  # the header and some: the read buffer
    view = connection.get_buffer(-1)
    assert view is not harness.server.read_buffer and len(view) == len(large) - got[0]  # up to the frame's end
    got = stream(harness, [(connection, transport, large[got[0] :] + route_frame(2))], 1)
    assert [a.opaque for a in transport.peer_reads()] == [1, 2]
    assert connection.get_buffer(-1) is harness.server.read_buffer and connection.decoder.buffered == 0


@pytest.mark.slow
def test_a_10_mib_registration_is_received_at_the_pace_and_registers(harness):
    ext, body = registration(broker_addr=BROKER, topics=[f"BigTopic{i:06d}{'x' * 60}" for i in range(40_000)])
    frame = encode(request(RequestCode.REGISTER_BROKER, ext, body, opaque=1))
    assert len(frame) > 10 * 1024 * KiB
    connection, transport = harness.connect(7000)
    start = harness.clock.seconds()
    stream(harness, [(connection, transport, frame)], 10)
    took = harness.clock.seconds() - start
    pace = len(frame) / server_mod.LARGE_FRAME_BYTES_PER_S  # 0.35 s
    # less the first read, one read's worth of credit and the slack
    assert pace - 2 * READ_PACE_S - SLACK_S <= took <= pace * 1.1
    wait_until(lambda: harness.loop.ready, 30, "the registration to be applied")  # off the loop: a large body
    harness.loop.run_ready()
    assert [a.code for a in transport.peer_reads()] == [ResponseCode.SUCCESS]
    assert len(routes_of(harness).get_all_topic_list()) >= 40_000


def test_a_connection_held_back_past_the_limit_is_closed_unless_a_broker_registered_on_it(harness, monkeypatch):
    monkeypatch.setattr(server_mod, "BUFFER_BUDGET_BYTES", 1024 * KiB)
    broker, broker_t = harness.connect(7000)
    broker.data_received(register_frame())
    assert [a.code for a in broker_t.peer_reads()] == [ResponseCode.SUCCESS]
    attacker, attacker_t = harness.connect(7001)
    broker.data_received(unfinished_frame(600 * KiB))
    attacker.data_received(unfinished_frame(600 * KiB))
    harness.loop.run_ready()
    assert broker.held_back and attacker.held_back
    harness.loop.advance(server_mod.HELD_BACK_LIMIT_S - 0.1)
    assert not attacker_t.closing
    harness.loop.advance(0.2)
    assert attacker_t.closing and attacker.close_reason.cause is Cause.IDLE
    assert "held back for the buffer budget" in attacker.close_reason.reason
    assert not broker_t.closing and broker.held_back  # 600 KiB: over 3/4 of the budget still
    harness.loop.run_ready()
    assert attacker.decoder.buffered == 0 and harness.server.held_total == 600 * KiB  # freed at once
    assert harness.observer.seen == {}  # no broker was unregistered


def test_a_connection_past_its_credit_for_work_off_the_loop_rests_while_others_are_served(harness, monkeypatch):
    monkeypatch.setattr(server_mod, "WORK_CPU_BURST_S", 0.0)  # no credit: the first bomb puts it in debt
    bomber, bomber_t = harness.connect(7000)
    bomb = zip_bomb_registration(SMALL_BOMB)  # a small body: inflated off the loop all the same
    bomber.data_received(bomb + bomb)
    assert bomber.pending is not None
    wait_until(lambda: harness.loop.ready, 30, "the first bomb to be refused off the loop")
    harness.loop.run_ready()
    (refused,) = bomber_t.peer_reads()
    assert refused.code == ResponseCode.SYSTEM_ERROR and "inflates beyond" in refused.remark
    # the second bomb, already received, waits with the socket until the debt is earned back
    assert bomber.resting and not bomber_t.reading and bomber.pending is None
    rest = bomber.work.wait_s()
    assert rest > 0
    client, client_t = harness.connect(7001)
    client.data_received(route_frame(2))
    assert [a.opaque for a in client_t.peer_reads()] == [2]
    harness.loop.advance(rest * 0.9)
    assert bomber.resting and bomber.pending is None
    harness.loop.advance(rest * 0.2)
    assert not bomber.resting and bomber.pending is not None
    wait_until(lambda: harness.loop.ready, 30, "the second bomb to be refused")
    harness.loop.run_ready()
    assert [a.code for a in bomber_t.peer_reads()] == [ResponseCode.SYSTEM_ERROR]


# --------------------------------------------------------------------------- metrics


def test_with_metrics_on_every_request_is_counted_by_code_and_answer_oneway_and_off_loop_ones_too(harness):
    from namesrv.handlers import HANDLERS
    from namesrv.request_stats import ONEWAY, OTHER, RequestStats

    stats = harness.server.request_stats = RequestStats(HANDLERS, clock=harness.clock.seconds)
    connection, transport = harness.connect(5000)
    heartbeat = request(
        RequestCode.BROKER_HEARTBEAT, {"clusterName": "DefaultCluster", "brokerAddr": BROKER, "brokerName": "broker-a"},
        opaque=4, oneway=True,
    )  # fmt: skip
    connection.data_received(
        register_frame() + route_frame(2) + route_frame(3, topic="NoSuchTopic") + encode(heartbeat)
        + encode(request(4242, {}, opaque=5))
    )  # fmt: skip
    assert [a.opaque for a in transport.peer_reads()] == [1, 2, 3, 5]
    counted = {(code, rc): n for code, rc, n, _, _ in stats.snapshot()}
    assert counted == {
        (RequestCode.REGISTER_BROKER, ResponseCode.SUCCESS): 1,
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, ResponseCode.SUCCESS): 1,
        (RequestCode.GET_ROUTEINFO_BY_TOPIC, ResponseCode.TOPIC_NOT_EXIST): 1,
        (RequestCode.BROKER_HEARTBEAT, ONEWAY): 1,
        (OTHER, ResponseCode.REQUEST_CODE_NOT_SUPPORTED): 1,
    }
    # a KV write runs off the loop: counted once its answer is out
    connection.data_received(encode(request(RequestCode.PUT_KV_CONFIG, {"namespace": "ns", "key": "k", "value": "v"})))
    wait_until(lambda: harness.loop.ready, 10, "the KV write to finish")
    harness.loop.run_ready()
    assert [a.code for a in transport.peer_reads()] == [ResponseCode.SUCCESS]
    assert stats.count(RequestCode.PUT_KV_CONFIG) == 1
