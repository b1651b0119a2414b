"""NOTIFY_MIN_BROKER_ID_CHANGE (spec §3.2 step 13, §3.4): the frame, and every path reaching the node's outlet."""

from __future__ import annotations

from pathlib import Path

import pytest

from namesrv.app import build_node
from namesrv.config import load_config
from namesrv.handlers import HandlerContext, dispatch, min_broker_id_change_request
from namesrv.protocol.codec import decode_frame, encode
from namesrv.protocol.codes import Flag, RequestCode, ResponseCode, SerializeType
from namesrv.protocol.command import request
from namesrv.routes import MinBrokerIdChange
from tests.support.brokers import registration
from tests.support.clock import Clock

GROUP = "broker-a"
MASTER, SLAVE = "127.0.0.1:10911", "127.0.0.1:10921"


@pytest.mark.parametrize("stype", [SerializeType.JSON, SerializeType.ROCKETMQ])
def test_the_request_is_a_oneway_905_with_absent_values_left_out(stype):
    arrival = MinBrokerIdChange(GROUP, 0, MASTER, None, "127.0.0.1:10912", (SLAVE,))
    departure = MinBrokerIdChange(GROUP, 1, SLAVE, MASTER, None, (SLAVE,))
    for change, ext in [
        (arrival, {"minBrokerId": "0", "minBrokerAddr": MASTER, "haBrokerAddr": "127.0.0.1:10912"}),
        (departure, {"minBrokerId": "1", "minBrokerAddr": SLAVE, "offlineBrokerAddr": MASTER}),
    ]:
        cmd = min_broker_id_change_request(change, opaque=7)
        cmd.serialize_type = stype
        sent = decode_frame(encode(cmd))
        assert (sent.code, sent.opaque, sent.flag) == (RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE, 7, Flag.ONEWAY)
        assert sent.ext_fields == ext and not sent.body and sent.serialize_type == stype


def _node(tmp_path: Path, notify: bool) -> tuple[HandlerContext, object, object, Clock, list[MinBrokerIdChange]]:
    props = {"kvConfigPath": str(tmp_path / "kv.json"), "notifyMinBrokerIdChanged": str(notify).lower()}
    node, unregistration, expiry = build_node(load_config(None, props))
    clock = node.routes.now_ms = Clock()
    sent: list[MinBrokerIdChange] = []
    node.notify_brokers = sent.append
    return node, unregistration, expiry, clock, sent


def _register(node: HandlerContext, addr: str, broker_id: int, channel: object) -> None:
    ext, body = registration(
        broker_addr=addr,
        topics=["T"],
        broker_name=GROUP,
        broker_id=broker_id,
        enable_acting_master=True,
        ha_server_addr=f"{addr}-ha",
    )
    response = dispatch(node, request(RequestCode.REGISTER_BROKER, ext, body), channel)
    assert response is not None and response.code == ResponseCode.SUCCESS


def test_a_registration_lowering_the_minimum_reaches_the_outlet(tmp_path):
    node, _, _, _, sent = _node(tmp_path, notify=True)
    _register(node, SLAVE, 1, object())
    assert sent == []
    _register(node, MASTER, 0, object())
    assert sent == [MinBrokerIdChange(GROUP, 0, MASTER, None, f"{MASTER}-ha", (SLAVE,))]


def test_a_batched_unregistration_reaches_the_outlet(tmp_path):
    node, unregistration, _, _, sent = _node(tmp_path, notify=True)
    _register(node, MASTER, 0, object())
    _register(node, SLAVE, 1, object())
    assert unregistration.submit([node.routes.build_unregister_request("DefaultCluster", MASTER)])
    unregistration.drain_now()
    assert sent == [MinBrokerIdChange(GROUP, 1, SLAVE, MASTER, None, (SLAVE,))]


def test_an_expiry_reaches_the_outlet(tmp_path):
    node, _, expiry, clock, sent = _node(tmp_path, notify=True)
    _register(node, MASTER, 0, object())
    clock.advance(100_000)
    _register(node, SLAVE, 1, object())
    clock.advance(30_000)  # the master is past the default 120 s timeout, the slave is not
    assert [r.broker_addr for r in expiry.scan_once()] == [MASTER]
    assert sent == [MinBrokerIdChange(GROUP, 1, SLAVE, MASTER, None, (SLAVE,))]


def test_nothing_reaches_the_outlet_when_the_switch_is_off(tmp_path):
    node, unregistration, _, _, sent = _node(tmp_path, notify=False)
    _register(node, SLAVE, 1, object())
    _register(node, MASTER, 0, object())
    assert unregistration.submit([node.routes.build_unregister_request("DefaultCluster", MASTER)])
    unregistration.drain_now()
    assert sent == []
