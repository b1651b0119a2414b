"""A clock for the tests: time that moves only when the test moves it, so no test sleeps.

The code under test takes its clock as an argument. The route tables, the event publisher and the
liveness code read milliseconds (``now_ms=``, ``clock_ms=``): give them the clock itself. The request
timer, the monitor watchdog and the connection's idle timer read seconds, as ``time.monotonic`` does
(``clock=``, ``now=``): give them ``clock.seconds``. Both read the same time, so one clock serves code
that mixes the two.
"""

from __future__ import annotations

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


class Clock:
    """One time, read in milliseconds (calling the clock, or ``ms``) or in seconds (:meth:`seconds`),
    moved on by :meth:`advance` or to a time by :meth:`set`.

    ``step_ms`` moves it on by that much before each reading in milliseconds, for code that stamps
    everything it makes with a new time (the event publisher's events). ``reads`` counts the readings,
    so a test can show that a path reads no clock at all.
    """

    def __init__(self, ms: int = 1_000_000, *, step_ms: int = 0) -> None:
        # nanoseconds: whole milliseconds stay exact and sub-millisecond steps in seconds still add up
        self._ns = ms * NS_PER_MS
        self.step_ms = step_ms
        self.reads = 0

    def __call__(self) -> int:
        """The time in milliseconds, as the route tables' ``now_ms`` reads it."""
        self._ns += self.step_ms * NS_PER_MS
        self.reads += 1
        return self.ms

    @property
    def ms(self) -> int:
        """The time in whole milliseconds; setting it moves the clock there (no reading is counted)."""
        return self._ns // NS_PER_MS

    @ms.setter
    def ms(self, value: int) -> None:
        self._ns = value * NS_PER_MS

    def seconds(self) -> float:
        """The time in seconds, as ``time.monotonic()`` reads it."""
        self.reads += 1
        return self._ns / NS_PER_S

    def advance(self, ms: float = 0, *, seconds: float = 0) -> None:
        """Move the time on by ``ms`` milliseconds and ``seconds`` seconds."""
        self._ns += round(ms * NS_PER_MS) + round(seconds * NS_PER_S)

    def set(self, ms: float = 0, *, seconds: float = 0) -> None:
        """Move the time to ``ms`` milliseconds plus ``seconds`` seconds (a wall clock's epoch seconds, say)."""
        self._ns = round(ms * NS_PER_MS) + round(seconds * NS_PER_S)
