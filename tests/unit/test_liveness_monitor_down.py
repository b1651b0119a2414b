"""MONITOR_DOWN's pure parts: when a node says the monitor is down, what the alert says, and its resolution;
and a pager with no receiver, against a stand-in for Redis (tests/integration/test_monitor_down*.py: a real one)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from common.alerts import NODE_OWNED_KINDS, AlertKind, AlertState, Severity, decode_alert
from common.paging import Notice, PagingSettings, labels_of, notice_of
from common.redis_keys import RedisKeys
from namesrv.config import ConfigError, NamesrvConfig, alert_receivers
from namesrv.liveness import MonitorDownPager, MonitorWatchdog, monitor_down
from tests.support.clock import Clock

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


class ScriptedRedis:
    """The pager's three scripts and SET, as Redis runs them, on a dict; every command is recorded."""

    def __init__(self) -> None:
        self.strings: dict[str, bytes] = {}
        self.hashes: dict[str, dict[str, bytes]] = {}
        self.lists: dict[str, list[bytes]] = {}
        self.commands: list[tuple[str, ...]] = []

    def eval(self, script: str, numkeys: int, *args: Any) -> Any:
        keys, argv = (
            [str(a) for a in args[:numkeys]],
            [a if isinstance(a, bytes) else str(a).encode() for a in args[numkeys:]],
        )
        if script == monitor_down._OPEN:
            self.commands.append(("OPEN",))
            here = keys[0] not in self.strings
            if here:
                self.strings[keys[0]] = argv[0]
                self.hashes.setdefault(keys[1], {})[argv[1].decode()] = argv[2]
            return [self.strings[keys[0]], int(here)]
        if script == monitor_down._SHOW:
            self.commands.append(("SHOW",))
            if self.strings.get(keys[0]) == argv[0]:
                self.hashes.setdefault(keys[1], {}).setdefault(argv[1].decode(), argv[2])
            return 0
        if script == monitor_down._RESOLVE:
            self.commands.append(("RESOLVE",))
            opened = self.strings.get(keys[0])
            if opened is None or opened == argv[3]:
                return None
            self.strings[keys[0]] = argv[3]
            self.strings.pop(keys[3], None)
            self.hashes.get(keys[1], {}).pop(argv[0].decode(), None)
            self.lists.setdefault(keys[2], []).insert(0, argv[1])
            return opened
        raise AssertionError(f"a script the pager does not have: {script!r}")

    def set(self, key: str, value: str, **options: Any) -> bool:
        self.commands.append(("SET", key))  # the pager's one SET: NX
        if key in self.strings:
            return False
        self.strings[key] = value.encode()
        return True

    def close(self) -> None:
        pass


LAG_MS = 60_000


def silent_pager(client: ScriptedRedis, clock: Clock, settings: PagingSettings | None = None) -> MonitorDownPager:
    watchdog = MonitorWatchdog(SimpleNamespace(hand_to_monitor=lambda: False), 30_000, now=clock.seconds)
    watchdog.heard("liveness@test")
    keys = RedisKeys("unit")
    return MonitorDownPager(client, keys, "node-1", watchdog, settings or PagingSettings(), LAG_MS)  # type: ignore[arg-type]


def no_post(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("a pager without a receiver POSTed")


def test_a_node_with_redis_and_no_receiver_has_a_pager_and_one_without_redis_none():
    watchdog = MonitorWatchdog(SimpleNamespace(hand_to_monitor=lambda: False), 30_000)
    cfg = NamesrvConfig(kafka_bootstrap_servers="127.0.0.1:1", redis_url="redis://127.0.0.1:1/0")
    pager = MonitorDownPager.from_config(cfg, "node-1", watchdog)  # connects lazily: no Redis needed
    assert pager is not None and not pager.settings.enabled and pager.threshold_ms == cfg.alerts_monitor_lag_millis
    pager.client.close()
    assert (
        MonitorDownPager.from_config(NamesrvConfig(kafka_bootstrap_servers="127.0.0.1:1"), "node-1", watchdog) is None
    )


def test_without_a_receiver_it_opens_in_redis_claims_no_resend_posts_nothing_and_resolves_once(monkeypatch):
    monkeypatch.setattr(monitor_down, "post_json", no_post)
    clock, redis = Clock(), ScriptedRedis()
    pager = silent_pager(redis, clock)
    keys = pager.keys
    pager.step()
    clock.advance(LAG_MS - 500)
    pager.step()
    assert redis.commands == [("RESOLVE",), ("RESOLVE",)] and keys.alerts not in redis.hashes  # heard: nothing open

    clock.advance(500)
    pager.step()  # silent for alerts.monitorLagMillis: the notice and the console's alert, nothing else
    assert redis.commands[2:] == [("OPEN",)]
    assert Notice.decode(redis.strings[keys.monitor_down]).state == "OPEN"
    (shown,) = redis.hashes[keys.alerts].values()
    assert decode_alert(shown).kind == AlertKind.MONITOR_DOWN
    redis.hashes[keys.alerts].clear()  # as a job's rewrite of Redis does
    clock.advance(seconds=5)
    pager.step()  # still silent: shown again, still no resend claim
    assert redis.commands[3:] == [("OPEN",), ("SHOW",)] and list(redis.hashes[keys.alerts].values()) == [shown]
    assert keys.monitor_down_resend not in redis.strings

    pager.watchdog.heard("liveness@test")
    pager.step(), pager.step()
    assert redis.commands[5:] == [("RESOLVE",), ("RESOLVE",)]  # resolved by the first, nothing left for the second
    assert redis.hashes[keys.alerts] == {} and redis.strings[keys.monitor_down] == monitor_down.HEARD
    (resolved,) = redis.lists[keys.alerts_resolved]
    assert decode_alert(resolved).state == AlertState.RESOLVED
    assert pager.unsent is None  # no resolution waits for a receiver
    assert not any(c[0] == "SET" for c in redis.commands)


def test_with_a_receiver_it_still_claims_the_interval_and_posts_as_before(monkeypatch):
    posted: list[str] = []
    monkeypatch.setattr(monitor_down, "post_json", lambda url, body, timeout: posted.append(url))
    clock, redis = Clock(), ScriptedRedis()
    pager = silent_pager(redis, clock, PagingSettings(webhook_url="http://hook/x", resend_ms=60_000))
    clock.advance(LAG_MS)
    pager.step(), pager.step()
    assert redis.commands == [("OPEN",), ("SET", pager.keys.monitor_down_resend), ("OPEN",), ("SHOW",),
                              ("SET", pager.keys.monitor_down_resend)]  # fmt: skip
    assert posted == ["http://hook/x"]  # once in its interval
    pager.watchdog.heard("liveness@test")
    pager.step()
    assert posted == ["http://hook/x", "http://hook/x"] and pager.unsent is None  # the resolution
