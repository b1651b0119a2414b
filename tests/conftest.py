import sys
from collections.abc import Generator
from pathlib import Path

import pytest

# tests import their helpers as `tests.support...`
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.node import running_node  # noqa: E402
from tests.support.report import SUMMARY  # noqa: E402


@pytest.fixture
def node(tmp_path):
    """A name-server node on a free loopback port, stopped after the test."""
    with running_node(tmp_path) as n:
        yield n


@pytest.fixture(autouse=True)
def fresh_warning_budgets(monkeypatch):
    """Every test starts with a full minute's budget of the node's rate-limited warnings.

    The budgets are per process: without this, a test that sends hostile input (the fuzzers) spends
    them, and a later test in the same minute that asserts one such warning sees none.
    """
    from common.logs import RateLimited
    from namesrv import handshake, server

    for module in (server, handshake):
        monkeypatch.setattr(module, "_drop_log", RateLimited(module.log, per_minute=module._drop_log.per_minute))


#: per module: seconds in set-up (module-scoped stacks start there), in the tests, in teardown
_module_seconds: dict[str, dict[str, float]] = {}
#: where every module's times go, for whoever makes the suite faster (the terminal shows the ten slowest)
TIMES_FILE = Path(__file__).resolve().parents[1] / "build" / "test-module-seconds.tsv"


#: what the scenarios measured (tests.support.report), gathered from every report, a worker's included
_measured: list[str] = []
#: how much of this process's SUMMARY has gone out on a report
_sent = 0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Each report carries the lines measured since the last: under ``-n`` they reach the main process so."""
    global _sent
    report = yield
    report.user_properties.extend(("measured", line) for line in SUMMARY[_sent:])
    _sent = len(SUMMARY)
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    phases = _module_seconds.setdefault(report.nodeid.split("::", 1)[0], {"setup": 0.0, "call": 0.0, "teardown": 0.0})
    phases[report.when] += report.duration
    _measured.extend(str(value) for key, value in report.user_properties if key == "measured")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """What the scenarios measured; the ten slowest modules, setup and teardown included."""
    if _measured:
        terminalreporter.section("integration: measured")
        for line in _measured:
            terminalreporter.write_line(line)
    if len(_module_seconds) < 2:
        return
    ranked = sorted(_module_seconds.items(), key=lambda kv: -sum(kv[1].values()))
    terminalreporter.section("slowest 10 modules")
    for module, phases in ranked[:10]:
        terminalreporter.write_line(f"{sum(phases.values()):8.1f}s {module} (set-up {phases['setup']:.1f}s)")
    # `make test` runs pytest twice (the parallel part, then the modules marked alone): the file keeps
    # every module's latest times
    rows = _times_rows()
    rows.update(
        (m, f"{m}\t{sum(p.values()):.1f}\t{p['setup']:.1f}\t{p['call']:.1f}\t{p['teardown']:.1f}")
        for m, p in _module_seconds.items()
    )
    ordered = sorted(rows.values(), key=lambda row: -float(row.split("\t")[1]))
    TIMES_FILE.parent.mkdir(exist_ok=True)
    TIMES_FILE.write_text("module\tseconds\tsetup\tcall\tteardown\n" + "\n".join(ordered) + "\n")
    terminalreporter.write_line(f"every module's times: {TIMES_FILE}")


def _times_rows() -> dict[str, str]:
    """module -> its row in TIMES_FILE, as an earlier run left it."""
    try:
        lines = TIMES_FILE.read_text().splitlines()[1:]
    except OSError:
        return {}
    return {line.split("\t", 1)[0]: line for line in lines if line.count("\t") == 4}
