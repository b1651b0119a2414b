"""Requests answered again from their bytes (namesrv.repeats) answer exactly what the full path does.

Every test feeds the same raw frames, written as rmq-loadgen and Java clients write them, into two
connections of two nodes built alike, one with :class:`~namesrv.repeats.Repeats` and one without, and
compares the bytes written back, the brokers' refreshed entries and what the observer heard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from common.protocol.codec import encode
from common.protocol.codes import RequestCode
from common.protocol.command import request
from namesrv import handlers
from namesrv.app import build_node
from namesrv.config import load_config
from namesrv.handlers import NodeObserver
from namesrv.repeats import Repeats
from namesrv.request_stats import RequestStats
from namesrv.server import Connection, RemotingServer
from tests.support.brokers import registration
from tests.support.frames import commands, json_frame, loadgen_header

DV = b'{"counter":1,"stateVersion":0,"timestamp":1700000000000}'
CLUSTER = "DefaultCluster"


class Heartbeats(NodeObserver):
    def __init__(self) -> None:
        self.heard: list[tuple[str, str, RequestCode]] = []
        #: the heartbeats' times, where they were not now
        self.heard_at: list[int] = []

    def broker_heartbeat(self, cluster_name, broker_addr, source, heard_at_ms=None):
        self.heard.append((cluster_name, broker_addr, source))
        if heard_at_ms is not None:
            self.heard_at.append(heard_at_ms)


class Transport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:
        self.written += data

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> Any:
        return ("10.0.0.9", 4000) if name == "peername" else None

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


@dataclass
class Node:
    server: RemotingServer
    observer: Heartbeats
    transport: Transport = field(default_factory=Transport)
    connection: Connection | None = None

    def feed(self, data: bytes) -> None:
        assert self.connection is not None
        self.connection.data_received(data)

    def taken(self) -> bytes:
        out = bytes(self.transport.written)
        self.transport.written.clear()
        return out


def make_node(
    tmp_path, name: str, repeats: bool, heard_at_ms: Callable[[], int | None] = lambda: None, **settings: str
) -> Node:
    config = load_config(None, {
        "kvConfigPath": str(tmp_path / f"{name}-kv.json"),
        "configStorePath": str(tmp_path / f"{name}.properties"), **settings,
    })  # fmt: skip
    observer = Heartbeats()
    context = dataclasses.replace(build_node(config, observer=observer).context, heard_at_ms=heard_at_ms)
    context.routes.now_ms = lambda: 5_000  # both nodes refresh their brokers to the same time
    server = RemotingServer(context, repeats=Repeats(context) if repeats else None)
    n = Node(server, observer)
    n.connection = Connection(server)
    n.connection.connection_made(n.transport)  # type: ignore[arg-type]
    return n


@pytest.fixture
def stood_since() -> list[int | None]:
    """What both nodes of :func:`pair` say when asked when what they read was heard (None: now)."""
    return [None]


@pytest.fixture
def pair(tmp_path, stood_since):
    def heard_at_ms() -> int | None:
        return stood_since[0]

    nodes = make_node(tmp_path, "repeats", True, heard_at_ms), make_node(tmp_path, "full", False, heard_at_ms)
    yield nodes
    for n in nodes:
        n.server.context.close()


def route(topic: str, opaque: int | str, **kw: Any) -> bytes:
    return json_frame(loadgen_header(105, [("topic", topic)], opaque, **kw))


def broker_ext(b: int) -> list[tuple[str, str]]:
    return [("brokerName", f"broker-{b}"), ("brokerAddr", addr(b)), ("clusterName", CLUSTER), ("brokerId", "0")]


def addr(b: int) -> str:
    return f"127.0.0.1:{30000 + 2 * b}"


def query_data_version(b: int, opaque: int, body: bytes = DV) -> bytes:
    return json_frame(loadgen_header(322, broker_ext(b), opaque), body)


def heartbeat(b: int, opaque: int) -> bytes:
    return json_frame(loadgen_header(904, broker_ext(b), opaque))


def register(b: int, opaque: int, topics: list[str], counter: int = 1) -> bytes:
    ext, raw = registration(broker_addr=addr(b), broker_name=f"broker-{b}", topics=topics, counter=counter)
    return encode(request(RequestCode.REGISTER_BROKER, ext, raw, opaque=opaque, version=409))


def both(pair, data: bytes, pieces: int = 1) -> bytes:
    """Feed ``data`` to both nodes (in ``pieces`` reads); assert they wrote the same bytes, return them."""
    fast, full = pair
    step = max(1, -(-len(data) // pieces))
    for i in range(0, len(data), step):
        fast.feed(data[i : i + step])
        full.feed(data[i : i + step])
    written = fast.taken()
    assert written == full.taken()
    assert fast.observer.heard == full.observer.heard
    assert fast.observer.heard_at == full.observer.heard_at
    assert fast.transport.closed == full.transport.closed
    return written


def seed(pair) -> None:
    both(pair, b"".join(register(b, 1 + b, [f"T{b * 10 + i}" for i in range(10)]) for b in range(3)))


def test_repeated_lookups_and_heartbeats_answer_what_the_full_path_answers(pair):
    seed(pair)
    stream = []
    opaques = iter([0, -1, 7, 2**31 - 1, -(2**31), 1_000_000_000, *range(100, 10_000)])
    for _ in range(3):
        for t in ["T0", "T1", "T25", "nope", "T0"]:
            stream.append(route(t, next(opaques)))
            stream.append(route(t, next(opaques), version=317))  # the non-standard JSON answer
        for b in range(3):
            stream.append(query_data_version(b, next(opaques)))
            stream.append(query_data_version(b, next(opaques), b'{"counter":9,"stateVersion":0,"timestamp":1}'))
            stream.append(heartbeat(b, next(opaques)))
        stream.append(query_data_version(7, next(opaques)))  # not registered: changed=true, no body
    data = b"".join(stream)
    for pieces in (1, len(stream), len(data) // 7):
        written = both(pair, data, pieces)
        assert len(commands(written)) == len(stream)
    fast, full = pair
    assert len(fast.server.repeats) >= 10
    # both nodes refreshed the same brokers, and nothing more
    for b in (*range(3), 7):
        assert fast.server.context.routes.last_seen(CLUSTER, addr(b)) == full.server.context.routes.last_seen(
            CLUSTER, addr(b)
        )


def test_a_learnt_request_skips_the_handler_but_not_the_heartbeat(pair, monkeypatch):
    seed(pair)
    fast, _ = pair
    calls: list[int] = []
    for code in (105, 322, 904):
        handler = handlers.HANDLERS[code]
        monkeypatch.setitem(handlers.HANDLERS, code, lambda n, r, c, h=handler: calls.append(r.code) or h(n, r, c))
    first = route("T1", 1) + query_data_version(1, 2) + heartbeat(1, 3)
    both(pair, first + first)  # seen, then learnt
    handled = len(calls)
    assert handled == 2 * 3 * 2  # two nodes, three requests, twice
    calls.clear()
    fast.observer.heard.clear()
    for opaque in range(5):
        fast.feed(route("T1", opaque) + query_data_version(1, opaque) + heartbeat(1, opaque))
    assert calls == []
    assert len(commands(fast.taken())) == 15
    assert (
        fast.observer.heard
        == [
            (CLUSTER, addr(1), RequestCode.QUERY_DATA_VERSION),
            (CLUSTER, addr(1), RequestCode.BROKER_HEARTBEAT),
        ]
        * 5
    )


def test_heartbeats_read_while_the_node_catches_up_count_as_heard_when_it_stopped_on_both_paths(pair, stood_since):
    """A node woken from standing still reads heartbeats that queued up meanwhile: learnt or not, each counts
    as heard when the node stopped, in the route tables and in what the observer (the events) is told."""
    seed(pair)
    beats = query_data_version(1, 2) + heartbeat(1, 3)
    both(pair, beats + beats)  # seen, then learnt
    stood_since[0] = 1_234
    fast, _ = pair
    both(pair, beats + register(2, 9, [f"T{20 + i}" for i in range(10)]) + beats)
    assert fast.observer.heard_at == [1_234] * 4
    for node in pair:
        assert node.server.context.routes.last_seen(CLUSTER, addr(1)) == 1_234
        assert node.server.context.routes.last_seen(CLUSTER, addr(2)) == 1_234  # the registration too
    stood_since[0] = None  # caught up: heard now again
    both(pair, beats)
    for node in pair:
        assert node.server.context.routes.last_seen(CLUSTER, addr(1)) == 5_000


def test_answers_follow_route_and_data_version_changes(pair):
    seed(pair)
    lookups = b"".join(route("T15", i) + query_data_version(0, 100 + i) for i in range(4))
    before = commands(both(pair, lookups))
    # broker-0 registers broker-1's T15 too, with a new DataVersion: the route and the heartbeat answer change
    both(pair, register(0, 9, [f"T{i}" for i in range(10)] + ["T15"], counter=2))
    after = commands(both(pair, lookups))
    assert before[0].body != after[0].body
    assert before[1].ext_fields == {"changed": "false"} and after[1].ext_fields == {"changed": "true"}
    # broker-0 re-registers the same topics with a newer DataVersion: only the heartbeat answer changes
    version = pair[0].server.context.routes.version
    both(pair, register(0, 10, [f"T{i}" for i in range(10)] + ["T15"], counter=3))
    assert pair[0].server.context.routes.version == version
    again = commands(both(pair, lookups))
    assert again[0].body == after[0].body and again[1].body != after[1].body
    # a KV change can change route answers too (orderMessageEnable off here: they must simply still agree)
    fast, full = pair
    for n in pair:
        n.server.context.kv.put("ORDER_TOPIC_CONFIG", "T15", "broker-1:8")
    both(pair, lookups + lookups)


def test_frames_that_only_look_repeatable_take_the_full_path(pair):
    seed(pair)
    fast, _ = pair
    tricky = [
        # an "opaque": inside extFields comes before the real one, and only it changes
        b"".join(
            json_frame(
                b'{"code":105,"extFields":{"opaque":%d,"topic":"T1"},"flag":0,"language":"JAVA","opaque":9,'
                b'"serializeTypeCurrentRPC":"JSON","version":409}' % i
            )  # fmt: skip
            for i in range(5, 9)
        ),
        route("T1", "007"),  # not how Java writes an int
        route("T1", 2**31),  # does not fit an int
        route("T1", 3, flag=2),  # oneway: no answer at all
        json_frame(loadgen_header(105, [("topic", "T1")], 4), b"a body"),  # same header, a body
    ]
    for f in tricky:
        both(pair, f * 3)  # the same answers, or the same refusal (the connection is closed)
        for n in pair:  # a refused frame closes that connection: a new one for the next
            n.transport = Transport()
            n.connection = Connection(n.server)
            n.connection.connection_made(n.transport)  # type: ignore[arg-type]
    learnt = fast.server.repeats._table
    assert learnt and not any(b'{"opaque":' in key for key in learnt)  # the extFields' "opaque" was refused


def test_nothing_is_repeated_while_the_node_is_not_ready(tmp_path):
    waiting = make_node(tmp_path, "waiting", True, needWaitForService="true", waitSecondsForService="3600")
    waiting.feed(route("T1", 1) * 4)
    assert [a.remark for a in commands(waiting.taken())] == ["name server not ready"] * 4
    assert len(waiting.server.repeats) == 0
    waiting.server.context.close()


def test_repeated_requests_are_counted_for_the_metrics(pair):
    seed(pair)
    fast, full = pair
    for n in pair:
        n.server.request_stats = RequestStats(handlers.HANDLERS)
    both(pair, b"".join(route("T1", i) + route("nope", i) + query_data_version(0, i) for i in range(20)))
    for code, rc in ((105, 0), (105, 17), (322, 0)):
        assert fast.server.request_stats.count(code, rc) == full.server.request_stats.count(code, rc) == 20


def test_learnt_requests_stay_within_their_byte_bound(pair):
    seed(pair)
    fast, _ = pair
    fast.server.repeats = repeats = Repeats(fast.server.context, max_bytes=8 * 1024)
    lookups = b"".join(route(f"T{i % 30}", i) + route(f"gone-{i}", i) for i in range(200))
    both(pair, lookups + lookups)
    assert 0 < repeats.size <= 8 * 1024
    assert len(repeats) < 60
