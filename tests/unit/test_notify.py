"""NOTIFY_MIN_BROKER_ID_CHANGE (spec §3.2 step 13, §3.4): the frame, and every path reaching the node's outlet."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from common.protocol.codec import decode_frame, encode
from common.protocol.codes import Flag, RequestCode, ResponseCode, SerializeType
from common.protocol.command import request
from common.routes import MinBrokerIdChange
from namesrv import notify as notify_mod
from namesrv.app import build_node
from namesrv.config import load_config
from namesrv.handlers import HandlerContext, dispatch
from namesrv.notify import BrokerNotifier, min_broker_id_change_request
from tests.support.brokers import registration
from tests.support.clock import Clock
from tests.support.frames import commands

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
    sent: list[MinBrokerIdChange] = []
    parts = build_node(load_config(None, props), notify_brokers=sent.append)
    clock = parts.context.routes.now_ms = Clock()
    return parts.context, parts.unregistrations, parts.expiry, clock, sent


def _register(context: HandlerContext, addr: str, broker_id: int, channel: object) -> None:
    ext, body = registration(
        broker_addr=addr,
        topics=["T"],
        broker_name=GROUP,
        broker_id=broker_id,
        enable_acting_master=True,
        ha_server_addr=f"{addr}-ha",
    )
    response = dispatch(context, request(RequestCode.REGISTER_BROKER, ext, body), channel)
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


class FakeWriter:
    """The writer of a connection to ``addr``: what was written, and whether it was closed."""

    def __init__(self, addr: str, sent: dict[str, bytes]) -> None:
        self.addr, self.sent = addr, sent
        sent[addr] = b""

    def write(self, data: bytes) -> None:
        self.sent[self.addr] += data

    async def drain(self) -> None: ...

    def close(self) -> None:
        self.sent[self.addr] += b"<closed>"


def _fake_connections(monkeypatch, sent: dict[str, bytes], hang: asyncio.Event | None = None) -> None:
    async def open_connection(host: str, port: int) -> tuple[None, FakeWriter]:
        if hang is not None:
            await hang.wait()
        return None, FakeWriter(f"{host}:{port}", sent)

    monkeypatch.setattr(notify_mod.asyncio, "open_connection", open_connection)


def test_the_notifier_sends_each_target_one_frame_over_its_own_connection(monkeypatch):
    sent: dict[str, bytes] = {}
    _fake_connections(monkeypatch, sent)
    notifier = BrokerNotifier(SerializeType.ROCKETMQ)
    change = MinBrokerIdChange(GROUP, 1, SLAVE, MASTER, None, (SLAVE, "127.0.0.1:10931"))

    async def notify_and_wait() -> None:
        notifier.notify(change)
        await asyncio.wait(notifier.tasks)

    asyncio.run(notify_and_wait())
    assert sorted(sent) == [SLAVE, "127.0.0.1:10931"] and not notifier.tasks
    frames = [commands(data.removesuffix(b"<closed>")) for data in sent.values()]
    assert all(data.endswith(b"<closed>") for data in sent.values())
    assert [len(f) for f in frames] == [1, 1]
    first, second = frames[0][0], frames[1][0]
    assert (first.code, first.flag, first.serialize_type) == (
        RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE,
        Flag.ONEWAY,
        SerializeType.ROCKETMQ,
    )
    assert (
        first.ext_fields
        == second.ext_fields
        == {"minBrokerId": "1", "minBrokerAddr": SLAVE, "offlineBrokerAddr": MASTER}
    )
    assert first.opaque != second.opaque


def test_an_unreachable_target_is_logged_not_raised(caplog):
    notifier = BrokerNotifier()
    change = MinBrokerIdChange(GROUP, 0, MASTER, None, None, ("not an address",))
    caplog.set_level(logging.INFO, logger="namesrv.notify")

    async def notify_and_wait() -> None:
        notifier.notify(change)
        await asyncio.wait(notifier.tasks)

    asyncio.run(notify_and_wait())
    assert any("could not connect to broker not an address" in r.getMessage() for r in caplog.records)


def test_stop_cancels_the_sends_under_way(monkeypatch):
    sent: dict[str, bytes] = {}
    notifier = BrokerNotifier()

    async def notify_then_stop() -> list[asyncio.Task[None]]:
        _fake_connections(monkeypatch, sent, hang=asyncio.Event())  # connections that never come up
        notifier.notify(MinBrokerIdChange(GROUP, 0, MASTER, None, None, (SLAVE,)))
        under_way = list(notifier.tasks)
        await asyncio.sleep(0)
        await notifier.stop(timeout=1)
        return under_way

    (task,) = asyncio.run(notify_then_stop())
    assert task.cancelled() and not notifier.tasks and sent == {}


@pytest.mark.parametrize(("mode", "stype"), [("JSON", SerializeType.JSON), ("ROCKETMQ", SerializeType.ROCKETMQ),
                                             ("ECHO", SerializeType.JSON)])  # fmt: skip
def test_the_notifier_writes_headers_as_the_node_writes_answers(mode, stype):
    assert BrokerNotifier.from_config(load_config(None, {"responseSerializeType": mode})).serialize_type == stype
