"""Kafka with SASL against the local Kafka-protocol broker: the node's producer and consumer, the job's
source and publisher; and a node whose security the broker does not offer.

What the local brokers support (found by trying them; the README's Security section says the same):

* noida-db 0.2.3 answers SaslHandshake offering only PLAIN and accepts any user and password (it does
  not check them, and it serves clients without SASL too); SCRAM is refused
  (UnsupportedSaslMechanismError) and TLS is not spoken at all (the handshake ends in EOF).
* Tansu 0.6.0 checks SCRAM credentials with ``--authentication``, but its users can only be created
  over an authenticated connection on memory storage, and its ``--cert``/``--key`` options cannot be
  given together, so neither can be started here with SASL or TLS that works.

So SASL PLAIN is tested end to end against noida-db, with a spy on kafka-python's SASL mechanism
factory proving each client ran the exchange with our user; SCRAM and TLS are tested as a node
configured with them against that broker: it keeps serving and says, within seconds, which security
settings the broker may not accept.  The mapping of every key is unit-tested
(tests/unit/test_kafka_security.py).
"""

from __future__ import annotations

import logging
import time

import kafka.net.connection
import pytest

from namesrv.client import NameServerClient
from namesrv.events.schema import EventType
from namesrv.kafka_clients import KafkaSecurity
from namesrv.protocol.codes import RequestCode, ResponseCode
from streaming.kafka_io import KafkaInputPartition, KafkaOptions, read_range
from tests.support.brokers import register_broker
from tests.support.kafka import EventReader, kafka_broker
from tests.support.node import running_node
from tests.support.tls import make_certificates
from tests.support.wait import wait_until

EVENTS, ACTIONS, SOURCE = "namesrv-events", "namesrv-actions", "auth-source"
USER, PASSWORD_ENV = "node-a", "NAMESRV_TEST_KAFKA_PASSWORD"
PASSWORD = "kafka-secret-7"


@pytest.fixture(scope="module")
def noida(tmp_path_factory: pytest.TempPathFactory):
    with kafka_broker("noida", tmp_path_factory.mktemp("kafka"), {EVENTS: 2, ACTIONS: 1, SOURCE: 1}) as service:
        yield service


@pytest.fixture
def sasl_exchanges(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """(mechanism, user) of every SASL exchange kafka-python starts in this process."""
    seen: list[tuple[str, str | None]] = []
    real = kafka.net.connection.get_sasl_mechanism

    def spy(name: str):
        mechanism = real(name)

        def make(**config):
            seen.append((name, config.get("sasl_plain_username")))
            return mechanism(**config)

        return make

    monkeypatch.setattr(kafka.net.connection, "get_sasl_mechanism", spy)
    return seen


def sasl_plain() -> KafkaSecurity:
    return KafkaSecurity.from_settings(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": USER,
            "sasl.password": PASSWORD,
        }
    )


def test_node_publishes_events_and_reads_actions_over_sasl_plain(noida, tmp_path, monkeypatch, sasl_exchanges):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    props = {
        "kafkaBootstrapServers": noida.bootstrap_servers, "eventsTopic": EVENTS, "actionsTopic": ACTIONS,
        "nodeName": "auth-node", "tickIntervalMillis": "300",
        "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.username": USER, "kafka.sasl.password": f"${{env:{PASSWORD_ENV}}}",
    }  # fmt: skip
    reader = EventReader(noida.bootstrap_servers, EVENTS, security=sasl_plain())
    try:
        with running_node(tmp_path, **props) as node, NameServerClient(node.addr) as client:
            link = node.running.kafka
            assert link is not None and link.consumer is not None
            # the action consumer read the topic's partitions and end offsets: over SASL
            wait_until(link.consumer.ready.is_set, 20, "the action consumer to be ready")
            register_broker(client, broker_name="broker-sasl", broker_addr="127.0.0.1:10999", topics=["TopicS"])
            events = reader.wait_for_events(
                lambda e: e.type is EventType.REGISTER and e.broker_name == "broker-sasl", what="the registration"
            )
            assert events[0].node == "auth-node"
    finally:
        reader.close()
    # every connection of the node's admin, consumer and producer (and the test's reader) authenticated as USER
    assert sasl_exchanges and set(sasl_exchanges) == {("PLAIN", USER)}


def test_job_source_and_publisher_read_and_write_over_sasl_plain(noida, sasl_exchanges):
    from streaming.job import KafkaPublisher

    security = sasl_plain()
    publisher = KafkaPublisher.connect(noida.bootstrap_servers, security=security)
    assert publisher is not None
    try:
        for i in range(5):
            publisher.send(SOURCE, b"k", f"v{i}".encode())
        publisher.flush(10)
    finally:
        publisher.close()
    # the options the job hands format("namesrv-kafka"), as Spark passes them (lower-cased), with a JAAS line
    options = {
        "kafka.bootstrap.servers": noida.bootstrap_servers, "subscribe": SOURCE,
        "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                  f'username="{USER}" password="{PASSWORD}";',
    }  # fmt: skip
    opts = KafkaOptions.from_options(options)
    assert opts.security == security and PASSWORD not in repr(opts)
    batches = list(read_range(opts, KafkaInputPartition(SOURCE, 0, 0, 5)))
    values = [v for batch in batches for v in batch.column("value").to_pylist()]
    assert values == [f"v{i}".encode() for i in range(5)]
    assert sasl_exchanges and set(sasl_exchanges) == {("PLAIN", USER)}


@pytest.mark.parametrize("security", ["SCRAM-SHA-256", "SSL"])
def test_a_node_whose_security_the_broker_lacks_says_so_and_keeps_serving(noida, tmp_path, caplog, security):
    props = {"kafkaBootstrapServers": noida.bootstrap_servers, "eventsTopic": EVENTS, "actionsTopic": ACTIONS}
    if security == "SSL":
        pki = make_certificates(tmp_path / "pki")
        props |= {"kafka.security.protocol": "SSL", "kafka.ssl.cafile": str(pki.ca)}
    else:
        props |= {
            "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": security,
            "kafka.sasl.username": USER, "kafka.sasl.password": PASSWORD,
        }  # fmt: skip
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, "namesrv.events"),
        running_node(tmp_path, **props) as node,
        NameServerClient(node.addr) as client,
    ):
        # the node serves at once, whatever Kafka does
        register_broker(client, broker_name="broker-x", broker_addr="127.0.0.1:10998", topics=["TopicX"])
        route = client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicX"})
        assert route.code == ResponseCode.SUCCESS
        # and says, once and soon, what to check: the request timeout (5 s) plus scheduling
        wait_until(lambda: "cannot read the partitions of the actions topic" in caplog.text, 20, "the warning")
        assert time.monotonic() - started < 20
    warning = next(r.getMessage() for r in caplog.records if "actions topic" in r.getMessage())
    expected = f"sasl.mechanism={security}" if security != "SSL" else "security.protocol=SSL"
    assert expected in warning and "refuses the credentials or certificate" in warning
    assert PASSWORD not in caplog.text
    assert sum("cannot read the partitions" in r.getMessage() for r in caplog.records) == 1
