"""The driver's Kafka producer for the monitor's actions and alerts (:class:`KafkaPublisher`).

It is built once per run, when Kafka first answers: the job may start before Kafka does, so
:meth:`KafkaPublisher.connect` waits with back-off and says once what it is waiting for. A broker
that refuses the job's credentials or certificate will not change its mind, so that ends the wait
with :class:`KafkaLoginRefused`, quoting the broker's own reason and the settings to fix; the
reason is read as the node reads it (:mod:`common.kafka_refusals`).

A batch sends its records, then :meth:`KafkaPublisher.flush` waits for them: a record Kafka refuses
as too large is skipped and counted (replaying the batch would not make it smaller), any other
refusal fails the batch, which Spark then replays.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from common import kafka_clients, kafka_refusals
from common.kafka_security import KafkaSecurity
from common.retrying import retry_until_stopped
from streaming.config import ConfigError

if TYPE_CHECKING:
    from kafka import KafkaProducer

log = logging.getLogger(__name__)

#: one attempt to reach Kafka at start-up; short, so a stop request is answered within it
BOOTSTRAP_ATTEMPT_MS = 5_000
#: names the publisher's connections, so that a broker's refusal of them is kept (common.kafka_refusals)
CLIENT_ID = "namesrv-monitor"
#: how long a request may go unanswered before it is sent again: a leader that stops answering (a frozen
#: process, a hung host) keeps our connection open, and kafka-python's 30 s default held every action and
#: MONITOR_HEARTBEAT (and the batch flushing them) that long behind it, though Kafka moves the leadership
#: after broker.session.timeout.ms (9 s); idempotence makes the resend harmless
#: (tests/integration/test_kafka_replicated.py, the actions' leader frozen)
REQUEST_TIMEOUT_MS = 5_000


class KafkaLoginRefused(ConfigError):
    """Kafka answers but refuses the job's SASL login or TLS handshake: waiting will not help."""


class KafkaPublisher:
    """The driver's producer for actions and alerts; ``flush`` raises if the broker refused any."""

    def __init__(self, producer: KafkaProducer) -> None:
        self.producer = producer
        self._errors: list[BaseException] = []
        #: records skipped because Kafka refused them as too large
        self.refused = 0

    @classmethod
    def connect(
        cls,
        bootstrap_servers: str,
        stopping: threading.Event | None = None,
        security: KafkaSecurity | None = None,
    ) -> KafkaPublisher | None:
        """A publisher once Kafka answers, retrying with back-off meanwhile; None if ``stopping`` is set first.

        With TLS or SASL, a failed attempt whose connection the broker refused (credentials,
        mechanism, certificate) raises :class:`KafkaLoginRefused` instead of waiting on.
        """
        from kafka.errors import KafkaError

        security = security or KafkaSecurity()
        started = time.monotonic()

        def producer() -> KafkaProducer:
            # not pinned (common.kafka_clients): the constructor raises while Kafka does not answer,
            # which is how this waits for it
            try:
                return kafka_clients.producer(
                    bootstrap_servers,
                    key="kafka.bootstrap",
                    timeout_ms=REQUEST_TIMEOUT_MS,
                    security=security,
                    client_id=CLIENT_ID,
                    # an action or alert flushed is one Kafka keeps while one replica is lost (acks=all), and
                    # a retry across a leader change neither repeats nor reorders it (idempotence), as the
                    # nodes' events: namesrv.events.publisher.kafka_producer says why each
                    acks="all",
                    enable_idempotence=True,
                    linger_ms=2,
                    bootstrap_timeout_ms=BOOTSTRAP_ATTEMPT_MS,
                )
            except KafkaError:
                refused = kafka_refusals.last_refusal(bootstrap_servers, since=started)
                if refused is not None and security.protocol != "PLAINTEXT":
                    raise KafkaLoginRefused(
                        f"Kafka at {bootstrap_servers} refuses the job's credentials" + security.failure_hint(refused)
                    ) from None
                raise

        made = retry_until_stopped(
            producer,
            stopping or threading.Event(),
            log=log,
            retry_on=KafkaError,
            first_wait_s=0.5,
            max_wait_s=10.0,
            problem=lambda: f"Kafka at {bootstrap_servers} does not answer yet: is it up, and is kafka.bootstrap "
            "right?" + security.failure_hint(kafka_refusals.last_refusal(bootstrap_servers, since=started)),
        )
        return None if made is None else cls(made)

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        from kafka.errors import MessageSizeTooLargeError

        try:
            future = self.producer.send(topic, key=key, value=value)
        except MessageSizeTooLargeError as exc:
            # our records are bounded (schema, cut messages); should one still be too big, it is
            # this record's problem: skipping it must not stop the query and replay it forever
            self.refused += 1
            log.error("kafka: a %d-byte record for %s is too large and was skipped: %s", len(value), topic, exc)
            return
        future.add_errback(self._errors.append)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait for what was sent; record-size refusals are counted and logged, anything else raises."""
        from kafka.errors import MessageSizeTooLargeError, RecordListTooLargeError

        self.producer.flush(timeout=timeout_s)
        errors, self._errors = self._errors, []
        too_big = [e for e in errors if isinstance(e, MessageSizeTooLargeError | RecordListTooLargeError)]
        if too_big:
            self.refused += len(too_big)
            log.error("kafka refused %d record(s) of the monitor as too large (skipped): %r", len(too_big), too_big[0])
        others = [e for e in errors if e not in too_big]
        if others:
            raise RuntimeError(f"kafka refused {len(others)} record(s) from the monitor: {others[0]!r}")

    def close(self) -> None:
        self.producer.close()
