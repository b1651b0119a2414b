"""The query's ``foreachBatch`` sink (:class:`BatchSink`) and the monitor's own heartbeat beside it.

Each micro-batch's decisions, in order: actions to the actions topic, alerts to the alerts topic
and the log, routes, cluster info and health to Redis, then the alerts to the pager
(:mod:`streaming.paging`), which delivers them from its own threads. A restarted query replays
its last batch: the actions go out again (nodes ignore duplicates) and Redis skips it.

Threads: the sink's state (route model, alert book, health, lineage and Redis flags) is its
own, and every thread that changes it holds the sink's one lock for its whole turn: the thread
that starts the query (:meth:`BatchSink.set_lineage`), Spark's batch thread (:meth:`BatchSink.process`)
and :class:`MonitorHeartbeat` (:meth:`BatchSink.monitor_tick`). A batch waits for the lineage
on that same lock. The metrics endpoint's thread only reads, without it (:meth:`BatchSink.brokers_alive`,
:meth:`BatchSink.open_alert_kinds`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from common import redis_clients
from common.contract import (
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
from common.routes import RouteSettings
from common.routes.materialised import BrokerKey
from common.routes.snapshot import SnapshotError
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
from streaming.config import StreamingConfig
from streaming.health import HealthBook
from streaming.liveness import KIND_ACTION, KIND_ALERT, KIND_ROUTE
from streaming.paging import Pager
from streaming.publisher import KafkaPublisher
from streaming.routes import RedisRouteStore, RemovalsChanged, RouteChanges, RouteModel, StoreChanged, WritesLost
from streaming.status import MonitorStatus

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: a Redis outage, a failover, or a cluster none of whose nodes answers: the decisions go on without Redis
REDIS_FAILURES = redis_clients.failures()

#: what Spark's StreamExecution recognises as a stop interrupting a foreachBatch call
_INTERRUPTED = (
    "py4j.protocol.Py4JJavaError: An error occurred while calling collectToPython: java.lang.InterruptedException"
)
#: a NODE_CLOCK_AHEAD incident ends after this long (wall clock) without a refused event from the node
_CLOCK_QUIET_MS = 60_000


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


class BatchSink:
    """``foreachBatch``: publish actions and alerts, keep the route model, write Redis."""

    def __init__(
        self,
        cfg: StreamingConfig,
        publisher: KafkaPublisher,
        store: RedisRouteStore | None,
        status: MonitorStatus | None = None,
        clock: Callable[[], int] = wall_ms,
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
        #: held by every thread that reads or writes the state above and below (see the module's docstring)
        self._lock = threading.Lock()
        #: the query's id, which a restart from the same checkpoint keeps; a batch waits for it
        self._lineage: str | None = None
        self._lineage_known = threading.Condition(self._lock)
        self._stored_batch = -1
        #: the next Redis write replaces everything (new lineage, or a write failed)
        self._rewrite = True
        #: the route incidents in the book were reconciled with the route tables as they are now
        self._route_incidents_current = False
        #: the nodes' removals this batch's model honoured (None: not read), checked again at the write
        self._removals_read: dict[BrokerKey, int] | None = None

    # -- lineage (the starting thread)

    def set_lineage(self, query_id: str) -> None:
        with self._lock:
            self._lineage = query_id
            if self.store is not None:
                try:
                    stored = self.store.load(self.route_settings, order_message_enable=self.cfg.order_message_enable)
                except REDIS_FAILURES as exc:  # Redis down must not stop the liveness decisions
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
            self._lineage_known.notify_all()

    # -- the batch (Spark's batch thread)

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        with self._lock:
            self._lineage_known.wait_for(lambda: self._lineage is not None)
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
        with self._lock:
            if batch_id <= self._stored_batch:
                log.info(
                    "batch %d was already written to redis (stored up to %d); skipping", batch_id, self._stored_batch
                )
                return []
            at = self.clock()
            self._honour_fallback_removals()
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

    def _honour_fallback_removals(self) -> None:
        """Brokers the nodes removed from Redis while no monitor decided: out of the model too, as written."""
        if self.store is None:
            return
        try:
            removed = self.store.fallback_removals()
        except REDIS_FAILURES as exc:  # the next batch reads them again
            log.error("redis: cannot read the nodes' fallback removals (%r)", exc)
            self._removals_read = None
            return
        self._removals_read = removed
        gone = self.model.apply_fallback_removals(removed)
        if gone:
            log.info("brokers a node removed from redis while no monitor decided: %s", gone)
            if not self._rewrite:
                self.model.changes()  # the node wrote them; a full rewrite would anyway

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
            # them walks every topic, a cost that grows with the fleet (docs/internals/monitor.md)
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
            self.cfg.alerts_topic, alert.incident.encode(), encode_alert(alert, raised_by=self.monitor, emitted_at=at)
        )

    def _write_redis(
        self, batch_id: int, changes: Any, alerts: list[Alert], outbox: dict[str, bytes] | None = None, tries: int = 3
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
                outbox=outbox, removals=self._removals_read, written=self._stored_batch,
            )  # fmt: skip
        except StoreChanged as changed:
            # Redis is not what this batch's differences were computed against (a node removed a broker while
            # the batch was under way, a failover lost writes or broke the WATCH): write everything again
            self._honour_fallback_removals()
            self._rewrite = True
            self.model.forget_written()
            if isinstance(changed, WritesLost):
                log.warning(
                    "redis: %s, not batch %d that this job wrote last (a failover or a restart lost writes); "
                    "writing everything again", changed, self._stored_batch,
                )  # fmt: skip
            if tries > 1:
                if isinstance(changed, RemovalsChanged):
                    log.info("redis: a node removed brokers while batch %d was under way; writing it again", batch_id)
                elif not isinstance(changed, WritesLost):
                    log.info(
                        "redis: what batch %d watched changed or its connection failed; writing it again", batch_id
                    )
                self._write_redis(batch_id, self.model.changes(full=True), alerts, outbox, tries - 1)
            else:
                log.error(
                    "redis: batch %d not written (what it watched kept changing); the next write replaces everything",
                    batch_id,
                )
            return
        except REDIS_FAILURES as exc:  # a cache outage must not stop the liveness decisions
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

    # -- read-only, for the metrics endpoint (its own thread, without the lock: each reads what is whole)

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

    # -- the monitor's own heartbeat (MonitorHeartbeat's thread)

    def monitor_tick(self) -> None:
        """Publish MONITOR_HEARTBEAT while deciding; open or resolve MONITOR_LAGGING and NODE_CLOCK_AHEAD."""
        with self._lock:
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
                    decided_through=st.decided_through,
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
                except REDIS_FAILURES as exc:  # see _write_redis
                    log.error("redis: alerts not written (%r)", exc)
            if self.pager is not None:
                self.pager.submit(notices)


class MonitorHeartbeat(threading.Thread):
    """Calls :meth:`BatchSink.monitor_tick` after every batch, and every ``interval_s`` whether or not batches run.

    The beat after a batch tells the nodes at once how far the monitor has decided (``decidedThrough``):
    a node takes a broker past its deadline back into its own hands when the monitor has not got there
    in time (docs/monitor.md, "While the monitor is slow or away"). Until this run's first
    MONITOR_HEARTBEAT it also calls every :attr:`FIRST_BEAT_POLL_S`: the nodes hand expiry back at that
    beat, which should follow the first batch that allows it, not an interval later.
    """

    FIRST_BEAT_POLL_S = 0.2

    def __init__(self, sink: BatchSink, interval_s: float) -> None:
        super().__init__(name="monitor-heartbeat", daemon=True)
        self.sink = sink
        self.interval_s = interval_s
        self.stopped = threading.Event()

    def next_tick_s(self) -> float:
        """Seconds until the next call: :attr:`FIRST_BEAT_POLL_S` until this run's first beat, then ``interval_s``."""
        if self.sink.status.actions_published.get(ActionType.MONITOR_HEARTBEAT.value):
            return self.interval_s
        return min(self.interval_s, self.FIRST_BEAT_POLL_S)

    def run(self) -> None:
        finished = self.sink.status.batch_finished
        while not self.stopped.is_set():
            finished.wait(self.next_tick_s())
            finished.clear()
            if self.stopped.is_set():
                break
            try:
                self.sink.monitor_tick()
            except Exception as exc:  # noqa: BLE001 - keep beating; the next tick retries
                log.error("monitor heartbeat failed: %r", exc)

    def stop(self) -> None:
        self.stopped.set()
        self.sink.status.batch_finished.set()
        self.join(timeout=10)
