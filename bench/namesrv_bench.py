"""Drive a running name-server node with rmq-loadgen and write the figures, with the command, to a file.

Every workload runs against our node and, in the same script, against ``rmq-echo`` (a server that
answers every frame with a fixed response: the ceiling of this machine plus the client).  Figures are
reported as ratios: our node's requests per server CPU-second against the Java NameServer 4.9.8
figures that ``rmq-loadgen``'s README measured on this kind of machine, and our throughput against
the echo ceiling of this very run.  Absolute numbers on a shared 2-core machine are noise; compare
ratios.

    .venv/bin/python bench/namesrv_bench.py [--runs 3] [--duration 10] [--out bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support.loadgen: where the in-repo load generator is built, how it is run

from tests.support.loadgen import ECHO, LOADGEN, LoadgenError, hold_brokers, run  # noqa: E402

#: Apache RocketMQ 4.9.8 on this kind of machine (tools/rmq-loadgen/README.md): requests per server CPU-second
JAVA_PER_CPU_S = {
    "route 16x1": 26_800,
    "route 16x16": 69_500,
    "route 64x4": 47_800,
    "heartbeat 16x16": 82_900,
    "register 4x1": 1_300,
}


@dataclass
class Workload:
    name: str
    args: list[str]
    connections: int
    depth: int
    needs_setup: bool = True


WORKLOADS = [
    Workload("route 16x1", ["route", "--topics", "1000"], 16, 1),
    Workload("route 16x16", ["route", "--topics", "1000"], 16, 16),
    Workload("route 64x4", ["route", "--topics", "1000"], 64, 4),
    Workload("heartbeat 16x16", ["heartbeat", "--brokers", "10"], 16, 16),
    Workload("register 4x1", ["register", "--brokers", "100", "--topics-per-broker", "1000"], 4, 1, needs_setup=False),
    # one connection: the latency of a single 1,000-topic registration, without queueing behind others
    Workload("register 1x1", ["register", "--brokers", "100", "--topics-per-broker", "1000"], 1, 1, needs_setup=False),
]


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
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log.open("wb"), cwd=REPO)

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


def start_node(workdir: Path, metrics: bool = False) -> tuple[Process, int]:
    port = free_port()
    # with --metrics the node counts every request for its Prometheus endpoint (nothing scrapes it)
    extra = ["--set", f"metricsPort={free_port()}"] if metrics else []
    workdir.mkdir(parents=True, exist_ok=True)
    node = Process(
        [
            str(REPO / ".venv" / "bin" / "namesrv"),
            "start",
            "--set",
            f"listenPort={port}",
            "--set",
            "bindAddress=127.0.0.1",
            "--set",
            f"kvConfigPath={workdir / 'kvConfig.json'}",
            "--set",
            f"configStorePath={workdir / 'namesrv.properties'}",
            *extra,
        ],
        workdir / "namesrv.log",
    )
    wait_for_port(port)
    return node, port


def loadgen(w: Workload, port: int, server_pid: int, warmup: float, duration: float) -> dict:
    args = [
        *w.args,
        "--addr",
        f"127.0.0.1:{port}",
        "-c",
        str(w.connections),
        "-d",
        str(w.depth),
        "--warmup",
        str(warmup),
        "--duration",
        str(duration),
        "--server-pid",
        str(server_pid),
    ]
    return run(args, timeout=warmup + duration + 120)


def summarise(name: str, runs: list[dict], echo: list[dict]) -> dict:
    def med(key: str, src: list[dict] = runs) -> float:
        return statistics.median(r[key] for r in src)

    per_cpu = statistics.median(r["server"]["responses_per_cpu_s"] for r in runs)
    java = JAVA_PER_CPU_S.get(name)
    return {
        "workload": name,
        "rps": med("throughput_rps"),
        "p50_us": statistics.median(r["latency_us"]["p50"] for r in runs),
        "p99_us": statistics.median(r["latency_us"]["p99"] for r in runs),
        "per_cpu_s": per_cpu,
        "vs_java_per_cpu": per_cpu / java if java else None,
        "echo_rps": med("throughput_rps", echo) if echo else None,
        "errors": sum(r["errors"] for r in runs),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per workload; the median is reported")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--only", help="run only workloads whose name contains this text")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS.md")
    parser.add_argument("--metrics", action="store_true", help="run the node with its metrics endpoint on")
    args = parser.parse_args()
    if not LOADGEN.exists():
        raise SystemExit(f"{LOADGEN} is missing: run `bash tests/peers/install.sh` (or `make setup`) first")
    command = "python bench/namesrv_bench.py " + shlex.join(sys.argv[1:])
    workloads = [w for w in WORKLOADS if not args.only or args.only in w.name]
    results = []
    with tempfile.TemporaryDirectory(prefix="namesrv-bench-") as tmp:
        echo_port = free_port()
        echo = Process([str(ECHO), "--listen", f"127.0.0.1:{echo_port}"], Path(tmp) / "echo.log")
        wait_for_port(echo_port)
        try:
            for w in workloads:
                print(f"[bench] {w.name}: {args.runs} run(s) of {args.warmup}+{args.duration}s", file=sys.stderr)
                ours, ceiling = [], []
                for i in range(args.runs):
                    node, port = start_node(Path(tmp) / f"{w.name.replace(' ', '-')}-{i}", args.metrics)
                    setup = None
                    try:
                        if w.needs_setup:  # 10 brokers x 100 topics registered and heartbeating for the whole run
                            setup = hold_brokers(f"127.0.0.1:{port}", 10, 100)[0]
                        ours.append(loadgen(w, port, node.pid, args.warmup, args.duration))
                    finally:
                        if setup is not None:
                            setup.kill()
                            setup.wait()
                        node.stop()
                    if w.needs_setup:  # echo answers registrations with a tiny frame: no ceiling for those
                        ceiling.append(loadgen(w, echo_port, echo.pid, args.warmup, args.duration))
                results.append(summarise(w.name, ours, ceiling))
                r = results[-1]
                print(
                    f"[bench]   {r['rps']:.0f} req/s, p99 {r['p99_us']:.0f} us, {r['per_cpu_s']:.0f} req/CPU-s",
                    file=sys.stderr,
                )
        finally:
            echo.stop()
    write_report(args.out, command, args, results)
    print(args.out.read_text())
    return 0


def write_report(path: Path, command: str, args: argparse.Namespace, results: list[dict]) -> None:
    lines = [
        "# Name-server benchmark",
        "",
        f"Command: `{command}` ({args.runs} run(s) per workload, {args.warmup} s warm-up + {args.duration} s measured, "
        f"median reported; {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, shared machine).",
        "",
        "Route and heartbeat run against 10 brokers x 100 topics held by `rmq-loadgen setup`; register runs on a",
        "fresh node (100 brokers x 1000 topics, every request a changed DataVersion). `vs Java` divides our",
        "requests per server CPU-second by the Apache RocketMQ 4.9.8 figure from `rmq-loadgen`'s README;",
        "`of echo` divides our throughput by `rmq-echo`'s in the same run (the machine + client ceiling).",
        "",
        "| workload (CxD) | req/s | p50 µs | p99 µs | req per server CPU-s | vs Java per CPU-s | of echo | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        of_echo = f"{r['rps'] / r['echo_rps']:.2f}" if r["echo_rps"] else "–"
        vs_java = f"{r['vs_java_per_cpu']:.2f}x" if r["vs_java_per_cpu"] else "–"
        lines.append(
            f"| {r['workload']} | {r['rps']:,.0f} | {r['p50_us']:,.0f} | {r['p99_us']:,.0f} | "
            f"{r['per_cpu_s']:,.0f} | {vs_java} | {of_echo} | {r['errors']} |"
        )
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LoadgenError as e:  # the tool's own message is the useful part, not this script's traceback
        sys.exit(f"bench/namesrv_bench.py: {e}")
