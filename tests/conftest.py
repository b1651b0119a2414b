import sys
from pathlib import Path

import pytest

# tests import their helpers as `tests.support...`
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.node import running_node  # noqa: E402


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


_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The ten slowest modules, setup and teardown included: where the suite's time goes."""
    if len(_module_seconds) < 2:
        return
    terminalreporter.section("slowest 10 modules")
    for module, seconds in sorted(_module_seconds.items(), key=lambda kv: -kv[1])[:10]:
        terminalreporter.write_line(f"{seconds:8.1f}s {module}")
