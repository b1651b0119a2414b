"""The repository stands alone: nothing it builds, runs, tests or benchmarks reads the team's folder beside it.

A clone with nothing beside it must pass ``make setup`` and ``make test``: the golden frames
live in ``tests/vectors/`` and the load generator in ``tools/rmq-loadgen/``. Only documentation, and
the vectors' README (which says where they were captured), may still cite that folder as provenance.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAY_CITE = ("docs/", "tests/vectors/README.md")
#: the sibling folder's name; the samples below spell it as "@" so that this file does not cite it itself
SIBLING = "shared"
#: a relative path up to it, a path built to it from the repository (a parent joined with the quoted
#: name), or one of the files it holds
CITES = re.compile(
    rf"""\.\./{SIBLING}\b|/\s*["']{SIBLING}["']|\b{SIBLING}/(?:spec|tools|hooks|design\.md|style\.md)\b"""
)


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [name for name in listing.decode().split("\0") if name]


@pytest.mark.parametrize(
    "text",
    [
        "LOADGEN_SRC=$REPO/../@/tools/rmq-loadgen",
        'VECTORS = REPO.parent / "@" / "spec" / "vectors"',
        "Path(__file__).resolve().parents[3] / '@' / 'spec'",
        "Brokers (see ``@/design.md``)",
    ],
)
def test_every_way_the_tree_used_to_name_the_folder_is_caught(text):
    assert CITES.search(text.replace("@", SIBLING))


@pytest.mark.parametrize(
    "text",
    [
        "Absolute numbers on a shared 2-core machine are noise",
        "the shared libraries ``ldd`` says it needs",
        "def shared_libraries(binary: Path)",
        "shared = world.lookup.get('DefaultCluster')",
    ],
)
def test_the_word_in_its_other_senses_is_not(text):
    assert not CITES.search(text)


def test_no_tracked_file_outside_the_docs_reads_the_folder_beside_the_repository():
    files = tracked_files()
    assert "tests/vectors/vectors.json" in files and "tools/rmq-loadgen/Cargo.toml" in files  # what replaced it
    offenders = []
    for name in files:
        if name.startswith(MAY_CITE) or not (REPO / name).is_file():
            continue  # a file deleted in the work tree but not yet from the index is not read by anything
        text = (REPO / name).read_bytes().decode("utf-8", errors="replace")
        offenders += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in CITES.finditer(text)]
    assert not offenders, "these name the folder beside the repository; use tests/vectors or tools/:\n" + "\n".join(
        offenders
    )
