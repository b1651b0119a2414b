"""The project's load generator, ``tools/rmq-loadgen``, as the tests and ``bench/namesrv_bench.py`` run it.

Theory of operation: ``make setup`` (``tests/peers/install.sh``) builds the crate offline into
``build/rmq-loadgen/release/``; this module is the one place that knows where the source and the two
binaries are, and how a run is read: every workload prints one JSON line on stdout at its end, and
``setup`` prints its summary line at once, then holds its brokers registered until it is killed.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tools" / "rmq-loadgen"
TARGET = REPO / "build" / "rmq-loadgen"  # cargo's --target-dir, as install.sh builds it (gitignored)
LOADGEN, ECHO = TARGET / "release" / "rmq-loadgen", TARGET / "release" / "rmq-echo"


class LoadgenError(RuntimeError):
    """rmq-loadgen exited with an error, or its setup did not register what it was asked to."""


def run(args: list[str], timeout: float) -> dict:
    """Run ``rmq-loadgen ARGS`` to its end and return its JSON result line."""
    done = subprocess.run([str(LOADGEN), *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise LoadgenError(f"rmq-loadgen {shlex.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class FleetNames:
    """What one ``setup`` calls its brokers and topics (``<broker_prefix><b>``, ``<topic_prefix><i>``)."""

    broker_prefix: str = "broker-"
    topic_prefix: str = "T"
    #: broker b listens on port_base + 2b (its HA port is the next one)
    port_base: int = 30000

    def args(self) -> list[str]:
        return ["--broker-prefix", self.broker_prefix, "--topic-prefix", self.topic_prefix,
                "--port-base", str(self.port_base)]  # fmt: skip


def hold_brokers(
    addr: str, brokers: int, topics_per_broker: int, hold_s: int = 3600, *, names: FleetNames | None = None
) -> tuple[subprocess.Popen, dict]:
    """``rmq-loadgen setup``: register the brokers and keep them heartbeating until the process is killed.

    Returns the running process (the caller kills it: closing its connection unregisters the brokers)
    and its summary line, once the route checks of its first and last topic succeeded.  ``names`` lets
    several setups at one node hold distinct brokers and topics.
    """
    setup = subprocess.Popen(
        [
            str(LOADGEN),
            "setup",
            "--addr",
            addr,
            "--brokers",
            str(brokers),
            "--topics-per-broker",
            str(topics_per_broker),
            "--hold",
            str(hold_s),
            *(names.args() if names else ()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = setup.stdout.readline()  # printed right after registering; EOF if setup died first
    try:
        summary = json.loads(line)
        codes = summary["route_check_codes"]
    except (ValueError, KeyError, TypeError):
        summary, codes = line, None
    if not codes or any(code != 0 for code in codes.values()):
        setup.kill()
        raise LoadgenError(f"setup did not register its brokers (exit code {setup.wait()}): {summary!r}")
    return setup, summary
