"""Counting on the request path, in plain ints, for the metrics endpoint (:mod:`namesrv.metrics`).

:class:`RequestStats` counts every request per (request code, response code), one dict lookup and
one addition on the event loop, and times one request in :data:`SAMPLE_EVERY` into latency buckets:
timing every request, or prometheus_client's locked ``Histogram``, would cost the request path far
more.  A scrape, on the metrics server's thread, copies the ints (:meth:`RequestStats.snapshot`).
Latency is what the node spent on a request, from the end of the previous one on the connection (or
reading its bytes) to its encoded answer, off-loop work included, socket buffers not.  Request codes
come from peers, so codes without a handler count as :data:`OTHER` and a peer cannot grow the keys.
prometheus_client is not imported here.  ``docs/internals/metrics.md`` has the measurements.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Collection
from typing import Any

from common.protocol.codes import ResponseCode

#: RocketMQ 5's rocketmq_rpc_latency buckets (RemotingMetricsManager, ms), with finer ones below 1 ms
RPC_LATENCY_BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1, 3, 5, 7, 10, 100, 1000, 2000, 3000)
#: the response code recorded for a oneway request (no answer, so no code); labelled result="oneway"
ONEWAY = -1
#: the request code recorded for every code the node has no handler for
OTHER = -2


#: one request in this many is timed: a clock read on every request is a noticeable share of a route lookup
SAMPLE_EVERY = 16


class RequestStats:
    """Requests per (request code, response code), every one counted, one in :data:`SAMPLE_EVERY` timed.

    The connection calls :meth:`start` before the first request it answers in a turn and
    :meth:`record` once per request with ``started``, the clock time the request started if it is
    being timed, else 0.0; ``record`` returns what to pass for the next request: every
    :data:`SAMPLE_EVERY` th call it reads the clock, so the next request is timed from the end of
    this one (or, on whichever connection answers next, from :meth:`start`).
    """

    __slots__ = ("clock", "known", "armed", "_bounds", "_first", "_cells", "_countdown")

    def __init__(self, known_codes: Collection[int], clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.known = frozenset(known_codes)
        self._bounds = tuple(b / 1000 for b in RPC_LATENCY_BUCKETS_MS)  # the clock's seconds
        self._first = self._bounds[0]
        #: (request code, response code) -> [requests, then the timed ones per bucket, then their seconds]
        self._cells: dict[tuple[int, int], list[Any]] = {}
        self._countdown = SAMPLE_EVERY
        #: the next request is to be timed: a connection that starts answering reads the clock first
        #: (the one that armed it may have had no further request to chain to)
        self.armed = False

    def record(self, code: int, response_code: int, started: float = 0.0) -> float:
        """Count one request (timed from ``started`` unless it is 0.0); returns the next one's ``started``."""
        cell = self._cells.get((code, response_code))
        if cell is None:
            cell = self._cell(code, response_code)
        cell[0] += 1
        self._countdown -= 1
        if started or not self._countdown:  # the rare path: a timed request, or the next one is
            now = self.clock()
            if started:
                elapsed = now - started
                cell[1 + bisect_left(self._bounds, elapsed)] += 1
                cell[-1] += elapsed
                self.armed = False
            if not self._countdown:
                self._countdown = SAMPLE_EVERY
                self.armed = True
                return now
        return 0.0

    def start(self) -> float:
        """``started`` for the first request a connection answers now: the clock if one is due."""
        return self.clock() if self.armed else 0.0

    def _cell(self, code: int, response_code: int) -> list[Any]:
        if code not in self.known:  # a peer's made-up code: not a key of its own
            code = OTHER
        cell = self._cells.get((code, response_code))
        if cell is None:
            cell = self._cells[(code, response_code)] = [0] * (len(self._bounds) + 2) + [0.0]
        return cell

    def snapshot(self) -> list[tuple[int, int, int, list[int], float]]:
        """``(request code, response code, requests, timed ones per bucket, their seconds)`` of every pair seen."""
        out = []
        for (code, rc), cell in list(self._cells.items()):
            copy = cell[:]  # one whole copy: the loop thread may count meanwhile
            out.append((code, rc, copy[0], copy[1:-1], copy[-1]))
        return out

    def count(self, code: int, response_code: int = ResponseCode.SUCCESS) -> int:
        """Requests of ``code`` answered with ``response_code`` so far."""
        cell = self._cells.get((code, response_code))
        return 0 if cell is None else cell[0]
