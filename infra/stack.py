"""The whole system on one machine: ``make run`` and ``make stop``, ``python -m infra.stack up|down|status``.

``up`` starts, in order, the local Apache Kafka and Redis (:mod:`infra.kafka`, :mod:`infra.redis`), the
Spark streaming job in local mode (its slow start overlaps the rest), the name-server nodes and the
cluster-health console (:mod:`infra.apps`), prints where everything is, and stays in the foreground
restarting whatever dies (:mod:`infra.supervisor`); Ctrl-C or SIGTERM stops everything it started, by PID.
``up --topology ha`` does the same for the replicated topology (:mod:`infra.topology`).  ``down`` (``make
stop``) stops a running ``up`` first, so that nothing it stops is restarted behind its back, then
whatever the pidfiles still name.  ``status`` prints one line per service.  ``docs/internals/local-stack.md``
says what happens meanwhile, per service.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from common import kafka_clients, procfs
from infra.apps import LAUNCHER_ENV, REPO, ConsoleService, Launcher, NodeService, StreamingJob, node_properties
from infra.config import load_config
from infra.kafka import KafkaService
from infra.processes import LOOPBACK, ProcessService, ServiceError, pid_alive, read_pidfile, write_pidfile
from infra.redis import RedisService
from infra.supervisor import Supervisor

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
                properties=node_properties(
                    port=port,
                    name=f"node-{port}",
                    kafka_bootstrap=services.kafka_bootstrap,
                    redis_url=services.redis_url,
                    data_dir=run_dir / f"namesrv-{port}",
                    bind=args.bind,
                    metrics_port=metrics_port,
                ),
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
    pid = read_pidfile(run_dir / UP_PIDFILE)
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
    write_pidfile(run_dir / UP_PIDFILE, os.getpid())
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
    kafka_clients.demote_slow_step_warnings()  # a false alarm of kafka-python, off the console (common.kafka_clients)
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
