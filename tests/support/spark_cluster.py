"""A Spark standalone cluster on loopback, from the pip-installed pyspark, for tests.

Theory of operation
-------------------
:func:`spark_cluster` starts a master and ``workers`` workers with ``spark-class`` (the copy beside
the interpreter, else the one inside the pyspark package), each a JVM in a session of its own with
its logs and work directory in ``tmp``, all on 127.0.0.1 and free ports. It waits, polling the
master's JSON status page with a deadline, until every worker is ALIVE, and yields a
:class:`SparkCluster`. Afterwards every process of every daemon's session (the worker's executors
and their Python workers included) is ended by PID: SIGTERM, then SIGKILL after a grace period.

:meth:`SparkCluster.kill_worker` SIGKILLs one worker and everything below it (its executor and
the executor's Python workers), as a host that dies takes them all. The environment the daemons
get is the caller's plus ``SPARK_LOCAL_IP``: executors inherit it, so a ``PYTHONPATH`` the test
sets reaches the executors' Python workers as well.
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

from infra.services import LOOPBACK, free_port, package_file, pid_alive
from namesrv import procfs
from tests.support.wait import wait_until

__all__ = ["SparkCluster", "SparkDaemon", "spark_class", "spark_cluster", "spark_home"]

#: a JVM daemon's heap here: the master and workers only bookkeep
_DAEMON_MEMORY = "256m"


def spark_home() -> Path:
    """The interpreter's pyspark package: SPARK_HOME of a pip-installed Spark."""
    found = package_file("pyspark", "bin/spark-class")
    if found is None:
        raise RuntimeError(f"no pyspark package with bin/spark-class for {sys.executable}")
    return found.parents[1]


def spark_class() -> Path:
    """``spark-class`` of the interpreter's pyspark (run with :func:`spark_home` as SPARK_HOME)."""
    return spark_home() / "bin" / "spark-class"


@dataclass
class SparkDaemon:
    name: str
    proc: subprocess.Popen
    log: Path

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

    def status(self) -> dict:
        """The master's JSON status page (workers, applications)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as answer:
            return json.load(answer)

    def answers(self) -> bool:
        if self.master.proc.poll() is not None:
            raise AssertionError(f"the Spark master exited with {self.master.proc.returncode}:\n{self.logs()}")
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

    def executors_of(self, worker: SparkDaemon) -> list[int]:
        """PIDs of the executor JVMs running under ``worker``."""
        return [
            st.pid
            for st in procfs.descendants(worker.pid)
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in (procfs.cmdline(st.pid) or [])
        ]

    def kill_worker(self, worker: SparkDaemon) -> None:
        """SIGKILL ``worker`` with everything below it, as a dead host loses them all."""
        worker.kill_tree(signal.SIGKILL)
        wait_until(lambda: not worker.session(), 20, f"worker {worker.name} and its executors to die")

    def logs(self) -> str:
        return "\n".join(f"--- {d.name} ({d.log})\n{_tail(d.log)}" for d in (self.master, *self.workers))


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(unreadable: {exc})"


def _start(name: str, args: list[str], tmp: Path, env: dict[str, str]) -> SparkDaemon:
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(spark_class()), *args], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp,
            start_new_session=True,
        )  # fmt: skip
    return SparkDaemon(name, proc, log)


@contextlib.contextmanager
def spark_cluster(
    tmp: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g", start_timeout: float = 120.0
) -> Iterator[SparkCluster]:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, stopped by PID afterwards."""
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
    master = _start(
        "master",
        ["org.apache.spark.deploy.master.Master", "--host", LOOPBACK, "--port", str(port),
         "--webui-port", str(ui_port)],
        tmp, env,
    )  # fmt: skip
    cluster = SparkCluster(f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{ui_port}", master)
    try:
        wait_until(
            cluster.answers, start_timeout, "the Spark master's status page",
            state=lambda: f"master exit code {master.proc.poll()}\n{cluster.logs()}",
        )  # fmt: skip
        for i in range(workers):
            work = tmp / f"worker-{i}"
            work.mkdir(exist_ok=True)
            cluster.workers.append(
                _start(
                    f"worker-{i}",
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        "--host",
                        LOOPBACK,
                        "--port",
                        str(free_port()),
                        "--webui-port",
                        str(free_port()),
                        "--cores",
                        str(cores),
                        "--memory",
                        memory,
                        "--work-dir",
                        str(work),
                        cluster.master_url,
                    ],
                    tmp,
                    env,
                )  # fmt: skip
            )
        wait_until(
            lambda: cluster.alive_workers() >= workers,
            start_timeout,
            f"{workers} Spark workers to register",
            interval=0.5,
            state=lambda: f"{cluster.alive_workers()} alive; exited: "
            f"{[d.name for d in (master, *cluster.workers) if d.proc.poll() is not None]}\n{cluster.logs()}",
        )
        yield cluster
    finally:
        for daemon in (*cluster.workers, master):
            daemon.stop()
