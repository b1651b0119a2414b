"""REGISTER events of three brokers in two groups, for tests of the job's route model."""

from __future__ import annotations

from common.contract import DataVersionInfo, Event, EventType, QueueInfo
from common.protocol import fastjson

T0 = 1_700_000_000_000
CLUSTER = "C1"


def reg_event(
    name: str,
    addr: str,
    bid: int,
    topics: dict[str, tuple[int, int, int]],
    counter: int = 1,
    t: int = T0,
    acting: bool | None = False,
    filters: list[str] | None = None,
    mappings: dict[str, dict] | None = None,
) -> Event:
    return Event(
        type=EventType.REGISTER, node="n1", event_time=t, seq=1, cluster_name=CLUSTER, broker_name=name,
        broker_id=bid, broker_addr=addr, ha_server_addr=addr, enable_acting_master=acting,
        heartbeat_timeout_millis=120_000, data_version=DataVersionInfo(counter, 0, 1),
        topics={n: QueueInfo(r, w, p) for n, (r, w, p) in topics.items()}, filter_server_list=filters,
        topic_queue_mapping_info_map=None if mappings is None else {
            topic: fastjson.dumps_legacy(info).decode() for topic, info in mappings.items()
        },
    )  # fmt: skip


A0 = reg_event("a", "10.0.0.1:1", 0, {"T1": (4, 4, 6), "T2": (8, 8, 6), "C1": (1, 1, 7)})
A1 = reg_event("a", "10.0.0.2:1", 1, {"T1": (4, 4, 6), "T2": (8, 8, 6), "C1": (1, 1, 7)})
B0 = reg_event("b", "10.0.0.3:1", 0, {"T1": (2, 2, 6), "T3": (1, 1, 6), "C1": (1, 1, 7)})
