"""Events, output rows and a foreachBatch sink for tests of the streaming job's steps."""

from __future__ import annotations

from common.contract import DataVersionInfo, Event, EventType, QueueInfo, encode_event
from streaming.config import load_config
from streaming.liveness import KIND_ACTION, KIND_ROUTE, OUTPUT_COLUMNS
from streaming.routes import RedisRouteStore
from streaming.sink import BatchSink

T0 = 1_700_000_000_000
#: a TICK from a node whose clock says 2100: refused, it must not move event time
YEAR_2100 = 4_102_444_800_000
SKEW = 10_000


def register(node: str = "n1", t: int = T0, addr: str = "10.0.0.1:1", name: str = "a", seq: int = 1) -> Event:
    return Event(
        type=EventType.REGISTER, node=node, event_time=t, seq=seq, cluster_name="C", broker_name=name, broker_id=0,
        broker_addr=addr, heartbeat_timeout_millis=10_000, data_version=DataVersionInfo(1, 0, 1),
        topics={"T": QueueInfo(4, 4, 6), "C": QueueInfo(1, 1, 7)},
    )  # fmt: skip


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.flushes = 0

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout_s: float = 30.0) -> None:
        self.flushes += 1

    def close(self) -> None:
        pass


def out_row(kind: str, t: int, **kw) -> dict:
    row = {c: None for c, _ in OUTPUT_COLUMNS}
    row.update({"kind": kind, "orderTime": t, "step": 0, **kw})
    return row


def route_row(e: Event) -> dict:
    return out_row(KIND_ROUTE, e.event_time, node=e.node, seq=e.seq, type="REGISTER", raw=encode_event(e).decode())


def expire_row(t: int, addr: str = "10.0.0.1:1", last: int = T0) -> dict:
    return out_row(KIND_ACTION, t, type="EXPIRE", cause="TIMEOUT", clusterName="C", brokerName="a", brokerId=0,
                   brokerAddr=addr, lastHeartbeat=last, watermark=t, reason="silent")  # fmt: skip


def make_sink(redis_url: str | None, prefix: str, **overrides: str) -> tuple[BatchSink, FakePublisher]:
    """A sink publishing to a FakePublisher, writing to Redis at ``redis_url`` under ``prefix`` (None: no Redis)."""
    cfg = load_config(None, {"redis.url": redis_url or "", "redis.keyPrefix": prefix, "monitor.id": "m",
                             "alerts.monitorLagMillis": "1000", **overrides})  # fmt: skip
    pub = FakePublisher()
    store = RedisRouteStore.from_url(cfg.redis_url, cfg.redis_prefix) if redis_url else None
    return BatchSink(cfg, pub, store, clock=lambda: T0 + 100_000), pub
