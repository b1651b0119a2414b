"""`make test` runs the modules marked ``alone`` after the rest, one at a time: the ones docs/testing.md names."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
#: what docs/testing.md says runs alone besides the benches
ALONE_BY_NAME = {
    "tests/integration/test_chaos.py",
    "tests/integration/test_rocketmq_controller.py",
    "tests/integration/test_liveness_deadline.py",
}
MARKED = re.compile(r"^pytestmark = .*\bpytest\.mark\.alone\b", re.M)


def test_the_modules_marked_alone_are_the_benches_and_those_the_testing_page_names():
    modules = {p for p in TESTS.rglob("test_*.py") if "node_modules" not in p.parts}
    alone = {str(p.relative_to(TESTS.parent)) for p in modules if MARKED.search(p.read_text())}
    benches = {str(p.relative_to(TESTS.parent)) for p in modules if p.name.endswith("_bench.py")}
    assert benches, "no bench modules found: the pattern is stale"
    assert alone == benches | ALONE_BY_NAME
    page = (TESTS.parent / "docs" / "testing.md").read_text()
    assert all(f"`{name}`" in page or name.endswith("_bench.py") for name in alone)
