"""A Spark standalone cluster on loopback, from the pip-installed pyspark.

Theory of operation
-------------------
:meth:`SparkCluster.start` (or :func:`spark_cluster`, its context manager) starts a master and
``workers`` workers with ``spark-class`` (the copy inside the interpreter's pyspark package), each a
JVM in a session of its own with its log in ``tmp`` and its work directory ``tmp/worker-<i>``, all on
127.0.0.1 and free ports. It waits, polling the master's JSON status page with a deadline, until every
worker is ALIVE. :meth:`SparkCluster.stop` ends every process of every daemon's session (the workers'
executors and their Python workers included) by PID: SIGTERM, then SIGKILL after a grace period.

:meth:`SparkCluster.kill_worker` SIGKILLs one worker and everything below it (its executor and
the executor's Python workers), as a host that dies takes them all; :meth:`SparkCluster.restart_worker`
starts it again with its cores, memory and work directory, so the cluster gets its capacity back. The
environment the daemons get is the caller's plus ``SPARK_LOCAL_IP``: executors inherit it, so a
``PYTHONPATH`` the caller sets reaches the executors' Python workers as well. A missing pyspark is a
:class:`~infra.processes.BinaryNotFoundError`; a daemon that exits or a deadline passed, a
:class:`~infra.processes.ServiceError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common import procfs
from infra.processes import (
    LOOPBACK,
    BinaryNotFoundError,
    ServiceError,
    free_port,
    package_file,
    pid_alive,
    poll_until,
)

__all__ = ["SparkCluster", "SparkDaemon", "spark_class", "spark_cluster", "spark_home"]

#: a JVM daemon's heap here: the master and workers only bookkeep
_DAEMON_MEMORY = "256m"
_WORKER_MAIN = "org.apache.spark.deploy.worker.Worker"


def spark_home() -> Path:
    """The interpreter's pyspark package: SPARK_HOME of a pip-installed Spark."""
    found = package_file("pyspark", "bin/spark-class")
    if found is None:
        raise BinaryNotFoundError(f"no pyspark package with bin/spark-class for {sys.executable}: run `make setup`")
    return found.parents[1]


def spark_class() -> Path:
    """``spark-class`` of the interpreter's pyspark (run with :func:`spark_home` as SPARK_HOME)."""
    return spark_home() / "bin" / "spark-class"


@dataclass
class SparkDaemon:
    name: str
    proc: subprocess.Popen
    log: Path
    #: the RPC port it listens on (how the master's status page names a worker)
    port: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def session(self) -> list[int]:
        """Live processes of this daemon's session (it is the leader of its own)."""
        return [p for p, st in procfs.all_stats().items() if st.session == self.pid and pid_alive(p)]

    def kill_tree(self, sig: int = signal.SIGKILL) -> None:
        for pid in self.session():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the session, SIGKILL what is left after ``grace`` seconds, then reap the leader."""
        self.kill_tree(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.session() and time.monotonic() < deadline:
            time.sleep(0.2)
        self.kill_tree(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


@dataclass
class SparkCluster:
    master_url: str
    ui_url: str
    master: SparkDaemon
    workers: list[SparkDaemon] = field(default_factory=list)
    #: what start() was given, so that restart_worker() starts a worker as it was
    tmp: Path = field(kw_only=True)
    env: dict[str, str] = field(kw_only=True, default_factory=dict)
    cores: int = field(kw_only=True, default=1)
    memory: str = field(kw_only=True, default="1g")

    # -- starting and stopping

    @classmethod
    def start(
        cls, tmp: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g", start_timeout: float = 120.0
    ) -> SparkCluster:
        """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, every worker ALIVE; stop() ends them."""
        tmp.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            # else spark-class looks for pyspark with the `python3` on PATH, which may not have it
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_DAEMON_MEMORY": _DAEMON_MEMORY,
            "SPARK_LOG_DIR": str(tmp / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
            # the master's REST submission server listens on a fixed port (6066) by default
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }
        port, ui_port = free_port(), free_port()
        master = _launch(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(port),
             "--webui-port", str(ui_port)],
            tmp, env, port,
        )  # fmt: skip
        cluster = cls(
            f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{ui_port}", master,
            tmp=tmp, env=env, cores=cores, memory=memory,
        )  # fmt: skip
        try:
            poll_until(
                cluster.answers, start_timeout, "the Spark master's status page",
                state=lambda: f"master exit code {master.proc.poll()}\n{cluster.logs()}",
            )  # fmt: skip
            for i in range(workers):
                cluster.workers.append(cluster._launch_worker(i))
            poll_until(
                lambda: cluster.alive_workers() >= workers,
                start_timeout,
                f"{workers} Spark workers to register",
                interval=0.5,
                state=lambda: f"{cluster.alive_workers()} alive; exited: "
                f"{[d.name for d in (master, *cluster.workers) if d.proc.poll() is not None]}\n{cluster.logs()}",
            )
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _launch_worker(self, i: int) -> SparkDaemon:
        work = self.tmp / f"worker-{i}"
        work.mkdir(exist_ok=True)
        port = free_port()
        return _launch(
            f"worker-{i}",
            [_WORKER_MAIN, "--host", LOOPBACK, "--port", str(port), "--webui-port", str(free_port()),
             "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work), self.master_url],
            self.tmp, self.env, port,
        )  # fmt: skip

    def stop(self) -> None:
        """End every daemon's session by PID, the workers (and their executors) first."""
        for daemon in (*self.workers, self.master):
            daemon.stop()

    # -- what the master sees

    def status(self) -> dict:
        """The master's JSON status page (workers, applications)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as answer:
            return json.load(answer)

    def answers(self) -> bool:
        if self.master.proc.poll() is not None:
            raise ServiceError(f"the Spark master exited with {self.master.proc.returncode}:\n{self.logs()}")
        try:
            self.status()
        except (OSError, ValueError):  # not listening yet, or an empty page while it starts
            return False
        return True

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")
        except (OSError, ValueError):
            return 0

    def worker_alive(self, i: int) -> bool:
        """Worker ``i`` runs and the master lists it ALIVE."""
        worker = self.workers[i]
        if worker.proc.poll() is not None:
            return False
        try:
            listed = self.status().get("workers", [])
        except (OSError, ValueError):
            return False
        return any(w.get("port") == worker.port and w.get("state") == "ALIVE" for w in listed)

    def executors_of(self, worker: SparkDaemon) -> list[int]:
        """PIDs of the executor JVMs running under ``worker``."""
        return [
            st.pid
            for st in procfs.descendants(worker.pid)
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in (procfs.cmdline(st.pid) or [])
        ]

    # -- faults

    def kill_worker(self, worker: SparkDaemon | int) -> None:
        """SIGKILL ``worker`` (or worker number ``worker``) with everything below it, as a dead host loses them all."""
        daemon = self.workers[worker] if isinstance(worker, int) else worker
        daemon.kill_tree(signal.SIGKILL)
        poll_until(lambda: not daemon.session(), 20, f"worker {daemon.name} and its executors to die")
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.proc.wait(10)

    def restart_worker(self, i: int, timeout: float = 120.0) -> None:
        """Start killed worker ``i`` again with its cores, memory and work directory; returns once it is ALIVE.

        It gets fresh ports: the master refuses a worker at the address of one it still counts as ALIVE."""
        if self.workers[i].proc.poll() is None:
            raise ServiceError(f"Spark worker {i} (PID {self.workers[i].pid}) is still running")
        self.workers[i] = self._launch_worker(i)
        poll_until(
            lambda: self.worker_alive(i), timeout, f"Spark worker {i} ALIVE again", interval=0.5,
            state=lambda: f"exit code {self.workers[i].proc.poll()}\n{self.logs()}",
        )  # fmt: skip

    def logs(self) -> str:
        return "\n".join(f"--- {d.name} ({d.log})\n{_tail(d.log)}" for d in (self.master, *self.workers))


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"


def _launch(name: str, args: list[str], tmp: Path, env: dict[str, str], port: int) -> SparkDaemon:
    log = tmp / f"{name}.log"
    # appended to, so that a restarted worker's log keeps what its predecessor said before it died
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(spark_class()), *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp,
            start_new_session=True,
        )  # fmt: skip
    return SparkDaemon(name, proc, log, port)


@contextlib.contextmanager
def spark_cluster(
    tmp: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g", start_timeout: float = 120.0
) -> Iterator[SparkCluster]:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, stopped by PID afterwards."""
    cluster = SparkCluster.start(tmp, workers=workers, cores=cores, memory=memory, start_timeout=start_timeout)
    try:
        yield cluster
    finally:
        cluster.stop()
