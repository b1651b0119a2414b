"""Certificates made at test time with the openssl command: a CA, a server and a client certificate.

Nothing is checked in: each test session makes its own, valid for two days, in a directory it owns.
The server certificate names 127.0.0.1 and localhost (subjectAltName), where the test services listen.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: the client certificate and its key in one PEM file (what Java's PEM key store reads)
    client_combined: Path
    #: a CA that signed nothing here: trusting only it must fail the handshake
    other_ca_cert: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.crt"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-keyout", str(key), "-out", str(cert), cwd=directory,
    )  # fmt: skip
    return cert, key


def _signed(directory: Path, name: str, subject: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    key, csr, cert, ext = (directory / f"{name}.{s}" for s in ("key", "csr", "crt", "ext"))
    ext.write_text(extensions + "\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(csr), cwd=directory
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert), cwd=directory,
    )  # fmt: skip
    return cert, key


def make_pki(directory: Path) -> Pki:
    """A CA and the certificates it signed, in ``directory`` (created); needs the ``openssl`` command."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command is not installed (Debian: apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca(directory, "ca")
    other_ca, _ = _ca(directory, "other-ca")
    server = _signed(
        directory,
        "server",
        "/CN=127.0.0.1",
        ca,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
    )
    client = _signed(directory, "client", "/CN=namesrv-test-client", ca, "extendedKeyUsage=clientAuth")
    combined = directory / "client-combined.pem"
    combined.write_bytes(client[0].read_bytes() + client[1].read_bytes())
    for key in (ca[1], server[1], client[1], combined):
        key.chmod(0o600)
    return Pki(ca[0], ca[1], server[0], server[1], client[0], client[1], combined, other_ca)
