"""The fake broker must record what clients send and answer sends, or peer tests prove nothing."""

from __future__ import annotations

import socket
import struct

import pytest

from common.protocol.codec import decode_frame
from common.protocol.codes import Flag, ResponseCode
from common.protocol.command import RemotingCommand
from tests.peers.fake_broker import BrokerCode, FakeBroker
from tests.support.frames import json_frame


def cpp_request(code: int, opaque: int, ext: dict[str, str], body: bytes = b"", flag: int = 0) -> bytes:
    """A request as the C++ client writes it."""
    header = {
        "code": code,
        "extFields": ext,
        "flag": flag,
        "language": "CPP",
        "opaque": opaque,
        "remark": "",
        "version": 63,
    }
    return json_frame(header, body)


def read_frame(sock: socket.socket) -> RemotingCommand:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "fake broker closed the connection"
            data += chunk
        return data

    prefix = exactly(4)
    (length,) = struct.unpack(">i", prefix)
    return decode_frame(prefix + exactly(length))


def test_send_is_recorded_and_acknowledged_and_oneway_is_not_answered() -> None:
    with FakeBroker() as broker, socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        # SEND_MESSAGE_V2 names the topic "b" and the queue "e"
        sock.sendall(cpp_request(BrokerCode.HEART_BEAT, 7, {}, flag=Flag.ONEWAY))
        sock.sendall(cpp_request(BrokerCode.SEND_MESSAGE_V2, 0, {"b": "TopicX", "e": "3"}, body=b"payload"))
        reply = read_frame(sock)

        assert reply.opaque == 0, "the oneway heartbeat must not be answered"
        assert reply.code == ResponseCode.SUCCESS
        assert reply.flag == Flag.RESPONSE
        ext = reply.ext_fields or {}
        assert ext["queueId"] == "3" and ext["queueOffset"] == "0" and ext["msgId"]

        sent = broker.wait_for_send("TopicX", timeout=5)
        assert sent.body == b"payload" and sent.language == "CPP" and sent.version == 63
        assert [f.code for f in broker.frames] == [BrokerCode.HEART_BEAT, BrokerCode.SEND_MESSAGE_V2]


def test_other_requests_get_bare_success() -> None:
    with FakeBroker() as broker, socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(cpp_request(BrokerCode.UNREGISTER_CLIENT, 41, {"clientID": "x"}))
        reply = read_frame(sock)
        assert (reply.code, reply.opaque) == (ResponseCode.SUCCESS, 41)
        assert reply.ext_fields is None


def test_wait_for_timeout_names_what_arrived() -> None:
    with FakeBroker() as broker, socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(cpp_request(BrokerCode.UNREGISTER_CLIENT, 1, {}))
        read_frame(sock)
        with pytest.raises(TimeoutError, match=r"\(35, None\)"):
            broker.wait_for_send("TopicX", timeout=0)


def test_garbage_closes_the_connection_and_is_reported() -> None:
    with FakeBroker() as broker, socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(json_frame(b"{}", type_byte=7))
        assert sock.recv(1) == b"", "a decode error must close the connection"
        assert broker.errors and "serialize type 7" in broker.errors[0]
        assert broker.frames == []


def test_address_is_a_free_loopback_port_and_requires_start() -> None:
    broker = FakeBroker()
    with pytest.raises(RuntimeError, match="not started"):
        _ = broker.address
    with broker:
        assert broker.address == f"127.0.0.1:{broker.port}" and broker.port > 0


def test_stop_closes_client_connections() -> None:
    broker = FakeBroker().start()
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(cpp_request(BrokerCode.UNREGISTER_CLIENT, 1, {}))
        read_frame(sock)  # the connection is now registered on the broker side
        broker.stop()
        assert sock.recv(1) == b"", "clients must see the broker go away"
