"""How long the liveness monitor is away after its job dies, and where the time goes: kill -> first decision, in legs.

The stack as the suite starts it (:class:`tests.support.system.System`, every setting as
``conf/`` ships it) with a few simulated brokers, or a real RocketMQ master and slave (``--rocketmq``,
the suite's ``ROCKETMQ_5``). The job is SIGKILLed and ``make run``'s own supervisor restarts it
(:class:`tests.support.recovery.Supervising`). The job runs under a probe (this script in ``streaming``
mode: its own ``main`` with timers around its steps), so the legs come from inside it: imports, the
JVM, the Spark session, Kafka and Redis, the query's start, the early micro-batches and the first
MONITOR_HEARTBEAT; with the CPU seconds spent by then. The same for the suite's cold start and for
``make run``'s own. Each table carries the 1-minute load; ``-D key=value`` sets the job's settings for
an A/B run; ``--out`` appends the tables to a file after a summary (date, cores, load, every kill's
kill -> first decision, median and maximum).

A job builds its class-data-sharing archive in its first run, and ``make run`` restarts a job that
ran 60 s after 1 s, one that dies sooner after twice the last wait: ``--archive`` (wait for the
archive) and ``--settle-s 65`` make each kill a restart of a job that has been up a while; without
them the restarts are a first run's, or a crash loop's.

    .venv/bin/python bench/recovery_bench.py [--kills 2] [--rocketmq] [--archive] [-D KEY=VALUE] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support.system: the stack the suite uses

from common import procfs  # noqa: E402

#: where the probed job writes its timings (one JSON object a line), given by the bench in the environment
PROBE_FILE_ENV = "RECOVERY_PROBE_FILE"
#: early micro-batches whose progress the probe records
PROBE_BATCHES = 6


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------- the probe (inside the job)


def boot_ms() -> int:
    with open("/proc/stat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("btime")) * 1000


def started_ms(st: Any) -> int:
    """A process's start (exec), wall clock ms, from its ``procfs.Stat``."""
    return boot_ms() + st.start_time * 1000 // procfs.CLOCK_TICKS


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants (the JVM, the Python daemon and workers)."""
    own = procfs.stat(pid)
    return (own.cpu_seconds if own else 0.0) + sum(st.cpu_seconds for st in procfs.descendants(pid))


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


def _watch_python_workers(probe: _Probe) -> None:
    """Mark when Spark's Python worker daemon (streaming.spark_daemon) and its first forked worker start."""
    seen: set[str] = set()
    while len(seen) < 2:
        for st in procfs.descendants(os.getpid()):
            if "daemon" not in seen and "streaming.spark_daemon" in " ".join(procfs.cmdline(st.pid) or []):
                seen.add("daemon")
                probe.mark("python daemon", started_ms(st))
                workers = procfs.descendants(st.pid)
                if workers:
                    seen.add("worker")
                    probe.mark("python worker", started_ms(min(workers, key=lambda w: w.start_time)))
            elif "daemon" in seen and "worker" not in seen and st.ppid != os.getpid():
                parent = procfs.cmdline(st.ppid) or []
                if "streaming.spark_daemon" in " ".join(parent):
                    seen.add("worker")
                    probe.mark("python worker", started_ms(st))
        time.sleep(0.1)


def probe_main(argv: list[str]) -> int:
    """``python -m streaming`` with timers around its steps (see the module's docstring)."""
    probe = _Probe(os.environ[PROBE_FILE_ENV])
    me = procfs.stat(os.getpid())
    assert me is not None
    probe.mark("process", started_ms(me))
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
    threading.Thread(target=_watch_python_workers, args=(probe,), daemon=True).start()
    tick = sink.BatchSink.monitor_tick

    build_spark = session.build_spark

    def noting_jvm_options(cfg: Any) -> Any:
        spark = build_spark(cfg)
        jvm = next((st for st in procfs.descendants(os.getpid()) if "java" in (procfs.exe(st.pid) or "")), None)
        args = procfs.cmdline(jvm.pid) if jvm is not None else None
        sharing = "used" if any("SharedArchiveFile" in a for a in args or []) else "off"
        probe.mark("jvm", cds="recording classes" if any("DumpLoadedClassList" in a for a in args or []) else sharing)
        return spark

    session.build_spark = noting_jvm_options

    def monitor_tick(self: Any) -> None:
        before = self.status.actions_published.get("MONITOR_HEARTBEAT", 0)
        tick(self)
        if before == 0 and self.status.actions_published.get("MONITOR_HEARTBEAT", 0):
            probe.mark("heartbeat", cpu=round(tree_cpu_s(os.getpid()), 1))

    sink.BatchSink.monitor_tick = monitor_tick  # type: ignore[method-assign]
    return entry.main(argv)


# --------------------------------------------------------------------------- the stack (the bench's process)


def load_1m() -> float:
    return os.getloadavg()[0]


def load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


#: a broker's JVM shares the cores with Kafka, Spark, the nodes and other people's tests (as the suite allows)
BROKER_START_S = 240.0


def start_rocketmq(base: Path, namesrv_addrs: list[str], brokers: list[Any]) -> str:
    """A real RocketMQ 5.x master and slave registered with every node, appended to ``brokers`` as each
    starts (so the caller stops whatever started); what they are, for the report."""
    from tests.support.rocketmq import ROCKETMQ_5, start_broker

    for broker_id in (0, 1):  # the slave after its master, as the suite starts a group
        brokers.append(start_broker(ROCKETMQ_5, base, namesrv_addrs, broker_id=broker_id, timeout=BROKER_START_S))
    master, slave = brokers
    return (
        f"Apache RocketMQ {ROCKETMQ_5.server_version} master {master.addr} and slave {slave.addr} "
        f"(group {master.name}, the suite's JVM options), registered with both nodes"
    )


def check_brokers(brokers: list[Any]) -> None:
    """Every real broker still runs and is registered with every node it was given."""
    from tests.support.rocketmq import registered

    for b in brokers:
        b.process.check_alive()
        missing = [a for a in b.namesrv_addrs if not registered(a, b.name, b.broker_id, b.addr)]
        assert not missing, f"broker {b.name}/{b.broker_id} at {b.addr} not registered with {missing}"


def wait_for_archive(timeout: float = 420.0) -> str:
    """Wait until the job has built the driver JVM's class-data-sharing archive; what became of it."""
    from streaming.class_archive import BUILD_AFTER_S, ClassArchive

    archive = ClassArchive.find()
    if archive is None:
        return "no class-data-sharing archive (no JVM, no folder for it, or building it failed before)"
    if not archive.path.is_file():
        print(f"waiting for the job's class-data-sharing archive ({BUILD_AFTER_S:.0f} s into its run)", flush=True)
        wait_for(archive.path.is_file, timeout, f"the class-data-sharing archive {archive.path}")
    return f"the driver JVM's class-data-sharing archive {archive.path.name} built before the first kill"


def summary(runs: list[Run]) -> list[str]:
    """Every kill's kill -> first decision (the new job's first MONITOR_HEARTBEAT), their median and max."""
    took = [r.heartbeat_on_topic - r.t0 for r in runs if r.death is not None and r.heartbeat_on_topic is not None]
    if not took:
        return []
    each = ", ".join(fmt_s(t) for t in took)
    loads = ", ".join(f"{r.load_at_start:.1f}" for r in runs if r.death is not None)
    return [
        f"kill -> first decision, {len(took)} kills: {each} s; median {fmt_s(statistics.median(took))} s, "
        f"max {fmt_s(max(took))} s (1-minute load at each kill: {loads})"
    ]


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
    #: (noticed, left-overs gone), wall ms
    death: tuple[int, int] | None = None
    marks: dict[str, int] = field(default_factory=dict)
    progress: list[dict[str, Any]] = field(default_factory=list)
    heartbeat_on_topic: int | None = None
    lagging_opened: int = 0
    #: when each node turned its own expiry scan back on (the monitor silent monitorSilenceFallbackMillis)
    scan_on: list[int] = field(default_factory=list)
    load_at_end: float = 0.0
    #: the job's monitor.watermarkDelayMillis: event time is the watermark plus this
    delay_ms: int = 120_000
    heartbeat_cpu: float | None = None
    #: the driver JVM's class-data sharing (streaming.class_archive): used, recording classes, off
    class_sharing: str | None = None
    #: (what, wall ms) seen from outside besides the above
    notes: list[tuple[str, int]] = field(default_factory=list)


def read_probe(path: Path, pid: int) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """The marks (the first of each leg) and the batches' progress the job ``pid`` wrote."""
    marks: dict[str, dict[str, Any]] = {}
    progress = []
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if rec["pid"] != pid:
            continue
        if rec["leg"] == "progress":
            progress.append(rec)
        else:
            marks.setdefault(rec["leg"], rec)
    return marks, progress


_LOG_TS = re.compile(r"ts=(\S+)Z")


def scan_on_times(text: str, since: int) -> list[int]:
    """Wall ms of a node's "local expiry scan back on" lines at or after ``since``."""
    from datetime import UTC, datetime

    out = []
    for line in text.splitlines():
        if "local expiry scan back on" in line and (m := _LOG_TS.search(line)):
            at = int(datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC).timestamp() * 1000)
            if at >= since:
                out.append(at)
    return out


def probed_job_class(probe_file: Path) -> type:
    from infra.apps import StreamingJob

    class ProbedJob(StreamingJob):
        """The job under the probe: this script in ``streaming`` mode (the word also tells the stack it is the job)."""

        def _command(self, binary: Path) -> list[str]:
            command = super()._command(binary)
            assert command[1:3] == ["-m", "streaming"], command
            return [command[0], str(Path(__file__).resolve()), "streaming", *command[3:]]

        def _environment(self) -> dict[str, str] | None:
            return {**os.environ, PROBE_FILE_ENV: str(probe_file)}

    return ProbedJob


def wait_for(check: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.1)
    return found


def observe(system: Any, run: Run, probe_file: Path, timeout: float = 300.0) -> Run:
    """Wait for the job's first MONITOR_HEARTBEAT and the probe's notes; fill ``run``."""
    from tests.support.recovery import first_heartbeat

    since = run.restarted_at or run.t0
    run.heartbeat_on_topic = wait_for(
        lambda: first_heartbeat(system.tap.actions(), since), timeout, f"{run.label}: a heartbeat"
    )
    run.scan_on = [min(t) for i in range(len(system.nodes)) if (t := scan_on_times(system.node_log(i), run.t0))]
    wait_for(
        lambda: (got := read_probe(probe_file, run.pid)) and "heartbeat" in got[0] and len(got[1]) >= 2,
        60,
        "the probe's note of the heartbeat and two batches' progress",
    )
    marks, run.progress = read_probe(probe_file, run.pid)
    run.marks = {leg: rec["at"] for leg, rec in marks.items()}
    run.heartbeat_cpu = marks.get("heartbeat", {}).get("cpu")
    run.class_sharing = marks.get("jvm", {}).get("cds")
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
#: marks shown by when they happened only
JOB_EVENTS = (("Python worker daemon started", "python daemon"), ("first Python worker forked", "python worker"))


def fmt_s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}"


def legs_table(run: Run) -> list[str]:
    m, t0 = run.marks, run.t0
    sharing = f", class-data sharing {run.class_sharing}" if run.class_sharing else ""
    rows = [f"### {run.label} (1-minute load {run.load_at_start:.1f} -> {run.load_at_end:.1f}{sharing})", ""]
    rows += ["| leg | s | at (s after t0) |", "|---|---:|---:|"]
    if run.death is not None:
        noticed, cleared = run.death
        rows.append(f"| kill -> `make run` noticed the death | {fmt_s(noticed - t0)} | {fmt_s(noticed - t0)} |")
        rows.append(
            f"| -> what the dead job left (its JVM, workers) gone | {fmt_s(cleared - noticed)} | {fmt_s(cleared - t0)} |"
        )
    if run.restarted_at is not None:
        rows.append(
            f"| kill -> `make run` restarted the job | {fmt_s(run.restarted_at - t0)} | {fmt_s(run.restarted_at - t0)} |"
        )
    for label, a, b in JOB_LEGS:
        if a in m and b in m:
            rows.append(f"| {label} | {fmt_s(m[b] - m[a])} | {fmt_s(m[b] - t0)} |")
    for label, at in run.notes:
        rows.append(f"| {label} | | {fmt_s(at - t0)} |")
    for label, mark in JOB_EVENTS:
        if mark in m:
            rows.append(f"| {label} | | {fmt_s(m[mark] - t0)} |")
    for p in run.progress[:PROBE_BATCHES]:
        d = p["duration"]
        parts = ", ".join(f"{k} {v}" for k, v in d.items() if k != "triggerExecution" and v >= 50)
        done = _iso_ms(p["started"]) + d.get("triggerExecution", 0)
        wm = _iso_ms(p["watermark"]) if p["watermark"] else 0
        behind = f"event time {fmt_s(done - wm - run.delay_ms)} s behind" if wm else "no watermark yet"
        rows.append(
            f"| batch {p['batch']}: {records_read(p['sources'])} records, {behind}; {parts} ms "
            f"| {fmt_s(d.get('triggerExecution'))} | {fmt_s(done - t0)} |"
        )
    rows.append(
        f"| first MONITOR_HEARTBEAT (decided_at, on the topic) | | **{fmt_s(run.heartbeat_on_topic - t0) if run.heartbeat_on_topic else '-'}** |"
    )
    if run.scan_on:
        rows.append(f"| the nodes' own expiry scan back on | | {', '.join(fmt_s(t - t0) for t in run.scan_on)} |")
    rows.append(f"| MONITOR_LAGGING opened | {run.lagging_opened} | |")
    if run.heartbeat_cpu is not None:
        rows.append(f"| CPU seconds of the job's processes at its first heartbeat | {run.heartbeat_cpu:.1f} | |")
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


def make_run_start(tmp: Path, timeout: float = 300.0) -> Run:
    """``python -m infra.stack up`` (``make run``) on free ports in ``tmp``: its start to the job's first heartbeat."""
    import subprocess

    from infra.processes import free_port, tcp_answers
    from infra.stack import UP_STOP_TIMEOUT_S
    from tests.support.recovery import first_heartbeat
    from tests.support.system import ACTIONS, KafkaTap

    run_dir, kafka_port = tmp / "run", free_port()
    conf = tmp / "services.properties"
    conf.write_text(
        f"kafka.port={kafka_port}\nkafka.controllerPort={free_port()}\nredis.port={free_port()}\n"
        f"run.dir={run_dir}\nkafka.dataDir={run_dir / 'kafka'}\n"
    )
    argv = ["--services-conf", str(conf), "--node-ports", f"{free_port()},{free_port()}",
            "--console-port", str(free_port()), "--metrics-base", "0"]  # fmt: skip
    out = tmp / "up.out"
    run = Run("`make run` (`python -m infra.stack up`): its start, empty run dir", wall_ms(), load_1m())
    with out.open("wb") as f:
        up = subprocess.Popen([sys.executable, "-m", "infra.stack", "up", *argv], stdout=f, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    tap = None

    def kafka_answers() -> bool:
        if up.poll() is not None:
            raise RuntimeError(f"make run exited {up.returncode}: {out.read_text(errors='replace')[-2000:]}")
        return tcp_answers("127.0.0.1", kafka_port, 1.0)

    try:
        wait_for(kafka_answers, timeout, "make run's Kafka")
        tap = KafkaTap(f"127.0.0.1:{kafka_port}", (ACTIONS,))
        banner_at: list[int] = []

        def banner() -> bool:
            if not banner_at and "The name-server system is up" in out.read_text(errors="replace"):
                banner_at.append(wall_ms())
            return bool(banner_at)

        def beat() -> int | None:
            banner()  # its time is noted when first seen
            return first_heartbeat(tap.actions(), run.t0)

        run.heartbeat_on_topic = wait_for(beat, timeout, "make run's first heartbeat")
        wait_for(banner, 60, "make run's banner")
        run.notes.append(("banner printed (every service started)", banner_at[0]))
        run.load_at_end = load_1m()
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; make run said:\n{out.read_text(errors='replace')[-2000:]}") from None
    finally:
        if tap is not None:
            tap.close()
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(UP_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            up.kill()
            subprocess.run([sys.executable, "-m", "infra.stack", "down", *argv], check=False, timeout=UP_STOP_TIMEOUT_S)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=2, help="SIGKILLs of a running job (default 2)")
    parser.add_argument("--brokers", type=int, default=3, help="simulated brokers (default 3)")
    parser.add_argument("--settle-s", type=float, default=20.0, help="seconds the job runs before each kill")
    parser.add_argument("--out", type=Path, help="append the tables to this file")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (logs, probe records)")
    parser.add_argument("--skip-make-run", action="store_true", help="leave out the start of `make run` itself")
    parser.add_argument("--archive", action="store_true",
                        help="before the first kill, wait for the job's class-data-sharing archive")  # fmt: skip
    parser.add_argument("--rocketmq", action="store_true",
                        help="register a real Apache RocketMQ 5.x master and slave (the suite's) for the kills")  # fmt: skip
    parser.add_argument("-D", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting of the job (e.g. kafka.maxOffsetsPerTrigger=1000), for A/B runs")  # fmt: skip
    args = parser.parse_args()
    from streaming.config import load_config, parse_overrides
    from tests.support import system as suite
    from tests.support.backends import ProcessInfra
    from tests.support.fleet import FleetRunner
    from tests.support.recovery import Supervising

    overrides = parse_overrides(args.overrides)
    delay_ms = load_config(REPO / "conf" / "streaming.properties", overrides).watermark_delay_millis
    runs: list[Run] = []
    started_at, load_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load_avg()
    brokers: list[Any] = []  # the real ones (--rocketmq)
    real_brokers = archive = ""
    print(f"{os.cpu_count()} cores; load average (1/5/15 min) at the start: {load_start}", flush=True)
    with tempfile.TemporaryDirectory(prefix="recovery-bench-") as tmp_name:
        tmp = args.keep or Path(tmp_name)
        if not args.skip_make_run:
            (tmp / "make-run").mkdir(parents=True, exist_ok=True)
            runs.append(make_run_start(tmp / "make-run"))
            print("\n".join(legs_table(runs[-1])), flush=True)
        probe_file = tmp / "probe.jsonl"
        suite.StreamingJob = probed_job_class(probe_file)  # type: ignore[misc,assignment] # System's job
        system = suite.System(ProcessInfra(tmp), tmp, timing=suite.SHIPPED, streaming_set=overrides)
        fleets = FleetRunner()
        supervising = None
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            t_stack, load = wall_ms(), load_1m()
            system.start()  # Kafka, Redis, the nodes, then the job: returns after its first heartbeat
            cold = Run("the suite's start (`System`: Kafka, Redis, two nodes, then the job), empty checkpoint",
                       t_stack, load, pid=system.streaming_pid or 0, delay_ms=delay_ms)  # fmt: skip
            observe(system, cold, probe_file)
            runs.append(cold)
            print("\n".join(legs_table(cold)), flush=True)
            for i in range(args.brokers):
                fleets.add(f"rb{i}", system.node_addrs, system.timing, addr_base=f"127.0.0.1:{43000 + 10 * i}")
            if args.rocketmq:
                real_brokers = start_rocketmq(tmp / "rocketmq", system.node_addrs, brokers)
                print(real_brokers, flush=True)
            assert system.streaming is not None
            supervising = Supervising(system.streaming)
            if args.archive:
                archive = wait_for_archive()
                print(archive, flush=True)
            for k in range(1, args.kills + 1):
                time.sleep(args.settle_s)  # the job runs steadily, the brokers heartbeat
                check_brokers(brokers)
                pid = system.streaming_pid
                assert pid is not None
                run = Run(f"restart {k}: SIGKILL, `make run`'s supervisor restarts it", wall_ms(), load_1m(),
                          delay_ms=delay_ms)  # fmt: skip
                os.kill(pid, signal.SIGKILL)
                run.death = supervising.death_after(run.t0, 120)
                run.restarted_at, run.pid = supervising.restart_after(run.t0, 120)
                observe(system, run, probe_file)
                runs.append(run)
                print("\n".join(legs_table(run)), flush=True)
            check_brokers(brokers)  # registered throughout
            load_end = load_avg()
        finally:
            signal.signal(signal.SIGTERM, previous)
            if supervising is not None:
                supervising.stop()
            for broker in reversed(brokers):
                broker.stop()
            fleets.stop()
            system.stop()
    head = (
        f"{started_at}, {os.cpu_count()} cores; load average (1/5/15 min) at the start -> end: "
        f"{load_start} -> {load_end}; brokers: {args.brokers} simulated"
        + "".join(f"; {note}" for note in (real_brokers, archive) if note)
    )
    lines = [head, "", *summary(runs)]
    print("\n".join(lines), flush=True)
    if args.out:
        command = ".venv/bin/python bench/recovery_bench.py " + " ".join(sys.argv[1:])
        tables = "\n".join(line for run in runs for line in legs_table(run))
        with args.out.open("a") as f:
            f.write(f"\nCommand: `{command}` ({head})\n\n" + "\n".join(lines[2:]) + "\n\n" + tables + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["streaming"]:
        sys.exit(probe_main(sys.argv[2:]))
    sys.exit(main())
