"""``namesrv console``: a live cluster-health page in the browser, read from what the monitor keeps in Redis.

Theory of operation
-------------------
The streaming monitor writes, with every micro-batch, each broker's last heartbeat, timeout and
state, each node's last tick, local-scan flag and clock offset, its own progress, the open
incidents and the recently resolved ones (``docs/redis-keys.md``, :mod:`streaming.health`). The
console only reads those keys (and the routes, for the topic search): it is stateless, needs no
Kafka or Spark, and as many can run as people want to look. :mod:`namesrv.console.app` is the
web application (aiohttp, one Jinja2 template, server-sent events, a small vanilla script; no
JavaScript build step); :mod:`namesrv.console.snapshot` turns the checked Redis values into the
page's document.

========================  ===========================  ============================================
option                    default                      meaning
========================  ===========================  ============================================
``--redis URL``           ``redis://127.0.0.1:16379/0``  the Redis the monitor writes (its redis.url)
``--prefix P``            ``namesrv``                  its key prefix (the monitor's redis.keyPrefix)
``--host H``              ``127.0.0.1``                address to listen on (the page has no login:
                                                       keep it on loopback or behind a proxy)
``--port N``              ``18080``                    port to listen on
``--poll-ms N``           ``300``                      how often Redis is read (50 ..= 5000)
========================  ===========================  ============================================
"""

from __future__ import annotations

from namesrv.console.app import ConsoleSettings, build_app

__all__ = ["ConsoleSettings", "DEFAULT_PORT", "build_app", "serve"]

DEFAULT_PORT = 18080


def serve(settings: ConsoleSettings, host: str, port: int) -> None:
    """Run the console in the foreground until SIGINT/SIGTERM; prints its URL once it listens."""
    from aiohttp import web

    from namesrv import redis_clients
    from namesrv.console.snapshot import shown_redis_url

    client = redis_clients.connect(settings.redis_url, timeout_s=2.0)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"

    def say(_: str) -> None:
        print(f"namesrv console: {url}  (reading {shown_redis_url(settings.redis_url)}, prefix {settings.prefix})",
              flush=True)  # fmt: skip

    try:
        web.run_app(build_app(settings, client), host=host, port=port, print=say, shutdown_timeout=2.0,
                    access_log=None)  # fmt: skip
    finally:
        client.close()
