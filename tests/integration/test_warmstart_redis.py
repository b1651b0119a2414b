"""Warm start against a real Redis and a real node over TCP.

The model is written by the streaming job's own writer (``streaming.routes.RouteModel`` fed with
REGISTER events, stored by ``RedisRouteStore.commit``), under a prefix of each test's own.  Waits
poll with deadlines.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from common.contract import DataVersionInfo, Event, EventType, QueueInfo
from common.protocol import bodies
from common.protocol.codes import RequestCode, ResponseCode
from common.protocol.types import DataVersion
from common.routes import RouteSettings
from infra.processes import free_port
from infra.redis import RedisService
from namesrv.client import NameServerClient
from namesrv.warmstart import READ_TIMEOUT_S
from streaming.routes import RedisRouteStore, RouteModel
from tests.support.brokers import register_broker
from tests.support.node import running_node
from tests.support.wait import wait_until

CLUSTER = "DefaultCluster"
A_ADDR, B_ADDR = "127.0.0.1:10911", "127.0.0.1:10921"
#: what tests.support.brokers.register_broker sends with counter=1
A_DV = DataVersion(1, 0, 1_700_000_000_000)
B_TIMEOUT_MS = 1_500


@pytest.fixture(scope="module")
def redis_service(tmp_path_factory):
    service = RedisService(port=free_port(), run_dir=tmp_path_factory.mktemp("redis"))
    service.start()
    yield service
    service.stop()


def write_model(url: str, prefix: str) -> None:
    """broker-a (master, 20 s timeout) with TopicA and Gone; broker-b (1.5 s timeout) with TopicA and OnlyB."""
    model = RouteModel(RouteSettings())
    now = int(time.time() * 1000)
    for name, addr, timeout, topics in (
        ("broker-a", A_ADDR, 20_000, ["TopicA", "Gone", CLUSTER]),
        ("broker-b", B_ADDR, B_TIMEOUT_MS, ["TopicA", "OnlyB", CLUSTER]),
    ):
        model.apply_event(Event(
            EventType.REGISTER, "node-1", now, 1, cluster_name=CLUSTER, broker_name=name, broker_id=0,
            broker_addr=addr, ha_server_addr=addr, enable_acting_master=False, heartbeat_timeout_millis=timeout,
            data_version=DataVersionInfo(A_DV.counter, A_DV.state_version, A_DV.timestamp),
            topics={t: QueueInfo(4, 4, 6, 0) for t in topics},
        ))  # fmt: skip
    store = RedisRouteStore.from_url(url, prefix)
    try:
        store.commit("lineage-1", 7, model.changes(full=True), watermark=now - 1_000, replace=True)
    finally:
        store.client.close()


def route_or_none(client: NameServerClient, topic: str):
    response = client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if response.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert response.code == ResponseCode.SUCCESS, response.remark
    return response.body


def test_routes_answer_at_once_then_registrations_replace_and_unconfirmed_brokers_drop(redis_service, tmp_path):
    write_model(redis_service.url, "ws1")
    props = {"warmStartFromRedis": "true", "redisUrl": redis_service.url, "redisKeyPrefix": "ws1"}
    with running_node(tmp_path, **props) as node, NameServerClient(node.addr) as client:
        report = node.running.warm_start
        assert report is not None and (report.brokers, report.batch_id, report.topics) == (2, 7, 4)

        # answered at once, byte for byte what the job materialised for clients
        raw = redis_service_get(redis_service.url, "ws1:route:TopicA")
        assert route_or_none(client, "TopicA") == raw
        assert {b.broker_name for b in client.topic_route("TopicA").broker_datas} == {"broker-a", "broker-b"}
        assert set(client.cluster_info()[1][CLUSTER]) == {"broker-a", "broker-b"}
        routes = node.running.context.routes
        assert node.call(routes.is_provisional, CLUSTER, A_ADDR)

        # the monitor switched the local scan off: the provisional deadline must not depend on it
        node.call(node.running.expiry.hand_to_monitor)

        # the broker asks whether to register with the DataVersion Redis holds: it is told to
        ask = client.call(
            RequestCode.QUERY_DATA_VERSION,
            {"brokerName": "broker-a", "brokerAddr": A_ADDR, "clusterName": CLUSTER, "brokerId": "0"},
            bodies.encode_data_version(A_DV),
        )
        assert ask.code == ResponseCode.SUCCESS and ask.ext_fields["changed"] == "true"

        # its own registration (same DataVersion, no "Gone" any more) takes over its rows
        register_broker(client, broker_addr=A_ADDR, topics=["TopicA", "New"], broker_name="broker-a", counter=1)
        assert route_or_none(client, "Gone") is None
        assert {q.broker_name for q in client.topic_route("New").queue_datas} == {"broker-a"}
        assert not node.call(routes.is_provisional, CLUSTER, A_ADDR)
        assert node.call(routes.is_provisional, CLUSTER, B_ADDR)

        # broker-b never registers: gone after its own 1.5 s timeout, with the scan off
        wait_until(lambda: route_or_none(client, "OnlyB") is None, B_TIMEOUT_MS / 1000 + 3, "OnlyB to go")
        assert {q.broker_name for q in client.topic_route("TopicA").queue_datas} == {"broker-a"}
        assert set(client.cluster_info()[1][CLUSTER]) == {"broker-a"}
        stats = node.call(lambda: routes.provisional_stats)
        assert (stats.loaded, stats.confirmed, stats.dropped) == (2, 1, 1)


def redis_service_get(url: str, key: str) -> bytes | None:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return client.get(key)
    finally:
        client.close()


def test_off_by_default_the_node_ignores_redis(redis_service, tmp_path):
    write_model(redis_service.url, "ws2")
    with (
        running_node(tmp_path, redisUrl=redis_service.url, redisKeyPrefix="ws2") as node,
        NameServerClient(node.addr) as client,
    ):
        assert node.running.warm_start is None
        assert route_or_none(client, "TopicA") is None


def test_redis_down_starts_empty_with_a_warning(tmp_path, caplog):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, "namesrv.warmstart"):
        with (
            running_node(tmp_path, warmStartFromRedis="true", redisUrl=url) as node,
            NameServerClient(node.addr) as client,
        ):
            assert time.monotonic() - started < READ_TIMEOUT_S
            assert node.running.warm_start is None
            assert route_or_none(client, "TopicA") is None
            register_broker(client, broker_addr=A_ADDR, topics=["TopicA"])
            assert route_or_none(client, "TopicA") is not None
    assert "cannot read" in caplog.text and "starting with empty route tables" in caplog.text


def test_a_redis_that_never_answers_holds_the_start_for_the_read_timeout_at_most(tmp_path, caplog):
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:  # accept and say nothing
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, "namesrv.warmstart"):
            with running_node(tmp_path, warmStartFromRedis="true", redisUrl=url) as node:
                assert time.monotonic() - started < READ_TIMEOUT_S + 2
                assert node.running.warm_start is None
        assert "starting with empty route tables" in caplog.text
    finally:
        stop.set()
        thread.join(2)
        for conn in accepted:
            conn.close()
        listener.close()
