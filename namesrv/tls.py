"""TLS settings and contexts: the node's (RocketMQ's ``tls.*`` keys) and the clients' (``--tls`` options).

The node reads RocketMQ's ``tls.*`` keys as RocketMQ reads them, its properties standing in for
``-D`` system properties and the file named by ``tls.config.file`` overriding the test mode and
``tls.server.*`` values, but checks every value and file at start-up and refuses combinations that
would fail later or silently (client auth without a trust file, test mode with a certificate,
``enforcing`` with neither).  Test mode is off by default, so a node nobody configured for TLS
serves exactly what it served before.  :func:`server_context` builds the node's
:class:`ssl.SSLContext` with the standard library (a self-signed certificate made by ``openssl`` in
test mode); :func:`client_context` is the one way our own clients get TLS.
``docs/internals/tls-and-proxy.md`` lists every difference from RocketMQ.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common.options import ConfigError, convert
from common.properties import decode_properties, parse_properties
from namesrv.config import OPTIONS_BY_KEY, NamesrvConfig

__all__ = ["TlsSettings", "tls_settings", "server_context", "client_context", "self_signed_certificate"]

log = logging.getLogger("namesrv.tls")

DEFAULT_CONFIG_FILE = "/etc/rocketmq/tls.properties"
#: the keys tls.config.file may set (RocketMQ's extractTlsConfigFromFile, server side), and their attributes
FILE_KEYS = {
    "tls.test.mode.enable": "tls_test_mode_enable",
    "tls.server.need.client.auth": "tls_server_need_client_auth",
    "tls.server.keyPath": "tls_server_key_path",
    "tls.server.keyPassword": "tls_server_key_password",
    "tls.server.certPath": "tls_server_cert_path",
    "tls.server.trustCertPath": "tls_server_trust_cert_path",
}
_OPENSSL_TIMEOUT_S = 60
_NODE_PROPERTIES = "the node's properties"


@dataclass(frozen=True)
class TlsSettings:
    """The node's TLS settings once ``tls.config.file`` is applied; see the module docstring."""

    mode: str
    test_mode: bool
    cert_path: str
    key_path: str
    key_password: str
    trust_cert_path: str
    need_client_auth: str
    #: where each file-capable key's value came from: "the node's properties" or the file's path
    sources: Mapping[str, str]

    @property
    def has_certificate(self) -> bool:
        return self.mode != "disabled" and (self.test_mode or bool(self.cert_path))

    def where(self, key: str) -> str:
        return f"{key} (from {self.sources.get(key, _NODE_PROPERTIES)})"


def _read_file(cfg: NamesrvConfig) -> tuple[dict[str, str], str]:
    path = Path(cfg.tls_config_file).expanduser()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        if cfg.tls_config_file == DEFAULT_CONFIG_FILE:
            log.debug("no %s: the node's properties alone configure TLS", path)
            return {}, str(path)
        raise ConfigError(
            f"tls.config.file={cfg.tls_config_file} does not exist; create it or point tls.config.file elsewhere"
        ) from None
    except OSError as e:
        raise ConfigError(f"tls.config.file={cfg.tls_config_file} cannot be read ({e.strerror})") from None
    try:
        return parse_properties(decode_properties(data)), str(path)
    except ValueError as e:
        raise ConfigError(f"tls.config.file={cfg.tls_config_file} is not a valid .properties file: {e}") from None


def _check_file(settings: TlsSettings, key: str, path: str) -> None:
    try:
        with open(Path(path).expanduser(), "rb"):
            pass
    except OSError as e:
        raise ConfigError(f"{settings.where(key)}={path} cannot be read ({e.strerror or e})") from None


def tls_settings(cfg: NamesrvConfig) -> TlsSettings:
    """The effective settings, every file and combination checked; raises :class:`ConfigError`."""
    values = {key: getattr(cfg, attr) for key, attr in FILE_KEYS.items()}
    sources = {key: _NODE_PROPERTIES for key in FILE_KEYS}
    if cfg.tls_server_mode != "disabled":
        props, path = _read_file(cfg)
        if "tls.server.mode" in props:
            log.warning(
                "%s sets tls.server.mode, which is read from the node's properties only (as RocketMQ reads it"
                " from -Dtls.server.mode): ignored; the mode is %s",
                path,
                cfg.tls_server_mode,
            )
        for key in FILE_KEYS.keys() & props.keys():
            values[key] = convert(path, key, props[key], OPTIONS_BY_KEY[key].converter)
            sources[key] = path
    settings = TlsSettings(
        mode=cfg.tls_server_mode,
        test_mode=values["tls.test.mode.enable"],
        cert_path=values["tls.server.certPath"],
        key_path=values["tls.server.keyPath"],
        key_password=values["tls.server.keyPassword"],
        trust_cert_path=values["tls.server.trustCertPath"],
        need_client_auth=values["tls.server.need.client.auth"],
        sources=sources,
    )
    if settings.mode == "disabled":
        return settings
    cert, key = settings.cert_path, settings.key_path
    if settings.test_mode and (cert or key):
        raise ConfigError(
            f"{settings.where('tls.test.mode.enable')}=true would ignore {settings.where('tls.server.certPath')}"
            f"={cert}: set one of them only (RocketMQ silently serves the self-signed certificate)"
        )
    if bool(cert) != bool(key):
        raise ConfigError(
            f"{settings.where('tls.server.certPath')}={cert} and {settings.where('tls.server.keyPath')}={key}:"
            " set both or neither"
        )
    if settings.mode == "enforcing" and not settings.has_certificate:
        raise ConfigError(
            "tls.server.mode=enforcing refuses plaintext, but no certificate is configured: set tls.server.certPath"
            " and tls.server.keyPath (or tls.test.mode.enable=true for tests)"
        )
    for k, path in (("tls.server.certPath", cert), ("tls.server.keyPath", key)):
        if path:
            _check_file(settings, k, path)
    if settings.need_client_auth != "none" and settings.has_certificate:
        if not settings.trust_cert_path:
            raise ConfigError(
                f"{settings.where('tls.server.need.client.auth')}={settings.need_client_auth} needs"
                " tls.server.trustCertPath: the CA certificates client certificates are verified against"
            )
        _check_file(settings, "tls.server.trustCertPath", settings.trust_cert_path)
    return settings


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate and its unencrypted key for localhost, written by ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigError("tls.test.mode.enable=true needs the openssl command (Debian: apt-get install openssl)")
    cert, key = directory / "test-mode-cert.pem", directory / "test-mode-key.pem"
    # EC P-256: made in milliseconds, and every RocketMQ client's JDK speaks ECDSA
    command = [
        openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", "3650", "-subj", "/CN=namesrv-py test mode",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1",
    ]  # fmt: skip
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=_OPENSSL_TIMEOUT_S)
    except subprocess.CalledProcessError as e:
        raise ConfigError(
            f"tls.test.mode.enable=true: openssl could not make a certificate: {e.stderr.decode(errors='replace')[:300]}"
        ) from None
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"tls.test.mode.enable=true: openssl could not make a certificate: {e}") from None
    return cert, key


def fingerprint(cert_pem: Path) -> str:
    """SHA-256 of the first certificate in a PEM file, as ``openssl x509 -fingerprint -sha256`` shows it."""
    der = ssl.PEM_cert_to_DER_cert(cert_pem.read_text())
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


class _KeyNeedsPassword(Exception):
    pass


def _no_password() -> bytes:
    # OpenSSL asks only for an encrypted key; without this it would prompt on the terminal
    raise _KeyNeedsPassword


def _load_chain(ctx: ssl.SSLContext, settings: TlsSettings, cert: Path, key: Path) -> None:
    password = settings.key_password or _no_password
    try:
        ctx.load_cert_chain(cert, key, password=password)
    except _KeyNeedsPassword:
        raise ConfigError(
            f"{settings.where('tls.server.keyPath')}={key} is encrypted: set tls.server.keyPassword"
        ) from None
    except (ssl.SSLError, OSError, ValueError) as e:
        hint = " or tls.server.keyPassword is wrong" if settings.key_password else ""
        raise ConfigError(
            f"{settings.where('tls.server.certPath')}={cert} with {settings.where('tls.server.keyPath')}={key}"
            f" cannot be used ({e}): not PEM, not a matching pair{hint}"
        ) from None


def server_context(settings: TlsSettings) -> ssl.SSLContext | None:
    """The node's TLS context, or None when it serves plaintext only (disabled, or no certificate)."""
    if not settings.has_certificate:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if settings.test_mode:
        with tempfile.TemporaryDirectory(prefix="namesrv-tls-") as tmp:  # created 0700; deleted once loaded
            cert, key = self_signed_certificate(Path(tmp))
            _load_chain(ctx, settings, cert, key)
            log.warning(
                "tls.test.mode.enable=true: serving TLS with a self-signed certificate made at start-up"
                " (SHA-256 %s); clients cannot verify it: for tests only",
                fingerprint(cert),
            )
    else:
        _load_chain(ctx, settings, Path(settings.cert_path).expanduser(), Path(settings.key_path).expanduser())
    if settings.need_client_auth != "none":
        try:
            ctx.load_verify_locations(cafile=str(Path(settings.trust_cert_path).expanduser()))
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(
                f"{settings.where('tls.server.trustCertPath')}={settings.trust_cert_path} holds no usable PEM"
                f" certificate ({e})"
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED if settings.need_client_auth == "require" else ssl.CERT_OPTIONAL
    return ctx


def client_context(
    *,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    key_password: str | None = None,
    insecure: bool = False,
) -> ssl.SSLContext:
    """A client's TLS context: verify the node against ``ca`` (else the system's CAs) unless ``insecure``;
    present ``cert``/``key`` when given.  Raises ``ValueError`` with a message for the user."""
    try:
        ctx = ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, OSError) as e:
        raise ValueError(f"--tls-ca {ca}: no usable PEM certificate ({e})") from None
    if insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert or key:
        if not cert:
            raise ValueError("--tls-key needs --tls-cert")
        try:
            ctx.load_cert_chain(cert, key, password=key_password or _no_password)
        except _KeyNeedsPassword:
            raise ValueError(f"--tls-key {key or cert} is encrypted: pass its password") from None
        except (ssl.SSLError, OSError) as e:
            raise ValueError(f"--tls-cert {cert} / --tls-key {key}: cannot be used ({e})") from None
    return ctx
