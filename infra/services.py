"""``python -m infra.services start|stop|status|topics``: the local Apache Kafka and Redis by hand.

``make run``'s stack (:mod:`infra.stack`) starts them itself; this starts, stops or shows them alone, from
``conf/services.properties`` (:mod:`infra.config`): Kafka as one KRaft node (:mod:`infra.kafka`) or a
cluster of N, Redis (:mod:`infra.redis`).  ``topics`` creates ``kafka.topics`` on any Kafka, a real cluster
too.  ``docs/internals/local-stack.md`` has more.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from common import kafka_clients
from common.options import ConfigError
from infra.config import DEFAULT_CONFIG_PATH, RedisBackend, ServicesConfig, format_topics, load_config
from infra.kafka import KafkaCluster, KafkaService, ensure_topics
from infra.processes import ServiceError
from infra.redis import RedisService

Service = KafkaService | KafkaCluster | RedisService


def services_from_config(
    config: ServicesConfig, only: Iterable[str] | None = None, kafka_nodes: int = 1
) -> list[Service]:
    """The services named in ``only`` (default: all), Kafka first: one node, or a cluster of ``kafka_nodes``."""
    chosen = set(only) if only else {"kafka", "redis"}
    services: list[Service] = []
    if "kafka" in chosen:
        services.append(
            KafkaService.from_config(config) if kafka_nodes == 1 else KafkaCluster.from_config(config, kafka_nodes)
        )
    if "redis" in chosen:
        services.append(RedisService.from_config(config))
    return services


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m infra.services",
        description="Start, stop or inspect the local Apache Kafka and Redis; "
        "`topics` creates kafka.topics on any Kafka (e.g. a real cluster).",
    )
    parser.add_argument("action", choices=("start", "stop", "status", "topics"))
    parser.add_argument("--only", choices=("kafka", "redis"), help="act on one service only")
    parser.add_argument(
        "--kafka-nodes", type=int, default=1, choices=range(1, 10), metavar="N",
        help="start|stop|status: Kafka as N KRaft nodes on kafka.port and kafka.controllerPort + 0, 2, 4 ..., "
        "topics on N replicas (default 1: one node)",
    )  # fmt: skip
    parser.add_argument("--redis-backend", choices=[b.value for b in RedisBackend])
    parser.add_argument(
        "-c", "--config", type=Path, default=None,
        help=f"services properties file (default: {DEFAULT_CONFIG_PATH} if present)",
    )  # fmt: skip
    parser.add_argument(
        "--bootstrap", metavar="HOST:PORT[,...]",
        help="topics: the Kafka to create them on (default: the local broker of kafka.port)",
    )  # fmt: skip
    parser.add_argument("--replication-factor", type=int, default=1, help="topics: default 1")
    parser.add_argument(
        "--min-insync-replicas", type=int, default=None, metavar="N",
        help="topics: the topics' min.insync.replicas (default: the brokers' own)",
    )  # fmt: skip
    parser.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS",
        help="topics: keep retrying this long while the broker is not reachable yet",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done")
    return parser


def _create_topics_cli(config: ServicesConfig, args: argparse.Namespace) -> str:
    from kafka.errors import KafkaError

    bootstrap = args.bootstrap or config.kafka_bootstrap
    deadline = time.monotonic() + args.wait
    while True:
        try:
            created = ensure_topics(
                bootstrap, config.kafka_topics, replication_factor=args.replication_factor,
                configs={} if args.min_insync_replicas is None else {"min.insync.replicas": str(args.min_insync_replicas)},
            )  # fmt: skip
            break
        except KafkaError as exc:
            if time.monotonic() >= deadline:
                raise ServiceError(f"kafka: cannot create topics on {bootstrap}: {exc!r}") from exc
            time.sleep(1.0)
    return " ".join(
        [
            "topics",
            f"bootstrap={bootstrap}",
            f"topics={format_topics(config.kafka_topics)}",
            f"created={','.join(created) or '-'}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # kafka-python narrates every connection at INFO; keep -v about what we do.
    logging.getLogger("kafka").setLevel(logging.WARNING)
    kafka_clients.demote_slow_step_warnings()
    try:
        config = load_config(args.config)
        if args.redis_backend:
            config = replace(config, redis_backend=RedisBackend(args.redis_backend))
        if args.action == "topics":
            print(_create_topics_cli(config, args), flush=True)
            return 0
        services = services_from_config(config, [args.only] if args.only else None, args.kafka_nodes)
    except (ConfigError, ServiceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1

    failed = False
    for service in services:
        try:
            if args.action == "start":
                status = service.start()
            elif args.action == "stop":
                service.stop()
                status = service.status()
            else:
                status = service.status()
        except ServiceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
            continue
        for each in status if isinstance(status, list) else [status]:  # a cluster: one line per node
            print(each.line(), flush=True)
            if args.action == "status" and not each.running:
                failed = True
    if failed:
        # LSB's "not running" for status; a plain failure otherwise.
        return 3 if args.action == "status" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
