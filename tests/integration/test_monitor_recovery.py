"""The monitor decides again soon after its job dies, and soon after the stack starts.

The stack as ``make run`` starts it (Kafka, Redis, two nodes and the job as processes, every setting
as ``conf/`` ships it but the simulated brokers' own timeout), with ``make run``'s own supervisor
restarting the job (:class:`tests.support.recovery.Supervising`). The job is SIGKILLed just after a
broker falls silent, so the broker's deadline passes while no job runs: the new job's first
MONITOR_HEARTBEAT, where the nodes hand expiry back to it, comes within ``RECOVERY_S`` of the kill,
and the broker is expired by one EXPIRE. The stack's first decision comes within ``START_S`` of its
start. The bounds are load-aware (:func:`tests.support.liveness.bounds_now`) and the figures printed;
``bench/recovery_bench.py`` splits the time into legs.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from common.contract import wall_ms
from tests.support.backends import ProcessInfra
from tests.support.fleet import FleetRunner
from tests.support.liveness import bounds_now, known_in_redis
from tests.support.recovery import Supervising, first_heartbeat
from tests.support.report import report
from tests.support.routes import brokers_at
from tests.support.system import SHIPPED, System
from tests.support.wait import wait_until

if TYPE_CHECKING:
    from streaming.routes import RouteLookup

pytestmark = pytest.mark.timeout(900)

#: a SIGKILLed job -> the first decision of the new one
RECOVERY_S = 30.0
#: the stack's start -> its job's first decision (``make run``'s start, and this suite's)
START_S = 30.0
#: a miss is measured once more before it fails: a neighbour's burst on this shared machine seldom
#: lands on both tries, a slow restart of the system's own shows in both. Every try is printed.
TRIES = 2


@dataclass
class Recovery:
    system: System
    fleets: FleetRunner
    supervising: Supervising
    lookup: RouteLookup


@pytest.fixture(scope="module")
def recovery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recovery]:
    from streaming.routes import RouteLookup

    run_dir = tmp_path_factory.mktemp("recovery")
    system = System(ProcessInfra(run_dir), run_dir, timing=SHIPPED)
    system.start()  # returns once the job has committed a batch and sent a MONITOR_HEARTBEAT
    assert system.streaming is not None
    r = Recovery(system, FleetRunner(), Supervising(system.streaming), RouteLookup(system.redis_url))
    try:
        yield r
    finally:
        r.supervising.stop()  # before the job is stopped, or it would restart it
        r.fleets.stop()
        r.lookup.close()
        system.stop()


def test_the_stack_s_first_decision_comes_within_seconds_of_its_start(tmp_path_factory: pytest.TempPathFactory):
    """Stacks of its own, before the module's (it runs first, and asks for no fixture): a try made beside a
    running stack would pay for that stack's batches too."""
    took_ms = [start_once(tmp_path_factory.mktemp("start"))]
    (bound_ms,) = bounds_now(START_S)
    while took_ms[-1] > bound_ms and len(took_ms) < TRIES:
        took_ms.append(start_once(tmp_path_factory.mktemp("start-again")))
    for attempt, ms in enumerate(took_ms, 1):
        report(f"stack start [try {attempt}] -> first MONITOR_HEARTBEAT: {ms / 1000:.1f} s "
               f"(bound {bound_ms / 1000:.0f} s)")  # fmt: skip
    assert took_ms[-1] <= bound_ms


def start_once(run_dir: Path) -> int:
    """A whole stack started afresh and stopped: ms from its start to its job's first MONITOR_HEARTBEAT."""
    system = System(ProcessInfra(run_dir), run_dir, timing=SHIPPED)
    started_ms = wall_ms()
    try:
        system.start()
        beat = first_heartbeat(system.tap.actions(), started_ms)
        assert beat is not None, "System.start returns after the job's first MONITOR_HEARTBEAT"
        return beat - started_ms
    finally:
        system.stop()


def add_broker(r: Recovery, fleet: str, port: int) -> tuple[str, str]:
    """A broker registered at both nodes and in Redis; returns (brokerName, brokerAddr)."""
    r.fleets.add(fleet, r.system.node_addrs, r.system.timing, addr_base=f"127.0.0.1:{port}")
    name, addr = r.fleets.broker(fleet)
    wait_until(
        lambda: all(name in brokers_at(a) for a in r.system.node_addrs) and name in known_in_redis(r.lookup),
        90,
        f"{name} at both nodes and in Redis",
    )
    return name, addr


def kill_and_time(r: Recovery, attempt: int) -> tuple[int, str, str]:
    """SIGKILL the job as a broker falls silent: (ms from the kill to the new job's first beat, name, addr)."""
    system, sup = r.system, r.supervising
    name, addr = add_broker(r, f"away{attempt}", 44000 + 10 * attempt)
    pid = system.streaming_pid
    assert pid is not None, "the job runs"
    r.fleets.silence(f"away{attempt}")  # its deadline passes while no job runs
    killed = wall_ms()
    os.kill(pid, signal.SIGKILL)
    noticed, cleared = sup.death_after(killed, 30)
    restarted, _ = sup.restart_after(killed, 60)
    beat = wait_until(
        lambda: first_heartbeat(system.tap.actions(), killed), 300, "the new job's first MONITOR_HEARTBEAT"
    )
    assert beat is not None
    report(
        f"recovery [try {attempt}]: kill -> death noticed {(noticed - killed) / 1000:.1f} s, its leftovers gone "
        f"{(cleared - killed) / 1000:.1f} s, job restarted {(restarted - killed) / 1000:.1f} s, first "
        f"MONITOR_HEARTBEAT {(beat - killed) / 1000:.1f} s (1-minute load {os.getloadavg()[0]:.1f})"
    )
    return beat - killed, name, addr


def test_a_killed_job_is_deciding_again_within_seconds_and_expires_what_died_meanwhile_once(recovery: Recovery):
    for attempt in range(1, TRIES + 1):
        took_ms, name, addr = kill_and_time(recovery, attempt)
        (bound_ms,) = bounds_now(RECOVERY_S)
        if took_ms <= bound_ms:
            break
    assert took_ms <= bound_ms, recovery.supervising.out.getvalue()
    # the broker whose deadline passed while no job ran: expired by the new job, once, and gone everywhere
    tap = recovery.system.tap
    wait_until(lambda: tap.decisions(addr), 60, f"the new job's decision on {name}")
    wait_until(
        lambda: not any(name in brokers_at(a) for a in recovery.system.node_addrs)
        and name not in known_in_redis(recovery.lookup),
        30,
        f"{name} gone at both nodes and in Redis",
    )
    before = recovery.system.committed_batch()
    wait_until(lambda: recovery.system.committed_batch() >= before + 3, 60, "three more batches")
    assert tap.decisions(addr) == ["EXPIRE"]
