"""Every Kafka client the project builds (producers, consumers, admin clients), from settings.

Theory of operation
-------------------
Callers pass what is theirs to decide (acks, batching, client id, offsets policy) as kafka-python
keyword arguments; this module adds what every client shares, so it is decided once:

* **The bootstrap list.**  A comma-separated ``host[:port]`` text (or a list of entries): blanks
  around entries are stripped and empty entries dropped; no entry at all, or an entry whose port is
  not 1..65535, is a :class:`~namesrv.options.ConfigError` naming the setting it came from
  (:func:`bootstrap_list`; :data:`BOOTSTRAP` is the same check as an option-table converter).
* **The pinned protocol level.**  With ``pinned=True`` the client gets :data:`API_VERSION` (a cap;
  connections still negotiate down).  Without it kafka-python's constructor blocks to probe the
  broker and raises when none answers; with it, building the client needs no broker, and
  connecting and reconnecting are the library's business.  The node's clients are pinned (a node
  starts whether or not Kafka is up); the job's publisher is not, because it waits for Kafka by
  retrying the constructor until it succeeds.
* **Timeouts.**  ``timeout_ms`` bounds each request; an admin client's bootstrap gets the same
  bound, since its constructor otherwise waits the library's 30 s for a broker to answer.
* **Security** (:class:`KafkaSecurity`): TLS and SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512), read
  once from settings spelled as the Kafka client spells them (:data:`SECURITY_KEYS`, prefixed
  ``kafka.`` in the node's and the job's files) and turned into kafka-python's keyword arguments
  (:meth:`KafkaSecurity.client_config`) or Spark's connector options
  (:meth:`KafkaSecurity.spark_options`).  Checked whole before any client is built: an unknown
  protocol or mechanism, SASL without credentials, credentials or certificates the protocol would
  ignore, an unreadable file, are each a :class:`~namesrv.options.ConfigError` naming the key.
  Passwords may be ``${env:NAME}`` or ``${file:PATH}`` (:func:`namesrv.options.resolve_secret`);
  no message, ``repr`` or :meth:`KafkaSecurity.describe` shows one.  The default is PLAINTEXT
  with nothing added, so a client is built exactly as before.

* **One false alarm silenced.**  kafka-python 3 runs each client's I/O on a thread of its own and
  warns (logger ``kafka.net.selector``) "Task ... ran for 0.15s ... It is blocking the event loop"
  when one step of it takes over 0.1 s of *wall-clock* time.  On a loaded machine (two cores, Spark
  starting, a node holding the GIL) the thread is simply off the CPU or waiting for the GIL: measured
  here, 0.115 s of wall time held 0.022 s of the thread's CPU.  The threshold cannot be set through
  the clients' settings, so :class:`_SlowStepFilter` logs that one message at DEBUG instead; every
  other kafka-python warning is unchanged, and a real stall still shows as request timeouts.

kafka-python is imported only when a client is built: a node without Kafka never imports it, and
the Kafka source (``streaming/kafka_io.py``) imports this module inside Spark's Python workers, so
nothing here may import more than the standard library and :mod:`namesrv.options`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from namesrv.options import BOOLEAN_EXPECTED, ConfigError, Converter, parse_bool, resolve_secret

if TYPE_CHECKING:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

__all__ = [
    "API_VERSION",
    "BOOTSTRAP",
    "KafkaSecurity",
    "SECURITY_KEYS",
    "SECRET_KEYS",
    "SECURITY_PROTOCOLS",
    "SASL_MECHANISMS",
    "bootstrap_list",
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

    def failure_hint(self) -> str:
        """What to check when no broker completes a connection; empty for plaintext."""
        if self.protocol == "PLAINTEXT":
            return ""
        return (
            f"; with {self.describe()} this is also what a broker looks like that does not offer that protocol or "
            "mechanism or refuses the credentials or certificate: check the broker's listener and the settings "
            "(logLevel=DEBUG shows kafka-python's own reason)"
        )


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

    if timeout_ms is not None:
        config.setdefault("bootstrap_timeout_ms", timeout_ms)
    return KafkaAdminClient(**_config(servers, key, pinned, timeout_ms, config, security))
