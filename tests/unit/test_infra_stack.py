"""The stack's streaming job: how each launcher is started, and its supervisor on a fake clock (no Spark here).

Which live PID counts as the job or as a running ``up`` is tested with real processes in
tests/integration/test_infra_stack_processes.py.
"""

from __future__ import annotations

import io
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from infra import apps, stack, supervisor
from infra.apps import REPO, StreamingJob
from infra.processes import ServiceError
from tests.support.clock import Clock


def job(tmp_path: Path, launcher: str = "spark-submit") -> StreamingJob:
    return StreamingJob(
        run_dir=tmp_path,
        conf=Path("/c/streaming.properties"),
        overrides={"redis.url": "redis://h:1/0", "spark.master": "local[2]"},
        launcher=launcher,
    )


def test_spark_submit_runs_this_tree_s_main_script_with_the_same_arguments_as_python_m(tmp_path):
    j = job(tmp_path)
    binary = j._binary()
    assert binary.name == "spark-submit" and binary.is_file()
    args = ["-c", "/c/streaming.properties", "-D", "redis.url=redis://h:1/0", "-D", "spark.master=local[2]"]
    # with Spark's Kafka connector on the driver's class path (make setup resolved it into build/jvm)
    jars = ["--jars", f"{REPO / 'build' / 'jvm' / 'spark-kafka'}/*.jar"]
    assert j._command(binary) == [str(binary), *jars, str(REPO / "streaming" / "__main__.py"), *args]
    python = job(tmp_path, "python")
    assert python._command(Path(sys.executable)) == [sys.executable, "-m", "streaming", *args]


def test_spark_submit_starts_the_driver_with_the_operator_s_own_spark_jars_and_jvm_options(tmp_path):
    conf = tmp_path / "streaming.properties"
    conf.write_text("spark.jars=/opt/jars/*.jar\nspark.driver.extraJavaOptions=-Xss4m\n")
    j = StreamingJob(run_dir=tmp_path, conf=conf, overrides={}, launcher="spark-submit")
    argv = j._command(j._binary())
    assert argv[1:5] == ["--jars", "/opt/jars/*.jar", "--driver-java-options", "-Xss4m"], argv
    conf.write_text("redis.url=redis://h:1/0\n")  # neither set: the jars make setup resolved, C1 only
    argv = j._command(j._binary())
    jars = ",".join(str(j) for j in sorted((REPO / "build" / "jvm" / "spark-kafka").glob("*.jar")))
    assert argv[1:5] == ["--jars", jars, "--driver-java-options", "-XX:TieredStopAtLevel=1"], argv


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
    monkeypatch.setattr(stack.procfs, "cmdline", lambda pid: [])
    assert apps._runs_streaming(os.getpid())
    monkeypatch.setattr(stack.procfs, "cmdline", lambda pid: [sys.executable, "-c", "pass"])
    assert not apps._runs_streaming(os.getpid())


# --------------------------------------------------------------------------- supervision


def test_restarts_back_off_from_one_second_doubling_to_a_minute():
    clock = Clock()
    policy = supervisor.RestartPolicy(clock.seconds)
    policy.started()
    delays = []
    for _ in range(9):
        delays.append(policy.died())
        clock.advance(seconds=delays[-1])
        policy.started()
        clock.advance(seconds=5)  # each run dies after 5 s: not stable
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert policy.deaths == 9


def test_a_failed_start_counts_as_a_death_with_no_uptime():
    clock = Clock()
    policy = supervisor.RestartPolicy(clock.seconds)
    policy.started()
    clock.advance(seconds=3600)
    assert policy.died() == 1
    clock.advance(seconds=1)
    assert policy.died() == 2  # the start failed: no uptime, so no reset however long ago it ran
    assert policy.uptime() is None


@pytest.mark.parametrize("lived, next_delay", [(59.9, 8), (60.0, 1)])
def test_a_run_that_lasted_stable_after_resets_the_back_off(lived, next_delay):
    clock = Clock()
    policy = supervisor.RestartPolicy(clock.seconds)
    policy.started()
    for _ in range(3):  # 1, 2, 4
        clock.advance(seconds=policy.died())
        policy.started()
    clock.advance(seconds=lived)
    assert policy.died() == next_delay


def test_a_restart_is_due_only_once_its_delay_has_passed():
    clock = Clock()
    policy = supervisor.RestartPolicy(clock.seconds, first_delay=2.0)
    policy.started()
    assert not policy.waiting and not policy.due() and policy.seconds_left() is None
    policy.died()
    assert policy.waiting and policy.seconds_left() == 2.0
    clock.advance(seconds=1.999)
    assert not policy.due()
    clock.advance(seconds=0.001)
    assert policy.due() and policy.seconds_left() == 0.0
    policy.started()
    assert not policy.waiting and policy.uptime() == 0.0


@pytest.mark.parametrize("kwargs", [dict(first_delay=0), dict(first_delay=10, max_delay=5), dict(stable_after=-1)])
def test_a_back_off_that_cannot_work_is_refused(kwargs):
    with pytest.raises(ValueError, match="restart back-off"):
        supervisor.RestartPolicy(Clock().seconds, **kwargs)


@pytest.mark.parametrize(
    "code, text",
    [
        (-9, "killed by SIGKILL"),
        (1, "exited with code 1"),
        (0, "exited with code 0"),
        (None, "status unknown"),
        # spark-submit's JVM when its driver is SIGKILLed; a JVM after its own shutdown on SIGTERM
        (137, "exited with code 137 (128 + SIGKILL: it, or the process it ran, got SIGKILL)"),
        (143, "exited with code 143 (128 + SIGTERM: it, or the process it ran, got SIGTERM)"),
        (255, "exited with code 255"),
    ],
)
def test_an_exit_is_said_in_words(code, text):
    assert text in supervisor.describe_exit(code)
    if code == 255:  # 128 + 127: no signal has that number
        assert supervisor.describe_exit(code) == text


class FakeService:
    """What the supervisor uses of a ProcessService, with no process behind it."""

    def __init__(self, name: str, run_dir: Path, pid: int) -> None:
        self.name = name
        self.log_file = run_dir / f"{name}.log"
        self.log_file.write_text(f"{name} says hello\n")
        self.pid: int | None = pid
        self.code: int | None = None
        self.starts = 0
        self.start_error: Exception | None = None

    def running_pid(self) -> int | None:
        return self.pid

    def exit_code(self) -> int | None:
        return self.code

    def die(self, code: int, last_words: str = "") -> None:
        with self.log_file.open("a") as fh:
            fh.write(last_words)
        self.pid, self.code = None, code

    def start(self) -> None:
        self.starts += 1
        if self.start_error is not None:
            raise self.start_error
        self.pid, self.code = 5000 + self.starts, None


@pytest.fixture
def supervised(tmp_path):
    clock = Clock()
    services = {name: FakeService(name, tmp_path, pid) for name, pid in (("kafka", 11), ("namesrv-1", 22))}
    out = io.StringIO()
    ended: list[int] = []
    sup = supervisor.Supervisor(
        list(services.values()), clock=clock.seconds, out=out, end_session=lambda sid, grace: ended.append(sid)
    )
    return sup, services, clock, out, ended


def test_a_dead_service_is_reported_once_and_restarted_when_due_and_the_rest_is_left_alone(supervised):
    sup, services, clock, out, ended = supervised
    node, kafka = services["namesrv-1"], services["kafka"]
    clock.advance(seconds=30)
    node.die(-9, "last words\n")
    sup.check()
    said = out.getvalue()
    first = said.splitlines()[0]
    assert first.startswith(
        "namesrv-1 (pid 22) killed by SIGKILL after 30 s; the rest keeps running; "
        "restarting it on the same port in 1 s"
    ), said
    assert "  | last words" in said.splitlines()
    assert ended == [22]  # what the dead process left in its session is ended before the restart
    assert (node.log_file.parent / "namesrv-1.log.1").read_text().endswith("last words\n")
    assert node.starts == 0 and sup.next_check_s() == 1.0
    clock.advance(seconds=0.5)
    sup.check()
    assert node.starts == 0 and sup.next_check_s() == 0.5
    assert out.getvalue() == said  # said once, not at every check
    clock.advance(seconds=0.5)
    sup.check()
    assert node.starts == 1 and node.pid == 5001
    assert out.getvalue().splitlines()[-1] == "namesrv-1 restarted (pid 5001)"
    assert kafka.starts == 0 and kafka.pid == 11 and ended == [22]
    sup.check()
    assert node.starts == 1


def test_a_restart_that_fails_is_reported_and_retried_later(supervised):
    sup, services, clock, out, _ = supervised
    kafka = services["kafka"]
    kafka.die(1)
    sup.check()
    kafka.start_error = stack.ServiceError("kafka: port 19092 on 127.0.0.1 is already in use\nsecond line")
    clock.advance(seconds=1)
    sup.check()
    assert kafka.starts == 1
    assert out.getvalue().splitlines()[-1] == (
        "kafka could not be restarted: kafka: port 19092 on 127.0.0.1 is "
        f"already in use; next attempt in 2 s (death 2, log {kafka.log_file})"
    )
    kafka.start_error = RuntimeError("not a ServiceError")  # whatever goes wrong, the supervisor carries on
    clock.advance(seconds=2)
    sup.check()
    assert kafka.starts == 2 and "next attempt in 4 s" in out.getvalue().splitlines()[-1]
    kafka.start_error = None
    clock.advance(seconds=4)
    sup.check()
    assert kafka.starts == 3 and kafka.pid is not None


def test_nothing_is_restarted_once_stopping(supervised):
    sup, services, clock, out, _ = supervised
    services["kafka"].die(-15)
    services["namesrv-1"].die(-9)
    sup.check(stopping=lambda: True)
    assert out.getvalue() == ""  # `up` is about to stop everything: nothing to say or do
    sup.check()
    assert out.getvalue().count("restarting it") == 2
    clock.advance(seconds=1)  # both due now, but `up` got its signal during the back-off wait
    sup.check(stopping=lambda: True)
    assert [s.starts for s in services.values()] == [0, 0]


def test_a_log_quoted_on_the_terminal_cannot_drive_it(supervised):
    sup, services, _, out, _ = supervised
    services["kafka"].die(1, "evil \x1b[2J\x07 line\n")
    sup.check()
    assert "\x1b" not in out.getvalue() and "evil \\x1b[2J\\x07 line" in out.getvalue()


#: 2025-01-01T00:00:00Z, the wall clock of the logs below
WALL = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
OWN_ERROR = (
    'ts=2025-01-01T00:00:01.000Z level=error logger=streaming.sink msg="redis: batch 7 not written '
    "(ConnectionError('Connection refused')); the next write replaces everything\""
)
#: what Spark writes as the query dies under a killed driver: long, and not the cause
DYING_QUERY = "\n".join([
    "25/01/01 00:00:02 ERROR MicroBatchExecution: Query namesrv-liveness terminated with error",
    "java.lang.NullPointerException: Cannot invoke \"SparkSession.sessionState()\" because the return value of "
    "\"org.apache.spark.sql.execution.SparkPlan.session()\" is null",
    *["\tat org.apache.spark.sql.execution.SparkPlan.executeQuery(SparkPlan.scala:%d)" % i for i in range(200)],
    "Traceback (most recent call last):",
    '  File "pyspark/daemon.py", line 1, in worker',
    "EOFError: End of stream",
    "25/01/01 00:00:03 WARN ProcessingTimeExecutor: Current batch is falling behind.",
])  # fmt: skip


#: what the job logs when it raises a critical alert: at error level, but what it saw, not what went wrong with it
ALERT = (
    'ts=2025-01-01T00:00:02.000Z level=error logger=streaming.alerts msg="ALERT OPEN CRITICAL GROUP_WITHOUT_MASTER '
    'cluster=DefaultCluster broker=broker-a: no master"'
)


def test_the_job_s_last_error_is_its_own_line_not_spark_s_trace():
    ours_warning = "ts=2025-01-01T00:00:00.000Z level=warning logger=streaming.progress msg=slow"
    assert supervisor.own_last_error("\n".join([OWN_ERROR, ours_warning, DYING_QUERY]), WALL) == OWN_ERROR
    assert supervisor.own_last_error("\n".join([ours_warning, DYING_QUERY]), WALL) is None
    exit_line = "error: the streaming query failed 6 times within 600 s; last: boom"
    assert supervisor.own_last_error("\n".join([OWN_ERROR, exit_line, DYING_QUERY]), WALL) == exit_line
    long = OWN_ERROR + " exc=" + "x" * 5000
    assert supervisor.own_last_error(long, WALL) == long[:600] + " ..."


def test_an_alert_is_not_the_job_s_error():
    assert supervisor.own_last_error("\n".join([ALERT, DYING_QUERY]), WALL) is None
    assert supervisor.own_last_error("\n".join([OWN_ERROR, ALERT, DYING_QUERY]), WALL) == OWN_ERROR
    other = ALERT.replace("logger=streaming.alerts", "logger=streaming.alertsink")
    assert supervisor.own_last_error(other, WALL) == other  # only the alerts logger itself, by name


def test_only_an_error_logged_at_or_after_since_counts_and_the_exit_message_always():
    assert supervisor.own_last_error(OWN_ERROR, WALL + 1) == OWN_ERROR
    assert supervisor.own_last_error(OWN_ERROR, WALL + 1.001) is None
    older = OWN_ERROR.replace("00:00:01.000Z", "00:00:00.500Z")
    # the last in time, not in place
    assert supervisor.own_last_error("\n".join([OWN_ERROR, older]), WALL + 1) == OWN_ERROR
    unreadable = OWN_ERROR.replace("2025-01-01T00:00:01.000Z", "yesterday")
    assert supervisor.own_last_error(unreadable, 0) is None  # no time to judge it by: not a last word
    exit_line = "error: the streaming query failed 6 times within 600 s; last: boom"
    assert supervisor.own_last_error("\n".join([OWN_ERROR, exit_line]), WALL + 3600) == exit_line


def job_dies(tmp_path: Path, code: int, last_words: str, *, alive_at: float = WALL + 2) -> tuple[str, StreamingJob]:
    """What the supervisor says when the job, last seen alive at ``alive_at`` (wall clock), dies with ``code``
    after writing ``last_words``."""
    j = job(tmp_path, "python")
    out = io.StringIO()
    fake = FakeService("streaming", tmp_path, 33)
    j.running_pid, j.exit_code = fake.running_pid, fake.exit_code  # type: ignore[method-assign]
    wall = Clock()
    wall.set(seconds=alive_at)
    sup = supervisor.Supervisor(
        [j], clock=Clock().seconds, out=out, end_session=lambda sid, grace: None, wall_clock=wall.seconds
    )
    fake.die(code, last_words)
    wall.advance(seconds=1.0)  # the next poll
    sup.check()
    return out.getvalue(), j


def test_the_job_is_restarted_from_its_checkpoint_naming_the_signal_and_the_error_it_logged_as_it_died(tmp_path):
    said, j = job_dies(tmp_path, -9, f"{OWN_ERROR}\n{ALERT}\n{DYING_QUERY}\n")  # the trace runs far past a log tail
    assert said.startswith(
        "streaming (pid 33) killed by SIGKILL after 0 s; the rest keeps running; restarting it from its "
        f"checkpoint in 1 s (death 1); the error it logged in its last seconds (log {j.log_file}.1):\n"
    ), said
    assert said.splitlines()[1:] == ["  | " + OWN_ERROR]


def test_a_job_killed_minutes_after_its_last_error_or_alert_is_said_killed_and_nothing_it_logged_is_quoted(tmp_path):
    # the job raised an alert and logged an error, lived on for two and a half minutes, then got kill -9
    said, j = job_dies(tmp_path, -9, f"{OWN_ERROR}\n{ALERT}\n{DYING_QUERY}\n", alive_at=WALL + 150)
    assert said == (
        "streaming (pid 33) killed by SIGKILL after 0 s; the rest keeps running; restarting it from its "
        f"checkpoint in 1 s (death 1); it logged no error of its own in its last seconds (log {j.log_file}.1)\n"
    )


def test_an_alert_raised_as_the_job_died_is_not_said_to_be_its_error(tmp_path):
    said, _ = job_dies(tmp_path, 1, f"{ALERT}\n{DYING_QUERY}\n")
    assert "ALERT" not in said and "it logged no error of its own in its last seconds" in said, said


def test_a_job_that_logged_no_error_of_its_own_is_said_to_have_none_rather_than_spark_s_trace(tmp_path):
    said, j = job_dies(tmp_path, 1, DYING_QUERY)
    assert said == (
        "streaming (pid 33) exited with code 1 after 0 s; the rest keeps running; restarting it from its "
        f"checkpoint in 1 s (death 1); it logged no error of its own in its last seconds (log {j.log_file}.1)\n"
    )


def test_a_job_that_gave_up_is_said_to_exit_with_its_code_and_its_exit_message(tmp_path):
    exit_line = "error: the streaming query failed 6 times within 600 s; last: boom"
    said, _ = job_dies(tmp_path, 1, f"{OWN_ERROR}\n{exit_line}\n", alive_at=WALL + 600)
    assert said.startswith("streaming (pid 33) exited with code 1 after 0 s;") and said.splitlines()[1:] == [
        "  | " + exit_line
    ], said


def test_the_job_s_last_seconds_follow_the_supervisor_s_last_sight_of_it_alive(tmp_path):
    j = job(tmp_path, "python")
    fake = FakeService("streaming", tmp_path, 33)
    j.running_pid, j.exit_code = fake.running_pid, fake.exit_code  # type: ignore[method-assign]
    wall, out = Clock(), io.StringIO()
    wall.set(seconds=WALL - 600)
    sup = supervisor.Supervisor(
        [j], clock=Clock().seconds, out=out, end_session=lambda sid, grace: None, wall_clock=wall.seconds
    )
    wall.set(seconds=WALL + 3)  # seen alive at every poll, the last one 2 s after the error
    sup.check()
    fake.die(-15, OWN_ERROR + "\n")
    wall.advance(seconds=1.0)
    sup.check()
    assert out.getvalue().splitlines()[1:] == ["  | " + OWN_ERROR], out.getvalue()


def test_each_node_and_the_job_get_a_metrics_port_and_the_banner_prints_their_urls(tmp_path):
    services = tmp_path / "services.properties"
    services.write_text(f"run.dir={tmp_path / 'run'}\n")
    args = stack.build_parser().parse_args(
        ["status", "--services-conf", str(services), "--node-ports", "9876,9877", "--metrics-base", "9500"]
    )
    built = stack.build_stack(args)
    nodes = [s for s in built if isinstance(s, stack.NodeService)]
    assert [n.properties["metricsPort"] for n in nodes] == ["9501", "9502"]
    (monitor,) = [s for s in built if isinstance(s, StreamingJob)]
    assert monitor.overrides["monitor.metricsPort"] == "9500"
    text = stack.banner(built, args.node_ports)
    for port in (9500, 9501, 9502):
        assert f"http://127.0.0.1:{port}/metrics" in text
    (line,) = [li for li in text.splitlines() if li.strip().startswith("streaming ")]
    assert line.split()[1] == "127.0.0.1:9500"  # where the job listens: its metrics, not port 0
    off = stack.build_stack(stack.build_parser().parse_args(["status", "--services-conf", str(services),
                                                             "--metrics-base", "0"]))  # fmt: skip
    assert stack.metrics_urls(off) == [] and "Metrics:             off" in stack.banner(off, [9876, 9877])
    (monitor,) = [s for s in off if isinstance(s, StreamingJob)]
    assert monitor.address == "(metrics off)"


def test_the_job_s_address_is_the_metrics_port_its_conf_gives(tmp_path):
    conf = tmp_path / "streaming.properties"
    conf.write_text("monitor.metricsPort=9999\nmonitor.metricsBindAddress=127.0.0.2\n")
    j = StreamingJob(run_dir=tmp_path, conf=conf, overrides={}, launcher="python")
    assert j.address == "127.0.0.2:9999" and stack.metrics_urls([j]) == [("streaming", "http://127.0.0.1:9999/metrics")]
    assert job(tmp_path).address == "(metrics off)"  # a conf that cannot be read: the job says why when it starts
