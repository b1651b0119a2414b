"""Where a steady micro-batch's time goes: the job fed a fixed event rate, Spark's own split of each batch.

A monitor in service takes, every batch, what arrived during the last one, so expiry at scale
depends on a steady batch's duration.  This script runs Kafka, Redis and Spark ``local[2]`` in its
own process with ``conf/streaming.properties`` as shipped, registers a synthetic fleet, produces its
heartbeats and ticks at ``--rate`` events per second, and reports the median of each part of the
query's ``durationMs`` over the batches that held events, after ``--warmup`` of them.  Compare two
trees by running it from inside each (Spark's Python workers import the job from their working
directory), alternating in the same window (``docs/internals/benchmarks.md``):

    cd <tree> && PYTHONPATH=<tree> /work/main/.venv/bin/python /work/main/bench/steady_batches.py
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import streaming_bench as sb  # this directory: the throughput bench's stack, load and helpers

from common import kafka_clients
from common.contract import encode_event, event_key
from infra.config import TopicSpec

#: the parts of a batch Spark reports (``StreamingQueryProgress.durationMs``), in the order they happen
PARTS = ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets", "triggerExecution")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="events per second offered (default 1000)")
    parser.add_argument("--brokers", type=int, default=1000, help="brokers in the fleet (default 1000)")
    parser.add_argument("--seconds", type=float, default=40, help="how long the rate is offered (default 40)")
    parser.add_argument("--warmup", type=int, default=5, help="batches with events left out first (default 5)")
    args = parser.parse_args()
    if args.rate < 1 or args.brokers < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--rate, --brokers and --seconds must be positive, --warmup at least 0")
    from streaming import job

    tree = Path(job.__file__).resolve().parents[1]
    sb.say(f"job from {tree}; {args.brokers} brokers, {args.rate} events/s for {args.seconds:.0f} s")
    with tempfile.TemporaryDirectory(prefix="steady-batches-") as tmp_name, sb.Stack() as stack:
        tmp = Path(tmp_name)
        kafka, redis = sb.start_backends(stack, tmp)
        spark = sb.start_spark(stack, partitions=None)

        name, bootstrap = "steady", kafka.bootstrap_servers
        kafka.ensure_topics([TopicSpec(f"{name}-events", 4), TopicSpec(f"{name}-actions", 1),
                             TopicSpec(f"{name}-alerts", 1)])  # fmt: skip
        settings = sb.Settings(events=0, brokers=args.brokers, expiring=0, crashing=0, registrations=0,
                               timeout_ms=10_000, poll_ms=25)  # fmt: skip
        cfg = sb.job_config(bootstrap, redis.url, name, tmp / "ckpt", settings, **{
            "spark.sql.shuffle.partitions": spark.conf.get("spark.sql.shuffle.partitions"),  # as shipped
            "alerts.monitorLagMillis": str(10**13),  # synthetic event times are years behind
        })  # fmt: skip
        load = sb.synthetic_load(args.brokers)
        sb.produce(bootstrap, f"{name}-events", itertools.islice(load, sb.registrations_count(args.brokers)))
        monitor = job.start(spark, cfg)
        assert monitor is not None
        stack.later("the query", monitor.stop)
        monitor.process_all_available()
        before = len(monitor.query.recentProgress)
        sb.say(f"fleet registered; offering {args.rate} events/s")
        producer = kafka_clients.producer(bootstrap, acks=1, linger_ms=5, enable_idempotence=False)
        started, sent = time.perf_counter(), 0
        while (elapsed := time.perf_counter() - started) < args.seconds:
            for e in itertools.islice(load, max(0, int(elapsed * args.rate) - sent)):
                producer.send(f"{name}-events", key=event_key(e), value=encode_event(e))
                sent += 1
            time.sleep(0.01)
        producer.flush(60)
        producer.close(10)
        monitor.process_all_available()  # no batch in flight when the query stops
        progress = [p for p in monitor.query.recentProgress[before:] if sb.events_read(p) > 0][args.warmup :]
        if len(progress) < 5:
            raise SystemExit(f"only {len(progress)} batches with events after the warm-up: offer for longer")
    medians = {part: statistics.median(p.durationMs.get(part, 0) for p in progress) for part in PARTS}
    print(f"\n{len(progress)} batches with events; events per batch: median "
          f"{statistics.median(sb.events_read(p) for p in progress):,.0f}\n")  # fmt: skip
    print("| part of a batch (Spark's durationMs) | median, ms |\n|---|---:|")
    for part, ms in medians.items():
        print(f"| {part} | {ms:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
