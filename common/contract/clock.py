"""The contract's clock: epoch milliseconds, the unit of every event and action time."""

from __future__ import annotations

import time


def wall_ms() -> int:
    """The wall clock in epoch milliseconds: the unit of every event and action time."""
    return time.time_ns() // 1_000_000
