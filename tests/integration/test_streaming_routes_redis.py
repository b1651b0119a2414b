"""The job's Redis route store against a real Redis: atomic batches, lineages, the change channel,
and the ``namesrv-monitor routes`` CLI reading what the job wrote."""

from __future__ import annotations

import pytest

from common.protocol import bodies
from streaming.alerts import Alert, AlertKind, AlertState, Severity
from streaming.routes import RedisRouteStore, RouteLookup, RouteModel
from tests.support.route_events import A0, A1, B0, CLUSTER, T0


@pytest.fixture
def store(redis_url, request):
    s = RedisRouteStore.from_url(redis_url, prefix=f"t{abs(hash(request.node.name))}")
    yield s
    s.reset()


def expired_alert() -> Alert:
    return Alert(
        AlertKind.BROKER_EXPIRED,
        AlertState.OPEN,
        Severity.WARNING,
        "gone",
        T0,
        cluster_name=CLUSTER,
        broker_addr=A0.broker_addr,
    )


def test_a_batch_is_written_atomically_announced_and_read_back_after_a_restart(store, redis_url):
    model = RouteModel()
    for e in (A0, A1, B0):
        model.apply_event(e)
    lookup = RouteLookup(redis_url, prefix=store.keys.prefix)
    announced = []
    watcher = lookup.client.pubsub(ignore_subscribe_messages=True)
    watcher.subscribe(store.keys.channel)
    watcher.get_message(timeout=1)

    topics = store.commit("q1", 0, model.changes(), [expired_alert()], watermark=T0, replace=True)
    assert topics == ["C1", "T1", "T2", "T3"]
    while (m := watcher.get_message(timeout=1)) is not None:
        announced.append(m["data"].decode())
    assert announced == topics
    assert lookup.get_raw("T1") == model.route("T1")
    assert lookup.get("T3").queue_datas[0].broker_name == "b"
    assert lookup.get("nope") is None
    assert lookup.topics() == ["C1", "T1", "T2", "T3"]
    assert lookup.cluster_info() == bodies.decode_cluster_info(model.cluster_info())
    assert [a.incident for a in lookup.alerts()] == [expired_alert().incident]
    assert lookup.status()["batchId"] == "0"

    stored = store.load()
    assert (stored.lineage, stored.batch_id) == ("q1", 0)
    assert set(stored.alerts) == {expired_alert().incident}
    for t in ("T1", "T2", "T3", "C1"):
        assert stored.model.route(t) == model.route(t)
    assert stored.model.changes().empty  # it knows what is already written

    # the restored model goes on exactly like the original
    for m in (model, stored.model):
        m.apply_removal(CLUSTER, B0.broker_addr, T0 + 1, unclean=True)
    a, b = model.changes(), stored.model.changes()
    assert a.routes == b.routes and a.lost_topics == b.lost_topics == {"T3"}
    store.commit("q1", 1, b, [expired_alert().resolved("back", T0 + 2)])
    assert lookup.get_raw("T3") is None and "T3" not in lookup.topics()
    assert lookup.alerts() == []


def test_replace_drops_what_an_earlier_lineage_wrote(store, redis_url):
    old = RouteModel()
    old.apply_event(B0)
    store.commit("old", 7, old.changes(), replace=True)
    new = RouteModel()
    new.apply_event(A0)
    store.commit("new", 0, new.changes(full=True), replace=True)
    lookup = RouteLookup(redis_url, prefix=store.keys.prefix)
    assert lookup.topics() == ["C1", "T1", "T2"]
    assert lookup.get("T3") is None
    assert store.load().lineage == "new"


def test_watch_yields_changed_topic_names(store, redis_url):
    import threading

    lookup = RouteLookup(redis_url, prefix=store.keys.prefix)
    seen: list[str] = []
    ready = threading.Event()

    def watch():
        gen = lookup.watch(timeout=2)
        ready.set()
        seen.extend(gen)

    th = threading.Thread(target=watch)
    th.start()
    ready.wait()
    model = RouteModel()
    model.apply_event(B0)
    # the subscription starts on the generator's first step; publish until it is seen
    for _ in range(20):
        store.client.publish(store.keys.channel, "T3")
        th.join(timeout=0.05)
        if seen:
            break
    th.join(timeout=5)
    assert seen and set(seen) == {"T3"}


def test_namesrv_routes_cli_reads_what_the_job_wrote(store, redis_url):
    import subprocess
    import sys

    model = RouteModel()
    for e in (A0, A1, B0):
        model.apply_event(e)
    store.commit("q1", 0, model.changes(), [expired_alert()], watermark=T0, replace=True)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "streaming.cli",
                "routes",
                "--redis",
                redis_url,
                "--prefix",
                store.keys.prefix,
                *args,
            ],
            capture_output=True,
            timeout=60,
        )

    got = cli("get", "T1")
    assert got.returncode == 0 and got.stdout.rstrip(b"\n") == model.route("T1")
    missing = cli("get", "nope")
    assert missing.returncode == 1 and b"no route for nope" in missing.stderr
    assert cli("topics").stdout.decode().split() == ["C1", "T1", "T2", "T3"]
    assert expired_alert().incident in cli("alerts").stdout.decode()


def test_thousands_of_topics_are_written_and_removed_in_one_batch(store, redis_url):
    # more topics than one variadic command takes (1,000), so every command is split
    from tests.support.route_events import reg_event

    model = RouteModel()
    big = {f"Big{i:04d}": (4, 4, 6) for i in range(2_500)}
    model.apply_event(reg_event("big", "10.0.0.9:1", 0, big))
    model.apply_event(A0)
    announced = store.commit("q", 0, model.changes(full=True), replace=True)
    lookup = RouteLookup(redis_url, prefix=store.keys.prefix)
    assert len(announced) == len(lookup.topics()) == 2_500 + 3
    assert lookup.get("Big2499").queue_datas[0].broker_name == "big"
    assert store.load().model.changes().empty  # the model entries are all there

    # the group goes: its 2,500 routes and model entries go in one batch
    model.apply_removal(CLUSTER, "10.0.0.9:1", T0 + 1, unclean=False)
    changes = model.changes()
    assert sum(route is None for route in changes.routes.values()) == 2_500
    store.commit("q", 1, changes)
    assert lookup.topics() == ["C1", "T1", "T2"]
    assert lookup.get_raw("Big0000") is None and lookup.get_raw("Big2499") is None
    stored = store.load()
    assert sorted(stored.model.topics()) == ["C1", "T1", "T2"]
    assert stored.model.changes().empty


def test_a_restarted_job_leaves_the_alert_the_nodes_own_to_them(store):
    """MONITOR_DOWN is opened and resolved by the nodes: a job that loads it would re-send it for ever."""
    model = RouteModel()
    model.apply_event(A0)
    down = Alert(AlertKind.MONITOR_DOWN, AlertState.OPEN, Severity.CRITICAL, "no monitor decides", T0)
    store.commit("q1", 0, model.changes(), [expired_alert(), down], watermark=T0, replace=True)
    assert set(store.load().alerts) == {expired_alert().incident}
