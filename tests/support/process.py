"""A name-server node in its own process (``namesrv start``), for tests and soaks that measure its memory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common import procfs
from namesrv.client import NameServerClient
from tests.support.node import REPO, free_port
from tests.support.wait import wait_until


@dataclass
class NodeProcess:
    proc: subprocess.Popen
    addr: str
    log: Path

    def rss(self) -> int:
        """Resident memory of the node process, in bytes."""
        rss = procfs.rss_bytes(self.proc.pid)
        assert rss is not None, f"no resident memory for pid {self.proc.pid}: has the node exited?"
        return rss

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def node_answers(addr: str, proc: subprocess.Popen) -> bool:
    """True once the node ``proc`` answers at ``addr``; fails at once if it has exited (with its stderr if piped)."""
    if proc.poll() is not None:
        said = proc.stderr.read() if proc.stderr is not None else "(stderr not captured)"
        raise AssertionError(f"the node exited at start-up with code {proc.returncode}: {said}")
    try:
        with NameServerClient(addr, timeout=0.5) as c:
            c.cluster_info()
            return True
    except OSError:
        return False


@contextmanager
def node_process(tmp_path: Path, *, log_level: str = "WARNING", **overrides: str) -> Iterator[NodeProcess]:
    """``namesrv start`` on a free loopback port with its files in ``tmp_path``; killed afterwards."""
    port = free_port()
    props = {
        "listenPort": str(port),
        "bindAddress": "127.0.0.1",
        "kvConfigPath": str(tmp_path / "kvConfig.json"),
        "configStorePath": str(tmp_path / "namesrv.properties"),
        "logLevel": log_level,
        **overrides,
    }
    conf = tmp_path / "node.properties"
    conf.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    log = tmp_path / "node.log"
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "namesrv", "start", "-c", str(conf)],
            cwd=REPO,
            stderr=err,
            stdout=subprocess.DEVNULL,
            env=env,
        )
    addr = f"127.0.0.1:{port}"
    try:
        wait_until(lambda: node_answers(addr, proc), 20, f"the node to listen on {addr} (log: {log})")
        yield NodeProcess(proc, addr, log)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
