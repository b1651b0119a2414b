"""Structured, quiet-by-default logs: one ``key=value`` line per record on stderr."""

from __future__ import annotations

import logging
import sys
import time


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
