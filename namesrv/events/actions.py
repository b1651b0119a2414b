"""Read the monitor's actions from Kafka and apply them on the node, fenced by what the node saw.

:class:`ActionConsumer` is a daemon thread reading *every* partition of the actions topic from its
end with ``assign()`` (no consumer group: every node must see every action); malformed records are
counted and skipped.  Valid actions go to the node's event loop, where :class:`ActionApplier`
refuses an action whose times are too far ahead of the node's clock (AHEAD) or whose monitor the
node does not obey (:class:`MonitorTrust`), tells the watchdog the monitor is alive, and applies
EXPIRE / REMOVE as an unregistration only if the node has published nothing newer for the broker
than the action's ``lastHeartbeat``.  docs/internals/node-liveness.md tells the whole story: the
offsets after a lost log, the fencing, which monitor is obeyed, and why the consumer pauses 50 ms.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common import kafka_clients, kafka_refusals
from common.contract import Action, ActionType, SchemaError, decode_action, wall_ms
from common.kafka_security import KafkaSecurity
from common.logs import LogThrottle
from common.retrying import retry_until_stopped
from common.routes.manager import RouteInfoManager
from common.routes.model import UnregisterRequest
from namesrv.handlers import NodeObserver
from namesrv.liveness import REFUSAL_LOG_INTERVAL_S, Departure, MonitorTrust, MonitorWatchdog, departure

#: pause after an empty fetch: latency an action may gain against an idle node's CPU (docs/internals/node-liveness.md)
IDLE_PAUSE_S = 0.05

log = logging.getLogger("namesrv.actions")

#: what applying each removing action tells the observer (the UNREGISTER event's source)
_DEPARTURES: dict[ActionType, Departure] = {
    ActionType.EXPIRE: departure.MONITOR_EXPIRE,
    ActionType.REMOVE: departure.MONITOR_REMOVE,
}


class Outcome(enum.Enum):
    APPLIED = "applied"
    #: the node saw the broker after the action's lastHeartbeat
    STALE = "stale"
    #: the broker is not in this node's tables (already gone, or a duplicate)
    ABSENT = "absent"
    #: the address now has another broker id than the one the monitor decided about
    ROLE_CHANGED = "role_changed"
    #: the unregistration queue was full
    REJECTED = "rejected"
    #: MONITOR_HEARTBEAT
    HEARD = "heard"
    #: sent by a monitor this node does not obey (trustedMonitors, or another one is deciding)
    UNTRUSTED = "untrusted"
    #: lastHeartbeat or watermark further ahead of the node's clock than maxClockSkewMillis
    AHEAD = "ahead"


@dataclass(frozen=True, slots=True)
class ActionStats:
    """Counters of the consumer thread and of the applier, as one snapshot."""

    received: int
    #: malformed records and unknown action types
    skipped: int
    applied: int
    stale: int
    absent: int
    role_changed: int
    rejected: int
    monitor_heartbeats: int
    #: from monitors this node does not obey
    untrusted: int = 0
    #: lastHeartbeat / watermark too far ahead of the node's clock
    ahead: int = 0


class ActionApplier:
    """Applies actions on the node's event-loop thread (the only thread that touches its counters)."""

    def __init__(
        self,
        routes: RouteInfoManager,
        submit_unregister: Callable[[list[UnregisterRequest]], bool],
        last_event_time: Callable[[str, str], int | None],
        observer: NodeObserver,
        watchdog: MonitorWatchdog | None = None,
        *,
        trust: MonitorTrust | None = None,
        max_clock_skew_ms: int = 10_000,
        wall_clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.routes = routes
        self.submit_unregister = submit_unregister
        self.last_event_time = last_event_time
        self.observer = observer
        self.watchdog = watchdog
        #: None: obey every monitor (tests of the fencing alone)
        self.trust = trust
        self.max_clock_skew_ms = max_clock_skew_ms
        self.wall_clock_ms = wall_clock_ms
        self.counts: dict[Outcome, int] = dict.fromkeys(Outcome, 0)
        self._ahead_warnings = LogThrottle(REFUSAL_LOG_INTERVAL_S)

    def apply(self, action: Action) -> Outcome:
        outcome = self._apply(action)
        self.counts[outcome] += 1
        if outcome is not Outcome.HEARD:
            log.info(
                "%s %r/%r (lastHeartbeat=%s) from %r: %s",
                action.type.value,
                action.cluster_name,
                action.broker_addr,
                action.last_heartbeat,
                action.monitor,
                outcome.value,
            )
        return outcome

    def _apply(self, action: Action) -> Outcome:
        if self._ahead(action):
            return Outcome.AHEAD
        if self.trust is not None and not self.trust.admit(action.monitor, action.type.value):
            return Outcome.UNTRUSTED
        if self.watchdog is not None:
            self.watchdog.heard(action.monitor, action.decided_through)
        if action.type is ActionType.MONITOR_HEARTBEAT:
            return Outcome.HEARD
        cluster, addr = action.cluster_name, action.broker_addr
        assert cluster is not None and addr is not None and action.last_heartbeat is not None  # decode_action
        seen = self.last_event_time(cluster, addr)
        if seen is not None and seen > action.last_heartbeat:
            return Outcome.STALE
        request = self.routes.build_unregister_request(cluster, addr)
        if request is None:
            return Outcome.ABSENT
        if action.broker_id is not None and request.broker_id is not None and action.broker_id != request.broker_id:
            return Outcome.ROLE_CHANGED
        if not self.submit_unregister([request]):
            return Outcome.REJECTED
        self.observer.broker_unregistered(request, _DEPARTURES[action.type])
        return Outcome.APPLIED

    def _ahead(self, action: Action) -> bool:
        """True (and a warning, once a minute per monitor) if the action's times are in our future."""
        limit = self.wall_clock_ms() + self.max_clock_skew_ms
        times = (
            ("lastHeartbeat", action.last_heartbeat),
            ("watermark", action.watermark),
            ("decidedThrough", action.decided_through),
        )
        for name, value in times:
            if value is not None and value > limit:
                if self._ahead_warnings.allow(action.monitor):
                    log.warning(
                        "refusing %s of %r from monitor %r: its %s is %d ms ahead of this node's clock, more than "
                        "maxClockSkewMillis=%d; the monitor's event time ran ahead (an event stamped in the future?) "
                        "or a clock is wrong", action.type.value, action.broker_addr, action.monitor, name,
                        value - limit + self.max_clock_skew_ms, self.max_clock_skew_ms,
                    )  # fmt: skip
                return True
        return False


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    bootstrap_servers: str
    topic: str
    client_id: str = "namesrv-actions"
    #: how long one metadata / offsets request may take before we retry
    request_timeout_ms: int = 5_000
    #: pause after an empty fetch (see IDLE_PAUSE_S)
    idle_pause_s: float = IDLE_PAUSE_S
    #: TLS and SASL (the node's ``kafka.security.*``, ``kafka.sasl.*``, ``kafka.ssl.*`` keys); plaintext by default
    security: KafkaSecurity = KafkaSecurity()

    @classmethod
    def from_config(cls, config: Any, client_id: str = "namesrv-actions") -> ConsumerSettings:
        from namesrv.config import kafka_security

        return cls(config.kafka_bootstrap_servers, config.actions_topic, client_id, security=kafka_security(config))


def kafka_consumer(settings: ConsumerSettings) -> Any:
    # pinned (common.kafka_clients), so that building the consumer needs no broker
    return kafka_clients.consumer(
        settings.bootstrap_servers,
        key="kafkaBootstrapServers",
        pinned=True,
        timeout_ms=settings.request_timeout_ms,
        security=settings.security,
        client_id=settings.client_id,
        # only reached when our position is past the log (it was lost); everything there is new
        auto_offset_reset="earliest",
        # the topic is created by whoever deploys Kafka, with its configured partition count
        allow_auto_create_topics=False,
        fetch_max_wait_ms=200,
        reconnect_backoff_max_ms=1_000,
    )


def topic_partitions(settings: ConsumerSettings) -> list[int]:
    """Partition ids of the actions topic; raises while Kafka is unreachable or the topic is missing.

    Uses the admin client, whose bootstrap and requests have timeouts; the consumer's
    ``partitions_for_topic`` waits forever while no broker answers.
    """
    admin = kafka_clients.admin(
        settings.bootstrap_servers,
        key="kafkaBootstrapServers",
        timeout_ms=settings.request_timeout_ms,
        security=settings.security,
        client_id=f"{settings.client_id}-admin",
        reconnect_backoff_max_ms=1_000,
    )
    try:
        (info,) = admin.describe_topics([settings.topic])
    finally:
        admin.close()
    if info.get("error_code") or not info.get("partitions"):
        raise LookupError(f"topic {settings.topic} not found (error code {info.get('error_code')}); create it")
    return sorted(p["partition_index"] for p in info["partitions"])


class ActionConsumer:
    """A daemon thread reading every partition of the actions topic from its end."""

    def __init__(
        self,
        settings: ConsumerSettings,
        deliver: Callable[[Action], None],
        *,
        consumer_factory: Callable[[ConsumerSettings], Any] = kafka_consumer,
        partitions: Callable[[ConsumerSettings], list[int]] = topic_partitions,
    ) -> None:
        """``deliver`` is called on this thread for every valid action (hand it to your loop)."""
        self.settings = settings
        self.deliver = deliver
        self._consumer_factory = consumer_factory
        self._partitions = partitions
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        #: True once every partition's start offset is settled (tests wait for it)
        self.ready = threading.Event()
        self.received = 0
        self.skipped = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="namesrv-action-consumer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        thread, self._thread = self._thread, None
        self._stopping.set()
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        try:
            partitions = self._retry("read the partitions of the actions topic", self._partitions, self.settings)
            if partitions is None:
                return
            consumer = self._consumer_factory(self.settings)
        except Exception:
            log.exception("action consumer could not start; the node keeps its local expiry scan")
            return
        try:
            self._consume(consumer, partitions)
        except Exception:
            log.exception("action consumer stopped by an error; the node falls back to its local expiry scan")
        finally:
            try:
                consumer.close()
            except Exception:
                log.debug("closing the action consumer failed", exc_info=True)

    def _retry(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` until it succeeds, backing off up to 5 s; None if we are stopped first."""
        # with TLS or SASL, a broker that refuses them looks like one that is down: the hint says so,
        # and why, when one of the node's clients of these servers was refused since we started trying
        settings, since = self.settings, time.monotonic()

        def problem() -> str:
            refused = kafka_refusals.last_refusal(settings.bootstrap_servers, since=since)
            return f"cannot {what} yet{settings.security.failure_hint(refused)}"

        return retry_until_stopped(lambda: fn(*args), self._stopping, problem=problem, log=log)

    def _consume(self, consumer: Any, partitions: list[int]) -> None:
        from kafka import TopicPartition

        tps = [TopicPartition(self.settings.topic, p) for p in partitions]
        consumer.assign(tps)
        ends = self._retry(
            "read the end offsets of the actions topic", consumer.end_offsets, tps, self.settings.request_timeout_ms
        )
        if ends is None:
            return
        for tp in tps:
            consumer.seek(tp, ends[tp])
        log.info(
            "reading actions from %s partitions %s at %s",
            self.settings.topic,
            partitions,
            {tp.partition: o for tp, o in ends.items()},
        )
        self.ready.set()
        while not self._stopping.is_set():
            try:
                batches = consumer.poll(timeout_ms=0)  # one fetch round; the idle pause below paces us
            except Exception as e:  # the library reconnects; keep polling
                log.debug("polling actions failed: %s", e)
                self._stopping.wait(0.5)
                continue
            if not batches:
                # poll(timeout_ms=0) returns at once: pause, or an idle node burns a core
                self._stopping.wait(self.settings.idle_pause_s)
            for records in batches.values():
                for record in records:
                    self._handle(record.value)

    def _handle(self, value: bytes | None) -> None:
        self.received += 1
        try:
            action = decode_action(value or b"")
        except SchemaError as e:
            self.skipped += 1
            log.debug("skipping an action record: %s", e)
            return
        self.deliver(action)


def loop_deliverer(loop: asyncio.AbstractEventLoop, apply: Callable[[Action], Any]) -> Callable[[Action], None]:
    """A ``deliver`` for :class:`ActionConsumer` that runs ``apply`` on ``loop``'s thread."""

    def deliver(action: Action) -> None:
        try:
            loop.call_soon_threadsafe(apply, action)
        except RuntimeError:  # the loop is closed: the node is stopping
            log.debug("dropping an action: the node's loop is closed")

    return deliver


def action_stats(consumer: ActionConsumer, applier: ActionApplier) -> ActionStats:
    c = applier.counts
    return ActionStats(
        received=consumer.received, skipped=consumer.skipped, applied=c[Outcome.APPLIED], stale=c[Outcome.STALE],
        absent=c[Outcome.ABSENT], role_changed=c[Outcome.ROLE_CHANGED], rejected=c[Outcome.REJECTED],
        monitor_heartbeats=c[Outcome.HEARD], untrusted=c[Outcome.UNTRUSTED], ahead=c[Outcome.AHEAD],
    )  # fmt: skip
