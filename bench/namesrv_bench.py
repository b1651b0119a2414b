"""Our node against Apache RocketMQ's NameServers 4.9.7 and 5.5.0, in the same run, with the same load.

Each workload runs with ``tools/rmq-loadgen`` against three servers started fresh for it, in an order
that rotates from run to run: our node and Apache's NameServers from the jars of the pinned JVM
manifest (``infra/jvm/pom.xml``).  Each gets the same unmeasured warm-up and is measured for
``--duration`` seconds; the figure compared is requests answered per server CPU-second (from
``/proc``, every thread included), then resident memory with 100 brokers x 1,000 topics held.  The
Java servers run with a full JIT and a fixed 256 MiB serial-collector heap, and ``rmq-echo`` gives
the machine's own ceiling.  Ratios are ours over Java's; ``docs/internals/benchmarks.md`` says why
each choice was made.

    .venv/bin/python bench/namesrv_bench.py [--runs 3] [--warmup 5] [--duration 8] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support: the load generator's and Apache RocketMQ's launchers

from tests.support.loadgen import ECHO, LOADGEN, LoadgenError, hold_brokers, run  # noqa: E402
from tests.support.rocketmq import ROCKETMQ_4, ROCKETMQ_5, Release, start_java_namesrv  # noqa: E402

OURS = "ours"
#: what we aim for over Java's, per CPU-second (route, heartbeat, register) and in RSS
GOALS = {"route": 3.0, "heartbeat": 4.0, "register": 1.5}
RSS_GOAL = 0.5
RELEASES = {"4": ROCKETMQ_4, "5": ROCKETMQ_5}


@dataclass
class Workload:
    name: str
    args: list[str]
    connections: int
    depth: int
    needs_setup: bool = True

    @property
    def kind(self) -> str:
        return self.name.split()[0]


def workloads(register_brokers: int, register_topics: int) -> list[Workload]:
    register = ["register", "--brokers", str(register_brokers), "--topics-per-broker", str(register_topics)]
    return [
        Workload("route 16x1", ["route", "--topics", "1000"], 16, 1),
        Workload("route 16x16", ["route", "--topics", "1000"], 16, 16),
        Workload("route 64x4", ["route", "--topics", "1000"], 64, 4),
        Workload("heartbeat 16x16", ["heartbeat", "--brokers", "10"], 16, 16),
        Workload("register 4x1", register, 4, 1, needs_setup=False),
        # one connection: the latency of a single registration, without queueing behind others
        Workload("register 1x1", register, 1, 1, needs_setup=False),
    ]


def java_options(heap: str) -> list[str]:
    return [
        f"-Xms{heap}",
        f"-Xmx{heap}",
        "-XX:+UseSerialGC",
        "-XX:-UseLargePages",
        "-XX:-OmitStackTraceInFastThrow",
        "-Djava.net.preferIPv4Stack=true",
    ]


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port} after {timeout}s; see the server log")


class Process:
    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Running:
    pid: int
    addr: str
    stop: Callable[[], None]


@dataclass
class Server:
    """One kind of name server the bench starts fresh for every measurement."""

    label: str
    start: Callable[[Path], Running]


def ours(metrics: bool) -> Server:
    def start(workdir: Path) -> Running:
        port = free_port()
        # with --metrics the node counts every request for its Prometheus endpoint (nothing scrapes it)
        extra = ["--set", f"metricsPort={free_port()}"] if metrics else []
        workdir.mkdir(parents=True, exist_ok=True)
        node = Process(
            [
                str(REPO / ".venv" / "bin" / "namesrv"), "start",
                "--set", f"listenPort={port}",
                "--set", "bindAddress=127.0.0.1",
                "--set", f"kvConfigPath={workdir / 'kvConfig.json'}",
                "--set", f"configStorePath={workdir / 'namesrv.properties'}",
                *extra,
            ],
            workdir / "namesrv.log",
        )  # fmt: skip
        wait_for_port(port)
        return Running(node.pid, f"127.0.0.1:{port}", node.stop)

    return Server(OURS, start)


def java(release: Release, heap: str) -> Server:
    def start(workdir: Path) -> Running:
        workdir.mkdir(parents=True, exist_ok=True)
        namesrv = start_java_namesrv(release, workdir, "namesrv", jvm_options=java_options(heap))
        return Running(namesrv.process.pid, namesrv.addr, namesrv.stop)

    return Server(f"Java {release.server_version}", start)


@contextlib.contextmanager
def started(server: Server, workdir: Path) -> Iterator[Running]:
    running = server.start(workdir)
    try:
        yield running
    finally:
        running.stop()


@contextlib.contextmanager
def held(addr: str, brokers: int, topics_per_broker: int) -> Iterator[dict]:
    """Brokers registered by ``rmq-loadgen setup`` and heartbeating until the block ends."""
    setup, summary = hold_brokers(addr, brokers, topics_per_broker)
    try:
        yield summary
    finally:
        setup.kill()
        setup.wait()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


# --------------------------------------------------------------------------- measuring


def loadgen(w: Workload, addr: str, server_pid: int, warmup: float, duration: float) -> dict:
    args = [
        *w.args,
        "--addr", addr,
        "-c", str(w.connections),
        "-d", str(w.depth),
        "--warmup", str(warmup),
        "--duration", str(duration),
        "--server-pid", str(server_pid),
    ]  # fmt: skip
    return run(args, timeout=warmup + duration + 120)


class JitWatch:
    """Methods a JVM has compiled so far, sampled every 0.1 s by one ``jstat -compiler`` for the whole
    measurement (one jstat run per reading would start a JVM beside the measured one each time)."""

    INTERVAL_MS = 100

    def __init__(self, pid: int) -> None:
        self._samples: list[tuple[float, int]] = []
        self._cond = threading.Condition()
        self._proc = subprocess.Popen(
            ["jstat", "-compiler", str(pid), str(self.INTERVAL_MS)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        column = None
        for line in self._proc.stdout:
            fields = line.split()
            if column is None:
                column = fields.index("Compiled") if "Compiled" in fields else None
                continue
            with self._cond:
                self._samples.append((time.monotonic(), int(fields[column])))
                self._cond.notify_all()

    def compiled(self, timeout: float = 30.0) -> int | None:
        """The count sampled after this call began; None if jstat gives none (not a JVM, or no attach)."""
        asked = time.monotonic()
        with self._cond:
            self._cond.wait_for(lambda: bool(self._samples) and self._samples[-1][0] >= asked or self._gone(), timeout)
            return self._samples[-1][1] if self._samples and self._samples[-1][0] >= asked else None

    def _gone(self) -> bool:
        return self._proc.poll() is not None

    def stop(self) -> None:
        self._proc.kill()
        self._proc.wait()


def warm_until_jit_idle(w: Workload, srv: Running, jit: JitWatch, args: argparse.Namespace) -> tuple[float, int]:
    """Load a JVM in chunks until a chunk compiles at most ``--jit-idle-methods`` methods, for at most
    ``--jit-max`` s: its JIT is then idle, and the measured window does not pay for compiling.
    Returns the seconds it took and the methods compiled in the last chunk."""
    started_at, compiled, last = time.monotonic(), jit.compiled(), 0
    while compiled is not None and time.monotonic() - started_at < args.jit_max:
        loadgen(w, srv.addr, srv.pid, 0.0, args.jit_chunk)
        if (now := jit.compiled()) is None:
            break
        last, compiled = now - compiled, now
        if last <= args.jit_idle_methods:
            break
    return time.monotonic() - started_at, last


def measured(w: Workload, srv: Running, java: bool, args: argparse.Namespace) -> dict:
    """A JVM's JIT warmed until idle, then for every server the same warm-up and the measured window; a
    JVM's result says how long its JIT warm-up took and how many methods it compiled while measured."""
    if not java or args.jit_max <= 0:
        result = loadgen(w, srv.addr, srv.pid, args.warmup, args.duration)
        result["jit"] = None
        return result
    jit = JitWatch(srv.pid)
    try:
        warmup_s, last_chunk = warm_until_jit_idle(w, srv, jit, args)
        before = jit.compiled()
        result = loadgen(w, srv.addr, srv.pid, args.warmup, args.duration)
        after = jit.compiled()
    finally:
        jit.stop()
    result["jit"] = {
        "warmup_s": warmup_s,
        "last_chunk_compiled": last_chunk,
        "compiled_while_measured": None if before is None or after is None else after - before,
    }
    return result


def measure(w: Workload, server: Server, workdir: Path, args: argparse.Namespace) -> dict:
    """One run of ``w`` against a fresh ``server``: 10 brokers x 100 topics held first when the workload reads them."""
    with started(server, workdir) as srv:
        java = server.label != OURS
        if not w.needs_setup:
            return measured(w, srv, java, args)
        with held(srv.addr, 10, 100):
            return measured(w, srv, java, args)


@dataclass
class Row:
    """The medians of one workload against one server."""

    workload: str
    server: str
    rps: float
    p50_us: float
    p99_us: float
    per_cpu_s: float
    #: the part of the server's CPU time spent in the kernel (system calls: reads, writes, epoll)
    sys_share: float
    other_cores: float
    errors: int
    runs: list[float] = field(default_factory=list)
    #: a JVM's: the median seconds of loading until its JIT was idle, and the most methods it compiled in a
    #: measured window (None for our node)
    jit_warmup_s: float | None = None
    jit_compiled_measured: int | None = None


def jitted(runs: list[dict]) -> list[dict]:
    """The runs against a JVM whose compilations were counted over the measured window."""
    return [r for r in runs if r["jit"] and r["jit"]["compiled_while_measured"] is not None]


def summarise(name: str, server: str, runs: list[dict]) -> Row:
    def med(pick: Callable[[dict], float]) -> float:
        return statistics.median(pick(r) for r in runs)

    return Row(
        workload=name,
        server=server,
        rps=med(lambda r: r["throughput_rps"]),
        p50_us=med(lambda r: r["latency_us"]["p50"]),
        p99_us=med(lambda r: r["latency_us"]["p99"]),
        per_cpu_s=med(lambda r: r["server"]["responses_per_cpu_s"]),
        sys_share=med(lambda r: r["server"]["sys_s"] / r["server"]["cpu_s"] if r["server"]["cpu_s"] else 0.0),
        other_cores=med(lambda r: r["machine"]["other_procs_cores"]),
        errors=sum(r["errors"] for r in runs),
        runs=[r["server"]["responses_per_cpu_s"] for r in runs],
        jit_warmup_s=statistics.median(j) if (j := [r["jit"]["warmup_s"] for r in runs if r["jit"]]) else None,
        jit_compiled_measured=max(c) if (c := [r["jit"]["compiled_while_measured"] for r in jitted(runs)]) else None,
    )


def memory(server: Server, workdir: Path, brokers: int, topics: int) -> tuple[int, int]:
    """RSS (KiB) of a fresh server idle, and once ``brokers`` x ``topics`` are registered and held."""
    with started(server, workdir) as srv:
        idle = rss_kb(srv.pid)
        with held(srv.addr, brokers, topics):
            return idle, rss_kb(srv.pid)


def rotated(servers: list[Server], i: int) -> list[Server]:
    k = i % len(servers)
    return servers[k:] + servers[:k]


def log(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per workload and server; the median is reported")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of unmeasured load, for every server")
    parser.add_argument("--jit-chunk", type=float, default=5.0, help="a Java server is loaded in chunks this long ...")
    parser.add_argument("--jit-idle-methods", type=int, default=2, help="... until one compiles at most this many")
    parser.add_argument(
        "--jit-max", type=float, default=120.0, help="... or this many seconds passed (0: no JIT warm-up)"
    )
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--only", help="run only workloads whose name contains this text")
    parser.add_argument("--java", default="4,5", help="Java NameServers to compare with: 4 (4.9.7), 5 (5.5.0), none")
    parser.add_argument("--java-heap", default="256m", help="the Java NameServer's -Xms and -Xmx")
    parser.add_argument("--register-brokers", type=int, default=100)
    parser.add_argument("--register-topics", type=int, default=1000, help="topics per registration")
    parser.add_argument("--rss-brokers", type=int, default=100, help="0: no memory measurement")
    parser.add_argument("--rss-topics", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS.md")
    parser.add_argument("--metrics", action="store_true", help="run our node with its metrics endpoint on")
    args = parser.parse_args()
    if not LOADGEN.exists():
        raise SystemExit(f"{LOADGEN} is missing: run `bash tests/peers/install.sh` (or `make setup`) first")
    releases = [] if args.java == "none" else [RELEASES[k] for k in args.java.split(",")]
    servers = [ours(args.metrics), *(java(r, args.java_heap) for r in releases)]
    command = "python bench/namesrv_bench.py " + shlex.join(sys.argv[1:])
    chosen = [w for w in workloads(args.register_brokers, args.register_topics) if not args.only or args.only in w.name]
    load_before = os.getloadavg()
    rows: list[Row] = []
    echo_rps: dict[str, float] = {}
    rss: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="namesrv-bench-") as tmp:
        echo_port = free_port()
        echo = Process([str(ECHO), "--listen", f"127.0.0.1:{echo_port}"], Path(tmp) / "echo.log")
        wait_for_port(echo_port)
        try:
            for w in chosen:
                log(f"{w.name}: {args.runs} run(s) of {args.warmup}+{args.duration} s on {[s.label for s in servers]}")
                results: dict[str, list[dict]] = {s.label: [] for s in servers}
                ceiling = []
                for i in range(args.runs):
                    for server in rotated(servers, i):
                        workdir = Path(tmp) / f"{w.name.replace(' ', '-')}-{i}-{server.label.replace(' ', '-')}"
                        results[server.label].append(measure(w, server, workdir, args))
                    if w.needs_setup:  # echo answers registrations with a tiny frame: no ceiling for those
                        ceiling.append(loadgen(w, f"127.0.0.1:{echo_port}", echo.pid, args.warmup, args.duration))
                for server in servers:
                    rows.append(summarise(w.name, server.label, results[server.label]))
                    log(f"  {server.label}: {rows[-1].per_cpu_s:,.0f} req per CPU-s, {rows[-1].rps:,.0f} req/s")
                if ceiling:
                    echo_rps[w.name] = statistics.median(r["throughput_rps"] for r in ceiling)
            if args.rss_brokers > 0:
                for server in servers:
                    workdir = Path(tmp) / f"rss-{server.label.replace(' ', '-')}"
                    rss[server.label] = memory(server, workdir, args.rss_brokers, args.rss_topics)
                    log(f"RSS {server.label}: {rss[server.label][1] / 1024:.1f} MiB")
        finally:
            echo.stop()
    report = Report(command, args, [s.label for s in servers], rows, echo_rps, rss, load_before, os.getloadavg())
    report.write(args.out)
    print(args.out.read_text())
    return 0


# --------------------------------------------------------------------------- the report

#: text after this heading in an existing report is kept as it is: measurements of other kinds
EARLIER = "## Earlier measurements"


def ratio(ours_value: float, java_value: float) -> str:
    return f"{ours_value / java_value:.2f}x" if java_value else "–"


def spread(mine: Row, theirs: Row) -> str:
    """The median ratio and, over several runs, the lowest and highest of the ratios of run i to run i."""
    pairs = [m / t for m, t in zip(mine.runs, theirs.runs, strict=False) if t]
    if len(pairs) < 2:
        return ratio(mine.per_cpu_s, theirs.per_cpu_s)
    return f"{ratio(mine.per_cpu_s, theirs.per_cpu_s)} ({min(pairs):.2f}-{max(pairs):.2f})"


def jit(r: Row) -> str:
    if r.jit_warmup_s is None:
        return "–"
    return f"{r.jit_warmup_s:.0f} s, {r.jit_compiled_measured if r.jit_compiled_measured is not None else '?'}"


@dataclass
class Report:
    command: str
    args: argparse.Namespace
    servers: list[str]
    rows: list[Row]
    echo_rps: dict[str, float]
    rss: dict[str, tuple[int, int]]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    @property
    def javas(self) -> list[str]:
        return [s for s in self.servers if s != OURS]

    def row(self, workload: str, server: str) -> Row:
        return next(r for r in self.rows if r.workload == workload and r.server == server)

    def lines(self) -> list[str]:
        a = self.args
        load = ", ".join(f"{x:.2f}" for x in self.load_before)
        out = [
            "# Name-server benchmark: our node against Apache RocketMQ's NameServers, same run",
            "",
            f"Command: `{self.command}` ({a.runs} run(s) per workload and server, {a.warmup} s warm-up + "
            f"{a.duration} s measured, median reported; {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, "
            f"shared machine, load average {load} at the start and "
            f"{', '.join(f'{x:.2f}' for x in self.load_after)} at the end).",
            "",
            "Each server is started fresh for each measurement and gets the same load from `rmq-loadgen`: route and",
            "heartbeat against 10 brokers x 100 topics held by `rmq-loadgen setup`; register with a new DataVersion",
            f"in every request ({a.register_brokers} brokers x {a.register_topics} topics). Per CPU-s = requests answered",
            "per CPU-second of the server's process (utime + stime from /proc over the measured window). Java:",
            f"`java {' '.join(java_options(a.java_heap))}`",
            "(tiered JIT, C2 included), the jars of `infra/jvm/pom.xml`. Before its measured window each Java server",
            f"is loaded with the workload in {a.jit_chunk:g} s chunks until one compiles at most {a.jit_idle_methods} methods",
            f"(`jstat -compiler`; at most {a.jit_max:g} s), so that its JIT is idle while measured. Ratios are ours / Java's:",
            "the median, and in brackets the lowest and highest of the per-run ratios (run i against run i).",
            "",
        ]
        if self.javas:
            head = " | ".join(f"{j} per CPU-s" for j in self.javas)
            vs = " | ".join(f"vs {j}" for j in self.javas)
            out += [
                f"| workload (CxD) | ours per CPU-s | {head} | {vs} | goal |",
                "|---|---:|" + "---:|" * (2 * len(self.javas)) + "---:|",
            ]
            for name in dict.fromkeys(r.workload for r in self.rows):
                mine = self.row(name, OURS)
                theirs = [self.row(name, j) for j in self.javas]
                goal = GOALS.get(name.split()[0])
                out.append(
                    f"| {name} | {mine.per_cpu_s:,.0f} | "
                    + " | ".join(f"{t.per_cpu_s:,.0f}" for t in theirs)
                    + " | "
                    + " | ".join(spread(mine, t) for t in theirs)
                    + f" | {'≥ %.1fx' % goal if goal else '–'} |"
                )
            out.append("")
        if self.rss:
            brokers, topics = a.rss_brokers, a.rss_topics
            out += [
                f"RSS with {brokers} brokers x {topics} topics registered and held (`VmRSS`, each server fresh):",
                "",
                "| server | RSS idle MiB | RSS loaded MiB | ours / this |",
                "|---|---:|---:|---:|",
            ]
            ours_loaded = self.rss[OURS][1]
            for server, (idle, loaded) in self.rss.items():
                vs = "–" if server == OURS else f"{ours_loaded / loaded:.2f}x (goal ≤ {RSS_GOAL}x)"
                out.append(f"| {server} | {idle / 1024:,.1f} | {loaded / 1024:,.1f} | {vs} |")
            out.append("")
        out += [
            "Every server, every workload (medians; `sys` = the share of the server's CPU time spent in the kernel;",
            "`other cores` = CPU used meanwhile by every other process on the machine, from the load generator;",
            "`of echo` = throughput over `rmq-echo`'s in the same run;",
            "`JIT` = a Java server's median warm-up until its JIT was idle, and the most methods it compiled in a",
            "measured window):",
            "",
            "| workload (CxD) | server | req/s | p50 µs | p99 µs | per CPU-s (runs) | sys | other cores | of echo | JIT | errors |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in self.rows:
            echo = self.echo_rps.get(r.workload)
            runs = ", ".join(f"{x:,.0f}" for x in r.runs)
            out.append(
                f"| {r.workload} | {r.server} | {r.rps:,.0f} | {r.p50_us:,.0f} | {r.p99_us:,.0f} | "
                f"{r.per_cpu_s:,.0f} ({runs}) | {r.sys_share:.0%} | {r.other_cores:.2f} | "
                f"{f'{r.rps / echo:.2f}' if echo else '–'} | {jit(r)} | "
                f"{r.errors} |"
            )
        return out

    def write(self, path: Path) -> None:
        kept = ""
        if path.exists():
            old = path.read_text()
            if EARLIER in old:
                kept = "\n" + old[old.index(EARLIER) :]
        path.write_text("\n".join(self.lines()) + "\n" + kept)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LoadgenError as e:  # the tool's own message is the useful part, not this script's traceback
        sys.exit(f"bench/namesrv_bench.py: {e}")
