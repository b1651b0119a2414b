"""Why Kafka refused a client: a broker's own reason, kept per bootstrap list, once installed.

A broker that refuses the credentials, the mechanism or the certificate looks to a client like one that is
down; the reason is in one record, kafka-python's ERROR "Connection lost" on :data:`CONNECTION_LOGGER`.
:func:`install_refusal_tracking` puts a filter on that logger that reads those records into a bounded
registry (:class:`Refusals`, keyed by the bootstrap list of the client that met them), and makes kafka-python
hand on the reply a broker sends just before it hangs up, which it would otherwise drop.  Nothing happens at
import: whoever wants the reasons installs this, once per process (the node's Kafka link and the job's
driver do, as they start), and asks :func:`last_refusal`; :meth:`common.kafka_security.KafkaSecurity.failure_hint`
words the answer.  ``docs/internals/kafka-clients.md`` has the details.
"""

from __future__ import annotations

import functools
import logging
import re
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONNECTION_LOGGER",
    "MAX_REMEMBERED",
    "Refusal",
    "Refusals",
    "install_refusal_tracking",
    "last_refusal",
    "refusal_of",
    "track_client",
]

#: kafka-python's logger of connections (kafka/net/connection.py): ERROR "<conn>: Connection lost: <exc>"
CONNECTION_LOGGER = "kafka.net.connection"
#: bootstrap lists whose last refusal is kept (and four times as many client ids)
MAX_REMEMBERED = 64
_MAX_REASON_CHARS = 200
#: OpenSSL's names of the alerts a peer sends when it does not accept our certificate (or wants one)
_CERTIFICATE_ALERT = re.compile(r"ALERT_(?:BAD_CERTIFICATE|CERTIFICATE_\w+|UNKNOWN_CA|UNSUPPORTED_CERTIFICATE)")
#: X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
_NAME_MISMATCH = (62, 64)
#: kafka-python's complaint about a frame's length (kafka/protocol/parser.py)
_FRAME_LENGTH = re.compile(r"Invalid frame length: (-?\d+)")


@dataclass(frozen=True)
class Refusal:
    """Why a broker refused a client: its ``kind`` (see :func:`refusal_of`), the ``reason`` in its own words."""

    kind: str
    reason: str
    #: when it was seen (time.monotonic)
    at: float


def _clip(text: str) -> str:
    """One line of at most ``_MAX_REASON_CHARS``, without OpenSSL's source position."""
    text = re.sub(r"\s*\(_ssl\.c:\d+\)", "", " ".join(text.split()))
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 3] + "..."


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, what it wraps (as an argument) and its chain, nearest first, at most 8."""
    out: list[BaseException] = []
    todo = [exc]
    while todo and len(out) < 8:
        e = todo.pop(0)
        if any(e is seen for seen in out):
            continue
        out.append(e)
        todo += [a for a in e.args if isinstance(a, BaseException)]
        todo += [c for c in (e.__cause__, e.__context__) if c is not None]
    return out


def _words(e: BaseException) -> str:
    """A kafka-python error's message without the class name its ``str`` puts first."""
    text = str(e.args[0]) if e.args else str(getattr(e, "description", "") or type(e).__name__)
    return text.removeprefix(f"{type(e).__name__}: ")


def refusal_of(exc: BaseException) -> tuple[str, str] | None:
    """``(kind, reason)`` if ``exc``, a lost connection's error as kafka-python logs it, is a refusal; else None.

    Kinds: ``login`` (SASL credentials refused), ``mechanism`` (SASL mechanism not enabled),
    ``untrusted`` and ``hostname`` (the broker's certificate failed this client's checks),
    ``certificate`` (the broker's alert about this client's certificate), ``handshake`` (another
    failed TLS handshake: a listener that is not TLS), ``tls`` (a plaintext client answered in TLS).
    """
    from kafka import errors

    if isinstance(exc, errors.SaslAuthenticationFailedError):
        return "login", _clip(_words(exc))
    if isinstance(exc, errors.UnsupportedSaslMechanismError):
        return "mechanism", _clip(_words(exc))
    tls_error = next((e for e in _causes(exc) if isinstance(e, ssl.SSLError)), None)
    if isinstance(tls_error, ssl.SSLCertVerificationError):
        mismatch = getattr(tls_error, "verify_code", None) in _NAME_MISMATCH
        return ("hostname" if mismatch else "untrusted"), _clip(str(tls_error))
    if tls_error is not None:  # OpenSSL names an alert in ``reason`` and in the text
        alert = _CERTIFICATE_ALERT.search(str(getattr(tls_error, "reason", None) or tls_error))
        return ("certificate" if alert else "handshake"), _clip(str(tls_error))
    if isinstance(exc, errors.KafkaConnectionError) and _words(exc).startswith("Handshake failed"):
        return "handshake", _clip(_words(exc))  # only TLS transports shake hands; an OSError cut it short
    if isinstance(exc, errors.InvalidReceiveError):
        match = _FRAME_LENGTH.search(_words(exc))
        head = int(match.group(1)).to_bytes(4, "big", signed=True) if match else b""
        if head[:1] in (b"\x15", b"\x16") and head[1:2] == b"\x03":  # a TLS alert / handshake record, version 3.x
            record = "alert" if head[0] == 0x15 else "handshake"
            return "tls", _clip(f"a TLS {record} record where a Kafka response belongs ({_words(exc)})")
    return None


class Refusals:
    """The last refusal per bootstrap list, and the bootstrap list of each client id; both bounded.

    The one that :func:`install_refusal_tracking` installs is fed by kafka-python's log; on its own (a
    test's), by whoever calls :meth:`client` and :meth:`note`.
    """

    def __init__(self, max_entries: int = MAX_REMEMBERED, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.clock = clock
        self._lock = threading.Lock()
        self._servers: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._last: OrderedDict[tuple[str, ...], Refusal] = OrderedDict()

    @staticmethod
    def _put(table: OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> None:
        table.pop(key, None)
        table[key] = value
        while len(table) > limit:
            table.popitem(last=False)

    def client(self, client_id: str, servers: Sequence[str]) -> None:
        """A client ``client_id`` of bootstrap list ``servers`` is being built."""
        with self._lock:
            self._put(self._servers, client_id, _key(servers), 4 * self.max_entries)

    def note(self, client_id: str, exc: BaseException) -> None:
        """A connection of client ``client_id`` was lost with ``exc``: kept if it is a refusal."""
        with self._lock:
            servers = self._servers.get(client_id)
        found = refusal_of(exc) if servers is not None else None
        if found is not None:
            with self._lock:
                self._put(self._last, servers, Refusal(*found, at=self.clock()), self.max_entries)

    def last(self, servers: str | Sequence[str], since: float | None = None) -> Refusal | None:
        """The last refusal met by a client of ``servers``, if seen at or after ``since``."""
        key = _key(servers)
        with self._lock:
            refusal = self._last.get(key)
        return refusal if refusal is not None and (since is None or refusal.at >= since) else None


def _key(servers: str | Sequence[str]) -> tuple[str, ...]:
    """A bootstrap list as the registry knows it: its entries stripped, empty ones dropped."""
    raw = servers.split(",") if isinstance(servers, str) else list(servers)
    return tuple(entry.strip() for entry in raw if entry.strip())


class _RefusalLog(logging.Filter):
    """Reads kafka-python's "Connection lost" records into a :class:`Refusals`; passes on a record
    only if ``parent`` (the ``kafka`` logger) is enabled for its level."""

    def __init__(self, refusals: Refusals, parent: logging.Logger) -> None:
        super().__init__()
        self.refusals = refusals
        self.parent = parent

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.levelno >= logging.ERROR and isinstance(args, tuple) and len(args) == 2:
            conn, exc = args
            config = getattr(conn, "config", None)
            client_id = config.get("client_id") if isinstance(config, dict) else None
            if isinstance(exc, BaseException) and isinstance(client_id, str):
                try:
                    self.refusals.note(client_id, exc)
                except Exception:  # a record misread must not break kafka-python's logging
                    pass
        # the node keeps this logger at ERROR while kafka's is silenced (common.logs): kafka's level decides
        return self.parent.isEnabledFor(record.levelno)


# --------------------------------------------------------------------------- the reply kafka-python drops


def _keeps_last_reply(original: Callable[[Any], tuple[bytes, Any]]) -> Callable[[Any], tuple[bytes, Any]]:
    @functools.wraps(original)
    def _sock_recv(transport: Any) -> tuple[bytes, Any]:
        pending = transport.__dict__.pop("_namesrv_error_after_data", None)
        if pending is not None:
            return b"", pending
        data, err = original(transport)
        if data and err is not None:  # kafka-python would drop the data (a broker's last answer) with the error
            transport._namesrv_error_after_data = err
            return data, None
        return data, err

    _sock_recv._namesrv_keeps_last_reply = True  # type: ignore[attr-defined]
    return _sock_recv


def _keep_last_reply() -> None:
    """Make kafka-python's transports hand on the bytes read with a close before the close: a broker refusing
    a SASL login sends its answer and hangs up at once, and kafka-python 3.0.12 dropped that answer with the
    close (``_read_from_sock`` in kafka/net/transport.py).  The error comes with the next read."""
    from kafka.net import transport

    for cls in (transport.KafkaTCPTransport, transport.KafkaSSLTransport):
        original = cls.__dict__.get("_sock_recv")
        if original is not None and not getattr(original, "_namesrv_keeps_last_reply", False):
            cls._sock_recv = _keeps_last_reply(original)


# --------------------------------------------------------------------------- installed once per process

#: the registry installed in this process (kafka-python's loggers and transports are the process's): None
#: until :func:`install_refusal_tracking`
_installed: Refusals | None = None
_install_lock = threading.Lock()


def install_refusal_tracking() -> Refusals:
    """Track why Kafka refuses this process's clients, from now on; the registry (the same at every call).

    Puts the filter on :data:`CONNECTION_LOGGER` (the logger itself, which makes the records, so that they
    are read whether or not they are shown) and wraps kafka-python's transports once.  Imports kafka-python.
    """
    global _installed
    with _install_lock:
        if _installed is None:
            refusals = Refusals()
            logging.getLogger(CONNECTION_LOGGER).addFilter(_RefusalLog(refusals, logging.getLogger("kafka")))
            _keep_last_reply()
            _installed = refusals
        return _installed


def track_client(client_id: str, servers: Sequence[str]) -> None:
    """A client ``client_id`` of bootstrap list ``servers`` is being built: its refusals will be known by
    ``servers``.  Nothing until tracking is installed."""
    if _installed is not None:
        _installed.client(client_id, servers)


def last_refusal(servers: str | Sequence[str], since: float | None = None) -> Refusal | None:
    """The last refusal met by a client of ``servers`` built with a ``client_id``, if seen at or after ``since``
    (a :func:`time.monotonic` time); None too while tracking is not installed."""
    return None if _installed is None else _installed.last(servers, since)
