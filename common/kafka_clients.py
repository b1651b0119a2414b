"""Every Kafka client the project builds (producers, consumers, admin clients), from settings.

Callers pass what is theirs to decide (acks, batching, client id, offsets policy) as kafka-python
keyword arguments; this module adds what every client shares, so that it is decided once: the
checked bootstrap list (:func:`bootstrap_list`), a pinned protocol level so that a client can be
built with no broker up (:data:`API_VERSION`), request timeouts, and the TLS and SASL settings of a
:class:`~common.kafka_security.KafkaSecurity`.  Importing it changes nothing: a client built with a
``client_id`` is named to :mod:`common.kafka_refusals`, which keeps it only once its tracking is
installed, and kafka-python's wall-clock "blocking the event loop" warning is logged at DEBUG only
once :func:`demote_slow_step_warnings` is called.  kafka-python is imported only when a client is
built.  ``docs/internals/kafka-clients.md`` has the details and the reasons.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from common import kafka_refusals
from common.kafka_security import KafkaSecurity
from common.options import ConfigError, Converter

if TYPE_CHECKING:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

__all__ = [
    "API_VERSION",
    "BOOTSTRAP",
    "SELECTOR_LOGGER",
    "admin",
    "bootstrap_list",
    "consumer",
    "demote_slow_step_warnings",
    "producer",
]

#: the newest protocol level pinned clients ask for; brokers that know less negotiate down per connection
API_VERSION = (3, 3)
#: the logger of kafka-python 3's I/O loop (kafka/net/selector.py)
SELECTOR_LOGGER = "kafka.net.selector"


class _SlowStepFilter(logging.Filter):
    """Turns kafka-python's wall-clock "Task ... ran for ... blocking the event loop" warning into DEBUG."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.logger = logger

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and "blocking the event loop" in record.getMessage():
            # the logger let it through as a WARNING: pass it on only where DEBUG is wanted, as DEBUG
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.logger.isEnabledFor(logging.DEBUG)
        return True


_filters_lock = threading.Lock()


def demote_slow_step_warnings() -> None:
    """From now on, log kafka-python's "Task ... blocking the event loop" warning at DEBUG in this process.

    The filter goes on the selector's logger itself, whose own records pass through it; a second call adds
    none.  The node's Kafka link, the job's driver and the local stack's command lines call it as they start.
    """
    logger = logging.getLogger(SELECTOR_LOGGER)
    with _filters_lock:
        if not any(isinstance(f, _SlowStepFilter) for f in logger.filters):
            logger.addFilter(_SlowStepFilter(logger))


_BOOTSTRAP_EXPECTED = "host:port[,host:port...] list"


def _entries(servers: str | Sequence[str]) -> list[str]:
    """The entries of a bootstrap list; ``ValueError`` naming the first bad one."""
    raw = servers.split(",") if isinstance(servers, str) else list(servers)
    entries = [entry.strip() for entry in raw if entry.strip()]
    if not entries:
        raise ValueError("names no server")
    for entry in entries:
        host, sep, port = entry.rpartition(":")
        if sep and (not host or not port.isdigit() or not 0 < int(port) < 65536):
            raise ValueError(f"bad entry {entry!r}")
    return entries


def bootstrap_list(servers: str | Sequence[str], key: str) -> list[str]:
    """The entries of ``servers``, stripped, empties dropped; :class:`ConfigError` naming ``key`` if unusable."""
    try:
        return _entries(servers)
    except ValueError as exc:
        shown = servers if isinstance(servers, str) else ",".join(servers)
        raise ConfigError(f"{key}={shown!r} is not a valid {_BOOTSTRAP_EXPECTED}: {exc}") from None


#: for option tables: the list, checked and normalised to ``host:port,host:port``
BOOTSTRAP: Converter[str] = Converter(lambda raw: ",".join(_entries(raw)), _BOOTSTRAP_EXPECTED)


# --------------------------------------------------------------------------- building clients

_PLAINTEXT = KafkaSecurity()


def _config(
    servers: str | Sequence[str],
    key: str,
    pinned: bool,
    timeout_ms: int | None,
    config: dict[str, Any],
    security: KafkaSecurity | None = None,
) -> dict[str, Any]:
    """A client's kafka-python keyword arguments: the shared ones, then ``config`` on top; no side effect."""
    out: dict[str, Any] = {"bootstrap_servers": bootstrap_list(servers, key)}
    if pinned:
        out["api_version"] = API_VERSION
    if timeout_ms is not None:
        out["request_timeout_ms"] = timeout_ms
    out.update((security or _PLAINTEXT).client_config())
    out.update(config)  # the caller's own settings win
    return out


def _tracked(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs``, their client id named to the refusal tracking, so that its refusals are known by its
    bootstrap list (kept only once :func:`common.kafka_refusals.install_refusal_tracking` ran)."""
    if isinstance(kwargs.get("client_id"), str):
        kafka_refusals.track_client(kwargs["client_id"], kwargs["bootstrap_servers"])
    return kwargs


def producer(
    servers: str | Sequence[str],
    *,
    key: str = "bootstrap servers",
    pinned: bool = False,
    timeout_ms: int | None = None,
    security: KafkaSecurity | None = None,
    **config: Any,
) -> KafkaProducer:
    """A ``KafkaProducer`` for ``servers`` (read from setting ``key``) with ``config`` on top."""
    from kafka import KafkaProducer

    return KafkaProducer(**_tracked(_config(servers, key, pinned, timeout_ms, config, security)))


def consumer(
    servers: str | Sequence[str],
    *,
    key: str = "bootstrap servers",
    pinned: bool = False,
    timeout_ms: int | None = None,
    security: KafkaSecurity | None = None,
    **config: Any,
) -> KafkaConsumer:
    """A ``KafkaConsumer`` for ``servers``; it joins no group unless ``config`` names one."""
    from kafka import KafkaConsumer

    kwargs = _config(servers, key, pinned, timeout_ms, config, security)
    return KafkaConsumer(**_tracked({"group_id": None, "enable_auto_commit": False, **kwargs}))


def admin(
    servers: str | Sequence[str],
    *,
    key: str = "bootstrap servers",
    pinned: bool = False,
    timeout_ms: int | None = None,
    security: KafkaSecurity | None = None,
    **config: Any,
) -> KafkaAdminClient:
    """A ``KafkaAdminClient`` for ``servers``; ``timeout_ms`` bounds its bootstrap too."""
    from kafka.admin import KafkaAdminClient

    if timeout_ms is not None:
        config.setdefault("bootstrap_timeout_ms", timeout_ms)
    return KafkaAdminClient(**_tracked(_config(servers, key, pinned, timeout_ms, config, security)))
