"""One broker's events as the nodes publish them, for the tests of the monitor's liveness rules: the pure
core (``streaming.decide``) and the stateful processor around it (``streaming.liveness``)."""

from __future__ import annotations

from typing import Any

from common.contract import DataVersionInfo, Event, EventType, QueueInfo

CLUSTER = "DefaultCluster"
ADDR = "10.0.0.1:10911"
T0 = 1_700_000_000_000
#: the broker's own heartbeat timeout, as its registration says
TIMEOUT = 10_000
#: conf/streaming.properties' monitor.watermarkDelayMillis
DELAY = 120_000


def ev(etype: EventType, t: int, node: str = "n1", seq: int = 1, **kw: Any) -> Event:
    """An event of ``etype`` at event time ``t`` from ``node``; about the broker at ``addr`` (ADDR) unless a
    TICK or an ADMIN event, which are about no broker."""
    base: dict[str, Any] = dict(type=etype, node=node, event_time=t, seq=seq)
    if etype not in (EventType.TICK, EventType.ADMIN):
        base.update(cluster_name=CLUSTER, broker_addr=kw.pop("addr", ADDR))
    base.update(kw)
    return Event(**base)


def register(t: int, node: str = "n1", counter: int = 1, timeout: int = TIMEOUT, **kw: Any) -> Event:
    return ev(
        EventType.REGISTER, t, node, broker_name="broker-a", broker_id=0, heartbeat_timeout_millis=timeout,
        data_version=DataVersionInfo(counter, 0, 1), topics={"T": QueueInfo(4, 4, 6)}, **kw,
    )  # fmt: skip


def heartbeat(t: int, node: str = "n1", source: str = "BROKER_HEARTBEAT") -> Event:
    return ev(EventType.HEARTBEAT, t, node, source=source)


def unregister(t: int, node: str = "n1", source: str = "UNREGISTER_BROKER") -> Event:
    return ev(EventType.UNREGISTER, t, node, source=source)


def closed(t: int, node: str) -> Event:
    return ev(EventType.CHANNEL_CLOSED, t, node, reason="reset by peer")


def silent(t: int, node: str = "n1") -> Event:
    return ev(EventType.SILENT, t, node, reason="nothing heard")
