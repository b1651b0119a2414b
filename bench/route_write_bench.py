"""The job's route model and its full Redis write, measured apart from Spark.

Theory of operation
-------------------
A new query lineage, or the rewrite after a failed Redis write, makes the job apply every broker's
REGISTER event to its :class:`~streaming.routes.RouteModel`, take ``changes(full=True)`` (every
topic's route encoded) and write it all in one MULTI/EXEC (:meth:`RedisRouteStore.commit` with
``replace``). This bench times those three steps for a fleet into a fresh ``redis-server`` (Debian's,
started here on a free loopback port and stopped by PID), and Redis' memory afterwards.

The reference, in the same run: the same route values written with one pipelined MSET per thousand
keys through the same client, the least any writer of those bytes pays. Absolute times on a shared
machine are noise; the ratio is the figure.

    PYTHONPATH=. .venv/bin/python bench/route_write_bench.py [--fleet 10000x10 --fleet 100x1000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from common import redis_clients  # noqa: E402
from infra.processes import free_port  # noqa: E402
from infra.redis import RedisService  # noqa: E402
from streaming.routes import RedisRouteStore, RouteModel  # noqa: E402
from tests.support.route_events import reg_event  # noqa: E402


def fleet(text: str) -> tuple[int, int]:
    brokers, _, topics = text.partition("x")
    return int(brokers), int(topics)


def run(redis_url: str, brokers: int, per_broker: int) -> dict[str, float]:
    events = [
        reg_event(f"b{b}", f"10.{b // 62500}.{b // 250 % 250}.{b % 250}:10911", 0,
                  {f"T{b}_{i}": (8, 8, 6) for i in range(per_broker)})
        for b in range(brokers)
    ]  # fmt: skip
    model = RouteModel()
    start = time.perf_counter()
    for event in events:
        model.apply_event(event)
    applied = time.perf_counter()
    changes = model.changes(full=True)
    changed = time.perf_counter()
    store = RedisRouteStore.from_url(redis_url, prefix="bench")
    store.reset()
    store.client.flushall()
    begin = time.perf_counter()
    store.commit("bench", 0, changes, replace=True)
    written = time.perf_counter()
    memory = store.client.info("memory")["used_memory"]
    keys = store.client.dbsize()

    # the reference: the same values, MSET a thousand at a time, one transaction
    store.client.flushall()
    values = [(f"ref:{topic}", route) for topic, route in changes.routes.items() if route is not None]
    ref_start = time.perf_counter()
    with store.client.pipeline(transaction=True) as pipe:
        for i in range(0, len(values), 1000):
            pipe.execute_command("MSET", *(part for pair in values[i : i + 1000] for part in pair))
        pipe.execute()
    ref = time.perf_counter() - ref_start
    store.client.flushall()
    store.client.close()
    return {
        "topics": len(values),
        "apply_s": applied - start,
        "changes_s": changed - applied,
        "write_s": written - begin,
        "ref_s": ref,
        "memory_mib": memory / 2**20,
        "keys": keys,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet", action="append", type=fleet, help="BROKERSxTOPICS (repeatable)")
    args = parser.parse_args()
    fleets = args.fleet or [(1_000, 10), (10_000, 10), (100, 1_000)]
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisService(port=free_port(), run_dir=Path(tmp) / "redis")
        redis.start()
        try:
            url = redis.url
            redis_clients.connect(url).ping()
            print(
                "| fleet | topics | REGISTERs applied | changes(full) | the full write | reference: MSET of the routes | ratio | used_memory | keys |"
            )
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            for brokers, per in fleets:
                r = run(url, brokers, per)
                print(
                    f"| {brokers:,} brokers x {per:,} topics | {r['topics']:,} | {r['apply_s']:.2f} s | {r['changes_s']:.2f} s"
                    f" | {r['write_s']:.2f} s | {r['ref_s']:.2f} s | {r['write_s'] / r['ref_s']:.1f}x"
                    f" | {r['memory_mib']:.1f} MiB | {r['keys']:,} |",
                    flush=True,
                )
        finally:
            redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
