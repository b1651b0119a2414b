"""Spark's Python worker daemon for this job: PySpark's own, started with the job's imports done.

Spark starts one daemon per executor (``spark.python.daemon.module``, set by
:func:`streaming.session.python_settings`) and forks a worker from it for each task that finds no idle
one.  A worker forked from PySpark's daemon imports PySpark (compiled afresh from Spark's zip), the
worker and the job's modules itself, and the batch waits for its slowest task; forked from this one,
it has them already.  :func:`prepare` puts the installed PySpark (with bytecode) before an identical
zip, imports what every task needs, with numpy and pyarrow told to start no thread (a fork copies
only the calling thread) and a check that none started, and freezes what was imported out of the
garbage collector's reach.  ``docs/internals/spark-job.md`` has the reasons and the figures.

It also sets up logging as the driver does (:func:`setup_worker_logging`), for itself and every worker
forked from it: what the job's own code logs in a worker reaches the job's log as one logfmt line with
its time and level, as the driver's lines do.  One Python worker is not forked from it: the one Spark
starts in the driver at each query start for the stateful processor's ``init``;
:func:`setup_driver_worker` does the same there and keeps PySpark's prints of it out of the job's log.
"""

from __future__ import annotations

import gc
import importlib
import importlib.machinery
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from types import ModuleType

from common.logs import setup_logging

#: the level of the workers' log: the driver's default (``python -m streaming`` without -v); what the
#: job's code logs in a worker is warnings
WORKER_LOG_LEVEL = "WARNING"

#: the module Spark runs (``python -m``, a process of its own) at each query start for the stateful processor's
#: first step, its ``init``, which tells Spark the state it keeps; not forked from this daemon
DRIVER_WORKER = "pyspark.sql.streaming.transform_with_state_driver_worker"

#: imported before the first fork: pure Python or extension modules that start no thread
PRELOAD = (
    "pyspark.worker",
    "pyspark.sql.streaming.stateful_processor",
    "pyspark.sql.streaming.stateful_processor_api_client",
    "orjson",
    "streaming.events",
    "streaming.liveness",
)

#: the settings under which these start no thread on import; workers inherit them (they use neither
#: BLAS nor Arrow's decay purging for anything that matters)
NO_THREADS = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
#: imported before the first fork when the environment holds :data:`NO_THREADS`
PRELOAD_THREADLESS = ("numpy", "pyarrow", "pandas", "pyspark.sql.pandas.serializers")


def threadless_settings(environ: MutableMapping[str, str]) -> bool:
    """Set :data:`NO_THREADS` where unset; True when ``environ`` then holds them (an operator's own value wins)."""
    for name, value in NO_THREADS.items():
        environ.setdefault(name, value)
    return all(environ[name] == value for name, value in NO_THREADS.items())


def prefer_installed_pyspark(path: list[str]) -> list[str]:
    """``path`` with the PySpark zips moved last when they belong to the installed ``pyspark`` found without them."""
    zips = [p for p in path if p.endswith(".zip") and Path(p).name.startswith(("pyspark", "py4j"))]
    rest = [p for p in path if p not in zips]
    spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    if not zips or spec is None or not spec.submodule_search_locations:
        return path
    package = Path(next(iter(spec.submodule_search_locations))).resolve()
    if all(package in Path(z).resolve().parents for z in zips):
        return rest + zips
    return path


def threads() -> int:
    """Threads of this process, as the kernel counts them (native ones too)."""
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


def preload(modules: tuple[str, ...] = PRELOAD) -> None:
    """Import ``modules`` (those missing are skipped: a worker reports them itself), and check that no thread started."""
    before = threads()
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    if threads() != before:
        raise SystemExit(
            f"streaming.spark_daemon: importing {', '.join(modules)} started a thread ({before} -> {threads()}), "
            "so workers forked from this daemon could hang; unset spark.python.daemon.module to use PySpark's own"
        )


def setup_worker_logging() -> None:
    """Log as the driver does: one logfmt line with time and level on stderr (:func:`common.logs.setup_logging`).

    A worker's stderr, the daemon's, reaches the job's log through the executor.  Without a handler a
    worker's warning (``skipping 3 malformed event(s) ...``) would get there as its bare message, through
    Python's last-resort handler; the forked workers inherit this one.
    """
    setup_logging(WORKER_LOG_LEVEL)


def setup_driver_worker(main: ModuleType | None = None) -> bool:
    """In PySpark's worker for the stateful processor's ``init`` (:data:`DRIVER_WORKER`; ``main`` is the
    process's ``__main__``), log as in the workers and print nothing; True there, and a no-op elsewhere.

    That worker prints its progress to stdout, five lines and five empty ones at each query start
    ("Streaming TransformWithStateInPandas Python worker Completed execution of UDF: <bound method ...>"),
    which Spark copies into the job's log; it sends nothing else there (it answers Spark through a socket,
    its errors go to stderr).  The job's code first runs in it when it unpickles the processor, after the
    first of those lines: :mod:`streaming.liveness` calls this on import, which keeps the others out.
    """
    spec = getattr(main if main is not None else sys.modules.get("__main__"), "__spec__", None)
    if getattr(spec, "name", None) != DRIVER_WORKER:
        return False
    setup_worker_logging()
    sys.stdout = open(os.devnull, "w")  # the process's stdout from now on: never closed
    return True


def prepare() -> None:
    """Everything the daemon does before PySpark's takes over (see the module's docstring)."""
    setup_worker_logging()
    sys.path[:] = prefer_installed_pyspark(sys.path)
    threadless = threadless_settings(os.environ)
    preload(PRELOAD + PRELOAD_THREADLESS if threadless else PRELOAD)
    # A reused worker runs a full gc.collect() after every task, twice a batch, and with pandas and
    # PySpark loaded that walk is costly. Frozen here, the imported modules' objects are left out of
    # every collection in the workers forked from now on (and their pages stay shared: a collection
    # writes to the headers of the objects it scans).
    gc.freeze()


def main() -> None:
    prepare()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
