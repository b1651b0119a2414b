"""Apache's 5.5.0 proxy in cluster mode in front of 5.5.0 brokers in controller mode, found through our
nodes, serves gRPC clients as it does through Apache's own NameServer, and follows a master's failover.

A group of two brokers in controller mode under Apache's 5.5.0 controller (``ControllerStartup``)
registers with two of our nodes and with Apache's 5.5.0 NameServer.  For each world (our two nodes,
Apache's NameServer) a proxy (``ProxyStartup -pm cluster``) is given only that world's name servers, and
topics and groups of that world's own are created through it: a NORMAL topic, a FIFO topic and an
orderly group for the latter.

* Apache's gRPC Java client (``rocketmq-client-java``, ``tests/peers/java/GrpcFlow.java``) sends COUNT
  messages to each topic through the proxy, the FIFO ones alternating between two message groups, and a
  SimpleConsumer per topic receives and acks them all.  The official Python gRPC client (PyPI
  ``rocketmq-python-client``, this module run as a program) does the same through the same proxy.  Every
  message is sent, received and acked once, each message group's in the order sent, and both worlds give
  the same counts and the same order to both clients.
* Then the Python client sends through each proxy every ``PERIOD_S`` while the master is SIGKILLed and
  the controller elects the slave.  The proxy sends to the dead address until its route cache refreshes
  (its ``topicRouteServiceCacheRefreshSeconds``, 20 s), then to the new master: through each world a
  send is acknowledged again within ``WRITES_AGAIN_S`` of the election, and none fails before the kill or
  after that.  Both worlds' figures are printed side by side.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.contract import wall_ms
from infra.processes import BinaryNotFoundError, jvm_jars
from infra.rocketmq import (
    REPO,
    ROCKETMQ_5,
    Controller,
    ControllerGroup,
    GrpcFlowResult,
    JavaProcess,
    JavaProxy,
    compile_grpc_flow,
    create_group,
    create_typed_topic,
    java_grpc_flow_argv,
    kill_broker,
    run_grpc_flow,
    start_controller,
    start_controller_group,
    start_proxy,
)
from tests.support.liveness import bounds_now
from tests.support.node import running_node
from tests.support.report import report
from tests.support.rocketmq import broker_topics, elected, start_java_namesrv
from tests.support.wait import wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(600)]

CLUSTER = "ProxyCluster"
COUNT = 20
#: a SimpleConsumer pops, and 5.x pops only with the timer wheel on (start_broker turns it off); the
#: default timer log maps 100 MB
POP_BROKER = {"timerWheelEnable": "true", "mappedFileSizeTimerLog": str(4 * 1024 * 1024)}
WORLDS = ("ours", "apache")
WHOSE = {"ours": "our nodes'", "apache": "Apache's"}
CLIENTS = ("java", "python")
GROUPS = {"g0": list(range(0, COUNT, 2)), "g1": list(range(1, COUNT, 2))}
BROKER_GROUP = "broker-a"
#: how often the steady client sends during the failover
PERIOD_S = 0.1
#: the proxy's topicRouteServiceCacheRefreshSeconds (its default, 20 s), plus the client's own retry and
#: the proxy's next look (on a loaded machine three times that: tests.support.liveness.bounds_now)
WRITES_AGAIN_S = 30.0
#: the controller hears of a SIGKILL from the closed connection
ELECTION_S = 60.0


@dataclass
class World:
    base: Path
    controller: Controller
    group: ControllerGroup
    #: "ours" (in front of our two nodes) and "apache" (in front of Apache's NameServer)
    proxies: dict[str, JavaProxy]
    java_classes: Path


def names(which: str, client: str) -> tuple[str, str, str, str]:
    """The normal topic, the FIFO topic, the normal group and the orderly group of one client in one world."""
    tail = f"{which}-{client}"
    return f"GrpcNormal-{tail}", f"GrpcFifo-{tail}", f"GrpcGroup-{tail}", f"GrpcFifoGroup-{tail}"


def prepare(base: Path, which: str, addrs: list[str]) -> JavaProxy:
    """``which`` world's topics and groups, each client's, created through its first name server; then its
    proxy, started."""
    home = base / f"admin-{which}"
    home.mkdir()
    for client in CLIENTS:
        normal, fifo, _, fifo_group = names(which, client)
        create_typed_topic(addrs[0], normal, CLUSTER, "NORMAL", base=home)
        create_typed_topic(addrs[0], fifo, CLUSTER, "FIFO", base=home)
        create_group(addrs[0], fifo_group, CLUSTER, orderly=True, base=home)
    return start_proxy(base, addrs, cluster=CLUSTER, ready_topic=names(which, "java")[1], name=f"proxy-{which}")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("proxy")
    try:
        jvm_jars("rocketmq-5-grpc-client")
    except BinaryNotFoundError as e:
        pytest.skip(f"Apache's gRPC Java client is not resolved: {e}")
    classes = compile_grpc_flow(base / "grpc-flow-classes")  # before the JVMs take the cores
    with ExitStack() as stack:
        ours = []
        for name in ("node-1", "node-2"):
            (base / name).mkdir()
            ours.append(stack.enter_context(running_node(base / name)).addr)
        apache = start_java_namesrv(ROCKETMQ_5, base, "apache-namesrv")
        stack.callback(apache.stop)
        namesrvs = {"ours": ours, "apache": [apache.addr]}
        controller = start_controller(base, [*ours, apache.addr])
        stack.callback(controller.stop)
        group = start_controller_group(
            base, [*ours, apache.addr], controller, name=BROKER_GROUP, cluster=CLUSTER, extra=POP_BROKER
        )
        stack.callback(group.stop)
        # the two worlds side by side: each is mostly JVMs starting one after the other (more at once
        # starve the machine until mqadmin's 3 s requests time out)
        with ThreadPoolExecutor(len(WORLDS)) as pool:
            starting = {w: pool.submit(prepare, base, w, namesrvs[w]) for w in WORLDS}
        proxies = {w: f.result() for w, f in starting.items() if f.exception() is None}
        for proxy in proxies.values():
            stack.callback(proxy.stop)
        for f in starting.values():
            if (error := f.exception()) is not None:
                raise error
        yield World(base, controller, group, proxies, classes)


def flow(world: World, which: str, client: str) -> GrpcFlowResult:
    """One client's pass through ``which`` world's proxy."""
    normal, fifo, group, fifo_group = names(which, client)
    name = f"{client}-flow-{which}"
    args = ["-e", world.proxies[which].grpc_addr, "-t", normal, "-f", fifo, "-g", group, "-G", fifo_group]
    args += ["-c", str(COUNT), "-w", "60"]
    if client == "java":
        return run_grpc_flow(world.base, java_grpc_flow_argv(world.java_classes, world.base / name, *args), name=name)
    argv = [sys.executable, "-m", "tests.integration.test_rocketmq_proxy", *args]
    return run_grpc_flow(world.base, argv, name=name, env={"PYTHONPATH": str(REPO)})


def check_flow(result: GrpcFlowResult, what: str) -> None:
    assert result.returncode == 0, (what, result.errors or result.lines[-5:])
    for kind in ("normal", "fifo"):
        assert result.sent(kind) == list(range(COUNT)), (what, kind)
        assert result.acked(kind) == set(range(COUNT)), (what, kind)
    assert sorted(seq for seqs in result.received("normal").values() for seq in seqs) == list(range(COUNT)), what
    # FIFO: each message group's messages in the order they were sent
    assert result.received("fifo") == GROUPS, what


def test_grpc_clients_through_the_proxy_on_our_nodes_and_on_apaches(world: World):
    results = {w: {c: flow(world, w, c) for c in CLIENTS} for w in WORLDS}
    for which, by_client in results.items():
        for client, result in by_client.items():
            check_flow(result, f"{client} client through {which}")
    for client in CLIENTS:
        ours, apache = results["ours"][client], results["apache"][client]
        assert ours.received("fifo") == apache.received("fifo")
        assert [len(ours.acked(k)) for k in ("normal", "fifo")] == [len(apache.acked(k)) for k in ("normal", "fifo")]


@dataclass(frozen=True)
class Send:
    seq: int
    #: wall ms when the send returned
    at_ms: int
    ok: bool
    detail: str


class SteadyProducer:
    """This module as a program (``--steady``): the Python gRPC client sending through one proxy until stopped."""

    def __init__(self, world: World, which: str) -> None:
        name = f"steady-{which}"
        home = world.base / name
        home.mkdir()
        topic = names(which, "python")[0]
        argv = [sys.executable, "-m", "tests.integration.test_rocketmq_proxy", "--steady", "1"]
        argv += ["-e", world.proxies[which].grpc_addr, "-t", topic, "-p", str(PERIOD_S)]
        # HOME: the client logs under ~/logs whatever it is told
        self.process = JavaProcess(name, argv, home, {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(home)})

    def sends(self) -> list[Send]:
        out = []
        for line in self.process.out.read_text(errors="replace").splitlines():
            fields = line.split(" ", 3)
            if fields[0] in ("OK", "FAIL") and len(fields) >= 3:
                out.append(Send(int(fields[1]), int(fields[2]), fields[0] == "OK", "".join(fields[3:])))
        return out

    def stop(self) -> None:
        self.process.stop()


def first_ok_after(sends: list[Send], at_ms: int) -> Send | None:
    return next((s for s in sends if s.ok and s.at_ms > at_ms), None)


def test_the_proxy_s_clients_write_to_the_new_master_within_its_route_refresh_through_both_worlds(world: World):
    """Last in the module: it kills the group's master."""
    old, slave = world.group.brokers
    topics = {names(w, "python")[0] for w in WORLDS}
    wait_until(lambda: topics <= broker_topics(slave), 60, "the topics on the slave, to take writes as master")
    producers: dict[str, SteadyProducer] = {}
    again: dict[str, Send] = {}
    try:
        for which in WORLDS:
            producers[which] = SteadyProducer(world, which)
        for which, producer in producers.items():
            wait_until(
                lambda p=producer: sum(s.ok for s in p.sends()) >= 20,
                60,
                f"20 sends acknowledged through {WHOSE[which]} proxy",
                state=lambda p=producer: p.sends()[-3:],
            )
        kill_broker(old)
        killed_ms = wall_ms()
        assert elected(world.controller, BROKER_GROUP, old.addr, ELECTION_S) == slave.addr
        elected_ms = wall_ms()
        (bound_ms,) = bounds_now(WRITES_AGAIN_S)
        until_s = (elected_ms + bound_ms) / 1000 + 5  # the bound's end, and a margin to see it missed
        for which, producer in producers.items():
            again[which] = wait_until(
                lambda p=producer: first_ok_after(p.sends(), elected_ms),
                max(until_s - time.time(), 0),
                f"a send acknowledged through {WHOSE[which]} proxy after the election",
                state=lambda p=producer: p.sends()[-3:],
            )
    finally:
        for producer in producers.values():
            producer.stop()
    figures = {w: again[w].at_ms - elected_ms for w in WORLDS}
    report(
        f"master killed: kill -> election {(elected_ms - killed_ms) / 1000:.2f} s; election -> a send acknowledged "
        + ", ".join(f"through {WHOSE[w]} proxy {figures[w] / 1000:.2f} s" for w in WORLDS)
        + f" (bound {bound_ms / 1000:g} s)"
    )
    assert all(v <= bound_ms for v in figures.values()), figures
    for which, producer in producers.items():
        sends = producer.sends()
        assert [s.seq for s in sends] == list(range(len(sends))), which
        failed = [s for s in sends if not s.ok]
        # a send fails only between the kill and the proxy's new route, never before or after
        assert all(killed_ms - 1_000 <= s.at_ms <= again[which].at_ms for s in failed), (which, failed[:3])


def steady_send(opts: dict[str, str]) -> None:
    """Send through the proxy at ``opts['-e']`` every ``-p`` seconds until killed: a line per send."""
    from rocketmq.v5.client import ClientConfiguration, Credentials
    from rocketmq.v5.model import Message
    from rocketmq.v5.producer import Producer

    conf = ClientConfiguration(opts["-e"], Credentials(), request_timeout=3)
    producer = Producer(conf, (opts["-t"],))
    producer.startup()
    period = float(opts["-p"])
    seq = 0
    while True:
        message = Message()
        message.topic, message.body = opts["-t"], str(seq).encode()
        try:
            producer.send(message)
            print("OK", seq, wall_ms(), flush=True)
        except Exception as e:  # a failed send is a result here: the test reads them
            print("FAIL", seq, wall_ms(), repr(e).replace("\n", " ")[:300], flush=True)
        seq += 1
        time.sleep(period)  # the pace of the load, not a wait for an effect


def python_flow(opts: dict[str, str]) -> None:
    """The Python client's GrpcFlow (tests/peers/java/GrpcFlow.java): the same options, lines and exit code."""
    from rocketmq.v5.client import ClientConfiguration, Credentials
    from rocketmq.v5.consumer import SimpleConsumer
    from rocketmq.v5.model import FilterExpression, Message
    from rocketmq.v5.producer import Producer

    count, deadline = int(opts["-c"]), time.monotonic() + float(opts["-w"])
    # no TLS is its default; the proxy serves plaintext too while tlsTestModeEnable is on
    conf = ClientConfiguration(opts["-e"], Credentials(), request_timeout=10)
    producer = Producer(conf, (opts["-t"], opts["-f"]))
    producer.startup()
    try:
        for seq in range(count):
            for kind, topic in (("normal", opts["-t"]), ("fifo", opts["-f"])):
                message = Message()
                message.topic, message.body = topic, f"{kind}:{seq}".encode()
                if kind == "fifo":
                    message.message_group = f"g{seq % 2}"
                print("SENT", kind, seq, producer.send(message).message_id, flush=True)
    finally:
        producer.shutdown()
    for kind, group, topic in (("normal", opts["-g"], opts["-t"]), ("fifo", opts["-G"], opts["-f"])):
        # await_duration: how long an empty receive long-polls
        consumer = SimpleConsumer(conf, group, {topic: FilterExpression()}, await_duration=2)
        consumer.startup()
        try:
            seen: set[int] = set()
            while len(seen) < count:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{kind}: {len(seen)} of {count} received")
                try:
                    received = consumer.receive(16, 15) or ()
                except Exception as e:
                    # its startup only writes its settings to the telemetry stream: until the proxy has
                    # read them, a receive fails with a NullPointerException on them
                    if '"settings" is null' not in str(e):
                        raise
                    received = ()
                    time.sleep(0.1)  # poll interval, as tests.support.wait's
                for message in received:
                    seq = int(message.body.decode().split(":")[1])
                    print("GOT", kind, message.message_group or "-", seq, 1, flush=True)
                    consumer.ack(message)  # a FIFO group's next message comes only after this ack
                    print("ACKED", kind, seq, flush=True)
                    seen.add(seq)
        finally:
            consumer.shutdown()


if __name__ == "__main__":
    try:
        options = dict(zip(sys.argv[1::2], sys.argv[2::2], strict=True))
        if options.pop("--steady", None):
            steady_send(options)  # until killed
        else:
            python_flow(options)
        print("DONE", flush=True)
    except Exception as e:
        print("ERR", repr(e).replace("\n", " "), flush=True)
        os._exit(1)
    os._exit(0)  # the client's event loop and executor threads are not all daemons
