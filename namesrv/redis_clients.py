"""Every Redis client the project builds (the job's store, route lookups, a node's warm start), from a URL.

Theory of operation
-------------------
Callers say how long they may wait and whether a failed command may be retried; this module turns a
URL into a client, so that what every client shares (the URL's scheme and credentials, timeouts,
and later TLS files or a cluster) is decided in one place rather than at each call site.

* ``redis://[user:password@]host:port/db`` and ``unix://`` are what redis-py's ``from_url`` reads.
* ``redis+cluster://[user:password@]host:port[/0]`` (``rediss+cluster://`` with TLS) is a Redis Cluster:
  redis-py's ``RedisCluster``, seeded by that one node, which finds the others itself. The keys of a
  prefix then carry a hash tag (``{namesrv}:route:T``, :class:`namesrv.routes.snapshot.RedisKeys`),
  so every key the job writes lives in one slot and each batch's MULTI/EXEC still holds;
  ``docs/redis-keys.md`` has the trade-off. A cluster has database 0 only: another one is refused.
  redis-py's cluster client asks the cluster for its slots when it is made and fails if no node
  answers; this one is made at its first command instead, and an unreachable cluster is a
  ``redis.ConnectionError`` there, as a single Redis's is: Redis down must not stop the job's start.
* ``retries=False`` gives a client that fails at once: a node's warm start must not spend redis-py's
  default back-off before it falls back to another source.

redis-py is imported only when a client is built: a node that never uses Redis never imports it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, TypeAlias, cast
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    import redis
    import redis.cluster

__all__ = ["CLUSTER_SCHEMES", "Client", "check_url", "connect", "is_cluster"]

#: a client of either kind: what :func:`connect` returns
Client: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
#: URL schemes of a Redis Cluster -> the scheme redis-py reads for the same connection
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster(url: str) -> bool:
    """True when ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return urlsplit(url.strip()).scheme.lower() in CLUSTER_SCHEMES


def _cluster_url(url: str) -> str:
    """The redis-py URL of a cluster URL; ValueError naming the problem when it cannot be one."""
    parts = urlsplit(url.strip())
    if not parts.hostname:
        # the URL itself is not quoted: it may hold a password
        raise ValueError("a Redis Cluster URL names a node, e.g. redis+cluster://host:6379")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has database 0 only, not {parts.path.strip('/')[:20]!r}")
    return urlunsplit(parts._replace(scheme=CLUSTER_SCHEMES[parts.scheme.lower()], path=""))


def check_url(url: str) -> None:
    """Raise ValueError naming the problem when ``url`` is a cluster URL that cannot work."""
    if is_cluster(url):
        _cluster_url(url)


class _LazyCluster:
    """A ``RedisCluster`` made at first use (see the module); every attribute is the client's."""

    def __init__(self, url: str, kwargs: dict[str, Any]) -> None:
        self._url, self._kwargs = url, kwargs
        self._client: redis.cluster.RedisCluster | None = None
        self._lock = threading.Lock()

    def _made(self) -> redis.cluster.RedisCluster:
        with self._lock:
            if self._client is None:
                from redis.cluster import RedisCluster
                from redis.exceptions import ConnectionError, RedisClusterException

                try:
                    self._client = RedisCluster.from_url(self._url, **self._kwargs)
                except RedisClusterException as exc:  # no node answered: an outage, as for a single Redis
                    raise ConnectionError(f"Redis Cluster: {exc}") from exc
            return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._made(), name)

    def close(self) -> None:
        if self._client is not None:  # never connect only to close
            self._client.close()


def connect(url: str, *, timeout_s: float = 10.0, retries: bool = True) -> Client:
    """A client for ``url`` whose connects and commands each give up after ``timeout_s``."""
    import redis

    kwargs: dict[str, object] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if not retries:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs["retry"] = Retry(NoBackoff(), 0)
    if is_cluster(url):
        return cast("redis.cluster.RedisCluster", _LazyCluster(_cluster_url(url), kwargs))
    return redis.Redis.from_url(url, **kwargs)
