"""The whole system at fleet scale: 10,000 brokers across 3 nodes, 100,000 topics, real protocol, Kafka, Redis, Spark.

The end-to-end suite's stack (:class:`tests.support.system.System`, three nodes on
:class:`~tests.support.backends.ProcessInfra`) from the shipped ``conf/`` files, loaded as
RocketMQ 5.x brokers load a name server: ``rmq-loadgen setup`` registers the fleet at every node and
sends QUERY_DATA_VERSION for every broker every 30 s, spread over ``--spread`` start times as real
brokers spread theirs.  Timed steps: the nodes' start and RSS, the fleet's registration and RSS,
the job's first decision on that backlog, ``--window`` seconds of steady state from the job's own
per-batch log lines, and the expiry of ``--probes`` probe brokers that fall silent.  Everything
shares the machine's cores with the load generator.  ``docs/internals/benchmarks.md`` says how each
figure is made; results go to ``bench/SCALE_RESULTS.md``.

    PYTHONPATH=. .venv/bin/python bench/scale_bench.py [--quick] [--brokers 10000 --topics-per-broker 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support.system and tests.support.loadgen: the suite's stack and load

from common import procfs, redis_clients  # noqa: E402
from common.protocol.codes import RequestCode, ResponseCode  # noqa: E402
from infra.apps import StreamingJob  # noqa: E402
from namesrv.client import NameServerClient  # noqa: E402
from tests.support import system as suite  # noqa: E402
from tests.support.backends import ProcessInfra  # noqa: E402
from tests.support.fleet import FleetRunner  # noqa: E402
from tests.support.loadgen import LOADGEN, FleetNames, hold_brokers  # noqa: E402
from tests.support.system import ACTIONS, KafkaTap, System, Timing  # noqa: E402
from tests.support.wait import wait_until  # noqa: E402

#: RocketMQ's registration / heartbeat period (BrokerConfig.registerNameServerPeriod)
HEARTBEAT_S = 30
#: "batch 12: 345 events (0 bad) in 20 rows, input 1.0/s processed 2.0/s in 1234 ms; ..." (streaming/progress.py)
_BATCH = re.compile(
    r"batch (\d+): (\d+) events \(\d+ bad\)(?: in \d+ rows,)? input ([\d.]+)/s processed ([\d.]+)/s in (\d+) ms"
)
_REDIS = re.compile(r"redis: batch (\d+) written in ([\d.]+) ms")
MIB = 1024 * 1024


class VerboseJob(StreamingJob):
    """The job as the stack starts it, with ``-v``: one log line per batch, which this bench reads."""

    def _command(self, binary: Path) -> list[str]:
        return [*super()._command(binary), "-v"]


def say(text: str) -> None:
    print(f"[scale] {text}", file=sys.stderr, flush=True)


def rss_mib(pid: int | None) -> float:
    size = procfs.rss_bytes(pid) if pid is not None else None
    return (size or 0) / MIB


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


@dataclass
class Result:
    brokers: int
    topics_per_broker: int
    nodes: int = 3
    rss_idle: list[float] = field(default_factory=list)
    rss_loaded: list[float] = field(default_factory=list)
    rss_end: list[float] = field(default_factory=list)
    register_s: list[float] = field(default_factory=list)
    first_decision_s: float | None = None
    backlog_events: int = 0
    batches: list[tuple[int, int, float, float, int]] = field(default_factory=list)
    redis_ms: list[float] = field(default_factory=list)
    window_s: float = 0.0
    expiry_ms: dict[str, list[float]] = field(default_factory=dict)
    missed: list[str] = field(default_factory=list)
    job_rss: float = 0.0
    loads: list[float] = field(default_factory=list)
    redis_used: float = 0.0
    redis_keys: int = 0
    notes: list[str] = field(default_factory=list)


class LogTail:
    """The job's log from a position on: batch and Redis-write lines."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0

    def mark(self) -> None:
        self.pos = self.path.stat().st_size if self.path.exists() else 0

    def read(self) -> tuple[list[tuple[int, int, float, float, int]], list[float]]:
        with self.path.open("rb") as f:
            f.seek(self.pos)
            text = f.read().decode(errors="replace")
        batches = [(int(a), int(b), float(c), float(d), int(e)) for a, b, c, d, e in _BATCH.findall(text)]
        return batches, [float(ms) for _, ms in _REDIS.findall(text)]


def first_error(log: Path) -> str:
    """The first line of the log that names an error or exception (a JVM trace's tail names none)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        if re.search(r"Error|Exception|level=error", line) and not line.lstrip().startswith("at "):
            return f"{line.strip()[:500]} (log: {log})"
    return f"no error line in {log}: {suite.log_tail(log, 5)}"


def topic_gone(addr: str, topic: str) -> bool:
    with NameServerClient(addr, timeout=5) as c:
        response = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    return response is not None and response.code == ResponseCode.TOPIC_NOT_EXIST


def expiry(system: System, res: Result, probes: int, timeout_ms: int) -> None:
    from streaming.routes import RouteLookup

    runner = FleetRunner()
    timing = Timing(broker_timeout_ms=timeout_ms, broker_heartbeat_s=1.0)
    names = [f"probe{k}" for k in range(probes)]
    for k, name in enumerate(names):  # addresses apart from the load's (127.0.0.1:30000+2b)
        runner.add(name, system.node_addrs, timing, addr_base=f"127.0.0.2:{40000 + 10 * k}")
    topics = {name: f"T{name.upper()}0" for name in names}
    lookup = RouteLookup(system.redis_url)
    places = [*system.node_addrs, "redis"]

    def present(name: str, place: str) -> bool:
        if place == "redis":
            return lookup.get_raw(topics[name]) is not None
        return not topic_gone(place, topics[name])

    try:
        wait_until(
            lambda: all(present(n, p) for n in names for p in places), 180, "every probe at every node and in Redis"
        )
        time.sleep(3)  # a few heartbeat rounds, so the job has seen each probe heartbeat since registering
        deadlines: dict[str, float] = {}
        for name in names:
            runner.silence(name)  # no tick touches the fleet after this returns: its links show its last heartbeat
            links = runner.fleets[name].members[0].links.values()
            last = max(link.heartbeat_at for link in links) - timing.broker_heartbeat_s
            deadlines[name] = last + timeout_ms / 1000
            time.sleep(1.0)
        gone: dict[tuple[str, str], float] = {}
        end = time.monotonic() + timeout_ms / 1000 + 90
        while len(gone) < len(names) * len(places) and time.monotonic() < end:
            for name in names:
                for place in places:
                    if (name, place) not in gone and not present(name, place):
                        gone[(name, place)] = time.monotonic()
            time.sleep(0.05)
        for name in names:
            everywhere = [gone.get((name, p)) for p in places]
            if None in everywhere:
                res.missed.append(name)
                continue
            for place in places:
                label = "redis" if place == "redis" else f"node {system.node_addrs.index(place) + 1}"
                res.expiry_ms.setdefault(label, []).append((gone[(name, place)] - deadlines[name]) * 1000)
            res.expiry_ms.setdefault("everywhere", []).append((max(everywhere) - deadlines[name]) * 1000)
    finally:
        runner.stop()
        lookup.close()


def fleet_groups(brokers: int, spread: int) -> list[tuple[int, FleetNames | None]]:
    """The fleet at one node as ``spread`` setups of distinct brokers and topics (count, names).

    One group keeps rmq-loadgen's own names; more split the brokers as evenly as they go.
    """
    spread = max(1, min(spread, brokers))
    if spread == 1:
        return [(brokers, None)]
    counts = [brokers // spread + (i < brokers % spread) for i in range(spread)]
    port = 20000
    out: list[tuple[int, FleetNames | None]] = []
    for i, count in enumerate(counts):
        out.append((count, FleetNames(broker_prefix=f"g{i}-broker-", topic_prefix=f"G{i}T", port_base=port)))
        port += 2 * count + 2
    if port > 65535:
        raise SystemExit(f"{brokers} brokers need more ports than one host has: run fewer per node")
    return out


def run(args: argparse.Namespace, res: Result, tmp: Path) -> None:
    suite.StreamingJob = VerboseJob  # type: ignore[misc]  # System builds its job from this name
    system = System(ProcessInfra(tmp), tmp, Timing(), nodes=3)
    holders: list[subprocess.Popen] = []
    try:
        say("starting Kafka (Apache Kafka, one KRaft node), Redis and 3 nodes")
        system.infra.start()
        for i in range(3):
            system.start_node(i)
        pids = [node.status().pid if node else None for node in system.nodes]
        time.sleep(2)
        res.rss_idle = [rss_mib(p) for p in pids]

        groups = fleet_groups(args.brokers, args.spread)
        say(
            f"registering {args.brokers} brokers x {args.topics_per_broker} topics at each node, in "
            f"{len(groups)} group(s) started {HEARTBEAT_S / len(groups):.1f} s apart"
        )
        errors: list[BaseException] = []

        def hold(addr: str) -> None:
            t0 = time.monotonic()
            for i, (count, names) in enumerate(groups):
                # each group's setup heartbeats on its own 30 s timer from its start, as each real broker
                # does from its own: group i starts i/len(groups) of a period after the first
                delay = t0 + i * HEARTBEAT_S / len(groups) - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                try:
                    proc, _ = hold_brokers(addr, count, args.topics_per_broker, hold_s=24 * 3600, names=names)
                except BaseException as e:  # reported below
                    errors.append(e)
                    return
                holders.append(proc)
            res.register_s.append(time.monotonic() - t0)

        threads = [threading.Thread(target=hold, args=(a,)) for a in system.node_addrs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        res.rss_loaded = [rss_mib(p) for p in pids]
        say(f"registered in {', '.join(f'{s:.1f}' for s in res.register_s)} s; RSS {res.rss_loaded} MiB")

        say("starting the streaming job on the registrations' backlog")
        tap = KafkaTap(system.kafka_bootstrap, topics=(ACTIONS,))
        since_ms = int(time.time() * 1000)
        t0 = time.monotonic()
        system.streaming = VerboseJob(
            run_dir=system._run_dir("streaming"),
            conf=REPO / "conf" / "streaming.properties",
            overrides=system.streaming_overrides(),
        )
        system.streaming.start()
        job_log = LogTail(system.streaming.log_file)

        def decided() -> bool:
            if system.streaming is None or system.streaming.status().pid is None:
                raise RuntimeError(f"the streaming job exited: {first_error(system.streaming.log_file)}")
            return any(a.type == "MONITOR_HEARTBEAT" and a.decided_at >= since_ms for a in tap.actions())

        try:
            wait_until(decided, args.first_decision_timeout, "the job's first decision", interval=0.5)
        except AssertionError:  # the job is not keeping up: measure what it does anyway
            first, _ = job_log.read()
            res.notes.append(
                f"no decision within {args.first_decision_timeout:.0f} s of the job's start: its batches took "
                f"{', '.join(f'{b[4] / 1000:.0f} s' for b in first) or 'none finished'} for "
                f"{sum(b[1] for b in first):,} events, and its event time never came within "
                "alerts.monitorLagMillis of the wall clock (the job announces itself only then)"
            )
            say(res.notes[-1])
        else:
            res.first_decision_s = time.monotonic() - t0
            first, _ = job_log.read()
            say(f"first decision after {res.first_decision_s:.1f} s")
        res.backlog_events = sum(b[1] for b in first)

        say(f"steady state for {args.window:.0f} s")
        job_log.mark()
        t0 = time.monotonic()
        time.sleep(args.window)
        res.window_s = time.monotonic() - t0
        res.batches, res.redis_ms = job_log.read()
        say(f"{args.probes} probes with heartbeatTimeoutMillis={args.probe_timeout_ms} fall silent, one a second")
        expiry(system, res, args.probes, args.probe_timeout_ms)
        res.rss_end = [rss_mib(p) for p in pids]
        redis = redis_clients.connect(system.redis_url)
        try:
            res.redis_used = int(redis.info("memory")["used_memory"]) / MIB
            res.redis_keys = int(redis.dbsize())
        finally:
            redis.close()
        job_pid = system.streaming_pid
        res.job_rss = rss_mib(job_pid) + sum(rss_mib(s.pid) for s in procfs.descendants(job_pid)) if job_pid else 0.0
        tap.close()
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
        with contextlib.suppress(Exception):
            system.stop()


def table(rows: list[tuple[str, str]]) -> str:
    return "\n".join(["| figure | value |", "|---|---:|", *(f"| {a} | {b} |" for a, b in rows)])


def stats(xs: list[float], unit: str = "ms") -> str:
    if not xs:
        return "–"
    return f"median {statistics.median(xs):,.0f} {unit}, p95 {pct(xs, 0.95):,.0f}, max {max(xs):,.0f} (n={len(xs)})"


def report(args: argparse.Namespace, res: Result, command: str, wall_s: float) -> str:
    b, t = res.brokers, res.topics_per_broker
    events = sum(x[1] for x in res.batches)
    busy_s = sum(x[4] for x in res.batches) / 1000
    offered = events / res.window_s if res.window_s else 0.0
    from namesrv.config import load_config

    ticks = 3 * 1000 / load_config(REPO / "conf" / "namesrv.properties", {}).tick_interval_millis
    per_broker_min = max(0.0, offered - ticks) * 60 / b if b else 0.0
    load = " → ".join(f"{x:.1f}" for x in res.loads)
    rows = [
        ("brokers x topics per broker (topics)", f"{b:,} x {t} ({b * t:,})"),
        (
            "heartbeat groups per node (setups started evenly across 30 s)",
            f"{args.spread} (1 = every broker's QUERY_DATA_VERSION at once)",
        ),
        ("registration of the fleet at each node (3 at once)", ", ".join(f"{s:.1f} s" for s in res.register_s)),
        ("time from job start to its first decision", f"{res.first_decision_s:.1f} s" if res.first_decision_s else "–"),
        ("events in the batches up to it (or to the timeout)", f"{res.backlog_events:,}"),
        ("events/s through the job, steady state (offered = taken)", f"{offered:,.0f}"),
        ("of which TICKs (3 nodes, fixed)", f"{ticks:,.0f}"),
        ("events per broker per minute (3 nodes, TICKs aside)", f"{per_broker_min:.1f}"),
        ("the job's capacity: events per second of batch time", f"{events / busy_s:,.0f}" if busy_s else "–"),
        ("batch duration", stats([x[4] for x in res.batches])),
        (
            "batch interval busy (sum of batch durations / window)",
            f"{busy_s / res.window_s:.0%}" if res.window_s else "–",
        ),
        ("Redis write per batch", stats(res.redis_ms)),
        *((f"expiry: deadline → gone at {k}", stats(v)) for k, v in res.expiry_ms.items()),
        ("probes never gone within the wait", ", ".join(res.missed) or "none"),
        ("node RSS idle (MiB)", ", ".join(f"{x:.0f}" for x in res.rss_idle)),
        ("node RSS with the fleet registered (MiB)", ", ".join(f"{x:.0f}" for x in res.rss_loaded)),
        ("node RSS at the end (MiB)", ", ".join(f"{x:.0f}" for x in res.rss_end)),
        ("the job's RSS, driver + JVM + workers (MiB)", f"{res.job_rss:,.0f}"),
        ("Redis used_memory at the end (MiB; keys)", f"{res.redis_used:,.1f} ({res.redis_keys:,} keys)"),
        ("Redis memory per 1,000 topics (MiB)", f"{res.redis_used * 1000 / (b * t):,.2f}" if b * t else "–"),
    ]
    return "\n".join(
        [
            f"## {b:,} brokers x {t} topics ({'quick' if args.quick else 'full'}, "
            f"{'heartbeats all at once' if args.spread == 1 else f'heartbeats in {args.spread} groups'})",
            "",
            f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {wall_s:.0f} s in all; load average (1 min) at start → end: {load}).",
            "",
            table(rows),
            "",
            *(f"- {n}" for n in res.notes),
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 brokers and a 60 s window")
    parser.add_argument("--brokers", type=int, help="per node (default 10,000; --quick 1,000)")
    parser.add_argument("--topics-per-broker", type=int, default=10)
    parser.add_argument("--window", type=float, help="steady-state seconds (default 180; --quick 60)")
    parser.add_argument(
        "--spread",
        type=int,
        default=10,
        help="split each node's fleet into this many setups started evenly across the 30 s heartbeat period, "
        "as real brokers' own timers spread theirs (default 10); 1 sends every heartbeat at once",
    )
    parser.add_argument("--probes", type=int, default=5)
    parser.add_argument("--probe-timeout-ms", type=int, default=10_000)
    parser.add_argument("--first-decision-timeout", type=float, default=900)
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs, data) afterwards")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "SCALE_RESULTS.md")
    args = parser.parse_args()
    args.brokers = args.brokers or (1_000 if args.quick else 10_000)
    args.window = args.window or (60.0 if args.quick else 180.0)
    if not LOADGEN.exists():
        raise SystemExit(f"{LOADGEN} is missing: run `bash tests/peers/install.sh` (or `make setup`) first")
    command = "python bench/scale_bench.py " + shlex.join(sys.argv[1:])
    res = Result(args.brokers, args.topics_per_broker)
    res.loads = [os.getloadavg()[0]]
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="scale-bench-"))
    try:
        run(args, res, tmp)
    except Exception as e:  # say how far it got, and why
        res.notes.append(f"**stopped early**: {type(e).__name__}: {str(e)[:600]}")
        say(f"stopped early: {e!r}")
    finally:
        if args.keep:
            say(f"logs and data stay in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    res.loads.append(os.getloadavg()[0])
    res.notes.append(
        f"machine: {platform.machine()}, {os.cpu_count()} cores shared with other users, "
        f"Python {platform.python_version()}; every process of the stack and the load generator on the same cores"
    )
    text = report(args, res, command, time.monotonic() - started)
    print(text)
    out = args.out
    old = out.read_text() if out.exists() else ""
    header = old.split("\n## ", 1)[0] if old else "# Scale benchmark\n"
    sections = {s.split("\n", 1)[0]: s for s in ("## " + x for x in old.split("\n## ")[1:])}
    sections[text.split("\n", 1)[0]] = text
    out.write_text(header.rstrip() + "\n\n" + "\n\n".join(s.rstrip() for s in sections.values()) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
