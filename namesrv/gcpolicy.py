"""The node's garbage-collector policy: the one place that calls :mod:`gc`.

CPython's cyclic collector holds the GIL for a whole pass, and a full pass walks every tracked
object, most of them route-table rows.  Those rows are big, long-lived and acyclic (reference
counting frees them), so walking them finds nothing and stalls every client meanwhile.  The policy
keeps them out of sight with :func:`gc.freeze`, at start-up (:func:`enable`) and at the end of each
large registration that succeeded (:func:`run_large_change`); young passes never stop.  An object
frozen alive that later dies in a cycle would leak, so once resident memory has doubled the next
large job first collects everything (:func:`_reclaim`).  Off by default, so that a node started
inside another process (the tests') leaves its collector alone; ``namesrv start`` turns it on.
``docs/internals/gc.md`` has the figures, the leak argument and what was tried first.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from common import procfs

T = TypeVar("T")

#: a full-pass threshold no count reaches: full passes wait while it is set
_NO_FULL_PASS = 1 << 30
#: the backstop's trigger: resident memory at least twice, and this much more than, after the last reclaim
RECLAIM_GROWTH_BYTES = 64 * 1024 * 1024

_lock = threading.Lock()
_enabled = False
#: large changes in progress (the worker thread runs one at a time; the count keeps nesting safe)
_depth = 0
#: the full-pass threshold to restore when the last large change ends
_saved_full_threshold: int | None = None
#: resident memory right after the last reclaim (or :func:`enable`); None where it cannot be read
_reclaimed_at: int | None = None
#: how many reclaims the backstop ran (for tests and the curious)
reclaims = 0


def enabled() -> bool:
    return _enabled


def enable() -> None:
    """Turn the policy on and freeze what exists now (after a full collection: nothing frozen is garbage)."""
    global _enabled, _reclaimed_at
    with _lock:
        _enabled = True
        gc.collect()
        gc.freeze()
        _reclaimed_at = resident_bytes()


def disable() -> None:
    """Turn the policy off and give the frozen objects back to the collector (tests)."""
    global _enabled
    with _lock:
        _enabled = False
        gc.unfreeze()


def run_large_change(work: Callable[[], T]) -> T:
    """``work()``, which builds many long-lived objects (a large registration, on the worker thread).

    It starts with a full collection of what is not frozen, full passes wait while it runs, and
    what survives it is frozen if it succeeded (see the module notes).  Just ``work()`` while the
    policy is off.
    """
    if not _enabled:
        return work()
    _begin()
    try:
        result = work()
    except BaseException:
        _end(freeze=False)
        raise
    _end(freeze=True)
    return result


def resident_bytes() -> int | None:
    """This process's resident memory (Linux), or None."""
    return procfs.rss_bytes(os.getpid())


def _begin() -> None:
    global _depth, _saved_full_threshold
    with _lock:
        _depth += 1
        if _depth > 1:
            return
        if _memory_doubled():
            _reclaim()
        else:
            gc.collect()  # walks only what is not frozen: what the loop kept since the last freeze
        t0, t1, t2 = gc.get_threshold()
        _saved_full_threshold = t2
        gc.set_threshold(t0, t1, _NO_FULL_PASS)


def _end(*, freeze: bool) -> None:
    global _depth, _saved_full_threshold
    with _lock:
        _depth -= 1
        if _depth > 0:
            return
        if freeze:
            gc.collect(1)  # the young garbage of the job and of the loop meanwhile: not to be frozen
            gc.freeze()
        t0, t1, _ = gc.get_threshold()
        assert _saved_full_threshold is not None
        gc.set_threshold(t0, t1, _saved_full_threshold)
        _saved_full_threshold = None


def _memory_doubled() -> bool:
    if _reclaimed_at is None:
        return False
    now = resident_bytes()
    return now is not None and now > max(2 * _reclaimed_at, _reclaimed_at + RECLAIM_GROWTH_BYTES)


def _reclaim() -> None:
    """One full collection of everything, frozen objects included, then everything frozen again."""
    global _reclaimed_at, reclaims
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    reclaims += 1
    _reclaimed_at = resident_bytes()
