"""Local services for development and tests: Apache Kafka (one KRaft node) and Redis on loopback ports.

See :mod:`infra.services` (``python -m infra.services start|stop|status``) and
``infra/deploy/`` for a real deployment. Names are re-exported lazily so that
``python -m infra.services`` does not import the module twice.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "BinaryNotFoundError",
    "ConfigError",
    "KafkaService",
    "PortInUseError",
    "RedisBackend",
    "RedisService",
    "ServiceError",
    "ServiceStatus",
    "ServicesConfig",
    "TopicSpec",
    "free_port",
    "load_config",
    "parse_topics",
    "services_from_config",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("infra.services"), name)
    raise AttributeError(f"module 'infra' has no attribute {name!r}")
