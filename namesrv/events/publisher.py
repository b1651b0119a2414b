"""Publish what a node sees about brokers to Kafka without ever slowing a request down.

:class:`EventPublisher` is the node's :class:`~namesrv.handlers.NodeObserver`.  On the event loop a
call only builds an :class:`~common.contract.Event`, stamps it with the node's clock and the
next sequence number, and appends it to a bounded :class:`EventQueue`; a daemon thread drains the
queue into kafka-python's producer with few events in flight, so while Kafka is slow or down events
wait in our queue, where heartbeats and ticks are dropped before registrations and failed heavy
events are redelivered (readers deduplicate by node and seq).  Every event is checked against the
schema's bounds before it is queued, so the node never sends what the monitor would refuse.
:meth:`EventPublisher.last_event_time` lets the action consumer fence the monitor's decisions.
``docs/internals/event-pipeline.md`` gives the reason for each producer setting and the drop policy.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common import kafka_clients
from common.contract import (
    MAX_HEARTBEAT_TIMEOUT_MILLIS,
    MAX_REASON_CHARS,
    MIN_HEARTBEAT_TIMEOUT_MILLIS,
    AdminOp,
    BrokerQueueInfo,
    DataVersionInfo,
    Event,
    EventType,
    HeartbeatSource,
    QueueInfo,
    SchemaError,
    UnregisterSource,
    check_event,
    encode_event,
    event_key,
    is_light,
    wall_ms,
)
from common.kafka_security import KafkaSecurity
from common.logs import LogThrottle
from common.protocol import fastjson
from common.protocol.codes import DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS, ORDER_TOPIC_CONFIG, RequestCode
from common.protocol.headers import RegisterBrokerHeader
from common.protocol.types import RegisterBrokerBody
from common.routes.manager import RouteInfoManager
from common.routes.model import RegisterBrokerResult, UnregisterRequest
from namesrv.handlers import AdminChange, NodeObserver
from namesrv.liveness import Cause, Departure, SilenceWatch

log = logging.getLogger("namesrv.events")

#: how long the sender waits after a failed send or delivery before trying again
RETRY_PAUSE_S = 0.5
#: how often one heavy event is put back after failed deliveries before it counts as failed
MAX_REDELIVERIES = 20
#: at most one warning per this many seconds about each kind of refused event or clamped timeout
INVALID_LOG_INTERVAL_S = 60.0

#: the UNREGISTER event's source for each decided departure; the other causes are a connection's end
#: (CHANNEL_CLOSED), and a test checks that every cause is one or the other
UNREGISTER_SOURCES: dict[Cause, UnregisterSource] = {
    Cause.UNREGISTER_BROKER: UnregisterSource.UNREGISTER_BROKER,
    Cause.LOCAL_EXPIRY: UnregisterSource.LOCAL_EXPIRY,
    Cause.MONITOR_EXPIRE: UnregisterSource.EXPIRE,
    Cause.MONITOR_REMOVE: UnregisterSource.REMOVE,
}

_ADMIN_OPS: dict[RequestCode, AdminOp] = {
    RequestCode.WIPE_WRITE_PERM_OF_BROKER: AdminOp.WIPE_WRITE_PERM,
    RequestCode.ADD_WRITE_PERM_OF_BROKER: AdminOp.ADD_WRITE_PERM,
    RequestCode.DELETE_TOPIC_IN_NAMESRV: AdminOp.DELETE_TOPIC,
    RequestCode.REGISTER_TOPIC_IN_NAMESRV: AdminOp.REGISTER_TOPIC,
}


@dataclass(frozen=True, slots=True)
class PublisherSettings:
    bootstrap_servers: str
    topic: str
    #: empty until the node knows its port; see EventPublisher.node_name
    node_name: str = ""
    tick_interval_ms: int = 250
    #: events held while Kafka is slow or down
    capacity: int = 10_000
    #: events handed to the producer and not yet acknowledged
    max_in_flight: int = 1_000
    #: how long ``send`` may wait for topic metadata before we put the event back
    max_block_ms: int = 2_000
    #: the producer's own retry window for one event
    delivery_timeout_ms: int = 120_000
    #: how long one produce request waits for its answer before it is sent again: well below the
    #: monitor's Kafka clients' (Kafka's default, 30 s), so that when a Kafka node freezes, the events it
    #: held reach their partitions' new leaders before the monitor gives up on it and reads on, where it
    #: would find them missing (docs/deploy.md, "Kafka replicated")
    request_timeout_ms: int = 10_000
    linger_ms: int = 5
    #: TLS and SASL (the node's ``kafka.security.*``, ``kafka.sasl.*``, ``kafka.ssl.*`` keys); plaintext by default
    security: KafkaSecurity = KafkaSecurity()

    @classmethod
    def from_config(cls, config: Any) -> PublisherSettings:
        from namesrv.config import kafka_security

        return cls(
            bootstrap_servers=config.kafka_bootstrap_servers,
            topic=config.events_topic,
            node_name=config.node_name,
            tick_interval_ms=config.tick_interval_millis,
            capacity=config.event_queue_capacity,
            security=kafka_security(config),
        )


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """A snapshot of the publisher's counters (:meth:`EventPublisher.stats`)."""

    emitted: int
    #: acknowledged by Kafka
    sent: int
    #: heartbeats and ticks dropped because the queue was full
    dropped_light: int
    #: registrations, unregistrations, closes, admin and order-conf events dropped (the queue held nothing else)
    dropped_heavy: int
    #: not acknowledged by Kafka and not retried (light events, non-retriable errors)
    failed: int
    #: heavy events put back in the queue after a failed delivery
    requeued: int
    #: observer calls with nothing to publish: a registration that lost the stateVersion check,
    #: QUERY_DATA_VERSION / BROKER_HEARTBEAT of a broker this node does not hold
    ignored: int
    #: events waiting in the queue
    queued: int
    #: events outside the schema's bounds (a name too long, a number out of range): never queued
    invalid: int = 0

    @property
    def dropped(self) -> int:
        return self.dropped_light + self.dropped_heavy


@dataclass
class _Counters:
    # emitted/ignored: written by the loop thread; sent/failed/requeued: by the sender and Kafka threads
    emitted: int = 0
    sent: int = 0
    failed: int = 0
    requeued: int = 0
    ignored: int = 0
    invalid: int = 0


class EventQueue:
    """A bounded FIFO of events in two lanes, light and heavy, that drops light events first.

    ``put`` never blocks beyond a short lock.  Both lanes stay sorted by ``seq`` (events are put
    in seq order; ``put_back`` inserts in order), and ``take`` merges them.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"event queue capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._light: deque[Event] = deque()
        self._heavy: deque[Event] = deque()
        self._cond = threading.Condition(threading.Lock())
        self.dropped_light = 0
        self.dropped_heavy = 0

    def __len__(self) -> int:
        return len(self._light) + len(self._heavy)

    def put(self, event: Event) -> None:
        with self._cond:
            (self._light if is_light(event) else self._heavy).append(event)
            self._trim()
            self._cond.notify()

    def put_back(self, events: list[Event]) -> None:
        """Return events taken earlier (unsent or undelivered) to their place in seq order."""
        with self._cond:
            for event in events:
                _insert_sorted(self._light if is_light(event) else self._heavy, event)
            self._trim()
            self._cond.notify()

    def _trim(self) -> None:
        while len(self._light) + len(self._heavy) > self.capacity:
            if self._light:
                self._light.popleft()
                self.dropped_light += 1
            else:
                self._heavy.popleft()
                self.dropped_heavy += 1

    def take(self, max_items: int, timeout: float) -> list[Event]:
        """Up to ``max_items`` oldest events in seq order; waits up to ``timeout`` for the first."""
        with self._cond:
            if not self._light and not self._heavy:
                self._cond.wait(timeout)
            out: list[Event] = []
            light, heavy = self._light, self._heavy
            while len(out) < max_items and (light or heavy):
                if not heavy or (light and light[0].seq < heavy[0].seq):
                    out.append(light.popleft())
                else:
                    out.append(heavy.popleft())
            return out

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


def _insert_sorted(lane: deque[Event], event: Event) -> None:
    # put-back events are old, so their place is near the front: scan from the left
    for i, queued in enumerate(lane):
        if event.seq < queued.seq:
            lane.insert(i, event)
            return
    lane.append(event)


ProducerFactory = Callable[[PublisherSettings, str], Any]


def kafka_producer(settings: PublisherSettings, client_id: str) -> Any:
    """The real producer (``docs/internals/event-pipeline.md`` says why each setting).

    What Kafka asks of a producer for no acknowledged record lost and none reordered across a leader
    change: ``acks="all"`` (a record is acknowledged once every in-sync replica, at least the topic's
    ``min.insync.replicas``, holds it), retries until ``delivery_timeout_ms`` (kafka-python's default
    retries are unbounded) and idempotence, under which the broker takes each partition's batches only in
    their sequence, so a retry after a leader change neither duplicates nor reorders; kafka-python 3 also
    keeps one batch in flight per partition then, and recovers from a lost producer state by bumping its
    epoch (KIP-360) rather than failing every later send.
    """
    return kafka_clients.producer(
        settings.bootstrap_servers,
        key="kafkaBootstrapServers",
        pinned=True,
        timeout_ms=min(settings.request_timeout_ms, settings.delivery_timeout_ms),
        security=settings.security,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        max_in_flight_requests_per_connection=5,  # idempotence's limit; order is kept per partition
        linger_ms=settings.linger_ms,
        max_block_ms=settings.max_block_ms,
        delivery_timeout_ms=settings.delivery_timeout_ms,
        reconnect_backoff_max_ms=1_000,
    )


def _never_raises(method: Callable[..., None]) -> Callable[..., None]:
    """Observer calls happen after the tables changed: a publishing bug must not fail the request."""

    @functools.wraps(method)
    def guarded(self: EventPublisher, *args: Any) -> None:
        try:
            method(self, *args)
        except Exception:
            log.exception("could not publish the event for %s%r", method.__name__, args)

    return guarded


class EventPublisher(NodeObserver):
    """The node's observer when Kafka is configured: events into a queue, a thread into Kafka."""

    def __init__(
        self,
        settings: PublisherSettings,
        routes: RouteInfoManager,
        *,
        clock_ms: Callable[[], int] = wall_ms,
        producer_factory: ProducerFactory = kafka_producer,
    ) -> None:
        self.settings = settings
        self.routes = routes
        #: stamped on events as they are sent; the app sets it once the port is known
        self.node_name = settings.node_name
        self.clock_ms = clock_ms
        self.queue = EventQueue(settings.capacity)
        self._counts = _Counters()
        self._reported_drops = 0
        self._producer_factory = producer_factory
        self._producer: Any = None
        self._seq = 0
        #: (cluster, addr) -> (brokerName, brokerId) from its last registration, for heartbeats
        self._identity: dict[tuple[str, str], tuple[str | None, int | None]] = {}
        self._last_event_time: dict[tuple[str, str], int] = {}
        self._silence = SilenceWatch(DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS)
        self._in_flight = threading.Semaphore(settings.max_in_flight)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_drop_log = -10.0
        self._resume_at = 0.0
        #: seq -> failed deliveries so far, for heavy events being retried
        self._attempts: dict[int, int] = {}
        self._invalid_log = LogThrottle(INVALID_LOG_INTERVAL_S)

    # ------------------------------------------------------------------ what actions fence with

    def last_event_time(self, cluster_name: str, broker_addr: str) -> int | None:
        """Event time of the last REGISTER/HEARTBEAT this node published for the broker."""
        return self._last_event_time.get((cluster_name, broker_addr))

    # ------------------------------------------------------------------ NodeObserver (loop thread)

    @_never_raises
    def broker_registered(
        self,
        header: RegisterBrokerHeader,
        body: RegisterBrokerBody,
        result: RegisterBrokerResult,
        heard_at_ms: int | None = None,
    ) -> None:
        if result.conflict:  # the registration was ignored and the address is not live
            self._counts.ignored += 1
            return
        cluster, addr, name, broker_id = header.cluster_name, header.broker_addr, header.broker_name, header.broker_id
        self._identity[(cluster, addr)] = (name, broker_id)
        dv = body.data_version
        timeout = header.heartbeat_timeout_millis
        if timeout is None:  # what the route tables apply too
            timeout = DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
        timeout = self._bounded_timeout(timeout, cluster, addr)
        common = dict(
            cluster_name=cluster, broker_name=name, broker_id=broker_id, broker_addr=addr,
            heartbeat_timeout_millis=timeout,
            data_version=DataVersionInfo(dv.counter, dv.state_version, dv.timestamp),
        )  # fmt: skip
        # a changed filter-server list, zone or acting-master flag needs the whole registration
        # too: the route model only replays REGISTER events, and a broker changes those without
        # bumping its DataVersion
        if result.topic_config_changed or result.filter_servers_changed or result.broker_data_changed:
            mappings = body.topic_queue_mapping_info_map
            filters = body.filter_server_list
            event = self._emit(
                EventType.REGISTER,
                heard_at_ms=heard_at_ms,
                **common,
                ha_server_addr=header.ha_server_addr,
                zone_name=self._zone_of(name),
                enable_acting_master=header.enable_acting_master,
                topics={
                    t: QueueInfo(tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.topic_sys_flag)
                    for t, tc in body.topic_config_table.items()
                },
                filter_server_list=None if filters is None else list(filters),
                # the dialect the broker sent: integer map keys stay integers for whoever replays it
                topic_queue_mapping_info_map={t: fastjson.dumps_legacy(info).decode() for t, info in mappings.items()}
                or None,
            )
        else:
            event = self._emit(
                EventType.HEARTBEAT, heard_at_ms=heard_at_ms, **common, source=HeartbeatSource.REGISTER_BROKER.value
            )
        # even when the event was refused: the node saw the broker alive then, so an action based
        # on older evidence must not remove it
        self._last_event_time[(cluster, addr)] = event.event_time
        self._silence.heard((cluster, addr), event.event_time, timeout)

    @_never_raises
    def broker_heartbeat(
        self, cluster_name: str, broker_addr: str, source: RequestCode, heard_at_ms: int | None = None
    ) -> None:
        if self.routes.last_seen(cluster_name, broker_addr) is None:
            self._counts.ignored += 1  # the broker will re-register; its heartbeat proves nothing here
            return
        name, broker_id = self._identity.get((cluster_name, broker_addr), (None, None))
        event = self._emit(
            EventType.HEARTBEAT,
            heard_at_ms=heard_at_ms,
            cluster_name=cluster_name, broker_name=name, broker_id=broker_id, broker_addr=broker_addr,
            source=HeartbeatSource[RequestCode(source).name].value,
        )  # fmt: skip
        self._last_event_time[(cluster_name, broker_addr)] = event.event_time
        self._silence.heard((cluster_name, broker_addr), event.event_time)

    @_never_raises
    def broker_unregistered(self, request: UnregisterRequest, departure: Departure) -> None:
        key = (request.cluster_name, request.broker_addr)
        if departure.cause.connection_ended:
            self._silence.disconnected(key)
        else:
            self._silence.forget(key)
        identity: dict[str, Any] = dict(
            cluster_name=request.cluster_name, broker_name=request.broker_name,
            broker_id=request.broker_id, broker_addr=request.broker_addr,
        )  # fmt: skip
        if departure.cause.connection_ended:
            self._emit(EventType.CHANNEL_CLOSED, **identity, reason=departure.reason[:MAX_REASON_CHARS])
        else:
            self._emit(EventType.UNREGISTER, **identity, source=UNREGISTER_SOURCES[departure.cause].value)

    @_never_raises
    def route_changed_by_admin(self, change: AdminChange) -> None:
        op = _ADMIN_OPS.get(change.code)
        if op is None:
            log.debug("no event for admin request code %s", change.code)
            return
        queue_datas = None
        if change.queue_datas is not None:
            queue_datas = [
                BrokerQueueInfo(
                    q.broker_name, QueueInfo(q.read_queue_nums, q.write_queue_nums, q.perm, q.topic_sys_flag)
                )
                for q in change.queue_datas
            ]
        self._emit(
            EventType.ADMIN,
            op=op,
            broker_name=change.broker_name,
            cluster_name=change.cluster_name,
            topic=change.topic,
            topic_count=change.topic_count,
            queue_datas=queue_datas,
        )

    @_never_raises
    def kv_config_changed(self, namespace: str, key: str, value: str | None) -> None:
        if namespace != ORDER_TOPIC_CONFIG:  # the only namespace that shows in routes
            return
        self._emit(EventType.ORDER_TOPIC_CONF, topic=key, order_topic_conf=value)

    def tick(self, local_scan: bool | None = None) -> Event:
        """A TICK (saying whether the node's own expiry scan is on), then a SILENT for each broker
        whose deadline the tick's time has passed (see :mod:`namesrv.liveness.silence`)."""
        tick = self._emit(EventType.TICK, local_scan=local_scan)
        self.report_silences(tick.event_time)
        return tick

    def report_silences(self, now: int) -> None:
        """A SILENT for each broker whose deadline ``now`` has passed, once per silence."""
        for silence in self._silence.due(now):
            cluster, addr = silence.key
            name, broker_id = self._identity.get(silence.key, (None, None))
            self._emit(
                EventType.SILENT, cluster_name=cluster, broker_name=name, broker_id=broker_id, broker_addr=addr,
                reason=f"nothing heard since {silence.last_heard} (timeout {silence.timeout_ms} ms)",
            )  # fmt: skip

    async def run_ticks(self, local_scan: Callable[[], bool] | None = None) -> None:
        """Publish a TICK (and the SILENTs due) every ``tickIntervalMillis`` (a task on the node's loop),
        saying whether ``local_scan()`` (the node's own expiry scan) is on, for the monitor's health view.

        A deadline that falls between two ticks is reported when it passes, not at the next tick:
        the monitor decides in the batch that reads the report, so every millisecond the report
        waits here is a millisecond more before the broker is gone everywhere.
        """
        interval = self.settings.tick_interval_ms
        next_tick = self.clock_ms()
        while True:
            now = self.clock_ms()
            if now >= next_tick:
                self.tick(None if local_scan is None else local_scan())
                next_tick = now + interval
            else:
                self.report_silences(now)
            deadline = self._silence.next_deadline()
            # strictly past a deadline, as RocketMQ's last + timeout < now: one millisecond after it
            wake = next_tick if deadline is None else min(next_tick, deadline + 1)
            await asyncio.sleep(max(0, wake - self.clock_ms()) / 1000)

    def _zone_of(self, broker_name: str) -> str | None:
        # every member's registration overwrites the group's zone, so this is the one just sent
        return self.routes.zone_of(broker_name)

    def _emit(self, event_type: EventType, *, heard_at_ms: int | None = None, **fields: Any) -> Event:
        """Build, check and queue one event, at ``heard_at_ms`` if given, else now; one outside the
        schema's bounds is counted, not queued."""
        at = self.clock_ms() if heard_at_ms is None else heard_at_ms
        event = Event(type=event_type, node=self.node_name, event_time=at, seq=self._seq + 1, **fields)
        try:
            check_event(event)
        except SchemaError as e:
            self._refuse(event, e)
            return event
        self._seq += 1  # only queued events take a number: a gap in seq means a lost event
        self._counts.emitted += 1
        self.queue.put(event)
        self._warn_about_drops()
        return event

    def _refuse(self, event: Event, error: SchemaError) -> None:
        self._counts.invalid += 1
        # one warning per minute per field (map keys and list indexes left out), whatever the values
        field = re.sub(r"\[.*?\]| key .*", "", str(error).split(": ", 1)[0])
        if self._invalid_log.allow((event.type, field)):
            log.warning(
                "not publishing a %s event of broker %s: %s (%d event(s) refused so far; "
                "the monitor cannot read such a record)",
                event.type.value,
                _short(event.broker_addr),
                error,
                self._counts.invalid,
            )

    def _bounded_timeout(self, timeout: int, cluster: str, addr: str) -> int:
        bounded = min(max(timeout, MIN_HEARTBEAT_TIMEOUT_MILLIS), MAX_HEARTBEAT_TIMEOUT_MILLIS)
        if bounded != timeout and self._invalid_log.allow(("heartbeatTimeoutMillis", cluster, addr)):
            log.warning(
                "broker %s of cluster %s registered with heartbeatTimeoutMillis=%d: publishing %d, the "
                "nearest value the monitor accepts ([%d, %d])",
                _short(addr),
                _short(cluster),
                timeout,
                bounded,
                MIN_HEARTBEAT_TIMEOUT_MILLIS,
                MAX_HEARTBEAT_TIMEOUT_MILLIS,
            )
        return bounded

    def stats(self) -> PublisherStats:
        c, q = self._counts, self.queue
        return PublisherStats(
            emitted=c.emitted, sent=c.sent, dropped_light=q.dropped_light, dropped_heavy=q.dropped_heavy,
            failed=c.failed, requeued=c.requeued, ignored=c.ignored, queued=len(q), invalid=c.invalid,
        )  # fmt: skip

    def _warn_about_drops(self) -> None:
        q = self.queue
        dropped = q.dropped_light + q.dropped_heavy
        now = time.monotonic()
        if dropped == self._reported_drops or now - self._last_drop_log < 10:
            return
        self._reported_drops, self._last_drop_log = dropped, now
        log.warning(
            "event queue full (%d): dropped %d heartbeat/tick and %d other event(s) so far; is Kafka at %s up?",
            q.capacity,
            q.dropped_light,
            q.dropped_heavy,
            self.settings.bootstrap_servers,
        )

    # ------------------------------------------------------------------ the sender thread

    def start(self) -> None:
        """Create the producer (no network I/O) and start the sender thread."""
        if self._thread is not None:
            return
        self._producer = self._producer_factory(self.settings, f"namesrv-{self.node_name or 'node'}")
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="namesrv-event-publisher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Send what is queued for up to ``timeout`` seconds, then close the producer."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        deadline = time.monotonic() + timeout
        while len(self.queue) and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopping.set()
        self.queue.wake()
        thread.join(max(0.1, deadline - time.monotonic()))
        try:
            self._producer.close(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:  # closing a producer that lost its broker must not fail the node's stop
            log.debug("closing the Kafka producer failed", exc_info=True)
        if len(self.queue):
            log.warning("stopping with %d unsent event(s)", len(self.queue))

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until the queue is empty and the producer has nothing pending (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while len(self.queue) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            self._producer.flush(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:
            return False
        return not len(self.queue)

    def _run(self) -> None:
        while not self._stopping.is_set():
            pause = self._resume_at - time.monotonic()
            if pause > 0:  # deliveries just failed: give the library time to reconnect
                self._stopping.wait(pause)
                continue
            batch = self.queue.take(256, timeout=0.2)
            for i, event in enumerate(batch):
                if not self._send(event):
                    self.queue.put_back(batch[i:])
                    self._resume_at = time.monotonic() + RETRY_PAUSE_S
                    break

    def _send(self, event: Event) -> bool:
        """Hand one event to the producer; False when it must be retried later (event not consumed)."""
        while not self._in_flight.acquire(timeout=0.2):
            if self._stopping.is_set():
                return False
        if not event.node:
            event.node = self.node_name
        try:
            future = self._producer.send(self.settings.topic, key=event_key(event), value=encode_event(event))
        except Exception as e:
            self._in_flight.release()
            if _worth_retrying(e):
                log.debug("cannot send events yet: %s", e)
                return False
            self._counts.failed += 1
            log.warning("dropping %s event seq=%d: %s", event.type.value, event.seq, e)
            return True
        future.add_callback(self._delivered, event)
        future.add_errback(self._undelivered, event)
        return True

    def _delivered(self, event: Event, _metadata: Any) -> None:
        self._in_flight.release()
        self._counts.sent += 1
        self._attempts.pop(event.seq, None)

    def _undelivered(self, event: Event, error: Exception) -> None:
        self._in_flight.release()
        attempts = self._attempts.pop(event.seq, 0) + 1
        if (
            not is_light(event)
            and _worth_retrying(error)
            and attempts <= MAX_REDELIVERIES
            and not self._stopping.is_set()
        ):
            self._attempts[event.seq] = attempts
            self._counts.requeued += 1
            self._resume_at = time.monotonic() + RETRY_PAUSE_S
            self.queue.put_back([event])
            return
        self._counts.failed += 1
        log.debug("event %s seq=%d not delivered: %s", event.type.value, event.seq, error)


def _short(text: str | None) -> str:
    """A name from the wire for a log line: repr'd (control characters escaped), at most ~100 characters."""
    return repr(text if text is None or len(text) <= 100 else text[:97] + "...")


def _worth_retrying(error: BaseException) -> bool:
    """Anything but errors that the same record would get again (a broker answers UNKNOWN_SERVER_ERROR,
    which kafka-python calls not retriable, for any unexpected fault of its own, passing ones too)."""
    from kafka import errors

    permanent = (
        errors.MessageSizeTooLargeError, errors.RecordListTooLargeError, errors.InvalidRecordError,
        errors.CorruptRecordError, errors.InvalidTopicError, errors.AuthorizationError,
        errors.TopicAuthorizationFailedError, errors.ClusterAuthorizationFailedError,
        errors.SaslAuthenticationFailedError, errors.UnsupportedVersionError,
        errors.UnsupportedForMessageFormatError, errors.InvalidRequiredAcksError, errors.PolicyViolationError,
        errors.KafkaConfigurationError, errors.IllegalStateError,
    )  # fmt: skip
    return isinstance(error, errors.KafkaError) and not isinstance(error, permanent)
