"""Debian's real Prometheus (``/usr/bin/prometheus``) on a free loopback port, scraping the given targets.

Theory of operation: :func:`running_prometheus` writes a configuration with one scrape job per
target (a short ``scrape_interval``, so a test waits seconds, not minutes), starts Prometheus with
its storage in the test's directory, waits for ``/-/ready`` and stops it afterwards.  Tests read
values back through the HTTP query API (``/api/v1/query``) with :meth:`Prometheus.wait_for`, which
polls until an expression yields what the test expects or its deadline passes. Without a
Prometheus, :func:`scrape` reads collectors as a scrape of them would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from tests.support.node import free_port
from tests.support.wait import wait_until

PROMETHEUS = Path("/usr/bin/prometheus")
SCRAPE_INTERVAL_S = 1


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen
    log: Path

    def query(self, expr: str) -> list[dict]:
        """The instant vector of ``expr`` (``[{"metric": {...}, "value": [ts, "text"]}, ...]``)."""
        with urllib.request.urlopen(
            f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=5
        ) as r:
            answer = json.load(r)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def values(self, expr: str) -> list[float]:
        return [float(sample["value"][1]) for sample in self.query(expr)]

    def wait_for(self, expr: str, check: Callable[[list[float]], bool], timeout: float = 60.0) -> list[float]:
        """Poll ``expr`` until ``check`` accepts its values; returns them (AssertionError at the deadline)."""
        seen: list[list[float]] = [[]]

        def ok() -> bool:
            seen[0] = self.values(expr)
            return check(seen[0])

        wait_until(ok, timeout, f"{expr} in Prometheus", 0.25, state=lambda: (seen[0], self.targets()))
        return seen[0]

    def targets(self) -> list[tuple[str, str, str]]:
        """``(job, health, last error)`` of every target, for failure messages."""
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=5) as r:
            active = json.load(r)["data"]["activeTargets"]
        return [(t["labels"]["job"], t["health"], t["lastError"]) for t in active]


def _ready(url: str, proc: subprocess.Popen, log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"prometheus exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def running_prometheus(tmp_path: Path, targets: Mapping[str, str]) -> Iterator[Prometheus]:
    """Prometheus scraping ``job name -> host:port`` (path ``/metrics``) every second."""
    if not PROMETHEUS.is_file() and shutil.which("prometheus") is None:
        pytest.fail(f"{PROMETHEUS} is missing: run infra/install.sh (Debian package prometheus)")
    binary = str(PROMETHEUS) if PROMETHEUS.is_file() else str(shutil.which("prometheus"))
    home = tmp_path / "prometheus"
    home.mkdir()
    jobs = "".join(
        f"  - job_name: {json.dumps(job)}\n    static_configs:\n      - targets: [{json.dumps(addr)}]\n"
        for job, addr in targets.items()
    )
    config = home / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  scrape_timeout: {SCRAPE_INTERVAL_S}s\n"
        f"scrape_configs:\n{jobs}"
    )
    port = free_port()
    log = home / "prometheus.log"
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url, proc, log), 60, "prometheus to be ready", 0.1)
        yield Prometheus(url, proc, log)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def scrape(*collectors: Collector) -> dict[str, dict[tuple, float]]:
    """``sample name -> {sorted label items: value}``, from the text a scrape of ``collectors`` returns,
    read back with prometheus_client's own parser."""
    registry = CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out
