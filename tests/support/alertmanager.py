"""Debian's Prometheus Alertmanager on a free loopback port, for the tests of the monitor's pager.

It runs with a minimal configuration (one receiver that notifies nobody), gossip off
(``--cluster.listen-address=``) and its storage in the test's directory. :meth:`Alertmanager.restart`
stops it and starts it again on the same port: Alertmanager keeps alerts in memory only, so a
restarted one has none until a sender gives them again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.node import free_port
from tests.support.wait import wait_until

BINARY = "/usr/bin/prometheus-alertmanager"

CONFIG = """\
route:
  receiver: nobody
  group_wait: 1s
  group_interval: 1s
receivers:
  - name: nobody
"""


def available() -> bool:
    return shutil.which(BINARY) is not None


class Alertmanager:
    def __init__(self, tmp_path: Path, config: str = CONFIG) -> None:
        """``config``: its alertmanager.yml (by default one receiver that notifies nobody)."""
        self.dir = tmp_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp_path / "alertmanager.yml"
        self.config.write_text(config)
        self.log = tmp_path / "alertmanager.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    BINARY,
                    f"--config.file={self.config}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                    f"--storage.path={self.dir / 'data'}",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(self._ready, 30, f"Alertmanager on {self.url} (log: {self.log})")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"Alertmanager exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """GET /api/v2/alerts (active, silenced, inhibited and unprocessed), those whose labels match ``filters``."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=5) as answer:
            found = json.load(answer)
        return [a for a in found if all(a["labels"].get(k) == v for k, v in filters.items())]

    def firing(self, **filters: str) -> list[dict[str, Any]]:
        """Alerts Alertmanager considers active now (its state, not just present)."""
        return [a for a in self.alerts(**filters) if a["status"]["state"] == "active"]
