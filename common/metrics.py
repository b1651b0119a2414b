"""What the node's and the monitor's Prometheus endpoints share: a plain-int histogram, its
exposition as cumulative buckets, and prometheus_client's HTTP server over a registry of our own.

Each process counts in plain ints on its hot path (:class:`Buckets`) and converts only when
Prometheus scrapes; nothing uses prometheus_client's global registry.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable

from prometheus_client import ProcessCollector, start_http_server
from prometheus_client.registry import Collector, CollectorRegistry


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


def histogram_buckets(bounds: Iterable[float], counts: list[int], scale: float = 1.0) -> list[tuple[str, float]]:
    """Prometheus' cumulative ``(le, count)`` pairs from per-bucket counts (bounds times ``scale``)."""
    out: list[tuple[str, float]] = []
    total = 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        total += count
        out.append(("+Inf" if bound == float("inf") else repr(float(bound * scale)), total))
    return out


class MetricsServer:
    """prometheus_client's HTTP server for one registry, on its own daemon thread."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.httpd, self.thread = start_http_server(port, host, registry)
        self.host = host
        self.port = self.httpd.server_port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving (blocks up to the server's half-second poll) and close the socket."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(1.0)


def serve(collectors: Iterable[Collector], host: str, port: int) -> MetricsServer:
    """Serve ``collectors`` and the process' own ``process_*`` figures (CPU, memory, open files) at
    ``host:port``, from a registry of their own (not prometheus_client's global one)."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in (*collectors, ProcessCollector(registry=None)):
        registry.register(collector)
    return MetricsServer(registry, host, port)
