"""How long an action waits between landing in Kafka and reaching the node, and what an idle node pays.

The node's action consumer (``namesrv.events.actions.ActionConsumer``) polls without blocking and
pauses ``idle_pause_s`` after an empty fetch; kafka-python's blocking ``poll``, which leaves the
waiting to the broker, is measured too, as the reference.  For each pause, against Apache Kafka on
free loopback ports: the CPU the idle consumer and the broker use over ``--idle`` seconds, then the
time from the producer's acknowledgement of each of ``--actions`` actions to the consumer's
``deliver`` call (median, p90, max).  Compare the rows of one run (``docs/internals/benchmarks.md``).

    .venv/bin/python bench/action_latency.py [--pauses 0.2,0.1,0.05,0.02] [--actions 60] [--idle 10]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kafka import KafkaProducer, TopicPartition  # noqa: E402

from common import kafka_clients, procfs  # noqa: E402
from common.contract import Action, ActionType, action_key, encode_action, wall_ms  # noqa: E402
from namesrv.events.actions import ActionConsumer, ConsumerSettings  # noqa: E402
from tests.support.kafka import CLIENT, kafka_broker  # noqa: E402

TOPIC = "actions"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads)."""
    st = procfs.stat(pid)
    assert st is not None, f"pid {pid} is gone"
    return st.cpu_seconds


def idle_cost(run: Callable[[float], object], seconds: float, broker_pid: int) -> tuple[float, float]:
    """CPU share (percent of one core) of this process and of the broker while ``run`` is going on."""
    me = os.getpid()
    t0, c0, k0 = time.monotonic(), cpu_seconds(me), cpu_seconds(broker_pid)
    run(seconds)
    elapsed = time.monotonic() - t0
    return 100 * (cpu_seconds(me) - c0) / elapsed, 100 * (cpu_seconds(broker_pid) - k0) / elapsed


def blocking_poll_reference(bootstrap: str, seconds: float, broker_pid: int) -> tuple[float, float]:
    consumer = kafka_clients.consumer(bootstrap, fetch_max_wait_ms=100, **CLIENT)
    tps = [TopicPartition(TOPIC, p) for p in range(3)]
    consumer.assign(tps)
    consumer.seek_to_end(*tps)

    def run(duration: float) -> None:
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)

    try:
        return idle_cost(run, seconds, broker_pid)
    finally:
        consumer.close()


def measure(
    bootstrap: str, pause: float, actions: int, idle_s: float, broker_pid: int, producer: KafkaProducer
) -> dict[str, float]:
    delivered: dict[str, float] = {}
    arrived = threading.Condition()

    def deliver(action: Action) -> None:
        with arrived:
            delivered[action.reason or ""] = time.perf_counter()
            arrived.notify_all()

    consumer = ActionConsumer(ConsumerSettings(bootstrap, TOPIC, idle_pause_s=pause), deliver)
    consumer.start()
    try:
        assert consumer.ready.wait(15), "the consumer did not reach the end of the topic"
        own_cpu, broker_cpu = idle_cost(time.sleep, idle_s, broker_pid)
        latencies = []
        for i in range(actions):
            time.sleep(random.uniform(0, 0.25))  # land at a random phase of the consumer's pauses
            action = Action(ActionType.MONITOR_HEARTBEAT, "bench", wall_ms(), reason=f"{pause}-{i}")
            producer.send(TOPIC, key=action_key(action), value=encode_action(action)).get(5)
            acked = time.perf_counter()
            with arrived:
                assert arrived.wait_for(
                    lambda reason=action.reason: reason in delivered, 5
                ), f"action {i} never arrived"
            latencies.append(max(0.0, delivered[action.reason] - acked) * 1000)
    finally:
        consumer.stop()
    latencies.sort()
    return {
        "own_cpu": own_cpu, "broker_cpu": broker_cpu, "median": statistics.median(latencies),
        "p90": latencies[int(0.9 * (len(latencies) - 1))], "max": latencies[-1],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pauses", default="0.2,0.1,0.05,0.02", help="idle pauses to compare (seconds)")
    parser.add_argument("--actions", type=int, default=60, help="actions timed per pause")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle consumer per pause")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, kafka_broker(Path(tmp), {TOPIC: 3}) as kafka:
        broker_pid = int(kafka.pidfile.read_text())
        producer = kafka_clients.producer(kafka.bootstrap_servers, acks=1, linger_ms=0, **CLIENT)
        try:
            own, broker = blocking_poll_reference(kafka.bootstrap_servers, args.idle, broker_pid)
            print(
                f"reference: kafka-python poll(timeout_ms=100), idle: this process {own:.1f}% CPU, "
                f"Kafka {broker:.1f}%"
            )
            print(
                "| idle pause | idle CPU, consumer process | idle CPU, Kafka | Kafka -> deliver median " "| p90 | max |"
            )
            print("|---:|---:|---:|---:|---:|---:|")
            for pause in (float(p) for p in args.pauses.split(",")):
                r = measure(kafka.bootstrap_servers, pause, args.actions, args.idle, broker_pid, producer)
                print(
                    f"| {pause * 1000:.0f} ms | {r['own_cpu']:.1f}% | {r['broker_cpu']:.1f}% | "
                    f"{r['median']:.0f} ms | {r['p90']:.0f} ms | {r['max']:.0f} ms |",
                    flush=True,
                )
        finally:
            producer.close(5)


if __name__ == "__main__":
    main()
