"""Hostile bytes on the TLS path of a live node: random and broken handshakes, and hostile frames
inside a TLS session.  The node never dies, logs no error, and keeps serving a TLS client and a
plaintext one (test_server_fuzz.py does the same for plaintext)."""

from __future__ import annotations

import logging
import socket
import ssl
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.protocol.codes import RequestCode
from namesrv import handshake
from namesrv.client import NameServerClient
from tests.conformance.test_server_fuzz import hostile
from tests.support.node import running_node
from tests.support.tls import client_hello, client_tls, insecure_tls, make_certificates, node_tls, proxy_v1

HELLO = client_hello()


def _mutate(at: int, value: int) -> bytes:
    return HELLO[:at] + bytes([value]) + HELLO[at + 1 :]


handshakes = st.one_of(
    st.binary(max_size=64).map(lambda b: b"\x16" + b),  # random after the handshake byte
    st.integers(1, len(HELLO) - 1).map(lambda n: HELLO[:n]),  # a ClientHello cut short
    st.builds(_mutate, st.integers(0, len(HELLO) - 1), st.integers(0, 255)),  # one byte changed
    st.builds(lambda n, junk: HELLO[:n] + junk, st.integers(5, len(HELLO)), st.binary(min_size=1, max_size=64)),
    st.builds(  # a record header announcing up to 64 KiB that never comes
        lambda version, length, tail: b"\x16" + struct.pack(">HH", version, length) + tail,
        st.integers(0, 0xFFFF),
        st.integers(0, 0xFFFF),
        st.binary(max_size=16),
    ),
    st.binary(max_size=48).map(lambda b: HELLO + b"\x15\x03\x03\x00\x02" + b),  # an alert and more after it
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


def send_and_drop(addr: str, data: bytes, *, tls: ssl.SSLContext | None = None, preamble: bytes = b"") -> None:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as raw:
        try:
            raw.sendall(preamble)
            s = raw if tls is None else tls.wrap_socket(raw, server_hostname=host)
            s.sendall(data)
            s.settimeout(0.05)
            while s.recv(65536):
                pass
        except (TimeoutError, ConnectionError, ssl.SSLError):
            pass


def test_hostile_handshakes_and_frames_over_tls_never_stop_the_node(tmp_path, certs, caplog):
    caplog.set_level(logging.WARNING)
    props = node_tls(certs, handshakeTimeoutMillis="500", proxyProtocolMode="optional")
    with running_node(tmp_path, **props) as node:
        with (
            NameServerClient(node.addr, tls=client_tls(certs)) as over_tls,
            NameServerClient(node.addr) as plain,
        ):

            @settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
            @given(data=handshakes, proxied=st.booleans())
            def attack_handshake(data: bytes, proxied: bool) -> None:
                send_and_drop(node.addr, data, preamble=proxy_v1("203.0.113.9", 9) if proxied else b"")
                assert over_tls.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == 0
                assert plain.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == 0

            @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
            @given(data=hostile)
            def attack_inside_tls(data: bytes) -> None:
                send_and_drop(node.addr, data, tls=insecure_tls())
                assert over_tls.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == 0

            attack_handshake()
            attack_inside_tls()
        with NameServerClient(node.addr, tls=client_tls(certs)) as fresh:
            assert fresh.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).code == 17
        assert node.call(lambda: node.running.server._acceptor.pending) == 0
    ours = [r for r in caplog.records if r.name.split(".")[0] in ("namesrv", "asyncio")]
    assert not [r.getMessage()[:200] for r in ours if r.levelno >= logging.ERROR]
    # the set-up warnings are rate-limited (the run takes a minute or two)
    assert sum(r.name == "namesrv.handshake" for r in caplog.records) <= 3 * handshake._LOG_PER_MINUTE
