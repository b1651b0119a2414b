"""The Redis Cluster of :mod:`infra.redis_cluster`, for tests: the same, but a test skips when redis-server is missing.

:class:`RedisCluster` and :func:`redis_cluster` are infra's with one difference: where infra's raise
:class:`~infra.processes.BinaryNotFoundError` (no redis-server or redis-cli on PATH), these skip the test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra import redis_cluster as _infra
from infra.processes import BinaryNotFoundError
from infra.redis_cluster import NODE_TIMEOUT_MS

__all__ = ["NODE_TIMEOUT_MS", "RedisCluster", "redis_cluster"]


def _skip_without_redis() -> None:
    try:
        _infra.binaries()
    except BinaryNotFoundError as exc:
        pytest.skip(str(exc))


class RedisCluster(_infra.RedisCluster):
    def start(self, timeout: float = 60.0) -> RedisCluster:
        _skip_without_redis()
        super().start(timeout)
        return self


@contextlib.contextmanager
def redis_cluster(tmp: Path, *args: Any, **kwargs: Any) -> Iterator[_infra.RedisCluster]:
    """:func:`infra.redis_cluster.redis_cluster` (same arguments), skipping the test without redis-server."""
    _skip_without_redis()
    with _infra.redis_cluster(tmp, *args, **kwargs) as cluster:
        yield cluster
