"""Local expiry and batched unregistration, driven with an injected clock: no sleeping."""

from __future__ import annotations

import asyncio
import json
import threading

from namesrv.config import load_config
from namesrv.handlers import NameServerNode, dispatch
from namesrv.kvconfig import KVConfigManager
from namesrv.liveness import BatchUnregistration, ExpiryScan
from namesrv.protocol.codes import RequestCode, ResponseCode
from namesrv.protocol.command import request
from namesrv.routes.manager import RouteInfoManager
from tests.support.node import VECTORS

V = json.loads((VECTORS / "vectors.json").read_text())
V3_EXT = json.loads(next(f for f in V["frames"] if f["name"].startswith("REGISTER_BROKER request"))["header_json"])[
    "extFields"
]
BODY = (VECTORS / "register_broker_body.json").read_bytes()


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


class Channel:
    closed = False

    def close(self) -> None:
        self.closed = True


def make_node(tmp_path, clock):
    config = load_config(None, {"kvConfigPath": str(tmp_path / "kv.json"), "configStorePath": str(tmp_path / "p")})
    routes = RouteInfoManager(config, now_ms=clock)
    batch = BatchUnregistration(routes, capacity=2)
    node = NameServerNode(config, routes, KVConfigManager(tmp_path / "kv.json"), batch.submit)
    return node, batch, ExpiryScan(routes, interval_ms=5000)


def route_code(node) -> int:
    return dispatch(node, request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}), None).code


def register(node, channel, **ext):
    assert dispatch(node, request(RequestCode.REGISTER_BROKER, {**V3_EXT, **ext}, BODY), channel).code == 0


def test_a_silent_broker_expires_after_its_timeout_and_its_connection_is_closed(tmp_path):
    clock, channel = Clock(), Channel()
    node, _, scan = make_node(tmp_path, clock)
    register(node, channel)
    clock.ms += 120_000
    assert scan.scan_once() == [] and route_code(node) == ResponseCode.SUCCESS
    clock.ms += 1
    assert [r.broker_addr for r in scan.scan_once()] == ["127.0.0.1:10911"]
    assert route_code(node) == ResponseCode.TOPIC_NOT_EXIST and channel.closed


def test_heartbeats_keep_a_broker_alive_and_its_own_timeout_wins(tmp_path):
    clock, channel = Clock(), Channel()
    node, _, scan = make_node(tmp_path, clock)
    register(node, channel, heartbeatTimeoutMillis="10000")
    for _ in range(5):
        clock.ms += 9_000
        hb = request(
            RequestCode.BROKER_HEARTBEAT,
            {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:10911"},
            oneway=True,
        )
        assert dispatch(node, hb, channel) is None
        assert scan.scan_once() == []
    clock.ms += 10_001
    assert len(scan.scan_once()) == 1


def test_unregistration_is_queued_then_applied_in_one_batch(tmp_path):
    node, batch, _ = make_node(tmp_path, Clock())
    register(node, Channel())
    ident = {
        "clusterName": "DefaultCluster",
        "brokerAddr": "127.0.0.1:10911",
        "brokerName": "broker-a",
        "brokerId": "0",
    }
    assert dispatch(node, request(RequestCode.UNREGISTER_BROKER, ident), None).code == 0
    assert route_code(node) == ResponseCode.SUCCESS  # asynchronous, as in Java
    batch.drain_now()
    assert route_code(node) == ResponseCode.TOPIC_NOT_EXIST


def test_a_queued_unregistration_does_not_remove_a_broker_that_registered_again(tmp_path):
    node, batch, _ = make_node(tmp_path, Clock())
    register(node, Channel())
    ident = {
        "clusterName": "DefaultCluster",
        "brokerAddr": "127.0.0.1:10911",
        "brokerName": "broker-a",
        "brokerId": "0",
    }
    dispatch(node, request(RequestCode.UNREGISTER_BROKER, ident), None)
    register(node, Channel())  # the broker came back before the batch ran (apache/rocketmq#11043)
    batch.drain_now()
    assert route_code(node) == ResponseCode.SUCCESS


def test_a_full_unregistration_queue_answers_system_error(tmp_path):
    node, _, _ = make_node(tmp_path, Clock())
    ident = {"clusterName": "c", "brokerAddr": "a:1", "brokerName": "b", "brokerId": "0"}
    codes = [dispatch(node, request(RequestCode.UNREGISTER_BROKER, ident), None).code for _ in range(3)]
    assert codes == [0, 0, ResponseCode.SYSTEM_ERROR]


def test_the_scan_on_the_loop_does_not_wait_for_tables_another_thread_is_changing(tmp_path):
    import threading

    inside, leave = threading.Event(), threading.Event()

    class SlowClock(Clock):
        """Read under the tables' lock: blocks a registration on another thread halfway."""

        def __call__(self) -> int:
            if threading.current_thread() is not threading.main_thread():
                inside.set()
                assert leave.wait(10)
            return self.ms

    clock, channel = SlowClock(), Channel()
    node, _, scan = make_node(tmp_path, clock)
    register(node, channel)
    clock.ms += 120_001
    worker = threading.Thread(target=register, args=(node, Channel()), kwargs={"brokerAddr": "127.0.0.1:10921"})
    worker.start()
    try:
        assert inside.wait(10)
        assert scan.scan_once(wait=False) is None  # busy: nothing done, nothing waited for
        assert not channel.closed
    finally:
        leave.set()
        worker.join(10)
    assert [r.broker_addr for r in scan.scan_once(wait=False)] == ["127.0.0.1:10911"] and channel.closed


def test_the_batch_task_applies_unregistrations_on_the_worker_and_reports_on_the_loop(tmp_path, monkeypatch):
    """Removing a broker of 100,000 topics takes 60-90 ms: the loop only queues and reports (here: the
    master leaves, the slave is told the group's minimum id changed)."""
    node, batch, _ = make_node(tmp_path, Clock())
    register(node, Channel(), enableActingMaster="true")
    register(node, Channel(), brokerId="1", brokerAddr="127.0.0.1:10921", enableActingMaster="true")
    applied_on, reported_on = [], []
    apply = node.routes.unregister_brokers
    monkeypatch.setattr(
        node.routes, "unregister_brokers", lambda r: applied_on.append(threading.current_thread()) or apply(r)
    )
    monkeypatch.setattr(node.routes.settings, "notify_min_broker_id_changed", True)
    batch.on_min_broker_id_change = lambda change: reported_on.append(threading.current_thread())

    async def unregister_the_master() -> None:
        task = asyncio.get_running_loop().create_task(batch.run(node.worker))
        assert node.submit_unregister(
            [node.routes.build_unregister_request(V3_EXT["clusterName"], V3_EXT["brokerAddr"])]
        )
        while not reported_on:
            await asyncio.sleep(0)  # a turn of the loop: the worker does the work meanwhile
        task.cancel()

    asyncio.run(asyncio.wait_for(unregister_the_master(), 10))
    assert applied_on and applied_on[0].name.startswith("namesrv-worker")
    assert reported_on == [threading.main_thread()]
    node.close()
