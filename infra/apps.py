"""The system's own processes as services: a name-server node, the console, and the Spark liveness job.

Each is a :class:`infra.processes.ProcessService` (a child in a session of its own, with a pidfile and a log
in its run dir), started by ``make run``'s stack (:mod:`infra.stack`) and by the replicated topology
(:mod:`infra.topology`). :class:`StreamingJob` runs under ``python -m streaming`` or spark-submit and
stops everything it left in its session; the ``/proc`` helpers below tell the job's processes from
others that reuse their PIDs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import sys
from enum import StrEnum
from pathlib import Path

from common import procfs
from common.options import ConfigError
from infra.processes import (
    LOOPBACK,
    BinaryNotFoundError,
    ProcessService,
    ServiceError,
    end_session,
    jvm_jars,
    package_file,
)
from streaming.config import StreamingConfig
from streaming.config import load_config as load_streaming_config
from streaming.session import launch_settings

log = logging.getLogger("infra.stack")
REPO = Path(__file__).resolve().parents[1]


def node_properties(
    *,
    port: int,
    name: str,
    kafka_bootstrap: str,
    redis_url: str,
    data_dir: Path,
    bind: str = LOOPBACK,
    metrics_port: int | None = None,
    warm_start: bool | None = None,
) -> dict[str, str]:
    """A node's settings in a stack the project starts: where it listens, its name, its Kafka and Redis,
    the directory of its KV and configuration files; its metrics port and warm start when given."""
    properties = {
        "bindAddress": bind,
        "listenPort": str(port),
        "nodeName": name,
        "kafkaBootstrapServers": kafka_bootstrap,
        "redisUrl": redis_url,
        "kvConfigPath": str(data_dir / "kvConfig.json"),
        "configStorePath": str(data_dir / "namesrv.properties"),
    }
    if metrics_port is not None:
        properties["metricsPort"] = str(metrics_port)
    if warm_start is not None:
        properties["warmStartFromRedis"] = str(warm_start).lower()
    return properties


class NodeService(ProcessService):
    """The stack's handle on one node's process: ``namesrv start`` with the repository's configuration."""

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


class ConsoleService(ProcessService):
    """The live cluster-health page, ``namesrv-monitor console``, reading the job's Redis."""

    port_key = "--console-port"
    backend_key = "namesrv-monitor console"

    def __init__(self, *, port: int, run_dir: Path, redis_url: str, prefix: str = "namesrv", host: str = LOOPBACK):
        super().__init__(port=port, run_dir=run_dir, host=host, start_timeout=20.0)
        self.name = "console"
        self.redis_url = redis_url
        self.prefix = prefix

    @property
    def backend(self) -> str:
        return "namesrv-monitor console"

    @property
    def url(self) -> str:
        return f"http://{self.address}/"

    def _binary(self) -> Path:
        return Path(sys.executable)

    def _known_binaries(self) -> list[Path]:
        return [Path(sys.executable)]

    def _command(self, binary: Path) -> list[str]:
        return [str(binary), "-m", "streaming.cli", "console", "--redis", self.redis_url, "--prefix", self.prefix,
                "--host", self.host, "--port", str(self.port)]  # fmt: skip

    def _probe(self, timeout: float) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "api/state", timeout=timeout) as answer:
                return bool(answer.status == 200)
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
    the tracked PID is the JVM's.  ``stop`` SIGTERMs the driver: it stops the query and the session as
    under ``python``, and the JVM exits with its code (a SIGTERM to the JVM does the same: the job has
    the JVM pass its signals to the driver, ``streaming.session.forward_jvm_signals``).  Either way, whatever is still in the job's session afterwards (the
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
        # its one listening port is its metrics endpoint (`address`), not a service of its own:
        # 0 keeps ProcessService's port checks out of the way
        super().__init__(port=0, run_dir=run_dir, start_timeout=10.0)
        self.conf = conf
        self.overrides = overrides
        try:
            self.launcher = Launcher(launcher)
        except ValueError:
            raise ServiceError(
                f"streaming launcher {launcher!r}: use one of " f"{' | '.join(m.value for m in Launcher)}"
            ) from None

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
            raise BinaryNotFoundError(
                f"spark-submit is neither beside {sys.executable} nor in a pyspark package; "
                "run: pip install -e '.[streaming]'"
            )
        return found

    def _known_binaries(self) -> list[Path]:
        # Both launchers, so `down` stops what `up` started.  spark-submit is env (its shebang), then
        # bash, then spark-class (env, bash again), then java: the PID is any of them while it starts.
        java = str(Path(os.environ["JAVA_HOME"], "bin", "java")) if os.environ.get("JAVA_HOME") else None
        found = [java or shutil.which("java"), shutil.which("bash"), shutil.which("env")]
        return [Path(sys.executable), *(Path(p) for p in found if p)]

    def _script(self) -> Path:
        script = package_file("streaming", "__main__.py")
        if script is None:
            raise ServiceError(
                "the streaming package is not importable here; run from the repository or "
                "pip install -e '.[streaming]'"
            )
        return script

    def _command(self, binary: Path) -> list[str]:
        sets = [arg for key, value in self.overrides.items() for arg in ("-D", f"{key}={value}")]
        if self.launcher is Launcher.PYTHON:
            return [str(binary), "-m", "streaming", "-c", str(self.conf), *sets]
        # no --master: the job's spark.master (conf, -D) is applied by the session builder and wins
        return [str(binary), *self._launch_args(), str(self._script()), "-c", str(self.conf), *sets]

    def _config(self) -> StreamingConfig | None:
        """The job's configuration as it will read it (conf and overrides); None if it cannot, which it then says."""
        try:
            return load_streaming_config(self.conf, self.overrides)
        except ConfigError:
            return None

    def _launch_args(self) -> list[str]:
        """spark-submit starts the driver's JVM, so it gets what the job would give its own launcher: the
        Kafka connector's jars (the job's ``spark.jars``, else those ``make setup`` resolved) and its JVM options."""
        cfg = self._config()
        settings = {} if cfg is None else launch_settings(cfg)
        args = ["--jars", settings.get("spark.jars", f"{jvm_jars('spark-kafka')}/*.jar")]
        options = settings.get("spark.driver.extraJavaOptions")
        return [*args, "--driver-java-options", options] if options else args

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

    @property
    def metrics_endpoint(self) -> tuple[str, int] | None:
        """(bind address, port) of the job's metrics, as the job reads its conf and overrides; None when off."""
        cfg = self._config()
        return (cfg.metrics_bind_address, cfg.metrics_port) if cfg is not None and cfg.metrics_port else None

    @property
    def address(self) -> str:
        """Its metrics endpoint: the only port it listens on."""
        endpoint = self.metrics_endpoint
        return "(metrics off)" if endpoint is None else f"{endpoint[0]}:{endpoint[1]}"

    def _probe(self, timeout: float) -> bool:
        # Spark is slow to start and only then publishes MONITOR_HEARTBEAT; until then the nodes
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
        leader = procfs.stat(pid)
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
                log.warning(
                    "%s: spark-submit pid %d still runs %.0fs after its driver's SIGTERM; signalling it",
                    self.name,
                    pid,
                    timeout,
                )
            super().stop(timeout)
        if leader is not None and leader.session == pid:
            end_session(pid)
        return True


# --------------------------------------------------------------------------- /proc (common.procfs)


def _runs_streaming(pid: int) -> bool:
    """True when ``pid`` runs the job: ``-m streaming``, or ``streaming/__main__.py`` (spark-submit's
    bash and java, the driver).  An unreadable command line is trusted, as an unreadable exe is, and
    so is an empty one: a process just past exec shows none for a moment, and ``start`` looks then."""
    args = procfs.cmdline(pid)
    if not args:
        return True
    return "streaming" in args or any(a.endswith(f"streaming{os.sep}__main__.py") for a in args)


def _submitted_driver(pid: int) -> int | None:
    """The Python driver that spark-submit's JVM ``pid`` runs, if ``pid`` is such a JVM."""
    args = procfs.cmdline(pid) or []
    if "org.apache.spark.deploy.SparkSubmit" not in args:
        return None
    for child, stat in procfs.all_stats().items():
        if stat.ppid == pid and not stat.exited:
            child_args = procfs.cmdline(child) or []
            if any(a.endswith(f"streaming{os.sep}__main__.py") for a in child_args):
                return child
    return None
