"""The stack's streaming job: how each launcher is started and which PID counts as the job (no Spark here)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra import stack
from infra.services import ServiceError
from infra.stack import REPO, Launcher, StreamingJob


def job(tmp_path: Path, launcher: str = "spark-submit") -> StreamingJob:
    return StreamingJob(run_dir=tmp_path, conf=Path("/c/streaming.properties"),
                        overrides={"redis.url": "redis://h:1/0", "spark.master": "local[2]"}, launcher=launcher)


def test_spark_submit_runs_this_tree_s_main_script_with_the_same_arguments_as_python_m(tmp_path):
    j = job(tmp_path)
    binary = j._binary()
    assert binary.name == "spark-submit" and binary.is_file()
    args = ["-c", "/c/streaming.properties", "-D", "redis.url=redis://h:1/0", "-D", "spark.master=local[2]"]
    assert j._command(binary) == [str(binary), str(REPO / "streaming" / "__main__.py"), *args]
    python = job(tmp_path, "python")
    assert python._command(Path(sys.executable)) == [sys.executable, "-m", "streaming", *args]


def test_spark_submit_gets_this_interpreter_and_this_tree_without_an_activated_venv(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "jupyter")  # a notebook setting must not become our driver
    env = job(tmp_path)._environment()
    assert env is not None
    assert env["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/elsewhere"]
    assert job(tmp_path, "python")._environment() is None  # inherits ours, as before


def test_an_unknown_launcher_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(ServiceError, match=r"'spark'.*python \| spark-submit"):
        job(tmp_path, "spark")


@pytest.mark.parametrize("extra, is_job", [([], False), (["streaming/__main__.py"], True)])
def test_a_live_pid_counts_as_the_job_only_if_it_runs_the_job(tmp_path, extra, is_job):
    # same binary as the job, so only the command line tells them apart (java and bash are as common)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", *extra], stdin=subprocess.PIPE)
    try:
        while not Path(f"/proc/{child.pid}/cmdline").read_bytes():
            time.sleep(0.01)  # just past exec, a process shows no command line for a moment
        j = job(tmp_path)
        j.pidfile.write_text(f"{child.pid}\n")
        assert j.status().pid == (child.pid if is_job else None)
        assert j.pidfile.exists() == is_job
    finally:
        child.communicate(b"")


@pytest.mark.parametrize("env, shown", [(None, "python"), ("spark-submit", "spark-submit")])
def test_up_s_launcher_defaults_to_the_environment_variable(tmp_path, monkeypatch, capsys, env, shown):
    if env is None:
        monkeypatch.delenv(stack.LAUNCHER_ENV, raising=False)
    else:
        monkeypatch.setenv(stack.LAUNCHER_ENV, env)
    conf = tmp_path / "services.properties"
    conf.write_text(f"run.dir={tmp_path / 'run'}\n")
    assert stack.main(["status", "--services-conf", str(conf)]) == 0
    line = next(li for li in capsys.readouterr().out.splitlines() if li.startswith("streaming "))
    assert f"launcher={shown}" in line.split()


def test_a_bad_launcher_in_the_environment_is_a_usage_error(monkeypatch):
    monkeypatch.setenv(stack.LAUNCHER_ENV, "yarn")
    with pytest.raises(SystemExit) as exc:
        stack.main(["status"])
    assert exc.value.code == 2



def test_a_pid_just_past_exec_with_no_command_line_yet_counts_as_the_job(monkeypatch):
    # `start` looks at the job within a millisecond of exec; an empty command line is not "another program"
    monkeypatch.setattr(stack, "_cmdline", lambda pid: [])
    assert stack._runs_streaming(os.getpid())
    monkeypatch.setattr(stack, "_cmdline", lambda pid: [sys.executable, "-c", "pass"])
    assert not stack._runs_streaming(os.getpid())
