"""Apache Kafka for a test module, fresh topics for each test, and small readers/writers for event and action topics."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common import kafka_clients
from common.contract import Action, Event, decode_event, encode_action
from infra.config import TopicSpec
from infra.kafka import KafkaService
from infra.processes import free_port
from tests.support.wait import wait_until

#: settings of the tests' clients (common.kafka_clients): pinned, like the node's, and quick to give up
CLIENT = dict(pinned=True, timeout_ms=5000, reconnect_backoff_max_ms=500)
_topic_numbers = itertools.count(1)


@contextmanager
def kafka_broker(run_dir: Path, topics: Mapping[str, int] | None = None, **options: Any) -> Iterator[KafkaService]:
    """Apache Kafka (one KRaft node) on free loopback ports with ``topics`` (name -> partitions); stopped by PID.

    It starts in seconds and holds ~350 MB, so a module starts one and its tests take fresh topics
    (:func:`fresh_topics`). ``options`` go to :class:`KafkaService` (listener, broker_properties,
    format_args, security).
    """
    service = KafkaService(
        port=free_port(), run_dir=run_dir, topics=[TopicSpec(name, n) for name, n in (topics or {}).items()], **options
    )
    service.start()
    try:
        yield service
    finally:
        service.stop()


def fresh_topics(kafka: KafkaService, **partitions: int) -> dict[str, str]:
    """New topics on ``kafka``, one per keyword (its partition count); returns keyword -> topic name."""
    n = next(_topic_numbers)
    names = {key: f"{key}-{n}" for key in partitions}
    kafka.ensure_topics([TopicSpec(names[key], count) for key, count in partitions.items()])
    return names


class TopicReader:
    """Reads every partition of a topic from its beginning, keeping what it has read."""

    def __init__(self, bootstrap: str, topic: str, security: kafka_clients.KafkaSecurity | None = None) -> None:
        # no group: kafka-python assigns itself every partition; with no committed offset it starts at the earliest
        self.consumer = kafka_clients.consumer(
            bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100, security=security, **CLIENT
        )
        self.consumer.subscribe([topic])
        self.topic = topic
        self.records: list = []

    def poll(self) -> list:
        got = [r for batch in self.consumer.poll(timeout_ms=100).values() for r in batch]
        self.records.extend(got)
        return got

    def wait_for(self, predicate: Callable[[list], bool], timeout: float = 15.0, what: str = "records") -> list:
        """Poll until ``predicate(all records so far)`` holds; fail after ``timeout`` seconds."""
        # each poll waits up to 100 ms for records itself (the broker holds the fetch): no pause between them
        wait_until(
            lambda: predicate(self.records) or (self.poll() and False),
            timeout,
            what,
            0,
            state=lambda: f"{len(self.records)} record(s)",
        )
        return self.records

    def close(self) -> None:
        self.consumer.close()


class EventReader(TopicReader):
    def events(self) -> list[Event]:
        return [decode_event(r.value) for r in self.records]

    def wait_for_events(
        self, predicate: Callable[[Event], bool], count: int = 1, timeout: float = 15.0, what: str = "events"
    ) -> list[Event]:
        """The events matching ``predicate`` once there are at least ``count`` of them."""
        self.wait_for(lambda rs: sum(1 for r in rs if predicate(decode_event(r.value))) >= count, timeout, what)
        return [e for e in self.events() if predicate(e)]


def publish_actions(
    bootstrap: str, topic: str, *actions: Action, security: kafka_clients.KafkaSecurity | None = None
) -> None:
    producer = kafka_clients.producer(bootstrap, acks="all", enable_idempotence=False, security=security, **CLIENT)
    try:
        for action in actions:
            producer.send(topic, key=(action.broker_addr or action.monitor).encode(), value=encode_action(action))
        producer.flush(10)
    finally:
        producer.close(5)
