"""Apache RocketMQ 5.5.0's own broker, Java client and mqadmin against our node with TLS enforced and
signed requests (ACL 1.0) checked.

One world for the module: our node with ``tls.server.mode=enforcing``, client certificates required
and verified against the test CA, and ``aclEnable=true``; a 5.5.0 broker that registers over TLS and
signs its registrations with a broker account; certificates made by ``openssl`` at test time
(:mod:`tests.support.tls`).  The Java side is configured as RocketMQ reads it, with ``-D`` system
properties, and mqadmin signs with the keys of the ``conf/tools.yml`` under its home;
``docs/internals/testing.md`` lists which property does what.
"""

from __future__ import annotations

import logging
import re
import secrets
import ssl
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from namesrv.acl import Credentials
from namesrv.client import NameServerClient
from tests.support.node import REPO, NodeThread, running_node
from tests.support.rocketmq import (
    ROCKETMQ_5,
    JavaBroker,
    client_probe,
    compile_client_probe,
    java_broker,
    mqadmin,
)
from tests.support.tls import Certificates, client_tls, make_certificates, node_tls
from tests.support.wait import wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(600)]

TOPIC = "TlsTopic"
MESSAGES = 20
QUEUES = 2
NAMESPACE, KEY = "TlsAclNamespace", "someKey"
#: RocketMQ 5.5.0's user store in the broker's own RocksDB, under its store directory
LOCAL_USERS = "org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider"


@dataclass
class World:
    base: Path
    certs: Certificates
    node: NodeThread
    broker: JavaBroker
    probe_classes: Path
    admin: Credentials
    broker_account: Credentials
    #: the node's refusals once the broker had registered
    refused_at_start: int

    def java_tls(self, *, cert: bool = True) -> list[str]:
        """The -D options of a Java client that verifies its servers and presents a client certificate."""
        props = [
            "-Dtls.enable=true",
            "-Dtls.test.mode.enable=false",
            "-Dtls.client.authServer=true",
            f"-Dtls.client.trustCertPath={self.certs.ca}",
        ]
        if cert:
            props += [
                f"-Dtls.client.certPath={self.certs.client_cert}",
                f"-Dtls.client.keyPath={self.certs.client_key}",
            ]
        return props

    def tls(self) -> ssl.SSLContext:
        """How this test reaches the node itself: TLS, with a client certificate."""
        return client_tls(self.certs, cert=True)

    def mqadmin(self, *args: str, credentials: Credentials | None = None, tls: bool = True, cert: bool = True):
        keys = None if credentials is None else (credentials.access_key, credentials.secret_key)
        props = self.java_tls(cert=cert) if tls else []
        return mqadmin(ROCKETMQ_5, self.base, *args, system_props=props, credentials=keys)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("tls-acl")
    classes = compile_client_probe(ROCKETMQ_5, base / "probe-classes")  # before the JVMs: two cores
    certs = make_certificates(base / "certs")
    admin = Credentials("adminAccount", secrets.token_urlsafe(18))
    broker_account = Credentials("brokerAccount", secrets.token_urlsafe(18))
    acl = base / "plain_acl.yml"
    acl.write_text(
        "accounts:\n"
        f"  - accessKey: {broker_account.access_key}\n    secretKey: {broker_account.secret_key}\n"
        f"  - accessKey: {admin.access_key}\n    secretKey: {admin.secret_key}\n    admin: true\n"
    )
    node_props = node_tls(
        certs,
        **{
            "tls.server.mode": "enforcing",
            "tls.server.need.client.auth": "require",
            "tls.server.trustCertPath": str(certs.ca),
            "aclEnable": "true",
            "aclFile": str(acl),
        },
    )
    broker_props = [
        "-Dtls.enable=true",
        "-Dtls.test.mode.enable=false",
        # as a server (permissive: TLS and plaintext), a certificate of the test CA
        f"-Dtls.server.certPath={certs.peer_cert}",
        f"-Dtls.server.keyPath={certs.peer_key}",
        # as a client of the name server, verifying it and presenting the same certificate
        "-Dtls.client.authServer=true",
        f"-Dtls.client.trustCertPath={certs.ca}",
        f"-Dtls.client.certPath={certs.peer_cert}",
        f"-Dtls.client.keyPath={certs.peer_key}",
    ]
    signing = f'{{"accessKey":"{broker_account.access_key}","secretKey":"{broker_account.secret_key}"}}'
    with ExitStack() as stack:
        (base / "node").mkdir()
        node = stack.enter_context(running_node(base / "node", **node_props))
        broker = stack.enter_context(
            java_broker(
                ROCKETMQ_5,
                base,
                [node.addr],
                cluster="TlsCluster",
                extra={
                    "innerClientAuthenticationCredentials": signing,
                    # 5.5.0 also keeps that account as a user of its own, and will not start without a
                    # store for users (authenticationEnabled stays false: the broker checks nobody)
                    "authenticationMetadataProvider": LOCAL_USERS,
                },
                system_props=broker_props,
                namesrv_tls=client_tls(certs, cert=True),
            )
        )
        refused = node.call(lambda: node.running.context.acl.refused)
        yield World(base, certs, node, broker, classes, admin, broker_account, refused)


def refusal(done) -> str:
    """What mqadmin printed about a refused request (it exits 0 whatever happened)."""
    return done.stdout + done.stderr


# --------------------------------------------------------------------------- TLS


def test_the_broker_registers_over_tls_and_signs_what_it_sends(world):
    with NameServerClient(world.node.addr, tls=world.tls()) as c:
        info = c.cluster_info()
        route = c.topic_route(world.broker.cluster)  # the topic every broker has named after its cluster
    assert info.cluster_addr_table == {"TlsCluster": ["broker-a"]}
    assert info.broker_addr_table["broker-a"].broker_addrs == {0: world.broker.addr}
    assert [b.broker_addrs for b in route.broker_datas] == [{0: world.broker.addr}]
    # every registration carried a valid signature of the broker account: none was refused
    assert world.refused_at_start == 0


def test_java_producer_and_consumer_over_tls_through_our_node(world):
    broker = world.broker
    done = world.mqadmin("updateTopic", "-n", world.node.addr, "-c", broker.cluster, "-t", TOPIC,
                         "-r", str(QUEUES), "-w", str(QUEUES))  # fmt: skip
    assert f"create topic to {broker.addr} success" in done.stdout, refusal(done)

    def queues() -> list[tuple[str, int, int]]:
        with NameServerClient(world.node.addr, tls=world.tls()) as c:
            if TOPIC not in c.topic_list():
                return []
            return [(q.broker_name, q.read_queue_nums, q.write_queue_nums) for q in c.topic_route(TOPIC).queue_datas]

    # the broker registers the new topic with the node (signed, over TLS) right after creating it
    wait_until(lambda: queues() == [("broker-a", QUEUES, QUEUES)], 30, f"{TOPIC} in our node's routes", state=queues)

    common = ("--namesrv", world.node.addr, "--topic", TOPIC, "--count", str(MESSAGES))
    code, sent = client_probe(ROCKETMQ_5, world.probe_classes, world.base, "produce", *common,
                              system_props=world.java_tls())  # fmt: skip
    assert code == 0 and sent["ok"], sent
    assert {(s["broker"], s["queue"]) for s in sent["sent"]} == {("broker-a", q) for q in range(QUEUES)}
    code, got = client_probe(ROCKETMQ_5, world.probe_classes, world.base, "consume", *common, "--timeout-ms", "60000",
                             system_props=world.java_tls())  # fmt: skip
    assert code == 0 and got["ok"], got
    assert sorted(got["bodies"]) == sorted(s["body"] for s in sent["sent"])


def test_mqadmin_reads_the_cluster_over_tls_unsigned(world):
    """Reads stay open with ACL on (aclCheckReads=false): no tools.yml, still answered."""
    done = world.mqadmin("topicRoute", "-n", world.node.addr, "-t", world.broker.cluster)
    assert world.broker.addr in done.stdout, refusal(done)
    assert '"brokerName":"broker-a"' in done.stdout, done.stdout


def sent_nowhere(done, addr: str) -> bool:
    """mqadmin's request never got an answer: the node closed the connection instead."""
    return f"RemotingSendRequestException: send request to </{addr}> failed" in refusal(done)


def node_said(caplog, *words: str) -> list[str]:
    return [m for m in (r.getMessage() for r in caplog.records) if all(w in m for w in words)]


def test_a_plaintext_java_client_is_refused(world, caplog):
    caplog.set_level(logging.INFO)
    done = world.mqadmin("topicRoute", "-n", world.node.addr, "-t", world.broker.cluster, tls=False)
    assert world.broker.addr not in done.stdout, done.stdout
    assert sent_nowhere(done, world.node.addr), refusal(done)
    assert node_said(caplog, "plaintext refused"), [r.getMessage() for r in caplog.records]


def docs_java_recipe(ca: Path) -> list[str]:
    """The -D options docs/security.md gives a Java client that verifies the node, as written there,
    with our CA's path for the recipe's."""
    page = (REPO / "docs" / "security.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^\s*```text\n(.*?)^\s*```", page, re.M | re.S)
    (block,) = [b for b in blocks if "-Dtls.client.authServer=true" in b]
    return [line.strip().replace("/etc/rocketmq/ca.pem", str(ca)) for line in block.splitlines() if line.strip()]


def namesrv_config(addr: str, base: Path, system_props: list[str]) -> str:
    """What mqadmin getNamesrvConfig printed: the node's configuration when it got through."""
    done = mqadmin(ROCKETMQ_5, base, "getNamesrvConfig", "-n", addr, system_props=system_props)
    return done.stdout + done.stderr


def test_the_docs_recipe_verifies_the_node_refusing_an_unrelated_certificate(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "namesrv.handshake")
    certs = make_certificates(tmp_path / "certs")
    recipe = docs_java_recipe(certs.ca)
    enforcing = {"tls.server.mode": "enforcing"}
    with (
        running_node(tmp_path / "right", **node_tls(certs, **enforcing)) as right,
        running_node(tmp_path / "unrelated", **{"tls.test.mode.enable": "true", **enforcing}) as unrelated,
    ):
        said = namesrv_config(right.addr, tmp_path, recipe)
        assert "kvConfigPath" in said, said
        assert not node_said(caplog, "TLS handshake failed")
        said = namesrv_config(unrelated.addr, tmp_path, recipe)  # its self-signed certificate
        assert "kvConfigPath" not in said, said
        assert node_said(caplog, "TLS handshake failed"), [r.getMessage() for r in caplog.records]


def test_a_java_tls_client_on_a_plaintext_node_is_told_once_which_keys_to_set(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "namesrv.server")
    with running_node(tmp_path / "plain") as node:
        said = namesrv_config(node.addr, tmp_path, ["-Dtls.enable=true"])
        assert "kvConfigPath" not in said, said
        said = namesrv_config(node.addr, tmp_path, ["-Dtls.enable=true"])  # and again
    (told,) = node_said(caplog, "a TLS client reached this plaintext-only node")
    assert "set tls.server.certPath and tls.server.keyPath" in told
    assert not node_said(caplog, "malformed frame")


def test_a_java_client_without_a_certificate_is_refused(world, caplog):
    caplog.set_level(logging.INFO)
    done = world.mqadmin("topicRoute", "-n", world.node.addr, "-t", world.broker.cluster, cert=False)
    assert world.broker.addr not in done.stdout, done.stdout
    assert sent_nowhere(done, world.node.addr), refusal(done)
    assert node_said(caplog, "TLS handshake failed", "CERTIFICATE"), [r.getMessage() for r in caplog.records]


# --------------------------------------------------------------------------- signed requests


def kv(world: World, key: str = KEY) -> str | None:
    with NameServerClient(world.node.addr, tls=world.tls()) as c:
        return c.get_kv(NAMESPACE, key)


def test_mqadmin_with_the_admin_account_writes_kv(world):
    done = world.mqadmin("updateKvConfig", "-n", world.node.addr, "-s", NAMESPACE, "-k", KEY, "-v", "signed value",
                         credentials=world.admin)  # fmt: skip
    assert "create or update kv config to namespace success" in done.stdout, refusal(done)
    assert kv(world) == "signed value"
    done = world.mqadmin("deleteKvConfig", "-n", world.node.addr, "-s", NAMESPACE, "-k", KEY, credentials=world.admin)
    assert "delete kv config from namespace success" in done.stdout, refusal(done)
    assert kv(world) is None


@pytest.mark.parametrize(
    "who, remark",
    [
        ("wrong secret", "Check signature failed for accessKey='adminAccount'"),
        ("unsigned", "No accessKey is configured: request code=100"),
        ("broker account", "Need admin permission for request code=100, but accessKey='brokerAccount' is not"),
    ],
)
def test_mqadmin_kv_write_is_refused_with_code_16(world, who, remark):
    credentials = {
        "wrong secret": Credentials(world.admin.access_key, world.admin.secret_key[::-1] + "x"),
        "unsigned": None,
        "broker account": world.broker_account,
    }[who]
    refused_before = world.node.call(lambda: world.node.running.context.acl.refused)
    key = f"{KEY}-{who.replace(' ', '-')}"
    done = world.mqadmin("updateKvConfig", "-n", world.node.addr, "-s", NAMESPACE, "-k", key, "-v", who,
                         credentials=credentials)  # fmt: skip
    out = refusal(done)
    assert "create or update kv config to namespace success" not in out, out
    # mqadmin shows the node's answer as RocketMQ's client reports any refusal: the code and our remark
    assert "CODE: 16" in out and remark in out, out
    assert kv(world, key) is None
    assert world.node.call(lambda: world.node.running.context.acl.refused) == refused_before + 1
