"""Batched unregistration: queued, applied in one batch off the loop, fenced against a fresh registration."""

from __future__ import annotations

import asyncio
import threading

from common.protocol.codes import RequestCode, ResponseCode
from common.protocol.command import request
from namesrv.handlers import dispatch
from tests.unit.liveness_support import V3_EXT, Channel, Clock, make_node, register, route_code

#: the UNREGISTER_BROKER header of the broker register() registers
IDENT = {"clusterName": "DefaultCluster", "brokerAddr": "127.0.0.1:10911", "brokerName": "broker-a", "brokerId": "0"}


def test_unregistration_is_queued_then_applied_in_one_batch(tmp_path):
    node, batch, _ = make_node(tmp_path, Clock())
    register(node, Channel())
    ident = IDENT
    assert dispatch(node, request(RequestCode.UNREGISTER_BROKER, ident), None).code == 0
    assert route_code(node) == ResponseCode.SUCCESS  # asynchronous, as in Java
    batch.drain_now()
    assert route_code(node) == ResponseCode.TOPIC_NOT_EXIST


def test_a_queued_unregistration_does_not_remove_a_broker_that_registered_again(tmp_path):
    node, batch, _ = make_node(tmp_path, Clock())
    register(node, Channel())
    ident = IDENT
    dispatch(node, request(RequestCode.UNREGISTER_BROKER, ident), None)
    register(node, Channel())  # the broker came back before the batch ran (apache/rocketmq#11043)
    batch.drain_now()
    assert route_code(node) == ResponseCode.SUCCESS


def test_a_full_unregistration_queue_answers_system_error(tmp_path):
    node, _, _ = make_node(tmp_path, Clock())
    ident = {"clusterName": "c", "brokerAddr": "a:1", "brokerName": "b", "brokerId": "0"}
    codes = [dispatch(node, request(RequestCode.UNREGISTER_BROKER, ident), None).code for _ in range(3)]
    assert codes == [0, 0, ResponseCode.SYSTEM_ERROR]


def test_the_batch_task_applies_unregistrations_on_the_worker_and_reports_on_the_loop(tmp_path, monkeypatch):
    """Removing a broker of 100,000 topics takes tens of milliseconds: the loop only queues and reports
    (here: the master leaves, the slave is told the group's minimum id changed)."""
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
