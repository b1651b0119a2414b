"""Structured, quiet-by-default logs: one ``key=value`` line per record on stderr."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Hashable


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = f"ts={ts} level={record.levelname.lower()} logger={record.name} msg={_quote(record.getMessage())}"
        for key, value in getattr(record, "fields", {}).items():
            line += f" {key}={_quote(str(value))}"
        if record.exc_info:
            line += f" exc={_quote(self.formatException(record.exc_info))}"
        return line


def _quote(text: str) -> str:
    if text and all(c.isalnum() or c in "-_./:@" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def setup_logging(level: str = "WARNING") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if root.level > logging.DEBUG:
        # kafka-python logs an ERROR on every reconnect attempt while Kafka is down; our publisher
        # and consumer report the outage once, in words an operator can act on
        logging.getLogger("kafka").setLevel(logging.CRITICAL)


class LogThrottle:
    """Say when a warning about ``key`` may be logged again: at most once per ``interval_s`` per key.

    For warnings a remote party can trigger at will (a bad event, an untrusted monitor): the first
    one is logged, repeats within the interval are only counted by the caller.  At most
    ``max_keys`` keys are remembered, so a flood of distinct keys cannot grow memory; past it the
    oldest is forgotten (and may be logged again early).
    """

    def __init__(self, interval_s: float, now: Callable[[], float] = time.monotonic, max_keys: int = 1024) -> None:
        self.interval_s = interval_s
        self.now = now
        self.max_keys = max_keys
        self._last: dict[Hashable, float] = {}

    def allow(self, key: Hashable) -> bool:
        now = self.now()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._last.pop(key, None)  # re-insert: the dict's order is the order of last logging
        if len(self._last) >= self.max_keys:
            del self._last[next(iter(self._last))]
        self._last[key] = now
        return True
