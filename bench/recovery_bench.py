"""How long the liveness monitor is away after a crash, and where the time goes: kill -> first decision, in legs.

The stack as ``make run`` starts it (Kafka, Redis, two nodes and the job as processes,
:class:`tests.integration.backends.System`, every setting as ``conf/`` ships it) with a few simulated
brokers. The job is SIGKILLed and ``make run``'s own :class:`infra.stack.Supervisor` restarts it;
the new job runs under a probe (this script, ``streaming`` mode: the job's own ``main`` with timers
around its steps, written to a file) so the legs come from inside it: interpreter and imports, the
JVM, the Spark session, Kafka and Redis, the query's start, each early micro-batch (Spark's own
``durationMs``, input, watermark) and the first MONITOR_HEARTBEAT. From outside: the kill, the
restart, the heartbeat on the actions topic and the nodes handing expiry back. The same legs are
taken for a cold start (empty checkpoint, as ``make run``'s first start). Each figure is printed
with the 1-minute load; ``--out`` appends the tables to a file.

    .venv/bin/python bench/recovery_bench.py [--kills 2] [--down-s 0] [--out bench/STREAMING_RESULTS.md]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.integration.backends: the stack the suite uses

#: where the probed job writes its timings (one JSON object a line), given by the bench in the environment
PROBE_FILE_ENV = "RECOVERY_PROBE_FILE"
#: early micro-batches whose progress the probe records
PROBE_BATCHES = 6


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- the probe (inside the job)


def _process_start_ms() -> int:
    """This process's start (exec), wall clock ms, from /proc: the boot time plus its start in clock ticks."""
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    return btime * 1000 + start_ticks * 1000 // os.sysconf("SC_CLK_TCK")


class _Probe:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - one line per record, for the process's life

    def mark(self, leg: str, at: int | None = None, **extra: Any) -> None:
        record = {"leg": leg, "at": at if at is not None else wall_ms(), "pid": os.getpid(), **extra}
        self._file.write(json.dumps(record) + "\n")

    def around(self, owner: Any, name: str, leg: str, *, times: int = 1) -> None:
        """Mark ``leg:begin`` and ``leg:end`` around the first ``times`` calls of ``owner.name``."""
        inner = getattr(owner, name)
        calls = [0]

        def timed(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] > times:
                return inner(*args, **kwargs)
            self.mark(f"{leg}:begin")
            try:
                return inner(*args, **kwargs)
            finally:
                self.mark(f"{leg}:end")

        setattr(owner, name, staticmethod(timed) if isinstance(owner, type) and _is_static(owner, name) else timed)


def _is_static(owner: type, name: str) -> bool:
    return any(isinstance(k.__dict__.get(name), (staticmethod, classmethod)) for k in owner.__mro__)


def probe_main(argv: list[str]) -> int:
    """``python -m streaming`` with timers around its steps (see the module's docstring)."""
    probe = _Probe(os.environ[PROBE_FILE_ENV])
    probe.mark("process", _process_start_ms())
    probe.mark("interpreter")
    from pyspark import SparkContext
    from pyspark.sql.streaming import DataStreamWriter

    import streaming.__main__ as entry
    from streaming import job, session, sink

    probe.mark("imports")
    probe.around(SparkContext, "_ensure_initialized", "jvm")
    probe.around(session, "build_spark", "session")
    probe.around(session, "forward_jvm_signals", "signals")
    probe.around(job, "start", "job.start")
    probe.around(job.KafkaPublisher, "connect", "kafka")
    probe.around(job.RedisRouteStore, "from_url", "redis")
    probe.around(job, "build_pipeline", "plan")
    probe.around(DataStreamWriter, "start", "query.start")
    probe.around(sink.BatchSink, "set_lineage", "lineage")
    probe.around(sink.BatchSink, "__call__", "sink", times=PROBE_BATCHES)

    logger = job.progress_logger

    def progress_logger(*args: Any, **kwargs: Any) -> Any:
        listener = logger(*args, **kwargs)
        seen = listener.onQueryProgress

        seen_batches = [0]

        def on_progress(event: Any) -> None:
            p = event.progress
            seen_batches[0] += 1
            if seen_batches[0] <= PROBE_BATCHES:
                metrics = p.observedMetrics.get("events")
                probe.mark(
                    "progress",
                    batch=p.batchId,
                    started=p.timestamp,
                    duration=dict(p.durationMs),
                    rows=p.numInputRows,
                    events=int(metrics["events"]) if metrics is not None else 0,
                    watermark=p.eventTime.get("watermark"),
                    max_event=p.eventTime.get("max"),
                    sources=[{"start": s.startOffset, "end": s.endOffset, "latest": s.latestOffset} for s in p.sources],
                )
            seen(event)

        listener.onQueryProgress = on_progress
        return listener

    job.progress_logger = progress_logger
    tick = sink.BatchSink.monitor_tick

    def monitor_tick(self: Any) -> None:
        before = self.status.actions_published.get("MONITOR_HEARTBEAT", 0)
        tick(self)
        if before == 0 and self.status.actions_published.get("MONITOR_HEARTBEAT", 0):
            probe.mark("heartbeat")

    sink.BatchSink.monitor_tick = monitor_tick  # type: ignore[method-assign]
    return entry.main(argv)


# --------------------------------------------------------------------------- the stack (the bench's process)


def load_1m() -> float:
    return os.getloadavg()[0]


@dataclass
class Run:
    """One start of the job: what the probe and the outside saw, wall clock ms."""

    label: str
    #: the kill (restarts) or the stack's start of the job (cold start)
    t0: int
    load_at_start: float
    #: the job's process (the probe's records carry it)
    pid: int = 0
    restarted_at: int | None = None
    marks: dict[str, int] = field(default_factory=dict)
    progress: list[dict[str, Any]] = field(default_factory=list)
    heartbeat_on_topic: int | None = None
    lagging_opened: int = 0
    scan_off: list[int] = field(default_factory=list)
    backlog_events: int | None = None
    load_at_end: float = 0.0


def read_probe(path: Path, pid: int) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """The marks (first of each) and the batches' progress the job ``pid`` wrote."""
    marks: dict[str, int] = {}
    progress = []
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if rec["pid"] != pid:
            continue
        if rec["leg"] == "progress":
            progress.append(rec)
        else:
            marks.setdefault(rec["leg"], rec["at"])
    return marks, progress


_LOG_TS = re.compile(r"ts=(\S+)Z")


def scan_off_times(text: str, since: int) -> list[int]:
    """Wall ms of a node's "local expiry scan off" lines at or after ``since``."""
    from datetime import UTC, datetime

    out = []
    for line in text.splitlines():
        if "local expiry scan off" in line and (m := _LOG_TS.search(line)):
            at = int(datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC).timestamp() * 1000)
            if at >= since:
                out.append(at)
    return out


def events_end(bootstrap: str) -> int:
    from tests.integration.backends import EVENTS, end_offsets

    return sum(end_offsets(bootstrap, EVENTS).values())


def probed_job_class(probe_file: Path) -> type:
    from infra.stack import StreamingJob

    class ProbedJob(StreamingJob):
        """The job under the probe: this script in ``streaming`` mode (the word also tells the stack it is the job)."""

        def _command(self, binary: Path) -> list[str]:
            command = super()._command(binary)
            assert command[1:3] == ["-m", "streaming"], command
            return [command[0], str(Path(__file__).resolve()), "streaming", *command[3:]]

        def _environment(self) -> dict[str, str] | None:
            return {**os.environ, PROBE_FILE_ENV: str(probe_file)}

    return ProbedJob


class Supervising:
    """``make run``'s loop (:class:`infra.stack.Supervisor`) over the job, in a thread, noting each restart."""

    def __init__(self, job: Any) -> None:
        import io
        import threading

        from infra.stack import Supervisor

        self.out = io.StringIO()
        self.supervisor = Supervisor([job], out=self.out)
        self.job = job
        self.restarts: list[tuple[int, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pid = self.job.running_pid()
        while not self._stop.wait(self.supervisor.next_check_s()):
            self.supervisor.check(self._stop.is_set)
            now = self.job.running_pid()
            if now is not None and now != pid:
                self.restarts.append((wall_ms(), now))
            pid = now

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.1)
    return found


def first_heartbeat(system: Any, since: int) -> int | None:
    """decided_at of the first MONITOR_HEARTBEAT decided at or after ``since`` (the tap's copy of the topic)."""
    beats = [a.decided_at for a in system.tap.actions() if str(a.type) == "MONITOR_HEARTBEAT" and a.decided_at >= since]
    return min(beats) if beats else None


def observe(system: Any, run: Run, probe_file: Path, timeout: float = 300.0) -> Run:
    """Wait for the job's first MONITOR_HEARTBEAT and both nodes handing expiry back; fill ``run``."""
    since = run.restarted_at or run.t0
    run.heartbeat_on_topic = wait_for(lambda: first_heartbeat(system, since), timeout, f"{run.label}: a heartbeat")

    def handed_back() -> bool:
        run.scan_off = [min(t) for i in range(len(system.nodes)) if (t := scan_off_times(system.node_log(i), since))]
        return len(run.scan_off) == len(system.nodes)

    with contextlib.suppress(TimeoutError):
        wait_for(handed_back, 20, "the nodes handing expiry back")
    wait_for(lambda: len(read_probe(probe_file, run.pid)[1]) >= 2, 60, "two batches' progress")
    run.marks, run.progress = read_probe(probe_file, run.pid)
    run.lagging_opened = sum(
        1
        for a in system.tap.alerts()
        if str(a.kind) == "MONITOR_LAGGING" and str(a.state) == "OPEN" and a.event_time >= run.t0 - 1000
    )
    run.load_at_end = load_1m()
    return run


# --------------------------------------------------------------------------- the report


#: (label, from mark, to mark) of the job's own legs, in the order they happen
JOB_LEGS = (
    ("python: interpreter and the job's imports", "process", "imports"),
    ("JVM launch (py4j gateway up)", "jvm:begin", "jvm:end"),
    ("Spark session (SparkContext, connector check)", "jvm:end", "session:end"),
    ("JVM signal handlers (py4j callback server)", "signals:begin", "signals:end"),
    ("Kafka: publisher connected", "kafka:begin", "kafka:end"),
    ("Redis client", "redis:begin", "redis:end"),
    ("query planned (the pipeline's DataFrame)", "plan:begin", "plan:end"),
    ("query.start()", "query.start:begin", "query.start:end"),
    ("lineage: route model loaded from Redis", "lineage:begin", "lineage:end"),
    ("job.start() in all", "job.start:begin", "job.start:end"),
    ("first foreachBatch call", "job.start:end", "sink:begin"),
    ("first batch's sink (collect + publish + Redis)", "sink:begin", "sink:end"),
    ("first batch done -> first MONITOR_HEARTBEAT sent", "sink:end", "heartbeat"),
)


def fmt_s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}"


def legs_table(run: Run) -> list[str]:
    m, t0 = run.marks, run.t0
    rows = [f"### {run.label} (1-minute load {run.load_at_start:.1f} -> {run.load_at_end:.1f})", ""]
    rows += ["| leg | s | at (s after t0) |", "|---|---:|---:|"]
    if run.restarted_at is not None:
        rows.append(
            f"| kill -> `make run` restarted the job | {fmt_s(run.restarted_at - t0)} | {fmt_s(run.restarted_at - t0)} |"
        )
    for label, a, b in JOB_LEGS:
        if a in m and b in m:
            rows.append(f"| {label} | {fmt_s(m[b] - m[a])} | {fmt_s(m[b] - t0)} |")
    for p in run.progress[:PROBE_BATCHES]:
        d = p["duration"]
        parts = ", ".join(f"{k} {v}" for k, v in d.items() if k != "triggerExecution" and v >= 50)
        records = records_read(p["sources"])
        rows.append(
            f"| batch {p['batch']}: {p['events']} events ({p['rows']} rows, {records} records), "
            f"watermark {p['watermark'] or '-'}; {parts} ms | {fmt_s(d.get('triggerExecution'))} | "
            f"{fmt_s(_iso_ms(p['started']) + d.get('triggerExecution', 0) - t0)} |"
        )
    rows.append(
        f"| first MONITOR_HEARTBEAT (decided_at, on the topic) | | **{fmt_s(run.heartbeat_on_topic - t0) if run.heartbeat_on_topic else '-'}** |"
    )
    rows.append(f"| both nodes: local expiry scan off | | {', '.join(fmt_s(t - t0) for t in run.scan_off) or '-'} |")
    rows.append(f"| MONITOR_LAGGING opened | {run.lagging_opened} | |")
    return rows + [""]


def records_read(sources: list[dict[str, Any]]) -> int:
    """Kafka records a batch read: its end offsets less its start offsets (none: from the topic's start)."""

    def offsets(text: str | None) -> dict[str, int]:
        parsed = json.loads(text) if text else None
        return {f"{t}/{p}": int(o) for t, parts in (parsed or {}).items() for p, o in parts.items()}

    total = 0
    for s in sources:
        start = offsets(s["start"])
        total += sum(end - start.get(tp, 0) for tp, end in offsets(s["end"]).items())
    return total


def _iso_ms(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=2, help="SIGKILLs of a running job (default 2)")
    parser.add_argument("--brokers", type=int, default=3, help="simulated brokers (default 3)")
    parser.add_argument("--settle-s", type=float, default=20.0, help="seconds the job runs before each kill")
    parser.add_argument("--out", type=Path, help="append the tables to this file")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (logs, probe records)")
    parser.add_argument("-D", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the job (e.g. kafka.maxOffsetsPerTrigger=1000), for A/B runs")  # fmt: skip
    args = parser.parse_args()
    from streaming.config import parse_overrides
    from tests.integration import backends

    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="recovery-bench-") as tmp_name:
        tmp = args.keep or Path(tmp_name)
        probe_file = tmp / "probe.jsonl"
        backends.StreamingJob = probed_job_class(probe_file)  # type: ignore[misc] # System starts its job by this name
        system = backends.System(
            backends.ProcessInfra(tmp), tmp, timing=backends.SHIPPED, streaming_set=parse_overrides(args.overrides)
        )
        fleets = backends.FleetRunner()
        supervising = None
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            t_stack, load = wall_ms(), load_1m()
            system.start()  # Kafka, Redis, the nodes, then the job: returns after its first heartbeat
            cold = Run("cold start: `make run`'s stack started, empty checkpoint", t_stack, load)
            cold.pid = system.streaming_pid or 0
            observe(system, cold, probe_file)
            runs.append(cold)
            print("\n".join(legs_table(cold)), flush=True)
            for i in range(args.brokers):
                fleets.add(f"rb{i}", system.node_addrs, system.timing, addr_base=f"127.0.0.1:{43000 + 10 * i}")
            supervising = Supervising(system.streaming)
            for k in range(1, args.kills + 1):
                time.sleep(args.settle_s)  # the job runs steadily, the brokers heartbeat
                pid = system.streaming_pid
                assert pid is not None
                run = Run(f"restart {k}: SIGKILL, `make run`'s supervisor restarts it", wall_ms(), load_1m())
                end_before = events_end(system.kafka_bootstrap)
                os.kill(pid, signal.SIGKILL)
                run.restarted_at, run.pid = wait_for(
                    lambda t=run.t0: next((r for r in supervising.restarts if r[0] >= t), None), 120, "a restart"
                )
                observe(system, run, probe_file)
                run.backlog_events = events_end(system.kafka_bootstrap) - end_before
                runs.append(run)
                print("\n".join(legs_table(run)), flush=True)
        finally:
            signal.signal(signal.SIGTERM, previous)
            if supervising is not None:
                supervising.stop()
            fleets.stop()
            system.stop()
    if args.out:
        command = "python bench/recovery_bench.py " + " ".join(sys.argv[1:])
        with args.out.open("a") as f:
            f.write(f"\nCommand: `{command}`\n\n" + "\n".join(line for run in runs for line in legs_table(run)) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["streaming"]:
        sys.exit(probe_main(sys.argv[2:]))
    sys.exit(main())
