"""Every Redis client the project builds (the job's store, route lookups, a node's warm start), from a URL.

Theory of operation
-------------------
Callers say how long they may wait and whether a failed command may be retried; this module turns a
URL into a client, so that what every client shares (the URL's scheme and credentials, timeouts,
and later TLS files or a cluster) is decided in one place rather than at each call site.

* ``redis://[user:password@]host:port/db`` and ``unix://`` are what redis-py's ``from_url`` reads.
* ``retries=False`` gives a client that fails at once: a node's warm start must not spend redis-py's
  default back-off before it falls back to another source.

redis-py is imported only when a client is built: a node that never uses Redis never imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

__all__ = ["connect"]


def connect(url: str, *, timeout_s: float = 10.0, retries: bool = True) -> redis.Redis:
    """A client for ``url`` whose connects and commands each give up after ``timeout_s``."""
    import redis

    kwargs: dict[str, object] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if not retries:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs["retry"] = Retry(NoBackoff(), 0)
    return redis.Redis.from_url(url, **kwargs)
