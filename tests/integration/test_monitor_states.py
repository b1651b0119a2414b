"""Redis follows the nodes whatever the monitor's state: stalled, stalled for a minute, killed, restarting, slow.

Kafka, Redis, two real nodes and the Spark job as processes, every setting as ``conf/`` ships it
(simulated brokers send a 10 s timeout of their own, which cannot hide how late anything acts). In
each test the monitor is put in one state and brokers die at chosen moments of it: a broker that
crashes (its connections close) is gone at the nodes at once and from Redis within
``REDIS_AFTER_NODES_S`` of leaving them; a broker that falls silent is gone at every node within
``NODES_AFTER_DEADLINE_S`` of its deadline, and from Redis within ``REDIS_AFTER_NODES_S`` of that.
Throughout, a broker that keeps talking is never missing from any node or from Redis, a broker that
left Redis never comes back to it (not when the monitor resumes, restarts or catches up), and the
monitor decides on each broker at most once. The bounds hold to the targets on a quiet machine and
to three times them on a loaded one (:func:`tests.support.liveness.bounds_now`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from tests.support import report as summary
from tests.support.backends import ProcessInfra
from tests.support.liveness import Gone, Observer, Stack, bounds_now, last_heard_ms, running
from tests.support.system import EVENTS, SHIPPED, System
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(1200)

BROKER_TIMEOUT_MS = SHIPPED.broker_timeout_ms
#: a silent broker's deadline -> gone at every node; a broker's leaving the nodes -> gone from Redis
NODES_AFTER_DEADLINE_S, REDIS_AFTER_NODES_S = 2.0, 3.0
NODES = ("node-1", "node-2")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = tmp_path_factory.mktemp("monitor-states")
    with running(System(ProcessInfra(run_dir), run_dir, timing=SHIPPED)) as s:
        yield s


@pytest.fixture
def watch(stack: Stack) -> Iterator[Observer]:
    """A broker that keeps talking throughout the test, watched with the rest."""
    survivor, _ = stack.add(f"keep{len(stack.fleets.fleets)}")
    with Observer(stack.system.node_addrs, stack.system.redis_url, {survivor}) as w:
        yield w


def gone(stack: Stack, fleet: str, timeout: float) -> Gone:
    """When each place stops knowing ``fleet``'s broker, measured from now on."""
    return Gone(stack.system.node_addrs, stack.system.redis_url, stack.fleets.broker(fleet), timeout)


def report(label: str, figures: dict[str, int]) -> None:
    line = f"{label}: " + ", ".join(f"{k} {v} ms" for k, v in figures.items())
    summary.report(line)


def crash_and_check(stack: Stack, watch: Observer, fleet: str, label: str) -> None:
    """Crash ``fleet``'s broker: gone at both nodes, then from Redis within the bound of leaving them."""
    gone_at = gone(stack, fleet, 60)
    stack.fleets.crash(fleet)
    times = gone_at.times()
    watch.left_redis(gone_at.name)
    redis_after = times["redis"] - max(times[n] for n in NODES)
    report(f"{label}: crashed broker, left the nodes -> gone from Redis", {"redis": redis_after})
    (bound,) = bounds_now(REDIS_AFTER_NODES_S)
    assert redis_after <= bound, times


def silence(stack: Stack, fleet: str) -> Gone:
    """Silence ``fleet``'s broker; measure from now when each place forgets it."""
    gone_at = gone(stack, fleet, BROKER_TIMEOUT_MS / 1000 + 60)
    stack.fleets.silence(fleet)
    return gone_at


def check_silent(stack: Stack, watch: Observer, gone_at: Gone, label: str) -> None:
    """A silenced broker: gone at both nodes within the bound of its deadline, then from Redis within its bound."""
    times = gone_at.times()
    watch.left_redis(gone_at.name)
    wait_until(lambda: stack.system.tap.reached(EVENTS), 30, "the tap at the end of the events topic")
    deadline = last_heard_ms(stack.system.tap.events(), gone_at.addr) + BROKER_TIMEOUT_MS
    left_nodes = max(times[n] for n in NODES)
    figures = {**{n: times[n] - deadline for n in NODES}, "redis after the nodes": times["redis"] - left_nodes}
    report(f"{label}: silent broker, deadline -> gone", figures)
    nodes_bound, redis_bound = bounds_now(NODES_AFTER_DEADLINE_S, REDIS_AFTER_NODES_S)
    assert all(deadline - 50 <= times[n] <= deadline + nodes_bound for n in NODES), figures
    assert times["redis"] - left_nodes <= redis_bound, figures


def decided_at_most_once(stack: Stack, fleets: list[str]) -> None:
    """Once the job has written a few batches more, it decided on each broker at most once."""
    start = stack.system.committed_batch()
    wait_until(lambda: stack.system.committed_batch() >= start + 3, 120, "three more batches written")
    for fleet in fleets:
        _, addr = stack.fleets.broker(fleet)
        decisions = stack.system.tap.decisions(addr)
        assert len(decisions) <= 1, (fleet, decisions)


def test_a_stalled_monitor_leaves_no_dead_broker_at_the_nodes_or_in_redis(stack: Stack, watch: Observer):
    """Stalled for seconds (SIGSTOP): one broker falls silent before the stall, one crashes during it,
    one crashes just before the monitor resumes; the resumed monitor brings none back."""
    for fleet in ("stallquiet", "stallcrash", "stalllate"):
        stack.add(fleet)
    quiet = silence(stack, "stallquiet")  # its deadline falls 10 s later, well inside the stall
    time.sleep(3)  # schedule: the stall begins 3 s after the silence
    with stack.system.streaming_frozen():
        time.sleep(2)
        crash_and_check(stack, watch, "stallcrash", "monitor stalled")
        check_silent(stack, watch, quiet, "monitor stalled")
        late = gone(stack, "stalllate", 30)
        stack.fleets.crash("stalllate")
        time.sleep(0.3)  # schedule: the monitor resumes just after this crash
    late.times()
    watch.left_redis(late.name)
    decided_at_most_once(stack, ["stallquiet", "stallcrash", "stalllate"])
    watch.check()


def test_a_monitor_stalled_for_a_minute_leaves_no_dead_broker_in_redis(stack: Stack, watch: Observer):
    """The stall outlasts the nodes' monitorSilenceFallbackMillis (30 s): a broker that crashed before the
    nodes took expiry back, and one that fell silent after, leave Redis within seconds all the same."""
    for fleet in ("longcrash", "longquiet"):
        stack.add(fleet)
    with stack.system.streaming_frozen():
        time.sleep(10)  # schedule: the crash comes 10 s into the stall, before the nodes' fallback
        crash_and_check(stack, watch, "longcrash", "monitor stalled 10 s")
        wait_until(
            lambda: all("local expiry scan back on" in stack.system.node_log(i) for i in range(2)),
            60,
            "both nodes' fallback to their own expiry scan",
        )
        check_silent(stack, watch, silence(stack, "longquiet"), "monitor stalled past the nodes' fallback")
    decided_at_most_once(stack, ["longcrash", "longquiet"])
    watch.check()


def test_a_killed_then_restarting_monitor_leaves_no_dead_broker_in_redis(stack: Stack, watch: Observer):
    """Killed (SIGKILL): a broker crashes 10 s later; restarted: one crashes and one falls silent while the
    job starts and catches up."""
    for fleet in ("killcrash", "startcrash", "startquiet"):
        stack.add(fleet)
    stack.system.kill_streaming()
    time.sleep(10)  # schedule: the crash comes 10 s after the kill
    crash_and_check(stack, watch, "killcrash", "monitor killed")
    quiet = silence(stack, "startquiet")  # its deadline falls while the job starts
    restarted = threading.Thread(target=stack.system.start_streaming, name="restart", daemon=True)
    restarted.start()
    time.sleep(3)  # schedule: the crash comes 3 s into the restart
    crash_and_check(stack, watch, "startcrash", "monitor restarting")
    check_silent(stack, watch, quiet, "monitor restarting")
    restarted.join(300)
    assert not restarted.is_alive(), "the job did not start again"
    decided_at_most_once(stack, ["killcrash", "startcrash", "startquiet"])
    watch.check()


def test_a_slow_monitor_leaves_no_dead_broker_at_the_nodes_or_in_redis(stack: Stack, watch: Observer):
    """The job runs 0.4 s in every 2 s (stopped the rest, as a driver starved of CPU or pausing for its
    collector is): it still reads, decides and beats, but late, and its word on how far it has decided
    goes stale between runs. A broker that crashes and one that falls silent meanwhile leave the nodes
    and Redis in time."""
    for fleet in ("slowcrash", "slowquiet"):
        stack.add(fleet)
    with stack.system.streaming_slowed(stopped_s=1.6, running_s=0.4):
        quiet = silence(stack, "slowquiet")
        time.sleep(5)  # schedule: the crash comes 5 s into the slowdown
        crash_and_check(stack, watch, "slowcrash", "monitor slow")
        check_silent(stack, watch, quiet, "monitor slow")
    # the premise: the job was behind at that deadline, so the nodes decided it, not the job
    _, addr = stack.fleets.broker("slowquiet")
    for i in range(2):
        expired = [line for line in stack.system.node_log(i).splitlines() if "no monitor decided on them" in line]
        assert any(addr in line for line in expired), expired
    decided_at_most_once(stack, ["slowcrash", "slowquiet"])
    watch.check()
