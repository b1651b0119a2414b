"""A Redis master killed under the whole system: the cluster fails over, and every promise holds.

Kafka, two real nodes and the Spark job as processes, every setting as ``conf/`` ships it (simulated
brokers send a 10 s timeout of their own), and Redis as a Redis Cluster of three masters, each with a
replica (:class:`RedisClusterInfra`, ``cluster-node-timeout`` as docs/deploy.md says:
:data:`tests.support.redis_cluster.NODE_TIMEOUT_MS`). The job's ``redis.url`` and the nodes'
``redisUrl`` name every Redis node, the master that holds the prefix's slot first. That master is
SIGKILLed by its PID; its replica takes over by the cluster's own failover.

While the slot has no master, one broker crashes and one falls silent: each leaves every node and
Redis within ``FAULT_BOUND_S`` of its deadline or close (the promise while a fault is on Redis), and
the broker that keeps talking is never missing from a node, nor from Redis when Redis answers. Within
``HEAL_BOUND_S`` of the promotion, and again of the old master's return as a replica, every node's
answer for every topic is the bytes Redis holds. The readers follow: ``namesrv-monitor routes``, the
console (started before the kill), and a node started after it with ``warmStartFromRedis=true``.
With the job stalled (SIGSTOP), the nodes' fallback writer removes a broker that crashed during a
second failover once the slot has a master again, and one that crashed after it within
``REDIS_AFTER_NODES_S`` of leaving the nodes. Every incident is opened once and resolved at most once.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.contract import wall_ms
from infra.processes import ServiceError, free_port
from namesrv.client import NameServerClient
from streaming.routes import RouteLookup
from tests.support import report as summary
from tests.support.backends import ProcessInfra
from tests.support.liveness import Gone, Observer, Stack, bounds_now, last_heard_ms, running
from tests.support.node import REPO
from tests.support.redis_cluster import RedisCluster
from tests.support.routes import route_or_none
from tests.support.system import EVENTS, SHIPPED, System
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(1500)

BROKER_TIMEOUT_MS = SHIPPED.broker_timeout_ms
#: deadline or close -> gone at every node and in Redis while Redis fails over (docs/deploy.md)
FAULT_BOUND_S = 5.0
#: the fault healed (replica promoted, old master back) -> every node's routes are Redis's bytes
HEAL_BOUND_S = 5.0
#: a broker's leaving the nodes -> gone from Redis, the job stalled and Redis up (docs/monitor.md)
REDIS_AFTER_NODES_S = 3.0
PREFIX = "namesrv"
#: a key of the prefix: its slot is every key's of the prefix (the prefix is their hash tag)
META = "{namesrv}:meta"
NODES = ("node-1", "node-2")


class RedisClusterInfra(ProcessInfra):
    """:class:`ProcessInfra` with a Redis Cluster of three masters and three replicas instead of one redis-server.

    Its URL names every node, the master that holds the prefix's slot when the cluster started first: a
    client made while that one is down finds the cluster through the others."""

    name = "processes, redis cluster"

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir)
        self.cluster = RedisCluster(run_dir / "redis-cluster", masters=3, replicas=1)
        self._url: str | None = None

    @property
    def redis_url(self) -> str:
        assert self._url is not None, "start() first"
        return self._url

    def start(self) -> None:
        self.kafka.start()
        self.cluster.start()
        self._url = self.cluster.url_first(self.cluster.owner(META))

    def stop(self) -> None:
        with contextlib.suppress(ServiceError):
            self.kafka.stop()
        self.cluster.stop()

    def describe(self) -> str:
        return (
            f"processes: Apache Kafka {self.kafka_bootstrap} (log {self.kafka.log_file}), "
            f"redis cluster {self.redis_url} (logs under {self.cluster.tmp})"
        )


class ClusterSystem(System):
    """The system on :class:`RedisClusterInfra`: the job's keys carry the prefix as a hash tag."""

    def committed_batch(self) -> int:
        lookup = RouteLookup(self.redis_url, PREFIX)
        try:
            return int(lookup.status().get("batchId", -1))
        finally:
            lookup.close()


def report(label: str, figures: dict[str, float], unit: str = "ms") -> None:
    line = f"{label}: " + ", ".join(f"{k} {v:.0f} {unit}".rstrip() for k, v in figures.items())
    summary.report(line)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("redis-failover")
    with running(ClusterSystem(RedisClusterInfra(run_dir), run_dir, timing=SHIPPED)) as s:
        yield s


def cluster_of(stack: Stack) -> RedisCluster:
    infra = stack.system.infra
    assert isinstance(infra, RedisClusterInfra)
    return infra.cluster


def routes_everywhere(stack: Stack) -> dict[str, list[bytes | None]]:
    """Every topic Redis or a node knows -> [Redis's bytes, node-1's answer, node-2's answer]."""
    lookup = stack.lookup
    topics = set(lookup.topics())
    for addr in stack.system.node_addrs:
        with NameServerClient(addr, timeout=3.0) as client:
            topics |= set(client.topic_list())
    return {t: [lookup.get_raw(t), *(route_or_none(a, t) for a in stack.system.node_addrs)] for t in sorted(topics)}


def consistent_within(stack: Stack, bound_ms: float, since: float, label: str) -> float:
    """Wait until every node's route answer is Redis's bytes for every topic; the seconds since ``since``."""
    import redis

    def same() -> bool:
        try:
            seen = routes_everywhere(stack)
        except (redis.RedisError, OSError):
            return False
        return all(len(set(answers)) == 1 for answers in seen.values())

    def differing() -> dict[str, list[bytes | None]]:
        with contextlib.suppress(redis.RedisError, OSError):
            return {t: a for t, a in routes_everywhere(stack).items() if len(set(a)) > 1}
        return {}

    wait_until(same, 60, f"every node's routes to be Redis's bytes ({label})", 0.1, state=differing)
    took = time.monotonic() - since
    report(f"redis failover: {label} -> same routes at every node and in Redis", {"took": took * 1000})
    assert took * 1000 <= bound_ms, f"{label}: {took:.1f} s until the same routes everywhere"
    return took


def job_log(stack: Stack) -> str:
    job = stack.system.streaming
    assert job is not None
    return job.log_file.read_text(errors="replace")


def batches_not_written(log: str) -> int:
    """Batches whose Redis write failed, in the job's log (each is caught up by the next batch's write)."""
    return sum("not written (" in line for line in log.splitlines())


def incidents_once(stack: Stack) -> None:
    """On the alerts topic, no incident was opened twice in a row or resolved twice in a row."""
    last: dict[str, str] = {}
    for alert in stack.system.tap.alerts():
        state = str(alert.state)
        assert last.get(alert.incident) != state, f"{alert.incident} {state} twice in a row"
        last[alert.incident] = state


@contextlib.contextmanager
def console(url: str) -> Iterator[str]:
    """``namesrv-monitor console`` reading ``url``; yields its /api/state address."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streaming.cli", "console", "--redis", url, "--port", str(port), "--poll-ms", "200"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    state = f"http://127.0.0.1:{port}/api/state"
    try:
        wait_until(lambda: console_state(state) is not None, 30, "the console to answer")
        yield state
    finally:
        proc.terminate()
        proc.wait(10)


def console_state(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return json.loads(answer.read())
    except OSError:
        return None


def test_a_killed_master_fails_over_and_no_promise_breaks(stack: Stack):
    system, cluster = stack.system, cluster_of(stack)
    survivor, _ = stack.add("keep")
    for fleet in ("crash", "quiet"):
        stack.add(fleet)
    with Observer(system.node_addrs, system.redis_url, {survivor}) as watch:
        master = cluster.owner(META)
        assert system.redis_url.startswith(f"redis+cluster://127.0.0.1:{master},")  # the dead one seeds first
        replica = cluster.replicas_of(master)
        assert len(replica) == 1
        failed_before = batches_not_written(job_log(stack))
        with console(system.redis_url) as state:
            wait_until(lambda: (console_state(state) or {}).get("redis", {}).get("ok"), 30, "the console to read Redis")
            batch_at_kill = system.committed_batch()
            quiet = Gone(
                system.node_addrs, system.redis_url, stack.fleets.broker("quiet"), BROKER_TIMEOUT_MS / 1000 + 60
            )
            stack.fleets.silence("quiet")
            time.sleep(BROKER_TIMEOUT_MS / 1000 - 1.5)  # schedule: its deadline falls a second or so into the failover
            wall_kill = wall_ms()
            cluster.kill(master)
            time.sleep(1.0)  # schedule: the crash comes a second into the failover
            crash = Gone(system.node_addrs, system.redis_url, stack.fleets.broker("crash"), 60)
            stack.fleets.crash("crash")
            promoted, failover_s = cluster.promoted(master, META)
            t_promoted = time.monotonic()
            assert promoted == replica[0]
            report("redis failover: master killed -> replica promoted", {"failover": failover_s * 1000})

            # the dead brokers: gone everywhere within the bound of their deadline or close
            (bound,) = bounds_now(FAULT_BOUND_S)
            crashed = crash.times()
            watch.left_redis(crash.name)
            closed = min(crashed[n] for n in NODES)  # the nodes drop a crashed broker at its close
            silent = quiet.times()
            watch.left_redis(quiet.name)
            wait_until(lambda: system.tap.reached(EVENTS), 30, "the tap at the end of the events topic")
            deadline = last_heard_ms(system.tap.events(), quiet.addr) + BROKER_TIMEOUT_MS
            figures = {
                **{f"crashed, {p}": crashed[p] - closed for p in crashed},
                **{f"silent, {p}": silent[p] - deadline for p in silent},
                "silent deadline after the kill": deadline - wall_kill,
            }
            report("redis failover: deadline or close -> gone", figures)
            assert all(at - closed <= bound for at in crashed.values()), figures
            assert all(deadline - 50 <= at <= deadline + bound for at in silent.values()), figures

            # healed: every node's answer is Redis's bytes, for every topic
            consistent_within(stack, bounds_now(HEAL_BOUND_S)[0], t_promoted, "replica promoted")

            # the readers follow: the console (made before the kill), namesrv-monitor routes (made now)
            wait_until(
                lambda: int(((console_state(state) or {}).get("meta") or {}).get("batchId", -1)) > batch_at_kill,
                30, "the console to read a batch written after the failover",
            )  # fmt: skip
        from streaming import cli

        topic = "TKEEP0"
        out = subprocess.run(
            [sys.executable, "-m", "streaming.cli", "routes", "--redis", system.redis_url, "get", topic],
            cwd=REPO, capture_output=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == stack.lookup.get_raw(topic) == route_or_none(system.node_addrs[0], topic)
        assert cli.main(["routes", "--redis", system.redis_url, "status"]) == 0

        failed = batches_not_written(job_log(stack)) - failed_before
        unanswered = [t for t in watch.unanswered if t >= wall_kill]
        report("redis failover: the job's batches", {"not written": failed}, unit="")
        span = (max(unanswered) - min(unanswered)) if unanswered else 0
        report("redis failover: Redis unanswered (a reader without retries, every 0.1 s)", {"for": span})
    watch.check()
    for fleet in ("crash", "quiet"):
        _, addr = stack.fleets.broker(fleet)
        assert len(system.tap.decisions(addr)) <= 1, (fleet, system.tap.decisions(addr))
    opened = [a for a in system.tap.alerts_for(quiet.addr, "BROKER_EXPIRED") if str(a.state) == "OPEN"]
    assert len(opened) == 1, opened
    incidents_once(stack)


def test_a_node_started_after_the_failover_warms_from_the_new_master_then_the_old_one_returns(stack: Stack):
    """The killed master is still down, and first in the node's redisUrl: the node warms from the promoted
    replica, found through the others. Then the old master comes back, as a replica: nothing moves."""
    system, cluster = stack.system, cluster_of(stack)
    (dead,) = [p for p in cluster.ports if p not in cluster.live_ports()]
    assert system.redis_url.startswith(f"redis+cluster://127.0.0.1:{dead},")
    batch = system.committed_batch()
    system.stop_node(1)
    system.start_node(1, warm_start=True)
    log = system.node_log(1)
    warmed = [line for line in log.splitlines() if "warm start:" in line and "provisional broker(s)" in line]
    assert warmed, log[-3000:]
    got = int(warmed[0].split(" batch ")[1].split()[0])
    assert got >= batch, warmed[0]  # written after the failover, so read from the promoted master
    consistent_within(stack, bounds_now(HEAL_BOUND_S)[0] + 5_000, time.monotonic(), "a node warm-started")

    # the old master back, as a replica of the promoted one: nothing moves, the routes stay the same
    promoted = cluster.owner(META)
    t_restart = time.monotonic()
    cluster.restart(dead)
    t_back = time.monotonic()
    report("redis failover: old master restarted -> a replica in sync", {"took": (t_back - t_restart) * 1000})
    assert cluster.owner(META) == promoted and cluster.replicas_of(promoted) == [dead]
    consistent_within(stack, bounds_now(HEAL_BOUND_S)[0], t_back, "old master back as a replica")


def test_the_nodes_fallback_writer_follows_a_failover_while_the_job_is_stalled(stack: Stack):
    """The job stalled (SIGSTOP) throughout; the master that holds the slot now is killed. A broker that
    crashes during the failover leaves Redis once the slot has a master again, within the bound of a fault on
    Redis; one that crashes after it, within REDIS_AFTER_NODES_S of leaving the nodes: the nodes' writer did
    both, through a client made before the failover."""
    system, cluster = stack.system, cluster_of(stack)
    survivor, _ = stack.add("keep2")
    for fleet in ("during", "after"):
        stack.add(fleet)
    with Observer(system.node_addrs, system.redis_url, {survivor}) as watch:
        master = cluster.owner(META)
        (fault_bound, redis_bound) = bounds_now(FAULT_BOUND_S, REDIS_AFTER_NODES_S)
        with system.streaming_frozen():
            cluster.kill(master)
            time.sleep(1.0)  # schedule: the crash comes a second into the failover
            during = Gone(system.node_addrs, system.redis_url, stack.fleets.broker("during"), 60)
            stack.fleets.crash("during")
            promoted, failover_s = cluster.promoted(master, META)
            report("redis failover, job stalled: master killed -> replica promoted", {"failover": failover_s * 1000})
            times = during.times()
            watch.left_redis(during.name)
            left = max(times[n] for n in NODES)
            after = Gone(system.node_addrs, system.redis_url, stack.fleets.broker("after"), 60)
            stack.fleets.crash("after")
            later = after.times()
            watch.left_redis(after.name)
            later_left = max(later[n] for n in NODES)
            figures = {"during: left the nodes -> redis": times["redis"] - left,
                       "after: left the nodes -> redis": later["redis"] - later_left}  # fmt: skip
            report("redis failover, job stalled: crashed broker gone from Redis", figures)
            assert times["redis"] - left <= fault_bound, figures
            assert later["redis"] - later_left <= redis_bound, figures
        removed = [line for i in range(2) for line in system.node_log(i).splitlines() if "no monitor decided" in line]
        assert any(during.addr in line for line in removed) and any(after.addr in line for line in removed), removed
        # the job resumes on a client made before the failover; it brings neither back and decides each once
        start = system.committed_batch()
        wait_until(lambda: system.committed_batch() >= start + 3, 120, "three more batches written")
        consistent_within(stack, 60_000, time.monotonic(), "the job resumed")
        cluster.restart(master)
    watch.check()
    for fleet in ("during", "after"):
        _, addr = stack.fleets.broker(fleet)
        assert len(system.tap.decisions(addr)) <= 1, (fleet, system.tap.decisions(addr))
    incidents_once(stack)
