"""Every Kafka client the project builds (producers, consumers, admin clients), from settings.

Theory of operation
-------------------
Callers pass what is theirs to decide (acks, batching, client id, offsets policy) as kafka-python
keyword arguments; this module adds what every client shares, so it is decided once:

* **The bootstrap list.**  A comma-separated ``host[:port]`` text (or a list of entries): blanks
  around entries are stripped and empty entries dropped; no entry at all, or an entry whose port is
  not 1..65535, is a :class:`~namesrv.options.ConfigError` naming the setting it came from
  (:func:`bootstrap_list`; :data:`BOOTSTRAP` is the same check as an option-table converter).
* **The pinned protocol level.**  With ``pinned=True`` the client gets :data:`API_VERSION` (a cap;
  connections still negotiate down).  Without it kafka-python's constructor blocks to probe the
  broker and raises when none answers; with it, building the client needs no broker, and
  connecting and reconnecting are the library's business.  The node's clients are pinned (a node
  starts whether or not Kafka is up); the job's publisher is not, because it waits for Kafka by
  retrying the constructor until it succeeds.
* **Timeouts.**  ``timeout_ms`` bounds each request; an admin client's bootstrap gets the same
  bound, since its constructor otherwise waits the library's 30 s for a broker to answer.

* **One false alarm silenced.**  kafka-python 3 runs each client's I/O on a thread of its own and
  warns (logger ``kafka.net.selector``) "Task ... ran for 0.15s ... It is blocking the event loop"
  when one step of it takes over 0.1 s of *wall-clock* time.  On a loaded machine (two cores, Spark
  starting, a node holding the GIL) the thread is simply off the CPU or waiting for the GIL: measured
  here, 0.115 s of wall time held 0.022 s of the thread's CPU.  The threshold cannot be set through
  the clients' settings, so :class:`_SlowStepFilter` logs that one message at DEBUG instead; every
  other kafka-python warning is unchanged, and a real stall still shows as request timeouts.

kafka-python is imported only when a client is built: a node without Kafka never imports it, and
the Kafka source (``streaming/kafka_io.py``) imports this module inside Spark's Python workers, so
nothing here may import more than the standard library and :mod:`namesrv.options`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from namesrv.options import ConfigError, Converter

if TYPE_CHECKING:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

__all__ = ["API_VERSION", "BOOTSTRAP", "bootstrap_list", "producer", "consumer", "admin"]

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


# on the logger itself (its own records pass through it), in every process that builds a client
_selector_log = logging.getLogger(SELECTOR_LOGGER)
_selector_log.addFilter(_SlowStepFilter(_selector_log))
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


def _config(
    servers: str | Sequence[str], key: str, pinned: bool, timeout_ms: int | None, config: dict[str, Any]
) -> dict[str, Any]:
    out: dict[str, Any] = {"bootstrap_servers": bootstrap_list(servers, key)}
    if pinned:
        out["api_version"] = API_VERSION
    if timeout_ms is not None:
        out["request_timeout_ms"] = timeout_ms
    out.update(config)  # the caller's own settings win
    return out


def producer(
    servers: str | Sequence[str],
    *,
    key: str = "bootstrap servers",
    pinned: bool = False,
    timeout_ms: int | None = None,
    **config: Any,
) -> KafkaProducer:
    """A ``KafkaProducer`` for ``servers`` (read from setting ``key``) with ``config`` on top."""
    from kafka import KafkaProducer

    return KafkaProducer(**_config(servers, key, pinned, timeout_ms, config))


def consumer(
    servers: str | Sequence[str],
    *,
    key: str = "bootstrap servers",
    pinned: bool = False,
    timeout_ms: int | None = None,
    **config: Any,
) -> KafkaConsumer:
    """A ``KafkaConsumer`` for ``servers``; it joins no group unless ``config`` names one."""
    from kafka import KafkaConsumer

    return KafkaConsumer(
        **{"group_id": None, "enable_auto_commit": False, **_config(servers, key, pinned, timeout_ms, config)}
    )


def admin(
    servers: str | Sequence[str],
    *,
    key: str = "bootstrap servers",
    pinned: bool = False,
    timeout_ms: int | None = None,
    **config: Any,
) -> KafkaAdminClient:
    """A ``KafkaAdminClient`` for ``servers``; ``timeout_ms`` bounds its bootstrap too."""
    from kafka.admin import KafkaAdminClient

    if timeout_ms is not None:
        config.setdefault("bootstrap_timeout_ms", timeout_ms)
    return KafkaAdminClient(**_config(servers, key, pinned, timeout_ms, config))
