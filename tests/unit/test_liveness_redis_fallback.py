"""The fallback writer's pure parts: which brokers it removes, what it writes, the lease, and the job's side."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from redis.exceptions import ConnectionError as RedisConnectionError

from common.redis_keys import RedisKeys
from common.routes import RouteInfoManager, RouteSettings
from common.routes.materialised import RouteModel, decode_removals, encode_removal, removal_changes
from common.routes.snapshot import decode_model, encode_meta
from namesrv.liveness import Departures, ExpiryScan, MonitorWatchdog, RedisFallback, RedisLease
from tests.support.clock import Clock
from tests.support.route_events import A0, A1, B0, CLUSTER, T0

GONE = (CLUSTER, B0.broker_addr)


# --------------------------------------------------------------------------- which brokers


def test_a_broker_past_its_deadline_is_reported_once_and_one_heard_again_first_is_not():
    d = Departures()
    live = {("c", "a"), ("c", "b")}
    assert d.observe(live, set(), 1) == {}
    assert d.observe(live, {("c", "b")}, 2) == {("c", "b"): 2}
    assert d.observe(live, {("c", "b")}, 3) == {("c", "b"): 2}  # still to write: the first time stays
    d.written({("c", "b")})
    assert d.observe(live, {("c", "b")}, 4) == {}  # still overdue here, but written
    assert d.observe(live - {("c", "b")}, set(), 5) == {}  # the node's own scan removed it since
    assert d.observe(live, {("c", "a")}, 6) == {("c", "a"): 6}
    assert d.observe(live, set(), 7) == {}  # heard again before it was written


def test_a_departure_stays_pending_until_written_or_the_monitor_decided_it_and_the_first_look_is_the_baseline():
    d = Departures()
    assert d.observe({("c", "a"), ("c", "b")}, set(), 1) == {}  # what the tables hold at the first look stays
    assert d.observe({("c", "a")}, set(), 2) == {("c", "b"): 2}  # closed or unregistered
    # another node holds the lease: kept, so that this node writes it if the lease comes its way
    assert d.observe({("c", "a")}, set(), 3) == {("c", "b"): 2}
    assert d.due(1) == {} and d.due(2) == {("c", "b"): 2}  # due once the grace since it was seen has passed
    d.settle(lambda seen_at: False, seen_before=0)
    assert d.pending == {("c", "b"): 2}  # the monitor has not decided it
    d.settle(lambda seen_at: seen_at <= 2, seen_before=0)
    assert d.pending == {}  # the monitor has read past the moment it was seen: its to write
    assert d.observe({("c", "a")}, set(), 4) == {}  # and it is not reported again


def test_a_departure_nobody_wrote_is_forgotten_after_a_while_and_a_flood_is_bounded():
    d = Departures(max_pending=2)
    d.observe({("c", "a"), ("c", "b"), ("c", "x")}, set(), 1)
    d.observe({("c", "x")}, set(), 10)
    d.observe(set(), set(), 20)
    assert len(d.pending) == 2 and ("c", "x") in d.pending  # the oldest went first
    d.settle(lambda seen_at: False, seen_before=15)
    assert d.pending == {("c", "x"): 20}


class RedisDown:
    """A client every command of which fails, as one of a Redis that is down."""

    def eval(self, *args: object) -> object:
        raise RedisConnectionError("Connection refused")

    def set(self, *args: object, **kwargs: object) -> object:
        raise RedisConnectionError("Connection refused")

    def pipeline(self, transaction: bool = True) -> RedisDown:
        return self

    def __getattr__(self, command: str) -> object:  # a pipeline's queued commands, then its execute
        if command == "execute":
            return lambda: self.eval()
        return lambda *args, **kwargs: None


def test_a_departure_waits_out_a_redis_failure_and_the_writer_claims_no_change_of_lease(caplog):
    caplog.set_level(logging.INFO, logger="namesrv.liveness")
    clock, routes = Clock(), RouteInfoManager(RouteSettings())
    monitor = MonitorWatchdog(ExpiryScan(routes, 5000), 30_000, now=clock.seconds, wall_clock_ms=clock)
    writer = RedisFallback(RedisDown(), RedisKeys("p"), "node-1", routes, monitor, RouteSettings(), now_ms=clock)  # type: ignore[arg-type]
    gone = ("c", "a")
    asyncio.run(writer.look({gone}, set()))  # the baseline
    clock.advance(250)
    seen_at = clock.ms
    asyncio.run(writer.look(set(), set()))  # it left the tables; no monitor covers it
    clock.advance(monitor.grace_ms)
    asyncio.run(writer.look(set(), set()))  # due: the lease cannot be taken
    assert not writer.holding and writer.departures.pending == {gone: seen_at}  # kept for the next look
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "fallback lease" in m], said  # no lease was taken or lost
    assert [m for m in said if m.startswith("fallback writer: redis failed")], said


def writer_recording_writes(node: str) -> tuple[Clock, MonitorWatchdog, RedisFallback, list[dict]]:
    """A writer that can take the lease (FakeRedis, below) and records each write instead of making it."""
    clock, routes = Clock(), RouteInfoManager(RouteSettings())
    monitor = MonitorWatchdog(ExpiryScan(routes, 5000), 30_000, now=clock.seconds, wall_clock_ms=clock)
    writer = RedisFallback(FakeRedis(), RedisKeys("p"), node, routes, monitor, RouteSettings(), now_ms=clock)  # type: ignore[arg-type]
    writes: list[dict] = []
    writer.remove = lambda gone: writes.append(dict(gone)) or set(gone)  # type: ignore[method-assign]
    return clock, monitor, writer, writes


def test_after_the_node_itself_stood_still_a_live_monitor_decides_what_its_tables_call_overdue():
    """A frozen node wakes with brokers overdue in its own tables whose connections broke while it stood still;
    the other nodes heard them all along. While a monitor is heard, the writer leaves those to it, even past
    the grace; once none is heard (after RESUME_WAIT_MS), it writes them."""
    clock, monitor, writer, writes = writer_recording_writes("node-3")
    kept = ("c", "a")
    asyncio.run(writer.look({kept}, set()))  # the baseline
    clock.advance(60_000)  # frozen for a minute
    monitor.heard("m", decided_through=clock.ms - 3000)  # its consumer catches up: the monitor is alive
    asyncio.run(writer.look({kept}, {kept}))
    seen_at = clock.ms
    for _ in range(8):  # two grace periods: the monitor, slower than that, has not yet read this far
        clock.advance(250)
        monitor.heard("m", decided_through=seen_at - 1000)
        asyncio.run(writer.look({kept}, {kept}))
    assert writes == [], "a departure seen just after the node's own stall was written over a live monitor"
    clock.advance(RedisFallback.RESUME_WAIT_MS)  # the monitor goes silent: the node is on its own again
    asyncio.run(writer.look({kept}, {kept}))
    assert writes == [{kept: seen_at}]


def test_without_a_stall_an_undecided_departure_is_written_after_the_grace_as_before():
    clock, monitor, writer, writes = writer_recording_writes("node-1")
    gone = ("c", "a")
    asyncio.run(writer.look({gone}, set()))
    seen_at = None
    for _ in range(8):
        clock.advance(250)
        monitor.heard("m", decided_through=clock.ms - 5000)  # alive but behind
        asyncio.run(writer.look({gone}, {gone}))
        seen_at = seen_at or clock.ms
    assert writes == [{gone: seen_at}]


# --------------------------------------------------------------------------- the lease


class FakeRedis:
    """SET NX PX and the lease's two scripts, on one dict, and what the shared holds need (time does not pass)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.sets: dict[str, set[str]] = {}
        self.hashes: dict[str, dict[str, int]] = {}
        self._queued: list[object] | None = None

    def pipeline(self, transaction: bool = True) -> FakeRedis:
        self._queued = []
        return self

    def execute(self) -> list[object]:
        done, self._queued = self._queued or [], None
        return done

    def _answer(self, value: object) -> object:
        if self._queued is None:
            return value
        self._queued.append(value)
        return self

    def delete(self, key: str) -> object:
        return self._answer(int(self.sets.pop(key, None) is not None))

    def sadd(self, key: str, *members: str) -> object:
        self.sets.setdefault(key, set()).update(members)
        return self._answer(len(members))

    def srem(self, key: str, *members: str) -> object:
        self.sets.get(key, set()).difference_update(members)
        if not self.sets.get(key, True):
            del self.sets[key]
        return self._answer(len(members))

    def pexpire(self, key: str, ms: int) -> object:
        return self._answer(int(key in self.sets))

    def hset(self, key: str, field: str, value: int) -> object:
        self.hashes.setdefault(key, {})[field] = value
        return self._answer(1)

    def hgetall(self, key: str) -> dict[str, int]:
        return dict(self.hashes.get(key, {}))

    def hdel(self, key: str, *fields: str) -> int:
        for f in fields:
            self.hashes.get(key, {}).pop(f, None)
        return len(fields)

    def smismember(self, key: str, members: list[str]) -> object:
        return self._answer([int(m in self.sets.get(key, set())) for m in members])

    def set(self, key: str, value: str, nx: bool, px: int) -> bool:
        assert nx and px > 0
        if key in self.values:
            return False
        self.values[key] = value
        return True

    def eval(self, script: str, numkeys: int, key: str, owner: str, *args: object) -> int:
        if self.values.get(key) != owner:
            return 0
        if "del" in script:
            del self.values[key]
        return 1


def test_one_node_holds_the_lease_until_it_releases_it():
    redis = FakeRedis()
    first, second = (RedisLease(redis, "P:fallback:lease", n, 2000) for n in ("node-1", "node-2"))  # type: ignore[arg-type]
    assert first.hold() and first.hold()  # taken, then renewed
    assert not second.hold()
    second.release()  # not its own: nothing happens
    assert not second.hold()
    first.release()
    assert second.hold() and not first.hold()


# --------------------------------------------------------------------------- what is written


def stored(model: RouteModel):
    """The snapshot a reader gets back from what ``model`` wrote."""
    changes = model.changes(full=True)
    entries = {t: e for t, e in changes.model_topics.items() if e is not None}
    meta = {k: str(v) for k, v in encode_meta("L", 7, T0, T0).items()}  # as Redis gives it back: text
    return decode_model(meta, entries, changes.model_brokers)


def job_model() -> RouteModel:
    model = RouteModel()
    for e in (A0, A1, B0):
        model.apply_event(e)
    return model


def test_a_removal_rewrites_the_routes_of_the_brokers_group_and_the_model_without_it():
    snap = stored(job_model())
    gone, changes = removal_changes(snap, {GONE: T0 + 10_000})
    assert gone == [GONE]
    assert changes.routes["T3"] is None  # only b served it
    assert b"10.0.0.3:1" not in changes.routes["T1"] and b"10.0.0.1:1" in changes.routes["T1"]
    assert "T2" not in changes.routes  # a's alone: untouched
    assert changes.cluster is not None and b"10.0.0.3:1" not in changes.cluster
    assert changes.model_brokers is not None and b"10.0.0.3:1" not in changes.model_brokers


def test_a_removal_older_than_the_brokers_last_heartbeat_in_redis_changes_nothing():
    snap = stored(job_model())
    assert removal_changes(snap, {GONE: T0 - 1}) == ([], removal_changes(snap, {})[1])
    assert removal_changes(snap, {(CLUSTER, "10.9.9.9:1"): T0 + 1})[0] == []  # not in Redis


def test_the_returning_job_neither_brings_the_broker_back_nor_removes_it_twice():
    job = job_model()
    job.changes()  # what it wrote before it died
    node_wrote = removal_changes(stored(job_model()), {GONE: T0 + 10_000})[1]
    assert job.apply_fallback_removals({GONE: T0 + 10_000}) == [GONE]
    mine = job.changes()
    assert mine.routes == node_wrote.routes  # the job's model now says what the node wrote
    # the backlog it replays: the broker's heartbeats from before the removal do not bring it back
    job.apply_event(dataclasses.replace(B0, event_time=T0 + 5_000))
    assert job.changes().routes == {}
    # its own EXPIRE, late: nothing to remove
    assert not job.apply_removal(*GONE, T0 + 12_000, unclean=True)
    assert job.changes().routes == {}
    # a registration after the removal is the broker back
    job.apply_event(dataclasses.replace(B0, event_time=T0 + 20_000))
    assert set(job.changes().routes) == {"C1", "T1", "T3"}


def test_removals_round_trip_and_bad_entries_are_skipped():
    field, value = encode_removal(CLUSTER, "10.0.0.3:1", T0)
    assert decode_removals({field.encode(): value, b"junk": b"1", b"C|a": b"x"}) == {GONE: T0}


# --------------------------------------------------------------------------- what the other nodes hold


def two_nodes() -> tuple[Clock, FakeRedis, list[tuple[RedisFallback, list[dict]]]]:
    """Two nodes' writers on one Redis, no monitor heard; each records its writes instead of making them."""
    clock, redis, out = Clock(), FakeRedis(), []
    for name in ("node-1", "node-2"):
        routes = RouteInfoManager(RouteSettings())
        monitor = MonitorWatchdog(ExpiryScan(routes, 5000), 30_000, now=clock.seconds, wall_clock_ms=clock)
        writer = RedisFallback(redis, RedisKeys("p"), name, routes, monitor, RouteSettings(), now_ms=clock)  # type: ignore[arg-type]
        writes: list[dict] = []
        writer.remove = lambda gone, writes=writes: writes.append(dict(gone)) or set(gone)  # type: ignore[method-assign]
        out.append((writer, writes))
    return clock, redis, out


def test_the_lease_holder_leaves_a_broker_another_node_holds_until_no_node_does():
    clock, _, [(one, writes), (two, _)] = two_nodes()
    b = ("c", "b")
    for writer in (one, two):
        asyncio.run(writer.look({b}, set()))  # both hold it
    clock.advance(250)
    asyncio.run(one.look(set(), set()))  # its connection closed at node 1 only
    seen_at = clock.ms
    while clock.ms < seen_at + 3 * one.monitor.grace_ms:
        clock.advance(250)
        asyncio.run(two.look({b}, set()))  # node 2 hears it all along
        asyncio.run(one.look(set(), set()))
    assert one.holding and writes == [], "the lease holder removed a broker another node holds"
    asyncio.run(two.look(set(), set()))  # now gone at node 2 too: no node holds it
    clock.advance(250)
    asyncio.run(one.look(set(), set()))
    assert writes == [{b: seen_at}]


def test_a_node_whose_set_ran_out_holds_nothing_and_rewrites_it_whole_when_it_looks_again():
    clock, redis, [(one, writes), (two, _)] = two_nodes()
    b = ("c", "b")
    for writer in (one, two):
        asyncio.run(writer.look({b}, set()))
    clock.advance(250)
    asyncio.run(one.look(set(), set()))
    seen_at = clock.ms
    del redis.sets[RedisKeys("p").fallback_holds("node-2")]  # node 2 froze past its set's time to live
    clock.advance(one.monitor.grace_ms)
    asyncio.run(one.look(set(), set()))
    assert writes == [{b: seen_at}]  # nobody else holds it: removed
    for _ in range(2):  # node 2 wakes: the renewal finds its set gone, and the next look writes it whole
        asyncio.run(two.look({b}, set()))
    assert redis.sets[RedisKeys("p").fallback_holds("node-2")] == {"c|b"}


def test_entries_of_the_node_list_that_are_no_node_s_are_dropped_and_ask_nothing():
    clock, redis, [(one, _), (two, _)] = two_nodes()
    b = ("c", "b")
    asyncio.run(two.look({b}, set()))
    nodes = RedisKeys("p").fallback_nodes
    redis.hashes[nodes].update({b"\xff": 1, "node-9": "not a time", "node-8": clock.ms - 2 * 86_400_000})  # type: ignore[dict-item]
    assert one.holds.held_elsewhere(redis, {b, ("c", "x")}, clock.ms) == {b}  # type: ignore[arg-type]
    assert set(redis.hashes[nodes]) == {"node-2"}
