"""The node's link to the monitor: publisher, action consumer and watchdog, started and stopped together.

Built by :mod:`namesrv.app` for a node with ``kafkaBootstrapServers`` (see :mod:`namesrv.events`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from common import kafka_clients, kafka_refusals
from common.contract import MAX_NAME_CHARS
from common.kafka_clients import bootstrap_list
from common.routes.manager import RouteInfoManager
from namesrv.config import ConfigError, NamesrvConfig
from namesrv.events.actions import (
    ActionApplier,
    ActionConsumer,
    ActionStats,
    ConsumerSettings,
    action_stats,
    loop_deliverer,
)
from namesrv.events.publisher import EventPublisher, PublisherSettings, PublisherStats
from namesrv.handlers import HandlerContext
from namesrv.liveness import MonitorTrust, MonitorWatchdog, trusted_monitors

__all__ = ["KafkaLink", "check_bootstrap_servers", "check_names", "default_node_name", "event_publisher"]

log = logging.getLogger("namesrv.events")

Spawn = Callable[[Coroutine[Any, Any, Any], str], Any]


def default_node_name(port: int) -> str:
    return f"{socket.gethostname()}:{port}"


def check_bootstrap_servers(servers: str) -> None:
    """Reject a kafkaBootstrapServers value kafka-python would choke on, before the node listens."""
    bootstrap_list(servers, "kafkaBootstrapServers")


def check_names(config: NamesrvConfig) -> None:
    """Names this node writes into events, or compares with actions', must fit the schema's bound."""
    names = [("nodeName", config.node_name)]
    names += [("trustedMonitors", m) for m in trusted_monitors(config)]
    for key, name in names:
        if len(name) > MAX_NAME_CHARS:
            raise ConfigError(
                f"{key}: a name of {len(name)} characters; events and actions allow at most {MAX_NAME_CHARS}, "
                f"choose a shorter one"
            )


def event_publisher(config: NamesrvConfig, routes: RouteInfoManager) -> EventPublisher:
    """The observer of a node with Kafka, built before the parts that report to it; refuses settings
    kafka-python or the event schema would choke on."""
    check_bootstrap_servers(config.kafka_bootstrap_servers)
    check_names(config)
    return EventPublisher(PublisherSettings.from_config(config), routes)


@dataclass
class KafkaLink:
    """The Kafka side of one node: publisher (its observer), action consumer, applier, watchdog."""

    config: NamesrvConfig
    publisher: EventPublisher
    applier: ActionApplier
    watchdog: MonitorWatchdog
    #: built by :meth:`start`, once the node's loop and name are known
    consumer: ActionConsumer | None = None

    @classmethod
    def build(
        cls, config: NamesrvConfig, publisher: EventPublisher, context: HandlerContext, watchdog: MonitorWatchdog
    ) -> KafkaLink:
        """The parts around ``publisher``, which ``context`` has as its observer (before the server serves)."""
        trust = MonitorTrust(trusted_monitors(config), watchdog)
        applier = ActionApplier(
            context.routes,
            context.submit_unregister,
            publisher.last_event_time,
            publisher,
            watchdog,
            trust=trust,
            max_clock_skew_ms=config.max_clock_skew_millis,
        )
        return cls(config, publisher, applier, watchdog)

    def start(self, loop: asyncio.AbstractEventLoop, spawn: Spawn, node_name: str, worker: Executor) -> None:
        """Start the threads and the loop tasks (the watchdog's removals on ``worker``); nothing here waits for Kafka."""
        # before any client is built: the consumer's warnings quote why Kafka refuses the node's clients
        kafka_refusals.install_refusal_tracking()
        kafka_clients.demote_slow_step_warnings()
        self.publisher.node_name = node_name
        self.consumer = ActionConsumer(
            ConsumerSettings.from_config(self.config, client_id=f"namesrv-actions-{node_name}"),
            loop_deliverer(loop, self.applier.apply),
        )
        self.publisher.start()
        self.consumer.start()
        spawn(self.publisher.run_ticks(lambda: self.watchdog.expiry.enabled), "event-ticks")
        spawn(self.watchdog.run(worker), "monitor-watchdog")
        log.info(
            "publishing events to %s at %s as node %s; reading actions from %s",
            self.publisher.settings.topic,
            self.publisher.settings.bootstrap_servers,
            node_name,
            self.config.actions_topic,
        )

    async def stop(self, timeout: float = 3.0) -> None:
        """Stop reading actions, send what is queued for up to ``timeout`` seconds, close."""
        if self.consumer is not None:  # nothing to flush: do not wait long for a thread stuck connecting
            await asyncio.to_thread(self.consumer.stop, min(timeout, 1.0))
        await asyncio.to_thread(self.publisher.stop, timeout)

    def publisher_stats(self) -> PublisherStats:
        return self.publisher.stats()

    def action_stats(self) -> ActionStats:
        assert self.consumer is not None, "start() first"
        return action_stats(self.consumer, self.applier)
