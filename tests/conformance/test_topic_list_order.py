"""Topic lists in Apache's order: each scenario of ``tests/vectors/topic_list_order.json`` replayed on a
running node over the protocol, its answers equal byte for byte to what Apache RocketMQ 5.5.0's own
RouteInfoManager answered to the same steps (``tests/vectors/order/TopicListOrder.java`` made them):
registrations with the topics in the body's order, unregistrations, topic deletions, and
GET_ALL_TOPIC_LIST_FROM_NAMESERVER, GET_TOPICS_BY_CLUSTER and GET_SYSTEM_TOPIC_LIST_FROM_NS.
"""

from __future__ import annotations

import json
from contextlib import ExitStack

import pytest

from namesrv.client import NameServerClient
from namesrv.protocol.codes import RequestCode, ResponseCode
from namesrv.protocol.types import TopicConfig
from tests.support.brokers import register_broker
from tests.support.node import VECTORS
from tests.support.wait import wait_until

ORDER = json.loads((VECTORS / "topic_list_order.json").read_text())


def _ask(c: NameServerClient, op: list[str]) -> str:
    if op[0] == "all":
        answer = c.ok(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    elif op[0] == "cluster":
        answer = c.ok(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": op[1]})
    else:
        answer = c.ok(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)
    return answer.body.decode()


@pytest.mark.parametrize("name", list(ORDER["scenarios"]))
def test_topic_lists_come_in_apaches_order(node, name):
    expected = iter(ORDER["answers"][name])
    counter = 0
    with ExitStack() as stack:
        admin = stack.enter_context(NameServerClient(node.addr))
        brokers: dict[str, NameServerClient] = {}  # a broker stays registered while its connection is open
        for step, op in enumerate(ORDER["scenarios"][name]):
            kind = op[0]
            if kind == "reg":
                cluster, broker, addr, *topics = op[1:]
                if broker not in brokers:
                    brokers[broker] = stack.enter_context(NameServerClient(node.addr))
                counter += 1
                # compressed: the body keeps the topics in the scenario's order (our JSON writer sorts keys)
                register_broker(
                    brokers[broker], broker_addr=addr, broker_name=broker, cluster=cluster, counter=counter,
                    configs={t: TopicConfig(t, 4, 4) for t in topics}, compressed=True,
                )  # fmt: skip
            elif kind == "unreg":
                cluster, broker, addr = op[1:]
                ext = {"clusterName": cluster, "brokerAddr": addr, "brokerName": broker, "brokerId": "0"}
                assert admin.ok(RequestCode.UNREGISTER_BROKER, ext).code == ResponseCode.SUCCESS
                # applied by the node's batcher, as Java's BatchUnregistrationService applies it
                wait_until(lambda b=broker: b not in admin.cluster_info()[0], 10, f"{broker} unregistered")
            elif kind == "deltopic":
                admin.ok(RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": op[1]})
            else:
                assert _ask(admin, op) == next(expected), f"{name}, step {step}: {op}"
    assert next(expected, None) is None
