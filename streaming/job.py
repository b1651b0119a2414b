"""The liveness monitor job, top to bottom: source -> parse -> watermark -> state -> sinks.

Theory of operation
-------------------
One streaming query. Each step is a function that takes and returns a DataFrame, so a test
can run any of them on a small frame:

1. :func:`read_events` - the events topic, through Spark's own Kafka source (``format("kafka")``;
   its jars reach the driver when its JVM starts, :func:`build_spark`);
2. :func:`parse` - records to checked events, bundled in a ``mapInArrow``: one row per state key
   and Arrow batch (:mod:`streaming.events`); malformed ones and those stamped ahead of the
   micro-batch's clock are counted (query progress, metric ``events.bad``) and dropped, never fatal;
3. :func:`with_event_time` - ``eventTs`` from ``eventTime`` and the watermark (120 s by
   default). TICKs go through this step like any event: filtering them out after it would be
   pushed below the watermark by the optimizer and stop them from moving it;
4. :func:`decide` - ``transformWithState`` with :class:`LivenessProcessor` per
   bucket of brokers and per node, event-time timers on RocksDB;
5. :class:`BatchSink` (``foreachBatch``) on the driver: actions to the actions topic, alerts
   to the alerts topic and the log, routes and cluster info to Redis, in that order; then the
   alerts to the pager (:mod:`streaming.paging`, Alertmanager and webhooks), which delivers them
   from its own threads.

Restart: the checkpoint (``monitor.checkpointDir``) holds source offsets, the processor's state
and its pending timers, so a killed job carries on where it stopped; the batch that was
running is replayed, its actions are published again (nodes ignore duplicates) and Redis
skips it (see :mod:`streaming.routes`).

Around the query: :class:`ProgressLogger` logs each batch (input rate, duration, watermark
and how far event time is behind the clock) and :class:`MonitorHeartbeat` publishes the
MONITOR_HEARTBEAT action the nodes watch, and raises or resolves MONITOR_LAGGING.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from namesrv import kafka_clients
from namesrv.events.schema import (
    MAX_REASON_CHARS,
    Action,
    ActionType,
    SchemaError,
    action_key,
    check_action,
    decode_event,
    encode_action,
    wall_ms,
)
from namesrv.redis_clients import redact_url
from namesrv.request_stats import Buckets
from namesrv.retrying import retry_until_stopped
from namesrv.routes import RouteSettings
from namesrv.routes.snapshot import SnapshotError
from streaming.alerts import (
    Alert,
    AlertBook,
    AlertKind,
    AlertState,
    Severity,
    clock_incidents,
    cut,
    encode_alert,
    lag_incident,
    log_alert,
    lost_topics,
    route_incidents,
)
from streaming.config import CONNECTOR_CLASS, CONNECTOR_DIR, ConfigError, StreamingConfig, connector_jars
from streaming.events import PACKED, count_events, parse_events, valid_events
from streaming.health import HealthBook
from streaming.liveness import (
    KIND_ACTION,
    KIND_ALERT,
    KIND_ROUTE,
    OUTPUT_DDL,
    LivenessProcessor,
    LivenessSettings,
    state_layout,
)
from streaming.metrics import batch_buckets, redis_buckets, serve_monitor_metrics
from streaming.paging import Pager, pager_for
from streaming.routes import RedisRouteStore, RouteChanges, RouteModel

if TYPE_CHECKING:
    from kafka import KafkaProducer
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from namesrv.metrics import MetricsServer

log = logging.getLogger(__name__)

EVENT_TS = "eventTs"


now_ms = wall_ms


# --------------------------------------------------------------------------- session


#: the directory holding the namesrv and streaming packages this driver runs
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _installed(root: Path) -> bool:
    """True when ``root`` is a site-packages directory: the project is installed, not run from a tree."""
    import site

    installed = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())}
    return root in installed


#: the Python worker daemon the executors run
DAEMON_MODULE = "streaming.spark_daemon"


def python_settings(
    spark_conf: Mapping[str, str],
    environ: Mapping[str, str],
    *,
    executable: str = sys.executable,
    root: Path = _PROJECT_ROOT,
    installed: bool | None = None,
) -> tuple[str, dict[str, str]]:
    """The Python that Spark must run for this job, and the ``spark.*`` settings that say so.

    Every Python worker of the job must import ``namesrv`` and ``streaming`` and run the same
    PySpark as the driver. PySpark runs ``$PYSPARK_PYTHON``, else ``python3`` from PATH, which
    outside an activated venv has neither. So, whatever the master and launcher:
    ``spark.pyspark.python`` if given (``spark_conf``: the job's settings and the launcher's), else
    ``$PYSPARK_PYTHON``, else this interpreter (on a cluster: install the project at the same path on
    every host, as the deployment's one image does). When the project is not installed for that
    interpreter but run from a source tree, the tree goes to the executors' ``PYTHONPATH`` too,
    unless the settings give ``spark.executorEnv.PYTHONPATH``. Workers are forked from
    :mod:`streaming.spark_daemon` unless ``spark.python.daemon.module`` is given.
    """
    python = spark_conf.get("spark.pyspark.python") or environ.get("PYSPARK_PYTHON") or executable
    conf = {
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": executable,
        # workers forked with the job's imports done (see streaming.spark_daemon)
        "spark.python.daemon.module": DAEMON_MODULE,
    }
    if not (_installed(root) if installed is None else installed):
        conf["spark.executorEnv.PYTHONPATH"] = str(root)
    return python, {k: v for k, v in conf.items() if k not in spark_conf}


def launch_settings(cfg: StreamingConfig) -> dict[str, str]:
    """What the driver's JVM must start with, when the job starts it: Spark's Kafka connector (``spark.jars``).

    ``spark.jars`` set on the session builder reaches the executors but not the driver's own class path,
    which is fixed when its JVM starts: so the job's ``spark.jars``, by default the jars ``make setup`` put
    in :data:`~streaming.config.CONNECTOR_DIR`, is given to the launcher. Nothing when they are not there:
    :func:`check_connector` then says what is missing.
    """
    jars = cfg.spark.get("spark.jars")
    if jars is None:
        try:
            jars = connector_jars()
        except ConfigError:
            return {}
    return {"spark.jars": jars}


def check_connector(spark: SparkSession, cfg: StreamingConfig, *, submitted: bool) -> None:
    """ConfigError unless ``format("kafka")`` can load on the driver; the message says how to give it the jars."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session has its JVM
    try:
        jvm.java.lang.Class.forName(
            CONNECTOR_CLASS, False, jvm.java.lang.Thread.currentThread().getContextClassLoader()
        )
        return
    except Py4JJavaError:
        pass
    given = spark.sparkContext.getConf().get("spark.jars") or "(none)"
    if submitted:
        how = (
            f"spark-submit starts the driver's JVM, so give it the jars: spark-submit --jars '{CONNECTOR_DIR}/*.jar' "
            "streaming/__main__.py ..."
        )
    else:
        how = "spark.jars must list them (unset: the jars in " + str(CONNECTOR_DIR) + ")"
    raise ConfigError(
        f"kafka.format=kafka: Spark's Kafka connector ({CONNECTOR_CLASS}) is not on the driver's class path "
        f"(spark.jars={given}); {how}; `make setup` resolves them once"
    )


#: settings only the JVM's launcher takes (:func:`launch_settings`)
_LAUNCH_ONLY = frozenset({"spark.jars"})


def build_spark(cfg: StreamingConfig) -> SparkSession:
    """A session with the job's Spark settings, Spark's Kafka connector on the driver's and the executors' class path."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if cfg.spark.get("spark.master", "").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # before the JVM starts, below
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    # read by PySpark when it creates the context (every Python function it ships names it); set before
    # the JVM starts too, so that it inherits it
    os.environ["PYSPARK_PYTHON"] = python_settings(cfg.spark, os.environ)[0]
    # under spark-submit the driver's JVM runs already, with the class path spark-submit gave it
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    # taken only when this starts the JVM: not under spark-submit, nor again in a process that started it
    launch = SparkConf(loadDefaults=False).setAll(list(launch_settings(cfg).items()))
    # what the launcher already set (spark-submit --conf, spark-defaults.conf) counts as given, as the job's own
    # keys do: read from the JVM, which this starts (under spark-submit it runs already)
    SparkContext._ensure_initialized(conf=launch)
    given = {**dict(SparkConf(_jvm=SparkContext._jvm).getAll()), **cfg.spark}
    python, conf = python_settings(given, os.environ)
    os.environ["PYSPARK_PYTHON"] = python
    for key, value in {**conf, **cfg.spark}.items():
        # given to the launcher, which resolves a glob in it and sets the list; this would undo that
        if key not in _LAUNCH_ONLY:
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    check_connector(spark, cfg, submitted=submitted)
    return spark


# --------------------------------------------------------------------------- stopping


class _JvmSignalHandler:
    """A ``sun.misc.SignalHandler`` of the driver's JVM, implemented here (py4j calls it back).

    Under ``spark-submit`` the JVM is the process a supervisor signals, and its default SIGTERM
    handling is a JVM shutdown: its hooks stop the SparkContext under the running query
    (``NullPointerException: dagScheduler() is null``) and it exits 143. With this handler the
    JVM only tells the Python driver, which stops the query, then the session, and returns; the
    JVM then exits with the driver's code (0). A second signal gets the JVM's own handling.
    """

    def __init__(self, on_signal: Callable[[str], None]) -> None:
        self.on_signal = on_signal
        self.previous: dict[str, Any] = {}
        self.seen: set[str] = set()

    def handle(self, sig: Any) -> None:  # called by the JVM's signal dispatcher, through py4j
        name = str(sig.getName())
        if name in self.seen:
            previous = self.previous.get(name)
            if previous is not None and "NativeSignalHandler" not in previous.getClass().getName():
                log.warning("second SIG%s to the JVM: stopping it now", name)
                try:
                    previous.handle(
                        sig
                    )  # the JVM's shutdown (exit 128 + the signal's number): the call never returns an answer
                except Exception:  # noqa: BLE001 - py4j's connection ends with the JVM
                    pass
            return
        self.seen.add(name)
        self.on_signal(name)

    class Java:
        implements = ["sun.misc.SignalHandler"]


def forward_jvm_signals(
    spark: SparkSession, on_signal: Callable[[str], None], signals: Iterable[str] = ("TERM", "INT")
) -> None:
    """Have the driver's JVM pass ``signals`` to ``on_signal`` instead of shutting down (see _JvmSignalHandler).

    A signal the JVM was started ignoring (PySpark starts its gateway JVM ignoring SIGINT) stays ignored.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    sc = spark.sparkContext
    ensure_callback_server_started(sc._gateway)
    handler = _JvmSignalHandler(on_signal)
    assert sc._jvm is not None  # a running session has its JVM
    jvm_signal = sc._jvm.sun.misc.Signal
    for name in signals:
        handler.previous[name] = jvm_signal.handle(jvm_signal(name), handler)


# --------------------------------------------------------------------------- the steps


def read_events(spark: SparkSession, cfg: StreamingConfig) -> DataFrame:
    """1. The records of the events topic, as Spark's Kafka source gives them (``value`` binary), read by
    at most as many tasks as the job has cores.

    The source makes a task of every partition with records, and a steady batch's task is mostly its
    fixed cost (a fetch, a Python worker's round trip); more tasks than cores run in waves and cannot
    read a backlog faster (bench/STREAMING_RESULTS.md).
    """
    reader = spark.readStream.format(cfg.kafka_format)
    for key, value in cfg.source_options().items():
        reader = reader.option(key, value)
    return reader.load().coalesce(max(1, spark.sparkContext.defaultParallelism))


def parse(records: DataFrame, max_clock_skew_ms: int) -> DataFrame:
    """2. Checked events in bundles (``key``, ``eventTime``, ``events``: one row per state key and Arrow
    batch), parsed in a ``mapInArrow``; malformed records and events stamped ahead of the micro-batch's
    clock counted and dropped."""
    return valid_events(count_events(parse_events(records, max_clock_skew_ms)))


def with_event_time(events: DataFrame, delay_ms: int) -> DataFrame:
    """3. ``eventTs`` and the watermark: max event time seen minus ``delay_ms``."""
    from pyspark.sql import functions as F

    return events.withColumn(EVENT_TS, F.timestamp_millis("eventTime")).withWatermark(
        EVENT_TS, f"{delay_ms} milliseconds"
    )


def liveness_settings(cfg: StreamingConfig) -> LivenessSettings:
    return LivenessSettings(
        heartbeat_timeout_ms=cfg.heartbeat_timeout_millis,
        flap_threshold=cfg.flap_threshold,
        flap_window_ms=cfg.flap_window_millis,
        node_silent_ms=cfg.node_silent_millis,
        remove_on_channel_close=cfg.remove_on_channel_close,
        watermark_delay_ms=cfg.watermark_delay_millis,
        forget_after_ms=cfg.forget_after_millis,
    )


def decide(events: DataFrame, settings: LivenessSettings) -> DataFrame:
    """4. Actions, alerts and route events (:data:`streaming.liveness.OUTPUT_DDL`) per key.

    The processor gets a key's bundles (column :data:`PACKED`, a JSON array of events) beside
    ``eventTs``, which Spark needs to drop rows later than the watermark: PySpark makes a Python
    object of every input cell one by one, so three cells a bundle instead of fourteen an event
    made the stateful step many times faster.
    """
    return (
        events.select("key", EVENT_TS, PACKED)
        .groupBy("key")
        .transformWithState(
            statefulProcessor=LivenessProcessor(settings),
            outputStructType=OUTPUT_DDL,
            outputMode="Append",
            timeMode="EventTime",
        )
    )


def build_pipeline(spark: SparkSession, cfg: StreamingConfig) -> DataFrame:
    """Steps 1-4: what :class:`BatchSink` receives each micro-batch."""
    events = parse(read_events(spark, cfg), cfg.max_clock_skew_millis)
    return decide(with_event_time(events, cfg.watermark_delay_millis), liveness_settings(cfg))


# --------------------------------------------------------------------------- sinks


#: what Spark's StreamExecution recognises as a stop interrupting a foreachBatch call
_INTERRUPTED = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling collectToPython: java.lang.InterruptedException"
)
#: a NODE_CLOCK_AHEAD incident ends after this long (wall clock) without a refused event from the node
_CLOCK_QUIET_MS = 60_000
#: one attempt to reach Kafka at start-up; short, so a stop request is answered within it
_BOOTSTRAP_ATTEMPT_MS = 5_000


class KafkaLoginRefused(ConfigError):
    """Kafka answers but refuses the job's SASL login or TLS handshake: waiting will not help."""


def kafka_login_refused(
    spark: SparkSession, cfg: StreamingConfig, timeout_ms: int = _BOOTSTRAP_ATTEMPT_MS
) -> str | None:
    """Why Kafka refuses the job's credentials, asked with the connector's Java client; None if it does not.

    None too when Kafka does not answer in ``timeout_ms``, or with plaintext (nothing to refuse). The
    Java client reads the broker's answer to a failed login ("Authentication failed: Invalid username
    or password"), where kafka-python sees the connection close.
    """
    from py4j.protocol import Py4JJavaError

    if cfg.kafka_security.protocol == "PLAINTEXT":
        return None
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session has its JVM
    props = jvm.java.util.Properties()
    settings = {
        "bootstrap.servers": cfg.kafka_bootstrap,
        "request.timeout.ms": str(timeout_ms),
        "default.api.timeout.ms": str(timeout_ms),
        **cfg.kafka_security.spark_options(prefix=""),
    }
    for key, value in settings.items():
        props.setProperty(key, value)
    try:
        admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    except Py4JJavaError as exc:  # settings Java cannot use: say so, waiting will not help either
        return _java_message(exc.java_exception)
    try:
        admin.describeCluster().clusterId().get(timeout_ms, jvm.java.util.concurrent.TimeUnit.MILLISECONDS)
        return None
    except Py4JJavaError as exc:
        cause = exc.java_exception
        while cause is not None:
            names = []
            klass = cause.getClass()
            while klass is not None:
                names.append(klass.getName())
                klass = klass.getSuperclass()
            if "org.apache.kafka.common.errors.AuthenticationException" in names:
                return _java_message(cause)
            cause = cause.getCause()
        return None
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(1))


def _java_message(exc: Any) -> str:
    return f"{exc.getClass().getSimpleName()}: {str(exc.getMessage())[:500]}"


class KafkaPublisher:
    """The driver's producer for actions and alerts; ``flush`` raises if the broker refused any."""

    def __init__(self, producer: KafkaProducer) -> None:
        self.producer = producer
        self._errors: list[BaseException] = []
        #: records skipped because Kafka refused them as too large
        self.refused = 0

    @classmethod
    def connect(
        cls,
        bootstrap_servers: str,
        stopping: threading.Event | None = None,
        security: kafka_clients.KafkaSecurity | None = None,
        login_refused: Callable[[], str | None] | None = None,
    ) -> KafkaPublisher | None:
        """A publisher once Kafka answers, retrying with back-off meanwhile; None if ``stopping`` is set first.

        The job may start before Kafka does (a reboot, a deployment's start order): it waits rather
        than dies, and says once what it is waiting for. A broker that refuses the job's credentials
        will not change its mind: after a failed attempt ``login_refused`` says whether that is why
        (kafka-python sees only a closed connection), and :class:`KafkaLoginRefused` ends the wait.
        """
        from kafka.errors import KafkaError

        def producer() -> KafkaProducer:
            # not pinned (namesrv.kafka_clients): the constructor raises while Kafka does not answer,
            # which is how this waits for it
            try:
                return kafka_clients.producer(
                    bootstrap_servers,
                    key="kafka.bootstrap",
                    security=security,
                    acks=1,
                    linger_ms=2,
                    enable_idempotence=False,
                    bootstrap_timeout_ms=_BOOTSTRAP_ATTEMPT_MS,
                )
            except KafkaError:
                why = login_refused() if login_refused is not None else None
                if why:
                    raise KafkaLoginRefused(
                        f"Kafka at {bootstrap_servers} refuses the job's credentials "
                        f"({security.describe() if security else 'PLAINTEXT'}): {why}; check kafka.sasl.* / "
                        "kafka.ssl.* and the broker's users"
                    ) from None
                raise

        made = retry_until_stopped(
            producer,
            stopping or threading.Event(),
            log=log,
            retry_on=KafkaError,
            first_wait_s=0.5,
            max_wait_s=10.0,
            problem=f"Kafka at {bootstrap_servers} does not answer yet: is it up, and is kafka.bootstrap right?"
            + (security.failure_hint() if security else ""),
        )
        return None if made is None else cls(made)

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        from kafka.errors import MessageSizeTooLargeError

        try:
            future = self.producer.send(topic, key=key, value=value)
        except MessageSizeTooLargeError as exc:
            # our records are bounded (schema, cut messages); should one still be too big, it is
            # this record's problem: skipping it must not stop the query and replay it forever
            self.refused += 1
            log.error("kafka: a %d-byte record for %s is too large and was skipped: %s", len(value), topic, exc)
            return
        future.add_errback(self._errors.append)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for what was sent; record-size refusals are counted and logged, anything else raises."""
        from kafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

        self.producer.flush(timeout=timeout_s)
        errors, self._errors = self._errors, []
        too_big = [e for e in errors if isinstance(e, MessageSizeTooLargeError | RecordListTooLargeError)]
        if too_big:
            self.refused += len(too_big)
            log.error("kafka refused %d record(s) of the monitor as too large (skipped): %r", len(too_big), too_big[0])
        others = [e for e in errors if e not in too_big]
        if others:
            raise RuntimeError(f"kafka refused {len(others)} record(s) from the monitor: {others[0]!r}")

    def close(self) -> None:
        self.producer.close()


def order_key(row: dict[str, Any]) -> tuple:
    """The order a batch's output is applied in: event time, then the reporting node's sequence."""
    return (row["orderTime"] or 0, row["node"] or "", row["seq"] or 0, row["step"] or 0)


def row_action(row: dict[str, Any], monitor: str, decided_at: int) -> Action:
    return Action(
        type=ActionType(row["type"]),
        monitor=monitor,
        decided_at=decided_at,
        cluster_name=row["clusterName"],
        broker_addr=row["brokerAddr"],
        broker_name=row["brokerName"],
        broker_id=row["brokerId"],
        last_heartbeat=row["lastHeartbeat"],
        watermark=row["watermark"],
        reason=None if row["reason"] is None else cut(row["reason"], MAX_REASON_CHARS),
    )


def row_alert(row: dict[str, Any]) -> Alert:
    kind = AlertKind(row["type"])
    return Alert(
        kind=kind,
        state=AlertState(row["state"]),
        severity=Severity(row["severity"]),
        message=row["message"],
        event_time=int(row["orderTime"]),
        cluster_name=row["clusterName"],
        broker_name=row["brokerName"],
        broker_addr=row["brokerAddr"],
        node=row["node"],
    )


@dataclass
class MonitorStatus:
    """What the listener learnt from the latest progress; read by the heartbeat and the sink."""

    watermark_ms: int | None = None
    batches: int = 0
    events: int = 0
    bad_events: int = 0
    batch_durations_ms: list[int] = field(default_factory=list)
    #: wall clock when this run last finished a batch (0: none yet); the nodes hear the monitor only after one
    last_batch_done_at: int = 0
    #: events refused for being stamped ahead of the job's clock, in this run
    ahead_events: int = 0
    #: decided actions not sent because they fail the action schema's bounds (a bug, counted)
    bad_actions: int = 0
    #: node -> (wall time last seen ahead, events refused, furthest claim)
    ahead_nodes: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # -- for the metrics endpoint (streaming.metrics), each written by one thread
    #: events per second the last batch read
    input_rate: float = 0.0
    batch_seconds: Buckets = field(default_factory=batch_buckets)
    #: action type -> actions sent to the actions topic by this run
    actions_published: dict[str, int] = field(default_factory=dict)
    redis_seconds: Buckets = field(default_factory=redis_buckets)
    redis_failures: int = 0

    def published(self, action: Action) -> None:
        self.actions_published[action.type.value] = self.actions_published.get(action.type.value, 0) + 1

    def note_ahead(self, nodes: Iterable[str], refused: int, furthest: int, at: int) -> None:
        self.ahead_events += refused
        for node in nodes:
            _, count, far = self.ahead_nodes.get(node, (at, 0, furthest))
            self.ahead_nodes[node] = (at, count + refused, max(far, furthest))
        if len(self.ahead_nodes) > 1000:  # forget the quietest; a handful of nodes is normal
            for node, _ in sorted(self.ahead_nodes.items(), key=lambda kv: kv[1][0])[:-1000]:
                del self.ahead_nodes[node]

    def deciding(self, now: int, *, within_ms: int, delay_ms: int, lag_ms: int) -> bool:
        """True when a batch finished within ``within_ms`` and event time is at most ``lag_ms`` behind ``now``.

        Only then does the monitor announce itself to the nodes: a job that started but has not
        finished a batch, or is still catching up on a backlog, decides nothing in time, and the
        nodes' own expiry must stay on meanwhile.
        """
        if not self.last_batch_done_at or now - self.last_batch_done_at > within_ms:
            return False
        return (
            self.watermark_ms is not None and self.watermark_ms != 0 and now - (self.watermark_ms + delay_ms) <= lag_ms
        )


class BatchSink:
    """``foreachBatch``: publish actions and alerts, keep the route model, write Redis."""

    def __init__(
        self,
        cfg: StreamingConfig,
        publisher: KafkaPublisher,
        store: RedisRouteStore | None,
        status: MonitorStatus | None = None,
        clock: Callable[[], int] = now_ms,
        pager: Pager | None = None,
    ) -> None:
        self.cfg = cfg
        #: delivers alerts to Alertmanager / a webhook off the batch thread (None: not configured)
        self.pager = pager
        self.monitor = cfg.monitor_name
        self.publisher = publisher
        self.store = store
        self.status = status or MonitorStatus()
        self.clock = clock
        self.route_settings = RouteSettings(
            support_acting_master=cfg.support_acting_master,
            delete_topic_with_broker_registration=cfg.delete_topic_with_broker_registration,
        )
        self.model = RouteModel(self.route_settings, order_message_enable=cfg.order_message_enable)
        self.book = AlertBook()
        #: what the console shows (streaming.health), written with each batch
        self.health = HealthBook(forget_after_ms=cfg.forget_after_millis)
        self.lock = threading.Lock()
        self._lineage: str | None = None
        self._lineage_set = threading.Event()
        self._stored_batch = -1
        #: the next Redis write replaces everything (new lineage, or a write failed)
        self._rewrite = True
        #: the route incidents in the book were reconciled with the route tables as they are now
        self._route_incidents_current = False

    # -- lineage: the query id, which a restart from the same checkpoint keeps

    def set_lineage(self, query_id: str) -> None:
        with self.lock:
            self._lineage = query_id
            if self.store is not None:
                try:
                    stored = self.store.load(self.route_settings, order_message_enable=self.cfg.order_message_enable)
                except RedisError as exc:  # Redis down must not stop the liveness decisions
                    log.error("redis: cannot load the route model (%r); starting from an empty one", exc)
                except SnapshotError as exc:  # nor does a model this job cannot read: it is rewritten
                    log.error(
                        "redis: unreadable route model (%s); starting from an empty one and rewriting " "everything",
                        exc,
                    )
                else:
                    if stored.lineage == query_id:
                        self.model, self.book = stored.model, AlertBook(stored.alerts)
                        self._route_incidents_current = False
                        self.health.restore(*stored.health)
                        self._stored_batch = stored.batch_id
                        self._rewrite = False
                        log.info(
                            "redis: carrying on from batch %d of query %s (%d topics)",
                            stored.batch_id,
                            query_id,
                            len(self.model.topics()),
                        )
                    else:
                        log.info(
                            "redis: new query lineage %s (stored: %s); rewriting everything", query_id, stored.lineage
                        )
            if self.pager is not None:
                self.pager.start(self.book.open)  # re-sends what Redis says is open, and the outbox
            self._lineage_set.set()

    # -- the batch

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self._lineage_set.wait()
        try:
            collected = batch_df.collect()
        except Exception as exc:
            if "java.lang.InterruptedException" not in str(exc):
                raise
            # stop() interrupted this batch. Spark tells such an interruption from a failure by matching
            # the error's text with a regex that overflows the JVM's stack on a long Java trace (a
            # StackOverflowError at every stop during a batch): hand it the short text it looks for.
            raise RuntimeError(_INTERRUPTED) from None
        rows = sorted((r.asDict() for r in collected), key=order_key)
        self.process(rows, batch_id)
        self.status.last_batch_done_at = self.clock()

    def process(self, rows: list[dict[str, Any]], batch_id: int) -> list[Alert]:
        """Everything after collect(), for one batch; returns the alerts it emitted."""
        with self.lock:
            if batch_id <= self._stored_batch:
                log.info(
                    "batch %d was already written to redis (stored up to %d); skipping", batch_id, self._stored_batch
                )
                return []
            at = self.clock()
            self._publish_actions(rows, at)
            self._apply_routes(rows)
            changes = self.model.changes(full=self._rewrite)
            alerts = self._alerts(rows, changes, rows[-1]["orderTime"] if rows else at)
            for alert in alerts:
                self._publish_alert(alert, at)
            self.publisher.flush()
            self.health.observe(
                rows, alerts, at, batch_id=batch_id, monitor=self.monitor, status=self.status,
                delay_ms=self.cfg.watermark_delay_millis,
            )  # fmt: skip
            # open incidents whose topics changed: said again to Redis and the pager, not on Kafka
            said = [*alerts, *self.book.take_refreshed()]
            notices = self.pager.stage(said) if self.pager is not None else []
            self._write_redis(batch_id, changes, said, self.pager.outbox_entries(notices) if self.pager else None)
            if self.pager is not None:
                self.pager.submit(notices)
            return alerts

    def _publish_actions(self, rows: Iterable[dict[str, Any]], at: int) -> None:
        for row in rows:
            if row["kind"] == KIND_ACTION:
                action = row_action(row, self.monitor, at)
                try:
                    check_action(action)  # what the nodes would refuse is not sent: counted and logged
                except SchemaError as exc:
                    self.status.bad_actions += 1
                    log.error("action not sent, the nodes would refuse it: %s", exc)
                    continue
                log.info("%s %s %s (%s)", action.type, action.cluster_name, action.broker_addr, action.reason)
                self.publisher.send(self.cfg.actions_topic, action_key(action), encode_action(action))
                self.status.published(action)

    def _apply_routes(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            if row["kind"] == KIND_ROUTE:
                try:
                    self.model.apply_event(decode_event(row["raw"]))
                except SchemaError as exc:  # the processor passed it, so this is a bug, not bad input
                    log.error("route event that no longer decodes skipped: %s", exc)
            elif row["kind"] == KIND_ACTION:
                self.model.apply_removal(
                    row["clusterName"], row["brokerAddr"], int(row["orderTime"]),
                    unclean=row["cause"] != "UNREGISTER_BROKER",
                )  # fmt: skip

    def _alerts(self, rows: list[dict[str, Any]], changes: RouteChanges, at: int) -> list[Alert]:
        out = [a for a in (row_alert(r) for r in rows if r["kind"] == KIND_ALERT) if self.book.record(a)]
        unchanged = changes.empty and not (changes.lost_by_group or changes.deleted_topics)
        if unchanged and self._route_incidents_current:
            # Route incidents follow from the route tables alone, which this batch did not change; checking
            # them walks every topic (200 ms a batch at 100,000 topics, before the Redis write)
            return out
        # topics lost with a group stay in its incident until they come back or an admin deletes them
        lost = lost_topics(self.book.open.values(), changes.lost_by_group, changes.deleted_topics)
        health = self.model.manager.route_health(sorted(set().union(*lost.values())))
        current = route_incidents(health, at, lost)
        out += self.book.reconcile((AlertKind.GROUP_WITHOUT_MASTER, AlertKind.TOPIC_NOT_WRITABLE), current, at)
        self._route_incidents_current = True
        return out

    def _publish_alert(self, alert: Alert, at: int) -> None:
        log_alert(alert)
        self.publisher.send(
            self.cfg.alerts_topic, alert.incident.encode(), encode_alert(alert, monitor=self.monitor, emitted_at=at)
        )

    def _write_redis(
        self, batch_id: int, changes: Any, alerts: list[Alert], outbox: dict[str, bytes] | None = None
    ) -> None:
        if self.store is None:
            return
        assert self._lineage is not None
        # a full rewrite deletes the stored alerts too: write every open one again
        alert_writes = list(self.book.open.values()) if self._rewrite else alerts
        started = time.perf_counter()
        try:
            self.store.commit(
                self._lineage, batch_id, changes, alert_writes, watermark=self.status.watermark_ms,
                monitor=self.monitor, replace=self._rewrite, health=self.health.take(full=self._rewrite),
                outbox=outbox,
            )  # fmt: skip
        except RedisError as exc:  # a cache outage must not stop the liveness decisions
            self.status.redis_seconds.observe(time.perf_counter() - started)
            self.status.redis_failures += 1
            log.error("redis: batch %d not written (%r); the next write replaces everything", batch_id, exc)
            self._rewrite = True
            self.model.forget_written()
            return
        # bench/scale_bench.py reads this line: the Redis share of a batch, which grows with the topics changed
        log.info("redis: batch %d written in %.1f ms", batch_id, (time.perf_counter() - started) * 1000)
        self.status.redis_seconds.observe(time.perf_counter() - started)
        self._stored_batch = batch_id
        self._rewrite = False

    # -- read-only, for the metrics endpoint (any thread; see streaming.metrics)

    def brokers_alive(self) -> int:
        """Brokers in the route model: registered and neither expired nor removed."""
        return self.model.manager.counts().brokers

    def open_alert_kinds(self) -> list[tuple[str, str]]:
        """``(kind, severity)`` of every open incident."""
        return [(a.kind.value, a.severity.value) for a in list(self.book.open.values())]

    def close(self) -> None:
        if self.pager is not None:
            self.pager.stop()
        self.publisher.close()
        if self.store is not None:
            self.store.client.close()

    # -- the monitor's own heartbeat

    def monitor_tick(self) -> None:
        """Publish MONITOR_HEARTBEAT while deciding; open or resolve MONITOR_LAGGING and NODE_CLOCK_AHEAD."""
        with self.lock:
            at = self.clock()
            st, cfg = self.status, self.cfg
            wm = st.watermark_ms
            within = max(10_000, 3 * cfg.monitor_heartbeat_interval_millis, 3 * cfg.trigger_interval_millis)
            if st.deciding(at, within_ms=within, delay_ms=cfg.watermark_delay_millis, lag_ms=cfg.monitor_lag_millis):
                beat = Action(
                    type=ActionType.MONITOR_HEARTBEAT,
                    monitor=self.monitor,
                    decided_at=at,
                    watermark=wm,
                    reason=f"batches={st.batches} events={st.events} bad={st.bad_events} " f"ahead={st.ahead_events}",
                )
                self.publisher.send(cfg.actions_topic, action_key(beat), encode_action(beat))
                st.published(beat)
            current = lag_incident(wm, cfg.watermark_delay_millis, at, cfg.monitor_lag_millis)
            current |= clock_incidents(dict(st.ahead_nodes), at, _CLOCK_QUIET_MS, cfg.max_clock_skew_millis)
            changed = self.book.reconcile((AlertKind.MONITOR_LAGGING, AlertKind.NODE_CLOCK_AHEAD), current, at)
            for alert in changed:
                self._publish_alert(alert, at)
            self.publisher.flush()
            notices = self.pager.stage(changed) if self.pager is not None else []
            if changed and self.store is not None and self._lineage is not None:
                try:
                    self.store.write_alerts(
                        changed, monitor=self.monitor, outbox=self.pager.outbox_entries(notices) if self.pager else None
                    )
                except RedisError as exc:  # see _write_redis
                    log.error("redis: alerts not written (%r)", exc)
            if self.pager is not None:
                self.pager.submit(notices)


# --------------------------------------------------------------------------- around the query


def _iso_ms(text: str | None) -> int | None:
    if not text:
        return None
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


class _ProgressAsJson:
    """The JVM's side of :class:`ProgressLogger` (Py4J): each batch's progress crosses as its JSON.

    PySpark's own bridge builds a progress from the JVM object one getter at a time: some thirty
    Py4J calls a batch, each of which has the JVM look the member up by reflection through every jar
    on its class path. That kept a JVM thread and the driver's Python busy for a quarter of a core
    beside a steady stream on two cores (JFR and py-spy). ``progress().json()`` is one call, and
    :meth:`StreamingQueryProgress.fromJson` is what ``query.lastProgress`` itself uses.
    """

    def __init__(self, listener: Any) -> None:
        self.listener = listener

    def onQueryStarted(self, jevent: Any) -> None:
        from pyspark.sql.streaming.listener import QueryStartedEvent

        self.listener.onQueryStarted(QueryStartedEvent.fromJObject(jevent))

    def onQueryProgress(self, jevent: Any) -> None:
        from pyspark.sql.streaming.listener import QueryProgressEvent

        self.listener.onQueryProgress(QueryProgressEvent.fromJson({"progress": json.loads(jevent.progress().json())}))

    def onQueryIdle(self, jevent: Any) -> None:
        pass

    def onQueryTerminated(self, jevent: Any) -> None:
        from pyspark.sql.streaming.listener import QueryTerminatedEvent

        self.listener.onQueryTerminated(QueryTerminatedEvent.fromJObject(jevent))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


def _make_listener_class() -> type:
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressLogger(StreamingQueryListener):
        """Logs every batch: input rate, duration, watermark and event-time lag; feeds MonitorStatus."""

        def __init__(
            self, status: MonitorStatus, delay_ms: int, max_skew_ms: int, query_id: Callable[[], str | None]
        ) -> None:
            self.status = status
            self.delay_ms = delay_ms
            self.max_skew_ms = max_skew_ms
            self.query_id = query_id
            self._json_bridge: Any = None

        @property
        def _jlistener(self) -> Any:
            # what spark.streams.addListener/removeListener hand the JVM: our JSON bridge, made once
            if self._json_bridge is None:
                from pyspark import SparkContext

                jvm = SparkContext._jvm
                assert jvm is not None, "a listener is added to a running session"
                self._json_bridge = jvm.PythonStreamingQueryListenerWrapper(_ProgressAsJson(self))
            return self._json_bridge

        def onQueryStarted(self, event: Any) -> None:
            log.info("query %s started (run %s)", event.id, event.runId)

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            if str(p.id) != self.query_id():
                return
            wm = _iso_ms(p.eventTime.get("watermark"))
            metrics = p.observedMetrics.get("events")
            bad = int(metrics["bad"]) if metrics is not None else 0
            # the source's rows are bundles of events (streaming.events): the events are counted apart
            events = int(metrics["events"]) if metrics is not None else 0
            rows = int(p.numInputRows)
            per_row = events / rows if rows else 0.0
            rate = float(p.inputRowsPerSecond or 0.0) * per_row
            ahead = int(metrics["ahead"] or 0) if metrics is not None else 0
            s = self.status
            if ahead:
                nodes = {n for n in (metrics["aheadNode"], metrics["aheadOtherNode"]) if n is not None}
                s.note_ahead(nodes, ahead, int(metrics["aheadMax"]), now_ms())
                log.warning(
                    "refused %d event(s) stamped more than %d ms ahead of the monitor's clock, from %s "
                    "(furthest: %s)",
                    ahead,
                    self.max_skew_ms,
                    sorted(nodes),
                    metrics["aheadMax"],
                )
            s.batches += 1
            s.events += events
            s.bad_events += bad
            s.batch_durations_ms.append(int(p.batchDuration))
            s.batch_seconds.observe(p.batchDuration / 1000)
            s.input_rate = rate
            del s.batch_durations_ms[:-1000]
            if wm:
                s.watermark_ms = wm
            behind = f"event time {(now_ms() - (wm + self.delay_ms)) / 1000:.1f} s behind" if wm else "no watermark yet"
            log.info(
                "batch %d: %d events (%d bad) in %d rows, input %.1f/s processed %.1f/s in %d ms; %s",
                p.batchId, events, bad, rows, rate, per_row * float(p.processedRowsPerSecond or 0.0), p.batchDuration,
                behind,
            )  # fmt: skip

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            if event.exception:
                log.error("query %s failed: %s", event.id, event.exception)
            else:
                log.info("query %s stopped", event.id)

    return ProgressLogger


class MonitorHeartbeat(threading.Thread):
    def __init__(self, sink: BatchSink, interval_s: float) -> None:
        super().__init__(name="monitor-heartbeat", daemon=True)
        self.sink = sink
        self.interval_s = interval_s
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            try:
                self.sink.monitor_tick()
            except Exception as exc:  # noqa: BLE001 - keep beating; the next tick retries
                log.error("monitor heartbeat failed: %r", exc)

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=10)


@dataclass
class MonitorJob:
    """A running monitor: the query and what runs beside it."""

    spark: SparkSession
    query: StreamingQuery
    sink: BatchSink
    status: MonitorStatus
    listener: Any
    heartbeat: MonitorHeartbeat
    #: the Prometheus endpoint; None when monitor.metricsPort is 0
    metrics: MetricsServer | None = None

    def process_all_available(self) -> None:
        self.query.processAllAvailable()

    def stop(self) -> None:
        self.heartbeat.stop()
        try:
            self.query.stop()
        finally:
            self.spark.streams.removeListener(self.listener)
            self.sink.close()
            if self.metrics is not None:  # a restarted query (streaming.__main__) serves on the same port again
                self.metrics.stop()


def checkpoint_location(checkpoint_dir: Path) -> Path:
    """This job version's checkpoint: ``checkpoint_dir/state-<layout>``, created if missing.

    Checkpoints of other state layouts (older versions of the job) are left alone and named in
    a warning: a new layout starts from ``kafka.startingOffsets`` and rebuilds its state from
    the events still in the topic, while the nodes' fallback scan covers the start-up.
    """
    location = checkpoint_dir / f"state-{state_layout()}"
    if not location.exists():
        others = sorted(p.name for p in checkpoint_dir.glob("state-*")) if checkpoint_dir.is_dir() else []
        if checkpoint_dir.joinpath("offsets").is_dir():
            others.append("(an unversioned checkpoint in the directory itself)")
        if others:
            log.warning(
                "checkpoint %s: starting a new state layout %s; the state of %s was written by another "
                "version of the job and is not read (delete it once the new one runs)",
                checkpoint_dir,
                location.name,
                ", ".join(others),
            )
    location.mkdir(parents=True, exist_ok=True)
    return location


def start(
    spark: SparkSession, cfg: StreamingConfig, *, trigger_ms: int | None = None, stopping: threading.Event | None = None
) -> MonitorJob | None:
    """Start the monitor on ``spark`` (see :func:`build_spark`) once Kafka answers; None if ``stopping`` is set first."""
    publisher = KafkaPublisher.connect(
        cfg.kafka_bootstrap, stopping, cfg.kafka_security, login_refused=lambda: kafka_login_refused(spark, cfg)
    )
    if publisher is None:
        return None
    store = RedisRouteStore.from_url(cfg.redis_url, cfg.redis_prefix) if cfg.redis_url else None
    status = MonitorStatus()
    sink = BatchSink(cfg, publisher, store, status, pager=pager_for(cfg, store))
    query_id: list[str | None] = [None]
    listener = _make_listener_class()(
        status, cfg.watermark_delay_millis, cfg.max_clock_skew_millis, lambda: query_id[0]
    )
    spark.streams.addListener(listener)
    checkpoint = checkpoint_location(cfg.checkpoint_dir)
    query = (
        build_pipeline(spark, cfg)
        .writeStream.foreachBatch(sink)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{trigger_ms or cfg.trigger_interval_millis} milliseconds")
        .queryName("namesrv-liveness")
        .start()
    )
    query_id[0] = str(query.id)
    sink.set_lineage(str(query.id))
    heartbeat = MonitorHeartbeat(sink, cfg.monitor_heartbeat_interval_millis / 1000)
    heartbeat.start()
    monitor = MonitorJob(spark, query, sink, status, listener, heartbeat)
    if cfg.metrics_port > 0:
        try:
            monitor.metrics = serve_monitor_metrics(cfg, sink, status)
        except OSError as exc:  # a port taken is the operator's to fix; the monitor decides on without it
            log.error(
                "monitor.metricsPort=%d: cannot listen on %s (%s); running without metrics",
                cfg.metrics_port, cfg.metrics_bind_address, exc,
            )  # fmt: skip
    log.warning(
        "monitor %s started: events %s on %s, checkpoint %s, redis %s, metrics %s",
        cfg.monitor_name,
        cfg.events_topic,
        cfg.kafka_bootstrap,
        checkpoint,
        redact_url(cfg.redis_url) if cfg.redis_url else "-",
        monitor.metrics.url if monitor.metrics is not None else "off",
    )
    return monitor
