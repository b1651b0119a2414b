"""Structured, quiet-by-default logs: one ``key=value`` line per record on stderr.

Every value is quoted when it is not a plain word, and control characters, lone surrogates and line
separators are escaped (``\\x00``, ``\\ud800``), so text a peer chose (a topic, a KV key, a frame's
bytes) can neither forge a second line nor break the UTF-8 of the log.  :class:`RateLimited` keeps
what a peer can trigger at will (malformed frames, refused requests) to a few lines a minute.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = f"ts={ts} level={record.levelname.lower()} logger={record.name} msg={_quote(record.getMessage())}"
        for key, value in getattr(record, "fields", {}).items():
            line += f" {key}={_quote(str(value))}"
        if record.exc_info:
            line += f" exc={_quote(self.formatException(record.exc_info))}"
        return line


#: what must never reach the log raw: C0/C1 controls, DEL, lone surrogates, Unicode line separators
_UNSAFE = re.compile('[\\\\"\\x00-\\x1f\\x7f-\\x9f\\ud800-\\udfff\\u2028\\u2029]')
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    escaped = _ESCAPES.get(c)
    if escaped is not None:
        return escaped
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every character that could forge or break a log line escaped."""
    return _UNSAFE.sub(_escape_char, text)


def _quote(text: str) -> str:
    if text and all(c.isalnum() or c in "-_./:@" for c in text):
        return text
    return '"' + escape(text) + '"'


class RateLimited:
    """At most ``per_minute`` records a minute through ``logger``; the rest are counted, and the
    count is reported with the next record that gets through."""

    def __init__(self, logger: logging.Logger, per_minute: int = 10) -> None:
        self.logger = logger
        self.per_minute = per_minute
        self._lock = threading.Lock()
        self._window = 0.0
        self._sent = 0
        self._suppressed = 0

    def log(self, level: int, msg: str, *args: object, **kwargs: Any) -> bool:
        """Log unless the budget of this minute is spent; True when the record was written."""
        if not self.logger.isEnabledFor(level):
            return False
        now = time.monotonic()
        with self._lock:
            if now - self._window >= 60.0:
                self._window, self._sent = now, 0
            if self._sent >= self.per_minute:
                self._suppressed += 1
                return False
            self._sent += 1
            suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            msg += " (%d similar lines suppressed)"
            args += (suppressed,)
        self.logger.log(level, msg, *args, stacklevel=2, **kwargs)
        return True


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
        # and why a broker refused them, which kafka-python's lost-connection ERRORs say: those are still
        # made, read, and shown only as the "kafka" logger's level says (common.kafka_refusals, once installed)
        logging.getLogger("kafka.net.connection").setLevel(logging.ERROR)
    else:
        logging.getLogger("kafka.net.connection").setLevel(logging.NOTSET)


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
