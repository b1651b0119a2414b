"""A node's fallback writer against a real Redis: the lease, the removal, and the job reading it back.

The job's store writes a model as after a batch; the writer then removes a broker as a node that
holds the lease does while no monitor decides, and the job's store, loading it as a restarted job
does, finds the broker gone and the removal to honour. The whole stack (job killed, broker dead,
Redis right within seconds of the deadline) is ``test_liveness_deadline.py``'s business.
"""

from __future__ import annotations

import pytest

from common import redis_clients
from common.routes import RouteInfoManager, RouteSettings
from namesrv.liveness import ExpiryScan, MonitorWatchdog, RedisFallback
from streaming.routes import RedisRouteStore, RouteLookup, RouteModel
from tests.support.clock import Clock
from tests.support.route_events import A0, A1, B0, CLUSTER, T0
from tests.support.wait import wait_until

GONE = (CLUSTER, B0.broker_addr)


@pytest.fixture
def store(redis_url, request):
    s = RedisRouteStore.from_url(redis_url, prefix=f"f{abs(hash(request.node.name))}")
    yield s
    s.reset()
    s.client.delete(s.keys.fallback_lease)
    s.client.close()


def writer(redis_url: str, store: RedisRouteStore, owner: str) -> RedisFallback:
    routes = RouteInfoManager(RouteSettings())
    client = redis_clients.connect(redis_url)
    watchdog = MonitorWatchdog(ExpiryScan(routes, 5000), 30_000)
    return RedisFallback(client, store.keys, owner, routes, watchdog, RouteSettings())


def test_the_lease_holder_removes_a_broker_and_a_restarted_job_honours_it(store, redis_url):
    model = RouteModel()
    for e in (A0, A1, B0):
        model.apply_event(e)
    store.commit("q1", 3, model.changes(), watermark=T0, replace=True)
    node1, node2 = writer(redis_url, store, "node-1"), writer(redis_url, store, "node-2")
    lookup = RouteLookup(redis_url, prefix=store.keys.prefix)
    try:
        assert node1.lease.hold() and not node2.lease.hold()
        assert node2.remove({GONE: T0 + 10_000}) is None  # not the holder: writes nothing
        assert lookup.get("T3") is not None

        assert node1.remove({GONE: T0 + 10_000}) == {GONE}
        assert lookup.get("T3") is None
        assert {q.broker_name for q in lookup.get("T1").queue_datas} == {"a"}
        assert "b" not in lookup.cluster_info()[0]
        assert lookup.status()["batchId"] == "3"  # the job's batch is the job's
        assert node1.remove({GONE: T0 + 10_000}) == {GONE}  # again: nothing left to remove, no harm

        stored = store.load()
        assert stored.model.route("T3") is None
        assert store.fallback_removals() == {GONE: T0 + 10_000}
        node1.lease.release()
        assert node2.lease.hold()
    finally:
        lookup.close()
        node1.client.close()
        node2.client.close()


def test_the_lease_holder_leaves_a_broker_another_node_holds_and_a_stopped_node_holds_nothing(store, redis_url):
    """On a real Redis: a close at node 1 only leaves the broker, which node 2 still holds, in the routes while no
    monitor decides; once node 2 stops renewing what it holds (dead, frozen), its set runs out and it goes."""
    import asyncio

    model = RouteModel()
    for e in (A0, A1, B0):
        model.apply_event(e)
    store.commit("q1", 3, model.changes(), watermark=T0, replace=True)
    clock = Clock(T0 + 10_000)  # after the broker's last heartbeat in the model
    nodes = []
    for owner in ("node-1", "node-2"):
        routes = RouteInfoManager(RouteSettings())
        watchdog = MonitorWatchdog(ExpiryScan(routes, 5000), 30_000, now=clock.seconds, wall_clock_ms=clock)
        client = redis_clients.connect(redis_url)
        nodes.append(RedisFallback(client, store.keys, owner, routes, watchdog, RouteSettings(), now_ms=clock))
    one, two = nodes
    lookup = RouteLookup(redis_url, prefix=store.keys.prefix)
    try:
        for node in nodes:
            asyncio.run(node.look({GONE}, set()))  # both hold it
        clock.advance(250)
        asyncio.run(one.look(set(), set()))  # closed at node 1 only
        while clock.ms < T0 + 10_000 + 4 * one.monitor.grace_ms:
            clock.advance(250)
            asyncio.run(two.look({GONE}, set()))
            asyncio.run(one.look(set(), set()))
        assert one.holding and lookup.get("T3") is not None, "removed while node 2 holds it"
        # node 2 stops looking: its set runs out (its time to live is the lease's)
        wait_until(lambda: not store.client.exists(store.keys.fallback_holds("node-2")), 10, "node 2's set ran out")
        asyncio.run(one.look(set(), set()))
        assert lookup.get("T3") is None and "b" not in lookup.cluster_info()[0]
        # node 2 comes back: its first renewal finds the set gone, its next look writes it whole
        asyncio.run(two.look({GONE}, set()))
        asyncio.run(two.look({GONE}, set()))
        assert store.client.smembers(store.keys.fallback_holds("node-2")) == {f"{CLUSTER}|{GONE[1]}".encode()}
        # a node that stops cleanly holds nothing from then on
        two.close()
        assert not store.client.exists(store.keys.fallback_holds("node-2"))
    finally:
        lookup.close()
        one.close()
        store.client.delete(store.keys.fallback_nodes, *(store.keys.fallback_holds(n) for n in ("node-1", "node-2")))


# --------------------------------------------------------------------------- the stack, job killed


#: a broker's deadline -> gone from the routes in Redis, while no monitor decides
FALLBACK_MAX_S = 3.0


@pytest.mark.timeout(900)
def test_with_the_job_killed_a_dead_broker_leaves_redis_at_its_deadline_and_the_returning_job_keeps_it_out(
    tmp_path,
):
    import threading

    from common.contract import wall_ms
    from tests.support.backends import ProcessInfra
    from tests.support.liveness import Stack, bounds_now, gone_times, known_in_redis, last_heard_ms
    from tests.support.system import SHIPPED, System
    from tests.support.wait import wait_until

    system = System(ProcessInfra(tmp_path), tmp_path, timing=SHIPPED)
    system.start()
    stack = Stack(system)
    try:
        survivor, _ = stack.add("survivor")
        orphan, orphan_addr = stack.add("orphan")
        system.kill_streaming()
        wait_until(
            lambda: all("local expiry scan back on" in system.node_log(i) for i in range(2)),
            60,
            "both nodes' fallback to their own expiry scan",
        )
        stack.fleets.silence("orphan")
        gone = gone_times(system.node_addrs, stack.lookup, [orphan], SHIPPED.broker_timeout_ms / 1000 + 30)[orphan]
        deadline = last_heard_ms(system.tap.events(), orphan_addr) + SHIPPED.broker_timeout_ms
        (bound,) = bounds_now(FALLBACK_MAX_S)
        print(f"\ndeadline -> gone from Redis with the job killed: {gone['redis'] - deadline} ms (bound {bound:.0f})")
        assert gone["redis"] - deadline <= bound
        assert system.tap.decisions(orphan_addr) == []  # no monitor decided it

        seen_again: list[int] = []
        stop = threading.Event()

        def watch() -> None:  # the returning job must never bring it back, not even for one batch
            while not stop.wait(0.05):
                if orphan in known_in_redis(stack.lookup):
                    seen_again.append(wall_ms())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            system.start_streaming()
            # it catches up past the orphan's deadline: its own EXPIRE comes, and removes nothing
            wait_until(lambda: system.tap.decisions(orphan_addr) != [], 120, f"the job's decision on {orphan}")
            wait_until(lambda: system.committed_batch() > 0, 30, "a batch written after it")
        finally:
            stop.set()
            watcher.join(5)
        assert seen_again == []
        assert survivor in known_in_redis(stack.lookup)
    finally:
        stack.close()
        system.stop()
