"""What Linux's ``/proc`` says about a process, read and parsed in one place.

Theory of operation
-------------------
``/proc/<pid>/stat`` is one line whose second field, the command name in parentheses, may itself
hold spaces and parentheses, so the fields after it are counted from the *last* ``)``.
:func:`stat` parses that line into a typed :class:`Stat` with the fields the project uses (state,
parent, session, CPU time, start time); ``cmdline``, ``exe``, ``task`` and ``status`` have a
function each.  Every reader of ``/proc`` goes through here: the local services' liveness checks,
the stack's clean-up of the job's session, the tests' process trees and the benchmarks' CPU figures.

Processes come and go between listing ``/proc`` and reading a file there, so a process that is
gone, or a file that cannot be read, is ``None`` (or left out of a listing), never an exception.
Nothing here signals or changes a process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Stat", "stat", "all_stats", "cmdline", "exe", "thread_count", "rss_bytes", "descendants", "CLOCK_TICKS"]

PROC = Path("/proc")
#: clock ticks per second, the unit of the CPU and start times in ``stat``
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Stat:
    """The fields of ``/proc/<pid>/stat`` the project reads (proc(5) numbers them from 1)."""

    pid: int
    #: (3) R running, S sleeping, D disk wait, Z zombie, X dead, T stopped, ...
    state: str
    #: (4)
    ppid: int
    #: (6) the session: every service is started as the leader of its own
    session: int
    #: (14) and (15), in clock ticks
    utime: int
    stime: int
    #: (22) clock ticks after boot; with the PID it names one process, since PIDs are reused
    start_time: int

    @property
    def exited(self) -> bool:
        """A zombie (exited, not reaped yet) or dead."""
        return self.state in ("Z", "X")

    @property
    def cpu_seconds(self) -> float:
        """User plus system CPU time of all its threads."""
        return (self.utime + self.stime) / CLOCK_TICKS


def stat(pid: int) -> Stat | None:
    """The process's ``stat``, or None if it is gone or unreadable."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # fields (3) onwards
    try:
        return Stat(pid, fields[0], int(fields[1]), int(fields[3]), int(fields[11]), int(fields[12]), int(fields[19]))
    except (IndexError, ValueError):
        return None


def all_stats() -> dict[int, Stat]:
    """Every process's ``stat`` by PID (those gone while listing are left out)."""
    stats = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (st := stat(int(entry.name))) is not None:
            stats[st.pid] = st
    return stats


def cmdline(pid: int) -> list[str] | None:
    """The process's arguments, or None if it is gone or unreadable; ``[]`` for a kernel thread, or a
    process just past exec, which shows none for a moment."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")[:-1]


def exe(pid: int) -> str | None:
    """The path of the process's binary, or None if it is gone or not ours to see."""
    try:
        return os.readlink(PROC / str(pid) / "exe")
    except OSError:
        return None


def thread_count(pid: int) -> int | None:
    """How many threads the process has (a zombie whose other threads still tear down has more than 1)."""
    try:
        return len(os.listdir(PROC / str(pid) / "task"))
    except OSError:
        return None


def rss_bytes(pid: int) -> int | None:
    """Resident memory (``VmRSS``), or None if the process is gone (or is a zombie, which has none)."""
    try:
        lines = (PROC / str(pid) / "status").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def descendants(pid: int) -> list[Stat]:
    """Every process below ``pid`` (children, their children, ...), each parent before its children."""
    children: dict[int, list[Stat]] = {}
    for st in all_stats().values():
        children.setdefault(st.ppid, []).append(st)
    found: list[Stat] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found
