"""The executors' Python worker daemon (streaming/spark_daemon.py): what it imports before it forks, and from where."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from streaming import spark_daemon

INSTALLED = Path(pyspark.__file__).parent
ZIPS = [str(INSTALLED / "python" / "lib" / z.name) for z in sorted((INSTALLED / "python" / "lib").glob("*.zip"))]


def test_the_zips_of_the_installed_pyspark_go_after_it_and_any_other_keeps_its_place():
    assert ZIPS, "a pip-installed PySpark ships pyspark.zip and py4j's"
    site = str(INSTALLED.parent)
    assert spark_daemon.prefer_installed_pyspark([*ZIPS, "/work", site]) == ["/work", site, *ZIPS]
    foreign = ["/opt/spark/python/lib/pyspark.zip", "/work", site]  # a Spark distribution's own
    assert spark_daemon.prefer_installed_pyspark(foreign) == foreign
    assert spark_daemon.prefer_installed_pyspark(["/work", site]) == ["/work", site]


REPO = str(Path(__file__).resolve().parents[2])


def fresh_python(code: str, path: list[str], **env: str) -> list[str]:
    """What ``code`` prints, run in a fresh interpreter with ``path`` as its PYTHONPATH and only ``env`` besides."""
    out = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": ":".join(path), **env}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.slow
def test_what_the_daemon_imports_starts_no_thread_as_the_workers_path_has_it():
    """Run as Spark runs it: the zips first on the path, a fresh interpreter; the preload must not raise."""
    code = (
        "import sys; from streaming import spark_daemon as d; sys.path[:] = d.prefer_installed_pyspark(sys.path); "
        "d.preload(); import pyspark.worker; print(pyspark.worker.__file__, 'pyarrow' in sys.modules, d.threads())"
    )
    where, pyarrow, threads = fresh_python(code, [*ZIPS, REPO])
    assert ".zip" not in where and pyarrow == "False" and threads == "1"


@pytest.mark.slow
def test_prepare_imports_numpy_pyarrow_and_pandas_threadless_and_frozen_out_of_a_forked_workers_collections():
    """The daemon's own sequence: the settings it gives itself keep the imports threadless, and in a child
    forked after it only what the child made itself is scanned by the gc.collect() PySpark's worker loop
    runs after every task (gc.get_objects lists what a collection would walk)."""
    code = (
        "import gc, os, sys; from streaming import spark_daemon as d; d.prepare(); pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if len(gc.get_objects()) < 1000 and gc.get_freeze_count() > 50000 else 3)\n"
        "print(all(m in sys.modules for m in ('numpy', 'pyarrow', 'pandas')), d.threads(), os.waitpid(pid, 0)[1] >> 8)"
    )
    assert fresh_python(code, [*ZIPS, REPO]) == ["True", "1", "0"]


@pytest.mark.slow
def test_without_the_daemons_settings_the_imports_start_threads_so_an_operators_own_value_skips_them():
    """The settings are what keeps the fork safe (this fails if numpy or pyarrow stop starting threads:
    then NO_THREADS and PRELOAD_THREADLESS can go); an operator's own value is kept and the three skipped."""
    code = "import numpy, pyarrow; from streaming import spark_daemon as d; print(d.threads())"
    assert int(fresh_python(code, [REPO], OPENBLAS_NUM_THREADS="2")[0]) > 1
    environ = {"OPENBLAS_NUM_THREADS": "4"}
    assert spark_daemon.threadless_settings(environ) is False
    assert environ == {"OPENBLAS_NUM_THREADS": "4", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
    assert spark_daemon.threadless_settings({}) is True


def test_a_module_that_starts_a_thread_stops_the_daemon_with_a_message(tmp_path, monkeypatch):
    (tmp_path / "spawns_a_thread.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit, match="started a thread .* unset spark.python.daemon.module"):
        spark_daemon.preload(("json", "spawns_a_thread"))
