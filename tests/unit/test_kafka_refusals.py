"""Why Kafka refused a client, without Kafka: kafka-python's lost-connection errors sorted into what to
fix, kept per bootstrap list (bounded, quiet, password masked), and the reply kafka-python 3.0.12 drops
when the broker hangs up right after it (tests/integration/test_auth_kafka.py meets real refusals)."""

from __future__ import annotations

import logging
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import errors
from kafka.net.transport import KafkaSSLTransport, KafkaTCPTransport

from common import kafka_clients
from common.kafka_refusals import (
    CONNECTION_LOGGER,
    Refusal,
    Refusals,
    install_refusal_tracking,
    last_refusal,
    refusal_of,
)
from common.kafka_security import MASK, KafkaSecurity
from common.logs import setup_logging
from common.retrying import retry_until_stopped
from tests.support.clock import Clock

PASSWORD = "node-pw-77"
SASL = KafkaSecurity.from_settings(
    {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "node-a", "sasl.password": PASSWORD}
)


def sasl_refused(message: str) -> errors.SaslAuthenticationFailedError:
    # as kafka/net/connection.py raises it from a SaslAuthenticate answer
    return errors.SaslAuthenticationFailedError(f"SaslAuthenticationFailedError: {message}")


def handshake_failed(cause: BaseException) -> errors.KafkaConnectionError:
    # as kafka/net/manager.py raises it, inside ``except``: the cause is its context and in its text
    wrapped = errors.KafkaConnectionError(f"Handshake failed: {cause}")
    wrapped.__context__ = cause
    return wrapped


def openssl(kind: type[ssl.SSLError], text: str, **attrs: object) -> ssl.SSLError:
    error = kind(1, text)
    for name, value in attrs.items():
        setattr(error, name, value)
    return error


class Conn:
    """What kafka-python passes as the first argument of "Connection lost": a connection with its config."""

    def __init__(self, client_id: str) -> None:
        self.config = {"client_id": client_id, "sasl_plain_password": PASSWORD}

    def __str__(self) -> str:
        return "<KafkaConnection node_id=bootstrap-0 (disconnected)>"


def lose(client_id: str, exc: BaseException) -> None:
    logging.getLogger(CONNECTION_LOGGER).error("%s: Connection lost: %s", Conn(client_id), exc)


@pytest.fixture
def kafka_levels() -> Iterator[dict[str, int]]:
    """The levels of kafka-python's loggers, restored afterwards; the test sets them."""
    names = ("kafka", CONNECTION_LOGGER)
    saved = {name: logging.getLogger(name).level for name in names}
    yield saved
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture
def tracking() -> Refusals:
    """Refusal tracking installed in this process, as the node's Kafka link and the job's driver install it."""
    return install_refusal_tracking()


@pytest.fixture
def quiet_node(kafka_levels) -> None:
    """kafka-python's loggers as the node's logging at INFO leaves them (see the next test)."""
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    logging.getLogger(CONNECTION_LOGGER).setLevel(logging.ERROR)


def test_the_node_silences_kafka_python_but_keeps_its_lost_connections_made(kafka_levels) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging("INFO")
        assert logging.getLogger("kafka").level == logging.CRITICAL
        assert logging.getLogger(CONNECTION_LOGGER).isEnabledFor(logging.ERROR)
        assert not logging.getLogger(CONNECTION_LOGGER).isEnabledFor(logging.WARNING)
        setup_logging("DEBUG")
        assert logging.getLogger(CONNECTION_LOGGER).level == logging.NOTSET
    finally:
        root.handlers[:], root.level = handlers, level


# --------------------------------------------------------------------------- what counts as a refusal


@pytest.mark.parametrize(
    ("exc", "kind", "reason"),
    [
        (
            sasl_refused("Authentication failed: Invalid username or password"),
            "login",
            "Authentication failed: Invalid username or password",
        ),
        (
            errors.UnsupportedSaslMechanismError(
                "Kafka broker does not support SCRAM-SHA-512 sasl mechanism. Enabled mechanisms: ['PLAIN']"
            ),
            "mechanism",
            "Kafka broker does not support SCRAM-SHA-512 sasl mechanism. Enabled mechanisms: ['PLAIN']",
        ),
        # the SaslHandshake's error code alone: the error's description
        (
            errors.UnsupportedSaslMechanismError(),
            "mechanism",
            "The broker does not support the requested SASL mechanism.",
        ),
        (
            handshake_failed(
                openssl(
                    ssl.SSLCertVerificationError,
                    "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer "
                    "certificate (_ssl.c:1006)",
                    verify_code=20,
                )
            ),
            "untrusted",
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate",
        ),
        (
            handshake_failed(
                openssl(
                    ssl.SSLCertVerificationError,
                    "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, certificate "
                    "is not valid for 'kafka-1'. (_ssl.c:1006)",
                    verify_code=62,
                )
            ),
            "hostname",
            "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: Hostname mismatch, certificate is not "
            "valid for 'kafka-1'.",
        ),
        # TLS 1.3: the broker's alert about our certificate comes with the first read, wrapped as an argument
        (
            errors.KafkaConnectionError(
                openssl(
                    ssl.SSLError,
                    "[SSL: SSLV3_ALERT_CERTIFICATE_UNKNOWN] sslv3 alert certificate unknown (_ssl.c:2580)",
                    reason="SSLV3_ALERT_CERTIFICATE_UNKNOWN",
                )
            ),
            "certificate",
            "[SSL: SSLV3_ALERT_CERTIFICATE_UNKNOWN] sslv3 alert certificate unknown",
        ),
        (
            errors.KafkaConnectionError(
                openssl(ssl.SSLError, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required")
            ),
            "certificate",
            "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required",
        ),
        (
            handshake_failed(
                openssl(
                    ssl.SSLEOFError,
                    "[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred in violation of protocol (_ssl.c:1006)",
                    reason="UNEXPECTED_EOF_WHILE_READING",
                )
            ),
            "handshake",
            "[SSL: UNEXPECTED_EOF_WHILE_READING] EOF occurred in violation of protocol",
        ),
        # a reset during the handshake: no OpenSSL error, but only a TLS transport shakes hands
        (
            handshake_failed(ConnectionResetError(104, "Connection reset by peer")),
            "handshake",
            "Handshake failed: [Errno 104] Connection reset by peer",
        ),
        # 0x15030300: a TLS alert record read as the length of a Kafka frame
        (
            errors.InvalidReceiveError("Invalid frame length: 352518912"),
            "tls",
            "a TLS alert record where a Kafka response belongs (Invalid frame length: 352518912)",
        ),
    ],
)
def test_refusals_are_sorted_by_what_to_fix(exc: BaseException, kind: str, reason: str) -> None:
    assert refusal_of(exc) == (kind, reason)


@pytest.mark.parametrize(
    "exc",
    [
        errors.KafkaConnectionError("socket disconnected"),  # a broker going away, or a listener hanging up
        errors.KafkaConnectionError(ConnectionRefusedError(111, "Connection refused")),
        errors.KafkaTimeoutError("Unable to bootstrap from ['h:1']"),
        errors.InvalidReceiveError("Invalid frame length: 2000000000"),
        errors.CorrelationIdError("No in-flight-request found for server response"),
        ValueError("anything else"),
    ],
)
def test_a_broker_that_is_down_or_hangs_up_is_no_refusal(exc: BaseException) -> None:
    assert refusal_of(exc) is None


def test_reasons_are_one_clipped_line() -> None:
    kind, reason = refusal_of(sasl_refused("Authentication\nfailed: " + "x" * 500)) or ("", "")
    assert kind == "login" and "\n" not in reason and len(reason) == 200 and reason.endswith("...")


# --------------------------------------------------------------------------- kept per bootstrap list


def test_the_last_refusal_is_kept_per_bootstrap_list_and_known_by_client_id() -> None:
    clock = Clock()
    refusals = Refusals(max_entries=2, clock=clock.seconds)
    refusals.client("admin-a", ["a:1", "a:2"])
    refusals.client("consumer-a", ["a:1", "a:2"])
    refusals.client("admin-b", ["b:1"])
    refusals.note("admin-a", sasl_refused("first"))
    clock.advance(seconds=1)
    at = clock.seconds()
    refusals.note("consumer-a", sasl_refused("second"))
    refusals.note("consumer-a", errors.KafkaConnectionError("socket disconnected"))  # no refusal: the last stays
    refusals.note("unknown-client", sasl_refused("not ours"))
    last = refusals.last(" a:1 , a:2 ,")  # the same list, as a setting may spell it
    assert last is not None and (last.kind, last.reason, last.at) == ("login", "second", at)
    assert refusals.last("a:1,a:2", since=at) is last
    assert refusals.last("a:1,a:2", since=at + 0.5) is None  # older than this episode
    assert refusals.last("b:1") is None and refusals.last("a:1") is None and refusals.last(",,") is None


def test_refusals_are_bounded() -> None:
    refusals = Refusals(max_entries=3)
    for i in range(50):
        refusals.client(f"c{i}", [f"h{i}:1"])
        refusals.note(f"c{i}", sasl_refused(str(i)))
    assert len(refusals._last) == 3 and len(refusals._servers) == 12
    assert refusals.last("h49:1") is not None and refusals.last("h0:1") is None


# --------------------------------------------------------------------------- read from kafka-python's log


def test_lost_connections_are_read_quietly_and_the_hint_says_why(tracking, quiet_node, caplog) -> None:
    servers = "refused-a:9092,refused-b:9092"
    # as the node's clients are built: this client id now means these servers
    kafka_clients._tracked(kafka_clients._config(servers, "k", True, None, {"client_id": "quiet-admin"}, SASL))
    started = time.monotonic()
    assert last_refusal(servers, since=started) is None  # nothing seen yet
    assert "; with security.protocol=SASL_PLAINTEXT" in SASL.failure_hint(last_refusal(servers, since=started))
    with caplog.at_level(logging.DEBUG, logger="namesrv"):
        lose("quiet-admin", errors.KafkaConnectionError("socket disconnected"))
        lose("quiet-admin", sasl_refused(f"Authentication failed: Invalid username or password {PASSWORD}"))
    assert not [r for r in caplog.records if r.name.startswith("kafka")]  # read, not shown
    hint = SASL.failure_hint(last_refusal(servers, since=started))
    assert hint == (
        f"; Kafka refused the login: 'Authentication failed: Invalid username or password {MASK}' "
        "(security.protocol=SASL_PLAINTEXT sasl.mechanism=PLAIN sasl.username='node-a'): "
        "check kafka.sasl.username and kafka.sasl.password (or kafka.sasl.jaas.config)"
    )
    assert PASSWORD not in hint
    assert last_refusal("elsewhere:9092") is None  # another list: the generic reminder
    assert "this is also what a broker looks like" in SASL.failure_hint()


def test_with_debug_logs_kafka_python_s_record_is_shown_too(tracking, kafka_levels, caplog) -> None:
    for name in kafka_levels:
        logging.getLogger(name).setLevel(logging.NOTSET)
    kafka_clients._tracked(kafka_clients._config("shown:9092", "k", True, None, {"client_id": "shown-admin"}, SASL))
    with caplog.at_level(logging.DEBUG):
        lose("shown-admin", sasl_refused("Authentication failed: Invalid username or password"))
    assert [r.name for r in caplog.records] == [CONNECTION_LOGGER]
    assert "refused the login" in SASL.failure_hint(last_refusal("shown:9092"))


@pytest.mark.parametrize(
    ("kind", "security", "said"),
    [
        ("mechanism", SASL, "Kafka refused the SASL mechanism: 'r' (security.protocol=SASL_PLAINTEXT"),
        ("untrusted", None, "set kafka.ssl.cafile to the CA that signed the broker's certificate"),
        ("hostname", None, "or set kafka.ssl.check.hostname=false"),
        ("certificate", None, "Kafka wants a client certificate: 'r' (security.protocol=SSL): set kafka.ssl.certfile"),
        ("handshake", None, "Kafka did not complete the TLS handshake: 'r'"),
        (
            "tls",
            KafkaSecurity(),
            "Kafka answers in TLS: 'r' (security.protocol=PLAINTEXT): set kafka.security.protocol",
        ),
    ],
)
def test_each_refusal_names_the_setting_to_fix(kind: str, security: KafkaSecurity | None, said: str) -> None:
    security = security or KafkaSecurity(protocol="SSL")
    assert said in security._refusal_hint(Refusal(kind, "r", 0.0), "kafka.")


def test_the_warning_asks_for_the_reason_only_when_it_is_written(caplog) -> None:
    stopping, calls, asked = threading.Event(), [], []

    def fails() -> None:
        calls.append(1)
        if len(calls) == 3:
            stopping.set()
        raise errors.KafkaTimeoutError("Unable to bootstrap")

    def problem() -> str:
        asked.append(len(calls))
        return "cannot read yet; Kafka refused the login"

    log = logging.getLogger("namesrv.test-retry")
    with caplog.at_level(logging.WARNING, logger=log.name):
        retry_until_stopped(fails, stopping, problem=problem, log=log, first_wait_s=0.001)
    assert [r.getMessage() for r in caplog.records] == [
        "cannot read yet; Kafka refused the login (KafkaTimeoutError: KafkaTimeoutError: Unable to bootstrap); "
        "retrying until it works"
    ]
    assert asked == [1]  # after the first failure, once: the debug lines are off


# --------------------------------------------------------------------------- the reply kafka-python drops


@pytest.fixture
def transport() -> Iterator[tuple[KafkaTCPTransport, socket.socket]]:
    install_refusal_tracking()
    install_refusal_tracking()  # once is enough: no second wrapper
    ours, broker = socket.socketpair()
    ours.setblocking(False)
    try:
        yield KafkaTCPTransport(None, ours), broker
    finally:
        ours.close()
        broker.close()


def test_a_reply_that_comes_with_the_close_is_handed_on_before_it(transport) -> None:
    conn, broker = transport
    for cls in (KafkaTCPTransport, KafkaSSLTransport):
        assert getattr(cls.__dict__["_sock_recv"], "_namesrv_keeps_last_reply", False)
        assert not getattr(cls.__dict__["_sock_recv"].__wrapped__, "_namesrv_keeps_last_reply", False)
    broker.sendall(b"\x00\x00\x00\x05refused")
    broker.close()  # the broker's answer and its close, read in one go
    assert conn._sock_recv() == (b"\x00\x00\x00\x05refused", None)
    data, err = conn._sock_recv()  # the close, at the next read
    assert data == b"" and isinstance(err, errors.KafkaConnectionError) and "socket disconnected" in str(err)


def test_reads_without_a_close_are_unchanged(transport) -> None:
    conn, broker = transport
    assert conn._sock_recv() == (b"", None)  # nothing yet
    broker.sendall(b"abc")
    assert conn._sock_recv() == (b"abc", None)
    broker.close()
    data, err = conn._sock_recv()
    assert data == b"" and isinstance(err, errors.KafkaConnectionError)


# --------------------------------------------------------------------------- nothing until installed

UNTOUCHED = """
import logging
from common import kafka_clients, kafka_refusals, kafka_security
from kafka.net.transport import KafkaSSLTransport, KafkaTCPTransport

def state():
    filters = [len(logging.getLogger(name).filters) for name in (kafka_refusals.CONNECTION_LOGGER, kafka_clients.SELECTOR_LOGGER)]
    wrapped = [getattr(c.__dict__["_sock_recv"], "_namesrv_keeps_last_reply", False) for c in (KafkaTCPTransport, KafkaSSLTransport)]
    return filters, wrapped

security = kafka_security.KafkaSecurity.from_settings({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u", "sasl.password": "p"})
kafka_clients.producer("127.0.0.1:1", pinned=True, security=security, client_id="c", max_block_ms=100).close(0)
assert state() == ([0, 0], [False, False]), state()
assert kafka_refusals._installed is None and kafka_refusals.last_refusal("127.0.0.1:1") is None
for _ in range(2):
    kafka_refusals.install_refusal_tracking()
    kafka_clients.demote_slow_step_warnings()
assert state() == ([1, 1], [True, True]), state()
"""


def test_importing_and_building_clients_change_nothing_until_the_tracking_is_installed() -> None:
    # a fresh interpreter: this one's tests have installed it; installing twice installs once
    subprocess.run([sys.executable, "-c", UNTOUCHED], check=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
