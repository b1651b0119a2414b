"""What the running monitor knows about itself (:class:`MonitorStatus`), for its heartbeat and metrics.

Written by two sides: the progress listener (:mod:`streaming.progress`, on Spark's listener thread)
notes each batch's counts, durations and watermark; the sink (:mod:`streaming.sink`, holding its
lock) notes what it published, its Redis writes and when a batch finished. Read by the sink's
heartbeat, to decide whether the monitor may announce itself to the nodes, and by the Prometheus
endpoint (:mod:`streaming.metrics`) at scrape time, without a lock: each field is a plain value
written by one side, or a container that readers copy in one step, which the GIL keeps whole.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from common.contract import Action
from common.metrics import Buckets

#: micro-batches take from a fraction of a second to tens of seconds on a loaded machine
BATCH_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
#: one MULTI/EXEC of a batch's routes, cluster info and alerts
REDIS_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
#: nodes whose refused events are remembered; a handful is normal
MAX_AHEAD_NODES = 1000


@dataclass
class MonitorStatus:
    """The listener's and the sink's notes of this run (see the module's docstring for who writes what)."""

    watermark_ms: int | None = None
    #: the newest event time a finished batch of this run read: every decision it called for is sent and
    #: written, so the MONITOR_HEARTBEAT says the monitor decided through it (None: no batch read one yet)
    decided_through: int | None = None
    #: set by the listener when a batch finished, so that the heartbeat goes out at once
    batch_finished: threading.Event = field(default_factory=threading.Event)
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
    # -- for the metrics endpoint (streaming.metrics)
    #: events per second the last batch read
    input_rate: float = 0.0
    batch_seconds: Buckets = field(default_factory=lambda: Buckets(BATCH_SECONDS_BUCKETS))
    #: action type -> actions sent to the actions topic by this run
    actions_published: dict[str, int] = field(default_factory=dict)
    redis_seconds: Buckets = field(default_factory=lambda: Buckets(REDIS_SECONDS_BUCKETS))
    redis_failures: int = 0

    def published(self, action: Action) -> None:
        self.actions_published[action.type.value] = self.actions_published.get(action.type.value, 0) + 1

    def note_ahead(self, nodes: Iterable[str], refused: int, furthest: int, at: int) -> None:
        self.ahead_events += refused
        for node in nodes:
            _, count, far = self.ahead_nodes.get(node, (at, 0, furthest))
            self.ahead_nodes[node] = (at, count + refused, max(far, furthest))
        if len(self.ahead_nodes) > MAX_AHEAD_NODES:  # forget the quietest
            for node, _ in sorted(self.ahead_nodes.items(), key=lambda kv: kv[1][0])[:-MAX_AHEAD_NODES]:
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
