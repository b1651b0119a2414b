"""Which live PID counts as the stack's streaming job, or as a running ``up``: real processes whose
command lines say so (or not)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import stack
from infra.apps import StreamingJob


@pytest.mark.parametrize("extra, is_job", [([], False), (["streaming/__main__.py"], True)])
def test_a_live_pid_counts_as_the_job_only_if_it_runs_the_job(tmp_path, extra, is_job):
    # same binary as the job, so only the command line tells them apart (java and bash are as common)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", *extra], stdin=subprocess.PIPE)
    try:
        while not Path(f"/proc/{child.pid}/cmdline").read_bytes():
            time.sleep(0.01)  # just past exec, a process shows no command line for a moment
        j = StreamingJob(run_dir=tmp_path, conf=Path("/c/streaming.properties"), overrides={}, launcher="spark-submit")
        j.pidfile.write_text(f"{child.pid}\n")
        assert j.status().pid == (child.pid if is_job else None)
        assert j.pidfile.exists() == is_job
    finally:
        child.communicate(b"")


def test_a_second_up_on_the_same_run_dir_is_refused(tmp_path, capsys):
    conf = tmp_path / "services.properties"
    run = tmp_path / "run"
    conf.write_text(f"run.dir={run}\n")
    run.mkdir()
    # a process whose command line reads as `python -m infra.stack up`, as the first `up`'s does
    first = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", "infra.stack", "up"], stdin=subprocess.PIPE
    )
    try:
        while not Path(f"/proc/{first.pid}/cmdline").read_bytes():
            time.sleep(0.01)
        (run / stack.UP_PIDFILE).write_text(f"{first.pid}\n")
        assert stack.running_up(run) == first.pid
        assert stack.main(["up", "--services-conf", str(conf), "--no-streaming"]) == 1
        assert f"already up (pid {first.pid}" in capsys.readouterr().err
        assert (run / stack.UP_PIDFILE).read_text() == f"{first.pid}\n"  # the first one's pidfile is left alone
        assert not (run / "kafka.pid").exists()
    finally:
        first.communicate(b"")
    assert stack.running_up(run) is None  # gone


def test_a_pidfile_naming_another_program_is_not_an_up(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        while not Path(f"/proc/{other.pid}/cmdline").read_bytes():
            time.sleep(0.01)
        (tmp_path / stack.UP_PIDFILE).write_text(f"{other.pid}\n")
        assert stack.running_up(tmp_path) is None
    finally:
        other.communicate(b"")
