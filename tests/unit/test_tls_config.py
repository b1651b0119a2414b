"""The TLS and PROXY protocol keys: defaults, validation with errors naming the keys, tls.config.file
as RocketMQ reads it, the password never shown, and no remote update of any of them."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from namesrv.app import start_node
from namesrv.config import (
    REDACTED,
    RESTART_ONLY,
    Blacklisted,
    ConfigError,
    Updated,
    apply_update,
    load_config,
    render_properties,
)
from namesrv.handshake import TransportSecurity
from namesrv.tls import DEFAULT_CONFIG_FILE, tls_settings


@pytest.fixture
def pem(tmp_path: Path) -> Path:
    """Readable files are all tls_settings checks; the contexts are built from real ones elsewhere."""
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("-----BEGIN CERTIFICATE-----\n")
    return tmp_path


def cfg(tmp_path: Path, **props: str):
    return load_config(None, {"kvConfigPath": str(tmp_path / "kv.json"), **props})


def start(tmp_path: Path, **props: str) -> None:
    """A node's start-up with these settings, as far as its first check: nothing starts before it."""
    asyncio.run(start_node(cfg(tmp_path, **props)))


def test_defaults_keep_plaintext_and_the_loops_own_server(tmp_path):
    c = cfg(tmp_path)
    assert (c.tls_server_mode, c.tls_test_mode_enable, c.proxy_protocol_mode) == ("permissive", False, "disabled")
    assert c.tls_config_file == DEFAULT_CONFIG_FILE and c.handshake_timeout_millis == 10000
    security = TransportSecurity.from_config(c)
    assert security.context is None and not security.sniffing  # permissive without a certificate: plaintext


def test_modes_are_checked_and_folded_to_rocketmqs_lower_case(tmp_path):
    assert cfg(tmp_path, **{"tls.server.mode": "ENFORCING", "tls.test.mode.enable": "true"}).tls_server_mode == (
        "enforcing"
    )
    with pytest.raises(ConfigError, match="tls.server.mode='strict' is not a valid one of disabled, permissive"):
        cfg(tmp_path, **{"tls.server.mode": "strict"})
    with pytest.raises(ConfigError, match="tls.server.need.client.auth='yes'"):
        cfg(tmp_path, **{"tls.server.need.client.auth": "yes"})
    with pytest.raises(ConfigError, match="proxyProtocolMode='on'"):
        cfg(tmp_path, proxyProtocolMode="on")
    with pytest.raises(ConfigError, match="handshakeTimeoutMillis='0'"):
        cfg(tmp_path, handshakeTimeoutMillis="0")


@pytest.mark.parametrize(
    "props, message",
    [
        ({"tls.server.mode": "enforcing"}, "tls.server.mode=enforcing refuses plaintext, but no certificate"),
        ({"tls.server.certPath": "{d}/cert.pem"}, r"tls.server.certPath \(from the node's properties\).*set both"),
        ({"tls.server.keyPath": "{d}/key.pem"}, "set both or neither"),
        (
            {"tls.server.certPath": "{d}/absent.pem", "tls.server.keyPath": "{d}/key.pem"},
            r"tls.server.certPath \(from the node's properties\)=.*absent.pem cannot be read",
        ),
        (
            {
                "tls.server.certPath": "{d}/cert.pem",
                "tls.server.keyPath": "{d}/key.pem",
                "tls.test.mode.enable": "true",
            },
            "tls.test.mode.enable .*=true would ignore tls.server.certPath",
        ),
        (
            {
                "tls.server.certPath": "{d}/cert.pem",
                "tls.server.keyPath": "{d}/key.pem",
                "tls.server.need.client.auth": "require",
            },
            "tls.server.need.client.auth .*=require needs tls.server.trustCertPath",
        ),
        (
            {
                "tls.server.certPath": "{d}/cert.pem",
                "tls.server.keyPath": "{d}/key.pem",
                "tls.server.need.client.auth": "optional",
                "tls.server.trustCertPath": "{d}/absent-ca.pem",
            },
            "tls.server.trustCertPath .*absent-ca.pem cannot be read",
        ),
        ({"tls.config.file": "{d}/absent.properties"}, "tls.config.file=.*absent.properties does not exist"),
    ],
)
def test_settings_that_cannot_work_stop_start_up_naming_the_keys(tmp_path, pem, props, message):
    with pytest.raises(ConfigError, match=message):
        start(tmp_path, **{k: v.format(d=pem) for k, v in props.items()})


def test_disabled_mode_reads_and_checks_nothing(tmp_path):
    c = cfg(tmp_path, **{"tls.server.mode": "disabled", "tls.server.certPath": "/absent", "tls.config.file": "/absent"})
    assert TransportSecurity.from_config(c).context is None


def test_the_file_overrides_the_nodes_properties_except_the_mode(tmp_path, pem, caplog):
    tls_file = pem / "tls.properties"
    tls_file.write_text(
        "tls.server.mode=disabled\n"
        f"tls.server.certPath={pem}/cert.pem\ntls.server.keyPath={pem}/key.pem\n"
        "tls.server.need.client.auth=optional\n"
        f"tls.server.trustCertPath={pem}/ca.pem\ntls.server.keyPassword=from-file\n"
        "tls.client.keyPath=/for/clients/only\n"
    )
    caplog.set_level(logging.WARNING, "namesrv.tls")
    c = cfg(
        tmp_path, **{"tls.config.file": str(tls_file), "tls.server.mode": "enforcing", "tls.server.keyPassword": "x"}
    )
    s = tls_settings(c)
    assert (s.mode, s.cert_path, s.need_client_auth, s.key_password) == (
        "enforcing",
        f"{pem}/cert.pem",
        "optional",
        "from-file",
    )
    assert s.sources["tls.server.certPath"] == str(tls_file)
    assert any(
        "sets tls.server.mode, which is read from the node's properties only" in r.message for r in caplog.records
    )


def test_a_bad_value_in_the_file_names_the_file_and_the_key(tmp_path):
    tls_file = tmp_path / "tls.properties"
    tls_file.write_text("tls.test.mode.enable=yes\n")
    with pytest.raises(ConfigError, match=rf"{tls_file}: tls.test.mode.enable='yes' is not a valid boolean"):
        start(tmp_path, **{"tls.config.file": str(tls_file)})


def test_the_key_password_is_shown_redacted_but_persisted_and_tls_keys_are_restart_only(tmp_path, pem):
    store = tmp_path / "namesrv.properties"
    c = cfg(
        tmp_path,
        configStorePath=str(store),
        **{
            "tls.server.certPath": f"{pem}/cert.pem",
            "tls.server.keyPath": f"{pem}/key.pem",
            "tls.server.keyPassword": "hunter2",
        },
    )
    shown = render_properties(c)
    assert f"tls.server.keyPassword={REDACTED}" in shown and "hunter2" not in shown
    # an unset password is shown as what it is: empty
    assert "tls.server.keyPassword=\n" in render_properties(cfg(tmp_path))
    # a remote update may change neither TLS nor the PROXY protocol
    for key in ("tls.server.mode", "tls.server.certPath", "proxyProtocolMode", "handshakeTimeoutMillis"):
        assert key in RESTART_ONLY
        result = apply_update(c, f"{key}=disabled\n")
        assert isinstance(result, Blacklisted) and result.keys == (key,)
    # any other update rewrites the file with the real password, so the next start can open the key
    assert isinstance(apply_update(c, "orderMessageEnable=true\n"), Updated)
    assert "tls.server.keyPassword=hunter2" in store.read_text()
    assert load_config(store).tls_server_key_password == "hunter2"
