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
