"""How long a node's event loop stalls while one connection registers 100,000 topics over and over.

The node runs in this process (so its collections can be timed with ``gc.callbacks``) and the
attacker in another (``tests/support/attacks.py``).  A task on the node's loop wakes every
millisecond; the gaps between its turns are the loop's stalls.  Reported for an unattacked
baseline and under the attack: the gaps (p99, max, how many over 10/20/40 ms), every collection
(how many, how many full, the longest in CPU time of the collecting thread), and how long the
loop's thread waited for a CPU (Linux schedstat): what is left once the collector is quiet is
mostly that, on a shared 2-core machine.  ``--policy`` turns on the garbage-collector policy of
``namesrv start`` (``namesrv/gcpolicy.py``); without it the collector runs as CPython's defaults
say (what a tree without the policy does).

    PYTHONPATH=. .venv/bin/python bench/loop_stalls.py [--seconds 5] [--policy] [--attack 100k-topics]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support import attacks  # noqa: E402
from tests.support.node import running_node  # noqa: E402

MS = 1e-3


class Collections:
    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []
        self._started: dict[int, float] = {}

    def __call__(self, phase: str, info: dict) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = time.thread_time()
        elif me in self._started:
            self.seen.append((info["generation"], time.thread_time() - self._started.pop(me)))

    def summary(self) -> str:
        if not self.seen:
            return "no collections"
        full = [cpu for g, cpu in self.seen if g == 2]
        longest = max(cpu for _, cpu in self.seen)
        return (
            f"{len(self.seen)} collections, {len(full)} full (longest full {max(full, default=0) / MS:.1f} ms), "
            f"longest of all {longest / MS:.1f} ms CPU"
        )


def gaps_summary(gaps: list[float]) -> str:
    g = sorted(gaps)
    over = {ms: sum(x > ms * MS for x in g) for ms in (10, 20, 40)}
    return (
        f"{len(g)} turns, gap p99 {g[int(0.99 * len(g))] / MS:.1f} ms, max {g[-1] / MS:.1f} ms, "
        f"over 10/20/40 ms: {over[10]}/{over[20]}/{over[40]}"
    )


def cpu_wait(native_id: int) -> float | None:
    """Seconds the thread has spent runnable but waiting for a CPU (None off Linux)."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--policy", action="store_true", help="the collector policy of `namesrv start`")
    parser.add_argument("--attack", default="100k-topics", choices=sorted(attacks.ATTACKS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_node(Path(tmp)) as node:
        if args.policy:
            from namesrv import gcpolicy

            gcpolicy.enable()
        gaps: list[float] = []

        async def tick() -> None:
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        ticker = asyncio.run_coroutine_threadsafe(tick(), node.loop)
        loop_thread = next(t for t in threading.enumerate() if t.name == "namesrv-test-node")
        time.sleep(args.seconds)
        print(f"unattacked: {gaps_summary(gaps)}")
        gaps.clear()
        collections = Collections()
        with attacks.AttackProcess(node.addr, args.attack) as attack:
            gaps.clear()  # from the attack's start (its process takes a while to build its frame)
            waited = cpu_wait(loop_thread.native_id or 0)
            gc.callbacks.append(collections)
            time.sleep(args.seconds)
            gc.callbacks.remove(collections)
            after = cpu_wait(loop_thread.native_id or 0)
            result = attack.stop()
        ticker.cancel()
        print(f"{args.attack} ({'with' if args.policy else 'without'} the collector policy): {gaps_summary(gaps)}")
        print(f"  {collections.summary()}")
        if waited is not None and after is not None:
            print(f"  the loop's thread waited {after - waited:.2f} s for a CPU in {args.seconds:.0f} s")
        print(f"  attacker: {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
