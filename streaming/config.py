"""Typed configuration of the streaming job, from ``conf/streaming.properties``.

:data:`OPTIONS` is the one table of keys: each row names the key, the :class:`StreamingConfig`
attribute, its converter (:mod:`common.options`, shared with the node's and the local services'
tables) and a line of documentation.  Loading is strict: a value that does not parse, or a key that
is not in the table, stops the job naming it, so a typo cannot silently fall back to a default.
Keys starting with ``spark.`` go to the SparkSession builder unchanged.  Kafka security uses the
Kafka client's own names after ``kafka.``, checked whole at load
(:class:`~common.kafka_security.KafkaSecurity`); ``redis.url`` is checked by
:func:`common.redis_clients.check_url`.  ``docs/internals/config.md`` has more.
"""

from __future__ import annotations

import dataclasses
import hashlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import options, redis_clients
from common.contract import MAX_NAME_CHARS
from common.kafka_clients import BOOTSTRAP
from common.kafka_security import SECURITY_KEYS, KafkaSecurity
from common.options import ConfigError, Option
from common.paging import http_url
from common.properties import parse_properties
from common.redis_keys import RedisKeys

DEFAULT_CONFIG_PATH = Path("conf/streaming.properties")
#: what error messages call this configuration
_SOURCE = "streaming config"
#: Spark's own Kafka connector (its jars: :data:`CONNECTOR_DIR`, or ``spark.jars``)
KAFKA_FORMATS = ("kafka",)
#: where `make setup` puts Spark's Kafka connector and what it needs (infra/jvm/spark-kafka/pom.xml)
CONNECTOR_DIR = Path(__file__).resolve().parents[1] / "build" / "jvm" / "spark-kafka"
#: the executors' Kafka consumers (the A/B is in bench/STREAMING_RESULTS.md): Spark's source asks for the
#: offset range after every poll, so large polls mean fewer of those round trips; a short fetch wait keeps a
#: read-ahead fetch the broker holds from delaying the next batch's task
CONSUMER_OPTIONS: Mapping[str, str] = {
    "kafka.max.poll.records": "20000",
    "kafka.max.partition.fetch.bytes": str(8 << 20),
    "kafka.fetch.max.wait.ms": "10",
}
#: the class behind format("kafka"): loadable on the driver once the connector is on its class path
CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def connector_jars(folder: Path = CONNECTOR_DIR) -> str:
    """The default ``spark.jars``: every jar of ``folder``, comma-separated; ConfigError saying how to get them."""
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise ConfigError(
            f"{_SOURCE}: kafka.format=kafka needs Spark's Kafka connector, and {folder} has no jars: run `make setup` "
            "(it resolves infra/jvm/pom.xml once, offline afterwards), or set spark.jars to the connector's jars"
        )
    return ",".join(str(j) for j in jars)


#: Spark settings applied unless the file or the command line sets them
SPARK_DEFAULTS: Mapping[str, str] = {
    "spark.master": "local[*]",
    "spark.app.name": "namesrv-liveness-monitor",
    "spark.sql.shuffle.partitions": "1",
    # event times are epoch milliseconds; the Kafka source's Arrow batches are in UTC
    "spark.sql.session.timeZone": "UTC",
    # transformWithState with timers needs RocksDB
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    # The driver's JVM compiles with C1 only (given to its launcher: streaming.session.launch_settings). C2's
    # compiler threads compete for the CPU with the start's own work, which delays the first decision after a
    # restart on a machine of few cores, and steady batches were hardly slower without it
    # (bench/STREAMING_RESULTS.md, "the driver's JIT (C1 only against C2)").
    # Setting this key replaces the option: keep -XX:TieredStopAtLevel=1 among your own (-Xshare:off there
    # also turns off the class-data-sharing archive, streaming.class_archive).
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "false",
    # commit only what changed in each batch instead of a RocksDB snapshot: shorter batches
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # counting state rows makes every write read the key first; the count is only a progress metric
    "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
    # Checkpoint files (offsets, commits, state changelogs) are written to a temporary name and
    # renamed. The default manager renames through Hadoop's FileContext, which on a local disk runs
    # `readlink` in a child process for every rename (Hadoop's RawLocalFileSystem without its native
    # library), a cost on every micro-batch. FileSystem.rename is a plain rename(2), as atomic
    # on a local disk (the checkpoint directory, monitor.checkpointDir, is a local path) and on HDFS.
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
    ),
}


@dataclass(frozen=True)
class StreamingConfig:
    """Every setting of the job; ``spark`` holds the ``spark.*`` keys for the session builder."""

    kafka_bootstrap: str = "127.0.0.1:19092"
    kafka_format: str = "kafka"
    events_topic: str = "namesrv-events"
    actions_topic: str = "namesrv-actions"
    alerts_topic: str = "namesrv-alerts"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    #: the ``kafka.security.*`` / ``kafka.sasl.*`` / ``kafka.ssl.*`` keys as written (see :attr:`kafka_security`)
    kafka_security_settings: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: those keys checked and resolved (``${env:...}`` read); plaintext by default
    kafka_security: KafkaSecurity = KafkaSecurity()

    checkpoint_dir: Path = Path("run/streaming/checkpoint")
    trigger_interval_millis: int = 100
    watermark_delay_millis: int = 120_000
    max_clock_skew_millis: int = 10_000
    heartbeat_timeout_millis: int = 120_000
    monitor_heartbeat_interval_millis: int = 500
    monitor_id: str = ""
    remove_on_channel_close: bool = False
    forget_after_millis: int = 86_400_000
    metrics_port: int = 0
    metrics_bind_address: str = "0.0.0.0"

    flap_threshold: int = 3
    flap_window_millis: int = 600_000
    node_silent_millis: int = 30_000
    monitor_lag_millis: int = 60_000
    alertmanager_urls: tuple[str, ...] = ()
    webhook_url: str = ""
    alerts_resend_interval_millis: int = 60_000
    alerts_send_timeout_millis: int = 10_000
    alerts_generator_url: str = ""

    redis_url: str = "redis://127.0.0.1:16379/0"
    redis_prefix: str = "namesrv"
    support_acting_master: bool = False
    delete_topic_with_broker_registration: bool = False
    order_message_enable: bool = False

    spark: Mapping[str, str] = field(default_factory=lambda: dict(SPARK_DEFAULTS))

    @property
    def monitor_name(self) -> str:
        """Who signs the actions: ``monitor.id``, else ``liveness@host/<checkpoint hash>``.

        A job restarted from the same checkpoint is the same monitor (same state, same decisions), and
        keeps its name, so nodes that trust the first monitor they hear keep obeying it after a restart.
        """
        if self.monitor_id:
            return self.monitor_id
        digest = hashlib.sha1(str(self.checkpoint_dir).encode()).hexdigest()[:8]
        return f"liveness@{socket.gethostname()[:200]}/{digest}"

    def source_options(self) -> dict[str, str]:
        """Options of Spark's Kafka source: the topic, offsets, the Java client's settings (a JAAS line, PEM
        trust and key stores: :meth:`KafkaSecurity.spark_options`) and :data:`CONSUMER_OPTIONS`."""
        opts = {"kafka.bootstrap.servers": self.kafka_bootstrap, **self.kafka_security.spark_options()}
        opts["subscribe"] = self.events_topic
        opts["startingOffsets"] = self.starting_offsets
        if self.max_offsets_per_trigger:
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        # records gone to retention are skipped with a warning rather than stopping the monitor
        opts["failOnDataLoss"] = "false"
        opts.update(CONSUMER_OPTIONS)
        return opts


# --------------------------------------------------------------------------- parsing
# the converters and the error are common.options', shared with the node's and the services' tables

_TEXT = options.text(required=True)
_MILLIS = options.integer(1, expected="milliseconds (an integer >= 1)")
_MILLIS_OR_ZERO = options.integer(0, expected="milliseconds (an integer >= 0)")
_COUNT = options.integer(1, expected="count (an integer >= 1)")
_POSITIVE = options.integer(1)
_OPTIONAL_POSITIVE = options.Converter(lambda raw: _POSITIVE(raw) if raw.strip() else None, "positive integer or empty")
_URL = options.Converter(http_url, "http:// or https:// URL with a host and no credentials, or empty")
_URLS = options.Converter(
    lambda raw: tuple(http_url(u) for u in raw.split(";") if u.strip()),
    "';'-separated http:// or https:// URLs with a host and no credentials, or empty",
)


OPTIONS: tuple[Option, ...] = (
    Option("kafka.bootstrap", "kafka_bootstrap", BOOTSTRAP, "Kafka brokers"),
    Option("kafka.format", "kafka_format", options.choice(*KAFKA_FORMATS),
           "kafka: Spark's Kafka connector, whose jars spark.jars names (unset: build/jvm/spark-kafka)"),
    Option("kafka.eventsTopic", "events_topic", _TEXT, "where the nodes publish events"),
    Option("kafka.actionsTopic", "actions_topic", _TEXT, "where the job publishes EXPIRE/REMOVE"),
    Option("kafka.alertsTopic", "alerts_topic", _TEXT, "where the job publishes health alerts"),
    Option("kafka.startingOffsets", "starting_offsets",
           options.text(required=True, expected="earliest | latest | JSON"), "where a query without a checkpoint starts"),
    Option("kafka.maxOffsetsPerTrigger", "max_offsets_per_trigger", _OPTIONAL_POSITIVE,
           "events per micro-batch (empty: all available)"),
    Option("monitor.checkpointDir", "checkpoint_dir", options.text(required=True, expected="directory"),
           "offsets, state, pending expiries"),
    Option("monitor.triggerIntervalMillis", "trigger_interval_millis", _MILLIS, "micro-batch interval"),
    Option("monitor.watermarkDelayMillis", "watermark_delay_millis", _MILLIS_OR_ZERO,
           "how late an event may arrive and still count; never added to a broker's timeout"),
    Option("monitor.maxClockSkewMillis", "max_clock_skew_millis", _MILLIS_OR_ZERO,
           "events stamped further ahead of the job's clock are refused, counted and alerted on"),
    Option("monitor.heartbeatTimeoutMillis", "heartbeat_timeout_millis", _MILLIS,
           "silence before EXPIRE when the registration carries no timeout"),
    Option("monitor.heartbeatIntervalMillis", "monitor_heartbeat_interval_millis", _MILLIS,
           "period of the MONITOR_HEARTBEAT action the nodes watch (it also follows every batch)"),
    Option("monitor.id", "monitor_id",
           options.text(max_chars=MAX_NAME_CHARS, expected=f"text of at most {MAX_NAME_CHARS} characters"),
           "name in actions (empty: liveness@host/<hash of the checkpoint directory>)"),
    Option("monitor.removeOnChannelClose", "remove_on_channel_close", options.BOOLEAN,
           "a broker whose connection closes at any node is removed at every node"),
    Option("monitor.forgetAfterMillis", "forget_after_millis", _MILLIS,
           "a broker gone this long (event time) is forgotten and its incidents resolved"),
    Option("monitor.metricsPort", "metrics_port", options.integer(0, 65535),
           "port of the driver's Prometheus endpoint, http://metricsBindAddress:port/metrics (0: off)"),
    Option("monitor.metricsBindAddress", "metrics_bind_address", _TEXT, "address the metrics endpoint listens on"),
    Option("alerts.flapThreshold", "flap_threshold", _COUNT,
           "a broker expiring or re-registering more than this many times ..."),
    Option("alerts.flapWindowMillis", "flap_window_millis", _MILLIS, "... within this window flaps"),
    Option("alerts.nodeSilentMillis", "node_silent_millis", _MILLIS,
           "a node whose ticks stop this long (event time) is silent"),
    Option("alerts.monitorLagMillis", "monitor_lag_millis", _MILLIS,
           "event time this far behind the wall clock means the monitor lags"),
    Option("alerts.alertmanagerUrl", "alertmanager_urls", _URLS,
           "Alertmanagers to push alerts to (v2 API), ';'-separated, e.g. http://127.0.0.1:9093 (empty: none)"),
    Option("alerts.webhookUrl", "webhook_url", _URL, "URL alerts are POSTed to as JSON batches (empty: none)"),
    Option("alerts.resendIntervalMillis", "alerts_resend_interval_millis", _MILLIS,
           "open alerts are sent again this often, with endsAt 4 intervals ahead"),
    Option("alerts.sendTimeoutMillis", "alerts_send_timeout_millis", _MILLIS, "longest wait for one POST"),
    Option("alerts.generatorUrl", "alerts_generator_url", _URL,
           "generatorURL of the alerts, e.g. the console's address (empty: none)"),
    Option("redis.url", "redis_url", options.text(expected="redis://host:port/db, redis+cluster://host:port[,host:port...] or empty"),
           "where routes are materialised (empty: no Redis); redis://[[user]:password@]host:port/db, rediss:// for TLS "
           "(?ssl_ca_certs=FILE&ssl_certfile=FILE&ssl_keyfile=FILE), redis+cluster:// for a Redis Cluster, "
           "or ${env:NAME} / ${file:PATH}"),
    Option("redis.keyPrefix", "redis_prefix", _TEXT, "first part of every key (docs/redis-keys.md)"),
    Option("routes.supportActingMaster", "support_acting_master", options.BOOLEAN, "as the nodes' supportActingMaster"),
    Option("routes.deleteTopicWithBrokerRegistration", "delete_topic_with_broker_registration", options.BOOLEAN,
           "as the nodes' deleteTopicWithBrokerRegistration"),
    Option("routes.orderMessageEnable", "order_message_enable", options.BOOLEAN,
           "as the nodes' orderMessageEnable: routes carry orderTopicConf"),
)  # fmt: skip
OPTIONS_BY_KEY = {o.key: o for o in OPTIONS}
#: the Kafka security keys, documented with the nodes' (namesrv.config) and checked together by KafkaSecurity
SECURITY_OPTION_KEYS = tuple(f"kafka.{k}" for k in SECURITY_KEYS)
_SECURITY_DOCS = {
    "kafka.security.protocol": "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
    "kafka.sasl.mechanism": "with SASL_*: PLAIN (empty), SCRAM-SHA-256 or SCRAM-SHA-512",
    "kafka.sasl.jaas.config": 'with SASL_*, instead of username/password: <LoginModule> required username="..." password="...";',
    "kafka.sasl.username": "with SASL_*: the user",
    "kafka.sasl.password": "with SASL_*: the password, or ${env:NAME} / ${file:PATH}",
    "kafka.ssl.cafile": "with SSL / SASL_SSL: PEM file of the CAs to trust (empty: the system's)",
    "kafka.ssl.certfile": "PEM client certificate and its PKCS#8 key in this one file (Spark's connector reads both here)",
    "kafka.ssl.keyfile": "PEM key of kafka.ssl.certfile: for Spark's connector this same file, or empty",
    "kafka.ssl.password": "password of an encrypted key, or ${env:NAME} / ${file:PATH}",
    "kafka.ssl.check.hostname": "the broker's certificate must name the host connected to (true)",
}


def config_from_properties(props: Mapping[str, str], base_dir: Path | None = None) -> StreamingConfig:
    """Build a config from ``key -> text``; relative paths resolve against ``base_dir`` (cwd)."""
    values: dict[str, Any] = {}
    spark = dict(SPARK_DEFAULTS)
    security: dict[str, str] = {}
    for key, text in props.items():
        if key.startswith("spark."):
            spark[key] = text.strip()
            continue
        if key in SECURITY_OPTION_KEYS:
            security[key] = text
            continue
        opt = OPTIONS_BY_KEY.get(key)
        if opt is None:
            known = ", ".join([*OPTIONS_BY_KEY, *SECURITY_OPTION_KEYS])
            raise ConfigError(f"{_SOURCE}: unknown key {key!r}; known keys are spark.* and {known}")
        values[opt.attr] = options.convert(_SOURCE, key, text, opt.convert)
    if "checkpoint_dir" in values:
        values["checkpoint_dir"] = Path(values["checkpoint_dir"])
    kafka_security = KafkaSecurity.from_settings(security, prefix="kafka.", source=_SOURCE)
    cfg = StreamingConfig(spark=spark, kafka_security_settings=security, kafka_security=kafka_security, **values)
    check_combinations(cfg)
    base = (base_dir or Path.cwd()).resolve()
    return dataclasses.replace(cfg, checkpoint_dir=(base / cfg.checkpoint_dir).resolve())


def check_combinations(cfg: StreamingConfig) -> None:
    """Refuse settings that parse one by one but cannot work together; the message names the keys.

    Node clocks may each be ``maxClockSkewMillis`` off the job's, so an on-time event can trail the
    largest event time by twice that, plus the time it waits for the next trigger: a smaller
    watermark delay would drop live brokers' heartbeats as late. A default timeout within that
    spread would expire brokers whose heartbeats are merely stamped by a slow clock.
    """
    spread = 2 * cfg.max_clock_skew_millis + cfg.trigger_interval_millis
    if cfg.watermark_delay_millis < spread:
        raise ConfigError(
            f"streaming config: monitor.watermarkDelayMillis={cfg.watermark_delay_millis} must be at least "
            f"2 x monitor.maxClockSkewMillis + monitor.triggerIntervalMillis = {spread}: with less, an on-time "
            "event from a node whose clock is behind would be dropped as late; raise the delay (it does not "
            "delay expiry) or lower the skew"
        )
    if cfg.heartbeat_timeout_millis <= 2 * cfg.max_clock_skew_millis:
        raise ConfigError(
            f"streaming config: monitor.heartbeatTimeoutMillis={cfg.heartbeat_timeout_millis} must exceed "
            f"2 x monitor.maxClockSkewMillis = {2 * cfg.max_clock_skew_millis}: clock skew alone would expire "
            "live brokers"
        )
    cfg.kafka_security.spark_options()  # raises naming the key Spark's connector cannot take
    if cfg.redis_url.strip():
        redis_clients.check_url(cfg.redis_url, key="redis.url")  # a Redis Cluster's URL included
        try:  # a Redis Cluster: the prefix becomes the keys' hash tag
            RedisKeys(cfg.redis_prefix, hash_tag=redis_clients.is_cluster(cfg.redis_url))
        except ValueError as exc:
            raise ConfigError(f"streaming config: redis.keyPrefix={cfg.redis_prefix!r}: {exc}") from None
    if cfg.node_silent_millis <= cfg.trigger_interval_millis:
        raise ConfigError(
            f"streaming config: alerts.nodeSilentMillis={cfg.node_silent_millis} must exceed "
            f"monitor.triggerIntervalMillis={cfg.trigger_interval_millis}: every node would look silent"
        )


def load_config(
    path: Path | str | None = None,
    overrides: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> StreamingConfig:
    """Defaults, then the file (``conf/streaming.properties`` when present), then ``overrides``."""
    props: dict[str, str] = {}
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read streaming config {path}: {exc.strerror}") from exc
        try:
            props.update(parse_properties(text))
        except ValueError as exc:
            raise ConfigError(f"streaming config {path}: {exc}") from exc
    props.update(overrides or {})
    return config_from_properties(props, base_dir)


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``key=value`` strings from the command line (``-D key=value``)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"-D {item!r}: write key=value, e.g. -D monitor.watermarkDelayMillis=60000")
        out[key.strip()] = value
    return out
