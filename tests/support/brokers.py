"""A broker's REGISTER_BROKER as the tests write it, and its registration with a node over the real protocol,
as a RocketMQ 5.x broker would."""

from __future__ import annotations

from common.protocol import bodies
from common.protocol.codes import ZONE_NAME_EXT, RequestCode, ResponseCode
from common.protocol.types import DataVersion, RegisterBrokerBody, TopicConfig
from namesrv.client import NameServerClient


def registration(
    *,
    broker_addr: str,
    topics: list[str] | tuple[str, ...] = (),
    broker_name: str = "broker-a",
    cluster: str = "DefaultCluster",
    broker_id: int = 0,
    counter: int = 1,
    queues: int = 4,
    compressed: bool = False,
    enable_acting_master: bool = False,
    ha_server_addr: str | None = None,
    zone: str | None = None,
    configs: dict[str, TopicConfig] | None = None,
    data_version: DataVersion | None = None,
    filter_servers: list[str] | None = None,
    mappings: dict | None = None,
    body: bytes | None = None,
    crc: bool = True,
) -> tuple[dict[str, str], bytes]:
    """The ext fields and body of a REGISTER_BROKER (the HA address defaults to ``broker_addr``).

    The topic table is ``topics`` with ``queues`` read and write queues, plus the topic named after the
    cluster, or ``configs`` as given. ``zone`` is sent as a 5.x broker in a zone sends it. ``body`` sends those bytes instead of an encoded table (a zip
    bomb, a body a test edits), and ``crc=False`` leaves ``bodyCrc32`` out, so the node checks none.
    """
    if body is None:
        # the cluster-named topic every broker creates also keeps a first registration off the one-topic guard
        table = configs if configs is not None else {t: TopicConfig(t, queues, queues) for t in [*topics, cluster]}
        body = bodies.encode_register_broker_body(
            RegisterBrokerBody(
                data_version=data_version or DataVersion(counter, 0, 1_700_000_000_000),
                topic_config_table=table,
                filter_server_list=filter_servers or [],
                topic_queue_mapping_info_map=mappings or {},
            ),
            compressed=compressed,
        )
    ext = {
        "brokerName": broker_name,
        "brokerAddr": broker_addr,
        "clusterName": cluster,
        "brokerId": str(broker_id),
        "haServerAddr": ha_server_addr or broker_addr,
        "enableActingMaster": str(enable_acting_master).lower(),
        "compressed": str(compressed).lower(),
    }
    if zone is not None:
        ext[ZONE_NAME_EXT] = zone
    if crc:
        ext["bodyCrc32"] = str(bodies.body_crc32(body))
    return ext, body


def mapping(topic: str, bname: str, queues: int, epoch: int = 1) -> dict:
    """A static topic's TopicQueueMappingInfo; more than ten queues, so integer and text keys would sort differently."""
    return {"topic": topic, "scope": "__global__", "totalQueues": queues, "bname": bname, "epoch": epoch,
            "dirty": False, "currIdMap": {i: i for i in range(queues)}}  # fmt: skip


def register_broker(client: NameServerClient, **kw) -> None:
    """Register (or re-register) a broker; the broker stays registered while ``client`` stays connected.

    Takes :func:`registration`'s keywords.
    """
    ext, raw = registration(**kw)
    response = client.call(RequestCode.REGISTER_BROKER, ext, raw)
    assert response is not None and response.code == ResponseCode.SUCCESS, response
