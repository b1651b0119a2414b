"""The whole system on one machine: ``make run`` and ``make stop``.

``up`` starts, in order, the local Kafka-protocol broker and Redis (:mod:`infra.services`), the
name-server nodes (publishing events to Kafka and applying the monitor's actions) and the Spark
streaming job in local mode, prints where everything is, and stays in the foreground: Ctrl-C or
SIGTERM stops everything it started, by PID.  ``down`` does the same from the pidfiles, for a stack
whose ``up`` is gone.  If any process dies, ``up`` says which, shows the end of its log, and stops
the rest.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from infra.services import (
    LOOPBACK,
    BinaryNotFoundError,
    KafkaService,
    ProcessService,
    RedisService,
    ServiceError,
    load_config,
    package_file,
    pid_alive,
)

log = logging.getLogger("infra.stack")
REPO = Path(__file__).resolve().parents[1]


class NamesrvNode(ProcessService):
    """One name-server node, ``namesrv start`` with the repository's configuration."""

    port_key = "listenPort"
    backend_key = "namesrv"

    def __init__(self, *, port: int, run_dir: Path, conf: Path, properties: dict[str, str]) -> None:
        super().__init__(port=port, run_dir=run_dir, start_timeout=30.0)
        self.name = f"namesrv-{port}"
        self.conf = conf
        self.properties = properties

    @property
    def backend(self) -> str:
        return "namesrv"

    def _binary(self) -> Path:
        return Path(sys.executable)

    def _known_binaries(self) -> list[Path]:
        return [Path(sys.executable)]

    def _command(self, binary: Path) -> list[str]:
        sets = [arg for key, value in self.properties.items() for arg in ("--set", f"{key}={value}")]
        return [str(binary), "-m", "namesrv", "start", "-c", str(self.conf), *sets]

    def _probe(self, timeout: float) -> bool:
        from namesrv.client import NameServerClient

        try:
            with NameServerClient(self.address, timeout=timeout) as client:
                client.cluster_info()
            return True
        except OSError:
            return False


class Launcher(StrEnum):
    PYTHON = "python"
    SPARK_SUBMIT = "spark-submit"


#: picks the launcher of ``up`` when --streaming-launcher is not given (so ``make run`` can choose)
LAUNCHER_ENV = "STREAMING_LAUNCHER"


class StreamingJob(ProcessService):
    """The Spark liveness monitor in local mode: ``python -m streaming`` or ``spark-submit streaming/__main__.py``.

    Under ``python``, the tracked PID is the driver and the JVM is its child.  Under ``spark-submit``
    the script exec's the JVM (SparkSubmit), which runs ``__main__.py`` in a child Python, the driver;
    the tracked PID is the JVM's.  A SIGTERM to that JVM kills the driver without its shutdown, so
    ``stop`` SIGTERMs the driver instead: it stops the query and the session as under ``python``, and
    the JVM exits with its code.  Either way, whatever is still in the job's session afterwards (the
    JVM under ``python``, PySpark's worker daemons) is killed: the job was started as the leader of a
    session of its own, so that session holds exactly what it left behind.  ``stop`` recognises both
    launchers whichever one this object was built with, so ``down`` stops what ``up`` started.
    """

    name = "streaming"
    port_key = "(none)"
    backend_key = "spark.master"

    def __init__(
        self, *, run_dir: Path, conf: Path, overrides: dict[str, str], launcher: Launcher | str = Launcher.PYTHON
    ) -> None:
        # it listens on no port of its own; 0 keeps ProcessService's port checks out of the way
        super().__init__(port=0, run_dir=run_dir, start_timeout=10.0)
        self.conf = conf
        self.overrides = overrides
        try:
            self.launcher = Launcher(launcher)
        except ValueError:
            raise ServiceError(f"streaming launcher {launcher!r}: use one of "
                               f"{' | '.join(m.value for m in Launcher)}") from None

    @property
    def backend(self) -> str:
        return "local"

    def _binary(self) -> Path:
        if self.launcher is Launcher.PYTHON:
            return Path(sys.executable)
        # the interpreter's own (a venv's bin/), else the copy inside the pyspark package
        beside = Path(sys.executable).with_name("spark-submit")
        found = beside if beside.is_file() else package_file("pyspark", "bin/spark-submit")
        if found is None:
            raise BinaryNotFoundError(f"spark-submit is neither beside {sys.executable} nor in a pyspark package; "
                                      "run: pip install -e '.[streaming]'")
        return found

    def _known_binaries(self) -> list[Path]:
        # Both launchers, so `down` stops what `up` started.  spark-submit is env (its shebang), then
        # bash, then spark-class (env, bash again), then java: the PID is any of them while it starts.
        java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
        found = [java or shutil.which("java"), shutil.which("bash"), shutil.which("env")]
        return [Path(sys.executable), *(Path(p) for p in found if p)]

    def _script(self) -> Path:
        script = package_file("streaming", "__main__.py")
        if script is None:
            raise ServiceError("the streaming package is not importable here; run from the repository or "
                               "pip install -e '.[streaming]'")
        return script

    def _command(self, binary: Path) -> list[str]:
        sets = [arg for key, value in self.overrides.items() for arg in ("-D", f"{key}={value}")]
        if self.launcher is Launcher.PYTHON:
            return [str(binary), "-m", "streaming", "-c", str(self.conf), *sets]
        # no --master: the job's spark.master (conf, -D) is applied by the session builder and wins
        return [str(binary), str(self._script()), "-c", str(self.conf), *sets]

    def _environment(self) -> dict[str, str] | None:
        if self.launcher is Launcher.PYTHON:
            return None
        env = dict(os.environ)
        # The driver runs __main__.py as a script: its sys.path starts with streaming/, not the
        # repository, so put the tree the script is in first (an editable install may point elsewhere).
        root = str(self._script().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        # The driver's interpreter.  spark-submit also finds SPARK_HOME with it (else PYSPARK_PYTHON,
        # else `python3` from PATH, which outside an activated venv has no pyspark: it fails).
        env["PYSPARK_DRIVER_PYTHON"] = sys.executable
        # the workers', as build_spark sets it for `python -m streaming` before its JVM starts
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("SPARK_LOCAL_IP", LOOPBACK)
        return env

    def _status_extra(self) -> dict[str, str]:
        return {"launcher": self.launcher.value}

    def _probe(self, timeout: float) -> bool:
        # Spark takes ~20 s to start and then publishes MONITOR_HEARTBEAT; until then the nodes
        # keep expiring brokers themselves, so a live process is all `up` needs to wait for
        return True

    def _tracked_pid(self) -> int | None:
        pid = super()._tracked_pid()
        ours = self._proc is not None and self._proc.pid == pid and self._proc.poll() is None
        if pid is not None and not ours and not _runs_streaming(pid):
            # java and bash are common binaries: a reused PID must not be taken for the job
            log.info("%s: removing stale pidfile %s (pid %d is not the job)", self.name, self.pidfile, pid)
            self.pidfile.unlink(missing_ok=True)
            return None
        return pid

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the job (see the class) and everything it started; True if it was running."""
        pid = self._tracked_pid()
        if pid is None:
            return super().stop(timeout)
        leader = _proc_stat(pid)
        driver = _submitted_driver(pid)
        if driver is not None:
            log.info("%s: stopping the spark-submit driver pid %d", self.name, driver)
            with contextlib.suppress(ProcessLookupError):
                os.kill(driver, signal.SIGTERM)
        if driver is not None and self._wait_exit(pid, timeout):
            self.pidfile.unlink(missing_ok=True)
            self._proc = None
        else:
            if driver is not None:
                log.warning("%s: spark-submit pid %d still runs %.0fs after its driver's SIGTERM; signalling it",
                            self.name, pid, timeout)
            super().stop(timeout)
        if leader is not None and leader.session == pid:
            _end_session(pid)
        return True


# --------------------------------------------------------------------------- /proc


@dataclass(frozen=True)
class _Stat:
    """The fields of ``/proc/<pid>/stat`` that the job's stop needs."""

    state: str
    ppid: int
    session: int


def _proc_stat(pid: int) -> _Stat | None:
    try:
        # the command name may hold spaces and parentheses: the fields start after the last ")"
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return _Stat(fields[0], int(fields[1]), int(fields[3]))
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").split("\0")[:-1]


def _runs_streaming(pid: int) -> bool:
    """True when ``pid`` runs the job: ``-m streaming``, or ``streaming/__main__.py`` (spark-submit's
    bash and java, the driver).  An unreadable command line is trusted, as an unreadable exe is, and
    so is an empty one: a process just past exec shows none for a moment, and ``start`` looks then."""
    args = _cmdline(pid)
    if not args:
        return True
    return "streaming" in args or any(a.endswith(f"streaming{os.sep}__main__.py") for a in args)


def _all_stats() -> dict[int, _Stat]:
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) is not None:
            stats[int(entry.name)] = stat
    return stats


def _submitted_driver(pid: int) -> int | None:
    """The Python driver that spark-submit's JVM ``pid`` runs, if ``pid`` is such a JVM."""
    args = _cmdline(pid) or []
    if "org.apache.spark.deploy.SparkSubmit" not in args:
        return None
    for child, stat in _all_stats().items():
        if stat.ppid == pid and stat.state not in ("Z", "X"):
            child_args = _cmdline(child) or []
            if any(a.endswith(f"streaming{os.sep}__main__.py") for a in child_args):
                return child
    return None


def _end_session(sid: int, grace: float = 10.0) -> None:
    """Wait ``grace`` seconds for what is left in session ``sid`` to exit by itself, then SIGKILL it.

    Only called for a session whose leader we started and just stopped: a session's ID stays taken
    while any member lives, so nothing else can be in it.
    """
    def members() -> list[int]:
        return [p for p, st in _all_stats().items() if st.session == sid and p != os.getpid() and pid_alive(p)]

    deadline = time.monotonic() + grace
    while (left := members()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        log.warning("streaming: pid %d of the job's session outlived the job by %.0fs; SIGKILL", pid, grace)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while members() and time.monotonic() < deadline:
        time.sleep(0.05)


def build_stack(args: argparse.Namespace) -> list[ProcessService]:
    services = load_config(args.services_conf)
    run_dir = services.run_dir
    stack: list[ProcessService] = [KafkaService.from_config(services), RedisService.from_config(services)]
    for port in args.node_ports:
        stack.append(NamesrvNode(port=port, run_dir=run_dir, conf=args.namesrv_conf, properties={
            "bindAddress": args.bind,
            "listenPort": str(port),
            "nodeName": f"node-{port}",
            "kafkaBootstrapServers": services.kafka_bootstrap,
            "redisUrl": services.redis_url,
            "kvConfigPath": str(run_dir / f"namesrv-{port}" / "kvConfig.json"),
            "configStorePath": str(run_dir / f"namesrv-{port}" / "namesrv.properties"),
        }))
    if not args.no_streaming:
        stack.append(StreamingJob(run_dir=run_dir, conf=args.streaming_conf, overrides={
            "kafka.bootstrap": services.kafka_bootstrap,
            "redis.url": services.redis_url,
            "monitor.checkpointDir": str(run_dir / "streaming" / "checkpoint"),
        }, launcher=args.streaming_launcher))
    return stack


def banner(stack: list[ProcessService], node_ports: list[int]) -> str:
    namesrv_addr = ";".join(f"127.0.0.1:{p}" for p in node_ports)
    lines = ["", "The name-server system is up:"]
    for service in stack:
        status = service.status()
        lines.append(f"  {status.name:<16} {status.address:<22} pid {status.pid or '-':<8} log {status.log_file}")
    redis = next(s for s in stack if isinstance(s, RedisService))
    lines += [
        "",
        f"  Brokers and clients: namesrvAddr={namesrv_addr}   (or NAMESRV_ADDR='{namesrv_addr}')",
        f"  Admin:               .venv/bin/namesrv admin -n 127.0.0.1:{node_ports[0]} clusterList",
        f"  A simulated fleet:   .venv/bin/namesrv simulate -n '{namesrv_addr}' --brokers 3 --topics 10 "
        "--silent 1 --silent-after 30",
        f"  Routes in Redis:     .venv/bin/namesrv routes --redis {redis.url} get T0   (or: routes watch)",
        "  Alerts:              in the streaming log, and on the Kafka topic namesrv-alerts",
        "",
        "  Stop: Ctrl-C here, or `make stop` from another shell.",
        "",
    ]
    return "\n".join(lines)


def up(args: argparse.Namespace) -> int:
    stack = build_stack(args)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    started: list[ProcessService] = []
    try:
        for service in stack:
            print(f"starting {service.name} ...", file=sys.stderr, flush=True)
            service.start()
            started.append(service)
            if stop.is_set():
                return 130
        print(banner(stack, args.node_ports), flush=True)
        while not stop.wait(1.0):
            for service in started:
                if service.status().pid is None:
                    print(f"{service.name} stopped unexpectedly; its log ({service.log_file}) ends with:\n"
                          f"{_tail(service.log_file)}", file=sys.stderr)
                    return 1
        return 0
    except ServiceError as e:
        print(f"could not start the system: {e}", file=sys.stderr)
        return 1
    finally:
        down_services(reversed(started or stack))


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def down_services(services) -> None:
    for service in services:
        try:
            if service.stop():
                print(f"stopped {service.name}", file=sys.stderr)
        except ServiceError as e:
            print(f"could not stop {service.name}: {e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.stack", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--services-conf", type=Path, default=REPO / "conf" / "services.properties")
    parser.add_argument("--namesrv-conf", type=Path, default=REPO / "conf" / "namesrv.properties")
    parser.add_argument("--streaming-conf", type=Path, default=REPO / "conf" / "streaming.properties")
    parser.add_argument("--node-ports", type=lambda s: [int(p) for p in s.split(",")], default=[9876, 9877],
                        help="comma-separated name-server ports (default 9876,9877)")
    parser.add_argument("--bind", default=LOOPBACK, help="address the nodes listen on (default 127.0.0.1)")
    parser.add_argument("--no-streaming", action="store_true", help="start everything but the Spark job")
    parser.add_argument("--streaming-launcher", type=Launcher, choices=list(Launcher),
                        default=os.environ.get(LAUNCHER_ENV, Launcher.PYTHON.value),
                        help=f"how `up` starts the Spark job: python -m streaming or spark-submit "
                             f"(default: ${LAUNCHER_ENV} or python; `down` stops either)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "up":
        return up(args)
    stack = build_stack(args)
    if args.command == "down":
        down_services(reversed(stack))
        return 0
    for service in stack:
        print(service.status().line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
