"""Typed name server configuration from Java-style ``.properties`` files.

:class:`NamesrvConfig` is the one table of options: each field carries its Java key, Java type,
group and a line of description, and :data:`OPTIONS`, parsing, GET_NAMESRV_CONFIG rendering and the
table in docs/configuration.md (:func:`options_markdown`) are all derived from it.  Start-up (:func:`load_config`) is
strict, so a typo stops the server instead of falling back to a default as Java does.  Updates
(:func:`apply_update`, UPDATE_NAMESRV_CONFIG) follow Java's lenient parsing, because admin tools
rely on it, but are bounded and checked whole, and change the running configuration only once the
file is on disk.  TLS and PROXY keys are :data:`RESTART_ONLY`, secrets are shown as
:data:`REDACTED`, and unknown keys are kept as ``extras`` as Java keeps them.
``docs/internals/config.md`` has the rules in full.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import javaproperties

from common.kafka_security import SECRET_KEYS as _KAFKA_SECRETS
from common.kafka_security import KafkaSecurity
from common.options import (
    BOOLEAN,
    ConfigError,
    Converter,
    choice,
    convert,
    integer,
    is_secret_reference,
    parse_integer,
    text,
)
from common.paging import http_url
from common.properties import decode_properties, parse_properties
from common.protocol.codes import ResponseCode
from namesrv.fileio import write_atomically

__all__ = [
    "ConfigError",
    "NamesrvConfig",
    "NodeOption",
    "OPTIONS",
    "OPTIONS_BY_KEY",
    "HARD_BLACKLIST",
    "RESTART_ONLY",
    "REDACTED",
    "load_config",
    "apply_update",
    "render_properties",
    "config_properties",
    "config_blacklist",
    "options_markdown",
    "check_combinations",
    "kafka_security",
    "SECRET_KEYS",
    "UpdateResult",
    "Updated",
    "Blacklisted",
    "Unparsable",
    "PersistFailed",
    "UpdateRefused",
    "oversized_update",
    "MAX_UPDATE_BODY_BYTES",
    "MAX_UPDATE_KEYS",
    "MAX_UPDATE_VALUE_CHARS",
]

log = logging.getLogger(__name__)

JavaType = Literal["String", "int", "long", "boolean"]

GROUP_NAMESRV = "NamesrvConfig"
GROUP_NETTY = "NettyServerConfig"
GROUP_TLS = "TLS and PROXY protocol"
GROUP_OURS = "namesrv-py"

#: keys whose values GET_NAMESRV_CONFIG, ``-p`` and the logs show masked (``redisUrl`` only loses its password)
SECRET_KEYS = frozenset(f"kafka.{k}" for k in _KAFKA_SECRETS)
#: the Kafka security keys: credentials and files are decided at start-up, never by a remote update
_KAFKA_SECURITY_KEYS = frozenset(
    {"kafka.security.protocol", "kafka.sasl.mechanism", "kafka.sasl.username", "kafka.ssl.cafile", "kafka.ssl.certfile"}
    | {"kafka.ssl.keyfile", "kafka.ssl.check.hostname"}
    | SECRET_KEYS
)
#: keys UPDATE_NAMESRV_CONFIG always refuses (``DefaultRequestProcessor.initConfigBlackList``), and ours:
#: anyone who reaches the port could otherwise switch access control off or rewrite the Kafka credentials
HARD_BLACKLIST = (
    frozenset({"configBlackList", "configStorePath", "kvConfigPath", "rocketmqHome"})
    | frozenset({"aclEnable", "aclFile", "aclCheckReads", "aclReloadIntervalMillis"})
    | _KAFKA_SECURITY_KEYS
)

_INT_RANGES = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def _home() -> Path:
    return Path.home()


def _default_rocketmq_home() -> str:
    # Java aborts start-up when this is unset; nothing here needs it, so fall back to the home dir
    return os.environ.get("ROCKETMQ_HOME") or str(_home())


def _default_kv_config_path() -> str:
    return str(_home() / "namesrv" / "kvConfig.json")


def _default_config_store_path() -> str:
    return str(_home() / "namesrv" / "namesrv.properties")


def _opt(
    default: Any,
    key: str,
    java_type: JavaType,
    group: str,
    doc: str,
    *,
    choices: tuple[str, ...] | None = None,
    bounds: tuple[int, int] | None = None,
    default_doc: str | None = None,
    effect: bool = True,
    secret: bool = False,
) -> Any:
    """A field of the table; ``effect=False`` marks a key that is accepted (and shown) but changes nothing,
    ``secret=True`` one whose value is never shown (GET_NAMESRV_CONFIG and ``-p`` print ``******``)."""
    metadata = {
        "key": key,
        "type": java_type,
        "group": group,
        "doc": doc,
        "choices": choices,
        "bounds": bounds,
        "default_doc": default_doc,
        "effect": effect,
        "secret": secret,
    }
    if callable(default):
        return field(default_factory=default, metadata=metadata)
    return field(default=default, metadata=metadata)


_N, _S, _T, _O = GROUP_NAMESRV, GROUP_NETTY, GROUP_TLS, GROUP_OURS


@dataclass
class NamesrvConfig:
    """All options of a node: RocketMQ's NamesrvConfig and NettyServerConfig keys, then ours."""

    # --- NamesrvConfig (common/.../namesrv/NamesrvConfig.java) ---
    rocketmq_home: str = _opt(
        _default_rocketmq_home,
        "rocketmqHome",
        "String",
        _N,
        "RocketMQ home directory; aclFile defaults to conf/plain_acl.yml under it, as in RocketMQ",
        default_doc="$ROCKETMQ_HOME, else ~",
    )
    kv_config_path: str = _opt(
        _default_kv_config_path,
        "kvConfigPath",
        "String",
        _N,
        "JSON file of the KV config store (relative paths resolve against the working directory)",
        default_doc="~/namesrv/kvConfig.json",
    )
    config_store_path: str = _opt(
        _default_config_store_path,
        "configStorePath",
        "String",
        _N,
        "file UPDATE_NAMESRV_CONFIG rewrites; the -c file unless that file sets this key",
        default_doc="~/namesrv/namesrv.properties",
    )
    product_env_name: str = _opt(
        "center",
        "productEnvName",
        "String",
        _N,
        "cluster-test mode: topic whose route answers for unknown topics",
        effect=False,
    )
    cluster_test: bool = _opt(
        False,
        "clusterTest",
        "boolean",
        _N,
        "cluster-test mode: unknown topics get the route of productEnvName",
        effect=False,
    )
    order_message_enable: bool = _opt(
        False,
        "orderMessageEnable",
        "boolean",
        _N,
        "add orderTopicConf from KV namespace ORDER_TOPIC_CONFIG to topic routes",
    )
    return_order_topic_config_to_broker: bool = _opt(
        True,
        "returnOrderTopicConfigToBroker",
        "boolean",
        _N,
        "answer REGISTER_BROKER with the ORDER_TOPIC_CONFIG KV table",
    )
    client_request_thread_pool_nums: int = _opt(
        8,
        "clientRequestThreadPoolNums",
        "int",
        _N,
        "workers for GET_ROUTEINFO_BY_TOPIC",
        effect=False,
    )
    default_thread_pool_nums: int = _opt(
        16,
        "defaultThreadPoolNums",
        "int",
        _N,
        "workers for every other request code",
        effect=False,
    )
    client_request_thread_pool_queue_capacity: int = _opt(
        50000,
        "clientRequestThreadPoolQueueCapacity",
        "int",
        _N,
        "pending GET_ROUTEINFO_BY_TOPIC requests before rejecting",
        effect=False,
    )
    default_thread_pool_queue_capacity: int = _opt(
        10000,
        "defaultThreadPoolQueueCapacity",
        "int",
        _N,
        "pending other requests before rejecting",
        effect=False,
    )
    scan_not_active_broker_interval: int = _opt(
        5000,
        "scanNotActiveBrokerInterval",
        "long",
        _N,
        "period (ms) of the local scan that expires silent brokers",
    )
    un_register_broker_queue_capacity: int = _opt(
        3000,
        "unRegisterBrokerQueueCapacity",
        "int",
        _N,
        "queued UNREGISTER_BROKER requests before answering SYSTEM_ERROR",
    )
    support_acting_master: bool = _opt(
        False,
        "supportActingMaster",
        "boolean",
        _N,
        "let a slave stand in for a dead master in routes",
    )
    enable_all_topic_list: bool = _opt(
        True,
        "enableAllTopicList",
        "boolean",
        _N,
        "answer GET_ALL_TOPIC_LIST_FROM_NAMESERVER (else SYSTEM_ERROR 'disable')",
    )
    enable_topic_list: bool = _opt(
        True,
        "enableTopicList",
        "boolean",
        _N,
        "answer GET_TOPICS_BY_CLUSTER and the unit topic lists",
    )
    notify_min_broker_id_changed: bool = _opt(
        False,
        "notifyMinBrokerIdChanged",
        "boolean",
        _N,
        "send NOTIFY_MIN_BROKER_ID_CHANGE (905) to a group's brokers when its smallest id changes"
        " (on departures: acting-master groups only)",
    )
    enable_controller_in_namesrv: bool = _opt(
        False,
        "enableControllerInNamesrv",
        "boolean",
        _N,
        "embed the DLedger/JRaft controller",
        effect=False,
    )
    need_wait_for_service: bool = _opt(
        False,
        "needWaitForService",
        "boolean",
        _N,
        "refuse GET_ROUTEINFO_BY_TOPIC until waitSecondsForService after start",
    )
    wait_seconds_for_service: int = _opt(
        45,
        "waitSecondsForService",
        "int",
        _N,
        "seconds needWaitForService waits after start",
    )
    delete_topic_with_broker_registration: bool = _opt(
        False,
        "deleteTopicWithBrokerRegistration",
        "boolean",
        _N,
        "drop topics missing from a registration (pair with broker enableSingleTopicRegister)",
    )
    config_black_list: str = _opt(
        "configBlackList;configStorePath;kvConfigPath",
        "configBlackList",
        "String",
        _N,
        "';'-separated keys UPDATE_NAMESRV_CONFIG refuses, besides the built-in four",
    )

    # --- NettyServerConfig (remoting/.../netty/NettyServerConfig.java) ---
    bind_address: str = _opt("0.0.0.0", "bindAddress", "String", _S, "address to listen on")
    listen_port: int = _opt(9876, "listenPort", "int", _S, "TCP port of the remoting protocol", bounds=(0, 65535))
    server_worker_threads: int = _opt(8, "serverWorkerThreads", "int", _S, "Netty worker threads", effect=False)
    server_callback_executor_threads: int = _opt(
        0, "serverCallbackExecutorThreads", "int", _S, "threads for async callbacks (0 = default)", effect=False
    )
    server_selector_threads: int = _opt(3, "serverSelectorThreads", "int", _S, "Netty selector threads", effect=False)
    server_oneway_semaphore_value: int = _opt(
        256, "serverOnewaySemaphoreValue", "int", _S, "concurrent one-way sends allowed", effect=False
    )
    server_async_semaphore_value: int = _opt(
        64, "serverAsyncSemaphoreValue", "int", _S, "concurrent async sends allowed", effect=False
    )
    server_channel_max_idle_time_seconds: int = _opt(
        120, "serverChannelMaxIdleTimeSeconds", "int", _S, "close a connection idle this long"
    )
    server_socket_snd_buf_size: int = _opt(
        0, "serverSocketSndBufSize", "int", _S, "SO_SNDBUF bytes of each accepted connection (0 = OS default)"
    )
    server_socket_rcv_buf_size: int = _opt(
        0, "serverSocketRcvBufSize", "int", _S, "SO_RCVBUF bytes of each accepted connection (0 = OS default)"
    )
    write_buffer_high_water_mark: int = _opt(
        0,
        "writeBufferHighWaterMark",
        "int",
        _S,
        "answer bytes waiting for a peer at which the node stops reading from it; used with"
        " writeBufferLowWaterMark when both are > 0, as in Java (else the event loop's default, 64 KiB)",
    )
    write_buffer_low_water_mark: int = _opt(
        0,
        "writeBufferLowWaterMark",
        "int",
        _S,
        "answer bytes waiting for a peer under which the node reads from it again; used with"
        " writeBufferHighWaterMark when both are > 0",
    )
    server_socket_backlog: int = _opt(1024, "serverSocketBacklog", "int", _S, "listen() backlog")
    server_netty_worker_group_enable: bool = _opt(
        True, "serverNettyWorkerGroupEnable", "boolean", _S, "separate Netty worker group", effect=False
    )
    server_pooled_byte_buf_allocator_enable: bool = _opt(
        True, "serverPooledByteBufAllocatorEnable", "boolean", _S, "pooled buffers", effect=False
    )
    enable_shutdown_gracefully: bool = _opt(
        False, "enableShutdownGracefully", "boolean", _S, "drain requests before stopping", effect=False
    )
    shutdown_wait_time_seconds: int = _opt(
        30, "shutdownWaitTimeSeconds", "int", _S, "longest graceful shutdown", effect=False
    )
    use_epoll_native_selector: bool = _opt(
        False, "useEpollNativeSelector", "boolean", _S, "native epoll transport", effect=False
    )

    # --- TLS (RocketMQ's TlsSystemConfig keys, there -D system properties) and the PROXY protocol.
    # Read once at start-up (namesrv/tls.py); UPDATE_NAMESRV_CONFIG refuses them (RESTART_ONLY).
    tls_server_mode: str = _opt(
        "permissive",
        "tls.server.mode",
        "String",
        _T,
        "disabled (plaintext only), permissive (TLS and plaintext on the same port, told apart by the first"
        " byte; TLS only once a certificate or test mode is set) or enforcing (TLS only); as RocketMQ",
        choices=("disabled", "permissive", "enforcing"),
    )
    tls_config_file: str = _opt(
        "/etc/rocketmq/tls.properties",
        "tls.config.file",
        "String",
        _T,
        "file whose tls.server.* and tls.test.mode.enable values override these (as RocketMQ); read when"
        " tls.server.mode is not disabled; a missing file is skipped unless this key names it explicitly",
    )
    tls_test_mode_enable: bool = _opt(
        False,
        "tls.test.mode.enable",
        "boolean",
        _T,
        "serve TLS with a self-signed certificate made at start-up (openssl), for tests only; RocketMQ's"
        " default is true",
    )
    tls_server_cert_path: str = _opt(
        "", "tls.server.certPath", "String", _T, "PEM certificate chain of the node (with tls.server.keyPath)"
    )
    tls_server_key_path: str = _opt(
        "", "tls.server.keyPath", "String", _T, "PEM private key of the node, PKCS#8 or traditional, maybe encrypted"
    )
    tls_server_key_password: str = _opt(
        "",
        "tls.server.keyPassword",
        "String",
        _T,
        "password of an encrypted tls.server.keyPath (never shown by GET_NAMESRV_CONFIG)",
        secret=True,
    )
    tls_server_trust_cert_path: str = _opt(
        "",
        "tls.server.trustCertPath",
        "String",
        _T,
        "PEM CA certificates client certificates are verified against (needed unless need.client.auth is none)",
    )
    tls_server_need_client_auth: str = _opt(
        "none",
        "tls.server.need.client.auth",
        "String",
        _T,
        "client certificates: none (not asked for), optional (verified if sent) or require",
        choices=("none", "optional", "require"),
    )
    handshake_timeout_millis: int = _opt(
        10000,
        "handshakeTimeoutMillis",
        "long",
        _T,
        "when TLS or the PROXY protocol is on: close a connection that has not sent its first bytes and finished"
        " its PROXY preamble and TLS handshake within this many ms",
        bounds=(1, 3_600_000),
    )
    proxy_protocol_mode: str = _opt(
        "disabled",
        "proxyProtocolMode",
        "String",
        _T,
        "HAProxy PROXY protocol v1/v2 ahead of the first bytes: disabled; optional (used when present, as RocketMQ:"
        " only if every peer that can reach the port is trusted); required (every connection must start with one)",
        choices=("disabled", "optional", "required"),
    )

    # --- ours (defaults keep plain RocketMQ behaviour) ---
    response_serialize_type: str = _opt(
        "JSON",
        "responseSerializeType",
        "String",
        _O,
        "header type of responses: JSON, ROCKETMQ, or ECHO (the request's, as 4.9.8 does)",
        choices=("JSON", "ROCKETMQ", "ECHO"),
    )
    log_level: str = _opt(
        "WARNING",
        "logLevel",
        "String",
        _O,
        "Python logging level of the server",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    )
    kafka_bootstrap_servers: str = _opt(
        "",
        "kafkaBootstrapServers",
        "String",
        _O,
        "Kafka host:port list for events/actions; empty = standalone, local liveness scan only",
    )
    events_topic: str = _opt("namesrv-events", "eventsTopic", "String", _O, "Kafka topic nodes publish events to")
    actions_topic: str = _opt("namesrv-actions", "actionsTopic", "String", _O, "Kafka topic of the monitor's actions")
    # Kafka security: the Kafka client's own names (common.kafka_security.SECURITY_KEYS), as in the job's file
    kafka_security_protocol: str = _opt(
        "PLAINTEXT",
        "kafka.security.protocol",
        "String",
        _O,
        "how the node reaches Kafka: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
        choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
    )
    kafka_sasl_mechanism: str = _opt(
        "", "kafka.sasl.mechanism", "String", _O, "with SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty = PLAIN"
    )
    kafka_sasl_jaas_config: str = _opt(
        "",
        "kafka.sasl.jaas.config",
        "String",
        _O,
        'with SASL_*, instead of the next two: `<LoginModule> required username="..." password="...";` as Java'
        " clients write it (secret: shown masked)",
    )
    kafka_sasl_username: str = _opt("", "kafka.sasl.username", "String", _O, "with SASL_*: the user")
    kafka_sasl_password: str = _opt(
        "",
        "kafka.sasl.password",
        "String",
        _O,
        "with SASL_*: the password, or ${env:NAME} / ${file:PATH} to read it from there (secret: shown masked)",
    )
    kafka_ssl_cafile: str = _opt(
        "", "kafka.ssl.cafile", "String", _O, "with SSL / SASL_SSL: PEM file of the CAs to trust; empty = the system's"
    )
    kafka_ssl_certfile: str = _opt(
        "", "kafka.ssl.certfile", "String", _O, "with SSL / SASL_SSL: PEM client certificate, for brokers that ask"
    )
    kafka_ssl_keyfile: str = _opt("", "kafka.ssl.keyfile", "String", _O, "PEM key of kafka.ssl.certfile")
    kafka_ssl_password: str = _opt(
        "",
        "kafka.ssl.password",
        "String",
        _O,
        "password of an encrypted kafka.ssl.keyfile, or ${env:NAME} / ${file:PATH} (secret: shown masked)",
    )
    kafka_ssl_check_hostname: bool = _opt(
        True,
        "kafka.ssl.check.hostname",
        "boolean",
        _O,
        "with SSL / SASL_SSL: the broker's certificate must name the host connected to",
    )
    monitor_silence_fallback_millis: int = _opt(
        30000,
        "monitorSilenceFallbackMillis",
        "long",
        _O,
        "after this long without actions, expire brokers with the local scan",
    )
    monitor_decision_grace_millis: int = _opt(
        1500,
        "monitorDecisionGraceMillis",
        "long",
        _O,
        "a broker this long past its deadline here, which the monitor has not decided on (its heartbeat"
        " says how far it has), is expired by this node itself; the monitor's dead broker leaves Redis too",
        bounds=(100, 60_000),
    )
    trusted_monitors: str = _opt(
        "",
        "trustedMonitors",
        "String",
        _O,
        "';'-separated monitor ids (the job's monitor.id) whose actions this node obeys; empty = the first one"
        " heard, and another only after it was silent for monitorSilenceFallbackMillis",
    )
    max_clock_skew_millis: int = _opt(
        10000,
        "maxClockSkewMillis",
        "long",
        _O,
        "refuse an action whose lastHeartbeat or watermark is further ahead of this node's clock (ms);"
        " as the job's monitor.maxClockSkewMillis",
        bounds=(0, 86_400_000),
    )
    event_queue_capacity: int = _opt(
        10000,
        "eventQueueCapacity",
        "int",
        _O,
        "events held while Kafka is slow or down; past it the oldest heartbeats are dropped first",
        bounds=(1, 10_000_000),
    )
    node_name: str = _opt(
        "", "nodeName", "String", _O, "name of this node in events (at most 1024 characters); empty = host:port"
    )
    tick_interval_millis: int = _opt(
        250,
        "tickIntervalMillis",
        "long",
        _O,
        "period (ms) of TICK events, which move the monitor's event time while brokers are silent and carry the node's SILENT reports",
        bounds=(1, 86_400_000),
    )
    redis_url: str = _opt(
        "",
        "redisUrl",
        "String",
        _O,
        "Redis holding materialised routes; empty = none. redis://[[user]:password@]host:port/db, rediss://... for"
        " TLS (?ssl_ca_certs=FILE), redis+cluster://host:port[,host:port...] for a Redis Cluster (name several nodes), or ${env:NAME} /"
        " ${file:PATH}; shown and logged without its password",
    )
    redis_key_prefix: str = _opt(
        "namesrv",
        "redisKeyPrefix",
        "String",
        _O,
        "prefix of the keys the streaming job writes (its redis.keyPrefix); one per name-server cluster",
    )
    warm_start_from_redis: bool = _opt(
        False,
        "warmStartFromRedis",
        "boolean",
        _O,
        "serve the routes in redisUrl as provisional at start-up, until brokers register (docs/warm-start.md)",
    )
    # the job's paging keys, by the same names: the nodes page MONITOR_DOWN, which no job can (docs/monitor.md)
    alerts_monitor_lag_millis: int = _opt(
        60000,
        "alerts.monitorLagMillis",
        "long",
        _O,
        "with Kafka and redisUrl: raise MONITOR_DOWN in Redis (and page the receivers below, if any) once no"
        " monitor was heard for this long (ms; the job's alerts.monitorLagMillis); read at start-up",
        bounds=(1, 86_400_000),
    )
    alerts_alertmanager_url: str = _opt(
        "",
        "alerts.alertmanagerUrl",
        "String",
        _O,
        "';'-separated Alertmanagers MONITOR_DOWN is pushed to (v2 API), as the job's; empty = none; read at start-up",
    )
    alerts_webhook_url: str = _opt(
        "",
        "alerts.webhookUrl",
        "String",
        _O,
        "URL MONITOR_DOWN is POSTed to as JSON, as the job's alerts are; empty = none; read at start-up",
    )
    alerts_resend_interval_millis: int = _opt(
        60000,
        "alerts.resendIntervalMillis",
        "long",
        _O,
        "an open MONITOR_DOWN is sent again this often, with endsAt 4 intervals ahead (the job's key); read at start-up",
        bounds=(1, 86_400_000),
    )
    stats_interval_millis: int = _opt(
        60000,
        "statsIntervalMillis",
        "long",
        _O,
        "period (ms) of the node's `stats` log line (INFO level); 0 = never",
    )
    acl_enable: bool = _opt(
        False,
        "aclEnable",
        "boolean",
        _O,
        "refuse write and admin requests that are neither signed by an account of aclFile (RocketMQ's ACL 1.0)"
        " nor from a whitelisted address: NO_PERMISSION (16)",
    )
    acl_file: str = _opt(
        "",
        "aclFile",
        "String",
        _O,
        "accounts and address whitelists in plain_acl.yml's format (read at start-up; a bad file stops it)",
        default_doc="$rocketmqHome/conf/plain_acl.yml",
    )
    acl_check_reads: bool = _opt(
        False,
        "aclCheckReads",
        "boolean",
        _O,
        "with aclEnable, check read requests (routes, cluster info, KV and config reads) the same way",
    )
    acl_reload_interval_millis: int = _opt(
        5000,
        "aclReloadIntervalMillis",
        "long",
        _O,
        "period (ms) of checking aclFile for changes; a changed file that is valid replaces the accounts, an"
        " invalid one is logged and the old accounts stay; 0 = never",
        bounds=(0, 86_400_000),
    )
    metrics_port: int = _opt(
        0,
        "metricsPort",
        "int",
        _O,
        "TCP port of the Prometheus metrics endpoint (http://bindAddress:port/metrics); 0 = off",
        bounds=(0, 65535),
    )

    #: keys of the -c file we do not know, echoed back as Java does
    extras: dict[str, str] = field(default_factory=dict, metadata={"internal": True})

    @property
    def kv_config_file(self) -> Path:
        return Path(self.kv_config_path).expanduser()

    @property
    def config_store_file(self) -> Path:
        return Path(self.config_store_path).expanduser()

    @property
    def acl_file_path(self) -> Path:
        """``aclFile``, or where RocketMQ looks (``rocketmq.acl.plain.file`` under ROCKETMQ_HOME)."""
        if self.acl_file.strip():
            return Path(self.acl_file.strip()).expanduser()
        return Path(self.rocketmq_home).expanduser() / "conf" / "plain_acl.yml"


@dataclass(frozen=True)
class NodeOption:
    """One row of the option table."""

    attr: str
    key: str
    java_type: JavaType
    group: str
    doc: str
    choices: tuple[str, ...] | None
    bounds: tuple[int, int] | None
    default_doc: str
    #: False: accepted, kept and shown by GET_NAMESRV_CONFIG (as Java does), but nothing reads it
    effect: bool
    #: True: a password; shown as ****** everywhere but in the file an update rewrites
    secret: bool
    #: start-up parsing of the value (strict; see the module docstring)
    converter: Converter[Any]


def _converter(java_type: JavaType, choices: tuple[str, ...] | None, bounds: tuple[int, int] | None) -> Converter[Any]:
    if java_type == "boolean":
        return BOOLEAN
    if java_type in _INT_RANGES:
        low, high = bounds or _INT_RANGES[java_type]
        return integer(low, high, f"{java_type} ({low}..{high})")
    if choices:
        return choice(*choices, fold=_fold(choices))
    return text(expected="string")


def _fold(choices: tuple[str, ...]) -> Callable[[str], str]:
    """RocketMQ writes its TLS modes in lower case and its other choices in upper case; either is accepted."""
    return str.lower if all(c == c.lower() for c in choices) else str.upper


def _build_options() -> tuple[NodeOption, ...]:
    rows = []
    for f in dataclasses.fields(NamesrvConfig):
        md = f.metadata
        if md.get("internal"):
            continue
        if md["default_doc"] is not None:
            default_doc = md["default_doc"]
        else:
            default_doc = _format_value(f.default)
        rows.append(
            NodeOption(
                f.name,
                md["key"],
                md["type"],
                md["group"],
                md["doc"],
                md["choices"],
                md["bounds"],
                default_doc,
                md["effect"],
                md["secret"],
                _converter(md["type"], md["choices"], md["bounds"]),
            )
        )
    return tuple(rows)


def _format_value(value: Any) -> str:
    """Java's ``String.valueOf`` for the types we hold."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


OPTIONS: tuple[NodeOption, ...] = _build_options()
OPTIONS_BY_KEY: dict[str, NodeOption] = {o.key: o for o in OPTIONS}
#: keys read once at start-up that UPDATE_NAMESRV_CONFIG refuses: a peer that can reach the port must
#: not be able to turn TLS off, swap certificates or claim other addresses from the next restart on
RESTART_ONLY = frozenset(o.key for o in OPTIONS if o.group == GROUP_TLS)
#: what a secret's value is shown as
REDACTED = "******"


# ---------------------------------------------------------------------------------------------
# value parsing


def _parse_java(opt: NodeOption, raw: str) -> Any:
    """``MixAll.properties2Object`` parsing for run-time updates; raises ValueError."""
    if opt.java_type == "boolean":
        return raw.lower() == "true"
    if opt.java_type in _INT_RANGES:
        # Java does not trim numbers; bounds are only a start-up check
        return parse_integer(raw, *_INT_RANGES[opt.java_type])
    value = raw.strip()
    if opt.choices:
        folded = _fold(opt.choices)(value)
        if folded not in opt.choices:
            raise ValueError(raw)
        return folded
    return value


# ---------------------------------------------------------------------------------------------
# .properties text


def _property_line(key: str, value: str) -> str:
    # Java writes ``key=value`` unescaped, which reloads wrongly when a value has a backslash,
    # a line break or leading blanks; keep Java's bytes whenever they reload to the same pair
    plain = f"{key}={value}"
    if javaproperties.loads(plain) == {key: value}:
        return plain
    return javaproperties.join_key_value(key, value, ensure_ascii=False)


def _java_string_order(key: str) -> bytes:
    # Java's TreeMap<String> compares UTF-16 code units
    return key.encode("utf-16-be", "surrogatepass")


def _masked(key: str, value: str) -> str:
    """``value`` as anyone but the file may see it: secrets masked, ``${env:...}``/``${file:...}`` shown."""
    from common.redis_clients import redact_url  # imports no more than the standard library

    if key in SECRET_KEYS and value and not is_secret_reference(value):
        return REDACTED
    if key == "redisUrl" and value:
        return redact_url(value)
    return value


def config_properties(cfg: NamesrvConfig, *, reveal_secrets: bool = False) -> dict[str, str]:
    """Every non-null option and extra as Java-formatted strings; secrets masked unless ``reveal_secrets``."""
    props = dict(cfg.extras)
    for opt in OPTIONS:
        value = getattr(cfg, opt.attr)
        if value is not None:
            text = _format_value(value)
            props[opt.key] = text if reveal_secrets else (REDACTED if opt.secret and text else _masked(opt.key, text))
    return props


def render_properties(cfg: NamesrvConfig, *, reveal_secrets: bool = False) -> str:
    """GET_NAMESRV_CONFIG body and ``-p`` (secrets masked), or the persisted file (``reveal_secrets``).

    ``key=value`` lines sorted by key.
    """
    props = config_properties(cfg, reveal_secrets=reveal_secrets)
    return "".join(_property_line(key, props[key]) + "\n" for key in sorted(props, key=_java_string_order))


# ---------------------------------------------------------------------------------------------
# start-up


def _apply_strict(cfg: NamesrvConfig, props: Mapping[str, str], source: str) -> None:
    for key, raw in props.items():
        opt = OPTIONS_BY_KEY.get(key)
        if opt is None:
            log.info("%s: unknown key %r kept as an extra (echoed by GET_NAMESRV_CONFIG)", source, key)
            cfg.extras[key] = raw
            continue
        setattr(cfg, opt.attr, convert(source, key, raw, opt.converter))


def load_config(path: Path | None, overrides: Mapping[str, str] | None = None) -> NamesrvConfig:
    """Build the config: defaults, then the ``-c`` file, then ``overrides`` (command line).

    As in Java, ``configStorePath`` becomes the file's path, so updates rewrite that file, unless
    the file sets ``configStorePath`` itself (Java ignores it there; we honour it so a tracked
    ``conf/`` file can send runtime updates to ``run/``).
    Raises :class:`ConfigError` for a missing or unreadable file or a value of the wrong type.
    """
    cfg = NamesrvConfig()
    if path is not None:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist; pass an existing file to -c") from None
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read ({exc.strerror}); check its permissions") from None
        try:
            props = parse_properties(decode_properties(data))
        except ValueError as exc:
            raise ConfigError(f"config file {path} is not a valid .properties file: {exc}") from None
        _apply_strict(cfg, props, str(path))
        if "configStorePath" not in props:
            cfg.config_store_path = str(path)
    if overrides:
        _apply_strict(cfg, overrides, "command line")
    check_combinations(cfg)
    return cfg


def check_combinations(cfg: NamesrvConfig) -> None:
    """Refuse values that parse one by one but cannot work together; the message names the keys.

    Java refuses the same at start-up (``WriteBufferWaterMark`` throws when low > high).
    """
    high, low = cfg.write_buffer_high_water_mark, cfg.write_buffer_low_water_mark
    if high > 0 and low > 0 and low > high:
        raise ConfigError(
            f"writeBufferLowWaterMark={low} must not exceed writeBufferHighWaterMark={high}; lower the first or "
            "raise the second"
        )
    kafka_security(cfg)
    alert_receivers(cfg)


def alert_receivers(cfg: NamesrvConfig) -> tuple[tuple[str, ...], str]:
    """The Alertmanagers and the webhook MONITOR_DOWN goes to, checked (:class:`ConfigError` naming the key)."""
    key, raw = "alerts.alertmanagerUrl", cfg.alerts_alertmanager_url
    try:
        alertmanagers = tuple(http_url(u) for u in raw.split(";") if u.strip())
        key, raw = "alerts.webhookUrl", cfg.alerts_webhook_url
        return alertmanagers, http_url(raw)
    except ValueError as exc:
        raise ConfigError(
            f"{key}: {str(exc)!r} is not an http:// or https:// URL with a host and no credentials"
        ) from None


def kafka_security(cfg: NamesrvConfig) -> KafkaSecurity:
    """The node's Kafka security from its ``kafka.*`` keys, checked whole (:class:`ConfigError` naming the key)."""
    values = {opt.key: _format_value(getattr(cfg, opt.attr)) for opt in OPTIONS if opt.key in _KAFKA_SECURITY_KEYS}
    # true is the default, not a setting a plaintext protocol would ignore; only false is
    values["kafka.ssl.check.hostname"] = "" if cfg.kafka_ssl_check_hostname else "false"
    return KafkaSecurity.from_settings(values, prefix="kafka.", source="namesrv config")


# ---------------------------------------------------------------------------------------------
# UPDATE_NAMESRV_CONFIG


@dataclass(frozen=True)
class Updated:
    """Applied and persisted.  ``ignored`` holds values Java would also ignore (bad type)."""

    changed: dict[str, str]
    ignored: dict[str, str]
    dropped: tuple[str, ...]
    code: ResponseCode = ResponseCode.SUCCESS
    remark: str | None = None


@dataclass(frozen=True)
class Blacklisted:
    """At least one key may only be changed by a restart; nothing was applied."""

    keys: tuple[str, ...]
    code: ResponseCode = ResponseCode.NO_PERMISSION
    remark: str = "Can not update config in black list."


@dataclass(frozen=True)
class Unparsable:
    """The body is not ``.properties`` text (a malformed ``\\uXXXX``); nothing was applied."""

    reason: str
    code: ResponseCode = ResponseCode.SYSTEM_ERROR
    remark: str = "string2Properties error"


@dataclass(frozen=True)
class PersistFailed:
    """The store file could not be written; the in-memory config is unchanged.

    Java keeps the change in memory and answers SUCCESS; we keep memory and disk equal instead.
    """

    path: str
    reason: str
    code: ResponseCode = ResponseCode.SYSTEM_ERROR

    @property
    def remark(self) -> str:
        return f"cannot persist config to {self.path}: {self.reason}"


@dataclass(frozen=True)
class UpdateRefused:
    """The update is too large, or a key or value is one no configuration may hold; nothing was applied."""

    remark: str
    code: ResponseCode = ResponseCode.SYSTEM_ERROR


UpdateResult = Updated | Blacklisted | Unparsable | PersistFailed | UpdateRefused

#: UPDATE_NAMESRV_CONFIG limits: a real update sets a handful of keys with short values
MAX_UPDATE_BODY_BYTES = 64 * 1024
MAX_UPDATE_KEYS = 256
MAX_UPDATE_VALUE_CHARS = 4096
#: C0 and C1 controls, DEL, and lone surrogates (which UTF-8 cannot encode)
_UNSTORABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")

# one lock for every config object: updates are rare, and readers only read single attributes
_UPDATE_LOCK = threading.Lock()


def _java_split(text: str, sep: str) -> list[str]:
    # String.split drops trailing empty strings
    parts = text.split(sep)
    while len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts


def config_blacklist(cfg: NamesrvConfig) -> frozenset[str]:
    """Keys UPDATE_NAMESRV_CONFIG refuses."""
    return HARD_BLACKLIST | RESTART_ONLY | frozenset(_java_split(cfg.config_black_list, ";"))


def _shown(text: str, limit: int = 64) -> str:
    """A key for a remark: printable, and short however long the key is."""
    shown = ascii(text[:limit])
    return shown + "..." if len(text) > limit else shown


def _update_refusal(props: Mapping[str, str]) -> str | None:
    if len(props) > MAX_UPDATE_KEYS:
        return f"an update may set at most {MAX_UPDATE_KEYS} keys, this one sets {len(props)}"
    for key, value in props.items():
        for what, checked in (("key", key), ("value", value)):
            if len(checked) > MAX_UPDATE_VALUE_CHARS:
                return f"the {what} of {_shown(key)} has {len(checked)} characters, more than the limit of {MAX_UPDATE_VALUE_CHARS}"
            if _UNSTORABLE.search(checked):
                return f"the {what} of {_shown(key)} holds a control character or a lone surrogate"
    return None


def oversized_update(size: int) -> UpdateRefused:
    """The answer to an update body of ``size`` bytes, over :data:`MAX_UPDATE_BODY_BYTES`."""
    return UpdateRefused(f"an update body may have at most {MAX_UPDATE_BODY_BYTES} bytes, this one has {size}")


def apply_update(cfg: NamesrvConfig, properties: str | bytes) -> UpdateResult:
    """UPDATE_NAMESRV_CONFIG on ``cfg``: persist to ``cfg.config_store_path``, then change ``cfg`` in place.

    ``properties`` is the request body (UTF-8 bytes) or its text.  Nothing changes unless the file
    was written.  Blocking (three fsyncs): the server calls it off the event loop.
    """
    if len(properties) > MAX_UPDATE_BODY_BYTES:
        return oversized_update(len(properties))
    if isinstance(properties, bytes):
        try:
            properties = properties.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Unparsable(f"not UTF-8: {exc.reason}")
    try:
        props = parse_properties(properties)
    except ValueError as exc:
        return Unparsable(str(exc))
    problem = _update_refusal(props)
    if problem is not None:
        return UpdateRefused(problem)
    blocked = sorted(key for key in props if key in config_blacklist(cfg))
    if blocked:
        return Blacklisted(tuple(blocked))

    with _UPDATE_LOCK:
        values: dict[str, Any] = {}
        extras = dict(cfg.extras)
        changed: dict[str, str] = {}
        ignored: dict[str, str] = {}
        dropped: list[str] = []
        for key, raw in props.items():
            opt = OPTIONS_BY_KEY.get(key)
            if opt is not None:
                try:
                    value = _parse_java(opt, raw)
                except ValueError:
                    log.info("update ignored %s=%r: not a valid %s", key, raw, opt.converter.expected)
                    ignored[key] = raw
                    continue
                values[opt.attr] = value
                changed[key] = _format_value(value)
            elif key in extras:
                extras[key] = raw
                changed[key] = raw
            else:
                dropped.append(key)
        candidate = dataclasses.replace(cfg, extras=extras, **values)
        target = cfg.config_store_file
        try:
            write_atomically(target, render_properties(candidate, reveal_secrets=True).encode("utf-8"))
        except Exception as exc:  # whatever went wrong, the running configuration stays as it was
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            log.error("cannot persist config to %s: %s", target, reason)
            return PersistFailed(str(target), reason)
        for attr, value in values.items():
            setattr(cfg, attr, value)
        cfg.extras = extras
    log.info("config updated: %s", {k: _masked(k, v) for k, v in changed.items()})
    return Updated(changed, ignored, tuple(dropped))


def options_markdown() -> str:
    """The option table of docs/configuration.md, one section per group."""
    lines: list[str] = []
    for group in (GROUP_NAMESRV, GROUP_NETTY, GROUP_TLS, GROUP_OURS):
        lines += [f"### {group}", "", "| Key | Type | Default | Meaning |", "|---|---|---|---|"]
        for opt in OPTIONS:
            if opt.group == group:
                default = f"`{opt.default_doc}`" if opt.default_doc else "(empty)"
                meaning = opt.doc if opt.effect else f"accepted, no effect; in Java: {opt.doc}"
                lines.append(f"| `{opt.key}` | {opt.java_type} | {default} | {meaning} |")
        lines.append("")
    return "\n".join(lines)
