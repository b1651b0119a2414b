"""Which brokers this node has heard nothing from past their deadline: what its SILENT events report.

A node knows each broker's deadline (its last REGISTER/HEARTBEAT here plus the broker's timeout) and
reports, once per silence, each broker whose deadline its clock has passed with nothing heard since,
so the monitor can decide in the batch that reads the report instead of a batch later on its own
timer (docs/internals/node-liveness.md). :class:`SilenceWatch` keeps the deadlines in a heap;
nothing here reads a clock: the caller passes ``now``.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

#: (cluster name, broker address)
BrokerKey = tuple[str, str]

#: a rebuild once the heap holds this many times more entries than there are brokers (plus slack)
_STALE_FACTOR = 4
_STALE_SLACK = 1024


@dataclass(frozen=True, slots=True)
class Silence:
    """A broker whose deadline passed: heard last at ``last_heard`` (event time), timeout ``timeout_ms``."""

    key: BrokerKey
    last_heard: int
    timeout_ms: int


class SilenceWatch:
    """Deadlines of the brokers a node has heard; :meth:`due` reports each silence once.

    The heap holds one (deadline, broker, heard-at) entry per proof of life; an entry whose broker
    was heard again since is stale and skipped when it comes due, and the heap is rebuilt from the
    live entries when stale ones outnumber them, so it stays within a few entries per broker.
    """

    def __init__(self, default_timeout_ms: int) -> None:
        self.default_timeout_ms = default_timeout_ms
        #: broker -> (event time last heard, its timeout), while a silence may still be reported
        self._heard: dict[BrokerKey, tuple[int, int]] = {}
        #: broker -> the timeout of its last registration, until it leaves the node
        self._timeouts: dict[BrokerKey, int] = {}
        self._heap: list[tuple[int, BrokerKey, int]] = []

    def __len__(self) -> int:
        return len(self._heard)

    def heard(self, key: BrokerKey, at: int, timeout_ms: int | None = None) -> None:
        """A proof of life at event time ``at``; a registration also says the broker's timeout.

        The deadline is ``at`` plus the timeout of the broker's last registration (the default
        before one is seen).
        """
        if timeout_ms is not None:
            self._timeouts[key] = timeout_ms
        prior = self._heard.get(key)
        if prior is not None and prior[0] > at:
            return
        timeout_ms = self._timeouts.get(key, self.default_timeout_ms)
        self._heard[key] = (at, timeout_ms)
        heapq.heappush(self._heap, (at + timeout_ms, key, at))
        if len(self._heap) > _STALE_FACTOR * len(self._heard) + _STALE_SLACK:
            self._heap = [(at + timeout, k, at) for k, (at, timeout) in self._heard.items()]
            heapq.heapify(self._heap)

    def forget(self, key: BrokerKey) -> None:
        """The broker left this node (unregistered, expired, removed): no report for it."""
        self._heard.pop(key, None)
        self._timeouts.pop(key, None)

    def disconnected(self, key: BrokerKey) -> None:
        """The broker's connection here ended: its silence is still reported when its deadline passes.

        The node dropped the broker, but nothing more will be heard from it here, which is what a SILENT
        says. Where the other nodes that held it are dead or frozen, this report is what lets the monitor
        decide at the deadline rather than on its own timer a batch later. Only the timeout is forgotten:
        a broker that comes back registers again, and says its timeout then.
        """
        self._timeouts.pop(key, None)

    def next_deadline(self) -> int | None:
        """The earliest deadline still to report (None: none): when the caller should look again."""
        while self._heap:
            deadline, key, at = self._heap[0]
            held = self._heard.get(key)
            if held is not None and held[0] == at:
                return deadline
            heapq.heappop(self._heap)  # stale: heard again since, or gone from this node
        return None

    def due(self, now: int) -> list[Silence]:
        """Brokers whose deadline is before ``now`` (strictly, as RocketMQ's ``last + timeout < now``), once each."""
        out: list[Silence] = []
        while self._heap and self._heap[0][0] < now:
            _, key, at = heapq.heappop(self._heap)
            held = self._heard.get(key)
            if held is None or held[0] != at:
                continue  # heard again since, or gone from this node
            del self._heard[key]  # reported; a new proof of life starts a new silence
            out.append(Silence(key, at, held[1]))
        return out
