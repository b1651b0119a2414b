"""MONITOR_DOWN: the nodes raise it when no monitor has decided for ``alerts.monitorLagMillis``.

Alerts come from the streaming job, so a dead or crash-looping job raises none; the nodes, which
hear the monitor (:class:`~namesrv.liveness.MonitorWatchdog`), raise it instead, and Redis makes it
one alert among them.  Every node with Kafka and Redis takes part, with or without a receiver: the
first node silent past the threshold stores the OPEN notice in ``P:alerts:monitor-down`` (SET NX) and
the alert in ``P:alerts``, where the console and ``namesrv-monitor routes alerts`` show it; the first
node that hears a monitor again takes the notice out and moves the alert to the resolved list.  With
receivers, the node that wins a resend interval (``P:alerts:monitor-down:resend``, SET NX PX) sends
the stored notice, so each receiver gets it once an interval with the same labels, and the node that
resolved it sends the resolution made from it.  The nodes own this alert: a job neither loads
nor re-sends it (:data:`common.alerts.NODE_OWNED_KINDS`).  ``docs/monitor.md`` ("When the monitor
is gone") has the guarantees and their limits.
"""

from __future__ import annotations

import asyncio
import enum
import logging

import orjson

from common import redis_clients
from common.alerts import MAX_RESOLVED, Alert, AlertKind, AlertState, Severity, decode_alert, encode_alert
from common.contract import wall_ms
from common.paging import (
    ENDS_AT_RESENDS,
    DeliveryError,
    Notice,
    PagingSettings,
    Refused,
    notice_of,
    post_json,
    request_body,
)
from common.redis_keys import RedisKeys
from namesrv.config import NamesrvConfig, alert_receivers
from namesrv.liveness.redis_fallback import connect_node_redis
from namesrv.liveness.watchdog import MonitorWatchdog

log = logging.getLogger("namesrv.liveness")

#: how often a node looks at the watchdog and Redis
PERIOD_S = 1.0
#: longest wait for one POST
SEND_TIMEOUT_S = 10.0

# the OPEN notice, stored once (the first node's), and its alert for the console; returns the stored notice
# and 1 when this call stored it
_OPEN = """
local stored = redis.call('set', KEYS[1], ARGV[1], 'NX')
if stored then redis.call('hset', KEYS[2], ARGV[2], ARGV[3]) end
return {redis.call('get', KEYS[1]), stored and 1 or 0}
"""
# the stored notice's alert back for the console (a job's rewrite of Redis drops it), only while that
# notice is still the open one: a node that read it a moment before another resolved it adds nothing
_SHOW = """
if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('hsetnx', KEYS[2], ARGV[2], ARGV[3]) end
return 0
"""
#: what the notice's key holds for the threshold after a resolution: a monitor was heard, so none has been
#: silent that long yet, and a node that hears it a moment later than the others does not open it again
HEARD = b"heard"
# the stored notice taken out (by one node), with its alert moved to the console's resolved list
_RESOLVE = """
local opened = redis.call('get', KEYS[1])
if not opened or opened == ARGV[4] then return false end
redis.call('set', KEYS[1], ARGV[4], 'PX', ARGV[5])
redis.call('del', KEYS[4])
redis.call('hdel', KEYS[2], ARGV[1])
redis.call('lpush', KEYS[3], ARGV[2])
redis.call('ltrim', KEYS[3], 0, tonumber(ARGV[3]) - 1)
return opened
"""
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class MonitorState(enum.Enum):
    #: this node never heard a monitor: it says nothing (a node without a monitor is Apache's)
    UNKNOWN = "unknown"
    UP = "up"
    DOWN = "down"


def monitor_state(silence_s: float | None, threshold_ms: int) -> MonitorState:
    """DOWN once the monitor this node heard has been silent for ``threshold_ms``; UP while it is heard."""
    if silence_s is None:
        return MonitorState.UNKNOWN
    return MonitorState.DOWN if silence_s * 1000 >= threshold_ms else MonitorState.UP


def down_alert(node: str, monitor: str | None, threshold_ms: int, now_ms: int) -> Alert:
    """The OPEN alert a node stores; it names no node, so every node's resolution has its labels."""
    return Alert(
        AlertKind.MONITOR_DOWN, AlertState.OPEN, Severity.CRITICAL,
        f"no liveness monitor has decided for {threshold_ms / 1000:.0f} s (alerts.monitorLagMillis): the last one "
        f"heard was {monitor or '?'}; the name-server nodes expire brokers with their own scan meanwhile (seen by "
        f"{node}). Check the streaming job (namesrv-monitor, make run's log)", now_ms,
    )  # fmt: skip


def resolution(opened: Notice, node: str, now_ms: int) -> Notice:
    """The notice that resolves ``opened``, whichever node sent it: the OPEN's labels, annotations and start."""
    alert = decode_alert(orjson.dumps(opened.alert))
    return notice_of(
        alert.resolved(f"a liveness monitor decides again (heard by {node})", now_ms), node, now_ms, opened
    )


class MonitorDownPager:
    """One node's share of MONITOR_DOWN: open and resolve it in Redis, and page it to the receivers, if any."""

    def __init__(
        self,
        client: redis_clients.Client,
        keys: RedisKeys,
        node: str,
        watchdog: MonitorWatchdog,
        settings: PagingSettings,
        threshold_ms: int,
    ) -> None:
        self.client, self.keys, self.node, self.watchdog = client, keys, node, watchdog
        self.settings, self.threshold_ms = settings, threshold_ms
        #: a resolution this node took out of Redis: receivers (name -> (URL, kind)) that still lack it
        self.unsent: tuple[Notice, dict[str, tuple[str, str]]] | None = None
        self.failing: set[str] = set()

    @classmethod
    def from_config(cls, config: NamesrvConfig, node: str, watchdog: MonitorWatchdog) -> MonitorDownPager | None:
        """The pager of a node with ``redisUrl``, receivers or none; None (and why, logged) otherwise.

        Without a receiver it still opens and resolves the alert in Redis (the console and
        ``namesrv-monitor routes alerts`` show it); it only sends nothing.
        """
        alertmanagers, webhook = alert_receivers(config)
        settings = PagingSettings(alertmanagers, webhook, config.alerts_resend_interval_millis, raised_by=node)
        if not config.redis_url.strip():
            return None
        connected = connect_node_redis(config, "no MONITOR_DOWN page from this node")
        return (
            None if connected is None else cls(*connected, node, watchdog, settings, config.alerts_monitor_lag_millis)
        )

    async def run(self) -> None:
        failed: tuple[type[Exception], ...] = (*redis_clients.failures(), ValueError)  # ValueError: a notice not ours
        try:
            while True:
                await asyncio.sleep(PERIOD_S)
                try:
                    await asyncio.to_thread(self.step)
                except failed as exc:
                    log.warning("MONITOR_DOWN: redis failed (%r); trying again in %.0f s", exc, PERIOD_S)
        finally:
            self.client.close()

    def step(self) -> None:
        """One look: page, resend or resolve as the watchdog and Redis say (blocks: run on a thread)."""
        now = wall_ms()
        state = monitor_state(self.watchdog.silence_s(), self.threshold_ms)
        if state is MonitorState.DOWN:
            self.unsent = None  # down again: the open one supersedes an undelivered resolution
            self.page(now)
        elif state is MonitorState.UP:
            self.resolve(now)
        if self.unsent is not None:
            self.send_resolution(now)

    def page(self, now: int) -> None:
        k = self.keys
        fresh = notice_of(down_alert(self.node, self.watchdog.monitor, self.threshold_ms, now), self.node, now)
        stored, here = self.client.eval(_OPEN, 2, k.monitor_down, k.alerts, fresh.encode(), fresh.incident,
                                        orjson.dumps(fresh.alert))  # fmt: skip
        if stored == HEARD:
            return
        opened = Notice.decode(stored)
        if here:
            log.error("MONITOR_DOWN opened: no liveness monitor heard for %d ms; %s", self.threshold_ms, self._whom())
        else:  # open for a while, or opened by another node: a job's rewrite may have dropped it from P:alerts
            self.client.eval(_SHOW, 2, k.monitor_down, k.alerts, stored, opened.incident, orjson.dumps(opened.alert))
        if not self.settings.enabled:
            return  # no receiver: Redis is where it shows
        if not self.client.set(k.monitor_down_resend, self.node, nx=True, px=self.settings.resend_ms):
            return  # sent within this interval, by this node or another
        failed = self.deliver(opened, dict(self._receivers()), now)
        if failed:  # let the next look (this node's or another's) send it again
            self.client.eval(_RELEASE, 1, k.monitor_down_resend, self.node)

    def resolve(self, now: int) -> None:
        k = self.keys
        # the resolved alert's content does not depend on the stored notice, so it is made before taking it
        blank = down_alert(self.node, None, self.threshold_ms, now).resolved("a liveness monitor decides again", now)
        entry = encode_alert(blank, raised_by=self.node, emitted_at=now)
        taken = self.client.eval(_RESOLVE, 4, k.monitor_down, k.alerts, k.alerts_resolved, k.monitor_down_resend,
                                 blank.incident, entry, MAX_RESOLVED, HEARD, self.threshold_ms)  # fmt: skip
        if taken is None:
            return
        log.warning("MONITOR_DOWN resolved: monitor %r heard again", self.watchdog.monitor)
        if self.settings.enabled:
            self.unsent = (resolution(Notice.decode(taken), self.node, now), dict(self._receivers()))

    def send_resolution(self, now: int) -> None:
        assert self.unsent is not None
        notice, left = self.unsent
        # past this the receivers have let the open one expire by themselves
        expired = now - (notice.ends_at or now) > ENDS_AT_RESENDS * self.settings.resend_ms
        left = {} if expired else self.deliver(notice, left, now)
        self.unsent = (notice, left) if left else None

    def deliver(self, notice: Notice, receivers: dict[str, tuple[str, str]], now: int) -> dict[str, tuple[str, str]]:
        """POST ``notice`` to each receiver; returns those that did not take it (to try again)."""
        failed = {}
        for name, (url, kind) in receivers.items():
            try:
                post_json(url, request_body(kind, [notice], now, self.settings), SEND_TIMEOUT_S)
            except DeliveryError as exc:
                failed[name] = (url, kind)
                if name not in self.failing:
                    log.warning("MONITOR_DOWN: %s at %s does not take it (%s); trying again", name, url, exc)
                self.failing.add(name)
                continue
            except Refused as exc:
                log.error("MONITOR_DOWN: %s refused %s (dropped): %s", name, notice.state, exc)
            if name in self.failing:
                self.failing.discard(name)
                log.warning("MONITOR_DOWN: %s takes alerts again", name)
        return failed

    def _receivers(self) -> list[tuple[str, tuple[str, str]]]:
        return [(name, (url, kind)) for name, url, kind in self.settings.targets()]

    def _whom(self) -> str:
        """Where the alert goes, for the log."""
        if self.settings.enabled:
            return "paging " + ", ".join(name for name, _, _ in self.settings.targets())
        return (
            "no receiver (alerts.alertmanagerUrl, alerts.webhookUrl): shown in Redis only, by the console and "
            "namesrv-monitor routes alerts"
        )
