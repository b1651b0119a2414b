"""The job's Python workers log as its driver does, and PySpark's prints of its driver-side worker stay out of its log.

Each case runs in a fresh interpreter, as Spark starts a worker: logging is set once per process.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streaming import spark_daemon

REPO = str(Path(__file__).resolve().parents[2])
#: a line of the job's own log: time and level first (common.logs)
LOGFMT = re.compile(r"ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(\w+) logger=(\S+) msg=(.*)")


def fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": REPO}, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done


def test_a_worker_forked_from_the_daemon_logs_a_warning_with_its_time_and_level_and_no_info():
    done = fresh_python(
        "import logging, os\n"
        "from streaming import spark_daemon\n"
        "spark_daemon.setup_worker_logging()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    log = logging.getLogger('streaming.events')\n"
        "    log.info('an info line')\n"
        "    log.warning('skipping %d malformed event(s) of this read; first: %s', 3, 'event: not JSON')\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    (line,) = done.stderr.splitlines()
    m = LOGFMT.fullmatch(line)
    assert m is not None, line
    assert m.groups() == (
        "warning",
        "streaming.events",
        '"skipping 3 malformed event(s) of this read; first: event: not JSON"',
    )


def test_the_daemon_sets_up_logging_first_of_all():
    calls: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spark_daemon, "setup_worker_logging", lambda: calls.append("logging"))
        mp.setattr(spark_daemon, "prefer_installed_pyspark", lambda path: calls.append("path") or path)
        mp.setattr(spark_daemon, "preload", lambda modules: calls.append("preload"))
        mp.setattr(spark_daemon.gc, "freeze", lambda: calls.append("freeze"))
        spark_daemon.prepare()
    assert calls == ["logging", "path", "preload", "freeze"]


def test_the_driver_worker_named_is_pyspark_s_and_prints_its_progress_to_stdout():
    """If PySpark renames the module or stops printing, DRIVER_WORKER and setup_driver_worker can go."""
    spec = importlib.util.find_spec(spark_daemon.DRIVER_WORKER)
    assert spec is not None and spec.origin is not None
    assert 'print(f"{log_name} Completed execution of UDF: {func}.\\n")' in Path(spec.origin).read_text()


@pytest.mark.slow
def test_importing_the_processor_in_the_driver_worker_silences_its_prints_and_sets_up_logging():
    """What the driver worker does: it runs as ``python -m`` DRIVER_WORKER, prints a line, unpickles the
    processor (importing streaming.liveness), prints more; the job's code then logs."""
    done = fresh_python(
        "import logging, sys, types\n"
        f"sys.modules['__main__'].__spec__ = types.SimpleNamespace(name={spark_daemon.DRIVER_WORKER!r})\n"
        "print('Starting Streaming TransformWithStateInPandas Python worker.\\n')\n"
        "import streaming.liveness\n"
        "print('Streaming TransformWithStateInPandas Python worker Completed execution of UDF: <bound method>.\\n')\n"
        "logging.getLogger('streaming.liveness').warning('a warning of ours')\n"
    )
    # the first line is printed before any of the job's code runs there
    assert done.stdout == "Starting Streaming TransformWithStateInPandas Python worker.\n\n"
    (line,) = done.stderr.splitlines()
    assert (m := LOGFMT.fullmatch(line)) is not None and m.groups() == (
        "warning",
        "streaming.liveness",
        '"a warning of ours"',
    )


@pytest.mark.slow
def test_elsewhere_importing_the_processor_leaves_stdout_and_logging_alone():
    done = fresh_python("import logging, streaming.liveness\nprint('printed')\nprint(logging.getLogger().handlers)\n")
    assert done.stdout == "printed\n[]\n"
    assert spark_daemon.setup_driver_worker(sys.modules[__name__]) is False
