"""``bench/route_write_bench.py`` as docs/testing.md names it, on a small fleet: it runs and reports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: a bench: it needs the machine to itself
pytestmark = pytest.mark.alone

REPO = Path(__file__).resolve().parents[2]


def test_the_route_write_bench_reports_each_fleet_against_its_reference():
    out = subprocess.run(
        [sys.executable, "bench/route_write_bench.py", "--fleet", "20x5", "--fleet", "3x200"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = [
        line for line in out.stdout.splitlines() if line.startswith("| 20 brokers") or line.startswith("| 3 brokers")
    ]
    assert len(rows) == 2, out.stdout
    # every topic written, and at least a key per topic in Redis
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [c[1] for c in cells] == ["100", "600"]
    assert all(re.fullmatch(r"\d+\.\dx", c[6]) for c in cells)
    assert [int(c[8].replace(",", "")) >= int(c[1]) for c in cells] == [True, True]
