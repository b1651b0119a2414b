"""``make chaos``: the replicated topology under a seeded schedule of faults, one at a time.

Starts the topology of ``infra/topology.py`` on free loopback ports (three Kafka nodes, a Redis Cluster
of three masters and three replicas, a Spark master and two workers with the job's driver supervised,
three name-server nodes, and with ``--rocketmq`` Apache RocketMQ 5.5.0's controller with two broker
groups of a master and a slave in controller mode, a producer and a consumer), Alertmanager, and
simulated brokers; runs every fault of ``tests/support/chaos/schedule.py`` in the seed's order
(``--faults`` for some of them), printing a line per fault; checks the invariants of
``tests/support/chaos/harness.py``; writes ``--out`` (``bench/CHAOS_RESULTS.md``); exits 1 when any
invariant broke, 2 when the topology did not start.

    .venv/bin/python bench/chaos.py --seed 7 --rocketmq
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.chaos.harness import Chaos, Outcome, machine  # noqa: E402
from tests.support.chaos.schedule import FAULTS, schedule  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def report(outcome: Outcome, *, command: str, took_s: float, machine_before: str, machine_after: str) -> str:
    lines = [
        "# Chaos: the replicated topology under faults",
        "",
        f"`{command}`, seed {outcome.seed}, on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
        f"({machine_before} at the start, {machine_after} at the end), {took_s / 60:.1f} min in all.",
        "",
        f"Verdict: **{'every invariant held' if outcome.ok else 'invariants broken'}**.",
        "",
        "| # | fault | target | invariants | figures |",
        "|---|---|---|---|---|",
    ]
    for i, r in enumerate(outcome.results, 1):
        held = "<br>".join(
            f"{'held' if not v else '**BROKEN**'}: {k}{'' if not v else ' (' + v + ')'}"
            for k, v in r.invariants.items()
        )
        figures = "<br>".join(f"{k}: {v:.2f} s" for k, v in r.figures.items())
        lines.append(f"| {i} | {r.fault.name}: {r.fault.what} | {r.target} | {held} | {figures} |")
    lines += ["", "## The whole run", ""]
    for k, v in outcome.invariants.items():
        lines.append(f"- {'held' if not v else '**BROKEN**'}: {k}{'' if not v else ' (' + v + ')'}")
    for k, v in outcome.figures.items():
        lines.append(f"- {k}: {v:.1f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/chaos.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="orders the faults and picks their targets (default 1)")
    parser.add_argument("--faults", default="", help=f"comma-separated, of: {', '.join(f.name for f in FAULTS)}")
    parser.add_argument("--rocketmq", action="store_true", help="Apache RocketMQ's controller-mode brokers too")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "CHAOS_RESULTS.md")
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="where the topology keeps its files (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    names = tuple(n for n in args.faults.split(",") if n) or None
    faults = schedule(args.seed, names, rocketmq=args.rocketmq)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
    command = "bench/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(
        f"chaos: seed {args.seed}, {len(faults)} faults: {', '.join(f.name for f in faults)}; run dir {run_dir}",
        flush=True,
    )
    t0, before = time.monotonic(), machine()
    chaos = Chaos(run_dir, args.seed, rocketmq=args.rocketmq)
    try:
        try:
            chaos.start()
        except Exception as exc:  # noqa: BLE001 - said, with where to look
            print(f"chaos: the topology did not start: {exc}\n  logs under {run_dir}", file=sys.stderr)
            return 2
        for i, fault in enumerate(faults, 1):
            result = chaos.run_fault(fault)
            chaos.outcome.results.append(result)
            print(f"[{i}/{len(faults)}] {result.line()}", flush=True)
        outcome = chaos.finish()
    finally:
        chaos.stop()
    for k, v in outcome.invariants.items():
        print(f"{'held' if not v else 'BROKEN'}: {k}{'' if not v else ': ' + v}")
    args.out.write_text(
        report(outcome, command=command, took_s=time.monotonic() - t0, machine_before=before, machine_after=machine())
    )
    print(f"chaos: {'every invariant held' if outcome.ok else 'invariants broken'}; results in {args.out}")
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
