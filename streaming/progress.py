"""The query's progress, batch by batch: logged, and noted in the :class:`~streaming.status.MonitorStatus`.

:func:`progress_logger` makes the listener the job adds to its session: for every batch of the
job's query it logs the input rate, the duration, the watermark and how far event time is behind
the clock, warns about events refused for being stamped ahead of the clock, and notes the counts
the heartbeat and the metrics endpoint read, among them how far the monitor has decided
(``decided_through``), after which it wakes the heartbeat so the nodes hear it at once. Batches slower than the trigger are told once an
episode (:class:`Lateness`), not once a batch as Spark's own warning was.

The JVM hands each progress over as its JSON in one call (:class:`_ProgressAsJson`) rather than
through PySpark's own bridge, which builds it one Py4J getter at a time and cost the driver a
sizeable share of a core on a steady stream (bench/STREAMING_RESULTS.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from common.contract import wall_ms
from streaming.status import MonitorStatus

log = logging.getLogger(__name__)


def _iso_ms(text: str | None) -> int | None:
    if not text:
        return None
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


class _ProgressAsJson:
    """The JVM's side of the progress logger (Py4J): each batch's progress crosses as its JSON.

    ``progress().json()`` is one call, and :meth:`StreamingQueryProgress.fromJson` is what
    ``query.lastProgress`` itself uses; PySpark's bridge makes some thirty Py4J calls a batch, each
    a reflective look-up in the JVM.
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


#: batches in a row within the trigger that end an episode of lateness: one quick batch among slow
#: ones is not catching up
CAUGHT_UP_BATCHES = 10


class Lateness:
    """Batches that take longer than the trigger interval, told as episodes: one line when they fall
    behind, one when they keep up again, each with figures."""

    def __init__(self, trigger_ms: int) -> None:
        self.trigger_ms = trigger_ms
        #: wall time (epoch ms) the current episode started; None while batches keep up
        self.since: int | None = None
        self.batches = self.late = self.slowest_ms = self.on_time = 0

    def batch(self, batch_id: int, duration_ms: int, now_ms: int) -> str | None:
        """Note a finished batch; returns the line to log when an episode starts or ends."""
        late = duration_ms > self.trigger_ms
        if self.since is None:
            if not late:
                return None
            self.since, self.batches, self.late, self.slowest_ms, self.on_time = now_ms, 1, 1, duration_ms, 0
            return (
                f"batches are falling behind the {self.trigger_ms} ms trigger: batch {batch_id} took {duration_ms} ms"
            )
        self.batches += 1
        if late:
            self.late += 1
            self.slowest_ms = max(self.slowest_ms, duration_ms)
            self.on_time = 0
            return None
        self.on_time += 1
        if self.on_time < CAUGHT_UP_BATCHES:
            return None
        took = (now_ms - self.since) / 1000
        self.since = None
        return (
            f"batches keep up with the {self.trigger_ms} ms trigger again (batch {batch_id}): for {took:.1f} s, "
            f"{self.late} of {self.batches} batches took longer, the slowest {self.slowest_ms} ms"
        )


def progress_logger(
    status: MonitorStatus, delay_ms: int, max_skew_ms: int, trigger_ms: int, query_id: Callable[[], str | None]
) -> Any:
    """A listener for ``spark.streams.addListener`` that follows the query whose id ``query_id()`` gives."""
    return _listener_class()(status, delay_ms, max_skew_ms, Lateness(trigger_ms), query_id)


def _listener_class() -> type:
    # PySpark is imported when a listener is made, not with this module
    from pyspark.sql.streaming import StreamingQueryListener

    class ProgressLogger(StreamingQueryListener):
        """Logs every batch: input rate, duration, watermark and event-time lag; feeds MonitorStatus."""

        def __init__(
            self,
            status: MonitorStatus,
            delay_ms: int,
            max_skew_ms: int,
            lateness: Lateness,
            query_id: Callable[[], str | None],
        ) -> None:
            self.status = status
            self.delay_ms = delay_ms
            self.max_skew_ms = max_skew_ms
            self.lateness = lateness
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
                s.note_ahead(nodes, ahead, int(metrics["aheadMax"]), wall_ms())
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
            latest = _observed(metrics, "latest")
            if latest is not None and (s.decided_through is None or latest > s.decided_through):
                s.decided_through = int(latest)
            s.batch_finished.set()
            if (episode := self.lateness.batch(p.batchId, p.batchDuration, wall_ms())) is not None:
                # its end at the level of its start, so that a log at WARNING shows both
                log.warning("%s", episode)
            behind = (
                f"event time {(wall_ms() - (wm + self.delay_ms)) / 1000:.1f} s behind" if wm else "no watermark yet"
            )
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


def _observed(metrics: Any, name: str) -> Any:
    """One column of an observed metric (a Row, or a dict from the JSON bridge); None when it has none."""
    if metrics is None:
        return None
    try:
        return metrics[name]
    except (KeyError, ValueError):  # a Row says ValueError
        return None
