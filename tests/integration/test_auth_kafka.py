"""The node's Kafka clients over SASL and TLS, against Apache Kafka, which checks what they present.

Two Kafka nodes, each started once: ``sasl_kafka`` (a SASL_PLAINTEXT listener offering PLAIN and
SCRAM-SHA-256/512) and ``tls_kafka`` (an SSL listener requiring a client certificate from the test
CA).  A node publishes its events and applies the monitor's actions over each mechanism and over
TLS; a node with a wrong password, a certificate from another CA, or a security the broker does not
offer is refused and says so in one warning, in the broker's (or OpenSSL's) words, naming the
setting to fix and never the password, and keeps serving.  The mapping of every key is unit-tested
(tests/unit/test_kafka_security.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common import kafka_clients
from common.contract import Action, ActionType, EventType
from common.kafka_security import KafkaSecurity
from infra.kafka import KafkaService
from namesrv.client import NameServerClient
from tests.support.brokers import register_broker
from tests.support.kafka import CLIENT, EventReader, fresh_topics, kafka_broker, publish_actions
from tests.support.node import running_node
from tests.support.process import node_process
from tests.support.tls import Certificates, make_certificates
from tests.support.wait import wait_until

PASSWORD_ENV = "NAMESRV_TEST_KAFKA_PASSWORD"
#: mechanism -> (user, password) the broker knows
USERS = {
    "PLAIN": ("node-plain", "plain-secret-7"),
    "SCRAM-SHA-256": ("node-256", "scram-256-secret"),
    "SCRAM-SHA-512": ("node-512", "scram-512-secret"),
}
ADMIN = ("admin", "admin-secret-3")
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
#: what the node says when no broker completes a connection with the security it was given, and it
#: does not know why (when it does, it says why instead)
REFUSED = "this is also what a broker looks like that does not offer that protocol or mechanism or refuses"
#: what Apache Kafka answers a SaslAuthenticate with wrong credentials, per mechanism
LOGIN_REFUSED = {
    "PLAIN": "Authentication failed: Invalid username or password",
    "SCRAM-SHA-256": "Authentication failed during authentication due to invalid credentials with SASL mechanism "
    "SCRAM-SHA-256",
}


def sasl(mechanism: str, user: str, password: str) -> KafkaSecurity:
    return KafkaSecurity.from_settings(
        {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism, "sasl.username": user,
         "sasl.password": password}
    )  # fmt: skip


def tls(pki: Certificates, *, stranger: bool = False) -> KafkaSecurity:
    cert, key = (pki.stranger_cert, pki.stranger_key) if stranger else (pki.client_cert, pki.client_key)
    return KafkaSecurity.from_settings(
        {"security.protocol": "SSL", "ssl.cafile": str(pki.ca), "ssl.certfile": str(cert), "ssl.keyfile": str(key)}
    )


def node_settings(security: KafkaSecurity) -> dict[str, str]:
    """The node's ``kafka.*`` security keys for ``security``."""
    return security.settings(prefix="kafka.")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaService]:
    plain_users = " ".join(f'user_{u}="{p}"' for u, p in (ADMIN, USERS["PLAIN"]))
    listener = "listener.name.sasl_plaintext"
    with kafka_broker(
        tmp_path_factory.mktemp("sasl-kafka"),
        listener="SASL_PLAINTEXT",
        broker_properties={
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            # the broker's own client (the inter-broker listener is this one) logs in as ADMIN
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            f"{listener}.plain.sasl.jaas.config": (
                f'{PLAIN_MODULE} required username="{ADMIN[0]}" password="{ADMIN[1]}" {plain_users};'
            ),
            f"{listener}.scram-sha-256.sasl.jaas.config": f"{SCRAM_MODULE} required;",
            f"{listener}.scram-sha-512.sasl.jaas.config": f"{SCRAM_MODULE} required;",
        },
        format_args=[
            arg
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
            for arg in ("--add-scram", f"{mechanism}=[name={USERS[mechanism][0]},password={USERS[mechanism][1]}]")
        ],
        security=sasl("PLAIN", *ADMIN),
    ) as service:
        yield service


@pytest.fixture(scope="module")
def tls_kafka(tmp_path_factory: pytest.TempPathFactory, pki: Certificates) -> Iterator[KafkaService]:
    run = tmp_path_factory.mktemp("tls-kafka")
    # a PEM key store is one file: the private key (PKCS#8) and the certificate chain
    keystore = run / "broker-keystore.pem"
    keystore.write_text(pki.peer_key.read_text() + pki.peer_cert.read_text())
    with kafka_broker(
        run,
        listener="SSL",
        broker_properties={
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(pki.ca),
            "ssl.client.auth": "required",
        },
        security=tls(pki),
    ) as service:
        yield service


# --------------------------------------------------------------------------- what works


@pytest.mark.parametrize("how", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "SSL"])
def test_node_publishes_events_and_applies_actions_over_sasl_and_tls(request, tmp_path, monkeypatch, how):
    if how == "SSL":
        kafka, security = request.getfixturevalue("tls_kafka"), tls(request.getfixturevalue("pki"))
    else:
        kafka, security = request.getfixturevalue("sasl_kafka"), sasl(how, *USERS[how])
    topics = fresh_topics(kafka, events=2, actions=1)
    settings = node_settings(security)
    if security.sasl:  # the password as operators keep it: out of the file
        monkeypatch.setenv(PASSWORD_ENV, USERS[how][1])
        settings["kafka.sasl.password"] = f"${{env:{PASSWORD_ENV}}}"
    props = {
        "kafkaBootstrapServers": kafka.bootstrap_servers, "eventsTopic": topics["events"],
        "actionsTopic": topics["actions"], "nodeName": "auth-node", "tickIntervalMillis": "300", **settings,
    }  # fmt: skip
    reader = EventReader(kafka.bootstrap_servers, topics["events"], security=security)
    try:
        with running_node(tmp_path, **props) as node, NameServerClient(node.addr) as client:
            link = node.running.kafka
            assert link is not None and link.consumer is not None
            wait_until(link.consumer.ready.is_set, 20, "the action consumer at the end of the actions topic")
            register_broker(client, broker_name="broker-sec", broker_addr="127.0.0.1:10999", topics=["TopicS"])
            (registered,) = reader.wait_for_events(
                lambda e: e.type is EventType.REGISTER and e.broker_name == "broker-sec", what="the registration"
            )
            assert registered.node == "auth-node"
            expire = Action(
                ActionType.EXPIRE, "auth-monitor", int(time.time() * 1000), cluster_name=registered.cluster_name,
                broker_addr="127.0.0.1:10999", broker_name="broker-sec", broker_id=0,
                last_heartbeat=registered.event_time, watermark=registered.event_time,
            )  # fmt: skip
            publish_actions(kafka.bootstrap_servers, topics["actions"], expire, security=security)
            wait_until(lambda: link.action_stats().applied == 1, 20, "the EXPIRE read and applied")
            # applied: queued for the node's worker thread, which removes it a moment later
            wait_until(
                lambda: "broker-sec" not in {name for name, b in client.cluster_info()[0].items() if b.broker_addrs},
                10,
                "broker-sec gone from the node",
            )
    finally:
        reader.close()


# --------------------------------------------------------------------------- what is refused


def refused_node(tmp_path: Path, kafka: KafkaService, security: KafkaSecurity):
    """``namesrv start`` with ``security`` against ``kafka``: its own process and log, as operators run it."""
    topics = fresh_topics(kafka, events=1, actions=1)
    props = {
        "kafkaBootstrapServers": kafka.bootstrap_servers, "eventsTopic": topics["events"],
        "actionsTopic": topics["actions"], "nodeName": "refused-node", "tickIntervalMillis": "200",
        **node_settings(security),
    }  # fmt: skip
    return topics, node_process(tmp_path, log_level="INFO", **props)


def says_refused(node, started: float, *wanted: str) -> str:
    """The node's one warning about Kafka, once logged (the request timeout, 5 s, plus start-up); has ``wanted``."""
    said = "cannot read the partitions of the actions topic"
    wait_until(lambda: said in node.log_text(), 20, "the node's warning")
    assert time.monotonic() - started < 20
    (warning,) = [line for line in node.log_text().splitlines() if said in line]
    for text in wanted:
        assert text in warning, warning
    # kafka-python's own lost-connection errors, read for the reason, stay out of an INFO log
    assert "Connection lost" not in node.log_text()
    return warning


def records_in(kafka: KafkaService, topic: str) -> int:
    """How many records ``topic`` holds (read with the broker's admin credentials)."""
    from kafka import TopicPartition

    consumer = kafka_clients.consumer(kafka.bootstrap_servers, security=kafka.security, **CLIENT)
    try:
        partitions = wait_until(lambda: consumer.partitions_for_topic(topic), 10, f"topic {topic}")
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
        return sum(ends.values())
    finally:
        consumer.close()


def serves(node) -> None:
    with NameServerClient(node.addr) as client:
        register_broker(client, broker_name="broker-x", broker_addr="127.0.0.1:10998", topics=["TopicX"])
        assert client.topic_route("TopicX").broker_datas[0].broker_addrs == {0: "127.0.0.1:10998"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_wrong_password_is_refused_and_the_node_says_so(sasl_kafka, tmp_path, mechanism):
    user, password = USERS[mechanism]
    wrong = password + "-not"
    topics, node_cm = refused_node(tmp_path, sasl_kafka, sasl(mechanism, user, wrong))
    started = time.monotonic()
    with node_cm as node:
        serves(node)  # at once, whatever Kafka says
        warning = says_refused(
            node,
            started,
            # the broker's own words, quoted, the login it refused, and what to fix
            f"Kafka refused the login: '{LOGIN_REFUSED[mechanism]}'",
            f"sasl.mechanism={mechanism}",
            f"sasl.username='{user}'",
            "check kafka.sasl.username and kafka.sasl.password",
        )
        assert REFUSED not in warning  # it knows why: no guessing
        # seconds of ticks and a registration, and none of it reached the topic
        assert records_in(sasl_kafka, topics["events"]) == 0
        log = node.log_text()
    assert wrong not in log and password not in log


def test_a_certificate_from_another_ca_is_refused(tls_kafka, pki, tmp_path):
    topics, node_cm = refused_node(tmp_path, tls_kafka, tls(pki, stranger=True))
    started = time.monotonic()
    with node_cm as node:
        serves(node)
        warning = says_refused(
            node,
            started,
            # OpenSSL's name of the broker's alert (Java sends certificate_unknown), and what to fix
            "Kafka refused this client's certificate: '[SSL: ",
            "ALERT_",
            "security.protocol=SSL",
            f"ssl.certfile={pki.stranger_cert}",
            "set kafka.ssl.certfile (and kafka.ssl.keyfile) to a certificate signed by a CA the broker trusts",
        )
        assert REFUSED not in warning
        assert records_in(tls_kafka, topics["events"]) == 0


@pytest.mark.parametrize(
    "case",
    ["TLS to the SASL listener", "SASL to the TLS listener", "plaintext to the SASL listener"],
)
def test_a_node_whose_security_the_broker_does_not_offer_says_so_within_seconds(request, pki, tmp_path, case):
    if case == "TLS to the SASL listener":  # the broker reads the ClientHello as a request and hangs up
        kafka, security = request.getfixturevalue("sasl_kafka"), tls(pki)
        wanted = [
            "Kafka did not complete the TLS handshake: '",
            "security.protocol=SSL",
            "check kafka.security.protocol",
        ]
    elif case == "SASL to the TLS listener":  # the broker answers the first request with a TLS alert
        kafka, security = request.getfixturevalue("tls_kafka"), sasl("SCRAM-SHA-512", *USERS["SCRAM-SHA-512"])
        wanted = [
            "Kafka answers in TLS: 'a TLS alert record where a Kafka response belongs",
            "security.protocol=SASL_PLAINTEXT",
            "sasl.mechanism=SCRAM-SHA-512",
            "set kafka.security.protocol to SSL or SASL_SSL",
        ]
    else:
        kafka, security, wanted = request.getfixturevalue("sasl_kafka"), KafkaSecurity(), []
    _, node_cm = refused_node(tmp_path, kafka, security)
    started = time.monotonic()
    with node_cm as node:
        serves(node)
        warning = says_refused(node, started, *wanted)
    assert REFUSED not in warning  # the reason is known, or (plaintext) there is no security to point at
    if not wanted:  # a SASL listener hangs up on a plaintext client without a word: Kafka looks down
        assert "; Kafka " not in warning
