"""The whole system on one machine: ``make run`` and ``make stop``.

``up`` starts, in order, the local Kafka-protocol broker and Redis (:mod:`infra.services`), the
name-server nodes (publishing events to Kafka and applying the monitor's actions) and the Spark
streaming job in local mode, prints where everything is, and stays in the foreground: Ctrl-C or
SIGTERM stops everything it started, by PID.  ``down`` does the same from the pidfiles, for a stack
whose ``up`` is gone.  If any process dies, ``up`` says which, shows the end of its log, and stops
the rest.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from infra.services import (
    LOOPBACK,
    KafkaService,
    ProcessService,
    RedisService,
    ServiceError,
    load_config,
)

log = logging.getLogger("infra.stack")
REPO = Path(__file__).resolve().parents[1]


class NamesrvNode(ProcessService):
    """One name-server node, ``namesrv start`` with the repository's configuration."""

    port_key = "listenPort"
    backend_key = "namesrv"

    def __init__(self, *, port: int, run_dir: Path, conf: Path, properties: dict[str, str]) -> None:
        super().__init__(port=port, run_dir=run_dir, start_timeout=30.0)
        self.name = f"namesrv-{port}"
        self.conf = conf
        self.properties = properties

    @property
    def backend(self) -> str:
        return "namesrv"

    def _binary(self) -> Path:
        return Path(sys.executable)

    def _known_binaries(self) -> list[Path]:
        return [Path(sys.executable)]

    def _command(self, binary: Path) -> list[str]:
        sets = [arg for key, value in self.properties.items() for arg in ("--set", f"{key}={value}")]
        return [str(binary), "-m", "namesrv", "start", "-c", str(self.conf), *sets]

    def _probe(self, timeout: float) -> bool:
        from namesrv.client import NameServerClient

        try:
            with NameServerClient(self.address, timeout=timeout) as client:
                client.cluster_info()
            return True
        except OSError:
            return False


class StreamingJob(ProcessService):
    """The Spark liveness monitor in local mode, ``python -m streaming``."""

    name = "streaming"
    port_key = "(none)"
    backend_key = "spark.master"

    def __init__(self, *, run_dir: Path, conf: Path, overrides: dict[str, str]) -> None:
        # it listens on no port of its own; 0 keeps ProcessService's port checks out of the way
        super().__init__(port=0, run_dir=run_dir, start_timeout=10.0)
        self.conf = conf
        self.overrides = overrides

    @property
    def backend(self) -> str:
        return "local"

    def _binary(self) -> Path:
        return Path(sys.executable)

    def _known_binaries(self) -> list[Path]:
        return [Path(sys.executable)]

    def _command(self, binary: Path) -> list[str]:
        sets = [arg for key, value in self.overrides.items() for arg in ("-D", f"{key}={value}")]
        return [str(binary), "-m", "streaming", "-c", str(self.conf), *sets]

    def _probe(self, timeout: float) -> bool:
        # Spark takes ~20 s to start and then publishes MONITOR_HEARTBEAT; until then the nodes
        # keep expiring brokers themselves, so a live process is all `up` needs to wait for
        return True


def build_stack(args: argparse.Namespace) -> list[ProcessService]:
    services = load_config(args.services_conf)
    run_dir = services.run_dir
    stack: list[ProcessService] = [KafkaService.from_config(services), RedisService.from_config(services)]
    for port in args.node_ports:
        stack.append(NamesrvNode(port=port, run_dir=run_dir, conf=args.namesrv_conf, properties={
            "bindAddress": args.bind,
            "listenPort": str(port),
            "nodeName": f"node-{port}",
            "kafkaBootstrapServers": services.kafka_bootstrap,
            "redisUrl": services.redis_url,
            "kvConfigPath": str(run_dir / f"namesrv-{port}" / "kvConfig.json"),
            "configStorePath": str(run_dir / f"namesrv-{port}" / "namesrv.properties"),
        }))
    if not args.no_streaming:
        stack.append(StreamingJob(run_dir=run_dir, conf=args.streaming_conf, overrides={
            "kafka.bootstrap": services.kafka_bootstrap,
            "redis.url": services.redis_url,
            "monitor.checkpointDir": str(run_dir / "streaming" / "checkpoint"),
        }))
    return stack


def banner(stack: list[ProcessService], node_ports: list[int]) -> str:
    namesrv_addr = ";".join(f"127.0.0.1:{p}" for p in node_ports)
    lines = ["", "The name-server system is up:"]
    for service in stack:
        status = service.status()
        lines.append(f"  {status.name:<16} {status.address:<22} pid {status.pid or '-':<8} log {status.log_file}")
    redis = next(s for s in stack if isinstance(s, RedisService))
    lines += [
        "",
        f"  Brokers and clients: namesrvAddr={namesrv_addr}   (or NAMESRV_ADDR='{namesrv_addr}')",
        f"  Admin:               .venv/bin/namesrv admin -n 127.0.0.1:{node_ports[0]} clusterList",
        f"  A simulated fleet:   .venv/bin/namesrv simulate -n '{namesrv_addr}' --brokers 3 --topics 10 "
        "--silent 1 --silent-after 30",
        f"  Routes in Redis:     .venv/bin/namesrv routes --redis {redis.url} get T0   (or: routes watch)",
        "  Alerts:              in the streaming log, and on the Kafka topic namesrv-alerts",
        "",
        "  Stop: Ctrl-C here, or `make stop` from another shell.",
        "",
    ]
    return "\n".join(lines)


def up(args: argparse.Namespace) -> int:
    stack = build_stack(args)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    started: list[ProcessService] = []
    try:
        for service in stack:
            print(f"starting {service.name} ...", file=sys.stderr, flush=True)
            service.start()
            started.append(service)
            if stop.is_set():
                return 130
        print(banner(stack, args.node_ports), flush=True)
        while not stop.wait(1.0):
            for service in started:
                if service.status().pid is None:
                    print(f"{service.name} stopped unexpectedly; its log ({service.log_file}) ends with:\n"
                          f"{_tail(service.log_file)}", file=sys.stderr)
                    return 1
        return 0
    except ServiceError as e:
        print(f"could not start the system: {e}", file=sys.stderr)
        return 1
    finally:
        down_services(reversed(started or stack))


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def down_services(services) -> None:
    for service in services:
        try:
            if service.stop():
                print(f"stopped {service.name}", file=sys.stderr)
        except ServiceError as e:
            print(f"could not stop {service.name}: {e}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.stack", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--services-conf", type=Path, default=REPO / "conf" / "services.properties")
    parser.add_argument("--namesrv-conf", type=Path, default=REPO / "conf" / "namesrv.properties")
    parser.add_argument("--streaming-conf", type=Path, default=REPO / "conf" / "streaming.properties")
    parser.add_argument("--node-ports", type=lambda s: [int(p) for p in s.split(",")], default=[9876, 9877],
                        help="comma-separated name-server ports (default 9876,9877)")
    parser.add_argument("--bind", default=LOOPBACK, help="address the nodes listen on (default 127.0.0.1)")
    parser.add_argument("--no-streaming", action="store_true", help="start everything but the Spark job")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "up":
        return up(args)
    stack = build_stack(args)
    if args.command == "down":
        down_services(reversed(stack))
        return 0
    for service in stack:
        print(service.status().line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
