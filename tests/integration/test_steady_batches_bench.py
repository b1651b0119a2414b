"""``bench/steady_batches.py`` (docs/testing.md), briefly: it runs the job at a fixed rate and reports each part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: a bench: it needs the machine to itself
pytestmark = pytest.mark.alone

REPO = Path(__file__).resolve().parents[2]
PARTS = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")


def test_the_steady_batch_bench_reports_every_part_of_a_batch_over_batches_that_held_events():
    out = subprocess.run(
        [sys.executable, "bench/steady_batches.py", "--brokers", "100", "--rate", "200", "--seconds", "12",
         "--warmup", "2"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    counted = next(line for line in lines if "batches with events" in line)
    assert int(counted.split()[0]) >= 5, out.stdout
    rows = {
        c[0]: c[1] for c in ([x.strip() for x in line.strip("|").split("|")] for line in lines if line.startswith("| "))
    }
    medians = {part: int(rows[part].replace(",", "")) for part in PARTS}
    # a batch's whole is at least the part that runs it
    assert medians["triggerExecution"] >= medians["addBatch"] > 0, medians
