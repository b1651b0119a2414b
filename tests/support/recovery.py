"""How long the monitor is away after its job dies: ``make run``'s restart, watched from outside.

:class:`Supervising` runs ``make run``'s own :class:`infra.supervisor.Supervisor` over the job, in a
thread, as ``up`` does, and notes each death it handled and each restart, with the wall clock the
nodes stamp events with. :func:`first_heartbeat` finds the first MONITOR_HEARTBEAT decided after a
moment: the nodes hand expiry back to the monitor at that beat, so it is the new job's first
decision that counts for recovery. Used by ``tests/integration/test_monitor_recovery.py`` and
``bench/recovery_bench.py``.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterable
from typing import Any

from common.contract import wall_ms
from infra.processes import ProcessService
from infra.processes import end_dead_session as _end_dead_session
from infra.supervisor import Supervisor
from tests.support.wait import wait_until


class Supervising:
    """``make run``'s supervision of ``service``, in a thread; :meth:`stop` ends it (not the service)."""

    def __init__(self, service: ProcessService) -> None:
        self.service = service
        #: (wall ms the death was noticed, wall ms what the dead process left in its session was gone)
        self.deaths: list[tuple[int, int]] = []
        #: (wall ms, new PID) of each restart
        self.restarts: list[tuple[int, int]] = []
        #: what the supervisor printed (deaths, restarts)
        self.out = io.StringIO()
        self._supervisor = Supervisor([service], out=self.out, end_session=self._end_session)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervising", daemon=True)
        self._thread.start()

    def _end_session(self, sid: int, grace: float) -> None:
        noticed = wall_ms()
        _end_dead_session(sid, grace)
        self.deaths.append((noticed, wall_ms()))

    def _run(self) -> None:
        pid = self.service.running_pid()
        while not self._stop.wait(self._supervisor.next_check_s()):
            self._supervisor.check(self._stop.is_set)
            now = self.service.running_pid()
            if now is not None and now != pid:
                self.restarts.append((wall_ms(), now))
            pid = now

    def death_after(self, since_ms: int, timeout: float) -> tuple[int, int]:
        """The first death handled at or after ``since_ms`` (see :attr:`deaths`), waiting up to ``timeout`` s."""
        found = wait_until(lambda: next((d for d in self.deaths if d[0] >= since_ms), None), timeout, "a death handled")
        assert found is not None
        return found

    def restart_after(self, since_ms: int, timeout: float) -> tuple[int, int]:
        """The first restart at or after ``since_ms`` (see :attr:`restarts`), waiting up to ``timeout`` s."""
        found = wait_until(lambda: next((r for r in self.restarts if r[0] >= since_ms), None), timeout, "a restart")
        assert found is not None
        return found

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def first_heartbeat(actions: Iterable[Any], since_ms: int) -> int | None:
    """``decided_at`` of the first MONITOR_HEARTBEAT among ``actions`` decided at or after ``since_ms``."""
    beats = [a.decided_at for a in actions if str(a.type) == "MONITOR_HEARTBEAT" and a.decided_at >= since_ms]
    return min(beats) if beats else None
