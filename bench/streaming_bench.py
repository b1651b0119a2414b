"""Measure the Spark liveness monitor on real Apache Kafka, Redis and Spark; write the figures, with the command.

Four figures, each beside a reference this same run measures, because on a shared machine absolute
numbers are noise and ratios are not: (1) events/s through the job in this process, against one
kafka-python consumer reading the same records; (2) expiry latency, deadline to gone at each node and
in Redis, split into legs by the records' Kafka timestamps, against a node's own scan; (3) route
latency, registration to route in Redis; (4) close latency, last close to gone in Redis.  Figures
2-4 run on the stack as ``make run`` starts it, every setting as ``conf/`` ships it but the simulated
brokers' own timeout.  The monitor's latency targets are checked and printed, never failing the run; only a
full run with the shipped settings writes ``bench/STREAMING_RESULTS.md`` by default.  Every process
started is stopped by PID on exit.  ``docs/internals/benchmarks.md`` explains the method.

    .venv/bin/python bench/streaming_bench.py [--quick] [--events 400000] [--out bench/STREAMING_RESULTS.md]
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
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support.system: the stack and the simulated brokers the suite uses

from common import kafka_clients  # noqa: E402
from common.contract import (  # noqa: E402
    DataVersionInfo,
    Event,
    EventType,
    QueueInfo,
    decode_event,
    encode_event,
    event_key,
)
from infra.config import TopicSpec  # noqa: E402
from infra.kafka import KafkaService  # noqa: E402
from infra.processes import free_port  # noqa: E402
from infra.redis import RedisService  # noqa: E402
from streaming.config import CONSUMER_OPTIONS  # noqa: E402
from streaming.events import EVENTS_METRIC  # noqa: E402

CLUSTER = "DefaultCluster"
T0 = 1_700_000_000_000  # synthetic event times of the throughput load start here
PARTITIONS = 2  # events topic partitions of the throughput load, one per local[2] core
STREAMING_CONF = REPO / "conf" / "streaming.properties"
NAMESRV_CONF = REPO / "conf" / "namesrv.properties"


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
    crashing: int
    registrations: int
    timeout_ms: int
    poll_ms: int
    #: events of the batches run before the measured one (0: the measured batch is the second), in how many
    warmup: int = 0
    warmup_batches: int = 1
    #: experiments only: None keeps the shipped value of conf/
    trigger_ms: int | None = None
    delay_ms: int | None = None
    tick_ms: int | None = None
    java_options: str | None = None

    @property
    def experiment(self) -> dict[str, int | str]:
        """The shipped settings this run overrides (empty: the stack as shipped)."""
        keys = {"monitor.triggerIntervalMillis": self.trigger_ms, "monitor.watermarkDelayMillis": self.delay_ms,
                "tickIntervalMillis": self.tick_ms, "spark.driver.extraJavaOptions": self.java_options}  # fmt: skip
        return {k: v for k, v in keys.items() if v is not None}


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


def start_backends(stack: Stack, tmp: Path) -> tuple[KafkaService, RedisService]:
    """Apache Kafka (one KRaft node) and Redis on free loopback ports, stopped with ``stack``."""
    kafka = KafkaService(port=free_port(), run_dir=tmp, data_dir=tmp / "kafka")
    redis = RedisService(port=free_port(), run_dir=tmp)
    stack.later("kafka", kafka.stop)
    kafka.start()
    stack.later("redis", redis.stop)
    redis.start()
    return kafka, redis


def start_spark(stack: Stack, partitions: str | None = str(PARTITIONS), java_options: str | None = None):
    """Spark ``local[2]`` with ``conf/streaming.properties``; ``partitions``: shuffle partitions (None: as shipped),
    ``java_options``: the driver JVM's ``spark.driver.extraJavaOptions`` (None: as shipped)."""
    from streaming.config import load_config
    from streaming.session import build_spark

    overrides = {"spark.master": "local[2]"}
    if partitions is not None:
        overrides["spark.sql.shuffle.partitions"] = partitions
    if java_options is not None:
        overrides["spark.driver.extraJavaOptions"] = java_options
    cfg = load_config(STREAMING_CONF, overrides)
    spark = build_spark(cfg)
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
                    topics = {
                        f"T{i % 200}": QueueInfo(8, 8, 6),
                        f"B{i}": QueueInfo(4, 4, 6),
                        CLUSTER: QueueInfo(1, 1, 7),
                    }
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


def events_read(progress: Any) -> int:
    """Events a micro-batch read, from the job's observed ``events`` metric (its rows are bundles)."""
    metric = progress.observedMetrics.get(EVENTS_METRIC)
    return int(metric["events"]) if metric is not None else 0


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

    return load_config(STREAMING_CONF, {
        "kafka.bootstrap": bootstrap,
        "kafka.eventsTopic": f"{name}-events",
        "kafka.actionsTopic": f"{name}-actions",
        "kafka.alertsTopic": f"{name}-alerts",
        "kafka.maxOffsetsPerTrigger": "",
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
    #: events of the warm-up batches between the first and the measured one (0: none)
    warmup: int = 0
    warmup_batches: int = 0
    #: CPU seconds of the Spark JVM's compiler threads (JIT), and of its other threads, while measured
    jit_s: float = 0.0
    jvm_other_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.events / self.wall_s

    @property
    def batch_rate(self) -> float:
        return self.events / self.batch_s


#: the measured backlog: a batch of several seconds, so that what a batch pays once (the trigger's wait, planning,
#: commits, the JIT still compiling) weighs in it as in a backlog being worked off; in a 1.3 s batch of 100,000 it
#: was a fifth of the time (0.34x raw then, 0.60-0.66x with 400,000: bench/STREAMING_RESULTS.md)
SUSTAINED_EVENTS = 400_000


class BatchGate:
    """Holds a batch open once it is done until the next load is in Kafka, so the batch after it gets all of it.

    ``maxOffsetsPerTrigger`` is unset, so a batch takes everything present when it is planned. The
    query's first batch is held; :meth:`open` lets it go and says whether to hold the next one too. The
    first batch of a fresh query pays for planning, Python workers and the state store, and the first
    big one for the JVM compiling the code a batch runs (its JIT): a warm-up batch
    between them keeps both out of the measured batch, as in a monitor that has been running for a
    while. Only this benchmark's process is patched, and only while the gate exists.
    """

    def __init__(self) -> None:
        from streaming.sink import BatchSink

        self.sink_class = BatchSink
        self.original = BatchSink.__call__
        self.armed = True
        self.held = threading.Event()
        self.release = threading.Event()
        gate = self

        def gated(sink, batch_df, batch_id: int) -> None:
            gate.original(sink, batch_df, batch_id)
            if gate.armed:
                gate.armed = False
                release = gate.release
                gate.held.set()
                release.wait(600)

        self.sink_class.__call__ = gated

    def wait_held(self, what: str) -> None:
        if not self.held.wait(600):
            raise SystemExit(f"{what} did not finish within 10 minutes")

    def open(self, *, hold_next: bool) -> None:
        release, self.release = self.release, threading.Event()
        self.held.clear()
        self.armed = hold_next
        release.set()

    def close(self) -> None:
        self.armed = False
        self.release.set()
        self.sink_class.__call__ = self.original


def spark_jvm_cpu() -> dict[str, float]:
    """CPU seconds of this process's Spark JVM so far, per kind of thread: ``jit`` (its compilers) and ``other``."""
    from common import procfs

    out = {"jit": 0.0, "other": 0.0}
    ticks = os.sysconf("SC_CLK_TCK")
    for st in procfs.descendants(os.getpid()):
        command = procfs.cmdline(st.pid) or []
        if not (command and command[0].endswith("java") and "org.apache.spark.deploy.SparkSubmit" in command):
            continue
        for task in Path(f"/proc/{st.pid}/task").iterdir():
            try:
                text = (task / "stat").read_text()
            except OSError:  # a thread that ended
                continue
            name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
            kind = "jit" if name.startswith(("C1 CompilerThre", "C2 CompilerThre")) else "other"
            out[kind] += (int(fields[11]) + int(fields[12])) / ticks
    return out


def bench_throughput(spark, kafka: KafkaService, redis_url: str, tmp: Path, s: Settings) -> Throughput:
    from streaming import job

    name, bootstrap = "load", kafka.bootstrap_servers
    ensure_topics(kafka, name)
    load = synthetic_load(s.brokers)
    first = produce(bootstrap, f"{name}-events", itertools.islice(load, registrations_count(s.brokers)))
    cfg = job_config(
        bootstrap, redis_url, name, tmp / f"ckpt-{name}", s, **{"alerts.monitorLagMillis": str(10**13)}
    )  # synthetic event times are years behind
    say(f"throughput: a fresh query over the registrations of {s.brokers} brokers ({first} events)")
    gate = BatchGate()
    try:
        started = time.perf_counter()
        monitor = job.start(spark, cfg, trigger_ms=s.trigger_ms)
        try:
            gate.wait_held("the query's first batch")
            first_s = time.perf_counter() - started
            say(f"throughput:   first batch done after {first_s:.1f} s")
            warm_batches = [s.warmup // s.warmup_batches] * s.warmup_batches if s.warmup else []
            t = time.perf_counter()
            for size in warm_batches:
                produce(bootstrap, f"{name}-events", itertools.islice(load, size))
                gate.open(hold_next=True)
                gate.wait_held("a warm-up batch")
            warm = sum(warm_batches)
            if warm:
                say(f"throughput:   {len(warm_batches)} warm-up batches of {warm_batches[0]} events in "
                    f"{time.perf_counter() - t:.1f} s")  # fmt: skip
            say(f"throughput:   producing {s.events} events while the last batch is held")
            t = time.perf_counter()
            n = produce(bootstrap, f"{name}-events", itertools.islice(load, s.events))
            say(f"throughput:   produced in {time.perf_counter() - t:.1f} s; the job takes them in one batch")
            cpu_before = spark_jvm_cpu()
            opened = time.perf_counter()
            gate.open(hold_next=False)
            monitor.process_all_available()
            wall = time.perf_counter() - opened
            cpu = {k: v - cpu_before[k] for k, v in spark_jvm_cpu().items()}
            # the rows may be bundles of events (streaming.events): count the events
            progress = [p for p in monitor.query.recentProgress if events_read(p) > 0]
            rows = [events_read(p) for p in progress]
            before = [first, *warm_batches]
            if rows[: len(before)] != before or sum(rows[len(before) :]) != n:
                raise SystemExit(f"expected batches of {before} events, then {n} in all; got batches of {rows}")
            measured = progress[len(before) :]
            batches, batch_s = len(measured), sum(p.batchDuration for p in measured) / 1000
            for p in measured:  # where a measured batch's time went, as Spark splits it
                say(
                    f"throughput:   batch {p.batchId}: {events_read(p)} events in {p.numInputRows} rows, "
                    f"durationMs {dict(p.durationMs)}"
                )
        finally:
            monitor.stop()
        if monitor.query.exception() is not None:
            raise SystemExit(f"the query failed: {monitor.query.exception()}")
    finally:
        gate.close()

    raw_n, raw_s = raw_consume(bootstrap, f"{name}-events", decode=False)
    dec_n, dec_s = raw_consume(bootstrap, f"{name}-events", decode=True)
    if raw_n != first + warm + n or dec_n != first + warm + n:
        raise SystemExit(f"kafka-python read {raw_n}/{dec_n} records, {first + warm + n} were produced")
    r = Throughput(n, s.brokers, first, first_s, wall, batches, batch_s, raw_n / raw_s, dec_n / dec_s, warm,
                   len(warm_batches), cpu["jit"], cpu["other"])  # fmt: skip
    say(
        f"throughput:   kafka-python assign+seek over the same {raw_n} records: {r.raw_rate:,.0f}/s raw, "
        f"{r.decode_rate:,.0f}/s decoding"
    )
    say(
        f"throughput:   {r.rate:,.0f} events/s through the job ({wall:.1f} s; {batches} batch(es), {batch_s:.1f} s), "
        f"{r.rate / r.raw_rate:.3f}x raw kafka-python; the Spark JVM meanwhile {r.jit_s:.2f} s of CPU compiling "
        f"(JIT), {r.jvm_other_s:.2f} s besides"
    )
    return r


# --------------------------------------------------------------------------- 2., 3. and 4. on the stack as shipped

#: the monitor's latency targets (docs/monitor.md, "How fast"), milliseconds
EXPIRY_MEDIAN_MS, EXPIRY_MAX_MS, CLOSE_MAX_MS = 1_000, 2_000, 2_000
#: between two brokers silenced (or crashed): deadlines fall at every phase of the ticks and the trigger
STAGGER_S = 0.73
KAFKA_NODES = ("n1", "n2")


def register(client, *, name: str, addr: str, topics: list[str], timeout_ms: int | None) -> None:
    """REGISTER_BROKER as a RocketMQ 5 broker sends it; sent again unchanged it is a heartbeat."""
    from common.protocol import bodies
    from common.protocol.codes import RequestCode, ResponseCode
    from common.protocol.types import DataVersion, RegisterBrokerBody, TopicConfig

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


def wait_for(check: Callable[[], object], timeout: float, what: str, period: float = 0.05,
             state: Callable[[], object] | None = None) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            seen = f"; last seen: {state()}" if state is not None else ""
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}{seen}")
        time.sleep(period)


class Watcher(threading.Thread):
    """Asks every place which brokers it knows, every ``interval`` s, and notes when watched brokers left.

    Places are nodes (GET_BROKER_CLUSTER_INFO on a connection kept open) and ``redis`` (the cluster
    info the job materialises).  A broker counts as known where its group has an address, as
    clients see it.  A place that fails to answer is skipped for that round, never taken as "gone".
    """

    def __init__(self, nodes: dict[str, str], redis_url: str, interval: float) -> None:
        super().__init__(name="bench-watcher", daemon=True)
        from streaming.routes import RouteLookup

        self.addrs = nodes
        self.clients: dict[str, Any] = {}
        self.lookup = RouteLookup(redis_url)
        self.interval = interval
        self.lock = threading.Lock()
        #: place -> the brokers it knew at its last answer
        self.known: dict[str, set[str]] = {}
        #: broker -> place -> the first wall ms it was missing there, once watched
        self.left: dict[str, dict[str, int]] = {}
        #: batchId -> the wall ms its Redis write was first seen
        self.writes: dict[int, int] = {}
        self.round_ms: list[int] = []
        self.failures: Counter[str] = Counter()
        self.last_failure = ""
        self.stopped = threading.Event()

    def _brokers_at(self, place: str) -> set[str]:
        from namesrv.client import NameServerClient

        if place == "redis":
            status = self.lookup.status()
            if "batchId" in status:
                with self.lock:
                    self.writes.setdefault(int(status["batchId"]), wall_ms())
            info = self.lookup.cluster_info()
            table = {} if info is None else info[0]
        else:
            if place not in self.clients:
                self.clients[place] = NameServerClient(self.addrs[place], timeout=2.0)
            table = self.clients[place].cluster_info()[0]
        return {name for name, b in table.items() if b.broker_addrs}

    def run(self) -> None:
        while not self.stopped.is_set():
            began = wall_ms()
            for place in [*self.addrs, "redis"]:
                try:
                    names = self._brokers_at(place)
                except Exception as exc:  # noqa: BLE001 - a place that does not answer is not "gone"
                    self.failures[place] += 1
                    self.last_failure = f"{place}: {exc!r}"
                    client = self.clients.pop(place, None)
                    if client is not None:
                        client.close()
                    continue
                at = wall_ms()
                with self.lock:
                    self.known[place] = names
                    for broker, left in self.left.items():
                        if broker not in names:
                            left.setdefault(place, at)
            self.round_ms.append(wall_ms() - began)
            self.stopped.wait(self.interval)

    def watch(self, broker: str) -> None:
        """From the next answer on, note where ``broker`` is missing."""
        with self.lock:
            self.left[broker] = {}

    def knows(self, broker: str, places: tuple[str, ...]) -> bool:
        with self.lock:
            return all(broker in self.known.get(p, ()) for p in places)

    def gone(self, broker: str) -> dict[str, int]:
        with self.lock:
            return dict(self.left[broker])

    def last_write(self) -> int:
        with self.lock:
            return max(self.writes, default=-1)

    def writes_between(self, start_ms: int, end_ms: int) -> int:
        """How many batches' Redis writes were first seen within (start_ms, end_ms)."""
        with self.lock:
            return sum(1 for at in self.writes.values() if start_ms < at < end_ms)

    def write_intervals(self, after: int) -> list[int]:
        """Milliseconds between consecutive batches' Redis writes seen, for batches after ``after``."""
        with self.lock:
            seen = sorted((b, at) for b, at in self.writes.items() if b > after)
        return [y[1] - x[1] for x, y in itertools.pairwise(seen) if y[0] == x[0] + 1]

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)
        for client in self.clients.values():
            client.close()
        self.lookup.close()


@dataclass(frozen=True)
class Rec:
    """A record of a topic: its Kafka timestamp (epoch ms) and its decoded value."""

    partition: int
    offset: int
    ts: int
    ts_type: int
    value: Any


def read_topic(bootstrap: str, topic: str, decode: Callable[[bytes], Any]) -> list[Rec]:
    """Every record of ``topic`` once, with ``assign()`` + ``seek(0)`` as the job's source reads; bad ones skipped."""
    from kafka import TopicPartition

    consumer = kafka_clients.consumer(bootstrap, auto_offset_reset="none", fetch_max_wait_ms=10)
    try:
        deadline = time.monotonic() + 15
        while not (parts := consumer.partitions_for_topic(topic)):  # None until the metadata has it
            if time.monotonic() > deadline:
                raise SystemExit(f"topic {topic} not found at {bootstrap}")
            time.sleep(0.1)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        out = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for tp, records in consumer.poll(timeout_ms=200, max_records=8192).items():
                for r in records:
                    try:
                        value = decode(r.value)
                    except (ValueError, TypeError):
                        continue
                    out.append(Rec(tp.partition, r.offset, r.timestamp, r.timestamp_type, value))
        return out
    finally:
        consumer.close()


@dataclass
class Topics:
    """The events and actions topics after the run, indexed as the legs need them."""

    events: list[Rec]
    actions: list[Rec]

    @classmethod
    def read(cls, bootstrap: str) -> Topics:
        from common.contract import decode_action
        from tests.support.system import ACTIONS, EVENTS

        return cls(read_topic(bootstrap, EVENTS, decode_event), read_topic(bootstrap, ACTIONS, decode_action))

    def of(self, addr: str, *types: EventType) -> list[Rec]:
        return [r for r in self.events if r.value.broker_addr == addr and r.value.type in types]

    def action(self, addr: str, atype: str) -> Rec | None:
        found = [r for r in self.actions if r.value.broker_addr == addr and str(r.value.type) == atype]
        return min(found, key=lambda r: r.offset, default=None)

    def first_past(self, event_time: int) -> Rec | None:
        """The first event in Kafka (by record timestamp) whose event time is past ``event_time``."""
        return min((r for r in self.events if r.value.event_time > event_time), key=lambda r: r.ts, default=None)

    def timestamp_types(self) -> set[int]:
        return {r.ts_type for r in [*self.events, *self.actions]}


@dataclass
class Live:
    """What figures 2-4 measured; every list is per broker, in milliseconds."""

    #: (key, value) of every setting that matters, as the processes read them
    settings: list[tuple[str, str]] = field(default_factory=list)
    experiment: dict[str, int | str] = field(default_factory=dict)
    timeout_ms: int = 0
    poll_ms: int = 0
    poll_round_ms: float = 0.0
    timestamp_types: set[int] = field(default_factory=set)
    route_ms: list[float] = field(default_factory=list)
    #: registration -> its REGISTER event's record timestamp
    route_kafka_ms: list[float] = field(default_factory=list)
    write_interval_ms: list[float] = field(default_factory=list)
    #: deadline -> gone at a place ("n1", "n2", "redis", "everywhere": the latest of the three, "n0")
    expiry: dict[str, list[float]] = field(default_factory=dict)
    #: the legs a-e (d per node)
    legs: dict[str, list[float]] = field(default_factory=dict)
    #: which event (type at node) first moved event time past each deadline
    movers: Counter[str] = field(default_factory=Counter)
    #: last close -> gone at a place ("n1", "n2", "redis")
    close: dict[str, list[float]] = field(default_factory=dict)
    close_legs: dict[str, list[float]] = field(default_factory=dict)

    def add(self, table: dict[str, list[float]], key: str, value: float) -> None:
        table.setdefault(key, []).append(value)


def shipped_settings(system) -> list[tuple[str, str]]:
    """The settings the job and the nodes run with, read from the conf files with the stack's overrides."""
    from infra.config import DEFAULT_TOPICS
    from namesrv.config import load_config as node_config
    from streaming.config import load_config as job_config_of

    job = job_config_of(STREAMING_CONF, system.streaming_overrides())
    node = node_config(NAMESRV_CONF, system.node_properties(0, warm_start=False))
    events = next(t for t in DEFAULT_TOPICS if t.name == job.events_topic)
    return [
        ("monitor.watermarkDelayMillis", f"{job.watermark_delay_millis:,}"),
        ("monitor.triggerIntervalMillis", f"{job.trigger_interval_millis:,}"),
        ("monitor.heartbeatIntervalMillis", f"{job.monitor_heartbeat_interval_millis:,}"),
        ("monitor.maxClockSkewMillis", f"{job.max_clock_skew_millis:,}"),
        ("monitor.removeOnChannelClose", str(job.remove_on_channel_close).lower()),
        ("spark.master", job.spark.get("spark.master", "")),
        ("spark.sql.shuffle.partitions", job.spark.get("spark.sql.shuffle.partitions", "(Spark's default)")),
        ("kafka.format", job.kafka_format),
        *((f"source option {k}", v) for k, v in CONSUMER_OPTIONS.items()),
        ("events topic partitions", str(events.partitions)),
        ("nodes: tickIntervalMillis", f"{node.tick_interval_millis:,}"),
        ("nodes: monitorSilenceFallbackMillis", f"{node.monitor_silence_fallback_millis:,}"),
        ("nodes: scanNotActiveBrokerInterval (n0)", f"{node.scan_not_active_broker_interval:,}"),
    ]


def bench_routes(lookup, addrs: list[str], s: Settings, stack: contextlib.ExitStack) -> list[tuple[str, int, int]]:
    """New brokers register a new topic at both nodes; returns (brokerName, registered at, in Redis at)."""
    from namesrv.client import NameServerClient

    rng = random.Random(7)
    out = []
    for k in range(s.registrations):
        # a random pause, so registrations land at every phase of the trigger
        time.sleep(0.5 + rng.random())
        topic, name, addr = f"RouteBench{k}", f"route-broker-{k}", f"10.2.0.{k}:10911"
        conns = [stack.enter_context(NameServerClient(a)) for a in addrs]  # open while the bench runs
        started = wall_ms()
        for c in conns:
            register(c, name=name, addr=addr, topics=[topic], timeout_ms=None)
        while lookup.get_raw(topic) is None:
            if wall_ms() - started > 60_000:
                raise SystemExit(f"route of {topic} not in redis 60 s after its registration")
            time.sleep(0.005)
        out.append((name, started, wall_ms()))
        say(f"route latency: {topic} in redis after {out[-1][2] - started:,} ms")
    return out


def add_fleets(runner, system, prefix: str, count: int, addrs: list[str], port_base: int) -> dict[str, tuple[str, str]]:
    """``count`` one-broker fleets at ``addrs``; fleet name -> (brokerName, brokerAddr)."""
    fleets = {}
    for k in range(count):
        name = f"{prefix}{k}"
        runner.add(name, addrs, system.timing, addr_base=f"127.0.0.1:{port_base + 10 * k}")
        fleets[name] = runner.broker(name)
    return fleets


def bench_expiry(system, runner, watcher: Watcher, n0_addr: str, s: Settings) -> dict[str, tuple[str, str]]:
    """Brokers at n1, n2 (Kafka) and n0 (its own scan) fall silent one by one, connections left open."""
    fleets = add_fleets(runner, system, "quiet", s.expiring, [*system.node_addrs, n0_addr], 43000)
    places = ("n1", "n2", "redis", "n0")
    wait_for(lambda: all(watcher.knows(b, places) for b, _ in fleets.values()), 120,
             f"{s.expiring} brokers at n1, n2, n0 and in Redis")  # fmt: skip
    say(
        f"expiry latency: {s.expiring} brokers with heartbeatTimeoutMillis={s.timeout_ms} fall silent, "
        f"one every {STAGGER_S} s"
    )
    for name, (broker, _) in fleets.items():
        watcher.watch(broker)
        runner.silence(name)
        time.sleep(STAGGER_S)
    wait_for(lambda: all(watcher.gone(b).keys() >= set(places) for b, _ in fleets.values()),
             s.timeout_ms / 1000 + 120, "every silent broker gone at n1, n2, n0 and in Redis",
             state=lambda: {b: watcher.gone(b) for b, _ in fleets.values()})  # fmt: skip
    return fleets


def bench_close(system, runner, watcher: Watcher, s: Settings) -> dict[str, tuple[str, str, int]]:
    """Brokers at n1 and n2 crash one by one: their sockets close at both nodes, no UNREGISTER_BROKER.

    Returns fleet name -> (brokerName, brokerAddr, wall ms just after the last socket closed).
    """
    fleets = add_fleets(runner, system, "crash", s.crashing, system.node_addrs, 44000)
    places = ("n1", "n2", "redis")
    wait_for(lambda: all(watcher.knows(b, places) for b, _ in fleets.values()), 120,
             f"{s.crashing} brokers at n1, n2 and in Redis")  # fmt: skip
    say(f"close latency: {s.crashing} brokers crash (sockets closed at both nodes), one every {STAGGER_S} s")
    closed = {}
    for name, (broker, addr) in fleets.items():
        watcher.watch(broker)
        runner.crash(name)  # as a SIGKILL: the kernel closes the sockets; nothing reconnects
        closed[name] = (broker, addr, wall_ms())
        time.sleep(STAGGER_S)
    wait_for(lambda: all(watcher.gone(b).keys() >= set(places) for b, _ in fleets.values()), 120,
             "every crashed broker gone at n1, n2 and in Redis",
             state=lambda: {b: watcher.gone(b) for b, _ in fleets.values()})  # fmt: skip
    return closed


def expiry_legs(
    out: Live, topics: Topics, watcher: Watcher, fleets: dict[str, tuple[str, str]], timeout_ms: int
) -> None:
    for broker, addr in fleets.values():
        beats = topics.of(addr, EventType.REGISTER, EventType.HEARTBEAT)
        if not beats:
            raise SystemExit(f"no REGISTER/HEARTBEAT event of {broker} ({addr}) in the events topic")
        deadline = max(r.value.event_time for r in beats) + timeout_ms
        gone = watcher.gone(broker)
        early = {p: deadline - at for p, at in gone.items() if at < deadline - 50}
        if early:
            raise SystemExit(f"{broker} gone before its deadline (ms early, per place): {early}; figures void")
        for place in (*KAFKA_NODES, "redis", "n0"):
            out.add(out.expiry, place, gone[place] - deadline)
        out.add(out.expiry, "everywhere", max(gone[p] for p in (*KAFKA_NODES, "redis")) - deadline)
        past, expire = topics.first_past(deadline), topics.action(addr, "EXPIRE")
        if expire is None:
            raise SystemExit(f"{broker} ({addr}) left without an EXPIRE action: the monitor did not decide it")
        if past is None:
            raise SystemExit(f"no event past {broker}'s deadline, yet an EXPIRE: the bench misreads the topics")
        legs = {"a": past.value.event_time - deadline, "b": past.ts - past.value.event_time, "c": expire.ts - past.ts,
                **{f"d {n}": gone[n] - expire.ts for n in KAFKA_NODES}, "e": gone["redis"] - expire.ts}  # fmt: skip
        for k, v in legs.items():
            out.add(out.legs, k, v)
        # the job writes Redis at the end of every batch: the writes within leg c are the batches that
        # finished after the event was in Kafka and before the one that decided
        out.add(out.legs, "c batches", watcher.writes_between(past.ts, expire.ts))
        out.movers[f"{past.value.type} from {past.value.node}"] += 1
        say(
            f"expiry latency: {broker}: deadline -> gone n1 {gone['n1'] - deadline:,} ms, n2 {gone['n2'] - deadline:,}"
            f", redis {gone['redis'] - deadline:,} (legs a {legs['a']:,} [{past.value.type} from {past.value.node}], "
            f"b {legs['b']:,}, c {legs['c']:,}, d {legs['d n1']:,}/{legs['d n2']:,}, e {legs['e']:,}); "
            f"n0's own scan {gone['n0'] - deadline:,} ms"
        )


def close_legs(out: Live, topics: Topics, watcher: Watcher, closed: dict[str, tuple[str, str, int]]) -> None:
    for broker, addr, at in closed.values():
        gone = watcher.gone(broker)
        for place in (*KAFKA_NODES, "redis"):
            out.add(out.close, place, gone[place] - at)
        closes = topics.of(addr, EventType.CHANNEL_CLOSED)
        remove = topics.action(addr, "REMOVE")
        if remove is None:
            raise SystemExit(f"{broker} ({addr}) crashed and no REMOVE followed: the monitor did not decide it")
        if len({r.value.node for r in closes}) < len(KAFKA_NODES):
            raise SystemExit(f"{broker}: CHANNEL_CLOSED from {sorted({r.value.node for r in closes})} only")
        last = max(closes, key=lambda r: r.ts)
        legs = {"close -> CHANNEL_CLOSED in kafka": last.ts - at, "-> REMOVE": remove.ts - last.ts,
                "REMOVE -> gone in redis": gone["redis"] - remove.ts}  # fmt: skip
        for k, v in legs.items():
            out.add(out.close_legs, k, v)
        out.add(out.close_legs, "batches", watcher.writes_between(last.ts, remove.ts))
        say(
            f"close latency: {broker}: last close -> gone in redis {gone['redis'] - at:,} ms (CHANNEL_CLOSED in "
            f"kafka {legs['close -> CHANNEL_CLOSED in kafka']:,}, REMOVE +{legs['-> REMOVE']:,}, redis "
            f"+{legs['REMOVE -> gone in redis']:,}); at n1 {gone['n1'] - at:,}, n2 {gone['n2'] - at:,}"
        )


def fallback_logged(system) -> list[int]:
    """Nodes (1-based) that logged switching their own expiry scan back on: the monitor was not deciding."""
    return [i + 1 for i in range(len(system.nodes)) if "local expiry scan back on" in system.node_log(i)]


def bench_live(tmp: Path, s: Settings) -> Live:
    from infra.apps import NodeService
    from streaming.routes import RouteLookup
    from tests.support.backends import ProcessInfra
    from tests.support.fleet import FleetRunner
    from tests.support.system import System, Timing

    run_dir = tmp / "live"
    run_dir.mkdir()
    # None keeps the value of conf/ (the monitor's heartbeat and the nodes' fallback included)
    timing = Timing(broker_timeout_ms=s.timeout_ms, broker_heartbeat_s=1.0, watermark_delay_ms=s.delay_ms,
                    trigger_ms=s.trigger_ms, tick_ms=s.tick_ms, monitor_heartbeat_ms=None,
                    monitor_fallback_ms=None)  # fmt: skip
    system = System(ProcessInfra(run_dir), run_dir, timing=timing)
    out = Live(settings=shipped_settings(system), experiment=s.experiment, timeout_ms=s.timeout_ms, poll_ms=s.poll_ms)
    say("live: starting Apache Kafka, redis, two nodes and the job (python -m streaming), as conf/ ships them")
    with Stack() as stack:
        stack.later("the stack", system.stop)
        system.start()
        say("live: " + system.describe().replace("\n", "; "))
        # n0: the same conf without Kafka, so it expires brokers with its own scan (the reference)
        n0_port = free_port()
        n0 = NodeService(port=n0_port, run_dir=run_dir / "n0", conf=NAMESRV_CONF, properties={
            "bindAddress": "127.0.0.1", "listenPort": str(n0_port), "nodeName": "n0",
            "kvConfigPath": str(run_dir / "n0-data" / "kvConfig.json"),
            "configStorePath": str(run_dir / "n0-data" / "namesrv.properties")})  # fmt: skip
        stack.later("n0", n0.stop)
        n0.start()
        n1, n2 = system.node_addrs
        watcher = Watcher({"n1": n1, "n2": n2, "n0": n0.address}, system.redis_url, s.poll_ms / 1000)
        watcher.start()
        stack.later("watcher", watcher.stop)
        runner = FleetRunner()
        stack.later("fleets", runner.stop)
        lookup = RouteLookup(system.redis_url)
        stack.later("lookup", lookup.close)
        started = wall_ms()
        # both nodes read the actions topic from its end: a second heartbeat reaches them for sure
        wait_for(lambda: sum(1 for a in system.tap.actions() if str(a.type) == "MONITOR_HEARTBEAT"
                             and a.decided_at >= started) >= 1, 120, "a MONITOR_HEARTBEAT after start-up")  # fmt: skip

        first_write = watcher.last_write()
        routes = bench_routes(lookup, [n1, n2], s, stack)
        out.write_interval_ms = watcher.write_intervals(first_write)
        silent = bench_expiry(system, runner, watcher, n0.address, s)
        crashed = bench_close(system, runner, watcher, s)

        if fallback_logged(system):
            raise SystemExit(f"node(s) {fallback_logged(system)} fell back to their own expiry scan: figures void")
        if system.streaming_pid is None:
            raise SystemExit("the streaming job died during the run; its log: " + str(system.streaming.log_file))
        say("live: reading the events and actions topics (assign + seek) for the legs")
        topics = Topics.read(system.kafka_bootstrap)
        out.timestamp_types = topics.timestamp_types()
        out.poll_round_ms = median(watcher.round_ms)
        if watcher.failures:
            say(f"live: the watcher's unanswered polls: {dict(watcher.failures)} (last: {watcher.last_failure})")
        for name, registered, in_redis in routes:
            out.route_ms.append(in_redis - registered)
            regs = [r for r in topics.events if r.value.broker_name == name and r.value.type is EventType.REGISTER]
            if regs:
                out.route_kafka_ms.append(min(r.ts for r in regs) - registered)
        expiry_legs(out, topics, watcher, silent, s.timeout_ms)
        close_legs(out, topics, watcher, crashed)
    return out


# --------------------------------------------------------------------------- report


def stats(xs: list[float]) -> str:
    if not xs:
        return "not measured"
    return f"median {median(xs):,.0f} ms, max {max(xs):,.0f} (min {min(xs):,.0f}, n={len(xs)})"


def count_stats(xs: list[float]) -> str:
    return f"median {median(xs):g}, max {max(xs):g} (n={len(xs)})" if xs else "not measured"


def targets(live: Live) -> list[tuple[str, float, int, bool]]:
    """(what, measured, target, met) for each of the monitor's latency targets."""
    every, redis = live.expiry.get("everywhere", []), live.close.get("redis", [])
    out = []
    for what, xs, agg, bound in (
        ("deadline -> gone everywhere, median", every, median, EXPIRY_MEDIAN_MS),
        ("deadline -> gone everywhere, max", every, max, EXPIRY_MAX_MS),
        ("last close -> gone in Redis, max", redis, max, CLOSE_MAX_MS),
    ):
        value = agg(xs) if xs else float("nan")
        out.append((what, value, bound, value <= bound))
    return out


def report(command: str, s: Settings, thr: Throughput | None, live: Live, total_s: float,
           load: tuple[tuple[float, ...], tuple[float, ...]]) -> str:  # fmt: skip
    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b else "-"

    load_text = " → ".join("/".join(f"{x:.1f}" for x in avg) for avg in load)
    ts_types = ", ".join({0: "CreateTime", 1: "LogAppendTime"}.get(t, str(t)) for t in sorted(live.timestamp_types))
    lines = [
        "# Streaming liveness monitor benchmark",
        "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, shared machine; load average "
        f"(1/5/15 min) at start → end: {load_text}; {total_s:.0f} s in all).",
    ]
    if live.experiment:
        lines += ["", f"**EXPERIMENT, not the shipped configuration**: {live.experiment} override `conf/`."]
    lines += [
        "Absolute numbers on a shared machine are noise: compare each figure with its reference, measured by the",
        "same run.",
        "",
        "| figure | value | reference (same run) | ratio |",
        "|---|---:|---:|---:|",
    ]
    if thr is not None:
        lines += [
            f"| sustained events/s through the job | {thr.rate:,.0f} | kafka-python assign+seek, raw: "
            f"{thr.raw_rate:,.0f}/s | {thr.rate / thr.raw_rate:.3f}x |",
            f"| same, within the batches | {thr.batch_rate:,.0f} | kafka-python, decoding each event: "
            f"{thr.decode_rate:,.0f}/s | {thr.batch_rate / thr.decode_rate:.3f}x |",
        ]
    every, n0 = median(live.expiry.get("everywhere", [])), median(live.expiry.get("n0", []))
    route, interval = median(live.route_ms), median(live.write_interval_ms)
    closed, at_node = median(live.close.get("redis", [])), median(live.close.get("n1", []) + live.close.get("n2", []))
    lines += [
        f"| expiry latency, deadline → gone at both nodes and in Redis (median) | {every:,.0f} ms | "
        f"node without Kafka, its own scan: {n0:,.0f} ms | {ratio(every, n0)} |",
        f"| route latency, registration → route in Redis (median) | {route:,.0f} ms | "
        f"one Redis write interval of the job: {interval:,.0f} ms | {ratio(route, interval)} |",
        f"| close latency, last close → gone in Redis (median) | {closed:,.0f} ms | "
        f"close → gone at the node (it drops it itself): {at_node:,.0f} ms | {ratio(closed, at_node)} |",
        "",
        'Targets (docs/monitor.md, "How fast"): '
        + "; ".join(
            f"{what} {value:,.0f} ms ≤ {bound:,} ms: **{'met' if met else 'NOT met'}**"
            for what, value, bound, met in targets(live)
        )
        + ".",
        "",
        "## Settings (read from `conf/` with the stack's overrides, as the processes read them)",
        "",
        "| key | value |",
        "|---|---:|",
        *(f"| `{k}` | {v} |" for k, v in live.settings),
        f"| brokers' `heartbeatTimeoutMillis` (the bench's own) | {live.timeout_ms:,} |",
        "",
        "## Where the time goes",
        "",
        f"Expiry, per broker ({len(live.expiry.get('everywhere', []))} silent brokers, connections open):",
        "",
        "| leg | |",
        "|---|---|",
        f"| deadline → gone at n1 | {stats(live.expiry.get('n1', []))} |",
        f"| deadline → gone at n2 | {stats(live.expiry.get('n2', []))} |",
        f"| deadline → gone in Redis | {stats(live.expiry.get('redis', []))} |",
        f"| deadline → gone everywhere (latest of the three) | {stats(live.expiry.get('everywhere', []))} |",
        f"| a. deadline → the first event past it (event time) | {stats(live.legs.get('a', []))} |",
        f"| b. that event: event time → Kafka record timestamp (node → Kafka) | {stats(live.legs.get('b', []))} |",
        f"| c. → the EXPIRE action's record timestamp (trigger wait + batches) | {stats(live.legs.get('c', []))} |",
        f"| c. batches that finished within it, before the deciding one (Redis writes seen) | "
        f"{count_stats(live.legs.get('c batches', []))} |",
        f"| d. EXPIRE → gone at n1 (action → node) | {stats(live.legs.get('d n1', []))} |",
        f"| d. EXPIRE → gone at n2 (action → node) | {stats(live.legs.get('d n2', []))} |",
        f"| e. EXPIRE → gone in Redis (the batch's Redis write) | {stats(live.legs.get('e', []))} |",
        f"| reference: n0's own scan, deadline → gone | {stats(live.expiry.get('n0', []))} |",
        "",
        "The event that moved event time past each deadline: "
        + ", ".join(f"{k} ×{v}" for k, v in live.movers.most_common())
        + ".",
        "",
        f"Close, per broker ({len(live.close.get('redis', []))} crashed brokers):",
        "",
        "| leg | |",
        "|---|---|",
        f"| last close → gone in Redis | {stats(live.close.get('redis', []))} |",
        *(f"| {k} | {stats(v)} |" for k, v in live.close_legs.items() if k != "batches"),
        f"| batches that finished between CHANNEL_CLOSED and REMOVE (Redis writes seen) | "
        f"{count_stats(live.close_legs.get('batches', []))} |",
        f"| close → gone at n1 | {stats(live.close.get('n1', []))} |",
        f"| close → gone at n2 | {stats(live.close.get('n2', []))} |",
        "",
        f"Route: registration → route in Redis {stats(live.route_ms)}; of which registration → REGISTER event's "
        f"record timestamp {stats(live.route_kafka_ms)}; the job's Redis writes meanwhile every "
        f"{stats(live.write_interval_ms)}.",
        "",
        "## How each figure is made",
        "",
    ]
    if thr is not None:
        lines.append(
            f"- **Throughput** (in the bench's process, Spark `local[2]`, {PARTITIONS} event partitions, Spark's "
            f"Kafka source): a load of {thr.brokers:,} brokers with "
            "synthetic event times: a REGISTER through each of two nodes, then a HEARTBEAT through each every 10 s of "
            f"event time, and TICKs. A fresh query (`maxOffsetsPerTrigger` unset) takes the {thr.first_events:,} "
            f"registrations in its first batch ({thr.first_s:.1f} s from `start()`, planning, Python workers and state "
            f"store included), then {thr.warmup:,} events in {thr.warmup_batches} warm-up batches (the JVM compiles "
            f"the code a batch runs over dozens of batches); the last is held open while {thr.events:,} more events "
            f"are produced, so the next batch can take them all. Timed from releasing it until "
            f"`processAllAvailable()` returns: {thr.wall_s:.1f} s ({thr.batches} batch(es) took them, "
            f"{thr.batch_s:.1f} s of batches), while the Spark JVM spent {thr.jit_s:.2f} s of CPU compiling (JIT) "
            f"and {thr.jvm_other_s:.2f} s besides. The reference reads the whole topic with one kafka-python consumer "
            "(`assign()`, `seek(0)`, `poll()` to the end offsets)."
        )
    else:
        lines.append("- **Throughput**: not run (`--skip-throughput`).")
    lines += [
        "- **The stack** for the other figures: Apache Kafka (one KRaft node) and Redis, two nodes n1, n2 (`namesrv start -c "
        "conf/namesrv.properties`) and the job (`python -m streaming -c conf/streaming.properties`), each its own "
        "process, as `make run` starts them (`tests.support.system.System`); overrides are only addresses, "
        "paths and `monitor.id`. Simulated brokers (`FleetRunner`) register with "
        f"`heartbeatTimeoutMillis={live.timeout_ms:,}` and heartbeat every second (QUERY_DATA_VERSION), a "
        're-registration every 30 s. "Gone" at a place is the first answer of a watcher that asks n1, n2 and n0 '
        f"for their cluster info and Redis for the job's (`RouteLookup`) every {live.poll_ms} ms (a round took "
        f"{live.poll_round_ms:.0f} ms, median), and no longer lists the broker. Record timestamps are {ts_types} "
        "(kafka-python stamps a record when the producer's `send()` is called: leg b is the node's event queue and "
        "sender thread; the producer's batching and the broker's write fall into leg c, or the first close leg).",
        f"- **Expiry latency**: silent brokers (connections left open, nothing sent) go silent {STAGGER_S} s apart. "
        "Deadline = the newest event time n1 or n2 stamped on the broker's REGISTER/HEARTBEAT events (from the events "
        "topic) + its timeout; the legs split it by reading both topics after the run (kafka-python `assign()` + "
        "`seek()`, record timestamps). n0 (the same conf without Kafka) expires the same brokers with its own scan; "
        "its deadline is taken as the Kafka nodes' (every heartbeat round reaches all three within milliseconds).",
        "- **Route latency**: new brokers register a new topic at n1 then n2, 0.5-1.5 s apart; from just before the "
        "first REGISTER_BROKER until `RouteLookup.get_raw(topic)` (polled every 5 ms) finds it. Reference: the "
        "interval between two consecutive Redis writes of the job (`batchId` in its meta hash, as the watcher saw it).",
        f"- **Close latency**: brokers registered at n1 and n2 close their sockets at both (no UNREGISTER_BROKER, as a "
        f"SIGKILL), {STAGGER_S} s apart; the clock starts when the last socket is closed. The monitor removes a broker "
        "once its connection is gone at every node that held one (CHANNEL_CLOSED from each).",
        "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def settings(args: argparse.Namespace) -> Settings:
    quick = args.quick
    return Settings(
        events=args.events or (20_000 if quick else SUSTAINED_EVENTS),
        brokers=args.brokers,
        expiring=args.expiring or (3 if quick else 10),
        crashing=args.crashing or (3 if quick else 10),
        registrations=args.registrations or (3 if quick else 12),
        timeout_ms=args.heartbeat_timeout_ms,
        poll_ms=args.poll_ms,
        warmup=(args.events or (20_000 if quick else SUSTAINED_EVENTS)) if args.warmup is None else args.warmup,
        warmup_batches=args.warmup_batches,
        trigger_ms=args.trigger_ms,
        delay_ms=args.watermark_delay_ms,
        tick_ms=args.tick_ms,
        java_options=args.driver_java_options,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events and brokers (Spark start-up dominates)")
    parser.add_argument(
        "--events", type=int, help=f"events for the throughput run (default {SUSTAINED_EVENTS}, quick 20000)"
    )
    parser.add_argument("--brokers", type=int, default=1000, help="brokers in the throughput load")
    parser.add_argument("--expiring", type=int, help="brokers that go silent (default 10, quick 3)")
    parser.add_argument("--crashing", type=int, help="brokers that crash (default 10, quick 3)")
    parser.add_argument("--registrations", type=int, help="route-latency registrations (default 12, quick 3)")
    parser.add_argument(
        "--heartbeat-timeout-ms",
        type=int,
        default=10_000,
        help="heartbeatTimeoutMillis the simulated brokers register with (default 10000)",
    )
    parser.add_argument("--poll-ms", type=int, default=25, help="the watcher's polling period (default 25)")
    parser.add_argument("--skip-throughput", action="store_true", help="only the figures on the stack")
    parser.add_argument(
        "--skip-live", action="store_true", help="only the throughput figures (an A/B of the job's speed); no report"
    )
    parser.add_argument(
        "--warmup", type=int, help="events before the measured batch (default: as many as --events; 0: none)"
    )
    parser.add_argument(
        "--warmup-batches", type=int, default=20, help="in how many batches the warm-up events go (default 20)"
    )
    experiment = parser.add_argument_group("experiments (default: the value conf/ ships; the report says so)")
    experiment.add_argument("--trigger-ms", type=int, help="monitor.triggerIntervalMillis")
    experiment.add_argument("--watermark-delay-ms", type=int, help="monitor.watermarkDelayMillis (live part)")
    experiment.add_argument("--tick-ms", type=int, help="the nodes' tickIntervalMillis (live part)")
    experiment.add_argument(
        "--driver-java-options", help="spark.driver.extraJavaOptions of the throughput part's JVM (an A/B of its JIT)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="where to write the report (default: bench/STREAMING_RESULTS.md "
        "for a full run with the shipped settings; other runs only print it)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="the bench's libraries' INFO logs too")
    args = parser.parse_args()
    s = settings(args)
    command = shlex.join(["python", "bench/streaming_bench.py", *sys.argv[1:]])
    out_path = args.out
    if s.warmup and s.warmup_batches < 1:
        parser.error("--warmup-batches must be at least 1 with warm-up events")
    if args.skip_live and args.skip_throughput:
        parser.error("--skip-live and --skip-throughput leave nothing to measure")
    if out_path is None and not (args.quick or args.skip_throughput or args.skip_live or s.experiment):
        out_path = REPO / "bench" / "STREAMING_RESULTS.md"

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    if not args.verbose:  # the bench reports what it measures itself
        for noisy in ("namesrv", "py4j", "streaming.alerts", "tests"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        # kafka-python logs a socket it closed itself as an ERROR; every figure is checked without it
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    # SIGTERM unwinds like Ctrl-C, so every process below is stopped by PID
    signal.signal(signal.SIGTERM, interrupted)

    load_start = os.getloadavg()
    begun = time.perf_counter()
    say(f"load average {'/'.join(f'{x:.1f}' for x in load_start)} on {os.cpu_count()} cores")
    thr = None
    with tempfile.TemporaryDirectory(prefix="streaming-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if not args.skip_throughput:
            with Stack() as stack:  # stopped before the live part: its processes get the machine to themselves
                kafka, redis = start_backends(stack, tmp)
                say(f"Apache Kafka on {kafka.bootstrap_servers} (pid {kafka.status().pid}), redis on {redis.url} "
                    f"(pid {redis.status().pid}); starting Spark local[2]")  # fmt: skip
                spark = start_spark(stack, java_options=s.java_options)
                thr = bench_throughput(spark, kafka, redis.url, tmp, s)
        if args.skip_live:
            assert thr is not None
            say(f"throughput only (--skip-live): {thr.rate:,.0f} events/s = {thr.rate / thr.raw_rate:.3f}x raw, "
                f"{thr.batch_rate:,.0f}/s within batches = {thr.batch_rate / thr.decode_rate:.3f}x decoding; "
                f"{time.perf_counter() - begun:.0f} s in all")  # fmt: skip
            return 0
        live = bench_live(tmp, s)
    total = time.perf_counter() - begun
    text = report(command, s, thr, live, total, (load_start, os.getloadavg()))
    for what, value, bound, met in targets(live):
        say(f"target {what}: {value:,.0f} ms <= {bound:,} ms: {'met' if met else 'NOT MET'}")
    if out_path is not None:
        out_path.write_text(text)
        say(f"report written to {out_path}")
    print(text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted; every process started was stopped")
        sys.exit(130)
