"""The node's garbage-collector policy (namesrv/gcpolicy.py): short pauses, and nothing leaked for them.

A collection holds the GIL, so its length is how long every client waits.  Pauses are timed with
``gc.callbacks`` in CPU time of the collecting thread (the collector runs on it from start to stop),
so a busy neighbour on this shared machine does not lengthen them; the wall time is printed too.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor, wait

import pytest

from common.protocol.codec import FrameDecoder
from common.protocol.codes import RequestCode, ResponseCode
from common.protocol.command import request
from common.protocol.types import DataVersion, RegisterBrokerBody, TopicConfig
from common.routes import RouteInfoManager, RouteSettings
from namesrv import gcpolicy
from namesrv.client import NameServerClient
from namesrv.handlers import Pending
from tests.support import attacks
from tests.support.brokers import registration
from tests.support.node import running_node
from tests.support.wait import wait_until

MS = 1e-3
#: the loop's budget is p99 5 ms and max 50 ms (a well-formed client's lookups under attack,
#: tests/conformance/test_attack_latency.py); a collection must stay far below the max
LONGEST_PAUSE = 15 * MS
TOPICS = 100_000
BROKER = "127.0.0.1:10911"


@pytest.fixture
def policy():
    """The policy on, as ``namesrv start`` turns it on; off again afterwards, nothing left frozen."""
    gcpolicy.enable()
    try:
        yield gcpolicy
    finally:
        gcpolicy.disable()


class Pauses:
    """Every collection while installed: (generation, CPU seconds, wall seconds, thread name)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, float, float, str]] = []
        self._started: dict[int, tuple[float, float]] = {}

    def _callback(self, phase: str, info: dict) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = (time.thread_time(), time.perf_counter())
        elif me in self._started:
            cpu, wall = self._started.pop(me)
            name = threading.current_thread().name
            self.seen.append((info["generation"], time.thread_time() - cpu, time.perf_counter() - wall, name))

    def __enter__(self) -> Pauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def longest(self) -> tuple[int, float, float, str]:
        return max(self.seen, key=lambda p: p[1])

    def summary(self) -> str:
        full = [p for p in self.seen if p[0] == 2]
        g, cpu, wall, thread = self.longest()
        return (
            f"{len(self.seen)} collections, {len(full)} full; longest: generation {g} on {thread}, "
            f"{cpu / MS:.1f} ms CPU ({wall / MS:.1f} ms wall); full ones (ms CPU): "
            f"{[round(p[1] / MS, 1) for p in full]}"
        )


def big_registration() -> tuple[dict[str, str], bytes]:
    return registration(broker_addr=BROKER, topics=[f"Topic{i}" for i in range(TOPICS)], compressed=True)


def register_and_unregister(addr: str, ext: dict[str, str], body: bytes) -> None:
    """A 100,000-topic broker registers, then asks to leave; returns once its topics are gone."""
    with NameServerClient(addr, timeout=60) as broker:
        assert broker.call(RequestCode.REGISTER_BROKER, ext, body).code == ResponseCode.SUCCESS
        assert broker.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Topic7"}).code == ResponseCode.SUCCESS
        ident = {k: ext[k] for k in ("clusterName", "brokerAddr", "brokerName", "brokerId")}
        assert broker.call(RequestCode.UNREGISTER_BROKER, ident).code == ResponseCode.SUCCESS
        wait_until(
            lambda: broker.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Topic7"}).code
            == ResponseCode.TOPIC_NOT_EXIST,
            30,
            "the broker's topics to go",
        )


@pytest.mark.slow
def test_no_collection_pauses_long_across_a_100k_topic_registration_and_unregistration(tmp_path, policy, capsys):
    ext, body = big_registration()
    with running_node(tmp_path) as n:
        register_and_unregister(n.addr, ext, body)  # the first registration of a node, then a later one
        for attempt in ("first", "again"):
            with Pauses() as pauses:
                register_and_unregister(n.addr, ext, body)
            with capsys.disabled():
                print(f"\n{attempt}: {pauses.summary()}")
            assert pauses.longest()[1] < LONGEST_PAUSE, pauses.summary()


@pytest.mark.slow
def test_repeated_100k_topic_rounds_leave_nothing_frozen_or_resident_behind(tmp_path, policy, capsys):
    ext, body = big_registration()
    with running_node(tmp_path) as n:
        register_and_unregister(n.addr, ext, body)
        frozen, resident, reclaims = gc.get_freeze_count(), gcpolicy.resident_bytes(), gcpolicy.reclaims
        for _ in range(4):
            register_and_unregister(n.addr, ext, body)
        grew = gc.get_freeze_count() - frozen
        resident_grew = (gcpolicy.resident_bytes() or 0) - (resident or 0)
        with capsys.disabled():
            print(f"\nafter 4 more rounds: {grew:+d} frozen objects, {resident_grew / 2**20:+.1f} MiB resident")
        # the rows and decoded topics (200,000 objects a round) went by reference counting, frozen or not
        assert grew < 2_000
        assert resident_grew < 24 * 2**20
        assert gcpolicy.reclaims == reclaims  # the backstop had nothing to do (and hid nothing)


@pytest.mark.slow
def test_the_route_tables_form_no_cycles_a_broker_leaves_nothing_for_the_collector():
    """Frozen rows are freed by reference counting alone: with the collector off, a 100,000-topic
    broker's registration and removal leave no tracked object behind (a cycle would)."""
    routes = RouteInfoManager(RouteSettings())
    topics = {f"T{i}": TopicConfig(f"T{i}", 8, 8) for i in range(TOPICS)}
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        channel = object()
        body = RegisterBrokerBody(DataVersion(1, 0, 1), topics, [])
        routes.register_broker("c", BROKER, "broker-a", 0, None, body=body, channel=channel)
        assert routes.counts().topics == TOPICS
        del body
        (req,) = routes.on_channel_destroy(channel)
        outcome = routes.unregister_brokers([req])
        assert outcome.applied == [req] and routes.counts().topics == 0
        del outcome, req
        assert len(gc.get_objects()) - before < 50
    finally:
        gc.enable()


def test_a_large_change_defers_full_passes_and_freezes_what_it_built(policy):
    full = gc.get_threshold()[2]
    seen: list[int] = []

    def build() -> list[list[int]]:
        seen.append(gc.get_threshold()[2])
        return [[i] for i in range(50_000)]  # tracked objects, as the rows' dicts are

    frozen = gc.get_freeze_count()
    rows = gcpolicy.run_large_change(build)
    assert seen[0] > 1_000_000 and gc.get_threshold()[2] == full  # waited while it ran, restored after
    assert gc.get_freeze_count() >= frozen + 50_000  # built, and frozen unwalked
    del rows
    assert gc.get_freeze_count() < frozen + 1_000  # frozen objects still go by reference counting


def test_a_large_change_that_fails_freezes_nothing(policy):
    full = gc.get_threshold()[2]

    def fail() -> None:
        kept = [[i] for i in range(50_000)]  # noqa: F841 - alive while the exception flies
        raise ValueError("no")

    frozen = gc.get_freeze_count()
    with pytest.raises(ValueError):
        gcpolicy.run_large_change(fail)
    assert gc.get_freeze_count() < frozen + 1_000 and gc.get_threshold()[2] == full


def test_the_backstop_collects_frozen_cycles_once_memory_has_doubled(policy, monkeypatch):
    class Node:
        pass

    holder: list[Node] = []

    def build() -> weakref.ref:
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle, alive when the large change ends, so frozen with it
        holder.append(a)
        return weakref.ref(a)

    cycle = gcpolicy.run_large_change(build)
    holder.clear()  # now cyclic garbage, frozen
    gc.collect()
    assert cycle() is not None  # no pass sees it die: what the backstop is for
    real = gcpolicy.resident_bytes() or 0
    monkeypatch.setattr(gcpolicy, "resident_bytes", lambda: 3 * real + gcpolicy.RECLAIM_GROWTH_BYTES)
    reclaims = gcpolicy.reclaims
    gcpolicy.run_large_change(lambda: None)
    assert cycle() is None and gcpolicy.reclaims == reclaims + 1


def test_the_policy_is_off_until_enabled():
    assert not gcpolicy.enabled()
    full, frozen = gc.get_threshold(), gc.get_freeze_count()
    assert gcpolicy.run_large_change(lambda: gc.get_threshold()) == full
    assert gc.get_freeze_count() == frozen


def test_a_failed_off_loop_job_is_answered_without_a_reference_cycle():
    """The zip bomb's path: the job raises on the worker, the loop answers SYSTEM_ERROR, and nothing of
    it (the request, its body) waits for a full collection, which the policy may have put far off."""

    class Body:
        """Stands for what the request holds."""

    held = Body()
    alive = weakref.ref(held)
    cmd = request(RequestCode.REGISTER_BROKER, {}, b"x")

    def job() -> None:
        raise ValueError("inflated beyond the limit")

    with ThreadPoolExecutor(1) as worker:
        pending = Pending(cmd, worker.submit(job), lambda result, _held=held: result)  # it holds the body
        wait([pending.future])
    del held
    gc.disable()
    try:
        answer = pending.resolve()
        assert answer is not None and answer.code == ResponseCode.SYSTEM_ERROR
        assert answer.remark == "ValueError: inflated beyond the limit"
        del pending
        assert alive() is None  # gone by reference counting: no cycle through the exception's traceback
    finally:
        gc.enable()


def test_zip_bombs_are_refused_and_freeze_nothing_with_the_policy_on(tmp_path, policy):
    frame = attacks.zip_bomb_registration(32 * attacks.MiB)
    with running_node(tmp_path) as n:
        host, port = n.addr.rsplit(":", 1)
        frozen = gc.get_freeze_count()
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            decoder = FrameDecoder()
            for _ in range(3):
                sock.sendall(frame)
                while (answer := decoder.next_command()) is None:
                    decoder.feed(sock.recv(65536))
                assert answer.code == ResponseCode.SYSTEM_ERROR
        assert gc.get_freeze_count() < frozen + 1_000
