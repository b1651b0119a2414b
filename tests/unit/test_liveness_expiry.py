"""The local expiry scan, driven with an injected clock: no sleeping."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from common.protocol.codec import FrameDecoder, encode
from common.protocol.codes import RequestCode, ResponseCode
from common.protocol.command import request
from namesrv.handlers import dispatch
from namesrv.liveness import ExpiryScan
from tests.support.brokers import registration
from tests.support.node import running_node
from tests.support.wait import wait_until
from tests.unit.liveness_support import Channel, Clock, make_node, register, route_code


def test_a_silent_broker_expires_after_its_timeout_and_its_connection_is_closed(tmp_path):
    clock, channel = Clock(), Channel()
    node, _, scan = make_node(tmp_path, clock)
    register(node, channel)
    clock.ms += 120_000
    assert scan.scan_once() == [] and route_code(node) == ResponseCode.SUCCESS
    clock.ms += 1
    assert [r.broker_addr for r in scan.scan_once()] == ["127.0.0.1:10911"]
    assert route_code(node) == ResponseCode.TOPIC_NOT_EXIST and channel.closed


def test_heartbeats_keep_a_broker_alive_and_its_own_timeout_wins(tmp_path):
    clock, channel = Clock(), Channel()
    node, _, scan = make_node(tmp_path, clock)
    register(node, channel, heartbeatTimeoutMillis="10000")
    for _ in range(5):
        clock.ms += 9_000
        hb = request(
            RequestCode.BROKER_HEARTBEAT,
            {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:10911"},
            oneway=True,
        )
        assert dispatch(node, hb, channel) is None
        assert scan.scan_once() == []
    clock.ms += 10_001
    assert len(scan.scan_once()) == 1


def test_the_scan_on_the_loop_does_not_wait_for_tables_another_thread_is_changing(tmp_path):
    import threading

    inside, leave = threading.Event(), threading.Event()

    class SlowClock(Clock):
        """Read under the tables' lock: blocks a registration on another thread halfway."""

        def __call__(self) -> int:
            if threading.current_thread() is not threading.main_thread():
                inside.set()
                assert leave.wait(10)
            return self.ms

    clock, channel = SlowClock(), Channel()
    node, _, scan = make_node(tmp_path, clock)
    register(node, channel)
    clock.ms += 120_001
    worker = threading.Thread(target=register, args=(node, Channel()), kwargs={"brokerAddr": "127.0.0.1:10921"})
    worker.start()
    try:
        assert inside.wait(10)
        assert scan.scan_once(wait=False) is None  # busy: nothing done, nothing waited for
        assert not channel.closed
    finally:
        leave.set()
        worker.join(10)
    assert [r.broker_addr for r in scan.scan_once(wait=False)] == ["127.0.0.1:10911"] and channel.closed


# --------------------------------------------------------------------------- expiry off the loop


@pytest.mark.slow  # needs its size: 100,000 topics are what would stall the loop
def test_a_node_expires_a_100k_topic_broker_on_its_worker_while_the_loop_keeps_serving(tmp_path):
    """Removing 100,000 topics takes tens of milliseconds: on the loop, no client would be served meanwhile."""
    ext, body = registration(
        broker_addr="127.0.0.1:10911", topics=[f"Topic{i}" for i in range(100_000)], compressed=True
    )
    frame = encode(request(RequestCode.REGISTER_BROKER, {**ext, "heartbeatTimeoutMillis": "1000"}, body, opaque=1))
    with running_node(tmp_path, scanNotActiveBrokerInterval="100") as n:
        routes = n.running.context.routes
        removals: list[tuple[float, float, str]] = []
        expire = routes.expire_inactive

        def timed_expire(**kw):
            start = time.perf_counter()
            outcome = expire(**kw)
            if outcome is not None and outcome.applied:
                removals.append((start, time.perf_counter(), threading.current_thread().name))
            return outcome

        routes.expire_inactive = timed_expire
        ticks: list[float] = []

        async def tick() -> None:
            while True:
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.001)

        ticker = asyncio.run_coroutine_threadsafe(tick(), n.loop)
        try:
            host, port = n.addr.rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=60) as broker:
                broker.sendall(frame)
                decoder = FrameDecoder()
                while (answer := decoder.next_command()) is None:
                    decoder.feed(broker.recv(65536))
                assert answer.code == ResponseCode.SUCCESS
                wait_until(lambda: removals, 30, "the broker to expire")
                assert broker.recv(1) == b""  # the node closed the expired broker's connection
        finally:
            ticker.cancel()
    start, end, thread = removals[0]
    turns = [t for t in ticks if start < t < end]
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False) if b > start and a < end]
    print(f"\nremoval took {(end - start) * 1000:.0f} ms on {thread}; the loop turned {len(turns)} times meanwhile, "
          f"longest gap {max(gaps) * 1000:.1f} ms")  # fmt: skip
    assert len(turns) >= 3  # the loop kept turning while the broker was removed
    assert thread.startswith("namesrv-worker")


def test_a_broker_registered_again_before_its_expiry_is_reported_is_neither_reported_nor_disconnected(tmp_path):
    """The worker removed it, then the loop took its registration before the report: the event and the
    connection close would now be about the new registration, so they are left out; a broker that
    stayed gone is reported and disconnected as before."""
    clock, came_back, gone = Clock(), Channel(), Channel()
    node, _, _ = make_node(tmp_path, clock)
    expired: list[str] = []
    changes: list[str | None] = []
    scan = ExpiryScan(
        node.routes, 5000, on_expired=lambda r, why: expired.append(r.broker_addr),
        on_min_broker_id_change=lambda c: changes.append(c.offline_broker_addr),
    )  # fmt: skip
    register(node, came_back)
    register(node, gone, brokerAddr="127.0.0.1:10921", brokerName="broker-b")
    clock.ms += 120_001
    outcome = node.routes.expire_inactive()  # what the worker does
    assert sorted(r.broker_addr for r in outcome.applied) == ["127.0.0.1:10911", "127.0.0.1:10921"]
    register(node, came_back)  # the loop, before the report
    assert sorted(r.broker_addr for r in scan._report(outcome)) == ["127.0.0.1:10911", "127.0.0.1:10921"]
    assert expired == ["127.0.0.1:10921"]
    assert gone.closed and not came_back.closed
    assert route_code(node) == ResponseCode.SUCCESS


def test_the_scan_switched_off_before_the_worker_gets_to_it_removes_nothing(tmp_path):
    clock, channel = Clock(), Channel()
    node, _, scan = make_node(tmp_path, clock)
    register(node, channel)
    clock.ms += 120_001

    async def scan_after_the_monitor_took_over() -> object:
        scan.hand_to_monitor()  # the watchdog heard the monitor while the job waited for the worker
        return await scan.scan_on(node.worker)

    assert asyncio.run(scan_after_the_monitor_took_over()) is None
    assert route_code(node) == ResponseCode.SUCCESS and not channel.closed
    node.close()
