"""The worker thread's jobs run with automatic garbage collection paused (handlers.OffLoopWorker)."""

from __future__ import annotations

import gc

from namesrv import handlers
from namesrv.handlers import OffLoopWorker


def test_a_job_runs_paused_and_leaves_its_many_objects_unwalked_in_the_oldest_generation():
    worker = OffLoopWorker()
    try:
        assert worker.submit(gc.isenabled).result(10) is False
        kept = worker.submit(lambda: [[i] for i in range(3 * handlers._MANY_YOUNG_OBJECTS)]).result(10)
        assert gc.isenabled()
        assert gc.get_count()[0] < handlers._MANY_YOUNG_OBJECTS  # moved on, not left for one long young walk
        assert len(kept) == 3 * handlers._MANY_YOUNG_OBJECTS
    finally:
        worker.shutdown()


def test_a_worker_kept_busy_still_gets_a_full_collection_now_and_then(monkeypatch):
    monkeypatch.setattr(handlers, "_FULL_COLLECTION_S", 0.0)
    worker = OffLoopWorker()
    try:
        before = gc.get_stats()[-1]["collections"]
        for _ in range(2):  # the first moves objects, the second finds them moved too long ago
            worker.submit(lambda: [[i] for i in range(3 * handlers._MANY_YOUNG_OBJECTS)]).result(10)
        assert gc.get_stats()[-1]["collections"] > before
    finally:
        worker.shutdown()
    assert gc.isenabled()
