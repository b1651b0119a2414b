"""Every hostile-peer attack at once against one node, for minutes, while well-formed clients work.

A node runs in its own process (``namesrv start``); each attack runs in its own process on its own
connection (``tests/support/attacks.py``: zip-bomb registrations, 100,000-topic registrations,
11 MiB config updates, KV puts with control characters and lone surrogates, 1 MB unknown topic
lookups, malformed frames, 20 connections with unfinished 16 MiB frames).  Meanwhile a good client
times route lookups back to back and a KV client puts numbered keys and checks at the end that every
acknowledged one is there.  Reported: the node's RSS (sampled every second), the good client's
latency percentiles, what was refused or lost, what each attacker got, and the node's log volume.

    PYTHONPATH=. .venv/bin/python bench/soak.py [--minutes 1] [--out bench/SOAK_RESULTS.md]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from namesrv.client import NameServerClient  # noqa: E402
from tests.support import attacks  # noqa: E402
from tests.support.brokers import register_broker  # noqa: E402
from tests.support.process import node_process  # noqa: E402

MiB = attacks.MiB


class KvWriter:
    """Puts ``SOAK/k<n>`` one after another; remembers which puts were acknowledged."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.acked: list[int] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with NameServerClient(self.addr, timeout=30) as c:
            n = 0
            while not self.stop.is_set():
                try:
                    c.put_kv("SOAK", f"k{n}", str(n))
                    self.acked.append(n)
                except Exception as e:  # noqa: BLE001 - counted and reported
                    self.failures.append(repr(e))
                n += 1
                self.stop.wait(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args()
    command = "PYTHONPATH=. .venv/bin/python bench/soak.py " + shlex.join(sys.argv[1:])
    kinds = [*attacks.ATTACKS, "unfinished-frames"]

    with tempfile.TemporaryDirectory() as tmp, node_process(Path(tmp)) as node, NameServerClient(node.addr) as broker:
        register_broker(broker, broker_addr="127.0.0.1:10911", topics=[attacks.GOOD_TOPIC])
        baseline_probe = attacks.LatencyProbe(node.addr)
        baseline = baseline_probe.lookups(2000)
        rss_start = node.rss()
        procs = [attacks.AttackProcess(node.addr, kind) for kind in kinds]
        for p in procs:
            p.__enter__()
        probe, kv = attacks.LatencyProbe(node.addr).start(), KvWriter(node.addr)
        kv.thread.start()
        rss: list[int] = []
        end = time.monotonic() + args.minutes * 60
        while time.monotonic() < end:
            rss.append(node.rss())
            time.sleep(1.0)
        probe.halt()
        kv.stop.set()
        kv.thread.join(60)
        results = {p.kind: p.stop() for p in procs}
        rss_attack_end = node.rss()
        time.sleep(5)  # the attackers' connections close; what the node holds is what it kept
        rss_after = node.rss()
        with NameServerClient(node.addr) as c:
            stored = c.kv_namespace("SOAK") or {}
        lost = [n for n in kv.acked if stored.get(f"k{n}") != str(n)]
        alive = node.proc.poll() is None
        log_text = node.log_text()

    lat = probe.latencies
    lines = [
        f"# Soak: every attack at once for {args.minutes:g} min",
        "",
        f"Command: `{command}` (machine: {os.cpu_count()} cores, 1-minute load average "
        f"{os.getloadavg()[0]:.1f} at the end; figures are noisy)",
        "",
        "| | value |",
        "|---|---|",
        f"| node alive at the end | {'yes' if alive else 'NO'} |",
        f"| RSS at start / max during / at attack end / 5 s after | {rss_start / MiB:.0f} / {max(rss) / MiB:.0f} / "
        f"{rss_attack_end / MiB:.0f} / {rss_after / MiB:.0f} MiB |",
        f"| good client, unattacked (2,000 lookups) p50 / p99 / max | {attacks.percentile(baseline, .5) * 1e3:.2f} / "
        f"{attacks.percentile(baseline, .99) * 1e3:.2f} / {max(baseline) * 1e3:.1f} ms |",
        f"| good client under attack ({len(lat):,} lookups) p50 / p99 / p99.9 / max | "
        f"{attacks.percentile(lat, .5) * 1e3:.2f} / {attacks.percentile(lat, .99) * 1e3:.2f} / "
        f"{attacks.percentile(lat, .999) * 1e3:.2f} / {max(lat) * 1e3:.1f} ms |",
        f"| good client lookups refused or failed | {len(probe.failures)} |",
        f"| KV puts acknowledged / failed / acknowledged but lost | {len(kv.acked)} / {len(kv.failures)} / {len(lost)} |",
        f"| node log | {len(log_text.splitlines())} lines, {len(log_text.encode()) / 1024:.0f} KiB, "
        f"{log_text.count('Traceback')} tracebacks |",
        "",
        "| attacker | what it sent and got |",
        "|---|---|",
        *[f"| {kind} | {results[kind]} |" for kind in kinds],
        "",
    ]
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0 if alive and not probe.failures and not lost else 1


if __name__ == "__main__":
    sys.exit(main())
