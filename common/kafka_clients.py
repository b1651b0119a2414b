"""Every Kafka client the project builds (producers, consumers, admin clients), from settings.

Callers pass what is theirs to decide (acks, batching, client id, offsets policy) as kafka-python
keyword arguments; this module adds what every client shares, so that it is decided once: the
checked bootstrap list (:func:`bootstrap_list`), a pinned protocol level so that a client can be
built with no broker up (:data:`API_VERSION`), request timeouts, and TLS and SASL settings
(:class:`KafkaSecurity`), checked whole before any client is built and never shown with a password.
A broker that refuses a login or a certificate looks down to a client, so :class:`_RefusalLog`
keeps the broker's or OpenSSL's reason (:func:`refusal_of`, :func:`last_refusal`) for
:meth:`KafkaSecurity.failure_hint` to quote.  Two kafka-python behaviours are worked around: a
wall-clock "blocking the event loop" warning (:class:`_SlowStepFilter`) and a refusal's last reply
dropped on close (:func:`_keep_last_reply`).  kafka-python is imported only when a client is built.
``docs/internals/kafka-clients.md`` has the details and the reasons.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.options import BOOLEAN_EXPECTED, ConfigError, Converter, parse_bool, resolve_secret

if TYPE_CHECKING:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

__all__ = [
    "API_VERSION",
    "BOOTSTRAP",
    "CONNECTION_LOGGER",
    "Refusal",
    "KafkaSecurity",
    "SECURITY_KEYS",
    "SECRET_KEYS",
    "SECURITY_PROTOCOLS",
    "SASL_MECHANISMS",
    "bootstrap_list",
    "refusal_of",
    "last_refusal",
    "producer",
    "consumer",
    "admin",
]

#: the newest protocol level pinned clients ask for; brokers that know less negotiate down per connection
API_VERSION = (3, 3)
#: the logger of kafka-python 3's I/O loop (kafka/net/selector.py)
SELECTOR_LOGGER = "kafka.net.selector"


class _SlowStepFilter(logging.Filter):
    """Turns kafka-python's wall-clock "Task ... ran for ... blocking the event loop" warning into DEBUG."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.logger = logger

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and "blocking the event loop" in record.getMessage():
            # the logger let it through as a WARNING: pass it on only where DEBUG is wanted, as DEBUG
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.logger.isEnabledFor(logging.DEBUG)
        return True


# on the logger itself (its own records pass through it), in every process that builds a client
_selector_log = logging.getLogger(SELECTOR_LOGGER)
_selector_log.addFilter(_SlowStepFilter(_selector_log))
_BOOTSTRAP_EXPECTED = "host:port[,host:port...] list"


def _entries(servers: str | Sequence[str]) -> list[str]:
    """The entries of a bootstrap list; ``ValueError`` naming the first bad one."""
    raw = servers.split(",") if isinstance(servers, str) else list(servers)
    entries = [entry.strip() for entry in raw if entry.strip()]
    if not entries:
        raise ValueError("names no server")
    for entry in entries:
        host, sep, port = entry.rpartition(":")
        if sep and (not host or not port.isdigit() or not 0 < int(port) < 65536):
            raise ValueError(f"bad entry {entry!r}")
    return entries


def bootstrap_list(servers: str | Sequence[str], key: str) -> list[str]:
    """The entries of ``servers``, stripped, empties dropped; :class:`ConfigError` naming ``key`` if unusable."""
    try:
        return _entries(servers)
    except ValueError as exc:
        shown = servers if isinstance(servers, str) else ",".join(servers)
        raise ConfigError(f"{key}={shown!r} is not a valid {_BOOTSTRAP_EXPECTED}: {exc}") from None


#: for option tables: the list, checked and normalised to ``host:port,host:port``
BOOTSTRAP: Converter[str] = Converter(lambda raw: ",".join(_entries(raw)), _BOOTSTRAP_EXPECTED)


# --------------------------------------------------------------------------- security

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: the settings, in the Kafka client's spelling (the node and the job prefix them with ``kafka.``)
SECURITY_KEYS = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.jaas.config",
    "sasl.username",
    "sasl.password",
    "ssl.cafile",
    "ssl.certfile",
    "ssl.keyfile",
    "ssl.password",
    "ssl.check.hostname",
)
#: settings whose value is (or holds) a secret: never shown, logged or echoed in an error
SECRET_KEYS = frozenset({"sasl.jaas.config", "sasl.password", "ssl.password"})
#: what every value shown in place of a secret looks like
MASK = "******"
_MAX_VALUE_CHARS = 4096
#: the login module Java's clients name in ``sasl.jaas.config`` for each mechanism
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_JAAS = re.compile(r"\s*(\S+)\s+required\b(.*?);?\s*", re.DOTALL)
_JAAS_OPTION = re.compile(r'\s*([A-Za-z_][\w.]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _jaas_credentials(text: str, mechanism: str) -> tuple[str, str]:
    """Username and password of a ``sasl.jaas.config`` line; ``ValueError`` (without the secret) if unusable."""
    match = _JAAS.fullmatch(text)
    if match is None:
        raise ValueError('is not "<LoginModule> required username="..." password="...";"')
    module, rest = match.group(1), match.group(2)
    if module != _LOGIN_MODULES[mechanism]:
        raise ValueError(
            f"names login module {module[:200]!r}; sasl.mechanism={mechanism} needs {_LOGIN_MODULES[mechanism]}"
        )
    found: dict[str, str] = {}
    pos = 0
    while pos < len(rest.rstrip()):
        option = _JAAS_OPTION.match(rest, pos)
        if option is None:
            raise ValueError('has an option that is not name="value"')
        found[option.group(1)] = re.sub(r"\\(.)", r"\1", option.group(2))
        pos = option.end()
    if not found.get("username") or not found.get("password"):
        raise ValueError('lacks username="..." or password="..."')
    return found["username"], found["password"]


_PEM_KEY = re.compile(r"-----BEGIN ([A-Z0-9 ]*?) ?PRIVATE KEY-----")


def _java_key_problem(path: str, *, has_password: bool, prefix: str) -> str | None:
    """Why the Java client's PEM key store (Spark's Kafka connector) cannot use the key in ``path``; None if it can.

    Java takes the certificate and its key from one file, the key in PKCS#8: encrypted with
    ``ssl.key.password`` (our ``ssl.password``), or plain without a password.
    """
    try:
        with open(path, encoding="ascii", errors="replace") as pem:
            kinds = _PEM_KEY.findall(pem.read(1 << 20))
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not kinds:
        return (
            "holds no private key: Spark's Kafka connector reads the client certificate and its key from this "
            "one PEM file; append the key to it"
        )
    if kinds[0] not in ("", "ENCRYPTED"):
        return (
            f"holds a {kinds[0]} PRIVATE KEY, and Java reads PKCS#8 keys only: convert it with "
            "`openssl pkcs8 -topk8 -nocrypt` (or encrypt it with a password, ssl.password)"
        )
    if kinds[0] == "ENCRYPTED" and not has_password:
        return f"holds an encrypted key, and {prefix}ssl.password is not set"
    if kinds[0] == "" and has_password:
        return f"holds a key without a password, and Java refuses it with {prefix}ssl.password set: remove the password"
    return None


def _jaas_quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True)
class KafkaSecurity:
    """How clients reach Kafka: TLS, SASL and their files; the default is plaintext without credentials.

    Build it with :meth:`from_settings`, which checks everything; the fields hold resolved secrets,
    which ``repr`` leaves out.
    """

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    @classmethod
    def from_settings(cls, values: Mapping[str, str], *, prefix: str = "", source: str = "kafka") -> KafkaSecurity:
        """The settings :data:`SECURITY_KEYS` (each after ``prefix``) of ``values``; empty means unset.

        Raises :class:`ConfigError` naming the first key that cannot work, and never its secret.
        """
        raw: dict[str, str] = {}
        for name in SECURITY_KEYS:
            value = values.get(prefix + name)
            if value is None or not str(value).strip():
                continue
            value = str(value)
            if len(value) > _MAX_VALUE_CHARS:
                raise ConfigError(f"{source}: {prefix}{name} has {len(value)} characters, more than {_MAX_VALUE_CHARS}")
            raw[name] = resolve_secret(value, prefix + name, source) if name in SECRET_KEYS else value.strip()

        def fail(name: str, problem: str) -> ConfigError:
            shown = "" if name in SECRET_KEYS or name not in raw else f"={raw[name]!r}"
            return ConfigError(f"{source}: {prefix}{name}{shown} {problem}")

        protocol = raw.get("security.protocol", "PLAINTEXT").upper()
        if protocol not in SECURITY_PROTOCOLS:
            raise fail("security.protocol", f"is not one of {', '.join(SECURITY_PROTOCOLS)}")
        check_hostname = True
        if "ssl.check.hostname" in raw:
            try:
                check_hostname = parse_bool(raw["ssl.check.hostname"])
            except ValueError:
                raise fail("ssl.check.hostname", f"is not a valid {BOOLEAN_EXPECTED}") from None

        sasl_keys = [k for k in ("sasl.mechanism", "sasl.jaas.config", "sasl.username", "sasl.password") if k in raw]
        ssl_keys = [
            k for k in ("ssl.cafile", "ssl.certfile", "ssl.keyfile", "ssl.password", "ssl.check.hostname") if k in raw
        ]
        if sasl_keys and not protocol.startswith("SASL_"):
            raise fail(
                sasl_keys[0],
                f"is set but {prefix}security.protocol={protocol} would ignore it: set SASL_PLAINTEXT or SASL_SSL, or remove it",
            )
        if ssl_keys and not protocol.endswith("SSL"):
            raise fail(
                ssl_keys[0],
                f"is set but {prefix}security.protocol={protocol} would ignore it: set SSL or SASL_SSL, or remove it",
            )

        mechanism = username = password = None
        if protocol.startswith("SASL_"):
            mechanism = raw.get("sasl.mechanism", "PLAIN").upper()
            if mechanism not in SASL_MECHANISMS:
                raise fail("sasl.mechanism", f"is not one of {', '.join(SASL_MECHANISMS)}")
            if "sasl.jaas.config" in raw:
                if "sasl.username" in raw or "sasl.password" in raw:
                    raise fail(
                        "sasl.jaas.config", f"and {prefix}sasl.username/{prefix}sasl.password are both set: keep one"
                    )
                try:
                    username, password = _jaas_credentials(raw["sasl.jaas.config"], mechanism)
                except ValueError as exc:
                    raise fail("sasl.jaas.config", str(exc)) from None
            else:
                username, password = raw.get("sasl.username"), raw.get("sasl.password")
                if not username or not password:
                    missing = "sasl.username" if not username else "sasl.password"
                    raise ConfigError(
                        f"{source}: {prefix}security.protocol={protocol} needs credentials: set {prefix}sasl.username "
                        f"and {prefix}sasl.password (or {prefix}sasl.jaas.config); {prefix}{missing} is missing"
                    )

        files: dict[str, str | None] = {}
        for name in ("ssl.cafile", "ssl.certfile", "ssl.keyfile"):
            path = raw.get(name)
            if path is not None and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise fail(name, "is not a readable file")
            files[name] = path
        if files["ssl.keyfile"] and not files["ssl.certfile"]:
            raise fail("ssl.keyfile", f"needs {prefix}ssl.certfile, the certificate it belongs to")
        if "ssl.password" in raw and not (files["ssl.keyfile"] or files["ssl.certfile"]):
            raise fail(
                "ssl.password",
                f"is the password of a key, but neither {prefix}ssl.keyfile nor {prefix}ssl.certfile is set",
            )
        return cls(
            protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=username,
            sasl_password=password,
            ssl_cafile=files["ssl.cafile"],
            ssl_certfile=files["ssl.certfile"],
            ssl_keyfile=files["ssl.keyfile"],
            ssl_password=raw.get("ssl.password"),
            ssl_check_hostname=check_hostname,
        )

    def client_config(self) -> dict[str, Any]:
        """kafka-python keyword arguments; empty for plaintext, so such clients are built as before."""
        out: dict[str, Any] = {}
        if self.protocol == "PLAINTEXT":
            return out
        out["security_protocol"] = self.protocol
        if self.sasl:
            out["sasl_mechanism"] = self.sasl_mechanism
            out["sasl_plain_username"] = self.sasl_username
            out["sasl_plain_password"] = self.sasl_password
        if self.tls:
            out["ssl_check_hostname"] = self.ssl_check_hostname
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password"):
                if getattr(self, name) is not None:
                    out[name] = getattr(self, name)
        return out

    def spark_options(self, prefix: str = "kafka.") -> dict[str, str]:
        """Options of Spark's own Kafka connector (Java client names, PEM files); empty for plaintext.

        Java reads a client certificate and its key from one PEM key store, so ``ssl.keyfile``, if
        set, must be the same file as ``ssl.certfile`` (:class:`ConfigError` otherwise).
        """
        out: dict[str, str] = {}
        if self.protocol == "PLAINTEXT":
            return out
        out[prefix + "security.protocol"] = self.protocol
        if self.sasl:
            assert self.sasl_mechanism and self.sasl_username is not None and self.sasl_password is not None
            out[prefix + "sasl.mechanism"] = self.sasl_mechanism
            out[prefix + "sasl.jaas.config"] = (
                f'{_LOGIN_MODULES[self.sasl_mechanism]} required username="{_jaas_quote(self.sasl_username)}" '
                f'password="{_jaas_quote(self.sasl_password)}";'
            )
        if self.tls:
            if self.ssl_cafile:
                out[prefix + "ssl.truststore.type"] = "PEM"
                out[prefix + "ssl.truststore.location"] = self.ssl_cafile
            if self.ssl_certfile:
                if self.ssl_keyfile and os.path.realpath(self.ssl_keyfile) != os.path.realpath(self.ssl_certfile):
                    raise ConfigError(
                        f"{prefix}ssl.keyfile: Spark's Kafka connector reads the client certificate and its key from one "
                        f"PEM file; put both in {prefix}ssl.certfile and drop {prefix}ssl.keyfile"
                    )
                problem = _java_key_problem(
                    self.ssl_certfile, has_password=self.ssl_password is not None, prefix=prefix
                )
                if problem:
                    raise ConfigError(f"{prefix}ssl.certfile={self.ssl_certfile!r} {problem}")
                out[prefix + "ssl.keystore.type"] = "PEM"
                out[prefix + "ssl.keystore.location"] = self.ssl_certfile
                if self.ssl_password is not None:
                    out[prefix + "ssl.key.password"] = self.ssl_password
            if not self.ssl_check_hostname:
                out[prefix + "ssl.endpoint.identification.algorithm"] = ""
        return out

    def settings(self, prefix: str = "kafka.") -> dict[str, str]:
        """The resolved settings in :data:`SECURITY_KEYS` spelling (what :meth:`from_settings` reads back)."""
        out: dict[str, str] = {}
        if self.protocol == "PLAINTEXT":
            return out
        out[prefix + "security.protocol"] = self.protocol
        pairs = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.cafile": self.ssl_cafile,
            "ssl.certfile": self.ssl_certfile,
            "ssl.keyfile": self.ssl_keyfile,
            "ssl.password": self.ssl_password,
        }
        out.update({prefix + k: v for k, v in pairs.items() if v is not None})
        if self.tls:
            out[prefix + "ssl.check.hostname"] = "true" if self.ssl_check_hostname else "false"
        return out

    def describe(self) -> str:
        """For logs and messages: protocol, mechanism, user and files, never a secret."""
        parts = [f"security.protocol={self.protocol}"]
        if self.sasl:
            parts += [f"sasl.mechanism={self.sasl_mechanism}", f"sasl.username={self.sasl_username!r}"]
        if self.tls:
            parts += [
                f"{k}={v}" for k, v in (("ssl.cafile", self.ssl_cafile), ("ssl.certfile", self.ssl_certfile)) if v
            ]
            if not self.ssl_check_hostname:
                parts.append("ssl.check.hostname=false")
        return " ".join(parts)

    def failure_hint(
        self, servers: str | Sequence[str] | None = None, *, since: float | None = None, prefix: str = "kafka."
    ) -> str:
        """What to check when no broker completes a connection: a clause to append to a message.

        With ``servers``, the bootstrap list of the clients that failed: the last refusal one of them
        met (at or after ``since``, a :func:`time.monotonic` time, if given), quoted, and the setting
        (after ``prefix``) to fix.  Otherwise: nothing for plaintext, else a reminder that a refusal
        looks like a broker that is down.
        """
        refusal = _refusals.last(servers, since) if servers is not None else None
        if refusal is not None:
            return self._refusal_hint(refusal, prefix)
        if self.protocol == "PLAINTEXT":
            return ""
        return (
            f"; with {self.describe()} this is also what a broker looks like that does not offer that protocol or "
            "mechanism or refuses the credentials or certificate: check the broker's listener and the settings "
            "(logLevel=DEBUG shows kafka-python's own reason)"
        )

    def _refusal_hint(self, refusal: Refusal, p: str) -> str:
        reason = refusal.reason
        for secret in (self.sasl_password, self.ssl_password):
            if secret:  # no broker echoes a password; should one, it reaches no log from here
                reason = reason.replace(secret, MASK)
        what, fix = {
            "login": ("refused the login", f"check {p}sasl.username and {p}sasl.password (or {p}sasl.jaas.config)"),
            "mechanism": ("refused the SASL mechanism", f"set {p}sasl.mechanism to one the broker enables"),
            "untrusted": (
                "sent a certificate this client does not trust",
                f"set {p}ssl.cafile to the CA that signed the broker's certificate",
            ),
            "hostname": (
                "sent a certificate for another name",
                f"name the broker in the bootstrap list as its certificate does, or set {p}ssl.check.hostname=false",
            ),
            "certificate": (
                "refused this client's certificate" if self.ssl_certfile else "wants a client certificate",
                f"set {p}ssl.certfile (and {p}ssl.keyfile) to a certificate signed by a CA the broker trusts",
            ),
            "handshake": (
                "did not complete the TLS handshake",
                f"is the broker's listener SSL or SASL_SSL? check {p}security.protocol",
            ),
            "tls": ("answers in TLS", f"set {p}security.protocol to SSL or SASL_SSL, as the broker's listener expects"),
        }[refusal.kind]
        return f"; Kafka {what}: {reason!r} ({self.describe()}): {fix}"


# --------------------------------------------------------------------------- why Kafka refused

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


class _Refusals:
    """The last refusal per bootstrap list, and the bootstrap list of each client id; both bounded."""

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
            self._put(self._servers, client_id, tuple(servers), 4 * self.max_entries)

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
        try:
            key = tuple(_entries(servers))
        except ValueError:
            return None
        with self._lock:
            refusal = self._last.get(key)
        return refusal if refusal is not None and (since is None or refusal.at >= since) else None


_refusals = _Refusals()


def last_refusal(servers: str | Sequence[str], since: float | None = None) -> Refusal | None:
    """The last refusal met by a client of ``servers`` built with a ``client_id``, if seen at or after ``since``."""
    return _refusals.last(servers, since)


class _RefusalLog(logging.Filter):
    """Reads kafka-python's "Connection lost" records into a :class:`_Refusals`; passes on a record
    only if ``parent`` (the ``kafka`` logger) is enabled for its level."""

    def __init__(self, refusals: _Refusals, parent: logging.Logger) -> None:
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


# on the logger itself, which makes the records, in every process that builds a client
_connection_log = logging.getLogger(CONNECTION_LOGGER)
_connection_log.addFilter(_RefusalLog(_refusals, logging.getLogger("kafka")))
_reply_lock = threading.Lock()


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
    """Make kafka-python's transports hand on the bytes read with a close before the close (see above)."""
    from kafka.net import transport

    with _reply_lock:
        for cls in (transport.KafkaTCPTransport, transport.KafkaSSLTransport):
            original = cls.__dict__.get("_sock_recv")
            if original is not None and not getattr(original, "_namesrv_keeps_last_reply", False):
                cls._sock_recv = _keeps_last_reply(original)


_PLAINTEXT = KafkaSecurity()


def _config(
    servers: str | Sequence[str],
    key: str,
    pinned: bool,
    timeout_ms: int | None,
    config: dict[str, Any],
    security: KafkaSecurity | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"bootstrap_servers": bootstrap_list(servers, key)}
    if pinned:
        out["api_version"] = API_VERSION
    if timeout_ms is not None:
        out["request_timeout_ms"] = timeout_ms
    out.update((security or _PLAINTEXT).client_config())
    out.update(config)  # the caller's own settings win
    if isinstance(out.get("client_id"), str):  # so that its refusals are known by its bootstrap list
        _refusals.client(out["client_id"], out["bootstrap_servers"])
    return out


def producer(
    servers: str | Sequence[str],
    *,
    key: str = "bootstrap servers",
    pinned: bool = False,
    timeout_ms: int | None = None,
    security: KafkaSecurity | None = None,
    **config: Any,
) -> KafkaProducer:
    """A ``KafkaProducer`` for ``servers`` (read from setting ``key``) with ``config`` on top."""
    from kafka import KafkaProducer

    _keep_last_reply()
    return KafkaProducer(**_config(servers, key, pinned, timeout_ms, config, security))


def consumer(
    servers: str | Sequence[str],
    *,
    key: str = "bootstrap servers",
    pinned: bool = False,
    timeout_ms: int | None = None,
    security: KafkaSecurity | None = None,
    **config: Any,
) -> KafkaConsumer:
    """A ``KafkaConsumer`` for ``servers``; it joins no group unless ``config`` names one."""
    from kafka import KafkaConsumer

    _keep_last_reply()
    return KafkaConsumer(
        **{"group_id": None, "enable_auto_commit": False, **_config(servers, key, pinned, timeout_ms, config, security)}
    )


def admin(
    servers: str | Sequence[str],
    *,
    key: str = "bootstrap servers",
    pinned: bool = False,
    timeout_ms: int | None = None,
    security: KafkaSecurity | None = None,
    **config: Any,
) -> KafkaAdminClient:
    """A ``KafkaAdminClient`` for ``servers``; ``timeout_ms`` bounds its bootstrap too."""
    from kafka.admin import KafkaAdminClient

    _keep_last_reply()
    if timeout_ms is not None:
        config.setdefault("bootstrap_timeout_ms", timeout_ms)
    return KafkaAdminClient(**_config(servers, key, pinned, timeout_ms, config, security))
