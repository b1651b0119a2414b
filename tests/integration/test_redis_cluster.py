"""Routes, alerts and the model on a Redis Cluster of three masters, selected by a ``redis+cluster://`` URL.

The cluster is Debian's redis-server, three cluster-enabled masters joined by ``redis-cli --cluster
create`` (:mod:`tests.support.redis_cluster`). What runs against it is what runs against a single
Redis: the job's batch sink and store (one MULTI/EXEC per batch, its change announcements, a
restart carrying on from the stored model), :class:`RouteLookup` and its ``watch``, ``namesrv
routes``, and a node's warm start. Every key of a prefix carries the prefix as a hash tag, so all
of them share one slot, which is what lets the transaction hold.

The clients themselves across a failover, on a second cluster whose masters each have a replica: a
transaction whose WATCH was on a connection that failed is a WatchError, never an unwatched EXEC; a
client without retries finds the promoted replica; a client made after the failover finds the cluster
through the other nodes its URL names. The whole system across a failover is
``tests/integration/test_redis_failover.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from common import redis_clients
from common.routes import RouteInfoManager, RouteSettings
from namesrv.config import NamesrvConfig
from namesrv.warmstart import warm_start
from streaming.liveness import KIND_ALERT
from streaming.routes import RouteLookup
from tests.support.node import REPO
from tests.support.redis_cluster import RedisCluster, redis_cluster
from tests.support.streaming import T0, expire_row, make_sink, out_row, register, route_row
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as c:
        yield c


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with redis_cluster(tmp_path_factory.mktemp("redis-cluster-replicated"), replicas=1) as c:
        yield c


def keys_of(cluster: RedisCluster, prefix: str) -> dict[str, int]:
    """Every key under ``{prefix}`` on any master, with its slot."""
    client = redis_clients.connect(cluster.url)
    try:
        keys = [k.decode() for k in client.scan_iter(match=f"{{{prefix}}}:*")]
        return {k: int(client.keyslot(k)) for k in keys}
    finally:
        client.close()


def shard_subscribers(cluster: RedisCluster, channel: str) -> int:
    """Subscribers of the sharded ``channel`` over every master."""
    import redis

    total = 0
    for i in range(len(cluster.ports)):
        client = redis.Redis.from_url(cluster.node_url(i))
        try:
            reply = client.execute_command("PUBSUB", "SHARDNUMSUB", channel)
            total += int(reply[1])
        finally:
            client.close()
    return total


def test_the_job_writes_a_batch_atomically_in_one_slot_and_readers_follow(cluster: RedisCluster) -> None:
    prefix = "east"
    sink, pub = make_sink(cluster.url, prefix)
    lookup = RouteLookup(cluster.url, prefix=prefix)
    announced: list[str] = []
    watching = threading.Thread(target=lambda: announced.extend(lookup.watch(timeout=5)), daemon=True)
    watching.start()
    wait_until(lambda: shard_subscribers(cluster, f"{{{prefix}}}:routes:changed") > 0, 10, "the watcher to subscribe")
    try:
        sink.set_lineage("q1")
        a, b = register(addr="10.0.0.1:1", name="a"), register(addr="10.0.0.2:1", name="b", seq=2)
        sink.process([route_row(a), route_row(b)], 0)

        # what a node answers, read back through the cluster
        route = lookup.get("T")
        assert route is not None and {q.broker_name for q in route.queue_datas} == {"a", "b"}
        assert lookup.get_raw("T") == sink.model.route("T")
        assert lookup.topics() == ["C", "T"]
        info = lookup.cluster_info()
        assert info is not None and set(info.broker_addr_table) == {"a", "b"}
        assert lookup.status()["batchId"] == "0"

        # every key of the prefix is hash-tagged into one slot; the single-Redis names are untouched
        keys = keys_of(cluster, prefix)
        assert {"{east}:route:T", "{east}:topics", "{east}:meta", "{east}:model:topics"} <= set(keys)
        assert len(set(keys.values())) == 1, keys

        # an expiry: its alert is kept in the cluster, the route follows
        expired = out_row(KIND_ALERT, T0 + 30_000, type="BROKER_EXPIRED", state="OPEN", severity="CRITICAL",
                          message="gone", clusterName="C", brokerName="a", brokerAddr="10.0.0.1:1")  # fmt: skip
        sink.process([expire_row(T0 + 30_000, addr="10.0.0.1:1"), expired], 1)
        route = lookup.get("T")
        assert route is not None and {q.broker_name for q in route.queue_datas} == {"b"}
        assert [a.kind for a in lookup.alerts()] == ["BROKER_EXPIRED"]
        assert any(t == "namesrv-actions" for t, _, _ in pub.sent)

        # the change channel is sharded with the keys (SPUBLISH in the batch's transaction)
        watching.join(15)
        assert not watching.is_alive()
        assert sorted(set(announced)) == ["C", "T"], announced

        # a restart of the same query carries on from the model stored in the cluster
        again, _ = make_sink(cluster.url, prefix)
        again.set_lineage("q1")
        assert again.model.route("T") == sink.model.route("T")
        assert again.process([route_row(a)], 1) == []  # batch 1 was already written: skipped
        # a new lineage replaces everything, in one transaction on the one slot
        fresh, _ = make_sink(cluster.url, prefix)
        fresh.set_lineage("q2")
        fresh.process([route_row(register(addr="10.0.0.9:1", name="z", seq=9))], 0)
        route = lookup.get("T")
        assert route is not None and {q.broker_name for q in route.queue_datas} == {"z"}
        assert lookup.alerts() == []
        for s in (sink, again, fresh):
            s.close()
    finally:
        lookup.close()


def test_a_node_warm_starts_from_the_cluster_and_the_cli_reads_it(cluster: RedisCluster) -> None:
    prefix = "west"
    sink, _ = make_sink(cluster.url, prefix)
    sink.set_lineage("q1")
    sink.process([route_row(register(addr="10.0.0.1:1", name="a"))], 0)
    sink.close()

    routes = RouteInfoManager(RouteSettings())
    report = asyncio.run(
        warm_start(NamesrvConfig(warm_start_from_redis=True, redis_url=cluster.url, redis_key_prefix=prefix), routes)
    )
    assert report is not None and (report.brokers, report.topics, report.batch_id) == (1, 2, 0)
    route = routes.pickup_topic_route_data("T")
    assert route is not None and route.queue_datas[0].broker_name == "a"

    def cli(url: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "streaming.cli", "routes", "--redis", url, "--prefix", prefix, *args],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    got = cli(cluster.url, "get", "T")
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip().encode() == sink.model.route("T")
    assert cli(cluster.url, "topics").stdout.split() == ["C", "T"]
    # a cluster URL that cannot work is refused with a message, not a traceback
    bad = cli(cluster.url.replace("/0", "/3"), "topics")
    assert bad.returncode == 2 and "database 0 only" in bad.stderr and "Traceback" not in bad.stderr


def test_an_unreachable_cluster_is_a_redis_error_at_the_first_command(tmp_path: Path) -> None:
    from redis.exceptions import ConnectionError

    from infra.processes import free_port

    client = redis_clients.connect(f"redis+cluster://127.0.0.1:{free_port()}", timeout_s=1, retries=False)
    with pytest.raises(ConnectionError):
        client.get("x")
    client.close()


def test_a_transaction_whose_watched_connection_fails_raises_watch_error_and_writes_nothing(cluster: RedisCluster):
    # A master that dies under a WATCH takes the watch with it. redis-py's cluster transaction would run the
    # rest on a new connection, unwatched, and its EXEC would write over the change the WATCH guarded against.
    import redis
    from redis.exceptions import WatchError

    key = "{watched}:k"
    client, other = redis_clients.connect(cluster.url), redis_clients.connect(cluster.url)
    master = redis.Redis.from_url(f"redis://127.0.0.1:{cluster.owner(key)}/0")
    try:
        client.set(key, "read")
        with client.pipeline(transaction=True) as pipe:
            pipe.watch(key)
            master.client_kill_filter(_type="normal", skipme=True)  # every client connection, the watched one too
            other.set(key, "changed meanwhile")
            with pytest.raises(WatchError):
                pipe.get(key)
                pipe.multi()
                pipe.set(key, "written over")
                pipe.execute()
        assert client.get(key) == b"changed meanwhile"
        with client.pipeline(transaction=True) as pipe:  # the caller's next try, from its WATCH, goes through
            pipe.watch(key)
            pipe.multi()
            pipe.set(key, "written")
            pipe.execute()
        assert client.get(key) == b"written"
    finally:
        for c in (client, other, master):
            c.close()


def test_clients_follow_a_failover_of_the_master_that_holds_the_prefix(replicated: RedisCluster):
    from redis.exceptions import RedisError

    c = replicated
    key = "{namesrv}:meta"
    master = c.owner(key)
    assert len(c.replicas_of(master)) == 1
    # a client without retries that only ever runs transactions (a node's warm start reads so)
    tx = redis_clients.connect(c.url, timeout_s=2, retries=False)
    tx.hset(key, "batchId", "7")

    def read() -> list:
        with tx.pipeline(transaction=True) as pipe:
            pipe.hget(key, "batchId")
            return pipe.execute()

    assert read() == [b"7"]
    c.kill(master)
    promoted, took = c.promoted(master, key)
    print(f"\nfailover of {master} to {promoted}: {took:.1f} s (cluster-node-timeout {c.node_timeout_ms} ms)")
    outcomes = []
    for _ in range(3):  # the first may still go to the dead master; it then asks where the slot is now
        try:
            outcomes.append(read())
        except RedisError as exc:
            outcomes.append(type(exc).__name__)
    assert outcomes[1:] == [[b"7"], [b"7"]], outcomes
    tx.close()

    # a client made now, by a URL whose first node is the dead master, finds the cluster through the others
    seeds = ",".join(f"127.0.0.1:{p}" for p in [master, *(p for p in c.ports if p != master)])
    late = redis_clients.connect(f"redis+cluster://{seeds}/0", timeout_s=2, retries=False)
    assert late.hget(key, "batchId") == b"7"
    late.close()

    c.restart(master)  # back, as a replica of the master that replaced it
    assert c.owner(key) == promoted and c.replicas_of(promoted) == [master]
