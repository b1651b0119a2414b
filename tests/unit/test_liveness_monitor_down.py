"""MONITOR_DOWN's pure parts: when a node says the monitor is down, what the alert says, and its resolution."""

from __future__ import annotations

import pytest

from common.alerts import NODE_OWNED_KINDS, AlertKind, AlertState, Severity
from common.paging import labels_of, notice_of
from namesrv.config import ConfigError, NamesrvConfig, alert_receivers
from namesrv.liveness import monitor_down

T0 = 1_700_000_000_000


def test_the_monitor_is_down_once_silent_for_the_threshold_and_unknown_if_never_heard():
    assert monitor_down.monitor_state(None, 60_000) is monitor_down.MonitorState.UNKNOWN
    assert monitor_down.monitor_state(0.0, 60_000) is monitor_down.MonitorState.UP
    assert monitor_down.monitor_state(59.999, 60_000) is monitor_down.MonitorState.UP
    assert monitor_down.monitor_state(60.0, 60_000) is monitor_down.MonitorState.DOWN


def test_the_alert_is_critical_names_no_node_and_is_the_nodes_alone():
    alert = monitor_down.down_alert("node-1", "liveness@host/abc", 60_000, T0)
    assert (alert.kind, alert.state, alert.severity, alert.node) == (
        AlertKind.MONITOR_DOWN, AlertState.OPEN, Severity.CRITICAL, None,
    )  # fmt: skip
    assert "60 s" in alert.message and "liveness@host/abc" in alert.message
    assert labels_of(alert) == {"alertname": "MONITOR_DOWN", "severity": "critical"}
    assert AlertKind.MONITOR_DOWN in NODE_OWNED_KINDS


def test_a_resolution_sent_by_another_node_has_the_open_s_labels_and_start():
    opened = notice_of(monitor_down.down_alert("node-1", "m", 60_000, T0), "node-1", T0)
    resolved = monitor_down.resolution(opened, "node-2", T0 + 90_000)
    assert (resolved.state, resolved.labels, resolved.starts_at, resolved.ends_at) == (
        "RESOLVED", opened.labels, T0, T0 + 90_000,
    )  # fmt: skip
    assert resolved.alert["severity"] == "CRITICAL" and resolved.alert["state"] == "RESOLVED"
    assert "node-2" in resolved.annotations["description"]


def test_the_receivers_are_checked_naming_the_key():
    cfg = NamesrvConfig(alerts_alertmanager_url="http://a:9093; http://b:9093", alerts_webhook_url="http://w/x")
    assert alert_receivers(cfg) == (("http://a:9093", "http://b:9093"), "http://w/x")
    assert alert_receivers(NamesrvConfig()) == ((), "")
    with pytest.raises(ConfigError, match="alerts.webhookUrl"):
        alert_receivers(NamesrvConfig(alerts_webhook_url="ftp://w/x"))
    with pytest.raises(ConfigError, match="alerts.alertmanagerUrl"):
        alert_receivers(NamesrvConfig(alerts_alertmanager_url="http://user@a:9093"))
