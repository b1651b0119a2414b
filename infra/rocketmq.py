"""Apache RocketMQ's own broker, controller, mqadmin and a Java producer and consumer, as child processes.

The jars come from the pinned JVM manifest (``infra/jvm/pom.xml``), resolved by ``make setup`` into
``build/jvm/<module>/``; a :class:`Release` names the two class paths (5.5.0, or 4.9.7's servers with
4.9.8's clients) one world uses.  Every JVM is a child process started and stopped by its PID
(:class:`JavaProcess`) on free loopback ports, with a home directory of its own under ``base``, so
everything RocketMQ writes stays there; its logging is configured here.  Readiness is a real round
trip, never a sleep; a process that exits while awaited fails the wait at once, and one that lost its
port to another process is started again on new ports.  The JVMs run small: they need to answer, not
to be fast.

Controller mode (5.x): :func:`start_controller` runs Apache's standalone controller (one DLedger peer),
:func:`start_controller_group` a broker group whose members the controller assigns their ids and
roles, and :class:`FlowClients` a producer and a consumer whose every acknowledgement, delivery and
route change lands in a file, so a failover can be checked message by message.
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
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from infra.processes import free_port, java_binary, jvm_jars, poll_until
from namesrv.client import NameServerClient

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
BROKER_MAIN = "org.apache.rocketmq.broker.BrokerStartup"
CONTROLLER_MAIN = "org.apache.rocketmq.controller.ControllerStartup"
MQADMIN_MAIN = "org.apache.rocketmq.tools.command.MQAdminStartup"
FLOW_CLIENTS = REPO / "tests" / "peers" / "java" / "FlowClients.java"

#: small and quiet: answers, not throughput
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
#: the controller's snapshots use Hessian, which reflects into java.lang's classes
CONTROLLER_JVM_OPTIONS = (*JVM_OPTIONS, "--add-opens=java.base/java.lang=ALL-UNNAMED")
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


class JavaProcessError(RuntimeError):
    """A JVM we started exited while we waited for it."""


class PortTakenError(JavaProcessError):
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
    """One JVM we started: signalled by its PID, its output and log in its home directory."""

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
            error = PortTakenError if "Address already in use" in tail else JavaProcessError
            raise error(f"{self.name} (pid {self.pid}) exited with code {self.proc.returncode}\n{tail}")

    def again(self) -> JavaProcess:
        """The same command started anew in the same home (after :meth:`stop`), its output appended."""
        assert not self.alive(), f"{self.name} (pid {self.pid}) is still running"
        return JavaProcess(self.name, self.argv, self.home, self.env, again=True)

    def _signal(self, sig: signal.Signals) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGKILL to our PID (its files are all temporary) and reap it."""
        self._signal(signal.SIGKILL)
        self.proc.wait(timeout)

    def terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM (the JVM runs its shutdown hooks), then SIGKILL if it has not exited within ``timeout``."""
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()

    def freeze(self) -> None:
        """SIGSTOP: the JVM stops answering but keeps its sockets open, as a hung host looks."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self._signal(signal.SIGCONT)


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


def compile_java(release: Release | Path, source: Path, out: Path) -> Path:
    """``source`` compiled into the folder ``out`` (returned), against ``release``'s client jars or a folder of jars."""
    jars = release.client_jars() if isinstance(release, Release) else release
    javac = java_binary().with_name("javac")
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(javac), "-nowarn", "-cp", f"{jars}/*", "-d", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        raise JavaProcessError(f"javac {source.name} failed:\n{done.stderr[-_OUTPUT_TAIL:]}")
    return out


# --------------------------------------------------------------------------- broker


@dataclass
class JavaBroker:
    release: Release
    process: JavaProcess
    cluster: str
    name: str
    #: the id name servers list it under; in controller mode the controller's choice, 0 while master
    broker_id: int
    addr: str
    namesrv_addrs: tuple[str, ...]
    conf: Path
    #: how this module reaches its name servers (None: plaintext)
    namesrv_tls: ssl.SSLContext | None = None
    #: name servers it is given but expected to refuse it (ACL): not waited for
    refused_by: tuple[str, ...] = ()
    #: its id and role come from a controller (``enableControllerMode``), not from its broker.conf
    controller_mode: bool = False

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


_ports_lock = threading.Lock()
#: every port broker_port handed out in this process, with its neighbours: brokers started at the same
#: time would otherwise be given each other's fast or HA port, free until the first of them binds it
_ports_handed: set[int] = set()


def broker_port() -> int:
    """A free port P whose P-2 (the broker's "fast" port) and P+1 (its HA port) are free too."""
    with _ports_lock:
        for _ in range(200):
            port = free_port()
            used = {port - 2, port - 1, port, port + 1}
            if port > 1026 and not used & _ports_handed and _bindable(port - 2) and _bindable(port + 1):
                _ports_handed.update(used)
                return port
    raise RuntimeError("no free port P with P-2 and P+1 free on 127.0.0.1")


def group_members(addr: str, broker_name: str, tls: ssl.SSLContext | None = None) -> dict[int, str]:
    """The members of ``broker_name`` by broker id as the name server at ``addr`` lists them ({}: none)."""
    with NameServerClient(addr, timeout=2.0, tls=tls) as c:
        data = c.cluster_info().broker_addr_table.get(broker_name)
    return {} if data is None else dict(data.broker_addrs)


def registered(
    addr: str, broker_name: str, broker_id: int, broker_addr: str, tls: ssl.SSLContext | None = None
) -> bool:
    """True once the name server at ``addr`` lists ``broker_addr`` as ``broker_name``'s member ``broker_id``."""
    return group_members(addr, broker_name, tls).get(broker_id) == broker_addr


def master_addr(namesrv_addr: str, group: str) -> str | None:
    """The address the name server at ``namesrv_addr`` lists as ``group``'s master (id 0), None if none."""
    return group_members(namesrv_addr, group).get(0)


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
    controller_mode: bool = False


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
        how.controller_mode,
    )
    _wait_registered(broker, how.timeout)
    return broker


def restart_broker(broker: JavaBroker, timeout: float = 120.0) -> None:
    """Start a stopped (killed) broker again on its ports, with its store; return once it registered again.

    A controller-mode member registers under whatever id its controller gives it (``broker.broker_id``
    is updated): a former master comes back as a slave once another member was elected.
    """
    broker.process = broker.process.again()
    _wait_registered(broker, timeout)


def _wait_registered(broker: JavaBroker, timeout: float) -> None:
    accepting = [a for a in broker.namesrv_addrs if a not in broker.refused_by]

    def listed_id() -> int | None:
        """The id every accepting name server lists the broker's address under; None until they all agree."""
        ids = set()
        for a in accepting:
            members = group_members(a, broker.name, broker.namesrv_tls)
            ids.add(next((i for i, addr in members.items() if addr == broker.addr), None))
        return ids.pop() if len(ids) == 1 else None

    def on_every_namesrv() -> bool:
        broker.process.check_alive()
        if not accepting:
            return True
        found = listed_id()
        if not broker.controller_mode:
            return found == broker.broker_id
        if found is None:
            return False
        broker.broker_id = found
        return True

    try:
        poll_until(
            on_every_namesrv,
            timeout,
            f"broker {broker.name}/{broker.broker_id} ({broker.release.server_version}) at {broker.addr} "
            f"on {accepting}",
        )
    except BaseException:
        broker.process.stop()
        raise


# --------------------------------------------------------------------------- mqadmin


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


def create_topic(
    namesrv_addr: str,
    topic: str,
    clusters: Sequence[str],
    *,
    queues: int = 4,
    release: Release = ROCKETMQ_5,
    base: Path | None = None,
    timeout: float = 90.0,
) -> None:
    """``topic`` on every master of ``clusters`` (mqadmin updateTopic through ``namesrv_addr``); returns once
    that name server routes it to every group of those clusters.  mqadmin's home goes under ``base``
    (a temporary folder if None)."""
    with contextlib.ExitStack() as stack:
        home = base if base is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for cluster in clusters:
            done = mqadmin(
                release, home, "updateTopic", "-n", namesrv_addr, "-c", cluster, "-t", topic,
                "-r", str(queues), "-w", str(queues), timeout=timeout,
            )  # fmt: skip
            if done.returncode != 0 or "success" not in done.stdout:
                raise JavaProcessError(f"mqadmin updateTopic {topic} on {cluster} failed:\n{done.stdout}{done.stderr}")
    with NameServerClient(namesrv_addr, timeout=5.0) as c:
        info = c.cluster_info()
    groups = {g for cluster in clusters for g in info.cluster_addr_table.get(cluster, ())}
    poll_until(
        lambda: groups <= routed_groups(namesrv_addr, topic),
        timeout,
        f"topic {topic} routed to {sorted(groups)} by {namesrv_addr}",
    )


def routed_groups(addr: str, topic: str, timeout: float = 5.0) -> set[str]:
    """The broker groups the name server (or proxy) at ``addr`` routes ``topic`` to; none while it refuses the
    lookup or answers TOPIC_NOT_EXIST (until the masters registered the topic, or while it starts)."""
    with NameServerClient(addr, timeout=timeout) as c:
        try:
            route = c.topic_route(topic)
        except Exception:
            return set()
    return {q.broker_name for q in route.queue_datas}


# --------------------------------------------------------------------------- controller mode


@dataclass
class Controller:
    """Apache's standalone controller: one DLedger peer, which is also where brokers reach it."""

    process: JavaProcess
    addr: str

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.stop()


def start_controller(
    base: Path,
    namesrv_addrs: Sequence[str],
    timeout: float = 120.0,
    *,
    release: Release = ROCKETMQ_5,
    name: str = "controller",
) -> Controller:
    """Apache's standalone controller (``ControllerStartup``, a DLedger group of one) on a free loopback port,
    answering as leader.

    ``namesrv_addrs`` are the name servers of the groups it will run; 5.5's controller itself never
    talks to them (it has no such key): its brokers tell the name servers what it decided.
    """
    del namesrv_addrs
    return _on_free_ports(lambda: _start_controller(base, timeout, release, name), lambda: base / name)


def _start_controller(base: Path, timeout: float, release: Release, name: str) -> Controller:
    home, props = _home(base, name, release, "controller")
    port = free_port()
    conf = _properties(
        home / "controller.conf",
        {
            "controllerDLegerGroup": "group1",
            # the DLedger peer address is also the controller's remoting address: 5.5 serves brokers and
            # admins on the DLedger server's port (its own listenPort is never bound)
            "controllerDLegerPeers": f"n0-{LOOPBACK}:{port}",
            "controllerDLegerSelfId": "n0",
            "controllerStorePath": str(home / "store"),
            "configStorePath": str(home / "controller.properties"),
            # small files: the default maps 1 GB of DLedger log
            "mappedFileSize": str(16 * 1024 * 1024),
            "bindAddress": LOOPBACK,
        },
    )
    argv = _java(release.server_jars(), props, CONTROLLER_MAIN, "-c", str(conf), jvm_options=CONTROLLER_JVM_OPTIONS)
    process = JavaProcess(name, argv, home, _env(home))
    controller = Controller(process, f"{LOOPBACK}:{port}")
    try:
        poll_until(lambda: _controller_leads(controller), timeout, f"the controller on {controller.addr} to lead")
    except BaseException:
        process.stop()
        raise
    return controller


def _controller_leads(controller: Controller) -> bool:
    controller.process.check_alive()
    try:
        return replica_info(controller, "-") is not None
    except OSError:
        return False


#: RequestCode.CONTROLLER_GET_REPLICA_INFO, a controller's request code
CONTROLLER_GET_REPLICA_INFO = 1004
#: ResponseCode.CONTROLLER_NOT_LEADER
_NOT_LEADER = 2007


@dataclass(frozen=True)
class ReplicaInfo:
    """What the controller holds for one group: its master and the ids of the members in sync with it."""

    master_id: int | None
    master_addr: str | None
    master_epoch: int
    sync_state_set: frozenset[int]


def replica_info(controller: Controller, group: str) -> ReplicaInfo | None:
    """The controller's view of ``group`` (an empty one if it knows no such group); None while not leader."""
    with NameServerClient(controller.addr, timeout=3.0) as c:
        answer = c.call(CONTROLLER_GET_REPLICA_INFO, {"brokerName": group})
    assert answer is not None
    if answer.code == _NOT_LEADER:
        return None
    if answer.code != 0:
        return ReplicaInfo(None, None, 0, frozenset())
    master = answer.ext("masterBrokerId")
    epoch = answer.ext("masterEpoch")
    in_sync = json.loads(answer.body)["syncStateSet"] if answer.body else []
    return ReplicaInfo(
        int(master) if master else None, answer.ext("masterAddress"), int(epoch or 0), frozenset(in_sync)
    )


#: a member's broker.conf in controller mode, beside what :func:`start_broker` writes
CONTROLLER_MEMBER_CONF = {
    # the controller gives the id and the role; -1 asks it for one (and keeps it in the store after)
    "brokerId": "-1",
    "brokerRole": "SLAVE",
    "enableControllerMode": "true",
    # an acknowledged message is on every member in sync, so any of them can take over without losing it
    "allAckInSyncStateSet": "true",
    # the master reports who is in sync, and a slave copies topics and offsets, every second (default 5 s)
    "checkSyncStateSetPeriod": "1000",
    "syncBrokerMetadataPeriod": "1000",
}


@dataclass
class ControllerGroup:
    """One broker group run by a controller: every member, the master first at start."""

    name: str
    brokers: list[JavaBroker]
    controller: Controller | None = field(default=None, repr=False)

    def master(self, namesrv_addr: str) -> JavaBroker | None:
        """The member the name server at ``namesrv_addr`` lists as master (id 0)."""
        addr = master_addr(namesrv_addr, self.name)
        return next((b for b in self.brokers if b.addr == addr), None)

    def stop(self) -> None:
        for broker in self.brokers:
            broker.process.thaw()
            broker.stop()


def start_controller_group(
    base: Path,
    namesrv_addrs: Sequence[str],
    controller: Controller,
    *,
    name: str,
    cluster: str,
    members: int = 2,
    timeout: float = 180.0,
    release: Release = ROCKETMQ_5,
    extra: dict[str, str] | None = None,
) -> ControllerGroup:
    """``members`` 5.x brokers of group ``name`` in controller mode, registered with every name server.

    The first is started alone, so the controller makes it master; the others register as its slaves.
    Returns once every member is in the controller's sync state set: from then on any of them can be
    elected without losing an acknowledged message.  ``extra`` adds to or overrides every broker.conf.
    """
    conf = {**CONTROLLER_MEMBER_CONF, "controllerAddr": controller.addr, **(extra or {})}
    deadline = time.monotonic() + timeout
    brokers: list[JavaBroker] = []

    def member(i: int) -> JavaBroker:
        how = _BrokerStart(
            f"broker-{name}-m{i}", name, cluster, -1, conf, (), None, (), deadline - time.monotonic(), True
        )
        return _on_free_ports(lambda: _start_broker(release, base, namesrv_addrs, how), lambda: base / how.proc_name)

    try:
        brokers.append(member(0))
        if brokers[0].broker_id != 0:
            raise JavaProcessError(f"{name}'s first member registered as id {brokers[0].broker_id}, not as master")
        # the slaves together: each start is mostly waiting for its JVM
        with ThreadPoolExecutor(max(members - 1, 1)) as pool:
            starting = [pool.submit(member, i) for i in range(1, members)]
            wait(starting)
        brokers += [f.result() for f in starting if f.exception() is None]
        for f in starting:
            if (error := f.exception()) is not None:
                raise error
        ids = {b.broker_id for b in brokers}
        poll_until(
            lambda: _all_in_sync(controller, name, len(brokers)),
            max(deadline - time.monotonic(), 1.0),
            f"all {members} members of {name} (ids {sorted(ids)} at the name servers) in sync at {controller.addr}",
        )
    except BaseException:
        for b in brokers:
            b.stop()
        raise
    return ControllerGroup(name, brokers, controller)


def _all_in_sync(controller: Controller, group: str, members: int) -> bool:
    info = replica_info(controller, group)
    return info is not None and len(info.sync_state_set) == members


def kill_broker(broker: JavaBroker) -> None:
    """SIGKILL by PID: its kernel closes its sockets, so the controller and name servers see it go at once."""
    broker.process.stop()


def freeze_broker(broker: JavaBroker) -> None:
    """SIGSTOP by PID: silent with its connections open; only heartbeat timeouts notice it."""
    broker.process.freeze()


def thaw_broker(broker: JavaBroker) -> None:
    broker.process.thaw()


@contextlib.contextmanager
def frozen(broker: JavaBroker) -> Iterator[JavaBroker]:
    """The broker frozen (SIGSTOP) inside the block, thawed (SIGCONT) after it, also on error."""
    freeze_broker(broker)
    try:
        yield broker
    finally:
        thaw_broker(broker)


# --------------------------------------------------------------------------- producer and consumer


def compile_flow_clients(out: Path, release: Release = ROCKETMQ_5) -> Path:
    """``tests/peers/java/FlowClients.java`` compiled against ``release``'s client jars into ``out``."""
    return compile_java(release, FLOW_CLIENTS, out)


@dataclass
class FlowClients:
    """``tests/peers/java/FlowClients.java`` running: a producer sending every ~50 ms and a clustering push
    consumer on one topic, writing what happened to ``output``, one line per event:

    ``ACK <seq> <msgId> <brokerName> <wallms>`` (SEND_OK), ``GOT <seq> <wallms>`` (delivered),
    ``ROUTE <wallms> <group>=<masterAddr>,...`` (the producer's route changed), ``ERR <wallms> <message>``.
    """

    process: JavaProcess
    output: Path

    @classmethod
    def start(
        cls,
        base: Path,
        namesrv_addr: str,
        topic: str,
        *,
        release: Release = ROCKETMQ_5,
        name: str = "flow",
        classes: Path | None = None,
        timeout: float = 120.0,
    ) -> FlowClients:
        """Started, from ``classes`` (:func:`compile_flow_clients`; compiled into ``base/<name>-classes`` if
        None), its files in ``base/<name>``; returns once the first message was acknowledged."""
        if classes is None:
            classes = compile_flow_clients(base / f"{name}-classes", release)
        home, props = _home(base, name, release, "client")
        output = home / "flow.txt"
        argv = [str(java_binary()), *JVM_OPTIONS, *props, "-cp", f"{release.client_jars()}/*:{classes}"]
        argv += ["FlowClients", "-n", namesrv_addr, "-t", topic, "-o", str(output), "-g", f"{name}-consumers"]
        clients = cls(JavaProcess(name, argv, home, _env(home)), output)
        try:
            poll_until(lambda: clients._running() and clients.acked(), timeout, f"a first acknowledgement on {topic}")
        except BaseException:
            clients.process.stop()
            raise
        return clients

    def _running(self) -> bool:
        self.process.check_alive()
        return True

    def lines(self, kind: str) -> list[list[str]]:
        """Every complete line of ``kind`` (ACK, GOT, ROUTE, ERR), split on spaces after the kind."""
        try:
            text = self.output.read_text(errors="replace")
        except FileNotFoundError:
            return []
        complete = text[: text.rfind("\n") + 1]  # the last line may be half written
        return [line.split(" ")[1:] for line in complete.splitlines() if line.startswith(kind + " ")]

    def acked(self) -> set[int]:
        return {int(fields[0]) for fields in self.lines("ACK")}

    def received(self) -> set[int]:
        return {int(fields[0]) for fields in self.lines("GOT")}

    def acks(self) -> dict[int, tuple[str, str, int]]:
        """seq -> (msgId, brokerName, wall ms) of every acknowledged message."""
        return {int(f[0]): (f[1], f[2], int(f[3])) for f in self.lines("ACK")}

    def routes(self) -> list[tuple[int, dict[str, str]]]:
        """Every route the producer saw, in order: (wall ms, {group: master address})."""
        out = []
        for fields in self.lines("ROUTE"):
            masters = fields[1] if len(fields) > 1 else ""
            out.append((int(fields[0]), dict(pair.split("=", 1) for pair in masters.split(",") if pair)))
        return out

    def errors(self) -> list[tuple[int, str]]:
        return [(int(f[0]), " ".join(f[1:])) for f in self.lines("ERR")]

    def stop(self) -> None:
        """SIGTERM: the program shuts its producer and consumer down and exits."""
        self.process.terminate()


# --------------------------------------------------------------------------- proxy and gRPC clients

PROXY_MAIN = "org.apache.rocketmq.proxy.ProxyStartup"
GRPC_FLOW = REPO / "tests" / "peers" / "java" / "GrpcFlow.java"
#: the jars of Apache's gRPC Java client (rocketmq-client-java): a module of their own, since its shaded
#: jar carries its own copies of the apache.rocketmq.v2 classes the proxy takes from rocketmq-proto
GRPC_CLIENT_MODULE = "rocketmq-5-grpc-client"


@dataclass
class JavaProxy:
    """Apache's 5.x proxy (``ProxyStartup -pm cluster``): gRPC clients at ``grpc_addr``, remoting ones at
    ``remoting_addr``, both served from the brokers its name servers route to."""

    process: JavaProcess
    grpc_addr: str
    remoting_addr: str

    def stop(self) -> None:
        self.process.stop()


def start_proxy(
    base: Path,
    namesrv_addrs: Sequence[str],
    *,
    cluster: str,
    ready_topic: str,
    name: str = "proxy",
    release: Release = ROCKETMQ_5,
    timeout: float = 120.0,
) -> JavaProxy:
    """The proxy in cluster mode in front of ``cluster``'s brokers, found through ``namesrv_addrs``; returns
    once it answers a route lookup of ``ready_topic`` on its remoting port, which it can do only after
    reaching a name server."""
    return _on_free_ports(
        lambda: _start_proxy(base, namesrv_addrs, cluster, ready_topic, name, release, timeout), lambda: base / name
    )


def _start_proxy(
    base: Path,
    namesrv_addrs: Sequence[str],
    cluster: str,
    ready_topic: str,
    name: str,
    release: Release,
    timeout: float,
) -> JavaProxy:
    home, props = _home(base, name, release, "proxy")
    grpc_port, remoting_port = free_port(), free_port()
    config = home / "rmq-proxy.json"
    config.write_text(
        json.dumps(
            {
                "rocketMQClusterName": cluster,
                "namesrvAddr": ";".join(namesrv_addrs),
                "grpcServerPort": grpc_port,
                "remotingListenPort": remoting_port,
                # the defaults size every pool by the cores (and the gRPC one at 16 + 2 per core): a test
                # sends a few dozen messages on a shared machine
                "grpcThreadPoolNums": 4,
                "rocketmqMQClientNum": 2,
                "enablePrintJstack": False,
            }
        )
    )
    argv = _java(release.server_jars(), props, PROXY_MAIN, "-pm", "cluster", "-pc", str(config))
    process = JavaProcess(name, argv, home, _env(home))
    proxy = JavaProxy(process, f"{LOOPBACK}:{grpc_port}", f"{LOOPBACK}:{remoting_port}")
    try:
        poll_until(lambda: _proxy_routes(proxy, ready_topic), timeout, f"the proxy on {proxy.grpc_addr} to route")
    except BaseException:
        process.stop()
        raise
    return proxy


def _proxy_routes(proxy: JavaProxy, topic: str) -> bool:
    proxy.process.check_alive()
    return bool(routed_groups(proxy.remoting_addr, topic, timeout=3.0))


def create_typed_topic(
    namesrv_addr: str,
    topic: str,
    cluster: str,
    message_type: str,
    *,
    base: Path,
    release: Release = ROCKETMQ_5,
    timeout: float = 90.0,
) -> None:
    """``topic`` with the 5.x attribute ``message.type`` (NORMAL, FIFO, ...) on ``cluster``'s masters, which
    the proxy checks every send against; returns once ``namesrv_addr`` routes it."""
    done = mqadmin(
        release, base, "updateTopic", "-n", namesrv_addr, "-c", cluster, "-t", topic,
        "-a", f"+message.type={message_type}", timeout=timeout,
    )  # fmt: skip
    if done.returncode != 0 or "success" not in done.stdout:
        raise JavaProcessError(f"mqadmin updateTopic {topic} ({message_type}) failed:\n{done.stdout}{done.stderr}")
    poll_until(lambda: routed_groups(namesrv_addr, topic), timeout, f"topic {topic} routed by {namesrv_addr}")


def create_group(
    namesrv_addr: str,
    group: str,
    cluster: str,
    *,
    orderly: bool,
    base: Path,
    release: Release = ROCKETMQ_5,
    timeout: float = 90.0,
) -> None:
    """Subscription group ``group`` on ``cluster``'s masters; ``orderly`` makes the proxy hand its consumers
    a FIFO topic's messages one message group at a time, in order (an auto-created group is not)."""
    done = mqadmin(
        release, base, "updateSubGroup", "-n", namesrv_addr, "-c", cluster, "-g", group,
        "-o", str(orderly).lower(), timeout=timeout,
    )  # fmt: skip
    if done.returncode != 0 or "success" not in done.stdout:
        raise JavaProcessError(f"mqadmin updateSubGroup {group} failed:\n{done.stdout}{done.stderr}")


def compile_grpc_flow(out: Path) -> Path:
    """``tests/peers/java/GrpcFlow.java`` compiled against the gRPC Java client into ``out`` (returned)."""
    return compile_java(jvm_jars(GRPC_CLIENT_MODULE), GRPC_FLOW, out)


@dataclass(frozen=True)
class GrpcFlowResult:
    """What one pass of a gRPC flow client did: its exit code, and its lines split on spaces."""

    returncode: int
    lines: list[list[str]]

    def sent(self, kind: str) -> list[int]:
        return [int(f[2]) for f in self.lines if f[:2] == ["SENT", kind]]

    def acked(self, kind: str) -> set[int]:
        return {int(f[2]) for f in self.lines if f[:2] == ["ACKED", kind]}

    def received(self, kind: str) -> dict[str, list[int]]:
        """Message group -> seqs in the order first delivered (redeliveries left out)."""
        groups: dict[str, list[int]] = {}
        seen: set[int] = set()
        for f in self.lines:
            if f[:2] == ["GOT", kind] and int(f[3]) not in seen:
                seen.add(int(f[3]))
                groups.setdefault(f[2], []).append(int(f[3]))
        return groups

    @property
    def errors(self) -> list[str]:
        return [" ".join(f[1:]) for f in self.lines if f[:1] == ["ERR"]]


def run_grpc_flow(
    base: Path,
    argv: Sequence[str],
    *,
    name: str,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
) -> GrpcFlowResult:
    """Run one gRPC flow client (``argv``, a program writing :class:`GrpcFlowResult`'s lines on stdout) to
    its end in a home of its own under ``base``, with ``env`` added to its environment; SIGKILLed by PID
    if it outlives ``timeout``."""
    home = base / name
    home.mkdir(parents=True)
    # HOME too: the Python client logs under ~/logs whatever it is told
    process = JavaProcess(name, argv, home, {**_env(home), "HOME": str(home), **(env or {})})
    try:
        process.proc.wait(timeout)
    except subprocess.TimeoutExpired:
        process.stop()
    text = process.out.read_text(errors="replace")
    kinds = ("SENT ", "GOT ", "ACKED ", "DONE", "ERR ")
    lines = [line.split(" ") for line in text.splitlines() if line.startswith(kinds)]
    return GrpcFlowResult(process.proc.returncode, lines)


def java_grpc_flow_argv(classes: Path, home: Path, *args: str) -> list[str]:
    """The command line of ``GrpcFlow`` (:func:`compile_grpc_flow`) with ``args``, its client logs in ``home``."""
    jars = jvm_jars(GRPC_CLIENT_MODULE)
    # the client writes its log under ~/logs/rocketmq: user.home keeps it in the test's folder
    return [str(java_binary()), *JVM_OPTIONS, f"-Duser.home={home}", "-cp", f"{jars}/*:{classes}", "GrpcFlow", *args]
