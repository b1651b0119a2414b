"""Apache RocketMQ's own NameServer, broker, mqadmin and Java client, as real peers of the tests.

The jars come from the pinned JVM manifest (``infra/jvm/pom.xml``), resolved by ``make setup`` into
``build/jvm/<module>/``; a :class:`Release` names the two class paths (5.5.0, or 4.9.7's servers with
4.9.8's clients) one test world uses.  Every JVM is a child process started and stopped by its PID
(:class:`JavaProcess`) on free loopback ports, with a home directory of its own under the test's
temporary directory, so everything RocketMQ writes stays there; its logging is configured here.
Readiness is a real round trip, never a sleep, a process that exits while awaited fails the wait at
once, and one that lost its port to another process is restarted on new ports.  The JVMs run small:
the tests need them to answer, not to be fast.  TLS goes to the JVMs as ``system_props``, as
RocketMQ reads it.  ``docs/internals/testing.md`` has the details.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from infra.services import java_binary, jvm_jars
from namesrv.client import NameServerClient
from namesrv.protocol import fastjson
from namesrv.protocol.bodies import decode_data_version, decode_kv_table, encode_data_version
from namesrv.protocol.codec import encode
from namesrv.protocol.codes import RequestCode
from namesrv.protocol.command import request
from namesrv.protocol.types import DataVersion
from tests.support.node import REPO, free_port
from tests.support.wait import wait_until

T = TypeVar("T")
LOOPBACK = "127.0.0.1"
CLIENT_PROBE = REPO / "tests" / "peers" / "java" / "ClientProbe.java"
NAMESRV_MAIN = "org.apache.rocketmq.namesrv.NamesrvStartup"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
MQADMIN_MAIN = "org.apache.rocketmq.tools.command.MQAdminStartup"

#: small and quiet: the tests need answers, not throughput
JVM_OPTIONS = (
    "-Xms128m",
    "-Xmx256m",
    "-XX:-UseLargePages",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.net.preferIPv4Stack=true",
    # the stores reach into the JDK's direct buffers, closed by default on JDK 17: 4.x unmaps its files
    # by reflection on java.nio's (MappedFile.clean), 5.x casts to sun.nio.ch.DirectBuffer (CommitLog)
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-exports=java.base/sun.nio.ch=ALL-UNNAMED",
)
_OUTPUT_TAIL = 3000


@dataclass(frozen=True)
class Release:
    """One world's RocketMQ: the module with its NameServer and broker, and the one with its clients."""

    server_module: str
    clients_module: str
    #: 5.x shades logback into org.apache.rocketmq.logging; 4.x uses logback as it is
    shaded_logging: bool

    def server_jars(self) -> Path:
        return jvm_jars(self.server_module)

    def client_jars(self) -> Path:
        return jvm_jars(self.clients_module)

    @property
    def server_version(self) -> str:
        return _jar_version(self.server_jars(), "rocketmq-broker")

    @property
    def client_version(self) -> str:
        return _jar_version(self.client_jars(), "rocketmq-client")

    @property
    def label(self) -> str:
        server, client = self.server_version, self.client_version
        return server if server == client else f"{server}+{client}"


ROCKETMQ_5 = Release("rocketmq-5", "rocketmq-5", shaded_logging=True)
#: 4.9.8 has no NameServer or broker on Maven Central: its server is 4.9.7, its clients 4.9.8
ROCKETMQ_4 = Release("rocketmq-4-server", "rocketmq-4-clients", shaded_logging=False)


def _jar_version(folder: Path, artifact: str) -> str:
    (jar,) = folder.glob(f"{artifact}-[0-9]*.jar")
    return jar.stem.removeprefix(f"{artifact}-")


# --------------------------------------------------------------------------- processes


class PortTakenError(AssertionError):
    """A JVM exited because a port picked for it was taken before it could bind it."""


def _on_free_ports(start: Callable[[], T], home: Callable[[], Path], attempts: int = 3) -> T:
    """``start()`` again with new ports (and a new home) while a JVM loses its ports to another process."""
    for attempt in range(attempts):
        try:
            return start()
        except PortTakenError:
            if attempt == attempts - 1:
                raise
            shutil.rmtree(home())
    raise AssertionError("unreachable")


class JavaProcess:
    """One JVM we started: stopped by its PID, its output and log in its home directory."""

    def __init__(self, name: str, argv: Sequence[str], home: Path, env: dict[str, str], *, again: bool = False) -> None:
        self.name = name
        self.home = home
        self.out = home / f"{name}.out"
        self.log = home / f"{name}.log"
        self.argv, self.env = list(argv), env
        with self.out.open("ab" if again else "wb") as out:
            self.proc = subprocess.Popen(
                list(argv),
                cwd=home,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self) -> str:
        parts = []
        for path in (self.out, self.log):
            with contextlib.suppress(OSError):
                parts.append(f"--- {path}:\n{path.read_text(errors='replace')[-_OUTPUT_TAIL:]}")
        return "\n".join(parts)

    def check_alive(self) -> None:
        if not self.alive():
            tail = self.tail()
            error = PortTakenError if "Address already in use" in tail else AssertionError
            raise error(f"{self.name} (pid {self.pid}) exited with code {self.proc.returncode}\n{tail}")

    def again(self) -> JavaProcess:
        """The same command started anew in the same home (after :meth:`stop`), its output appended."""
        assert not self.alive(), f"{self.name} (pid {self.pid}) is still running"
        return JavaProcess(self.name, self.argv, self.home, self.env, again=True)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGKILL to our PID (its files are all temporary) and reap it."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout)


def _home(base: Path, name: str, release: Release, logger: str) -> tuple[Path, list[str]]:
    """A fresh ROCKETMQ_HOME for one JVM, with its logback configuration; the system properties to pass."""
    home = base / name
    home.mkdir(parents=True)
    log_file = home / f"{name}.log"
    if release.shaded_logging:
        config = home / "logback.xml"
        config.write_text(_logback_xml(log_file, "org.apache.rocketmq.logging.ch.qos.logback"))
        props = [f"-Drmq.logback.configurationFile={config}"]
    else:
        (home / "conf").mkdir()
        (home / "conf" / f"logback_{logger}.xml").write_text(_logback_xml(log_file, "ch.qos.logback"))
        props = []
    props += [f"-Drocketmq.home.dir={home}", f"-Duser.home={home}"]
    return home, props


def _logback_xml(log_file: Path, package: str) -> str:
    # one plain file: RocketMQ's own configurations roll a dozen files under ~/logs
    return (
        "<configuration>\n"
        f'  <appender name="FILE" class="{package}.core.FileAppender">\n'
        f"    <file>{log_file}</file>\n"
        f'    <encoder class="{package}.classic.encoder.PatternLayoutEncoder">\n'
        "      <pattern>%d{HH:mm:ss.SSS} %-5level [%thread] %logger{0} - %msg%n</pattern>\n"
        "    </encoder>\n"
        "  </appender>\n"
        '  <root level="INFO"><appender-ref ref="FILE"/></root>\n'
        "</configuration>\n"
    )


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NAMESRV_ADDR", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS")}
    env["ROCKETMQ_HOME"] = str(home)
    return env


def _java(
    jars: Path, props: Sequence[str], main: str, *args: str, jvm_options: Sequence[str] = JVM_OPTIONS
) -> list[str]:
    return [str(java_binary()), *jvm_options, *props, "-cp", f"{jars}/*", main, *args]


def _properties(path: Path, props: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    return path


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


@dataclass
class JavaBroker:
    release: Release
    process: JavaProcess
    cluster: str
    name: str
    broker_id: int
    addr: str
    namesrv_addrs: tuple[str, ...]
    conf: Path
    #: how this module reaches its name servers (None: plaintext)
    namesrv_tls: ssl.SSLContext | None = None
    #: name servers it is given but expected to refuse it (ACL): not waited for
    refused_by: tuple[str, ...] = ()

    def stop(self) -> None:
        self.process.stop()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def broker_port() -> int:
    """A free port P whose P-2 (the broker's "fast" port) and P+1 (its HA port) are free too."""
    for _ in range(200):
        port = free_port()
        if port > 1026 and _bindable(port - 2) and _bindable(port + 1):
            return port
    raise AssertionError("no free port P with P-2 and P+1 free on 127.0.0.1")


def registered(
    addr: str, broker_name: str, broker_id: int, broker_addr: str, tls: ssl.SSLContext | None = None
) -> bool:
    """True once the name server at ``addr`` lists ``broker_addr`` as ``broker_name``'s member ``broker_id``."""
    with NameServerClient(addr, timeout=2.0, tls=tls) as c:
        info = c.cluster_info()
    data = info.broker_addr_table.get(broker_name)
    return data is not None and data.broker_addrs.get(broker_id) == broker_addr


@contextlib.contextmanager
def java_broker(release: Release, base: Path, namesrv_addrs: Sequence[str], **kwargs) -> Iterator[JavaBroker]:
    """:func:`start_broker`, killed afterwards."""
    started = start_broker(release, base, namesrv_addrs, **kwargs)
    try:
        yield started
    finally:
        started.stop()


def start_broker(
    release: Release,
    base: Path,
    namesrv_addrs: Sequence[str],
    *,
    name: str = "broker-a",
    cluster: str = "RealCluster",
    broker_id: int = 0,
    extra: dict[str, str] | None = None,
    system_props: Sequence[str] = (),
    namesrv_tls: ssl.SSLContext | None = None,
    refused_by: Sequence[str] = (),
    timeout: float = 120.0,
) -> JavaBroker:
    """Apache RocketMQ's broker of ``release``, its store in its home, registered with every name server.

    ``extra`` adds to or overrides its broker.conf; ``system_props`` are more ``-D`` options (TLS is
    configured only so in RocketMQ); ``namesrv_tls`` is how this module reaches the name servers to see
    the registrations (name servers that refuse plaintext); ``refused_by`` are name servers among
    ``namesrv_addrs`` expected to refuse it, whose registration is not waited for.
    """
    proc_name = f"broker-{name}-{broker_id}"
    how = _BrokerStart(
        proc_name, name, cluster, broker_id, extra or {}, tuple(system_props), namesrv_tls, tuple(refused_by), timeout
    )
    return _on_free_ports(lambda: _start_broker(release, base, namesrv_addrs, how), lambda: base / proc_name)


@dataclass(frozen=True)
class _BrokerStart:
    proc_name: str
    name: str
    cluster: str
    broker_id: int
    extra: dict[str, str]
    system_props: tuple[str, ...]
    namesrv_tls: ssl.SSLContext | None
    refused_by: tuple[str, ...]
    timeout: float


def _start_broker(release: Release, base: Path, namesrv_addrs: Sequence[str], how: _BrokerStart) -> JavaBroker:
    name, cluster, broker_id = how.name, how.cluster, how.broker_id
    home, props = _home(base, how.proc_name, release, "broker")
    port = broker_port()
    store = home / "store"
    conf = _properties(
        home / "broker.conf",
        {
            "brokerClusterName": cluster,
            "brokerName": name,
            "brokerId": str(broker_id),
            "brokerRole": "ASYNC_MASTER" if broker_id == 0 else "SLAVE",
            "flushDiskType": "ASYNC_FLUSH",
            "namesrvAddr": ";".join(namesrv_addrs),
            "brokerIP1": LOOPBACK,
            "brokerIP2": LOOPBACK,
            "bindAddress": LOOPBACK,
            "listenPort": str(port),
            "haListenPort": str(port + 1),
            "storePathRootDir": str(store),
            "storePathCommitLog": str(store / "commitlog"),
            # small files: the defaults map 1 GB of commit log and a 100 MB timer log per broker
            "mappedFileSizeCommitLog": str(64 * 1024 * 1024),
            "mappedFileSizeConsumeQueue": str(30_000 * 20),
            "timerWheelEnable": "false",
            **how.extra,
        },
    )
    argv = _java(release.server_jars(), [*props, *how.system_props], BROKER_MAIN, "-c", str(conf))
    process = JavaProcess(how.proc_name, argv, home, _env(home))
    broker_addr = f"{LOOPBACK}:{port}"
    broker = JavaBroker(
        release,
        process,
        cluster,
        name,
        broker_id,
        broker_addr,
        tuple(namesrv_addrs),
        conf,
        how.namesrv_tls,
        how.refused_by,
    )
    _wait_registered(broker, how.timeout)
    return broker


def restart_broker(broker: JavaBroker, timeout: float = 120.0) -> None:
    """Start a stopped (killed) broker again on its ports, with its store; return once it registered again."""
    broker.process = broker.process.again()
    _wait_registered(broker, timeout)


def _wait_registered(broker: JavaBroker, timeout: float) -> None:
    accepting = [a for a in broker.namesrv_addrs if a not in broker.refused_by]

    def on_every_namesrv() -> bool:
        broker.process.check_alive()
        return all(registered(a, broker.name, broker.broker_id, broker.addr, broker.namesrv_tls) for a in accepting)

    try:
        wait_until(
            on_every_namesrv,
            timeout,
            f"broker {broker.name}/{broker.broker_id} ({broker.release.server_version}) at {broker.addr} "
            f"on {accepting}",
        )
    except BaseException:
        broker.process.stop()
        raise


# --------------------------------------------------------------------------- mqadmin and the Java client


def mqadmin(
    release: Release,
    base: Path,
    *args: str,
    system_props: Sequence[str] = (),
    credentials: tuple[str, str] | None = None,
    timeout: float = 90.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``mqadmin ARGS`` (Apache RocketMQ's MQAdminStartup of ``release``'s clients); its output as text.

    ``system_props``: more ``-D`` options (TLS). ``credentials`` (accessKey, secretKey) go where mqadmin
    reads them, ``conf/tools.yml`` under its ``rocketmq.home.dir``; with them it signs every request.
    """
    n = sum(1 for _ in base.glob("mqadmin-*"))
    home, props = _home(base, f"mqadmin-{n}", release, "tools")
    if credentials is not None:
        (home / "conf").mkdir(exist_ok=True)
        access_key, secret_key = credentials
        (home / "conf" / "tools.yml").write_text(f"accessKey: {access_key}\nsecretKey: {secret_key}\n")
    argv = _java(release.client_jars(), [*props, *system_props], MQADMIN_MAIN, *args)
    return subprocess.run(argv, cwd=home, env=_env(home), capture_output=True, text=True, timeout=timeout, check=False)


def compile_client_probe(release: Release, out: Path) -> Path:
    """``tests/peers/java/ClientProbe.java`` compiled against ``release``'s client jars into ``out``."""
    javac = java_binary().with_name("javac")
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(javac), "-nowarn", "-cp", f"{release.client_jars()}/*", "-d", str(out), str(CLIENT_PROBE)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"javac ClientProbe.java failed:\n{done.stderr[-_OUTPUT_TAIL:]}"
    return out


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
