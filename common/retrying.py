"""Waiting for a service that is not there yet: one tenacity policy for the node and the job."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import tenacity

T = TypeVar("T")


def retry_until_stopped(
    fn: Callable[[], T],
    stopping: threading.Event,
    *,
    problem: str | Callable[[], str],
    log: logging.Logger,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    first_wait_s: float = 0.2,
    max_wait_s: float = 5.0,
) -> T | None:
    """``fn()`` until it returns, backing off up to ``max_wait_s``; None once ``stopping`` is set.

    The first failure is a warning that says ``problem`` (what is wrong and what to check), the
    later ones debug lines, so an outage is one line in a quiet log however long it lasts.  A
    callable ``problem`` is asked when a line is written, so it can say what the failure taught.
    """

    def report(state: tenacity.RetryCallState) -> None:
        e = state.outcome.exception() if state.outcome else None
        level = logging.WARNING if state.attempt_number == 1 else logging.DEBUG
        if log.isEnabledFor(level):
            said = problem() if callable(problem) else problem
            log.log(level, "%s (%s: %s); retrying until it works", said, type(e).__name__, e)

    def sleep(seconds: float) -> None:
        stopping.wait(seconds)  # a stop ends the wait at once

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(retry_on),
        wait=tenacity.wait_exponential(multiplier=first_wait_s, max=max_wait_s),
        stop=tenacity.stop_when_event_set(stopping),
        sleep=sleep,
        after=report,  # after every failed attempt, so a stop during the first one still says why
        retry_error_callback=lambda _state: None,
    )
    return retrying(fn)
