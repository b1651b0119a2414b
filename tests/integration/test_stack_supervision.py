"""``make run`` when a part dies: the real ``python -m infra.stack up``, on free ports and its own run dir.

One stack with the Spark job for the module, one story in order: (1) the job's driver is SIGKILLed
after a committed batch: nothing else restarts, nothing of its process tree survives, and a new job
carries on under the same query lineage; (2) a node is SIGKILLed: the other answers throughout and
it comes back on its port; (3) SIGTERM to ``up``: exit 0 and every process it started is gone.
Then, without the job: ``make stop`` from another shell while ``up`` waits to restart Redis stops
everything, and nothing is restarted behind its back.  The stack runs the shipped ``conf/`` files,
only ports and paths differ; every wait is a poll with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from infra.apps import NodeService, StreamingJob
from infra.processes import ProcessService, free_port, pid_alive, port_is_free
from infra.processes import read_pidfile as _read_pidfile
from infra.redis import RedisService
from infra.stack import UP_PIDFILE, build_parser, build_stack
from namesrv.client import NameServerClient
from streaming.routes import RouteLookup
from tests.support.report import SUMMARY
from tests.support.system import _start_time, descendants, log_tail
from tests.support.wait import wait_until

pytestmark = pytest.mark.timeout(900)

SPARK_S = 300.0  # the job's start and first committed batch, on a shared 2-core machine
UP_STOP_S = 120.0


@dataclass
class Stack:
    """A running ``python -m infra.stack up`` and the services it runs, found through their pidfiles."""

    proc: subprocess.Popen[bytes]
    argv: list[str]
    run_dir: Path
    services: list[ProcessService]
    out: Path
    err: Path
    redis_url: str

    def service(self, name: str) -> ProcessService:
        return next(s for s in self.services if s.name == name)

    @property
    def nodes(self) -> list[NodeService]:
        return [s for s in self.services if isinstance(s, NodeService)]

    def pid(self, name: str) -> int | None:
        """The live PID in the service's pidfile.  Read only: ``running_pid`` would remove a stale
        pidfile, racing with ``up`` writing the new one."""
        pid = _read_pidfile(self.service(name).pidfile)
        return pid if pid is not None and pid_alive(pid) else None

    def pids(self) -> dict[str, int | None]:
        return {s.name: self.pid(s.name) for s in self.services}

    def said(self) -> str:
        return self.err.read_text(errors="replace")

    def line(self, prefix: str) -> str | None:
        """The first line ``up`` printed that starts with ``prefix``."""
        return next((li for li in self.said().splitlines() if li.startswith(prefix)), None)

    def up_alive(self) -> bool:
        return self.proc.poll() is None

    def state(self) -> str:
        return (
            f"pids {self.pids()}, up {'runs' if self.up_alive() else f'exited {self.proc.returncode}'}; "
            f"up's stderr ends with:\n{log_tail(self.err, 15)}"
        )


def answers(node: NodeService) -> bool:
    try:
        with NameServerClient(node.address, timeout=2.0) as client:
            client.cluster_info()
        return True
    except OSError:
        return False


def start_stack(tmp: Path, *, streaming: bool) -> Stack:
    run_dir = tmp / "run"
    conf = tmp / "services.properties"
    conf.write_text(
        f"kafka.port={free_port()}\nkafka.controllerPort={free_port()}\nredis.port={free_port()}\nrun.dir={run_dir}\n"
        f"kafka.dataDir={run_dir / 'kafka'}\n"
    )
    argv = ["--services-conf", str(conf), "--node-ports", f"{free_port()},{free_port()}"]
    if not streaming:
        argv.append("--no-streaming")
    # the same services `up` builds, for their pidfiles (and PIDs checked against their binaries)
    services = build_stack(build_parser().parse_args(["status", *argv]))
    out, err = tmp / "up.out", tmp / "up.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infra.stack", "up", *argv],
            stdout=o,
            stderr=e,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    redis_service = services[1]
    assert isinstance(redis_service, RedisService)
    stack = Stack(proc, argv, run_dir, services, out, err, redis_service.url)

    def ready() -> bool:
        assert stack.up_alive(), f"`up` exited:\n{stack.state()}"
        return "The name-server system is up" in out.read_text(errors="replace")

    wait_until(ready, 180, "`up` to print its banner", interval=0.3, state=stack.state)
    return stack


def stop_stack(stack: Stack) -> None:
    """Backstop for a failed test: SIGTERM ``up``, then ``down`` for whatever is left."""
    if stack.up_alive():
        stack.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            stack.proc.wait(UP_STOP_S)
    if stack.up_alive():
        stack.proc.kill()
        stack.proc.wait()
    subprocess.run([sys.executable, "-m", "infra.stack", "down", *stack.argv], check=False, timeout=UP_STOP_S)


def gone(procs: list[tuple[int, str | None]]) -> list[int]:
    """Those of ``procs`` (PID, start time) still running as the same process (PIDs get reused)."""
    return [pid for pid, started in procs if pid_alive(pid) and _start_time(pid) == started]


def tree(pid: int) -> list[tuple[int, str | None]]:
    return [(pid, _start_time(pid)), *descendants(pid)]


# --------------------------------------------------------------------------- with the job


@dataclass
class Story:
    stack: Stack
    lookup: RouteLookup
    #: every process seen under `up` along the way: none may outlive it
    seen: list[tuple[int, str | None]]


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    stack = start_stack(tmp_path_factory.mktemp("stack"), streaming=True)
    lookup = RouteLookup(stack.redis_url)
    try:
        yield Story(stack, lookup, [])
    finally:
        lookup.close()
        stop_stack(stack)


def committed(lookup: RouteLookup) -> tuple[str | None, int]:
    """The job's last write to Redis: (query lineage, batch id); (None, -1) before the first or without Redis."""
    try:
        status = lookup.status()
    except redis.RedisError:
        return None, -1
    return status.get("lineage"), int(status.get("batchId", -1))


def measured(what: str, since: float) -> None:
    SUMMARY.append(f"  {what:<56} {time.monotonic() - since:6.1f} s")


def test_the_job_killed_is_restarted_from_its_checkpoint_while_the_rest_serves(story: Story):
    stack = story.stack
    job = stack.service(StreamingJob.name)
    SUMMARY.append("test_stack_supervision.py (python -m infra.stack up, shipped conf/):")
    t0 = time.monotonic()
    wait_until(
        lambda: committed(story.lookup)[1] >= 0,
        SPARK_S,
        "the job's first committed batch",
        interval=0.5,
        state=stack.state,
    )
    measured("job started to its first committed batch", t0)
    # the banner lists the job at its metrics address, the one port it serves
    banner = stack.out.read_text(errors="replace").splitlines()
    (line,) = [li for li in banner if li.split()[:1] == [job.name]]
    assert line.split()[1] == job.address and not job.address.endswith(":0"), line
    lineage, batch = committed(story.lookup)
    before = stack.pids()
    driver = before[job.name]
    assert driver is not None
    job_tree = tree(driver)
    assert len(job_tree) > 1, "the job has no JVM below it"
    story.seen.extend(job_tree)

    os.kill(driver, signal.SIGKILL)
    killed = time.monotonic()

    # the rest keeps running and serving while the job is down
    wait_until(lambda: stack.pid(job.name) != driver, 10, "`up` to notice the job is gone", state=stack.state)
    for node in stack.nodes:
        assert answers(node), f"{node.name} does not answer with the job down:\n{stack.state()}"
    now = stack.pids()
    for name in ("kafka", "redis", *(n.name for n in stack.nodes)):
        assert now[name] == before[name] and pid_alive(before[name]), (name, stack.state())
    assert stack.up_alive()
    said = wait_until(
        lambda: stack.line(f"streaming (pid {driver})"), 10, "`up` to say the job died", state=stack.state
    )
    assert "killed by SIGKILL" in said and "restarting it from its checkpoint" in said, said
    # the cause, not the dying query's Java trace
    quoted = [li for li in stack.said().splitlines() if li.startswith("  | ")]
    assert not [li for li in quoted if "java." in li or "at org.apache." in li], stack.said()
    # nothing of the dead job survives it: its JVM and workers would hold the same checkpoint
    wait_until(lambda: not gone(job_tree), 30, "the dead job's processes to go", state=lambda: gone(job_tree))
    measured("job killed to its whole tree gone", killed)

    new = wait_until(lambda: stack.pid(job.name), 30, "a new job PID", state=stack.state)
    assert new != driver
    measured("job killed to a new job PID", killed)
    wait_until(
        lambda: f"streaming restarted (pid {new})" in stack.said(),
        30,
        "`up` to say the job restarted",
        state=stack.state,
    )
    # from its checkpoint: the same query (lineage), batches carry on after the last one
    wait_until(
        lambda: (c := committed(story.lookup))[0] == lineage and c[1] > batch,
        SPARK_S,
        f"a batch after {batch} under lineage {lineage}",
        interval=0.5,
        state=lambda: f"{committed(story.lookup)}; {stack.state()}",
    )
    measured("job killed to a batch committed from its checkpoint", killed)
    for node in stack.nodes:
        assert answers(node)


def test_a_node_killed_is_restarted_while_the_rest_serves(story: Story):
    stack = story.stack
    victim, other = stack.nodes
    before = stack.pids()
    old = before[victim.name]
    assert old is not None
    story.seen.extend(tree(old))

    os.kill(old, signal.SIGKILL)
    killed = time.monotonic()

    def back() -> bool:
        assert answers(other), f"{other.name} stopped answering while {victim.name} was down:\n{stack.state()}"
        pid = stack.pid(victim.name)
        return pid is not None and pid != old and answers(victim)

    wait_until(back, 60, f"{victim.name} to be restarted and answer", interval=0.2, state=stack.state)
    measured("node killed to a new node answering", killed)
    now = stack.pids()
    assert {k: v for k, v in now.items() if k != victim.name} == {k: v for k, v in before.items() if k != victim.name}
    said = stack.said()
    assert f"{victim.name} (pid {old}) killed by SIGKILL" in said and "restarting it on the same port" in said
    assert stack.up_alive()


def test_sigterm_to_up_stops_everything_it_started(story: Story):
    stack = story.stack
    assert stack.up_alive(), stack.state()
    story.seen.extend(descendants(stack.proc.pid))
    assert {pid for pid in stack.pids().values()} <= {pid for pid, _ in story.seen}, stack.state()

    t0 = time.monotonic()
    stack.proc.send_signal(signal.SIGTERM)
    code = stack.proc.wait(UP_STOP_S)
    measured("SIGTERM to `up` exited, everything stopped", t0)

    assert code == 0, stack.state()
    assert gone(story.seen) == [], f"still running after `up` stopped: {gone(story.seen)}"
    assert [s.name for s in stack.services if s.pidfile.exists()] == []
    assert not (stack.run_dir / UP_PIDFILE).exists()


# --------------------------------------------------------------------------- make stop


def test_make_stop_from_another_shell_stops_everything_even_during_a_restart(tmp_path):
    stack = start_stack(tmp_path, streaming=False)
    try:
        seen = descendants(stack.proc.pid)
        redis = stack.pid("redis")
        assert redis is not None
        os.kill(redis, signal.SIGKILL)
        wait_until(lambda: "redis (pid" in stack.said(), 10, "`up` to say Redis died", state=stack.state)

        # `make stop` runs `python -m infra.stack down` with the Makefile's defaults; ours has the test's ports
        done = subprocess.run(
            [sys.executable, "-m", "infra.stack", "down", *stack.argv],
            capture_output=True,
            text=True,
            timeout=UP_STOP_S,
        )

        assert done.returncode == 0, done.stderr
        assert not stack.up_alive(), f"`down` returned with `up` still running:\n{stack.state()}"
        assert stack.proc.returncode == 0
        assert gone(seen) == [], stack.state()
        # nothing restarted behind `down`'s back: no pidfile, no process on any port of the stack
        assert [s.name for s in stack.services if s.pidfile.exists()] == []
        assert [s.name for s in stack.services if not port_is_free(s.port)] == []
    finally:
        stop_stack(stack)
