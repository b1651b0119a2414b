"""The whole system on one machine: ``make run`` and ``make stop``.

``up`` starts, in order, the local Apache Kafka and Redis (:mod:`infra.services`), the Spark streaming
job in local mode (its slow start overlaps the rest), the name-server nodes and the cluster-health
console (:class:`ConsoleService`), prints where everything is, and stays in the foreground
restarting whatever dies; Ctrl-C or SIGTERM stops everything it started, by PID.  ``down`` (``make
stop``) stops a running ``up`` first, so that nothing it stops is restarted behind its back, then
whatever the pidfiles still name.
``status`` prints one line per service.  Every service is a child process in a session of its own
with a pidfile and a log in the run dir; a :class:`Supervisor` polls their PIDs and restarts a dead
one with back-off (:class:`RestartPolicy`), after ending what it left in its session, while the rest
keeps running, since each part tolerates the others' absence.  ``docs/internals/local-stack.md``
says what happens meanwhile, per service.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from common import procfs
from infra.apps import (  # the stack's apps; re-exported, where callers have found them
    LAUNCHER_ENV,
    REPO,
    ConsoleService,
    Launcher,
    NodeService,
    StreamingJob,
    _end_dead_session,
)
from infra.services import (
    LOOPBACK,
    KafkaService,
    ProcessService,
    RedisService,
    ServiceError,
    _log_tail,
    _read_pidfile,
    _write_pidfile,
    load_config,
    pid_alive,
)

log = logging.getLogger("infra.stack")


# --------------------------------------------------------------------------- supervision


@dataclass
class RestartPolicy:
    """When to restart one service that died: the supervisor's decisions, without processes or sleeps.

    The first restart comes ``first_delay`` seconds after the death; each further one waits twice as
    long as the one before, up to ``max_delay``.  A run that lasted ``stable_after`` seconds resets
    the delay, so a service that dies once a day comes back after a second, while one that dies at
    every start settles at one attempt a minute.  A start that fails counts as a death with no
    uptime.  Time comes only from ``clock`` (seconds, monotonic), so tests drive it by hand.
    """

    clock: Callable[[], float] = time.monotonic
    first_delay: float = 1.0
    max_delay: float = 60.0
    stable_after: float = 60.0
    #: deaths (and failed starts) so far
    deaths: int = field(default=0, init=False)
    _delay: float = field(default=0.0, init=False, repr=False)
    _up_since: float | None = field(default=None, init=False, repr=False)
    _due: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.first_delay <= self.max_delay or self.stable_after < 0:
            raise ValueError(
                f"restart back-off: need 0 < first_delay ({self.first_delay}) <= max_delay "
                f"({self.max_delay}) and stable_after ({self.stable_after}) >= 0"
            )
        self._delay = self.first_delay

    def started(self) -> None:
        """The service runs (again): its uptime counts from now."""
        self._up_since, self._due = self.clock(), None

    def died(self) -> float:
        """The service died, or a start failed; returns the seconds until it is to be restarted."""
        now = self.clock()
        if self._up_since is not None and now - self._up_since >= self.stable_after:
            self._delay = self.first_delay
        delay = self._delay
        self._delay = min(delay * 2, self.max_delay)
        self._up_since, self._due = None, now + delay
        self.deaths += 1
        return delay

    @property
    def waiting(self) -> bool:
        """True from a death until the next ``started``."""
        return self._due is not None

    def uptime(self) -> float | None:
        """Seconds since ``started``; None while waiting."""
        return None if self._up_since is None else self.clock() - self._up_since

    def seconds_left(self) -> float | None:
        """Seconds until the restart is due (0 once it is); None when not waiting."""
        return None if self._due is None else max(0.0, self._due - self.clock())

    def due(self) -> bool:
        return self.seconds_left() == 0.0


def describe_exit(code: int | None) -> str:
    """How a process ended, in words: ``killed by SIGKILL``, ``exited with code 1``.

    A code of 128 + a signal's number is what a launcher exits with when the process it ran was killed by
    that signal (spark-submit's JVM when its driver is), and what a JVM exits with after its own shutdown on
    one: the signal is named beside it.
    """
    if code is None:
        return "exited (status unknown: this `up` did not start it)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code > 128:
        with contextlib.suppress(ValueError):
            name = signal.Signals(code - 128).name
            return f"exited with code {code} (128 + {name}: it, or the process it ran, got {name})"
    return f"exited with code {code}"


#: how much of a dead job's log is searched for its own last error: Spark's traces after it run long
_JOB_LOG_SCAN_BYTES = 1 << 20
#: an error the job logged tells why it died only if logged in its last moments: this many seconds
#: before the supervisor last saw it alive, or later.  An older one is an error it lived on after.
LAST_WORDS_S = 5.0
#: a line the job's own code wrote about an error: a logfmt record of ours at error level or above
#: (common.logs), or the ``error: ...`` it prints as it exits; Spark's and the JVM's lines are neither,
#: and neither is an alert (streaming.alerts logs a critical one at error level): an alert says what
#: the job saw in the cluster, not what went wrong with the job
_OWN_ERROR = re.compile(
    r"ts=(?P<ts>\S+) level=(?:error|critical) "
    r"logger=(?!streaming\.alerts\b)(?:streaming|namesrv|common|__main__)\b"
    r"|error: "
)
#: characters of that line quoted
_MAX_ERROR_CHARS = 600


def _logged_at(ts: str) -> float | None:
    """Seconds since the epoch of a logfmt ``ts`` (``2025-01-01T00:00:01.000Z``, UTC); None if it is not one."""
    try:
        return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def own_last_error(log_tail: str, since: float) -> str | None:
    """The last error line the job's own code wrote in ``log_tail`` at or after ``since`` (seconds since
    the epoch), shortened; None if it wrote none then.

    As the job dies, Spark logs the dying query's traces (``NullPointerException ... SparkPlan.session()
    is null``): effects of the death, not its cause, so only the job's own lines count; and of those only
    the recent ones, since an error it logged minutes before is one it lived on after.  The ``error: ...``
    it prints as it exits has no time, and is written only then: it always counts.
    """
    for line in reversed(log_tail.splitlines()):
        m = _OWN_ERROR.match(line)
        if m is None:
            continue
        if m["ts"] is not None:
            at = _logged_at(m["ts"])
            if at is None or at < since:
                continue
        return line if len(line) <= _MAX_ERROR_CHARS else line[:_MAX_ERROR_CHARS] + " ..."
    return None


@dataclass
class _Watched:
    service: ProcessService
    policy: RestartPolicy
    pid: int | None = None
    #: when the supervisor last saw its process alive (``wall_clock``): it died after that
    alive_at: float = 0.0


class Supervisor:
    """Applies one :class:`RestartPolicy` per service of a running stack; ``up``'s loop calls ``check``.

    ``check`` finds the services whose process is gone, says so (one line, then the end of its log),
    ends what is left of the dead process's session, and restarts each when its policy says; a
    restart that fails is reported and retried.  It does nothing more once ``stopping()`` is true,
    so a signal to ``up`` during a back-off wait or a restart leaves ``up`` free to stop everything.
    """

    #: how long what a dead service left in its session gets to exit by itself before SIGKILL
    LEFTOVER_GRACE_S = 5.0

    def __init__(
        self,
        services: list[ProcessService],
        *,
        clock: Callable[[], float] = time.monotonic,
        out: TextIO | None = None,
        poll_s: float = 1.0,
        end_session: Callable[[int, float], None] = _end_dead_session,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._out = out
        self._end_session = end_session
        self._wall_clock = wall_clock  # the clock of the job's log lines, to tell its last words
        self.poll_s = poll_s
        self._watched = [_Watched(s, RestartPolicy(clock)) for s in services]
        for w in self._watched:
            w.pid = w.service.running_pid()
            w.policy.started()
            w.alive_at = wall_clock()

    def next_check_s(self) -> float:
        """How long ``up`` may wait before the next ``check``: the poll interval or the next restart."""
        left = [s for w in self._watched if (s := w.policy.seconds_left()) is not None]
        return min([self.poll_s, *left])

    def check(self, stopping: Callable[[], bool] = lambda: False) -> None:
        for w in self._watched:
            if stopping():
                return
            if not w.policy.waiting:
                pid = w.service.running_pid()
                if pid is not None:
                    w.pid, w.alive_at = pid, self._wall_clock()
                    continue
                self._died(w)
            if w.policy.due() and not stopping():
                self._restart(w)

    def _say(self, text: str) -> None:
        print(text, file=self._out or sys.stderr, flush=True)

    def _died(self, w: _Watched) -> None:
        service, pid = w.service, w.pid
        uptime = w.policy.uptime()
        delay = w.policy.died()
        if pid is not None:
            # what is still in its session (the job's JVM and Python workers) must go before a new
            # job takes the same checkpoint
            self._end_session(pid, self.LEFTOVER_GRACE_S)
        kept = service.log_file.with_name(service.log_file.name + ".1")
        with contextlib.suppress(OSError):
            service.log_file.replace(kept)  # `start` truncates the log: keep the dead one's
        lived = f" after {uptime:.0f} s" if uptime is not None else ""
        if isinstance(service, StreamingJob):
            what = "from its checkpoint"
            # the cause is the exit said first (a signal, a code); an error of its own only adds to it
            # when logged as it died
            error = own_last_error(_log_tail(kept, _JOB_LOG_SCAN_BYTES), w.alive_at - LAST_WORDS_S)
            if error is None:
                said = f"it logged no error of its own in its last seconds (log {kept})"
            else:
                said = f"the error it logged in its last seconds (log {kept}):\n  | {_printable(error)}"
        else:
            what, said = "on the same port", f"its log {kept} ends with:\n{_tail(kept)}"
        self._say(
            f"{service.name} (pid {pid or '-'}) {describe_exit(service.exit_code())}{lived}; the rest keeps "
            f"running; restarting it {what} in {delay:.0f} s (death {w.policy.deaths}); {said}"
        )

    def _restart(self, w: _Watched) -> None:
        service = w.service
        try:
            service.start()
        # any failure: one service that cannot start yet must not take the others down with it
        except Exception as e:  # noqa: BLE001
            delay = w.policy.died()
            why = _printable(next(iter(str(e).splitlines()), "") or repr(e))
            self._say(
                f"{service.name} could not be restarted: {why}; next attempt in {delay:.0f} s "
                f"(death {w.policy.deaths}, log {service.log_file})"
            )
            return
        w.policy.started()
        w.pid, w.alive_at = service.running_pid(), self._wall_clock()
        self._say(f"{service.name} restarted (pid {w.pid or '-'})")


# --------------------------------------------------------------------------- the stack


def build_stack(args: argparse.Namespace) -> list[ProcessService]:
    services = load_config(args.services_conf)
    run_dir = services.run_dir
    stack: list[ProcessService] = [KafkaService.from_config(services), RedisService.from_config(services)]
    monitor_metrics, node_metrics = metrics_ports(args.metrics_base, len(args.node_ports))
    # the job right after Kafka and Redis, all it needs: its JVM's start, the longest, overlaps the nodes' and
    # the console's, and the first decision comes sooner after `make run`
    if not args.no_streaming:
        stack.append(
            StreamingJob(
                run_dir=run_dir,
                conf=args.streaming_conf,
                overrides={
                    "kafka.bootstrap": services.kafka_bootstrap,
                    "redis.url": services.redis_url,
                    "monitor.checkpointDir": str(run_dir / "streaming" / "checkpoint"),
                    "monitor.metricsPort": str(monitor_metrics),
                    "monitor.metricsBindAddress": args.bind,
                },
                launcher=args.streaming_launcher,
            )
        )
    for port, metrics_port in zip(args.node_ports, node_metrics, strict=True):
        stack.append(
            NodeService(
                port=port,
                run_dir=run_dir,
                conf=args.namesrv_conf,
                properties={
                    "bindAddress": args.bind,
                    "listenPort": str(port),
                    "nodeName": f"node-{port}",
                    "kafkaBootstrapServers": services.kafka_bootstrap,
                    "redisUrl": services.redis_url,
                    "kvConfigPath": str(run_dir / f"namesrv-{port}" / "kvConfig.json"),
                    "configStorePath": str(run_dir / f"namesrv-{port}" / "namesrv.properties"),
                    "metricsPort": str(metrics_port),
                },
            )
        )
    if args.console_port:
        stack.append(ConsoleService(port=args.console_port, run_dir=run_dir, redis_url=services.redis_url))
    return stack


def metrics_ports(base: int, nodes: int) -> tuple[int, list[int]]:
    """The monitor's metrics port and each node's: ``base``, then ``base + 1`` ... (all 0 when ``base`` is 0)."""
    if base == 0:
        return 0, [0] * nodes
    return base, [base + 1 + i for i in range(nodes)]


def metrics_urls(stack: list[ProcessService], host: str = LOOPBACK) -> list[tuple[str, str]]:
    """``(service name, URL)`` of every Prometheus endpoint the stack serves."""
    urls = []
    for service in stack:
        if isinstance(service, NodeService):
            port = int(service.properties.get("metricsPort", "0"))
        elif isinstance(service, StreamingJob):
            port = endpoint[1] if (endpoint := service.metrics_endpoint) else 0
        else:
            continue
        if port:
            urls.append((service.name, f"http://{host}:{port}/metrics"))
    return urls


def banner(stack: list[ProcessService], node_ports: list[int]) -> str:
    namesrv_addr = ";".join(f"127.0.0.1:{p}" for p in node_ports)
    lines = ["", "The name-server system is up:"]
    for service in stack:
        status = service.status()
        lines.append(f"  {status.name:<16} {status.address:<22} pid {status.pid or '-':<8} log {status.log_file}")
    kafka = next(s for s in stack if isinstance(s, KafkaService))
    redis = next(s for s in stack if isinstance(s, RedisService))
    console = next((s for s in stack if isinstance(s, ConsoleService)), None)
    lines += [
        "",
        *([f"  Cluster health:      {console.url}   (live console in the browser)"] if console else []),
        f"  Kafka:               Apache Kafka, one KRaft node: bootstrap {kafka.bootstrap_servers}, controller "
        f"{kafka.host}:{kafka.controller_port}, data {kafka.data_dir}",
        f"  Brokers and clients: namesrvAddr={namesrv_addr}   (or NAMESRV_ADDR='{namesrv_addr}')",
        f"  Admin:               .venv/bin/namesrv admin -n 127.0.0.1:{node_ports[0]} clusterList",
        f"  A simulated fleet:   .venv/bin/namesrv simulate -n '{namesrv_addr}' --brokers 3 --topics 10 "
        "--silent 1 --silent-after 30",
        f"  Routes in Redis:     .venv/bin/namesrv-monitor routes --redis {redis.url} get T0   (or: routes watch)",
        "  Alerts:              in the streaming log, and on the Kafka topic namesrv-alerts",
    ]
    urls = metrics_urls(stack)
    lines += [f"  {'Metrics:' if i == 0 else '':<20} {url}   ({name})" for i, (name, url) in enumerate(urls)] or [
        "  Metrics:             off (--metrics-base 0)"
    ]
    lines += [
        "",
        "  Whatever dies is restarted here (after 1 s, doubling to 60 s), the rest keeps running;",
        "  the Spark job restarts from its checkpoint, and meanwhile the nodes expire brokers themselves.",
        "",
        "  Stop: Ctrl-C here, or `make stop` from another shell.",
        "",
    ]
    return "\n".join(lines)


#: the pidfile of a running ``up``, in the run dir: ``down`` stops the stack through it first
UP_PIDFILE = "stack.pid"
#: how long ``down`` waits for ``up`` to stop everything it runs (the job's graceful stop is the longest)
UP_STOP_TIMEOUT_S = 180.0


def running_up(run_dir: Path) -> int | None:
    """The PID of the ``up`` that owns ``run_dir``, if it still runs (a reused PID does not count)."""
    pid = _read_pidfile(run_dir / UP_PIDFILE)
    if pid is None or pid == os.getpid() or not pid_alive(pid):
        return None
    args = procfs.cmdline(pid)
    # an unreadable command line is trusted, as for the job; anything else must be `infra.stack up`
    return pid if args is None or ("infra.stack" in args and "up" in args) else None


@contextlib.contextmanager
def _owning(run_dir: Path) -> Iterator[threading.Event | None]:
    """The run dir held by this ``up`` for the block (its pidfile, for ``down``), and the event SIGINT or SIGTERM
    sets; None, said, when another ``up`` holds it."""
    if (other := running_up(run_dir)) is not None:
        print(f"the system is already up (pid {other}, run dir {run_dir}); stop it first: make stop", file=sys.stderr)
        yield None
        return
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_pidfile(run_dir / UP_PIDFILE, os.getpid())
    try:
        yield stop
    finally:
        (run_dir / UP_PIDFILE).unlink(missing_ok=True)


def _supervise(services: list[ProcessService], stop: threading.Event) -> int:
    """Restart whatever of ``services`` dies until ``stop`` is set."""
    supervisor = Supervisor(services)
    while not stop.wait(supervisor.next_check_s()):
        supervisor.check(stop.is_set)
    return 0


def up(args: argparse.Namespace) -> int:
    stack = build_stack(args)
    with _owning(stack[0].run_dir) as stop:
        if stop is None:
            return 1
        started: list[ProcessService] = []
        try:
            for service in stack:
                print(f"starting {service.name} ...", file=sys.stderr, flush=True)
                service.start()
                started.append(service)
                if stop.is_set():
                    return 130
            print(banner(stack, args.node_ports), flush=True)
            return _supervise(stack, stop)
        except ServiceError as e:
            print(f"could not start the system: {e}", file=sys.stderr)
            return 1
        finally:
            # every service, also one waiting for its restart (nothing to stop) or just restarted
            down_services(reversed(started or stack))


def up_ha(args: argparse.Namespace) -> int:
    """``up --topology ha``: the replicated topology of :mod:`infra.topology`, supervised in the foreground."""
    from infra.topology import Layout, Topology

    run_dir = load_config(args.services_conf).run_dir / "ha"
    with _owning(run_dir) as stop:
        if stop is None:
            return 1
        topology = Topology(
            Layout.local(run_dir),
            rocketmq=args.rocketmq,
            namesrv_conf=args.namesrv_conf,
            streaming_conf=args.streaming_conf,
        )
        try:
            topology.start(lambda line: print(line, file=sys.stderr, flush=True))
            print(ha_banner(topology), flush=True)
            return _supervise(topology.supervised(), stop)
        except ServiceError as e:
            print(f"could not start the system: {e}", file=sys.stderr)
            return 1
        finally:
            topology.stop()


def ha_banner(topology) -> str:  # noqa: ANN001 - infra.topology.Topology, imported lazily
    layout = topology.layout
    lines = [
        "",
        "The replicated topology is up (docs/deploy.md, 'The replicated topology'):",
        f"  Kafka:               three KRaft nodes, bootstrap {topology.kafka_bootstrap}",
        f"  Redis Cluster:       {topology.redis_url}",
        f"  Spark standalone:    {topology.spark.master_url if topology.spark else '-'} (a master, two workers); "
        f"the job's log {topology.streaming.log_file}",
        f"  Brokers and clients: namesrvAddr={layout.namesrv_addr}",
        f"  Admin:               .venv/bin/namesrv admin -n {layout.node_addrs[0]} clusterList",
        f"  Routes in Redis:     .venv/bin/namesrv-monitor routes --redis '{topology.redis_url}' get T0",
    ]
    if topology.groups:
        lines.append(
            "  RocketMQ:            " + ", ".join(f"{g.name} {[b.addr for b in g.brokers]}" for g in topology.groups)
        )
    lines += [
        "",
        "  The job's driver, the nodes and Kafka's nodes are restarted when they die.",
        "  Stop: Ctrl-C here, or `make stop` from another shell.",
        "",
    ]
    return "\n".join(lines)


def down(args: argparse.Namespace) -> int:
    """Stop the stack: through its ``up`` if one runs (else it would restart what we stop), then by pidfile."""
    stack = build_stack(args)
    run_dir = stack[0].run_dir
    # the replicated topology's `up` keeps its own run dir; its parts are its children, stopped through it
    for ups_dir in (run_dir / "ha", run_dir):
        if (pid := running_up(ups_dir)) is None:
            continue
        print(f"stopping the system's `up` (pid {pid}) ...", file=sys.stderr, flush=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + UP_STOP_TIMEOUT_S
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            print(
                f"`up` (pid {pid}) still runs {UP_STOP_TIMEOUT_S:.0f} s after SIGTERM; stopping its services "
                "by pidfile",
                file=sys.stderr,
            )
    # what a gone `up` left behind (or all of it, with no `up`): each pidfile names its PID
    down_services(reversed(stack))
    return 0


def _printable(text: str) -> str:
    """``text`` with control characters escaped, so a log quoted on the terminal cannot drive it."""
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in text)


def _tail(path: Path, lines: int = 10, indent: str = "  | ") -> str:
    tail = _log_tail(path).splitlines()[-lines:] or ["(no log)"]
    return "\n".join(indent + _printable(line) for line in tail)


def down_services(services) -> None:
    for service in services:
        try:
            if service.stop():
                print(f"stopped {service.name}", file=sys.stderr)
        except ServiceError as e:
            print(f"could not stop {service.name}: {e}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m infra.stack", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--services-conf", type=Path, default=REPO / "conf" / "services.properties")
    parser.add_argument("--namesrv-conf", type=Path, default=REPO / "conf" / "namesrv.properties")
    parser.add_argument("--streaming-conf", type=Path, default=REPO / "conf" / "streaming.properties")
    parser.add_argument(
        "--node-ports",
        type=lambda s: [int(p) for p in s.split(",")],
        default=[9876, 9877],
        help="comma-separated name-server ports (default 9876,9877)",
    )
    parser.add_argument(
        "--topology",
        choices=["local", "ha"],
        default="local",
        help="local: one of each (make run); ha: the replicated topology of docs/deploy.md (three Kafka nodes, "
        "Redis Cluster with replicas, a Spark cluster, three nodes)",
    )
    parser.add_argument(
        "--rocketmq", action="store_true", help="with --topology ha: Apache RocketMQ's controller-mode brokers too"
    )
    parser.add_argument("--bind", default=LOOPBACK, help="address the nodes listen on (default 127.0.0.1)")
    parser.add_argument("--no-streaming", action="store_true", help="start everything but the Spark job")
    parser.add_argument(
        "--console-port",
        type=int,
        default=18080,
        help="port of the live cluster-health console (namesrv-monitor console) on 127.0.0.1; 0 = no console",
    )
    parser.add_argument(
        "--metrics-base",
        type=int,
        default=9470,
        metavar="PORT",
        help="Prometheus endpoints: the job's on PORT, the nodes' on PORT+1, PORT+2, ... (default 9470; 0 = off)",
    )
    parser.add_argument(
        "--streaming-launcher",
        type=Launcher,
        choices=list(Launcher),
        default=os.environ.get(LAUNCHER_ENV, Launcher.PYTHON.value),
        help=f"how `up` starts the Spark job: python -m streaming or spark-submit "
        f"(default: ${LAUNCHER_ENV} or python; `down` stops either)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "up":
        return up_ha(args) if args.topology == "ha" else up(args)
    if args.command == "down":
        return down(args)
    stack = build_stack(args)
    if (pid := running_up(stack[0].run_dir)) is not None:
        print(f"up pid={pid} pidfile={stack[0].run_dir / UP_PIDFILE}")
    for service in stack:
        print(service.status().line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
