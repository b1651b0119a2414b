"""How Kafka clients reach Kafka: TLS and SASL settings, checked whole, as plain data (:class:`KafkaSecurity`).

:meth:`KafkaSecurity.from_settings` reads the settings :data:`SECURITY_KEYS` (the Kafka client's own
spelling; the node and the job prefix them with ``kafka.``) and refuses, naming the key, whatever cannot
work: an unknown protocol or mechanism, SASL without credentials, credentials or certificates the protocol
would ignore, an unreadable file.  The result turns into kafka-python's keyword arguments
(:meth:`~KafkaSecurity.client_config`), Spark's connector options (:meth:`~KafkaSecurity.spark_options`)
or the settings again (:meth:`~KafkaSecurity.settings`), and never shows a password.  Nothing here has a
side effect: a broker's reason for refusing a client is tracked by :mod:`common.kafka_refusals`, and
:meth:`~KafkaSecurity.failure_hint` only words one it is given.  ``docs/internals/kafka-clients.md`` has
the details.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from common.options import BOOLEAN_EXPECTED, ConfigError, parse_bool, resolve_secret

if TYPE_CHECKING:
    from common.kafka_refusals import Refusal

__all__ = ["MASK", "SASL_MECHANISMS", "SECRET_KEYS", "SECURITY_KEYS", "SECURITY_PROTOCOLS", "KafkaSecurity"]

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

    def failure_hint(self, refusal: Refusal | None = None, *, prefix: str = "kafka.") -> str:
        """What to check when no broker completes a connection: a clause to append to a message.

        With ``refusal``, the reason a broker gave for refusing one of the clients that failed
        (:func:`common.kafka_refusals.last_refusal`), quoted, and the setting (after ``prefix``) to fix.
        Otherwise: nothing for plaintext, else a reminder that a refusal looks like a broker that is down.
        """
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
