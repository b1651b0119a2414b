"""Alerts that reach people: Prometheus Alertmanager's v2 API and a generic JSON webhook.

The job decides alerts (:mod:`streaming.alerts`); this module delivers them, and must never slow a
batch down nor lose one across a restart of either side.  :meth:`Pager.submit` only queues the
batch's alerts (bounded, the latest word on an incident wins) for one thread per target, which
POSTs them with back-off and splits a refused payload to drop only what is refused alone.  Open
alerts are re-sent every ``alerts.resendIntervalMillis`` with ``endsAt`` a few intervals ahead,
because Alertmanager forgets; resolutions wait in a Redis outbox until every target has them, so a
restarted job (:meth:`Pager.start`) re-sends what was open or undelivered.
``docs/internals/alerts.md`` has the delivery rules and what each target receives.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from common.contract import wall_ms
from common.paging import (
    ENDS_AT_RESENDS,
    DeliveryError,
    Notice,
    PagingSettings,
    Refused,
    iso,
    labels_of,
    notice_of,
    post_json,
    request_body,
)
from common.retrying import retry_until_stopped
from streaming.alerts import Alert

if TYPE_CHECKING:
    from common import redis_clients
    from streaming.config import StreamingConfig
    from streaming.routes import RedisRouteStore

log = logging.getLogger(__name__)

# what a receiver gets is the nodes' too (common.paging); the monitor's modules take it from here
__all__ = [
    "ENDS_AT_RESENDS",
    "DeliveryError",
    "Notice",
    "Outbox",
    "Pager",
    "PagingSettings",
    "Refused",
    "Target",
    "iso",
    "labels_of",
    "notice_of",
    "pager_for",
    "post_json",
]

#: incidents waiting per target; past it the oldest OPEN ones are dropped first (resends carry them)
MAX_PENDING = 10_000
#: alerts per POST
MAX_BATCH = 500


# --------------------------------------------------------------------------- the outbox


_COMPARE_AND_DELETE = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""


class Outbox:
    """Resolutions not yet delivered everywhere, in a Redis hash (incident -> :meth:`Notice.encode`)."""

    def __init__(self, client: redis_clients.Client, key: str) -> None:
        self.client = client
        self.key = key

    def load(self) -> list[Notice]:
        out = []
        for incident, raw in self.client.hgetall(self.key).items():
            try:
                out.append(Notice.decode(raw))
            except ValueError as exc:
                log.warning("paging: dropping outbox entry %r: %s", incident, exc)
                self.client.hdel(self.key, incident)
        return out

    def remove(self, notice: Notice) -> None:
        self.client.eval(_COMPARE_AND_DELETE, 1, self.key, notice.incident, notice.encode())


# --------------------------------------------------------------------------- targets


class Target(threading.Thread):
    """One receiver: a queue of notices and the thread that delivers them."""

    def __init__(self, pager: Pager, name: str, url: str, kind: str) -> None:
        super().__init__(name=f"paging-{kind}", daemon=True)
        self.pager = pager
        self.target_name = name
        self.url = url
        self.kind = kind
        self.lock = threading.Lock()
        self.pending: dict[str, Notice] = {}
        self.wake = threading.Event()
        #: the next attempt sends every open alert (start, resend due, after a failure)
        self.resync = True
        self.next_resend = 0.0
        self.delivered = 0
        self.dropped = 0
        self.failures = 0

    def enqueue(self, notices: Iterable[Notice]) -> None:
        with self.lock:
            for n in notices:
                self.pending.pop(n.incident, None)  # re-insert: the order is the age of the latest word
                self.pending[n.incident] = n
            while len(self.pending) > MAX_PENDING:
                victim = next((i for i, n in self.pending.items() if n.state == "OPEN"), None)
                victim = victim if victim is not None else next(iter(self.pending))
                gone = self.pending.pop(victim)
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.warning("paging: %s queue full (%d); dropped %s of %s (%d so far)",
                                self.target_name, MAX_PENDING, gone.state, victim, self.dropped)  # fmt: skip
                if gone.state == "RESOLVED":
                    self.pager.done(self, [gone])
        self.wake.set()

    def run(self) -> None:
        p = self.pager
        while not p.stopping.is_set():
            wait = max(0.0, self.next_resend - time.monotonic())
            self.wake.wait(wait)
            self.wake.clear()
            if p.stopping.is_set():
                break
            if time.monotonic() >= self.next_resend:
                self.resync = True
            self.failures = 0
            try:
                retry_until_stopped(
                    self._attempt, p.stopping, log=log, retry_on=DeliveryError, first_wait_s=0.5,
                    max_wait_s=min(30.0, p.settings.resend_ms / 1000),
                    problem=f"paging: {self.target_name} at {self.url} does not take alerts",
                )  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - a bug must not end paging; the next round retries
                log.exception("paging: delivery to %s failed unexpectedly: %r", self.target_name, exc)
                p.stopping.wait(1.0)

    def _attempt(self) -> None:
        p = self.pager
        with self.lock:
            batch = dict(self.pending)
            resync = self.resync
        if resync:
            for incident, n in p.open_notices().items():
                batch.setdefault(incident, n)
        if batch:
            try:
                self._send(list(batch.values()))
            except DeliveryError:
                self.failures += 1
                with self.lock:
                    self.resync = True  # the receiver may have restarted meanwhile: give it everything
                raise
        with self.lock:
            for incident, n in batch.items():
                if self.pending.get(incident) is n:
                    del self.pending[incident]
            if resync:
                self.resync = False
                self.next_resend = time.monotonic() + p.settings.resend_ms / 1000
        if self.failures:
            log.warning("paging: %s at %s takes alerts again (%d failed attempt(s))",
                        self.target_name, self.url, self.failures)  # fmt: skip
            self.failures = 0
        self.delivered += len(batch)
        p.done(self, [n for n in batch.values() if n.state == "RESOLVED"])

    def _send(self, notices: list[Notice]) -> None:
        for i in range(0, len(notices), MAX_BATCH):
            chunk = notices[i : i + MAX_BATCH]
            try:
                self._post(chunk)
            except Refused as exc:
                if len(chunk) == 1:
                    log.error("paging: %s refused %s (dropped): %s", self.target_name, chunk[0].incident, exc)
                    continue
                for one in chunk:  # find the one it refuses; the others go through
                    self._send([one])

    def _post(self, notices: list[Notice]) -> None:
        p = self.pager
        post_json(self.url, request_body(self.kind, notices, p.clock(), p.settings), p.settings.timeout_ms / 1000)


# --------------------------------------------------------------------------- the pager


class Pager:
    """Every target, the open alerts they are sent again, and the outbox of resolutions."""

    def __init__(
        self, settings: PagingSettings, outbox: Outbox | None = None, clock: Callable[[], int] = wall_ms
    ) -> None:
        self.settings = settings
        self.outbox = outbox
        self.clock = clock
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self._open: dict[str, Notice] = {}
        #: resolution incident -> (the notice in the outbox, targets that do not have it yet)
        self._outstanding: dict[str, tuple[Notice, set[str]]] = {}
        self.targets = [Target(self, name, url, kind) for name, url, kind in settings.targets()]
        self._started = False

    # -- the batch's side (under the sink's lock; never blocks on a target)

    def stage(self, alerts: Iterable[Alert]) -> list[Notice]:
        """The notices for a batch's alerts (no state changes: :meth:`submit` them once written)."""
        now = self.clock()
        staged: dict[str, Notice] = {}
        with self.lock:
            for a in alerts:
                opened = staged.get(a.incident) or self._open.get(a.incident)
                if opened is not None and opened.state != "OPEN":
                    opened = None
                staged[a.incident] = notice_of(a, self.settings.raised_by, now, opened)
        return list(staged.values())

    def outbox_entries(self, notices: Iterable[Notice]) -> dict[str, bytes]:
        """What the batch's transaction writes to the outbox: its resolutions."""
        return {n.incident: n.encode() for n in notices if n.state == "RESOLVED"} if self.outbox else {}

    def submit(self, notices: list[Notice]) -> None:
        """Queue ``notices`` at every target; returns at once."""
        if not notices:
            return
        names = {t.target_name for t in self.targets}
        with self.lock:
            for n in notices:
                if n.state == "OPEN":
                    self._open[n.incident] = n
                    self._outstanding.pop(n.incident, None)
                else:
                    self._open.pop(n.incident, None)
                    if self.outbox is not None:
                        self._outstanding[n.incident] = (n, set(names))
        for t in self.targets:
            t.enqueue(notices)

    # -- the targets' side

    def open_notices(self) -> dict[str, Notice]:
        with self.lock:
            return dict(self._open)

    def done(self, target: Target, resolved: list[Notice]) -> None:
        """``target`` has (or gave up on) these resolutions; one every target has leaves the outbox."""
        if self.outbox is None or not resolved:
            return
        finished = []
        with self.lock:
            for n in resolved:
                held = self._outstanding.get(n.incident)
                if held is None or held[0] is not n:
                    continue
                held[1].discard(target.target_name)
                if not held[1]:
                    del self._outstanding[n.incident]
                    finished.append(n)
        for n in finished:
            try:
                self.outbox.remove(n)
            except Exception as exc:  # noqa: BLE001 - Redis down: the entry is sent again after a restart
                log.warning("paging: outbox entry %s not removed (%r)", n.incident, exc)

    # -- life cycle

    def start(self, open_alerts: Mapping[str, Alert]) -> None:
        """Seed the open alerts (from Redis), re-queue the outbox's resolutions, start the threads."""
        now = self.clock()
        with self.lock:
            self._open = {i: notice_of(a, self.settings.raised_by, now) for i, a in open_alerts.items()}
        pending: list[Notice] = []
        if self.outbox is not None:
            try:
                for n in self.outbox.load():
                    if n.incident in open_alerts:  # opened again since: the resolution is moot
                        self.outbox.remove(n)
                    else:
                        pending.append(n)
            except Exception as exc:  # noqa: BLE001 - Redis down must not stop the monitor
                log.error("paging: cannot read the outbox (%r); undelivered resolutions wait for Redis", exc)
        if pending:
            log.info("paging: %d resolution(s) from the outbox to deliver", len(pending))
            self.submit(pending)
        if not self._started:
            self._started = True
            for t in self.targets:
                t.start()
        log.info(
            "paging: %s; %d open alert(s) sent again every %d ms",
            ", ".join(f"{t.target_name} ({t.url})" for t in self.targets), len(self._open), self.settings.resend_ms,
        )  # fmt: skip

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopping.set()
        for t in self.targets:
            t.wake.set()
        for t in self.targets:
            if t.is_alive():
                t.join(timeout_s)


def pager_for(cfg: StreamingConfig, store: RedisRouteStore | None) -> Pager | None:
    """The job's pager, None when no target is configured (the shipped default)."""
    settings = PagingSettings(
        alertmanager_urls=cfg.alertmanager_urls,
        webhook_url=cfg.webhook_url,
        resend_ms=cfg.alerts_resend_interval_millis,
        timeout_ms=cfg.alerts_send_timeout_millis,
        generator_url=cfg.alerts_generator_url,
        raised_by=cfg.monitor_name,
    )
    if not settings.enabled:
        return None
    outbox = None if store is None else Outbox(store.client, store.keys.alerts_outbox)
    return Pager(settings, outbox)
