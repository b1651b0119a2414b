"""Counting on the request path, in plain ints, for the metrics endpoint (:mod:`namesrv.metrics`).

Theory of operation: :class:`RequestStats` counts every request the node handles per (request
code, response code), with its latency in buckets: one clock read, one dict lookup, one ``bisect``
and two additions, on the event loop.  prometheus_client's ``Histogram.labels(...).observe`` takes
a lock and looks the labels up on every call, several times that, on a path where a cached route
lookup costs the node about ten microseconds.  Nothing here is shared but the ints; a scrape, on the
metrics server's thread, copies them (:meth:`RequestStats.snapshot`), and the GIL makes each copy
whole.  The module imports nothing of prometheus_client, so a node with ``metricsPort=0`` never
loads it.

Latency is what the node spent on the request: from the end of the previous request on the same
connection (or from reading its bytes) to its encoded answer, so parsing, handling and encoding,
plus the work off the loop for KV and config writes and large registrations.  Time waiting in
socket buffers is not in it.

Request codes come from peers: a code the node has no handler for is counted as :data:`OTHER`, so
a peer cannot grow the set of keys.  Response codes are the node's own.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable
from typing import Any

from namesrv.protocol.codes import ResponseCode

#: RocketMQ 5's rocketmq_rpc_latency buckets (RemotingMetricsManager, ms), with finer ones below 1 ms
RPC_LATENCY_BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1, 3, 5, 7, 10, 100, 1000, 2000, 3000)
#: the response code recorded for a oneway request (no answer, so no code); labelled result="oneway"
ONEWAY = -1
#: the request code recorded for every code the node has no handler for
OTHER = -2


class Buckets:
    """A histogram of plain ints: one count per bucket (the last is +Inf) and the sum.

    ``bounds`` are upper bounds, inclusive as Prometheus' ``le``.  Written by one thread; a reader
    takes :meth:`snapshot`, a copy the GIL makes whole.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> tuple[list[int], float]:
        return list(self.counts), self.sum


class RequestStats:
    """Requests per (request code, response code) with their latency, counted on the event loop.

    The connection calls :meth:`record` once per request with the time the request started (the
    end of the previous one, see the module docstring) and keeps the time it returns as the start
    of the next: one clock read per request.
    """

    __slots__ = ("clock", "known", "_bounds", "_first", "_cells")

    def __init__(self, known_codes: Collection[int], clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.known = frozenset(known_codes)
        self._bounds = tuple(b / 1000 for b in RPC_LATENCY_BUCKETS_MS)  # the clock's seconds
        self._first = self._bounds[0]
        #: (request code, response code) -> bucket counts, then the sum of seconds as the last item
        self._cells: dict[tuple[int, int], list[Any]] = {}

    def record(self, code: int, response_code: int, started: float) -> float:
        """Count one request that started at ``started`` (clock seconds); returns now."""
        now = self.clock()
        cell = self._cells.get((code, response_code))
        if cell is None:
            cell = self._cell(code, response_code)
        elapsed = now - started
        if elapsed <= self._first:  # most requests: a comparison costs half of a bisect call
            cell[0] += 1
        else:
            cell[bisect_left(self._bounds, elapsed)] += 1
        cell[-1] += elapsed
        return now

    def _cell(self, code: int, response_code: int) -> list[Any]:
        if code not in self.known:  # a peer's made-up code: not a key of its own
            code = OTHER
        cell = self._cells.get((code, response_code))
        if cell is None:
            cell = self._cells[(code, response_code)] = [0] * (len(self._bounds) + 1) + [0.0]
        return cell

    def snapshot(self) -> list[tuple[int, int, list[int], float]]:
        """``(request code, response code, per-bucket counts, sum of seconds)`` of every pair seen."""
        out = []
        for (code, rc), cell in list(self._cells.items()):
            copy = cell[:]  # one whole copy: the loop thread may count meanwhile
            out.append((code, rc, copy[:-1], copy[-1]))
        return out

    def count(self, code: int, response_code: int = ResponseCode.SUCCESS) -> int:
        """Requests of ``code`` answered with ``response_code`` so far."""
        cell = self._cells.get((code, response_code))
        return 0 if cell is None else sum(cell[:-1])
