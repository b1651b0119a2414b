"""A scenario's tools together on a running :class:`~tests.support.system.System`, and the real C++ client."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.fleet import FleetRunner
from tests.support.liveness import known_in_redis
from tests.support.routes import RouteProbe, brokers_at
from tests.support.system import REPO, KafkaTap, System
from tests.support.wait import wait_until


@dataclass
class CppRun:
    label: str
    namesrv: str
    result: dict[str, Any]
    seconds: float
    #: the SEND_MESSAGE the fake broker received for this run, if any
    delivered: bool = False


def run_cpp_producer(namesrv: str, topic: str, log_home: Path, timeout: float = 60.0) -> tuple[dict[str, Any], float]:
    """Run ``tests/peers/cpp_producer.py`` (C++ client 1.0.1) once; its JSON result and how long it took."""
    log_home.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(REPO / "tests" / "peers" / "cpp_producer.py"), "--namesrv", namesrv, "--topic", topic,
         "--log-home", str(log_home), "--hard-exit", "--send-timeout-ms", "3000"],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = (
        json.loads(lines[-1])
        if lines
        else {"ok": False, "error": f"no result (exit {done.returncode})", "stderr": done.stderr[-1500:]}
    )
    return result, time.monotonic() - t0


@dataclass
class Record:
    """What a scenario measured, printed at the end of the run."""

    durations: dict[str, float] = field(default_factory=dict)
    cpp: list[CppRun] = field(default_factory=list)
    #: (node, start, end): windows in which a node was allowed not to know a topic
    allowed_gaps: list[tuple[str, float, float]] = field(default_factory=list)
    #: (node, start, end): windows in which a node was stopped on purpose
    down: list[tuple[str, float, float]] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"  {k:<48} {v:6.1f} s" for k, v in self.durations.items()]
        out += [
            f"  C++ client [{r.label}] via {r.namesrv}: ok={r.result.get('ok')} delivered={r.delivered} "
            f"{r.seconds:.1f} s"
            for r in self.cpp
        ]
        return out


# --------------------------------------------------------------------------- a scenario's tools together


class Scenario:
    """A running :class:`System` with a fake broker, simulated brokers, a Kafka tap and Redis lookups.

    The fleet named ``live`` (add it first) gets the fake broker's address, so a real client that
    reads its topics' routes sends there.
    """

    def __init__(self, system: System, tmp: Path) -> None:
        from streaming.routes import RouteLookup
        from tests.peers.fake_broker import FakeBroker

        self.system = system
        self.tmp = tmp
        self.fake = FakeBroker().start()
        self.fleets = FleetRunner()
        self.lookup = RouteLookup(system.redis_url)
        self.record = Record()
        self.probe: RouteProbe | None = None

    @property
    def tap(self) -> KafkaTap:
        return self.system.tap

    def add_fleet(self, name: str, addr_base: str | None = None, **config: Any) -> tuple[str, str]:
        """Start broker ``<name>-0`` (topics ``T<NAME>0``…) at both nodes; returns (brokerName, brokerAddr)."""
        if addr_base is None:
            addr_base = self.fake.address if name == "live" else f"127.0.0.1:{41000 + 10 * len(self.fleets.fleets)}"
        self.fleets.add(name, self.system.node_addrs, self.system.timing, addr_base=addr_base, **config)
        return self.fleets.broker(name)

    # -- where a broker is known

    def at_nodes(self, broker_name: str) -> list[bool]:
        out = []
        for addr in self.system.node_addrs:
            try:
                out.append(broker_name in brokers_at(addr))
            except OSError:
                out.append(False)
        return out

    def in_redis(self, broker_name: str) -> bool:
        return broker_name in known_in_redis(self.lookup)

    def everywhere(self, broker_name: str) -> bool:
        return all(self.at_nodes(broker_name)) and self.in_redis(broker_name)

    def nowhere(self, broker_name: str) -> bool:
        return not any(self.at_nodes(broker_name)) and not self.in_redis(broker_name)

    def batch_id(self) -> int:
        return int(self.lookup.status().get("batchId", -1))

    def let_the_job_run(self, batches: int = 3, timeout: float = 30.0) -> None:
        """Wait for ``batches`` more micro-batches written to Redis (for checks that something did not happen)."""
        start = self.batch_id()
        wait_until(lambda: self.batch_id() >= start + batches, timeout, f"{batches} more micro-batches", 0.2)

    def cpp(self, label: str, namesrv: str, topic: str = "TLIVE0") -> CppRun:
        """The C++ client sends one message to ``topic`` using the route it reads from ``namesrv``."""
        from tests.peers.fake_broker import SEND_CODES

        since = time.monotonic()
        result, seconds = run_cpp_producer(namesrv, topic, self.tmp / f"cpp-{len(self.record.cpp) + 1}")
        run = CppRun(label, namesrv, result, seconds)
        try:
            self.fake.wait_for(lambda f: f.code in SEND_CODES and f.topic == topic and f.received_at >= since, 5.0)
            run.delivered = True
        except TimeoutError:
            pass
        self.record.cpp.append(run)
        return run

    def close(self) -> None:
        if self.probe is not None:
            self.probe.stop()
        self.fleets.stop()
        self.fake.stop()
        self.lookup.close()
