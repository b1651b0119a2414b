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
