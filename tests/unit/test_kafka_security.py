"""Kafka security settings: our keys to kafka-python's arguments and to Spark's connector options, checks
that name the key, secrets kept out of every message, and the plumbing into the node and the job."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from common import kafka_clients
from common.kafka_security import KafkaSecurity
from namesrv.config import (
    Blacklisted,
    ConfigError,
    NamesrvConfig,
    apply_update,
    kafka_security,
    load_config,
    render_properties,
)
from namesrv.events.actions import ConsumerSettings
from namesrv.events.publisher import PublisherSettings
from streaming.config import SECURITY_OPTION_KEYS
from streaming.config import load_config as load_streaming

REPO = Path(__file__).resolve().parents[2]
SECRET = "TOP-secret-pw"
PLAIN_JAAS = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="{SECRET}";'
SCRAM_JAAS = f'org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="{SECRET}";'


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    """A readable file where a PEM is expected (the checks only need it to be readable)."""
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def client_pem(tmp_path: Path, key: str = "ENCRYPTED PRIVATE KEY") -> Path:
    """A client certificate and its key in one PEM file, as Java's PEM key store reads them (headers only)."""
    path = tmp_path / f"client-{key.replace(' ', '-')}.pem"
    path.write_text(f"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n-----BEGIN {key}-----\nMIIE\n")
    return path


def sec(**values: str) -> KafkaSecurity:
    return KafkaSecurity.from_settings({k.replace("_", "."): v for k, v in values.items()})


# --------------------------------------------------------------------------- defaults


def test_plaintext_adds_nothing_to_any_client_or_option_map() -> None:
    default = KafkaSecurity()
    assert default.client_config() == {} and default.spark_options() == {} and default.settings() == {}
    assert kafka_clients._config("h:1", "k", False, None, {}, default) == {"bootstrap_servers": ["h:1"]}
    assert kafka_security(NamesrvConfig()) == default
    cfg = load_streaming(REPO / "conf" / "streaming.properties")
    assert cfg.kafka_security == default
    assert not [k for k in cfg.source_options() if k.startswith(("kafka.security", "kafka.sasl", "kafka.ssl"))]


# --------------------------------------------------------------------------- mapping


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_maps_to_kafka_python_arguments(mechanism: str) -> None:
    security = sec(
        security_protocol="sasl_plaintext",
        sasl_mechanism=mechanism.lower(),
        sasl_username="alice",
        sasl_password=SECRET,
    )
    assert security.client_config() == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "alice",
        "sasl_plain_password": SECRET,
    }


def test_sasl_ssl_with_every_file_maps_to_kafka_python_arguments(pem: Path) -> None:
    security = KafkaSecurity.from_settings(
        {
            "kafka.security.protocol": "SASL_SSL", "kafka.sasl.jaas.config": SCRAM_JAAS,
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.ssl.cafile": str(pem), "kafka.ssl.certfile": str(pem),
            "kafka.ssl.keyfile": str(pem), "kafka.ssl.password": "key-pw", "kafka.ssl.check.hostname": "FALSE",
        },
        prefix="kafka.",
    )  # fmt: skip
    assert security.client_config() == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "alice",
        "sasl_plain_password": SECRET, "ssl_check_hostname": False, "ssl_cafile": str(pem),
        "ssl_certfile": str(pem), "ssl_keyfile": str(pem), "ssl_password": "key-pw",
    }  # fmt: skip
    # what the job hands its own source reads back to the same settings
    assert KafkaSecurity.from_settings(security.settings(), prefix="kafka.") == security


def test_spark_connector_options_are_java_client_settings(pem: Path, tmp_path: Path) -> None:
    client = client_pem(tmp_path)
    security = sec(
        security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-256", sasl_username='a"l\\ice', sasl_password=SECRET,
        ssl_cafile=str(pem), ssl_certfile=str(client), ssl_password="key-pw", ssl_check_hostname="false",
    )  # fmt: skip
    assert security.spark_options() == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="a\\"l\\\\ice" password="{SECRET}";',
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(pem),
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.location": str(client),
        "kafka.ssl.key.password": "key-pw",
        "kafka.ssl.endpoint.identification.algorithm": "",
    }
    # the JAAS line we write is one we read back
    back = sec(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_jaas_config=security.spark_options()["kafka.sasl.jaas.config"],
        ssl_cafile=str(pem),
    )
    assert (back.sasl_username, back.sasl_password) == ('a"l\\ice', SECRET)


def test_spark_connector_needs_the_key_in_the_certificate_file(tmp_path: Path, pem: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text("key")
    security = sec(security_protocol="SSL", ssl_certfile=str(pem), ssl_keyfile=str(key))
    with pytest.raises(ConfigError, match="kafka.ssl.keyfile: Spark's Kafka connector"):
        security.spark_options()
    with pytest.raises(ConfigError, match="kafka.ssl.keyfile"):
        load_streaming(
            None,
            {
                "kafka.security.protocol": "SSL",
                "kafka.ssl.certfile": str(pem),
                "kafka.ssl.keyfile": str(key),
            },
        )
    # the certificate alone: the job stops at load, before Java fails on it
    with pytest.raises(ConfigError, match=r"kafka.ssl.certfile=.* holds no private key: .* append the key"):
        load_streaming(None, {"kafka.security.protocol": "SSL", "kafka.ssl.certfile": str(pem)})


@pytest.mark.parametrize(
    ("key", "password", "problem"),
    [
        (
            "RSA PRIVATE KEY",
            None,
            "holds a RSA PRIVATE KEY, and Java reads PKCS#8 keys only: convert it with `openssl pkcs8",
        ),
        ("EC PRIVATE KEY", "pw", "holds a EC PRIVATE KEY"),
        ("ENCRYPTED PRIVATE KEY", None, "holds an encrypted key, and kafka.ssl.password is not set"),
        ("PRIVATE KEY", "pw", "holds a key without a password, and Java refuses it with kafka.ssl.password set"),
    ],
)
def test_keys_java_cannot_read_stop_the_job_naming_the_file_and_the_fix(
    tmp_path: Path, key: str, password: str | None, problem: str
) -> None:
    client = client_pem(tmp_path, key)
    settings = {"kafka.security.protocol": "SSL", "kafka.ssl.certfile": str(client)}
    if password:
        settings["kafka.ssl.password"] = password
    with pytest.raises(ConfigError, match=re.escape(problem)) as refused:
        load_streaming(None, settings)
    assert str(client) in str(refused.value) and "pw" not in str(refused.value).replace(str(client), "")
    # kafka-python reads them all: the nodes and the job's publisher take the same settings
    assert KafkaSecurity.from_settings(settings, prefix="kafka.").ssl_certfile == str(client)


def test_pkcs8_keys_java_reads(tmp_path: Path) -> None:
    plain = sec(security_protocol="SSL", ssl_certfile=str(client_pem(tmp_path, "PRIVATE KEY")))
    assert "kafka.ssl.key.password" not in plain.spark_options()
    encrypted = sec(security_protocol="SSL", ssl_certfile=str(client_pem(tmp_path)), ssl_password="pw")
    assert encrypted.spark_options()["kafka.ssl.key.password"] == "pw"


# --------------------------------------------------------------------------- checks


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"security.protocol": "TLS"}, "security.protocol='TLS' is not one of"),
        (
            {
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "GSSAPI",
                "sasl.username": "a",
                "sasl.password": SECRET,
            },
            "sasl.mechanism='GSSAPI'",
        ),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "a"}, "sasl.password is missing"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.password": SECRET}, "sasl.username is missing"),
        (
            {"sasl.username": "a", "sasl.password": SECRET},
            "sasl.username='a' is set but security.protocol=PLAINTEXT would ignore it",
        ),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "a", "sasl.password": SECRET, "ssl.cafile": "/x"},
            "ssl.cafile='/x' is set but",
        ),
        (
            {"security.protocol": "SSL", "ssl.cafile": "/no/such/ca.pem"},
            "ssl.cafile='/no/such/ca.pem' is not a readable file",
        ),
        ({"security.protocol": "SSL", "ssl.check.hostname": "no"}, "ssl.check.hostname='no' is not a valid boolean"),
        ({"security.protocol": "SASL_SSL", "sasl.jaas.config": "garbage " + SECRET}, "sasl.jaas.config is not"),
        (
            {"security.protocol": "SASL_SSL", "sasl.jaas.config": PLAIN_JAAS, "sasl.mechanism": "SCRAM-SHA-256"},
            "sasl.jaas.config names login module",
        ),
        (
            {"security.protocol": "SASL_SSL", "sasl.jaas.config": PLAIN_JAAS, "sasl.password": SECRET},
            "sasl.jaas.config and sasl.username/sasl.password are both set",
        ),
        (
            {"security.protocol": "SASL_SSL", "sasl.jaas.config": PLAIN_JAAS.replace(f' password="{SECRET}"', "")},
            "lacks",
        ),
        ({"security.protocol": "SSL", "ssl.password": SECRET}, "ssl.password is the password of a key"),
    ],
)
def test_unusable_settings_name_the_key_and_never_the_secret(settings: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        KafkaSecurity.from_settings(settings, source="test")
    assert named in str(caught.value) and SECRET not in str(caught.value)


def test_secrets_come_from_the_environment_or_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_PW", SECRET)
    secret_file = tmp_path / "pw"
    secret_file.write_text(SECRET + "\n")
    base = {"security.protocol": "SASL_PLAINTEXT", "sasl.username": "alice"}
    assert KafkaSecurity.from_settings({**base, "sasl.password": "${env:KAFKA_PW}"}).sasl_password == SECRET
    assert KafkaSecurity.from_settings({**base, "sasl.password": f"${{file:{secret_file}}}"}).sasl_password == SECRET
    with pytest.raises(ConfigError, match="names environment variable NOT_SET_ANYWHERE, which is not set"):
        KafkaSecurity.from_settings({**base, "sasl.password": "${env:NOT_SET_ANYWHERE}"})
    with pytest.raises(ConfigError, match="names file /no/such/file, which cannot be read"):
        KafkaSecurity.from_settings({**base, "sasl.password": "${file:/no/such/file}"})


def test_nothing_shown_holds_a_secret() -> None:
    security = sec(security_protocol="SASL_SSL", sasl_username="alice", sasl_password=SECRET)
    for shown in (
        repr(security),
        security.describe(),
        security.failure_hint(),
    ):
        assert SECRET not in shown
    assert "sasl.mechanism=PLAIN" in security.failure_hint() and KafkaSecurity().failure_hint() == ""


# --------------------------------------------------------------------------- the node


def node_config(tmp_path: Path, **props: str) -> NamesrvConfig:
    return load_config(None, {"configStorePath": str(tmp_path / "n.properties"), **props})


SASL_NODE = {"kafka.security.protocol": "SASL_SSL", "kafka.sasl.username": "alice", "kafka.sasl.password": SECRET}


def test_node_keys_reach_its_producer_consumer_and_admin(tmp_path: Path) -> None:
    cfg = node_config(tmp_path, kafkaBootstrapServers="h:1", **SASL_NODE)
    assert (
        PublisherSettings.from_config(cfg).security == ConsumerSettings.from_config(cfg).security == kafka_security(cfg)
    )
    assert kafka_security(cfg).client_config()["sasl_plain_password"] == SECRET
    with pytest.raises(ConfigError, match="namesrv config: kafka.sasl.mechanism='NOPE'"):
        node_config(tmp_path, **SASL_NODE, **{"kafka.sasl.mechanism": "NOPE"})


def test_node_shows_secrets_masked_persists_them_and_refuses_remote_changes(
    tmp_path: Path, caplog, monkeypatch
) -> None:
    monkeypatch.setenv("X", SECRET)
    cfg = node_config(tmp_path, **SASL_NODE, redisUrl=f"redis://u:{SECRET}@h:1/0")
    shown = render_properties(cfg)  # GET_NAMESRV_CONFIG and -p
    assert SECRET not in shown
    assert "kafka.sasl.password=******" in shown and "redisUrl=redis://u:***@h:1/0" in shown
    assert f"kafka.sasl.password={SECRET}" in render_properties(cfg, reveal_secrets=True)
    # a reference holds no secret, so it is shown as written
    assert "kafka.sasl.password=${env:X}" in render_properties(
        node_config(tmp_path, **{**SASL_NODE, "kafka.sasl.password": "${env:X}"})
    )
    for key in ("kafka.sasl.password", "kafka.security.protocol", "kafka.ssl.cafile"):
        assert isinstance(apply_update(cfg, f"{key}=x"), Blacklisted)
    with caplog.at_level(logging.INFO, "namesrv.config"):
        apply_update(cfg, f"redisUrl=redis://:{SECRET}2@h:2/0")
    assert cfg.redis_url == f"redis://:{SECRET}2@h:2/0" and SECRET not in caplog.text
    assert f"redisUrl=redis://:{SECRET}2@h:2/0" in (tmp_path / "n.properties").read_text()


# --------------------------------------------------------------------------- the job


def test_job_security_keys_reach_spark_s_connector_and_the_conf_file_documents_them(tmp_path: Path) -> None:
    props = {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": SCRAM_JAAS,
    }
    ours = load_streaming(None, props, base_dir=tmp_path)
    assert ours.kafka_security.sasl_password == SECRET and SECRET not in repr(ours)
    spark = ours.source_options()
    assert {k: spark[k] for k in ("kafka.security.protocol", "kafka.sasl.mechanism", "kafka.sasl.jaas.config")} == {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": SCRAM_JAAS,
    }
    # only the Java client's names reach the connector: it would pass ours to Kafka, which warns and ignores them
    assert not [k for k in spark if k.startswith(("kafka.sasl.username", "kafka.sasl.password", "kafka.ssl.cafile"))]
    assert spark["failOnDataLoss"] == "false"
    text = (REPO / "conf" / "streaming.properties").read_text()
    for key in SECURITY_OPTION_KEYS:
        assert f"\n{key}=" in text, f"{key} is not documented in conf/streaming.properties"
    with pytest.raises(ConfigError, match="streaming config: kafka.sasl.mechanism='MD5'"):
        load_streaming(None, {**props, "kafka.sasl.mechanism": "MD5"})
