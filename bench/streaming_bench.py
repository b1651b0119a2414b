"""Measure the Spark liveness monitor on real noida-db, real Redis and local Spark; write the figures, with the command.

Three figures, each beside a reference measured by this same script on this same machine, because
absolute numbers on a shared 2-core machine are noise and ratios are not:

1. throughput: a fresh query (no ``maxOffsetsPerTrigger``) takes the registrations of ~1,000 brokers
   in its first batch, which is held open while N more events (heartbeats and ticks, synthetic event
   times) are produced; the next batch takes them all, and is timed until they are processed.
   Reference: kafka-python reading the same records with ``assign()`` + ``seek()`` (raw, and
   decoding each event), which is all the job's source does;
2. expiry latency: brokers registered with a 5 s ``heartbeatTimeoutMillis`` at two real nodes that
   publish to Kafka go silent; the clock runs from each broker's deadline (the nodes' own event time
   of its last heartbeat + timeout; wall clock, since the nodes stamp events with it) until neither
   node routes it any more.  Reference: a node without Kafka, whose own expiry scan (every
   ``scanNotActiveBrokerInterval``) handles the same brokers at the same time;
3. route latency: a new broker registers at both nodes; the clock runs until its topic's route is
   readable in Redis.  Reference: the trigger interval and the median batch duration of the query.

    .venv/bin/python bench/streaming_bench.py [--quick] [--events 100000] [--out bench/STREAMING_RESULTS.md]

Every process it starts (Kafka, Redis, the Spark JVM) is stopped by PID on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support.node: the in-process node the integration tests use

from infra.services import KafkaService, RedisService, TopicSpec, free_port  # noqa: E402
from namesrv import kafka_clients  # noqa: E402
from namesrv.events.schema import (  # noqa: E402
    DataVersionInfo,
    Event,
    EventType,
    QueueInfo,
    decode_event,
    encode_event,
    event_key,
)

CLUSTER = "DefaultCluster"
T0 = 1_700_000_000_000  # synthetic event times of the throughput load start here
PARTITIONS = 2  # events topic partitions, one per local[2] core


_BEGUN = time.monotonic()


def say(text: str) -> None:
    print(f"[bench +{time.monotonic() - _BEGUN:3.0f}s] {text}", file=sys.stderr, flush=True)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Settings:
    events: int
    brokers: int
    expiring: int
    registrations: int
    trigger_ms: int
    delay_ms: int
    tick_ms: int
    timeout_ms: int
    end_offsets: str


# --------------------------------------------------------------------------- cleanup


class Stack(contextlib.ExitStack):
    """An ExitStack whose failing cleanups are reported, not raised: the error that stopped the run stays
    the one shown, and a second Ctrl-C during cleanup does not leave the remaining processes behind."""

    def later(self, what: str, fn: Callable[[], object]) -> None:
        def guarded() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - keep cleaning up
                say(f"cleanup: {what} failed: {exc!r}")

        self.callback(guarded)


def stop_pid(proc: subprocess.Popen | None, what: str) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        say(f"{what} (pid {proc.pid}) ignored SIGTERM; killing it")
        proc.kill()
        proc.wait(5)


def start_spark(stack: Stack):
    from streaming import job
    from streaming.config import load_config

    cfg = load_config(None, {"spark.master": "local[2]", "spark.sql.shuffle.partitions": str(PARTITIONS)})
    spark = job.build_spark(cfg)
    spark.sparkContext.setLogLevel("ERROR")
    jvm = getattr(spark.sparkContext._gateway, "proc", None)  # the spark-submit -> java process we launched

    def stop() -> None:
        try:
            spark.stop()
        finally:
            stop_pid(jvm, "spark JVM")

    stack.later("spark", stop)
    return spark


# --------------------------------------------------------------------------- 1. throughput


def synthetic_load(brokers: int) -> Iterator[Event]:
    """Registrations of every broker through n1 and n2, then endless 10 s rounds of heartbeats and ticks."""
    seq = {"n1": 0, "n2": 0}
    step = 10_000 // brokers

    def ev(node: str, etype: EventType, t: int, i: int | None = None, **kw) -> Event:
        seq[node] += 1
        if i is not None:
            kw.update(cluster_name=CLUSTER, broker_name=f"broker-{i}", broker_addr=f"10.1.{i // 250}.{i % 250}:10911",
                      broker_id=0)  # fmt: skip
        return Event(type=etype, node=node, event_time=t, seq=seq[node], **kw)

    rnd = 0
    while True:
        base = T0 + rnd * 10_000
        for i in range(brokers):
            t = base + i * step
            for node in ("n1", "n2"):
                if rnd == 0:
                    topics = {f"T{i % 200}": QueueInfo(8, 8, 6), f"B{i}": QueueInfo(4, 4, 6),
                              CLUSTER: QueueInfo(1, 1, 7)}
                    yield ev(node, EventType.REGISTER, t, i, heartbeat_timeout_millis=120_000,
                             data_version=DataVersionInfo(1, 0, T0), ha_server_addr=f"10.1.0.{i % 250}:10912",
                             enable_acting_master=False, topics=topics)  # fmt: skip
                else:
                    yield ev(node, EventType.HEARTBEAT, t, i, source="BROKER_HEARTBEAT")
            if i % 100 == 0:
                for node in ("n1", "n2"):
                    yield ev(node, EventType.TICK, t)
        rnd += 1


def registrations_count(brokers: int) -> int:
    """Events in the load's first round: a REGISTER per broker and node, and the ticks."""
    return 2 * brokers + 2 * len(range(0, brokers, 100))


def produce(bootstrap: str, topic: str, events: Iterator[Event]) -> int:

    producer = kafka_clients.producer(bootstrap, acks=1, linger_ms=20, batch_size=256 * 1024,
                             enable_idempotence=False)  # fmt: skip
    count = 0
    errors: list[BaseException] = []
    try:
        for e in events:
            producer.send(topic, key=event_key(e), value=encode_event(e)).add_errback(errors.append)
            count += 1
        producer.flush(120)
    finally:
        producer.close(10)
    if errors:
        raise SystemExit(f"kafka refused {len(errors)} of {count} events, first: {errors[0]!r}")
    return count


def raw_consume(bootstrap: str, topic: str, decode: bool) -> tuple[int, float]:
    """Read every record of ``topic`` once, as the job's source tasks do: assign, seek, poll to the end."""
    from kafka import TopicPartition

    consumer = kafka_clients.consumer(bootstrap, auto_offset_reset="none", fetch_max_wait_ms=10)  # fmt: skip
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        started = time.perf_counter()
        for tp in tps:
            consumer.seek(tp, 0)
        count = 0
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=200, max_records=8192).values():
                count += len(records)
                if decode:
                    for r in records:
                        decode_event(r.value)
        return count, time.perf_counter() - started
    finally:
        consumer.close()


def job_config(bootstrap: str, redis_url: str, name: str, checkpoint: Path, s: Settings, **extra: str):
    from streaming.config import load_config

    return load_config(None, {
        "kafka.bootstrap": bootstrap,
        "kafka.eventsTopic": f"{name}-events",
        "kafka.actionsTopic": f"{name}-actions",
        "kafka.alertsTopic": f"{name}-alerts",
        "kafka.maxOffsetsPerTrigger": "",
        "kafka.endOffsets": s.end_offsets,
        "monitor.checkpointDir": str(checkpoint),
        "monitor.id": f"bench-{name}",
        "redis.url": redis_url,
        "redis.keyPrefix": f"bench-{name}",
        "spark.master": "local[2]",
        "spark.sql.shuffle.partitions": str(PARTITIONS),
        **extra,
    })  # fmt: skip


def ensure_topics(kafka: KafkaService, name: str) -> None:
    kafka.ensure_topics([TopicSpec(f"{name}-events", PARTITIONS), TopicSpec(f"{name}-actions", 1),
                         TopicSpec(f"{name}-alerts", 1)])  # fmt: skip


@dataclass
class Throughput:
    events: int
    brokers: int
    #: the first batch: the registrations, in a fresh query (planning, Python workers, state store)
    first_events: int
    first_s: float
    #: gate opened -> processAllAvailable() returned, for the pre-produced events
    wall_s: float
    batches: int
    batch_s: float
    raw_rate: float
    decode_rate: float

    @property
    def rate(self) -> float:
        return self.events / self.wall_s

    @property
    def batch_rate(self) -> float:
        return self.events / self.batch_s


class FirstBatchGate:
    """Holds the query's first batch open until the load is in Kafka, so the second batch gets all of it.

    ``maxOffsetsPerTrigger`` is unset, so a batch takes everything present when it is planned. The
    first batch of a fresh query also pays for planning, Python workers and the state store; with
    this gate that cost stays out of the measured batch, as it does in a monitor that has been
    running for a while. Only this benchmark's process is patched, and only while the gate exists.
    """

    def __init__(self) -> None:
        from streaming import job

        self.sink_class = job.BatchSink
        self.original = job.BatchSink.__call__
        self.first_done = threading.Event()
        self.release = threading.Event()
        gate = self

        def gated(sink, batch_df, batch_id: int) -> None:
            gate.original(sink, batch_df, batch_id)
            if not gate.first_done.is_set():
                gate.first_done.set()
                gate.release.wait(600)

        self.sink_class.__call__ = gated

    def close(self) -> None:
        self.release.set()
        self.sink_class.__call__ = self.original


def bench_throughput(spark, kafka: KafkaService, redis_url: str, tmp: Path, s: Settings) -> Throughput:
    from streaming import job

    name, bootstrap = "load", kafka.bootstrap_servers
    ensure_topics(kafka, name)
    load = synthetic_load(s.brokers)
    first = produce(bootstrap, f"{name}-events", itertools.islice(load, registrations_count(s.brokers)))
    cfg = job_config(bootstrap, redis_url, name, tmp / f"ckpt-{name}", s,
                     **{"alerts.monitorLagMillis": str(10**13)})  # synthetic event times are years behind
    say(f"throughput: a fresh query over the registrations of {s.brokers} brokers ({first} events)")
    gate = FirstBatchGate()
    try:
        started = time.perf_counter()
        monitor = job.start(spark, cfg, trigger_ms=s.trigger_ms)
        try:
            if not gate.first_done.wait(600):
                raise SystemExit("the query's first batch did not finish within 10 minutes")
            first_s = time.perf_counter() - started
            say(f"throughput:   first batch done after {first_s:.1f} s; producing {s.events} events while it is held")
            t = time.perf_counter()
            n = produce(bootstrap, f"{name}-events", itertools.islice(load, s.events))
            say(f"throughput:   produced in {time.perf_counter() - t:.1f} s; the job takes them in one batch")
            opened = time.perf_counter()
            gate.close()
            monitor.process_all_available()
            wall = time.perf_counter() - opened
            progress = [p for p in monitor.query.recentProgress if p.numInputRows > 0]
            rows = [p.numInputRows for p in progress]
            if not rows or rows[0] != first or sum(rows[1:]) != n:
                raise SystemExit(f"expected a batch of {first} events, then {n} in all; got batches of {rows}")
            # the source can see a partition's end one call late (see the report), so "all at once"
            # may still be two batches
            batches, batch_s = len(rows) - 1, sum(p.batchDuration for p in progress[1:]) / 1000
        finally:
            monitor.stop()
        if monitor.query.exception() is not None:
            raise SystemExit(f"the query failed: {monitor.query.exception()}")
    finally:
        gate.close()

    raw_n, raw_s = raw_consume(bootstrap, f"{name}-events", decode=False)
    dec_n, dec_s = raw_consume(bootstrap, f"{name}-events", decode=True)
    if raw_n != first + n or dec_n != first + n:
        raise SystemExit(f"kafka-python read {raw_n}/{dec_n} records, {first + n} were produced")
    r = Throughput(n, s.brokers, first, first_s, wall, batches, batch_s, raw_n / raw_s, dec_n / dec_s)
    say(f"throughput:   kafka-python assign+seek over the same {raw_n} records: {r.raw_rate:,.0f}/s raw, "
        f"{r.decode_rate:,.0f}/s decoding")
    say(f"throughput:   {r.rate:,.0f} events/s through the job ({wall:.1f} s; {batches} batch(es), {batch_s:.1f} s), "
        f"{r.rate / r.raw_rate:.3f}x raw kafka-python")
    return r


# --------------------------------------------------------------------------- 2. and 3. on real nodes


def register(client, *, name: str, addr: str, topics: list[str], timeout_ms: int | None) -> None:
    """REGISTER_BROKER as a RocketMQ 5 broker sends it; sent again unchanged it is a heartbeat."""
    from namesrv.protocol import bodies
    from namesrv.protocol.codes import RequestCode, ResponseCode
    from namesrv.protocol.types import DataVersion, RegisterBrokerBody, TopicConfig

    body = RegisterBrokerBody(data_version=DataVersion(1, 0, T0),
                              topic_config_table={t: TopicConfig(t, 4, 4) for t in [*topics, CLUSTER]},
                              filter_server_list=[])  # fmt: skip
    raw = bodies.encode_register_broker_body(body, compressed=False)
    ext = {"brokerName": name, "brokerAddr": addr, "clusterName": CLUSTER, "brokerId": "0", "haServerAddr": addr,
           "enableActingMaster": "false", "compressed": "false", "bodyCrc32": str(bodies.body_crc32(raw))}  # fmt: skip
    if timeout_ms is not None:
        ext["heartbeatTimeoutMillis"] = str(timeout_ms)
    response = client.call(RequestCode.REGISTER_BROKER, ext, raw)
    if response is None or response.code != ResponseCode.SUCCESS:
        raise SystemExit(f"REGISTER_BROKER {name} {addr} at {client.addr} failed: {response}")


def routed(client, topic: str) -> bool:
    from namesrv.protocol.codes import RequestCode, ResponseCode

    response = client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    return response is not None and response.code == ResponseCode.SUCCESS


@dataclass
class Live:
    trigger_ms: int
    delay_ms: int
    tick_ms: int
    timeout_ms: int
    route_ms: list[float] = field(default_factory=list)
    #: registration -> its REGISTER event readable in Kafka
    route_kafka_ms: list[float] = field(default_factory=list)
    route_batches_ms: list[int] = field(default_factory=list)
    expiry_ms: list[float] = field(default_factory=list)
    local_expiry_ms: list[float] = field(default_factory=list)
    #: deadline -> the EXPIRE action readable in Kafka
    expiry_kafka_ms: list[float] = field(default_factory=list)
    scan_interval_ms: int = 0
    applied: list[int] = field(default_factory=list)


def wait_for(check: Callable[[], object], timeout: float, what: str, period: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(period)


class Tail(threading.Thread):
    """Reads a topic from its end and notes when each record of interest became readable (wall ms).

    It splits each latency in two: before the record is in Kafka (node publisher, or the job's
    decision) and after it (the job's next batches, or the nodes' action consumers).
    """

    def __init__(self, bootstrap: str, topic: str, key: Callable[[bytes], str | None]) -> None:
        super().__init__(name=f"tail-{topic}", daemon=True)
        from kafka import TopicPartition

        self.consumer = kafka_clients.consumer(bootstrap, fetch_max_wait_ms=10)  # fmt: skip
        parts = self.consumer.partitions_for_topic(topic) or {0}
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        self.consumer.assign(tps)
        self.consumer.seek_to_end(*tps)
        for tp in tps:
            self.consumer.position(tp)  # resolve "end" now, before anything of interest is written
        self.key = key
        self.seen: dict[str, int] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopped.is_set():
                for records in self.consumer.poll(timeout_ms=50).values():
                    at = wall_ms()
                    for r in records:
                        k = self.key(r.value)
                        if k is not None:
                            self.seen.setdefault(k, at)
        finally:
            self.consumer.close()

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)


def registered_broker(value: bytes) -> str | None:
    e = decode_event(value)
    return e.broker_name if e.type is EventType.REGISTER else None


def expired_broker(value: bytes) -> str | None:
    from namesrv.events.schema import ActionType, decode_action

    a = decode_action(value)
    return a.broker_addr if a.type is ActionType.EXPIRE else None


def bench_routes(monitor, lookup, nodes, s: Settings, out: Live, stack: contextlib.ExitStack, tail: Tail) -> None:
    from namesrv.client import NameServerClient

    rng = random.Random(7)
    first_batch = len(monitor.status.batch_durations_ms)
    for k in range(s.registrations):
        # a random pause, so registrations land at every phase of the trigger
        time.sleep(0.5 + rng.random())
        topic, name, addr = f"RouteBench{k}", f"route-broker-{k}", f"10.2.0.{k}:10911"
        conns = [stack.enter_context(NameServerClient(n.addr)) for n in nodes]  # open while the bench runs
        started = wall_ms()
        for c in conns:
            register(c, name=name, addr=addr, topics=[topic], timeout_ms=None)
        while lookup.get_raw(topic) is None:
            if wall_ms() - started > 60_000:
                raise SystemExit(f"route of {topic} not in redis 60 s after its registration")
            time.sleep(0.005)
        out.route_ms.append(wall_ms() - started)
        in_kafka = tail.seen.get(name)
        if in_kafka is not None:
            out.route_kafka_ms.append(in_kafka - started)
        say(f"route latency: {topic} in redis after {out.route_ms[-1]:.0f} ms "
            f"(its REGISTER event readable in kafka after {in_kafka - started if in_kafka else '?'} ms)")
    out.route_batches_ms = list(monitor.status.batch_durations_ms[first_batch:])


@dataclass
class Silent:
    name: str
    addr: str
    topic: str
    silent_at: float  # monotonic
    conns: list  # [n1, n2, n0]
    last_wall_ms: list[int] = field(default_factory=lambda: [0, 0, 0])
    gone_wall_ms: list[int | None] = field(default_factory=lambda: [None, None, None])


def bench_expiry(nodes, local, s: Settings, out: Live, stack: contextlib.ExitStack, tail: Tail) -> None:
    """Brokers heartbeat every second to n1, n2 (Kafka) and n0 (local scan), then fall silent one by one."""
    from namesrv.client import NameServerClient

    everyone = [*nodes, local]
    begin = time.monotonic() + 2.5
    brokers = [
        Silent(f"expiry-broker-{k}", f"10.3.0.{k}:10911", f"ExpiryBench{k}", begin + k * 0.73,
               [stack.enter_context(NameServerClient(n.addr)) for n in everyone])
        for k in range(s.expiring)
    ]  # fmt: skip
    pollers = [stack.enter_context(NameServerClient(n.addr)) for n in everyone]
    next_beat = time.monotonic()
    last_deadline = begin + s.expiring * 0.73 + s.timeout_ms / 1000
    say(f"expiry latency: {s.expiring} brokers with heartbeatTimeoutMillis={s.timeout_ms}, silent from "
        f"{begin - time.monotonic():.1f} s on, one every 0.73 s")
    while True:
        now = time.monotonic()
        if now >= next_beat:
            next_beat += 1.0
            for b in brokers:
                if now < b.silent_at:
                    for i, c in enumerate(b.conns):
                        register(c, name=b.name, addr=b.addr, topics=[b.topic], timeout_ms=s.timeout_ms)
                        b.last_wall_ms[i] = wall_ms()  # n0's deadline; a response comes within a millisecond
        for b in brokers:
            if now < b.silent_at:
                continue
            for i, p in enumerate(pollers):
                if b.gone_wall_ms[i] is None and not routed(p, b.topic):
                    b.gone_wall_ms[i] = wall_ms()
        if all(None not in b.gone_wall_ms for b in brokers):
            break
        if now > last_deadline + 60:
            missing = [(b.name, i) for b in brokers for i, g in enumerate(b.gone_wall_ms) if g is None]
            raise SystemExit(f"expiry: still routed 60 s after their deadline (broker, node index): {missing}")
        time.sleep(0.01)

    for b in brokers:
        # the deadline the monitor works from: the latest event time either node published for the broker
        seen = [n.call(n.running.kafka.publisher.last_event_time, CLUSTER, b.addr) for n in nodes]
        deadline = max(seen) + s.timeout_ms
        out.expiry_ms.append(max(b.gone_wall_ms[0], b.gone_wall_ms[1]) - deadline)
        out.local_expiry_ms.append(b.gone_wall_ms[2] - (b.last_wall_ms[2] + s.timeout_ms))
        decided = tail.seen.get(b.addr)
        if decided is not None:
            out.expiry_kafka_ms.append(decided - deadline)
        say(f"expiry latency: {b.name}: monitor {out.expiry_ms[-1]:.0f} ms (EXPIRE readable in kafka after "
            f"{decided - deadline if decided else '?'} ms), local scan {out.local_expiry_ms[-1]:.0f} ms")


def bench_live(spark, kafka: KafkaService, redis_url: str, tmp: Path, s: Settings) -> Live:
    from streaming import job
    from streaming.routes import RouteLookup
    from tests.support.node import running_node

    name = "live"
    ensure_topics(kafka, name)
    cfg = job_config(kafka.bootstrap_servers, redis_url, name, tmp / "ckpt-live", s, **{
        "monitor.watermarkDelayMillis": str(s.delay_ms),
        "monitor.heartbeatIntervalMillis": "1000",
    })  # fmt: skip
    node_conf = dict(kafkaBootstrapServers=kafka.bootstrap_servers, eventsTopic=f"{name}-events",
                     actionsTopic=f"{name}-actions", tickIntervalMillis=str(s.tick_ms))  # fmt: skip
    out = Live(s.trigger_ms, s.delay_ms, s.tick_ms, s.timeout_ms)
    tails: list[Tail] = []
    monitor = job.start(spark, cfg, trigger_ms=s.trigger_ms)
    try:
        with contextlib.ExitStack() as stack:
            n1 = stack.enter_context(running_node(tmp / "n1", nodeName="n1", **node_conf))
            n2 = stack.enter_context(running_node(tmp / "n2", nodeName="n2", **node_conf))
            n0 = stack.enter_context(running_node(tmp / "n0", nodeName="n0"))  # no Kafka: its own expiry scan
            out.scan_interval_ms = n0.running.expiry.interval_ms
            lookup = RouteLookup(redis_url, prefix=f"bench-{name}")
            stack.callback(lookup.close)
            say("live: waiting until both nodes hear the monitor (their local expiry scan off)")
            wait_for(lambda: all(not n.call(lambda n=n: n.running.expiry.enabled) for n in (n1, n2)), 120,
                     "the monitor's heartbeat at both nodes")  # fmt: skip
            wait_for(lambda: monitor.status.batches >= 3, 60, "the query's first batches")
            for topic, key in ((f"{name}-events", registered_broker), (f"{name}-actions", expired_broker)):
                tail = Tail(kafka.bootstrap_servers, topic, key)
                tail.start()
                stack.callback(tail.stop)
                tails.append(tail)
            bench_routes(monitor, lookup, [n1, n2], s, out, stack, tails[0])
            bench_expiry([n1, n2], n0, s, out, stack, tails[1])
            # the Kafka nodes dropped the brokers because they applied the monitor's actions, not on their own
            out.applied = [n.call(lambda n=n: n.running.kafka.action_stats().applied) for n in (n1, n2)]
            if min(out.applied) < s.expiring:
                raise SystemExit(f"the nodes applied {out.applied} actions for {s.expiring} expired brokers")
            if any(n.call(lambda n=n: n.running.expiry.enabled) for n in (n1, n2)):
                raise SystemExit("a Kafka node fell back to its local expiry scan during the run: figures void")
            if monitor.query.exception() is not None:
                raise SystemExit(f"the query failed: {monitor.query.exception()}")
        # the nodes are stopped: let the query go idle, so stopping it does not interrupt a batch
        monitor.process_all_available()
    finally:
        monitor.stop()
    return out


# --------------------------------------------------------------------------- report


def write_report(path: Path, command: str, s: Settings, thr: Throughput, live: Live, total_s: float) -> None:
    def ms(xs: list[float]) -> str:
        if not xs:
            return "not measured"
        return f"{median(xs):,.0f} ms (min {min(xs):,.0f}, max {max(xs):,.0f}, n={len(xs)})"

    batch_med = median(live.route_batches_ms)
    lines = [
        "# Streaming liveness monitor benchmark",
        "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, shared machine; "
        f"{total_s:.0f} s in all). Real noida-db and Redis on loopback, Spark `local[2]`, "
        f"{PARTITIONS} event partitions, the job in `namesrv-kafka` format (`kafka.endOffsets={s.end_offsets}`).",
        "Absolute numbers on a shared machine are noise: compare each figure with its reference, measured by the",
        "same run.",
        "",
        "| figure | value | reference (same run) | ratio |",
        "|---|---:|---:|---:|",
        f"| sustained events/s through the job | {thr.rate:,.0f} | kafka-python assign+seek, raw: "
        f"{thr.raw_rate:,.0f}/s | {thr.rate / thr.raw_rate:.3f}x |",
        f"| same, within the batches | {thr.batch_rate:,.0f} | kafka-python, decoding each event: "
        f"{thr.decode_rate:,.0f}/s | {thr.batch_rate / thr.decode_rate:.3f}x |",
        f"| expiry latency, deadline → gone at both nodes (median) | {median(live.expiry_ms):,.0f} ms | "
        f"node's own expiry scan: {median(live.local_expiry_ms):,.0f} ms | "
        f"{median(live.expiry_ms) / median(live.local_expiry_ms):.2f}x |",
        f"| route latency, registration → route in Redis (median) | {median(live.route_ms):,.0f} ms | "
        f"trigger {live.trigger_ms} ms + median batch {batch_med:,.0f} ms = {live.trigger_ms + batch_med:,.0f} ms | "
        f"{median(live.route_ms) / (live.trigger_ms + batch_med):.2f}x |",
        "",
        "## How each figure is made",
        "",
        f"- **Throughput**: a load of {thr.brokers:,} brokers with synthetic event times: a REGISTER through each "
        "of two nodes, then a HEARTBEAT through each every 10 s of event time, and TICKs. A fresh query "
        f"(`maxOffsetsPerTrigger` unset) takes the {thr.first_events:,} registrations in its first batch "
        f"({thr.first_s:.1f} s from `start()`, planning, Python workers and state store included); that batch is "
        f"held open while {thr.events:,} more events are produced, so the next batch can take them all. "
        f"Timed from releasing it until `processAllAvailable()` returns: {thr.wall_s:.1f} s ({thr.batches} "
        f"batch(es) took them, {thr.batch_s:.1f} s of batches). The reference reads the whole topic with one "
        "kafka-python consumer (`assign()`, `seek(0)`, `poll()` to the end offsets), as the source's tasks do.",
        f"- **Expiry latency**: {len(live.expiry_ms)} brokers register with `heartbeatTimeoutMillis={live.timeout_ms}` "
        "at two in-process nodes with Kafka (n1, n2) and one without (n0), re-register every second, then fall "
        "silent 0.73 s apart. Deadline = the latest event time n1 or n2 published for the broker + timeout "
        "(wall clock: nodes stamp events with it); gone = the first poll (every ~10 ms, GET_ROUTEINFO_BY_TOPIC) "
        f"that finds the topic missing at both. Job: watermark delay {live.delay_ms} ms, trigger {live.trigger_ms} ms; "
        f"nodes tick every {live.tick_ms} ms. n0 expires with its own scan every {live.scan_interval_ms} ms "
        "(scanNotActiveBrokerInterval default), deadline = its last answered heartbeat + timeout.",
        f"  Per broker, monitor: {ms(live.expiry_ms)}, of which deadline → EXPIRE readable in the actions topic "
        f"(a consumer tailing it): {ms(live.expiry_kafka_ms)}; local scan: {ms(live.local_expiry_ms)}. "
        f"Actions applied by n1, n2: {live.applied} (their local scan stayed off: the monitor decided).",
        f"- **Route latency**: {len(live.route_ms)} new brokers, each registering a new topic at n1 then n2, "
        "0.5-1.5 s apart; from just before the first REGISTER_BROKER until `RouteLookup.get_raw(topic)` "
        f"(polled every 5 ms) finds it: {ms(live.route_ms)}, of which registration → REGISTER event readable in "
        f"the events topic: {ms(live.route_kafka_ms)}. Batches meanwhile: median {batch_med:,.0f} ms, "
        f"max {max(live.route_batches_ms, default=0):,} ms over {len(live.route_batches_ms)} batches.",
        "",
    ]
    path.write_text("\n".join(lines))


# --------------------------------------------------------------------------- main


def interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def settings(args: argparse.Namespace) -> Settings:
    quick = args.quick
    return Settings(
        events=args.events or (20_000 if quick else 100_000),
        brokers=args.brokers,
        expiring=args.expiring or (3 if quick else 8),
        registrations=args.registrations or (3 if quick else 12),
        trigger_ms=args.trigger_ms,
        delay_ms=args.watermark_delay_ms,
        tick_ms=args.tick_ms,
        timeout_ms=args.heartbeat_timeout_ms,
        end_offsets=args.end_offsets,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events and brokers: 1-1.5 min (Spark start-up dominates)")
    parser.add_argument("--events", type=int, help="events for the throughput run (default 100000, quick 20000)")
    parser.add_argument("--brokers", type=int, default=1000, help="brokers in the throughput load")
    parser.add_argument("--expiring", type=int, help="brokers that go silent (default 8, quick 3)")
    parser.add_argument("--registrations", type=int, help="route-latency registrations (default 12, quick 3)")
    parser.add_argument("--trigger-ms", type=int, default=1000, help="micro-batch trigger (conf default 1000)")
    parser.add_argument("--watermark-delay-ms", type=int, default=1000, help="monitor.watermarkDelayMillis, live part")
    parser.add_argument("--tick-ms", type=int, default=500, help="the nodes' tickIntervalMillis, live part")
    parser.add_argument("--heartbeat-timeout-ms", type=int, default=5000,
                        help="heartbeatTimeoutMillis of the brokers that go silent")
    parser.add_argument("--end-offsets", choices=("highwater", "listoffsets"), default="highwater",
                        help="kafka.endOffsets of the job (conf default highwater)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "STREAMING_RESULTS.md")
    parser.add_argument("-v", "--verbose", action="store_true", help="the job's and the nodes' INFO logs too")
    args = parser.parse_args()
    s = settings(args)
    command = shlex.join(["python", "bench/streaming_bench.py", *sys.argv[1:]])

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    if not args.verbose:  # the nodes announce boot and expiry at WARNING; the bench reports those itself
        for noisy in ("namesrv", "py4j", "streaming.alerts"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        # kafka-python logs a socket it closed itself as an ERROR; every figure is checked without it
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    # SIGTERM unwinds like Ctrl-C, so every process below is stopped by PID
    signal.signal(signal.SIGTERM, interrupted)

    begun = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="streaming-bench-") as tmp_name, Stack() as stack:
        tmp = Path(tmp_name)
        kafka = KafkaService(port=free_port(), run_dir=tmp, data_dir=tmp / "kafka")
        redis = RedisService(port=free_port(), run_dir=tmp)
        stack.later("kafka", kafka.stop)
        kafka.start()
        stack.later("redis", redis.stop)
        redis.start()
        say(f"noida-db on {kafka.bootstrap_servers} (pid {kafka.status().pid}), redis on {redis.url} "
            f"(pid {redis.status().pid}); starting Spark local[2]")  # fmt: skip
        spark = start_spark(stack)
        thr = bench_throughput(spark, kafka, redis.url, tmp, s)
        live = bench_live(spark, kafka, redis.url, tmp, s)
    total = time.perf_counter() - begun
    write_report(args.out, command, s, thr, live, total)
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted; every process started was stopped")
        sys.exit(130)
