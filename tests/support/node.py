"""Run a real name-server node in-process, on a free loopback port, for wire-level tests."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvloop

from namesrv.app import Node, start_node
from namesrv.config import load_config

REPO = Path(__file__).resolve().parents[2]
#: golden frames and bodies captured from Apache RocketMQ's own classes (tests/vectors/README.md)
VECTORS = REPO / "tests" / "vectors"


class NodeThread:
    """A node on its own event loop in a daemon thread; ``call`` runs a function on that loop."""

    def __init__(self, running: Node, loop: asyncio.AbstractEventLoop) -> None:
        self.running = running
        self.loop = loop

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the node's loop and return its result (state is only touched there)."""

        async def wrapper():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(10)


@contextmanager
def running_node(tmp_path: Path, **overrides: str) -> Iterator[NodeThread]:
    props = {
        "listenPort": "0",
        "bindAddress": "127.0.0.1",
        "kvConfigPath": str(tmp_path / "kvConfig.json"),
        "configStorePath": str(tmp_path / "namesrv.properties"),
        **overrides,
    }
    config = load_config(None, props)
    loop = uvloop.new_event_loop()  # the loop `namesrv start` runs on
    started: dict = {}
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            started["node"] = loop.run_until_complete(start_node(config))
        except BaseException as e:  # surfaced to the test below
            started["error"] = e
        ready.set()
        if "node" in started:
            loop.run_forever()

    thread = threading.Thread(target=run, name="namesrv-test-node", daemon=True)
    thread.start()
    ready.wait(10)
    if "error" in started:
        raise started["error"]
    node = NodeThread(started["node"], loop)
    try:
        yield node
    finally:
        asyncio.run_coroutine_threadsafe(node.running.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_exchange(
    addr: str,
    data: bytes,
    *,
    expect_close: bool = False,
    timeout: float = 3.0,
    tls: ssl.SSLContext | None = None,
    preamble: bytes = b"",
) -> bytes:
    """Send bytes on a fresh connection and read until the peer closes or goes quiet; with ``tls`` over
    TLS, after ``preamble`` (a PROXY protocol header) when given."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as raw:
        raw.sendall(preamble)
        s = raw if tls is None else tls.wrap_socket(raw, server_hostname=host)
        s.sendall(data)
        chunks = []
        s.settimeout(timeout if expect_close else 0.5)
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            if expect_close:
                raise AssertionError("the server did not close the connection") from None
        return b"".join(chunks)
