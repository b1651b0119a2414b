"""Nothing outside ``namesrv/liveness/`` imports one of its modules: the package's exports are the way in.

The package is node-side liveness in one place (see its ``__init__``); what the rest of the code may
use is its ``__all__``, so a module can be split or renamed without touching any caller.
"""

from __future__ import annotations

import ast
from pathlib import Path

import namesrv.liveness

REPO = Path(__file__).resolve().parents[2]
LIVENESS = REPO / "namesrv" / "liveness"


def reaches_inside(tree: ast.AST) -> list[str]:
    """What ``tree`` imports from inside the package, other than its exports."""
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith("namesrv.liveness.")]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("namesrv.liveness."):
                out.append(node.module)
            elif node.module == "namesrv.liveness":
                out += [f"namesrv.liveness.{a.name}" for a in node.names if a.name not in namesrv.liveness.__all__]
    return out


def test_code_outside_the_package_imports_only_what_the_package_exports():
    found = {}
    for d in ("namesrv", "streaming", "infra", "bench", "tests"):
        for path in sorted((REPO / d).rglob("*.py")):
            source = path.read_text()
            if (
                "namesrv.liveness" not in source or LIVENESS in path.parents
            ):  # parsing is the cost; most files never name it
                continue
            if bad := reaches_inside(ast.parse(source, str(path))):
                found[str(path.relative_to(REPO))] = bad
    assert found == {}


def test_every_export_is_there():
    assert all(hasattr(namesrv.liveness, name) for name in namesrv.liveness.__all__)
