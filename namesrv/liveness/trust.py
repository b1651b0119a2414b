"""Which monitor's actions the node obeys, read from the one clock of when the monitor was last heard.

With ``trustedMonitors`` configured: those ids, always. Without: the first monitor heard, until it has
been silent for ``monitorSilenceFallbackMillis``; the next one heard after that takes over. The silence
is the watchdog's (:meth:`MonitorWatchdog.silence_s`), so a node that itself stood still does not hand
the monitor's place to another for a silence that was its own.
"""

from __future__ import annotations

import logging
from typing import Any

from common.logs import LogThrottle
from namesrv.liveness.watchdog import MonitorWatchdog

#: at most one warning per this many seconds about each refused monitor
REFUSAL_LOG_INTERVAL_S = 60.0

log = logging.getLogger("namesrv.liveness")


def trusted_monitors(config: Any) -> frozenset[str]:
    """The ids of ``trustedMonitors`` (';'-separated, blanks ignored); empty: trust the first heard."""
    return frozenset(m.strip() for m in config.trusted_monitors.split(";") if m.strip())


class MonitorTrust:
    """Admits a monitor's action or refuses it (with a warning, once a minute per refused id)."""

    def __init__(self, trusted: frozenset[str], watchdog: MonitorWatchdog) -> None:
        self.trusted = trusted
        #: who was heard last and how long ago; the applier tells it of every admitted action
        self.watchdog = watchdog
        self._warnings = LogThrottle(REFUSAL_LOG_INTERVAL_S, watchdog.now)

    def admit(self, monitor: str, what: str = "action") -> bool:
        """True if ``monitor`` is obeyed (the caller then tells the watchdog it was heard); else warn and False."""
        if self.trusted:
            if monitor in self.trusted:
                return True
            if self._warnings.allow(monitor):
                log.warning(
                    "ignoring %s from monitor %r: not in trustedMonitors (%s); add its id there to obey it",
                    what,
                    monitor,
                    ";".join(sorted(self.trusted)),
                )
            return False
        current, silence_s = self.watchdog.monitor, self.watchdog.silence_s()
        if current is None or silence_s is None:
            log.info("obeying monitor %r, the first one heard (trustedMonitors is empty)", monitor)
        elif monitor != current:
            silent_ms = silence_s * 1000
            limit_ms = self.watchdog.silence_ms
            if silent_ms < limit_ms:
                if self._warnings.allow(monitor):
                    log.warning(
                        "ignoring %s from monitor %r: this node obeys monitor %r, the first one it heard, "
                        "until that one is silent for %d ms (monitorSilenceFallbackMillis); set "
                        "trustedMonitors to choose",
                        what,
                        monitor,
                        current,
                        limit_ms,
                    )
                return False
            log.warning(
                "monitor %r silent for %d ms (monitorSilenceFallbackMillis=%d): obeying monitor %r from now on",
                current,
                silent_ms,
                limit_ms,
                monitor,
            )
        return True
