"""The shape a newcomer relies on: layers that import one way, no cycles, one class per name, short
module docstrings, a pipeline that reads in one sitting, a README that is an entry point.

The layers, bottom up: the node<->monitor contract (``common.contract``), the rest of ``common`` (the
wire protocol and the route tables both sides run among it), the node (``namesrv``), the monitor
(``streaming``), the local stack (``infra``).  The monitor imports nothing of the node, nor do the
modules Spark's Python workers load.
"""

from __future__ import annotations

import ast
from collections import Counter
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "namesrv", "streaming", "infra")
#: the node<->monitor contract: a layer of its own, below the rest of common
CONTRACT = "common.contract"
#: which layer may import which: the contract imports nothing of ours, the node and the monitor stand
#: on it and on common (the monitor's route model in Redis runs the same route tables as the node, so a
#: route there is byte for byte what a node answers), and the local stack starts them all; never the
#: other way
MAY_IMPORT = {
    CONTRACT: set(),
    "common": {CONTRACT},
    "namesrv": {CONTRACT, "common"},
    "streaming": {CONTRACT, "common"},
    "infra": {CONTRACT, "common", "namesrv", "streaming"},
}
#: the modules Spark's Python workers import (streaming.spark_daemon.PRELOAD): nothing of the node
WORKER_MODULES = ("streaming.events", "streaming.liveness")


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer(module: str) -> str:
    return CONTRACT if within(module, CONTRACT) else module.split(".")[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), str(p)) for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


@cache
def imports() -> dict[str, set[str]]:
    """Each module's imports of the project's own modules, function-level ones included (they are a
    dependency all the same), ``if TYPE_CHECKING`` ones not (they never run)."""
    known = modules()
    out: dict[str, set[str]] = {}
    for name, tree in known.items():
        parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        found: set[str] = set()
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            if targets and _type_checking_only(node, parents):
                continue
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        out[name] = found
    return out


def test_layers_import_one_way():
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in imports().items()
        for target in targets
        if (to := layer(target)) != layer(name) and to not in MAY_IMPORT[layer(name)]
    )
    assert not wrong, wrong


def _from(source: str, top: str) -> dict[str, set[str]]:
    """What each module of layer ``source`` imports of package ``top``."""
    found = {
        name: {t for t in targets if layer(t) == top} for name, targets in imports().items() if layer(name) == source
    }
    return {name: targets for name, targets in found.items() if targets}


def test_the_contract_imports_neither_the_node_nor_the_monitor_nor_the_rest_of_common():
    for other in ("namesrv", "streaming", "common", "infra"):
        assert _from(CONTRACT, other) == {}, other


def test_the_node_imports_nothing_of_the_monitor():
    assert _from("namesrv", "streaming") == {}


def test_the_monitor_imports_nothing_of_the_node():
    assert _from("streaming", "namesrv") == {}


def test_what_sparks_workers_import_reaches_the_contract_and_nothing_of_the_node():
    graph, seen, todo = imports(), set(), list(WORKER_MODULES)
    while todo:
        if (name := todo.pop()) not in seen:
            seen.add(name)
            todo += graph.get(name, ())
    assert CONTRACT in seen and not {m for m in seen if layer(m) == "namesrv"}, sorted(seen)


def test_no_import_cycles():
    graph = imports()
    # a package imports its own __init__ on the way to any submodule: that edge is not a choice
    edges = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_one_class_per_name():
    names = Counter(
        node.name
        for tree in modules().values()
        for node in tree.body
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    )
    assert not [n for n, count in names.items() if count > 1]


def _module_docstring(text: str) -> str | None:
    """The module's docstring, from parsing only the head of the file up to it (a whole parse of every
    file costs a second), or of the whole file where the head alone does not parse."""
    first = min((i for i in (text.find('"""'), text.find("'''")) if i >= 0), default=-1)
    end = text.find(text[first : first + 3], first + 3) if first >= 0 else -1
    try:
        tree = ast.parse(text[: end + 3] if end >= 0 else text)
    except SyntaxError:
        tree = ast.parse(text)
    return ast.get_docstring(tree, clean=False)


def test_module_docstrings_say_what_and_why_briefly():
    files = [p for top in (*PACKAGES, "bench", "tests") for p in (REPO / top).rglob("*.py")]
    long = {}
    for path in files:
        doc = _module_docstring(path.read_text())
        if doc and doc.count("\n") + 1 > 25:
            long[str(path.relative_to(REPO))] = doc.count("\n") + 1
    assert not long, long


def test_the_job_reads_in_one_sitting_and_the_readme_is_an_entry():
    assert len((REPO / "streaming" / "job.py").read_text().splitlines()) <= 400
    assert len((REPO / "README.md").read_text().splitlines()) <= 300
