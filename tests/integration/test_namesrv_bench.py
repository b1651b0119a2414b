"""``bench/namesrv_bench.py`` at a tiny size: our node and Apache's NameServers 4.9.7 and 5.5.0 started in
the same run, every workload measured against each, the ratios and the RSS table written.

The figures of such a run mean nothing (the JVMs' warm-up until their JIT is idle is cut at one chunk);
what is checked is that every server answered every workload without errors, that each JVM was loaded
before its window and its JIT counted, that the report holds a same-run ratio for each, and that it
keeps the earlier measurements of an existing report.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = ["route 16x1", "route 16x16", "route 64x4", "heartbeat 16x16", "register 4x1", "register 1x1"]
SERVERS = ["ours", "Java 4.9.7", "Java 5.5.0"]

pytestmark = [pytest.mark.rocketmq, pytest.mark.alone, pytest.mark.timeout(420)]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_bench_measures_our_node_and_both_java_namesrvs_in_the_same_run(tmp_path):
    out = tmp_path / "RESULTS.md"
    out.write_text("# old report\n\nold figures\n\n## Earlier measurements\n\nan A/B worth keeping\n")
    done = subprocess.run(
        [sys.executable, "bench/namesrv_bench.py", "--runs", "1", "--warmup", "0.3", "--duration", "0.7",
         "--jit-chunk", "0.3", "--jit-max", "0.1",
         "--register-brokers", "4", "--register-topics", "20", "--rss-brokers", "3", "--rss-topics", "20",
         "--out", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = out.read_text()
    assert "old figures" not in report and report.endswith("## Earlier measurements\n\nan A/B worth keeping\n")
    lines = report.splitlines()

    # the ratios: one row per workload, ours and each Java per CPU-second, then ours over each
    ratios = {c[0]: c for c in map(cells, lines) if c[0] in WORKLOADS and len(c) == 7}
    assert list(ratios) == WORKLOADS, report
    for name, (_, mine, java4, java5, vs4, vs5, goal) in ratios.items():
        assert min(float(x.replace(",", "")) for x in (mine, java4, java5)) > 0, ratios[name]
        assert re.fullmatch(r"\d+\.\d\dx", vs4) and re.fullmatch(r"\d+\.\d\dx", vs5), ratios[name]
        assert goal == {"route": "≥ 3.0x", "heartbeat": "≥ 4.0x", "register": "≥ 1.5x"}[name.split()[0]]

    # every server answered every workload, without errors
    detail = [c for c in map(cells, lines) if c[0] in WORKLOADS and len(c) == 11]
    assert [(c[0], c[1]) for c in detail] == [(w, s) for w in WORKLOADS for s in SERVERS], report
    assert {c[10] for c in detail} == {"0"}, report
    assert all(re.fullmatch(r"\d+%", c[6]) for c in detail), report
    # each JVM loaded until its JIT was idle (here cut at a second), with what it compiled while measured
    assert {c[9] for c in detail if c[1] == "ours"} == {"–"}, report
    assert all(re.fullmatch(r"\d+ s, \d+", c[9]) for c in detail if c[1] != "ours"), report

    # RSS of each, loaded with 3 brokers x 20 topics, and ours over each Java's
    rss = {c[0]: c for c in map(cells, lines) if c[0] in SERVERS and len(c) == 4}
    assert list(rss) == SERVERS, report
    assert all(float(rss[s][2].replace(",", "")) > 0 for s in SERVERS)
    assert [re.fullmatch(r"\d+\.\d\dx \(goal ≤ 0\.5x\)", rss[s][3]) is not None for s in SERVERS[1:]] == [True, True]
    assert "-Xms256m -Xmx256m -XX:+UseSerialGC" in report  # the Java side's settings are stated
