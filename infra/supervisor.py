"""Keeping a running stack running: a :class:`Supervisor` that restarts whatever dies, on a :class:`RestartPolicy`.

``make run``'s ``up`` (:mod:`infra.stack`) and the replicated topology's polls their PIDs through
:meth:`Supervisor.check` (about once a second, from /proc, no probe).  When one is gone it prints one line
naming the service, how it ended (:func:`describe_exit`) and when it will be restarted, then the end of its
log, or for the job the error its own code logged as it died (:func:`own_last_error`); it ends what the dead
process left in its session and restarts it after 1 s, doubling up to 60 s, back to 1 s once a run has
lasted 60 s, while the rest keeps running.  Time comes from the clocks it is given, so tests drive it by
hand.  ``docs/internals/local-stack.md`` says what happens meanwhile, per service.
"""

from __future__ import annotations

import contextlib
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from infra.apps import StreamingJob
from infra.processes import ProcessService, end_dead_session, log_tail

__all__ = ["LAST_WORDS_S", "RestartPolicy", "Supervisor", "describe_exit", "own_last_error"]


@dataclass
class RestartPolicy:
    """When to restart one service that died: the supervisor's decisions, without processes or sleeps.

    The first restart comes ``first_delay`` seconds after the death; each further one waits twice as
    long as the one before, up to ``max_delay``.  A run that lasted ``stable_after`` seconds resets
    the delay, so a service that dies once a day comes back after a second, while one that dies at
    every start settles at one attempt a minute.  A start that fails counts as a death with no
    uptime.  Time comes only from ``clock`` (seconds, monotonic), so tests drive it by hand.
    """

    clock: Callable[[], float] = time.monotonic
    first_delay: float = 1.0
    max_delay: float = 60.0
    stable_after: float = 60.0
    #: deaths (and failed starts) so far
    deaths: int = field(default=0, init=False)
    _delay: float = field(default=0.0, init=False, repr=False)
    _up_since: float | None = field(default=None, init=False, repr=False)
    _due: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.first_delay <= self.max_delay or self.stable_after < 0:
            raise ValueError(
                f"restart back-off: need 0 < first_delay ({self.first_delay}) <= max_delay "
                f"({self.max_delay}) and stable_after ({self.stable_after}) >= 0"
            )
        self._delay = self.first_delay

    def started(self) -> None:
        """The service runs (again): its uptime counts from now."""
        self._up_since, self._due = self.clock(), None

    def died(self) -> float:
        """The service died, or a start failed; returns the seconds until it is to be restarted."""
        now = self.clock()
        if self._up_since is not None and now - self._up_since >= self.stable_after:
            self._delay = self.first_delay
        delay = self._delay
        self._delay = min(delay * 2, self.max_delay)
        self._up_since, self._due = None, now + delay
        self.deaths += 1
        return delay

    @property
    def waiting(self) -> bool:
        """True from a death until the next ``started``."""
        return self._due is not None

    def uptime(self) -> float | None:
        """Seconds since ``started``; None while waiting."""
        return None if self._up_since is None else self.clock() - self._up_since

    def seconds_left(self) -> float | None:
        """Seconds until the restart is due (0 once it is); None when not waiting."""
        return None if self._due is None else max(0.0, self._due - self.clock())

    def due(self) -> bool:
        return self.seconds_left() == 0.0


def describe_exit(code: int | None) -> str:
    """How a process ended, in words: ``killed by SIGKILL``, ``exited with code 1``.

    A code of 128 + a signal's number is what a launcher exits with when the process it ran was killed by
    that signal (spark-submit's JVM when its driver is), and what a JVM exits with after its own shutdown on
    one: the signal is named beside it.
    """
    if code is None:
        return "exited (status unknown: this `up` did not start it)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code > 128:
        with contextlib.suppress(ValueError):
            name = signal.Signals(code - 128).name
            return f"exited with code {code} (128 + {name}: it, or the process it ran, got {name})"
    return f"exited with code {code}"


#: how much of a dead job's log is searched for its own last error: Spark's traces after it run long
_JOB_LOG_SCAN_BYTES = 1 << 20
#: an error the job logged tells why it died only if logged in its last moments: this many seconds
#: before the supervisor last saw it alive, or later.  An older one is an error it lived on after.
LAST_WORDS_S = 5.0
#: a line the job's own code wrote about an error: a logfmt record of ours at error level or above
#: (common.logs), or the ``error: ...`` it prints as it exits; Spark's and the JVM's lines are neither,
#: and neither is an alert (streaming.alerts logs a critical one at error level): an alert says what
#: the job saw in the cluster, not what went wrong with the job
_OWN_ERROR = re.compile(
    r"ts=(?P<ts>\S+) level=(?:error|critical) "
    r"logger=(?!streaming\.alerts\b)(?:streaming|namesrv|common|__main__)\b"
    r"|error: "
)
#: characters of that line quoted
_MAX_ERROR_CHARS = 600


def _logged_at(ts: str) -> float | None:
    """Seconds since the epoch of a logfmt ``ts`` (``2025-01-01T00:00:01.000Z``, UTC); None if it is not one."""
    try:
        return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def own_last_error(tail: str, since: float) -> str | None:
    """The last error line the job's own code wrote in ``tail``, the end of its log, at or after ``since``
    (seconds since the epoch), shortened; None if it wrote none then.

    As the job dies, Spark logs the dying query's traces (``NullPointerException ... SparkPlan.session()
    is null``): effects of the death, not its cause, so only the job's own lines count; and of those only
    the recent ones, since an error it logged minutes before is one it lived on after.  The ``error: ...``
    it prints as it exits has no time, and is written only then: it always counts.
    """
    for line in reversed(tail.splitlines()):
        m = _OWN_ERROR.match(line)
        if m is None:
            continue
        if m["ts"] is not None:
            at = _logged_at(m["ts"])
            if at is None or at < since:
                continue
        return line if len(line) <= _MAX_ERROR_CHARS else line[:_MAX_ERROR_CHARS] + " ..."
    return None


@dataclass
class _Watched:
    service: ProcessService
    policy: RestartPolicy
    pid: int | None = None
    #: when the supervisor last saw its process alive (``wall_clock``): it died after that
    alive_at: float = 0.0


class Supervisor:
    """Applies one :class:`RestartPolicy` per service of a running stack; ``up``'s loop calls ``check``.

    ``check`` finds the services whose process is gone, says so (one line, then the end of its log),
    ends what is left of the dead process's session, and restarts each when its policy says; a
    restart that fails is reported and retried.  It does nothing more once ``stopping()`` is true,
    so a signal to ``up`` during a back-off wait or a restart leaves ``up`` free to stop everything.
    """

    #: how long what a dead service left in its session gets to exit by itself before SIGKILL
    LEFTOVER_GRACE_S = 5.0

    def __init__(
        self,
        services: list[ProcessService],
        *,
        clock: Callable[[], float] = time.monotonic,
        out: TextIO | None = None,
        poll_s: float = 1.0,
        end_session: Callable[[int, float], None] = end_dead_session,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._out = out
        self._end_session = end_session
        self._wall_clock = wall_clock  # the clock of the job's log lines, to tell its last words
        self.poll_s = poll_s
        self._watched = [_Watched(s, RestartPolicy(clock)) for s in services]
        for w in self._watched:
            w.pid = w.service.running_pid()
            w.policy.started()
            w.alive_at = wall_clock()

    def next_check_s(self) -> float:
        """How long ``up`` may wait before the next ``check``: the poll interval or the next restart."""
        left = [s for w in self._watched if (s := w.policy.seconds_left()) is not None]
        return min([self.poll_s, *left])

    def check(self, stopping: Callable[[], bool] = lambda: False) -> None:
        for w in self._watched:
            if stopping():
                return
            if not w.policy.waiting:
                pid = w.service.running_pid()
                if pid is not None:
                    w.pid, w.alive_at = pid, self._wall_clock()
                    continue
                self._died(w)
            if w.policy.due() and not stopping():
                self._restart(w)

    def _say(self, text: str) -> None:
        print(text, file=self._out or sys.stderr, flush=True)

    def _died(self, w: _Watched) -> None:
        service, pid = w.service, w.pid
        uptime = w.policy.uptime()
        delay = w.policy.died()
        if pid is not None:
            # what is still in its session (the job's JVM and Python workers) must go before a new
            # job takes the same checkpoint
            self._end_session(pid, self.LEFTOVER_GRACE_S)
        kept = service.log_file.with_name(service.log_file.name + ".1")
        with contextlib.suppress(OSError):
            service.log_file.replace(kept)  # `start` truncates the log: keep the dead one's
        lived = f" after {uptime:.0f} s" if uptime is not None else ""
        if isinstance(service, StreamingJob):
            what = "from its checkpoint"
            # the cause is the exit said first (a signal, a code); an error of its own only adds to it
            # when logged as it died
            error = own_last_error(log_tail(kept, _JOB_LOG_SCAN_BYTES), w.alive_at - LAST_WORDS_S)
            if error is None:
                said = f"it logged no error of its own in its last seconds (log {kept})"
            else:
                said = f"the error it logged in its last seconds (log {kept}):\n  | {_printable(error)}"
        else:
            what, said = "on the same port", f"its log {kept} ends with:\n{_tail(kept)}"
        self._say(
            f"{service.name} (pid {pid or '-'}) {describe_exit(service.exit_code())}{lived}; the rest keeps "
            f"running; restarting it {what} in {delay:.0f} s (death {w.policy.deaths}); {said}"
        )

    def _restart(self, w: _Watched) -> None:
        service = w.service
        try:
            service.start()
        # any failure: one service that cannot start yet must not take the others down with it
        except Exception as e:  # noqa: BLE001
            delay = w.policy.died()
            why = _printable(next(iter(str(e).splitlines()), "") or repr(e))
            self._say(
                f"{service.name} could not be restarted: {why}; next attempt in {delay:.0f} s "
                f"(death {w.policy.deaths}, log {service.log_file})"
            )
            return
        w.policy.started()
        w.pid, w.alive_at = service.running_pid(), self._wall_clock()
        self._say(f"{service.name} restarted (pid {w.pid or '-'})")


def _printable(text: str) -> str:
    """``text`` with control characters escaped, so a log quoted on the terminal cannot drive it."""
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in text)


def _tail(path: Path, lines: int = 10, indent: str = "  | ") -> str:
    tail = log_tail(path).splitlines()[-lines:] or ["(no log)"]
    return "\n".join(indent + _printable(line) for line in tail)
