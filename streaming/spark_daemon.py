"""Spark's Python worker daemon for this job: PySpark's own, started with the job's imports done.

Spark starts one daemon per executor (``spark.python.daemon.module``, set by
:func:`streaming.session.python_settings`) and forks a worker from it for each task that finds no idle
one.  A worker forked from PySpark's daemon imports PySpark (compiled afresh from Spark's zip), the
worker and the job's modules itself, and the batch waits for its slowest task; forked from this one,
it has them already.  :func:`prepare` puts the installed PySpark (with bytecode) before an identical
zip, imports what every task needs, with numpy and pyarrow told to start no thread (a fork copies
only the calling thread) and a check that none started, and freezes what was imported out of the
garbage collector's reach.  ``docs/internals/spark-job.md`` has the reasons and the figures.
"""

from __future__ import annotations

import gc
import importlib
import importlib.machinery
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

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


def prepare() -> None:
    """Everything the daemon does before PySpark's takes over (see the module's docstring)."""
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
