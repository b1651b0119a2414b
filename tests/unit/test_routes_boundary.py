"""Nothing outside ``common/routes/`` touches a route table or the lock that guards them.

The tables are plain data whose functions assume the caller holds ``RouteInfoManager``'s lock
(see :mod:`common.routes.manager` for the threads it is for); these checks keep it that way.
Tests may call the pure functions on tables they build themselves, so they are only held to the
second rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

from common.routes import RouteInfoManager, RouteSettings
from common.routes.tables import RouteTables

REPO = Path(__file__).resolve().parents[2]
ROUTES = REPO / "namesrv" / "routes"
#: modules whose functions assume the lock is held
INTERNAL = {f"common.routes.{m}" for m in ("tables", "register", "unregister", "provisional", "queries", "admin")}


def sources(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in sorted((REPO / d).rglob("*.py")) if ROUTES not in p.parents]


def imports(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def reaches_inside(tree: ast.AST) -> list[int]:
    """Lines that read another object's ``_tables`` or ``_lock`` (``self._lock`` is the object's own)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("_tables", "_lock")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]  # fmt: skip


def test_production_code_outside_the_package_imports_no_table_module():
    found = {}
    for path in sources("namesrv", "streaming", "bench", "tools", "infra"):
        text = path.read_text()  # only a file that spells "routes" can import a module under common.routes
        if "routes" in text and (bad := imports(ast.parse(text, str(path))) & INTERNAL):
            found[str(path.relative_to(REPO))] = sorted(bad)
    assert found == {}


def test_no_code_outside_the_package_reaches_for_the_tables_or_the_lock():
    found = {}
    for path in sources("namesrv", "streaming", "bench", "tools", "infra", "tests"):
        text = path.read_text()  # only a file that spells one of the two names can reach for it
        if ("_tables" in text or "_lock" in text) and (lines := reaches_inside(ast.parse(text, str(path)))):
            found[str(path.relative_to(REPO))] = lines
    assert found == {}


def test_the_manager_shows_no_table_and_no_lock():
    public = {a for a in dir(RouteInfoManager(RouteSettings())) if not a.startswith("_")}
    # provisional_stats is the one field it shows, as a copy of three counters
    tables = {f for f in RouteTables.__dataclass_fields__ if f.endswith(("_table", "provisional", "_groups"))}
    assert len(tables) == 9 and not public & tables
    assert "lock" not in public
