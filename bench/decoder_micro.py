"""The event decoder alone, and the source's per-record work, old against new in the same run.

Two ratios, each measured in one run: ``decode_event`` of this tree against another tree's
(``--baseline``), both loaded into this process, over the events the throughput benchmark produces,
rounds alternating and both decoders required to give equal events; and, with ``--trees A B``, the
job source's per-record work after kafka-python in each tree, each run in its own process from inside
its tree, alternated ``--rounds`` times.  ``docs/internals/benchmarks.md`` has more.

    .venv/bin/python bench/decoder_micro.py --baseline /work/main [--events 100000] [--rounds 7]
    .venv/bin/python bench/decoder_micro.py --trees /work/main /work/wt-decoder
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import itertools
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve()
#: events per turn of each decoder
CHUNK = 2_000


def load_values(brokers: int, events: int) -> list[bytes]:
    """The encoded events of the throughput load: the first round's registrations, then ``events`` more."""
    sys.path.insert(0, str(HERE.parents[1]))
    from bench.streaming_bench import registrations_count, synthetic_load
    from common.contract import encode_event

    load = synthetic_load(brokers)
    return [encode_event(e) for e in itertools.islice(load, registrations_count(brokers) + events)]


def schema_of(tree: Path, name: str) -> ModuleType:
    """``tree``'s event schema, loaded beside this process's own: ``common/contract/`` (a package whose
    modules import each other by name, so imported with ``tree`` first on the path, and this process's
    ``common`` put back after), or, in a tree from before it, ``namesrv/events/schema.py`` as a module of
    its own (``name``)."""
    single = tree / "namesrv" / "events" / "schema.py"
    if not single.exists():
        ours = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "common" or k.startswith("common.")}
        sys.path.insert(0, str(tree))
        try:
            return importlib.import_module("common.contract")
        finally:
            sys.path.remove(str(tree))
            for k in [k for k in sys.modules if k == "common" or k.startswith("common.")]:
                del sys.modules[k]
            sys.modules.update(ours)
    spec = importlib.util.spec_from_file_location(name, single)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def timed(fn, values: list) -> float:
    """CPU seconds of this process for ``fn`` over every value (no collection meanwhile): the machine is
    shared, and the time another process held the core is not the decoder's."""
    gc.collect()
    gc.disable()
    try:
        started = time.process_time()
        for v in values:
            fn(v)
        return time.process_time() - started
    finally:
        gc.enable()


def bench_decoder(baseline: Path, values: list[bytes], rounds: int) -> None:
    old = schema_of(baseline, "baseline_schema")
    new = schema_of(HERE.parents[1], "this_schema")
    mismatched = sum(repr(old.decode_event(v)) != repr(new.decode_event(v)) for v in values)
    if mismatched:
        raise SystemExit(f"the two decoders disagree on {mismatched} of {len(values)} events")
    # old and new alternate every CHUNK events, so a neighbour's load falls on both alike
    chunks = [values[i : i + CHUNK] for i in range(0, len(values), CHUNK)]
    times: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(rounds):
        spent = {"old": 0.0, "new": 0.0}
        for chunk in chunks:
            spent["old"] += timed(old.decode_event, chunk)
            spent["new"] += timed(new.decode_event, chunk)
        for k, t in spent.items():
            times[k].append(t)
    per = {k: statistics.median(ts) / len(values) * 1e6 for k, ts in times.items()}
    ratios = [n / o for o, n in zip(times["old"], times["new"], strict=True)]
    print(
        f"decode_event over {len(values):,} events, {rounds} rounds alternating: "
        f"old ({baseline}) {per['old']:.2f} µs/event, new ({HERE.parents[1]}) {per['new']:.2f} µs/event; "
        f"new/old {per['new'] / per['old']:.2f} (per round {min(ratios):.2f}-{max(ratios):.2f})"
    )


def parse_worker(path: str, repeat: int) -> None:
    """In a tree's own process: seconds per event of the source's per-record work, best of ``repeat``."""
    from streaming import events

    values = pickle.loads(Path(path).read_bytes())
    batches = [values[i : i + 8192] for i in range(0, len(values), 8192)]  # the source's Arrow batch size
    if hasattr(events, "bundled_batch"):  # since the source bundles events (clock far ahead: none refused)
        work = lambda b: events.bundled_batch(b, 2**62, 0)  # noqa: E731
    else:
        schema = events.parsed_arrow_schema()
        work = lambda b: events.parsed_batch(b, schema)  # noqa: E731
    best = min(timed(work, batches) for _ in range(repeat))
    print(json.dumps({"tree": str(Path(events.__file__).resolve().parents[1]), "us": best / len(values) * 1e6}))


def bench_trees(trees: list[Path], values: list[bytes], rounds: int) -> None:
    with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
        f.write(pickle.dumps(values))
        f.flush()
        per: dict[Path, list[float]] = {t: [] for t in trees}
        for _ in range(rounds):
            for tree in trees:
                env = {**os.environ, "PYTHONPATH": str(tree)}
                out = subprocess.run(
                    [sys.executable, str(HERE), "--parse-worker", f.name], cwd=tree, env=env,
                    check=True, capture_output=True, text=True,
                ).stdout  # fmt: skip
                answer = json.loads(out.strip().splitlines()[-1])
                if Path(answer["tree"]) != tree.resolve():
                    raise SystemExit(f"ran {answer['tree']}, not {tree}")
                per[tree].append(answer["us"])
    first = statistics.median(per[trees[0]])
    for tree in trees:
        m = statistics.median(per[tree])
        print(
            f"the source's batch (decode + key + Arrow) in {tree}: {m:.2f} µs/event (median of {rounds}; "
            f"{min(per[tree]):.2f}-{max(per[tree]):.2f}); {m / first:.2f}x {trees[0]}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="the tree whose decoder is the old one")
    parser.add_argument("--trees", type=Path, nargs="+", help="time the source's per-record work in each tree")
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100_000, help="heartbeats and ticks after the registrations")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--parse-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parse_worker:
        parse_worker(args.parse_worker, repeat=3)
        return 0
    if not args.baseline and not args.trees:
        parser.error("give --baseline TREE and/or --trees TREE...")
    values = load_values(args.brokers, args.events)
    if args.baseline:
        bench_decoder(args.baseline, values, args.rounds)
    if args.trees:
        bench_trees(args.trees, values, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
