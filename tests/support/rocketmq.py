"""Apache RocketMQ's own NameServer, broker, mqadmin and Java client, as real peers of the tests.

The JVMs as child processes (:class:`Release`, :class:`JavaProcess`, the broker, mqadmin) are
:mod:`infra.rocketmq`'s, for programs that are not tests too, and re-exported here; this module adds
Apache's NameServer, the ClientProbe client and raw answers.  Every JVM is a child process started and
stopped by its PID on free loopback ports, with a home directory of its own under the test's temporary
directory, so everything RocketMQ writes stays there.  Readiness is a real round trip, never a sleep, a
process that exits while awaited fails the wait at once, and one that lost its port to another process
is restarted on new ports.  The JVMs run small: the tests need them to answer, not to be fast.  TLS goes
to the JVMs as ``system_props``, as RocketMQ reads it.  ``docs/internals/testing.md`` has the details.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from common.protocol import fastjson
from common.protocol.bodies import decode_data_version, decode_kv_table, encode_data_version
from common.protocol.codec import encode
from common.protocol.codes import RequestCode
from common.protocol.command import request
from common.protocol.types import DataVersion
from infra.processes import java_binary

# the process parts live in infra.rocketmq, for programs that are not tests; re-exported for the tests
from infra.rocketmq import (
    _OUTPUT_TAIL,
    JVM_OPTIONS,
    LOOPBACK,
    ROCKETMQ_4,
    ROCKETMQ_5,
    Controller,
    JavaBroker,
    JavaProcess,
    PortTakenError,
    Release,
    _env,
    _home,
    _java,
    _on_free_ports,
    _properties,
    broker_port,
    compile_java,
    mqadmin,
    registered,
    replica_info,
    restart_broker,
    start_broker,
)
from namesrv.client import NameServerClient
from tests.support.node import REPO, free_port
from tests.support.wait import wait_until

__all__ = [
    "JVM_OPTIONS",
    "ROCKETMQ_4",
    "ROCKETMQ_5",
    "JavaBroker",
    "JavaNamesrv",
    "JavaProcess",
    "PortTakenError",
    "Release",
    "broker_port",
    "broker_runtime_info",
    "broker_topics",
    "client_probe",
    "compile_client_probe",
    "exchange_frame",
    "java_broker",
    "java_namesrv",
    "mqadmin",
    "registered",
    "restart_broker",
    "split_frame",
    "start_broker",
    "start_java_namesrv",
    "stored_data_version",
]

CLIENT_PROBE = REPO / "tests" / "peers" / "java" / "ClientProbe.java"
NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"


# --------------------------------------------------------------------------- NameServer


@dataclass
class JavaNamesrv:
    release: Release
    process: JavaProcess
    addr: str

    def stop(self) -> None:
        self.process.stop()


def _answers(addr: str, process: JavaProcess) -> bool:
    process.check_alive()
    try:
        with NameServerClient(addr, timeout=1.0) as c:
            c.cluster_info()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def java_namesrv(release: Release, base: Path, name: str = "namesrv", timeout: float = 90.0) -> Iterator[JavaNamesrv]:
    """Apache RocketMQ's NameServer of ``release`` on a free loopback port; killed afterwards."""
    started = start_java_namesrv(release, base, name, timeout)
    try:
        yield started
    finally:
        started.stop()


def start_java_namesrv(
    release: Release,
    base: Path,
    name: str = "namesrv",
    timeout: float = 90.0,
    *,
    jvm_options: Sequence[str] = JVM_OPTIONS,
) -> JavaNamesrv:
    """Apache RocketMQ's NameServer of ``release`` on a free loopback port, answering; see :func:`java_namesrv`.

    ``jvm_options`` replace the tests' small and quiet :data:`JVM_OPTIONS` (``bench/namesrv_bench.py``
    gives it a full JIT).
    """
    return _on_free_ports(lambda: _start_java_namesrv(release, base, name, timeout, jvm_options), lambda: base / name)


def _start_java_namesrv(
    release: Release, base: Path, name: str, timeout: float, jvm_options: Sequence[str]
) -> JavaNamesrv:
    home, props = _home(base, name, release, "namesrv")
    port = free_port()
    conf = _properties(
        home / "namesrv.properties",
        {
            "listenPort": str(port),
            "bindAddress": LOOPBACK,  # 5.x; 4.x binds every address (it has no such key)
            "kvConfigPath": str(home / "kvConfig.json"),
        },
    )
    argv = _java(release.server_jars(), props, NAMESRV_MAIN, "-c", str(conf), jvm_options=jvm_options)
    process = JavaProcess(name, argv, home, _env(home))
    addr = f"{LOOPBACK}:{port}"
    try:
        wait_until(lambda: _answers(addr, process), timeout, f"Java NameServer {release.server_version} on {addr}")
    except BaseException:
        process.stop()
        raise
    return JavaNamesrv(release, process, addr)


# --------------------------------------------------------------------------- broker


@contextlib.contextmanager
def java_broker(release: Release, base: Path, namesrv_addrs: Sequence[str], **kwargs) -> Iterator[JavaBroker]:
    """:func:`start_broker`, killed afterwards."""
    started = start_broker(release, base, namesrv_addrs, **kwargs)
    try:
        yield started
    finally:
        started.stop()


# --------------------------------------------------------------------------- the Java client


def compile_client_probe(release: Release, out: Path) -> Path:
    """``tests/peers/java/ClientProbe.java`` compiled against ``release``'s client jars into ``out``."""
    return compile_java(release, CLIENT_PROBE, out)


def client_probe(
    release: Release,
    classes: Path,
    base: Path,
    command: str,
    *args: str,
    system_props: Sequence[str] = (),
    timeout: float = 120.0,
) -> tuple[int, dict]:
    """Run the compiled ClientProbe (``produce`` or ``consume``); its exit code and its one JSON line.

    ``system_props``: more ``-D`` options (TLS).
    """
    n = sum(1 for _ in base.glob(f"{command}-*"))
    home, props = _home(base, f"{command}-{n}", release, "client")
    argv = [str(java_binary()), *JVM_OPTIONS, *props, *system_props, "-cp", f"{release.client_jars()}/*:{classes}"]
    done = subprocess.run(
        [*argv, "ClientProbe", command, *args],
        cwd=home,
        env=_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"ClientProbe {command} printed no result (exit {done.returncode}):\n{done.stdout[-_OUTPUT_TAIL:]}"
    return done.returncode, json.loads(lines[-1])


# --------------------------------------------------------------------------- raw answers


def exchange_frame(addr: str, code: int, ext_fields: dict[str, str] | None = None, *, version: int) -> bytes:
    """One request (opaque 1, JSON header, as a Java client of ``version`` sends it) on a fresh
    connection; the whole response frame, length word included, exactly as the server wrote it."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5.0) as s:
        s.sendall(encode(request(code, ext_fields, opaque=1, version=version)))
        frame = b""
        while len(frame) < 4 or len(frame) < 4 + int.from_bytes(frame[:4], "big"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError(f"{addr} closed the connection after {len(frame)} bytes")
            frame += chunk
    return frame


def split_frame(frame: bytes) -> tuple[dict, bytes]:
    """A JSON-header frame's header (parsed) and its body bytes."""
    header_len = int.from_bytes(frame[4:8], "big") & 0xFFFFFF
    assert frame[4] == 0, f"not a JSON header (serialize type {frame[4]})"
    return json.loads(frame[8 : 8 + header_len]), frame[8 + header_len :]


def stored_data_version(addr: str, broker: JavaBroker) -> DataVersion | None:
    """The DataVersion the name server at ``addr`` holds for ``broker`` (QUERY_DATA_VERSION), None if it has none."""
    header = {
        "brokerName": broker.name,
        "brokerAddr": broker.addr,
        "clusterName": broker.cluster,
        "brokerId": str(broker.broker_id),
    }
    with NameServerClient(addr, timeout=5.0) as c:
        answer = c.ok(RequestCode.QUERY_DATA_VERSION, header, encode_data_version(DataVersion()))
    return decode_data_version(answer.body)


#: RequestCode.GET_BROKER_RUNTIME_INFO and GET_ALL_TOPIC_CONFIG, a broker's (not a name server's) request codes
GET_BROKER_RUNTIME_INFO = 28
GET_ALL_TOPIC_CONFIG = 21


def broker_runtime_info(broker: JavaBroker) -> dict[str, str] | None:
    """The broker's own runtime table (what mqadmin clusterList shows), None while it cannot answer yet.

    A 4.9.7 broker fails this request (NoSuchElementException in StoreStatsService) until its store
    statistics took their first samples, a second or so after start-up.
    """
    with NameServerClient(broker.addr, timeout=5.0) as c:
        answer = c.call(GET_BROKER_RUNTIME_INFO)
    assert answer is not None
    return decode_kv_table(answer.body) if answer.code == 0 else None


def broker_topics(broker: JavaBroker) -> set[str]:
    """The topics the broker itself holds a configuration for (a slave: what it copied from its master)."""
    with NameServerClient(broker.addr, timeout=5.0) as c:
        answer = c.call(GET_ALL_TOPIC_CONFIG)
    assert answer is not None and answer.code == 0, answer
    return set(fastjson.loads(answer.body)["topicConfigTable"])


def controller_master(controller: Controller, group: str) -> str | None:
    """The address the controller names ``group``'s master at, None while it names none or does not lead."""
    info = replica_info(controller, group)
    return None if info is None else info.master_addr


def elected(controller: Controller, group: str, not_addr: str, timeout: float) -> str:
    """The address of the master the controller elects for ``group`` in place of ``not_addr``, once it has."""
    return wait_until(
        lambda: (addr := controller_master(controller, group)) not in (None, not_addr) and addr,
        timeout,
        f"the controller to elect a master of {group} other than {not_addr}",
        state=lambda: replica_info(controller, group),
    )
