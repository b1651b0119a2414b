"""TLS and the PROXY protocol on the remoting port, against a live node on loopback.

Certificates are made at test time (tests/support/tls.py, docs/security.md's openssl recipe).  Each test
starts its own node with the keys it needs; a well-formed client is served throughout.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import subprocess
import sys
import time

import pytest

from common.protocol.codec import encode
from common.protocol.codes import RequestCode
from common.protocol.command import request
from namesrv import handshake
from namesrv.client import NameServerClient
from namesrv.config import REDACTED, ConfigError, load_config
from namesrv.handshake import TransportSecurity
from tests.support.brokers import register_broker
from tests.support.node import REPO, raw_exchange, running_node
from tests.support.tls import (
    KEY_PASSWORD,
    client_hello,
    client_tls,
    insecure_tls,
    make_certificates,
    node_tls,
    proxy_v1,
    proxy_v2_inet6,
)
from tests.support.wait import wait_until

GOOD = encode(request(RequestCode.GET_BROKER_CLUSTER_INFO, opaque=1))
NAMESRV = [sys.executable, "-m", "namesrv"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


def served(addr: str, **kw) -> bool:
    with NameServerClient(addr, timeout=3, **kw) as c:
        return c.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == 0


def closed_without_answer(addr: str, data: bytes = GOOD, **kw) -> bool:
    try:
        return raw_exchange(addr, data, expect_close=True, **kw) == b""
    except (ssl.SSLError, ConnectionError):  # refused during the TLS handshake
        return True


def warnings(caplog, logger: str, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger and text in r.getMessage()]


# --- defaults ----------------------------------------------------------------------------------


def test_by_default_nothing_changes_the_loops_own_server_accepts_plaintext(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "namesrv.server")
    with running_node(tmp_path) as node:
        assert node.running.server._acceptor is None  # the code path of every release before this one
        assert served(node.addr)
        # a TLS client gets nowhere: its ClientHello is a malformed frame, as before
        for _ in range(3):  # a client retrying
            assert closed_without_answer(node.addr, client_hello())
        assert served(node.addr)
        addr = node.addr
    # at the default level, start-up says what the port serves
    assert warnings(caplog, "namesrv.server", f"remoting port {addr}: TLS off (tls.server.mode=permissive,")
    assert warnings(caplog, "namesrv.server", "no certificate); proxyProtocolMode=disabled")
    # and the TLS client is named once, with the keys that would serve it
    (told,) = warnings(caplog, "namesrv.server", "closing connection from 127.0.0.1")
    assert "a TLS client reached this plaintext-only node" in told
    assert "set tls.server.certPath and tls.server.keyPath" in told


# --- TLS ---------------------------------------------------------------------------------------


def test_permissive_serves_plaintext_and_tls_on_the_same_port(tmp_path, certs):
    with running_node(tmp_path, **node_tls(certs)) as node:
        assert served(node.addr)
        with NameServerClient(node.addr, tls=client_tls(certs)) as c:
            register_broker(c, broker_addr="127.0.0.1:10911", topics=["TlsTopic"])
            assert c._sock.version() in ("TLSv1.2", "TLSv1.3")  # type: ignore[union-attr]
            with NameServerClient(node.addr) as plain:  # while the broker's TLS connection lives
                assert plain.topic_route("TlsTopic").broker_datas[0].broker_addrs == {0: "127.0.0.1:10911"}


def test_enforcing_refuses_plaintext_and_serves_tls(tmp_path, certs, caplog):
    caplog.set_level(logging.WARNING, "namesrv.handshake")
    with running_node(tmp_path, **node_tls(certs, **{"tls.server.mode": "enforcing"})) as node:
        assert closed_without_answer(node.addr)
        assert served(node.addr, tls=client_tls(certs))
        assert warnings(caplog, "namesrv.handshake", "plaintext refused (tls.server.mode=enforcing)")


def test_disabled_treats_tls_as_a_bad_frame(tmp_path, certs, caplog):
    caplog.set_level(logging.WARNING, "namesrv.server")
    with running_node(tmp_path, **node_tls(certs, **{"tls.server.mode": "disabled"})) as node:
        assert node.running.server._acceptor is None
        assert closed_without_answer(node.addr, client_hello())
        assert served(node.addr)
        assert warnings(caplog, "namesrv.server", "tls.server.mode=disabled: to serve TLS, set tls.server.mode=")
        assert warnings(caplog, "namesrv.server", "TLS off (tls.server.mode=disabled); proxyProtocolMode=disabled")


def test_client_auth_require_refuses_clients_without_a_trusted_certificate(tmp_path, certs):
    props = node_tls(certs, **{"tls.server.need.client.auth": "require", "tls.server.trustCertPath": str(certs.ca)})
    with running_node(tmp_path, **props) as node:
        assert served(node.addr, tls=client_tls(certs, cert=True))
        assert closed_without_answer(node.addr, tls=client_tls(certs))  # no certificate
        assert closed_without_answer(node.addr, tls=client_tls(certs, stranger=True))  # another CA's
        assert served(node.addr)  # plaintext, in permissive mode, as RocketMQ (enforcing closes that door)


def test_client_auth_optional_verifies_a_certificate_only_when_one_is_sent(tmp_path, certs):
    props = node_tls(certs, **{"tls.server.need.client.auth": "optional", "tls.server.trustCertPath": str(certs.ca)})
    with running_node(tmp_path, **props) as node:
        assert served(node.addr, tls=client_tls(certs))
        assert served(node.addr, tls=client_tls(certs, cert=True))
        assert closed_without_answer(node.addr, tls=client_tls(certs, stranger=True))


def test_an_encrypted_key_opens_with_its_password_which_is_never_shown(tmp_path, certs):
    props = {
        "tls.server.certPath": str(certs.server_cert),
        "tls.server.keyPath": str(certs.server_key_encrypted),
        "tls.server.keyPassword": KEY_PASSWORD,
    }
    with running_node(tmp_path, **props) as node:
        with NameServerClient(node.addr, tls=client_tls(certs)) as c:
            shown = c.get_config()
        assert shown["tls.server.keyPassword"] == REDACTED and KEY_PASSWORD not in json.dumps(shown)
        # and a remote update may not touch the TLS keys
        with NameServerClient(node.addr) as c, pytest.raises(Exception, match="NO_PERMISSION"):
            c.update_config({"tls.server.mode": "disabled"})


def test_tls_config_file_overrides_the_nodes_properties(tmp_path, certs):
    tls_file = tmp_path / "tls.properties"
    tls_file.write_text(
        f"tls.server.certPath={certs.server_cert}\ntls.server.keyPath={certs.server_key}\n"
        f"tls.server.need.client.auth=require\ntls.server.trustCertPath={certs.ca}\n"
    )
    props = {"tls.config.file": str(tls_file), "tls.server.mode": "enforcing", "tls.server.need.client.auth": "none"}
    with running_node(tmp_path, **props) as node:
        assert closed_without_answer(node.addr, tls=client_tls(certs))
        assert served(node.addr, tls=client_tls(certs, cert=True))


def test_test_mode_serves_tls_with_a_self_signed_certificate(tmp_path, certs):
    with running_node(tmp_path, **{"tls.test.mode.enable": "true", "tls.server.mode": "enforcing"}) as node:
        assert served(node.addr, tls=insecure_tls())
        with pytest.raises(ssl.SSLCertVerificationError):
            served(node.addr, tls=client_tls(certs))  # nobody can verify it


def test_a_stalled_handshake_is_closed_after_the_timeout_while_a_good_client_is_served(tmp_path, certs, caplog):
    caplog.set_level(logging.WARNING, "namesrv.handshake")
    timeout_ms = 800
    with running_node(tmp_path, **node_tls(certs, handshakeTimeoutMillis=str(timeout_ms))) as node:
        host, port = node.addr.split(":")
        hello = client_hello()
        stalled = []
        for first in (b"", b"\x16", hello[: len(hello) // 2], hello):  # nothing, a byte, half, no Finished
            s = socket.create_connection((host, int(port)))
            s.sendall(first)
            stalled.append(s)
        started = time.monotonic()
        with NameServerClient(node.addr, tls=client_tls(certs)) as good:
            while time.monotonic() - started < timeout_ms / 1000 / 2:
                assert good.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == 0
        for s in stalled:
            s.settimeout(10)
            try:
                while s.recv(65536):  # the ServerHello, for the complete ClientHello
                    pass
            except ConnectionResetError:
                pass
            s.close()
        elapsed = time.monotonic() - started
        assert timeout_ms / 1000 * 0.9 <= elapsed < 10
        assert len(warnings(caplog, "namesrv.handshake", f"not finished within {timeout_ms} ms")) == 4
        assert served(node.addr, tls=client_tls(certs))


def test_admin_and_simulate_speak_tls(tmp_path, certs):
    props = node_tls(
        certs,
        **{
            "tls.server.mode": "enforcing",
            "tls.server.need.client.auth": "require",
            "tls.server.trustCertPath": str(certs.ca),
        },
    )
    tls_args = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key)]
    with running_node(tmp_path, **props) as node:
        run = dict(capture_output=True, text=True, timeout=60, cwd=REPO)
        done = subprocess.run([*NAMESRV, "admin", "-n", node.addr, *tls_args, "--json", "clusterList"], **run)
        assert done.returncode == 0 and json.loads(done.stdout) == [], done.stderr
        plain = subprocess.run([*NAMESRV, "admin", "-n", node.addr, "clusterList"], **run)
        assert plain.returncode == 1 and "it requires TLS (tls.server.mode=enforcing): pass --tls" in plain.stderr
        no_cert = subprocess.run([*NAMESRV, "admin", "-n", node.addr, *tls_args[:2], "clusterList"], **run)
        assert no_cert.returncode == 1 and "it refused our certificate" in no_cert.stderr, no_cert.stderr
        sim = subprocess.run(
            [
                *NAMESRV,
                "simulate",
                "-n",
                node.addr,
                *tls_args,
                "--duration",
                "1",
                "--summary-interval",
                "0.5",
                "--json",
            ],
            **run,
        )
        assert sim.returncode == 0, sim.stderr
        assert json.loads(sim.stdout)["registrations"] == 1


def test_admin_says_why_a_node_closed_the_connection_without_a_word(tmp_path, certs):
    run = dict(capture_output=True, text=True, timeout=60, cwd=REPO)

    def admin_says(addr: str, *args: str) -> str:
        done = subprocess.run([*NAMESRV, "admin", "-n", addr, *args, "clusterList"], **run)
        assert done.returncode == 1, done.stdout
        return done.stderr

    proxy = "as a node with proxyProtocolMode=required does: connect through the proxy in front of it"
    with running_node(tmp_path / "proxy", proxyProtocolMode="required", **node_tls(certs)) as node:
        for args in ([], ["--tls-ca", str(certs.ca)]):
            said = admin_says(node.addr, *args)
            assert proxy in said and "pass --tls" not in said, said
    with running_node(tmp_path / "plain") as node:
        said = admin_says(node.addr, "--tls-insecure")
        assert "it serves plaintext only (no tls.server.certPath on the node): leave out the --tls options" in said


def test_start_up_says_that_tls_and_the_proxy_protocol_are_on(tmp_path, certs, caplog):
    caplog.set_level(logging.WARNING, "namesrv.server")
    props = {
        "tls.server.mode": "enforcing",
        "tls.server.need.client.auth": "require",
        "tls.server.trustCertPath": str(certs.ca),
    }
    with running_node(tmp_path, proxyProtocolMode="required", **node_tls(certs, **props)) as node:
        addr = node.addr
    (line,) = warnings(caplog, "namesrv.server", f"remoting port {addr}: ")
    assert line.endswith(
        f"TLS on (tls.server.mode=enforcing, tls.server.need.client.auth=require, certificate {certs.server_cert});"
        " proxyProtocolMode=required"
    )


def test_client_key_password_comes_from_the_environment(tmp_path, certs):
    with running_node(tmp_path, **node_tls(certs)) as node:
        args = [*NAMESRV, "admin", "-n", node.addr, "--tls-ca", str(certs.ca), "--tls-cert", str(certs.server_cert)]
        args += ["--tls-key", str(certs.server_key_encrypted), "clusterList"]
        run = dict(capture_output=True, text=True, timeout=60, cwd=REPO)
        missing = subprocess.run(args, **run)
        assert missing.returncode == 2 and "is encrypted" in missing.stderr
        env = {**os.environ, "KEY_PW": KEY_PASSWORD}
        ok = subprocess.run([*args[:-1], "--tls-key-password-env", "KEY_PW", "clusterList"], env=env, **run)
        assert ok.returncode == 0, ok.stderr


# --- PROXY protocol ----------------------------------------------------------------------------


def peers(node) -> set[str]:
    return node.call(lambda: {c.peer for c in node.running.server.connections})


def unregistered_from(caplog, peer: str, broker_addr: str) -> bool:
    """The node's log of a closed connection: who it was, and the brokers registered on it."""
    return any(
        r.name == "namesrv.server" and f"from {peer}: unregistering ['{broker_addr}']" in r.getMessage()
        for r in caplog.records
    )


def test_proxy_v1_and_v2_put_the_clients_real_address_in_the_tables_and_the_logs(tmp_path, caplog):
    caplog.set_level(logging.INFO, "namesrv.server")
    with running_node(tmp_path, proxyProtocolMode="required") as node:
        with NameServerClient(node.addr, preamble=proxy_v1("203.0.113.7", 5555)) as v1:
            register_broker(v1, broker_addr="127.0.0.1:10911", topics=["T1"])
            assert "203.0.113.7:5555" in peers(node)
        # the broker's connection in the route tables is the client's, not the proxy's
        wait_until(lambda: unregistered_from(caplog, "203.0.113.7:5555", "127.0.0.1:10911"), 5, "the close")
        v6 = bytes.fromhex("20010db8000000000000000000000007")
        with NameServerClient(node.addr, preamble=proxy_v2_inet6(v6, 443)) as v2:
            register_broker(v2, broker_addr="127.0.0.1:10921", broker_name="broker-b", topics=["T2"])
            assert "2001:db8::7:443" in peers(node)
        wait_until(lambda: unregistered_from(caplog, "2001:db8::7:443", "127.0.0.1:10921"), 5, "the close")
        # what the node logs about a connection it drops names the client too
        assert closed_without_answer(node.addr, b"\x00\x00\x00\x01garbage", preamble=proxy_v1("198.51.100.9", 4242))
        wait_until(lambda: warnings(caplog, "namesrv.server", "closing connection from 198.51.100.9:4242"), 5)


def test_tls_may_follow_a_proxy_preamble(tmp_path, certs):
    with running_node(tmp_path, proxyProtocolMode="required", **node_tls(certs)) as node:
        with NameServerClient(node.addr, tls=client_tls(certs), preamble=proxy_v1("192.0.2.1", 1234)) as c:
            assert c.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == 0
            assert "192.0.2.1:1234" in peers(node)


def test_a_malformed_or_missing_preamble_closes_only_that_connection(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "namesrv.handshake")
    with running_node(tmp_path, proxyProtocolMode="required") as node:
        with NameServerClient(node.addr, preamble=proxy_v1("203.0.113.7", 5555)) as healthy:
            assert healthy.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == 0
            bad = [
                b"PROXY TCP4 203.0.113.7 10.0.0.1 99999 9876\r\n",  # port out of range
                b"PROXY TCP4 " + b"1" * 200,  # longer than 107 bytes, no CRLF
                b"\r\n\r\n\x00\r\nQUIT\n\x21\x11\xff\xff",  # v2 announcing 65535 bytes
                GOOD,  # missing
            ]
            for data in bad:
                assert closed_without_answer(node.addr, data)
                assert healthy.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == 0
        found = [m for m in warnings(caplog, "namesrv.handshake", "closing connection from 127.0.0.1")]
        assert len(found) == len(bad)
        assert "no PROXY protocol preamble (proxyProtocolMode=required)" in found[-1]


def test_optional_proxy_mode_takes_connections_with_and_without_a_preamble(tmp_path):
    with running_node(tmp_path, proxyProtocolMode="optional") as node:
        assert served(node.addr)
        assert served(node.addr, preamble=b"PROXY UNKNOWN\r\n")
        with NameServerClient(node.addr, preamble=proxy_v1("203.0.113.8", 7)) as c:
            c.call(RequestCode.GET_BROKER_CLUSTER_INFO)
            assert "203.0.113.8:7" in peers(node)


def test_connections_in_set_up_are_bounded_and_the_node_stops_with_them_pending(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, "namesrv.handshake")
    monkeypatch.setattr(handshake, "MAX_PENDING", 5)
    with running_node(tmp_path, proxyProtocolMode="required") as node:
        host, port = node.addr.split(":")
        held = [socket.create_connection((host, int(port))) for _ in range(5)]
        wait_until(lambda: node.call(lambda: node.running.server._acceptor.pending) == 5, 5, "5 set-ups")
        assert closed_without_answer(node.addr, preamble=b"PROXY UNKNOWN\r\n")  # the sixth: closed at once
        assert warnings(caplog, "namesrv.handshake", "5 connections in set-up")
        held.pop().close()  # one leaves: room for one more
        wait_until(lambda: node.call(lambda: node.running.server._acceptor.pending) == 4, 5, "4 set-ups")
        assert served(node.addr, preamble=b"PROXY UNKNOWN\r\n")
    # the node stopped with 4 connections in set-up: each was closed
    for s in held:
        s.settimeout(5)
        assert s.recv(1) == b""
        s.close()


# --- keys that only start-up can judge -----------------------------------------------------------


@pytest.mark.parametrize(
    "key_password, message",
    [
        ("", "is encrypted: set tls.server.keyPassword"),
        ("wrong", "cannot be used .* or tls.server.keyPassword is wrong"),
    ],
)
def test_an_encrypted_key_without_its_password_stops_start_up_with_a_message(tmp_path, certs, key_password, message):
    props = {
        "tls.server.certPath": str(certs.server_cert),
        "tls.server.keyPath": str(certs.server_key_encrypted),
        "tls.server.keyPassword": key_password,
    }
    with pytest.raises(ConfigError, match=message):
        TransportSecurity.from_config(load_config(None, props))
    # and `namesrv start` says so and exits 2, never prompting for a password on the terminal
    args = [f"--set={k}={v}" for k, v in props.items()]
    done = subprocess.run(
        [*NAMESRV, "start", "--set=listenPort=0", f"--set=kvConfigPath={tmp_path / 'kv.json'}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2 and "bad configuration" in done.stderr and "tls.server.keyPath" in done.stderr


def test_a_certificate_that_does_not_match_its_key_stops_start_up(tmp_path, certs):
    props = {"tls.server.certPath": str(certs.server_cert), "tls.server.keyPath": str(certs.client_key)}
    with pytest.raises(ConfigError, match="not a matching pair"):
        TransportSecurity.from_config(load_config(None, props))
