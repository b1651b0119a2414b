"""``namesrv-monitor console``: a live cluster-health page in the browser, read from what the monitor keeps in Redis.

The streaming monitor writes, with every micro-batch, each broker's and node's state, its own
progress and the open and recently resolved incidents (``docs/redis-keys.md``,
:mod:`streaming.health`).  The console only reads those keys (and the routes, for the topic
search): it is stateless and needs no Kafka or Spark, so any number can run.
:mod:`streaming.console.app` is the web application (aiohttp, one template, server-sent events, no
JavaScript build step); :mod:`streaming.console.snapshot` turns the checked Redis values into the
page's document.  The options are in the README ("The console"); ``docs/internals/console.md``
describes the parts.
"""

from __future__ import annotations

from streaming.console.app import ConsoleSettings, build_app

__all__ = ["ConsoleSettings", "DEFAULT_PORT", "build_app", "serve"]

DEFAULT_PORT = 18080


def serve(settings: ConsoleSettings, host: str, port: int) -> None:
    """Run the console in the foreground until SIGINT/SIGTERM; prints its URL once it listens."""
    from aiohttp import web

    from common import redis_clients
    from streaming.console.snapshot import shown_redis_url

    client = redis_clients.connect(settings.redis_url, timeout_s=2.0)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"

    def say(_: str) -> None:
        print(f"namesrv-monitor console: {url}  (reading {shown_redis_url(settings.redis_url)}, prefix {settings.prefix})",
              flush=True)  # fmt: skip

    try:
        web.run_app(build_app(settings, client), host=host, port=port, print=say, shutdown_timeout=2.0,
                    access_log=None)  # fmt: skip
    finally:
        client.close()
