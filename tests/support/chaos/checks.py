"""What the chaos harness holds the system to, read only where users read: the nodes' answers, Redis,
Alertmanager's notifications, the RocketMQ clients' own results, and our processes' logs.

:class:`~tests.support.liveness.Observer` watches every live node and Redis throughout (a wrong
removal, a broker back in Redis after it left, when each place stopped listing a dying broker).
:class:`Pager` is Debian's Prometheus Alertmanager with every alert its own group, notifying a webhook
receiver of the harness, so each incident's notifications can be counted. :func:`same_routes_everywhere`
waits until every live node answers every topic with the bytes Redis holds; :func:`tracebacks` finds the
tracebacks in our logs.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from common import redis_clients
from namesrv.client import NameServerClient
from tests.support.alertmanager import Alertmanager
from tests.support.liveness import known_in_redis, quick_lookup
from tests.support.routes import route_or_none
from tests.support.webhook import Webhook

__all__ = ["Pager", "same_routes_everywhere", "tracebacks"]

# --------------------------------------------------------------------------- routes


def routes_everywhere(node_addrs: Iterable[str], redis_url: str) -> dict[str, list[bytes | None]]:
    """Every topic Redis or a node knows -> [Redis's bytes, then each node's answer]."""
    addrs = list(node_addrs)
    lookup = quick_lookup(redis_url)
    try:
        topics = set(lookup.topics())
        for addr in addrs:
            with NameServerClient(addr, timeout=3.0) as client:
                topics |= set(client.topic_list())
        return {t: [lookup.get_raw(t), *(route_or_none(a, t) for a in addrs)] for t in sorted(topics)}
    finally:
        lookup.close()


def same_routes_everywhere(node_addrs: Iterable[str], redis_url: str, timeout: float) -> tuple[float, dict]:
    """Wait until every node in ``node_addrs`` answers every topic with Redis's bytes: (seconds it took, or
    -1 when ``timeout`` passed first; the topics that differed last)."""
    addrs, t0 = list(node_addrs), time.monotonic()
    differing: dict[str, list[bytes | None]] = {}
    #: (seconds since t0, the topics that differed then), for each change of that set
    history: list[tuple[float, list[str]]] = []
    while time.monotonic() - t0 <= timeout:
        try:
            seen = routes_everywhere(addrs, redis_url)
        except (*redis_clients.failures(), AssertionError):
            time.sleep(0.1)
            continue
        differing = {t: a for t, a in seen.items() if len(set(a)) > 1}
        if not history or history[-1][1] != sorted(differing):
            history.append((round(time.monotonic() - t0, 2), sorted(differing)))
        if not differing:
            return time.monotonic() - t0, {"history": history}
        time.sleep(0.1)
    return -1.0, {"history": history, "last": differing}


# --------------------------------------------------------------------------- Alertmanager


PAGER_CONFIG = """\
route:
  receiver: harness
  group_by: ['...']
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 24h
receivers:
  - name: harness
    webhook_configs:
      - url: {url}
        send_resolved: true
"""


@dataclass
class Episodes:
    """Per alert (its labels), the notifications Alertmanager sent, in order."""

    sent: dict[tuple[tuple[str, str], ...], list[str]] = field(default_factory=dict)

    def broken(self) -> list[str]:
        """Alerts whose incidents were not each notified once firing, then once resolved. Incidents of a kind
        that names nothing (MONITOR_DOWN, MONITOR_LAGGING) share their labels, so one alert's notifications
        are firing, resolved, firing, resolved ...: anything else is an incident notified twice."""
        out = []
        for labels, states in self.sent.items():
            if any(state != ("firing", "resolved")[i % 2] for i, state in enumerate(states)):
                out.append(f"{dict(labels).get('alertname', '?')} {dict(labels)}: {states}")
        return out

    def incidents(self) -> int:
        return sum(states.count("firing") for states in self.sent.values())

    def still_firing(self) -> list[str]:
        return [f"{dict(labels)}" for labels, states in self.sent.items() if states[-1:] == ["firing"]]


class Pager:
    """Alertmanager notifying the harness's webhook of every alert on its own (see the module docstring)."""

    def __init__(self, tmp: Path) -> None:
        self.hook = Webhook()
        tmp.mkdir(parents=True, exist_ok=True)
        self.alertmanager = Alertmanager(tmp, config=PAGER_CONFIG.format(url=self.hook.url))

    @property
    def url(self) -> str:
        return self.alertmanager.url

    def start(self) -> Pager:
        self.alertmanager.start()
        return self

    def episodes(self) -> Episodes:
        out = Episodes()
        for body in self.hook.bodies():
            for alert in body.get("alerts", []):
                labels = tuple(sorted(alert.get("labels", {}).items()))
                out.sent.setdefault(labels, []).append(str(alert.get("status")))
        return out

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.alertmanager.stop()
        self.hook.close()


# --------------------------------------------------------------------------- logs


_TRACEBACK = re.compile(r"Traceback \(most recent call last\)")


def tracebacks(logs: Iterable[Path]) -> dict[str, int]:
    """Log file -> how many tracebacks it holds, for the files that hold any."""
    found = {}
    for path in logs:
        with contextlib.suppress(OSError):
            n = len(_TRACEBACK.findall(path.read_text(errors="replace")))
            if n:
                found[str(path)] = n
    return found


def known_now(redis_url: str) -> set[str]:
    """The brokers the job's cluster entry in Redis lists now."""
    lookup = quick_lookup(redis_url)
    try:
        return known_in_redis(lookup)
    finally:
        lookup.close()
