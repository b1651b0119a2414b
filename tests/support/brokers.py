"""Register a broker with a node over the real protocol, as a RocketMQ 5.x broker would."""

from __future__ import annotations

from namesrv.client import NameServerClient
from namesrv.protocol import bodies
from namesrv.protocol.codes import RequestCode, ResponseCode
from namesrv.protocol.types import DataVersion, RegisterBrokerBody, TopicConfig


def registration(
    *,
    broker_addr: str,
    topics: list[str],
    broker_name: str = "broker-a",
    cluster: str = "DefaultCluster",
    broker_id: int = 0,
    counter: int = 1,
    queues: int = 4,
    compressed: bool = False,
    enable_acting_master: bool = False,
    ha_server_addr: str | None = None,
) -> tuple[dict[str, str], bytes]:
    """The ext fields and body of a REGISTER_BROKER (the HA address defaults to ``broker_addr``)."""
    body = RegisterBrokerBody(
        data_version=DataVersion(counter, 0, 1_700_000_000_000),
        # the cluster-named topic every broker creates also keeps a first registration off the one-topic guard
        topic_config_table={t: TopicConfig(t, queues, queues) for t in [*topics, cluster]},
        filter_server_list=[],
    )
    raw = bodies.encode_register_broker_body(body, compressed=compressed)
    ext = {
        "brokerName": broker_name,
        "brokerAddr": broker_addr,
        "clusterName": cluster,
        "brokerId": str(broker_id),
        "haServerAddr": ha_server_addr or broker_addr,
        "enableActingMaster": str(enable_acting_master).lower(),
        "compressed": str(compressed).lower(),
        "bodyCrc32": str(bodies.body_crc32(raw)),
    }
    return ext, raw


def register_broker(client: NameServerClient, **kw) -> None:
    """Register (or re-register) a broker; the broker stays registered while ``client`` stays connected.

    Takes :func:`registration`'s keywords.
    """
    ext, raw = registration(**kw)
    response = client.call(RequestCode.REGISTER_BROKER, ext, raw)
    assert response is not None and response.code == ResponseCode.SUCCESS, response
