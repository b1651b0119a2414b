"""Assemble a node from its configuration and run it until a signal stops it."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from common.routes.manager import RouteInfoManager
from namesrv import gcpolicy
from namesrv.acl import Acl, AclFileError, load_acl_file
from namesrv.config import ConfigError, NamesrvConfig
from namesrv.handlers import HANDLERS, HandlerContext, NodeObserver
from namesrv.kvconfig import KVConfigManager
from namesrv.liveness import (
    ExpiryScan,
    MinIdOutlet,
    MonitorDownPager,
    MonitorWatchdog,
    RedisFallback,
    UnregisterBatcher,
)
from namesrv.notify import BrokerNotifier
from namesrv.repeats import Repeats
from namesrv.request_stats import RequestStats
from namesrv.server import RemotingServer
from namesrv.tls import tls_settings
from namesrv.warmstart import WarmStartReport, drop_unconfirmed, warm_start

if TYPE_CHECKING:
    from common.metrics import MetricsServer
    from namesrv.events.link import KafkaLink

log = logging.getLogger("namesrv")


@dataclass
class Node:
    """The node: a started name server and its parts, for the CLI and for tests that run one in-process."""

    server: RemotingServer
    #: what every request handler reaches: the route tables, the KV store, the settings, the outlets
    context: HandlerContext
    unregistrations: UnregisterBatcher
    expiry: ExpiryScan
    #: sends the NOTIFY_MIN_BROKER_ID_CHANGE requests
    notifier: BrokerNotifier
    #: events out / actions in; None when kafkaBootstrapServers is empty
    kafka: KafkaLink | None = None
    #: what warm start loaded from Redis; None when it is off or found nothing usable
    warm_start: WarmStartReport | None = None
    #: the Prometheus endpoint; None when metricsPort is 0
    metrics: MetricsServer | None = None
    #: keeps the routes in Redis right while no monitor decides; None without Kafka and redisUrl
    fallback: RedisFallback | None = None

    @property
    def port(self) -> int:
        return self.server.port

    async def stop(self) -> None:
        await self.server.stop()
        await self.notifier.stop()  # after the server, whose connections and tasks may still change a minimum
        if self.kafka is not None:  # after the server, so closed connections are still published
            await self.kafka.stop()
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.stop)
        if self.fallback is not None:  # after the server, whose stop ended its task
            await asyncio.to_thread(self.fallback.close)


@dataclass(frozen=True, slots=True)
class NodeParts:
    """What :func:`build_node` wires together, before anything runs."""

    context: HandlerContext
    unregistrations: UnregisterBatcher
    expiry: ExpiryScan
    #: events out / actions in; None when kafkaBootstrapServers is empty
    kafka: KafkaLink | None


def build_node(
    config: NamesrvConfig, *, notify_brokers: MinIdOutlet | None = None, observer: NodeObserver | None = None
) -> NodeParts:
    """The node's parts, each built with everything it needs, those it reports to first.

    ``notify_brokers`` sends each NOTIFY_MIN_BROKER_ID_CHANGE (None: nothing is sent, a node without a
    server); ``observer`` is told about brokers and routes (None: the event publisher when
    ``kafkaBootstrapServers`` is set, else one that tells no one).  Raises AclFileError when
    ``aclEnable`` is on and the accounts file is unusable, ConfigError for unusable Kafka settings.
    """
    acl = Acl(load_acl_file(config.acl_file_path), config.acl_check_reads) if config.acl_enable else None
    routes = RouteInfoManager(config)
    kv = KVConfigManager(config.kv_config_file)
    kv.load()
    unregistrations = UnregisterBatcher(
        routes, config.un_register_broker_queue_capacity, on_min_broker_id_change=notify_brokers
    )
    publisher = None
    if config.kafka_bootstrap_servers.strip():
        from namesrv.events.link import event_publisher  # only nodes with Kafka import kafka-python

        if observer is not None:
            raise ValueError("a node with Kafka has the event publisher as its observer")
        publisher = observer = event_publisher(config, routes)
    if observer is None:
        observer = NodeObserver()
    expiry = ExpiryScan(
        routes,
        config.scan_not_active_broker_interval,
        on_expired=observer.broker_unregistered,
        on_min_broker_id_change=notify_brokers,
    )
    # a node with Kafka has a monitor to watch, and learns from watching it when it stood still itself
    watchdog = (
        MonitorWatchdog(expiry, config.monitor_silence_fallback_millis, grace_ms=config.monitor_decision_grace_millis)
        if publisher is not None
        else None
    )
    context = HandlerContext(
        config=config,
        routes=routes,
        kv=kv,
        submit_unregister=unregistrations.submit,
        observer=observer,
        started_at=time.monotonic(),
        now=time.monotonic,
        notify_brokers=notify_brokers,
        acl=acl,
        heard_at_ms=watchdog.heard_at_ms if watchdog is not None else lambda: None,
    )
    kafka = None
    if publisher is not None and watchdog is not None:
        from namesrv.events.link import KafkaLink

        kafka = KafkaLink.build(config, publisher, context, watchdog)
    return NodeParts(context, unregistrations, expiry, kafka)


async def start_node(config: NamesrvConfig, *, own_process: bool = False) -> Node:
    """Start a node; ``own_process``: the process is the node's alone (``namesrv start``), so its
    garbage-collector policy is switched on (:mod:`namesrv.gcpolicy`); a node started inside another
    process (the tests') leaves that process's collector as it is."""
    tls_settings(config)  # unusable TLS keys or files are refused before anything starts
    notifier = BrokerNotifier.from_config(config)
    parts = build_node(config, notify_brokers=notifier.notify)
    context, unregistrations, expiry, kafka = parts.context, parts.unregistrations, parts.expiry, parts.kafka
    # before listening, so the first client already gets the provisional routes
    warm = await warm_start(config, context.routes)
    if own_process:
        gcpolicy.enable()  # what start-up built, warm-started routes included, is frozen before the first client
    server = RemotingServer(
        context,
        catching_up=kafka.watchdog.catching_up if kafka is not None else lambda: False,
        repeats=Repeats(context),
        # requests are counted only for the metrics endpoint
        request_stats=RequestStats(HANDLERS) if config.metrics_port > 0 else None,
    )
    await server.start(config.bind_address, config.listen_port)
    server.spawn(unregistrations.run(context.worker), "batch-unregistration")
    server.spawn(expiry.run(context.worker), "expiry-scan")
    if warm is not None:
        server.spawn(
            drop_unconfirmed(context.routes, on_min_broker_id_change=context.min_broker_id_changed),
            "warm-start-deadlines",
        )
    fallback = None
    if kafka is not None:
        from namesrv.events.link import default_node_name

        node_name = config.node_name or default_node_name(server.port)
        kafka.start(asyncio.get_running_loop(), server.spawn, node_name, context.worker)
        if config.redis_url.strip():  # the nodes keep the routes in Redis right when no monitor decides in time
            fallback = RedisFallback.from_config(config, node_name, context.routes, kafka.watchdog)
            if fallback is not None:
                server.spawn(fallback.run(context.worker), "redis-fallback")
            pager = MonitorDownPager.from_config(config, node_name, kafka.watchdog)  # no monitor, no alerts: page
            if pager is not None:
                server.spawn(pager.run(), "monitor-down-pager")
    if context.acl is not None:
        log.warning(
            "signed requests required: aclFile=%s accounts=%d globalWhiteRemoteAddresses=%d checkReads=%s",
            config.acl_file_path,
            len(context.acl.table.accounts),
            len(context.acl.table.global_white),
            config.acl_check_reads,
        )
        if config.acl_reload_interval_millis > 0:
            server.spawn(
                reload_acl(context.acl, config.acl_file_path, config.acl_reload_interval_millis / 1000), "acl-reload"
            )
    running = Node(server, context, unregistrations, expiry, notifier, kafka, warm, fallback=fallback)
    if config.stats_interval_millis > 0:
        server.spawn(_log_stats(running, config.stats_interval_millis / 1000), "stats")
    if config.metrics_port > 0:
        try:
            running.metrics = _serve_metrics(running, config, server.request_stats)
        except BaseException:
            await running.stop()  # the node already listens: do not leave it half started
            raise
    log.warning(
        "The Name Server boot success. serializeType=%s, address %s:%d, metrics %s",
        config.response_serialize_type,
        config.bind_address,
        server.port,
        running.metrics.url if running.metrics is not None else "off",
    )
    return running


def _serve_metrics(running: Node, config: NamesrvConfig, requests: RequestStats | None) -> MetricsServer:
    """Serve the requests counted, with the node's tables and Kafka traffic, over HTTP."""
    from common.metrics import serve
    from namesrv.metrics import NodeCollector

    assert requests is not None  # counted whenever metricsPort is set
    collector = NodeCollector(
        running.context.routes, lambda: len(running.server.connections), running.expiry, requests, running.kafka
    )
    try:
        return serve([collector], config.bind_address, config.metrics_port)
    except OSError as e:
        raise ConfigError(f"metricsPort={config.metrics_port}: cannot listen on {config.bind_address}: {e}") from e


def node_stats(running: Node) -> dict[str, object]:
    """What an operator wants to know about a node at a glance: tables, connections, Kafka traffic."""
    counts = running.context.routes.counts()
    stats: dict[str, object] = {"brokers": counts.brokers, "groups": counts.groups, "topics": counts.topics}
    stats["connections"] = len(running.server.connections)
    stats["localExpiry"] = "on" if running.expiry.enabled else "off (monitor decides)"
    if running.context.acl is not None:
        stats["aclRefused"] = running.context.acl.refused
    if running.kafka is not None:
        published = running.kafka.publisher_stats()
        stats.update(
            eventsSent=published.sent,
            eventsQueued=published.queued,
            eventsDropped=published.dropped_light + published.dropped_heavy,
            eventsInvalid=published.invalid,
        )
        if running.kafka.consumer is not None:
            actions = running.kafka.action_stats()
            stats.update(
                actionsApplied=actions.applied,
                actionsStale=actions.stale,
                actionsSkipped=actions.skipped,
                actionsUntrusted=actions.untrusted,
                actionsAhead=actions.ahead,
            )
    return stats


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


async def reload_acl(acl: Acl, path: Path, interval_s: float) -> None:
    """Replace the accounts when the file changes; a file that does not validate leaves the old ones."""
    stamp = _file_stamp(path)
    while True:
        await asyncio.sleep(interval_s)
        now = _file_stamp(path)
        if now == stamp:
            continue
        stamp = now
        try:
            table = await asyncio.to_thread(load_acl_file, path)
        except AclFileError as e:
            log.warning("aclFile changed but is not usable, keeping the accounts loaded before: %s", e)
            continue
        acl.table = table
        log.warning(
            "aclFile reloaded: %s accounts=%d globalWhiteRemoteAddresses=%d",
            path,
            len(table.accounts),
            len(table.global_white),
        )


async def _log_stats(running: Node, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        log.info("stats", extra={"fields": node_stats(running)})


async def serve(config: NamesrvConfig) -> None:
    """Run a node in the foreground; the first SIGTERM/SIGINT stops it gracefully, a second one forces."""
    running = await start_node(config, own_process=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stopping.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            raise SystemExit(1)
        log.warning("%s received: shutting down", signal.Signals(signum).name)
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    await stopping.wait()
    await running.stop()
    log.warning("name server stopped")


def run(config: NamesrvConfig) -> None:
    try:
        import uvloop
    except ImportError:  # uvloop is a speed-up, not a requirement
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))
