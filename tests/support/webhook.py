"""A webhook receiver for the tests: a real HTTP server on a free loopback port that keeps every POST's JSON.

The pagers (the job's and the nodes') POST ``{"version", "monitor", "alerts": [...]}``; a test reads what
arrived, when, and can have the first POSTs refused with 503 to see a pager retry.
"""

from __future__ import annotations

import http.server
import json
import threading
from dataclasses import dataclass
from typing import Any

from common.contract import wall_ms


@dataclass(frozen=True)
class Delivery:
    """One POST: when it arrived (wall ms) and its JSON body."""

    at_ms: int
    body: dict[str, Any]


class Webhook:
    """Listens on 127.0.0.1 from construction until :meth:`close`; ``refuse_first`` POSTs get 503."""

    def __init__(self, *, refuse_first: int = 0) -> None:
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self._refusals = refuse_first
        keeper = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(200 if keeper._keep(body) else 503)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="test-webhook", daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"

    def _keep(self, body: bytes) -> bool:
        with self._lock:
            if self._refusals > 0:
                self._refusals -= 1
                return False
            self._deliveries.append(Delivery(wall_ms(), json.loads(body)))
            return True

    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def bodies(self) -> list[dict[str, Any]]:
        return [d.body for d in self.deliveries()]

    def alerts(self, kind: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        """Every alert of every body, in arrival order; only those of ``kind`` and ``state`` when given."""
        return [
            alert
            for body in self.bodies()
            for alert in body["alerts"]
            if (kind is None or alert.get("kind") == kind) and (state is None or alert.get("state") == state)
        ]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Webhook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
