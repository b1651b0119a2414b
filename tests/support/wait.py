"""The one way tests wait for an effect: poll with a deadline, never sleep for it.

Theory of operation: :func:`wait_until` calls ``check`` until it returns something true, and
returns that (so a wait can also fetch what it waited for).  After ``timeout`` seconds it fails
with an ``AssertionError`` naming ``what`` was awaited and, when ``state`` is given, what was seen
instead, so a failure on a loaded machine says how far things got.  ``during`` runs before each
poll, for tests that drive the system by hand (a simulated fleet's clock).  ``check`` is always
called at least once, and once more at the deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from infra.processes import TimedOut, poll_until

__all__ = ["wait_until"]

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    timeout: float = 15.0,
    what: str = "the condition",
    interval: float = 0.05,
    *,
    state: Callable[[], object] | None = None,
    during: Callable[[], object] | None = None,
) -> T:
    """Poll ``check`` every ``interval`` s until it is true (returned) or ``timeout`` s pass (AssertionError)."""

    def probe() -> T:
        if during is not None:
            during()
        return check()

    try:
        return poll_until(probe, timeout, what, interval, state=state)
    except TimedOut as e:  # a test's wait that times out is a failed assertion, not a broken service
        raise AssertionError(str(e)) from None
