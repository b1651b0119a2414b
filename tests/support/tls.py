"""Certificates for TLS tests, made at test time with the ``openssl`` command (docs/security.md's recipe),
and the client contexts and raw bytes (a ClientHello, PROXY preambles) the tests send.

One home for every test certificate: the node's remoting port, and the Redis and Kafka clients'
TLS. Nothing is checked in; each session makes its own, valid for two days, in a directory it owns.
"""

from __future__ import annotations

import ssl
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from common.protocol.proxy import V2_SIGNATURE
from namesrv.tls import client_context

KEY_PASSWORD = "s3cret pass"
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    #: the same key, PKCS#8 encrypted with KEY_PASSWORD
    server_key_encrypted: Path
    client_cert: Path
    client_key: Path
    #: a client certificate from another CA, which the node must not trust
    stranger_cert: Path
    stranger_key: Path
    #: that other CA: trusting only it must fail a handshake with ``server_cert``
    other_ca: Path
    #: for localhost/127.0.0.1 and good at both ends of a handshake, as a Kafka broker that requires
    #: client certificates wants its own (it checks that its key store could talk to itself)
    peer_cert: Path
    peer_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> tuple[Path, Path]:
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _openssl(
        "req", "-x509", *_EC, "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def _signed(d: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    cert, key, csr, ext = d / f"{name}.pem", d / f"{name}.key", d / f"{name}.csr", d / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", *_EC, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    _openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial", "-out", cert,
        "-days", "2", "-extfile", ext,
    )  # fmt: skip
    return cert, key


def make_certificates(d: Path) -> Certificates:
    """A CA, a node certificate for localhost/127.0.0.1 signed by it, a client certificate signed by
    it, a client certificate signed by another CA, and a peer certificate (both ends) signed by the CA."""
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca(d, "ca")
    server = _signed(d, "server", ca, "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    encrypted = d / "server-encrypted.key"
    _openssl("pkey", "-in", server[1], "-out", encrypted, "-aes256", "-passout", f"pass:{KEY_PASSWORD}")
    client = _signed(d, "client", ca, "extendedKeyUsage=clientAuth\n")
    other = _ca(d, "other-ca")
    stranger = _signed(d, "stranger", other, "extendedKeyUsage=clientAuth\n")
    peer = _signed(d, "peer", ca, "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    return Certificates(ca[0], *server, encrypted, *client, *stranger, other[0], *peer)


def node_tls(certs: Certificates, **more: str) -> dict[str, str]:
    """Node properties serving ``certs``' node certificate."""
    return {"tls.server.certPath": str(certs.server_cert), "tls.server.keyPath": str(certs.server_key), **more}


def client_tls(certs: Certificates, *, cert: bool = False, stranger: bool = False) -> ssl.SSLContext:
    """A client that verifies the node against the test CA, presenting a client certificate if asked."""
    if stranger:
        return client_context(ca=str(certs.ca), cert=str(certs.stranger_cert), key=str(certs.stranger_key))
    if cert:
        return client_context(ca=str(certs.ca), cert=str(certs.client_cert), key=str(certs.client_key))
    return client_context(ca=str(certs.ca))


def insecure_tls() -> ssl.SSLContext:
    return client_context(insecure=True)


def client_hello() -> bytes:
    """The first flight of a real TLS client (a ClientHello record), from the standard library."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = insecure_tls().wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def proxy_v1(src: str, sport: int, dst: str = "10.0.0.1", dport: int = 9876) -> bytes:
    family = "TCP6" if ":" in src else "TCP4"
    return f"PROXY {family} {src} {dst} {sport} {dport}\r\n".encode()


def proxy_v2_inet6(src: bytes, sport: int, dst: bytes = bytes(15) + b"\x01", dport: int = 9876) -> bytes:
    payload = src + dst + struct.pack(">HH", sport, dport)
    return V2_SIGNATURE + b"\x21\x21" + struct.pack(">H", len(payload)) + payload
