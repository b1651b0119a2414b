"""The node's garbage-collector policy: the one place that calls :mod:`gc`.

Why a policy at all
-------------------
CPython's cyclic collector holds the GIL for the whole of a pass, so while it runs no client is
served, whichever thread set it off.  Its young passes walk a few thousand objects (a millisecond
or two), but a full pass walks every tracked object of the process, and the route tables are most
of them: a 100,000-topic broker leaves one dict per topic (its row map; the QueueData in it are
shared, see ``namesrv.routes.tables.shared_queue_data``).  Measured on the 2-core test machine, a
first registration of such a broker set off three or four full passes of 30-130 ms each (its
decoded topics, alive for the second the registration takes, reach the oldest generation and trip
the collector's own trigger), and each re-registration two or three of 25-40 ms: ten times the
5 ms a route lookup may take.

The tables are big, long-lived and acyclic: reference counting frees a row the moment its broker
leaves, and walking them never finds anything to collect.  So the policy keeps them out of the
collector's sight with :func:`gc.freeze`, which moves every object then alive to a permanent
generation that no pass walks (in constant time; a frozen object is still freed by reference
counting when its last reference goes).  It freezes at two moments:

* start-up (:func:`enable`, called by ``namesrv start`` before it listens), after a full
  collection: modules, classes and warm-started routes live as long as the process;
* the end of each large registration that succeeded (:func:`run_large_change`, the worker
  thread's job in ``handlers.register_broker``).  The job starts with a full collection of what is
  not frozen yet (little: everything long-lived before it is), so there is no garbage about to be
  frozen; while it runs, full passes wait (young ones go on, for everyone's short-lived garbage);
  at its end a young pass clears the young garbage and the rest, its new rows and decoded topics
  and whatever the loop holds at that moment, is frozen unwalked.  A job that failed freezes
  nothing: its exception is in flight, and with its traceback it is a cycle (freezing failed
  zip-bomb jobs too took a node to 1.1 GiB in one minute of ``bench/soak.py``; 183 MiB without).

What it could leak, and the bound
---------------------------------
An object frozen while alive that later dies *in a reference cycle* is never collected.  The route
tables form no cycle (``tests/unit/test_gcpolicy.py`` checks that a 100,000-topic broker's rows go
by reference counting alone), closed connections and broken decoders form none (see
``server.Connection.connection_lost``), a failed off-loop job's answer forms none
(``handlers.Pending.resolve``), and repeated 100,000-topic register/unregister rounds leave the
permanent generation as they found it (tested).  Whatever else the loop holds at a freeze could,
so there is a backstop: when the process's resident memory has doubled (and grown by
:data:`RECLAIM_GROWTH_BYTES`) since the last reclaim, the next large job starts with one full
collection of *everything*, frozen objects included (:func:`_reclaim`), which pauses every client
for as long as it takes to walk the tables once (~25 ms with 100,000 topics), then freezes again.

Why not pause the collector during worker jobs instead: it was tried (commit 1d9c0f7 undid it).
Under every issue-9 attack at once the worker is busy nearly all the time, so nothing was
collected, young garbage included, and a node's RSS grew to 270-540 MiB in 30 s.  Here young
passes never stop, and full ones wait only for the duration of one registration job.

Off by default, so that a node started inside another process (the tests' in-process nodes)
leaves that process's collector alone; ``namesrv start`` turns it on.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from namesrv import procfs

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
