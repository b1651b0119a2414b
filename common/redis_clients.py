"""Every Redis client the project builds (the job's store, route lookups, a node's warm start, the CLI and
the console), from a URL.

Callers say how long they may wait and whether a failed command may be retried; this module turns a
URL into a client, so that what every client shares (scheme, credentials, TLS files, timeouts) is
decided in one place.  It reads ``redis://``, ``unix://``, ``rediss://`` (TLS files from the query
or a :class:`RedisTls`, checked before anything connects) and ``redis+cluster://`` (a Redis Cluster,
seeded by every node the URL names, made at its first command so that Redis down does not stop a
start, its watched transactions failing over as a single Redis's do: :func:`_cluster_class`); the
whole URL may be a ``${env:...}``/``${file:...}`` secret.  :func:`redact_url` is the one way a URL
reaches a log, and :func:`describe_error` says what to check.  redis-py is imported only when a
client is built.  ``docs/internals/redis-clients.md`` has the details.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from common.options import ConfigError, is_secret_reference, parse_bool, resolve_secret

if TYPE_CHECKING:
    import redis
    import redis.cluster

__all__ = [
    "CLUSTER_SCHEMES", "Client", "RedisTls", "RedisUrlError", "check_url", "connect", "describe_error", "failures",
    "is_cluster", "redact_url",
]  # fmt: skip

#: a client of either kind: what :func:`connect` returns
Client: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"
#: URL schemes of a Redis Cluster -> the scheme redis-py reads for the same connection
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES)
_TLS_SCHEMES = ("rediss", "rediss+cluster")
#: query parameters that only mean something over TLS
_TLS_PARAMS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname", "ssl_cert_reqs", "ssl_password")
_FILE_PARAMS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_CERT_REQS = ("none", "optional", "required")
_MASK = "***"


class RedisUrlError(ConfigError):
    """A Redis URL that cannot work; the message names what to fix and never holds the password."""


@dataclass(frozen=True)
class RedisTls:
    """TLS files for a ``rediss://`` URL; each ``None`` leaves the URL's (or redis-py's) choice."""

    ca_certs: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    check_hostname: bool | None = None

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, value in (
            ("ssl_ca_certs", self.ca_certs),
            ("ssl_certfile", self.certfile),
            ("ssl_keyfile", self.keyfile),
        ):
            if value is not None:
                out[name] = value
        if self.check_hostname is not None:
            out["ssl_check_hostname"] = self.check_hostname
        return out


def redact_url(url: str) -> str:
    """``url`` without its password (authority or ``password=`` query), for logs and messages."""
    if is_secret_reference(url):
        return url.strip()  # names where the URL is, holds nothing secret
    try:
        parts = urlsplit(url)
        password = parts.password
        seeds = "," in parts.netloc  # a cluster URL naming several nodes: no one port
        port = None if seeds else parts.port
    except ValueError:
        # unparsable: show no authority at all rather than risk a password
        return "<unparsable Redis URL>"
    netloc = parts.netloc
    if password is not None and seeds:
        netloc = f"{parts.username or ''}:{_MASK}@{netloc.rpartition('@')[2]}"
    elif password is not None:
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{parts.username or ''}:{_MASK}@{host}" + (f":{port}" if port else "")
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k == "password" for k, _ in pairs):
            query = urlencode([(k, _MASK if k == "password" else v) for k, v in pairs], safe="*/")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def is_cluster(url: str) -> bool:
    """True when ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    if is_secret_reference(url):
        try:
            url = resolve_secret(url, "Redis URL", "redis")
        except ConfigError:
            return False  # check_url names the problem
    return urlsplit(url.strip()).scheme.lower() in CLUSTER_SCHEMES


def _cluster_seeds(url: str) -> list[tuple[str, int]]:
    """Every node a cluster URL names (``host:port,host:port``), in order; ValueError naming the problem."""
    hosts = urlsplit(url.strip()).netloc.rpartition("@")[2]
    seeds = []
    for item in hosts.split(","):
        one = urlsplit(f"//{item.strip()}")
        if not one.hostname:
            # the URL itself is not quoted: it may hold a password
            raise ValueError("a Redis Cluster URL names a node, e.g. redis+cluster://host:6379")
        try:
            port = one.port
        except ValueError:
            raise ValueError(f"a Redis Cluster node's port is a number: {item.strip()[:60]!r}") from None
        seeds.append((one.hostname, port or 6379))
    return seeds


def _cluster_url(url: str) -> str:
    """The redis-py URL of a cluster URL's first node; ValueError naming the problem when it cannot be one."""
    parts = urlsplit(url.strip())
    (host, port), *_ = _cluster_seeds(url)
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has database 0 only, not {parts.path.strip('/')[:20]!r}")
    userinfo, at, _hosts = parts.netloc.rpartition("@")
    first = f"[{host}]" if ":" in host else host
    netloc = f"{userinfo}{at}{first}:{port}"
    return urlunsplit(parts._replace(scheme=CLUSTER_SCHEMES[parts.scheme.lower()], netloc=netloc, path=""))


def check_url(url: str, *, key: str = "Redis URL", tls: RedisTls | None = None) -> str:
    """The URL to connect to (a ``${env:...}``/``${file:...}`` reference resolved); :class:`RedisUrlError` if unusable."""
    resolved = resolve_secret(url, key, "redis").strip()
    shown = redact_url(resolved)
    try:
        parts = urlsplit(resolved)
        if "," not in parts.netloc or parts.scheme.lower() not in CLUSTER_SCHEMES:  # seeds: checked below
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise RedisUrlError(f"{key}: {shown} is not a valid URL ({exc})") from None
    if parts.scheme.lower() not in _SCHEMES:
        raise RedisUrlError(
            f"{key}: {shown} must start with redis://, rediss:// (TLS), unix://, or redis+cluster:// / "
            "rediss+cluster:// for a Redis Cluster"
        )
    if is_cluster(resolved):
        try:
            _cluster_url(resolved)
        except ValueError as exc:
            raise RedisUrlError(f"{key}: {exc}") from None
    params = dict(parse_qsl(parts.query, keep_blank_values=True))
    tls_params = [p for p in _TLS_PARAMS if p in params]
    if parts.scheme.lower() not in _TLS_SCHEMES and (tls_params or (tls is not None and tls.kwargs())):
        what = tls_params[0] if tls_params else "TLS files"
        raise RedisUrlError(f"{key}: {shown} sets {what} but is not rediss://; write rediss:// for TLS")
    if "ssl_check_hostname" in params:
        try:
            parse_bool(params["ssl_check_hostname"])
        except ValueError:
            raise RedisUrlError(
                f"{key}: ssl_check_hostname={params['ssl_check_hostname']!r} is not true or false"
            ) from None
    if "ssl_cert_reqs" in params and params["ssl_cert_reqs"].lower() not in _CERT_REQS:
        raise RedisUrlError(f"{key}: ssl_cert_reqs={params['ssl_cert_reqs']!r} is not one of {', '.join(_CERT_REQS)}")
    files = {p: params[p] for p in _FILE_PARAMS if p in params}
    if tls is not None:
        files.update({p: v for p, v in tls.kwargs().items() if p in _FILE_PARAMS})
    for param, path in files.items():
        if not (os.path.isfile(path) and os.access(path, os.R_OK)):
            raise RedisUrlError(f"{key}: {param}={path} is not a readable file")
    return resolved


@functools.cache
def _cluster_class() -> type[redis.cluster.RedisCluster]:
    """redis-py's ``RedisCluster`` whose transactions are :class:`_WatchSafeTransaction`s (built at first use)."""
    from redis.cluster import RedisCluster, TransactionStrategy
    from redis.exceptions import MovedError, RedisClusterException, WatchError

    class _WatchSafeTransaction(TransactionStrategy):
        """A cluster transaction that, like redis-py's ``Pipeline`` on a single Redis, raises ``WatchError`` when
        the connection that holds its WATCH fails, and that asks the cluster where the slot is after it failed.

        redis-py 8.1's ``TransactionStrategy`` retries a failed command of a transaction on a new connection,
        to the node its slot map names. Two things go wrong when a master fails over. Its WATCH stayed on the
        old connection, so the retried reads and EXEC run unwatched: a change a WATCH guards against is
        overwritten (the job's batch over a node's removal, a node's removal over the job's newer batch).
        And it refreshes its slot map only every ``reinitialize_steps`` errors counted on the pipeline, which
        each call makes anew, so a client without retries keeps sending transactions to the dead master.
        Here a failure while watching raises ``WatchError`` (the caller runs the transaction again from its
        WATCH, as it does when a watched key changed), and every connection error or MOVED updates the map.
        """

        def _reinitialize_on_error(self, error: Exception, failure_count: int) -> None:
            watching = self._watching
            super()._reinitialize_on_error(error, failure_count)
            if isinstance(error, MovedError):
                self._nodes_manager.move_slot(error)
            elif isinstance(error, self.CONNECTION_ERRORS):
                with contextlib.suppress(RedisClusterException):  # no node answers: keep the map, raise the error
                    self._nodes_manager.initialize()
            if watching:
                self._watching = False  # the server dropped the watch with the connection
                raise WatchError(f"A {type(error).__name__} occurred while watching one or more keys") from error

    class WatchSafeCluster(RedisCluster):
        def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
            pipe = super().pipeline(transaction, shard_hint)
            if transaction:
                pipe._execution_strategy = _WatchSafeTransaction(pipe)
            return pipe

    return WatchSafeCluster


class _LazyCluster:
    """A ``RedisCluster`` made at first use (see the module), seeded by every node the URL names; every
    attribute is the client's."""

    def __init__(self, url: str, kwargs: dict[str, Any], seeds: list[tuple[str, int]] | None = None) -> None:
        self._url, self._kwargs, self._seeds = url, kwargs, seeds or []
        self._client: redis.cluster.RedisCluster | None = None
        self._lock = threading.Lock()

    def _made(self) -> redis.cluster.RedisCluster:
        with self._lock:
            if self._client is None:
                from redis.cluster import ClusterNode
                from redis.exceptions import ConnectionError, RedisClusterException

                # the URL's first node comes from the URL; the others seed too, so that a client made
                # while one of them is down (a failed-over master) still finds the cluster
                more = [ClusterNode(host, port) for host, port in self._seeds[1:]]
                try:
                    self._client = _cluster_class().from_url(self._url, startup_nodes=more, **self._kwargs)
                except RedisClusterException as exc:  # no node answered: an outage, as for a single Redis
                    raise ConnectionError(f"Redis Cluster: {exc}") from exc
            return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._made(), name)

    def close(self) -> None:
        if self._client is not None:  # never connect only to close
            self._client.close()


def connect(
    url: str, *, timeout_s: float = 10.0, retries: bool = True, tls: RedisTls | None = None, key: str = "Redis URL"
) -> Client:
    """A client for ``url`` whose connects and commands each give up after ``timeout_s``.

    ``key`` names where the URL came from in a :class:`RedisUrlError`.
    """
    import redis

    resolved = check_url(url, key=key, tls=tls)
    kwargs: dict[str, object] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if not retries:
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        kwargs["retry"] = Retry(NoBackoff(), 0)
    if tls is not None:
        kwargs.update(tls.kwargs())
    if is_cluster(resolved):
        client = _LazyCluster(_cluster_url(resolved), kwargs, _cluster_seeds(resolved))
        return cast("redis.cluster.RedisCluster", client)
    return redis.Redis.from_url(resolved, **kwargs)


def failures() -> tuple[type[Exception], ...]:
    """What a command raises when Redis fails: redis-py's errors, and the cluster client's own when no node of a
    Redis Cluster answers (``RedisClusterException`` is no ``RedisError``), and the socket's."""
    import redis.exceptions

    return (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError)


def answers(url: str, *, timeout_s: float = 1.0) -> bool:
    """True when Redis at ``url`` answers PING within ``timeout_s`` (a readiness probe: no retries)."""
    import redis

    client = connect(url, timeout_s=timeout_s, retries=False)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def describe_error(exc: BaseException, url: str) -> str:
    """A sentence for an operator: what went wrong talking to Redis at ``url`` (redacted) and what to check."""
    import redis

    shown = redact_url(url)
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ConfigError):
        return text
    if isinstance(exc, redis.AuthenticationError) or "NOAUTH" in text or "WRONGPASS" in text:
        # the server's words differ by version and protocol (NOAUTH, or HELLO "must be called with the client
        # already authenticated"); whether the URL carried a password tells the two cases apart
        if not _has_password(url):
            return (
                f"Redis at {shown} requires a password ({text}); put it in the URL: "
                "redis://:PASSWORD@host:port/db, or redis://USER:PASSWORD@host:port/db for an ACL user"
            )
        return f"Redis at {shown} refused the user or password ({text}); check the credentials in the URL"
    if isinstance(exc, redis.ConnectionError) and any(w in text for w in ("SSL", "TLS", "certificate", "handshake")):
        return (
            f"TLS with Redis at {shown} failed ({text}); check ssl_ca_certs (the CA that signed the server's "
            "certificate), the host name it was issued for, and that the port serves TLS"
        )
    if isinstance(exc, redis.ConnectionError) and _scheme(url) == "redis" and "closed" in text.lower():
        return f"Redis at {shown} closed the connection ({text}); if that port serves TLS, write rediss://"
    return f"cannot use Redis at {shown}: {text}"


def _has_password(url: str) -> bool:
    try:
        parts = urlsplit(resolve_secret(url, "Redis URL", "redis"))
        return parts.password is not None or any(k == "password" for k, _ in parse_qsl(parts.query))
    except ValueError:  # ConfigError included: an unreadable reference
        return False


def _scheme(url: str) -> str:
    return url.strip().split(":", 1)[0].lower()
