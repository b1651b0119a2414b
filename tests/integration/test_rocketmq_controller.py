"""A 5.5.0 broker group in controller mode loses its master, killed and then frozen, under the system as
shipped and beside Apache's own 5.5.0 NameServer.

Apache's standalone controller runs one group, ``broker-a``, of three 5.5.0 brokers (a master and two
slaves, every acknowledged message on all three: ``allAckInSyncStateSet``), registered with two of our
nodes and with Apache's NameServer; Kafka, Redis and the Spark job run as processes with every
``conf/`` value. FlowClients (``tests/peers/java/FlowClients.java``) produces a message every ~50 ms
and consumes them through our nodes. Each step is watched at every place at once (our nodes and
Apache's over TCP as a client reads them, Redis as the job wrote it), and the figures are printed side
by side:

* the master SIGKILLed: the controller sees its connections close and elects a slave, which registers
  as id 0; every node and Redis show it within ``EVERY_PLACE_S`` of the first of our nodes that does,
  and so does Apache's; the producer routes to it and every acknowledged message is consumed; the
  killed broker comes back as a slave;
* the new master SIGSTOPped: the controller elects another after its heartbeat timeout, which
  registers as id 0, within the same bound; the frozen one, thawed, registers as master with the
  state version it had, which our nodes refuse as Apache's does (no node of ours names it while the
  controller names another, unless Apache took that registration too: Apache's log says which it
  refused), until it registers again as a slave;
* no GROUP_WITHOUT_MASTER alert is left open for the group, which has a master again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.rocketmq import (
    Controller,
    ControllerGroup,
    FlowClients,
    compile_flow_clients,
    create_topic,
    freeze_broker,
    kill_broker,
    master_addr,
    replica_info,
    restart_broker,
    start_controller,
    start_controller_group,
    thaw_broker,
)
from namesrv.client import NameServerClient
from streaming.routes import RouteLookup
from tests.support.backends import ProcessInfra
from tests.support.liveness import bounds_now
from tests.support.report import report
from tests.support.rocketmq import ROCKETMQ_5, broker_topics, controller_master, elected, start_java_namesrv
from tests.support.system import SHIPPED, System
from tests.support.wait import wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.alone, pytest.mark.timeout(900)]

GROUP = "broker-a"
CLUSTER = "ControllerCluster"
TOPIC = "FailoverTopic"
#: every node and Redis show the new master within this long of the first of our nodes that does (on a
#: machine quiet enough to meet it: :func:`tests.support.liveness.bounds_now`)
EVERY_PLACE_S = 2.0
#: the controller hears of a SIGKILL from the closed connection, of a SIGSTOP after its heartbeat
#: timeout (controllerHeartBeatTimeoutMills, 10 s)
ELECTION_S = 60.0
#: how long after the thaw the stale master must not be id 0 anywhere
STALE_WATCH_S = 10.0
#: the group's GROUP_WITHOUT_MASTER resolved in Redis within this long of its master's return
ALERT_RESOLVED_S = 30.0


@dataclass
class World:
    base: Path
    system: System
    #: our nodes, then Apache's NameServer
    addrs: list[str]
    apache: str
    #: Apache's NameServer's log, where it says which registrations it refused
    apache_log: Path
    controller: Controller
    group: ControllerGroup
    lookup: RouteLookup
    flow_classes: Path

    @property
    def ours(self) -> list[str]:
        return self.system.node_addrs


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("controller")
    flow_classes = compile_flow_clients(base / "flow-classes")  # before the JVMs take the cores
    with ExitStack() as stack:
        system = System(ProcessInfra(base / "system"), base / "system", timing=SHIPPED)
        system.start()
        stack.callback(system.stop)
        apache = start_java_namesrv(ROCKETMQ_5, base, "apache-namesrv")
        stack.callback(apache.stop)
        addrs = [*system.node_addrs, apache.addr]
        controller = start_controller(base, addrs)
        stack.callback(controller.stop)
        group = start_controller_group(base, addrs, controller, name=GROUP, cluster=CLUSTER, members=3)
        stack.callback(group.stop)
        lookup = RouteLookup(system.redis_url)
        stack.callback(lookup.close)
        yield World(base, system, addrs, apache.addr, apache.process.log, controller, group, lookup, flow_classes)


def places(world: World) -> dict[str, Callable[[], str | None]]:
    """Where a user reads the group's master, each read as a user reads it."""

    def redis() -> str | None:
        info = world.lookup.cluster_info()
        data = None if info is None else info.broker_addr_table.get(GROUP)
        return None if data is None else data.broker_addrs.get(0)

    out: dict[str, Callable[[], str | None]] = {
        f"node-{i + 1}": (lambda a=a: master_addr(a, GROUP)) for i, a in enumerate(world.ours)
    }
    out["redis"] = redis
    out["apache"] = lambda: master_addr(world.apache, GROUP)
    return out


def seen_as_master(world: World, addr: str, timeout: float) -> dict[str, float]:
    """Place -> when (wall s) it first named ``addr`` the group's master; polled at every place together."""
    readers, first = places(world), {}
    deadline = time.monotonic() + timeout
    while len(first) < len(readers) and time.monotonic() < deadline:
        for place, read in readers.items():
            if place not in first and read() == addr:
                first[place] = time.time()
        time.sleep(0.05)
    assert len(first) == len(readers), f"{addr} as {GROUP}'s master only at {sorted(first)} within {timeout:g} s"
    return first


def elected_in_place_of(world: World, not_addr: str) -> tuple[str, float]:
    """The member the controller elects in place of ``not_addr``, and when (wall s) it was seen elected."""
    addr = elected(world.controller, GROUP, not_addr, ELECTION_S)
    assert addr in {b.addr for b in world.group.brokers if b.addr != not_addr}
    return addr, time.time()


def check_and_report(step: str, since: float, first: dict[str, float], world: World) -> None:
    """Every place within EVERY_PLACE_S of the first of our nodes; the figures side by side."""
    registered = min(first[f"node-{i + 1}"] for i in range(len(world.ours)))
    (bound_ms,) = bounds_now(EVERY_PLACE_S)
    report(f"{step}: election -> id 0 at " + ", ".join(f"{p} {first[p] - since:.2f} s" for p in sorted(first))
           + f" (every place within {bound_ms / 1000:g} s of our first node)")  # fmt: skip
    late = {p: round(t - registered, 2) for p, t in first.items() if (t - registered) * 1000 > bound_ms}
    assert not late, f"{step}: later than {bound_ms / 1000:g} s after the registration at our first node: {late}"


def members_at(addr: str) -> dict[int, str]:
    """broker id -> address of the group's members, as the name server at ``addr`` lists them."""
    with NameServerClient(addr, timeout=3.0) as c:
        data = c.cluster_info().broker_addr_table.get(GROUP)
    return {} if data is None else dict(data.broker_addrs)


def refusals_at_apache(world: World, addr: str) -> int:
    """How many registrations of ``addr`` Apache's NameServer has refused as stale, from its own log."""
    text = world.apache_log.read_text(errors="replace")
    return sum(f"New BrokerAddr:{addr}," in line for line in text.splitlines() if "Registered Broker conflicts" in line)


def open_group_alerts(world: World) -> list[str]:
    return [
        a.message for a in world.lookup.alerts() if str(a.kind) == "GROUP_WITHOUT_MASTER" and a.broker_name == GROUP
    ]


def test_a_killed_then_a_frozen_master_is_replaced_everywhere_and_the_stale_one_refused(world: World):
    old = world.group.brokers[0]
    assert {p: read() for p, read in places(world).items()} == dict.fromkeys(places(world), old.addr)
    create_topic(world.ours[0], TOPIC, [CLUSTER], base=world.base)
    # whichever slave is elected must already hold the topic to register it as master
    wait_until(lambda: all(TOPIC in broker_topics(b) for b in world.group.brokers[1:]), 60, f"{TOPIC} on the slaves")

    flow = FlowClients.start(world.base, ";".join(world.ours), TOPIC, classes=world.flow_classes)
    try:
        wait_until(lambda: len(flow.received()) >= 40, 60, "the flow under way", state=flow.errors)
        assert {group for _, route in flow.routes() for group in route.items()} == {(GROUP, old.addr)}

        kill_broker(old)
        killed_at_ms = int(time.time() * 1000)
        new, election = elected_in_place_of(world, old.addr)
        check_and_report("master killed", election, seen_as_master(world, new, ELECTION_S), world)

        wait_until(lambda: any(r.get(GROUP) == new for _, r in flow.routes()), 30, "the producer's route to name it")
        wait_until(
            lambda: any(ms > killed_at_ms for _, _, ms in flow.acks().values()),
            30,
            "an acknowledgement after the kill",
            state=flow.errors,
        )
        acked = flow.acked()
        wait_until(
            lambda: acked <= flow.received(),
            60,
            f"every one of {len(acked)} acknowledged messages consumed",
            state=lambda: sorted(acked - flow.received())[:20],
        )
    finally:
        flow.stop()

    restart_broker(old)
    assert old.broker_id != 0, "the former master came back as a slave"
    members = members_at(world.ours[1])
    assert members[0] == new and old.addr in members.values()

    # the controller elects only a member in sync: wait until a slave is (RocketMQ may leave one out for
    # minutes after the old master's restart, which is its own matter: the next step needs just one)
    wait_until(
        lambda: (i := replica_info(world.controller, GROUP)) is not None and len(i.sync_state_set) >= 2,
        120,
        f"a slave of {GROUP} in sync again",
        state=lambda: replica_info(world.controller, GROUP),
    )
    frozen = next(b for b in world.group.brokers if b.addr == new)
    refused_before = refusals_at_apache(world, frozen.addr)
    freeze_broker(frozen)
    try:
        newer, election = elected_in_place_of(world, frozen.addr)
        check_and_report("master frozen", election, seen_as_master(world, newer, ELECTION_S), world)
    finally:
        thaw_broker(frozen)
    thawed = time.monotonic()
    # stale: a place names the thawed member as master while the controller names another.  A place
    # naming a third member is no stale registration: the controller may elect again on a loaded
    # machine, and a place may show that before the others
    stale: list[tuple[float, dict[str, str | None]]] = []
    while time.monotonic() - thawed < STALE_WATCH_S:
        masters = {p: read() for p, read in places(world).items()}
        if frozen.addr in masters.values() and controller_master(world.controller, GROUP) != frozen.addr:
            stale.append((round(time.monotonic() - thawed, 2), masters))
        time.sleep(0.1)
    # The rule is Apache's: a registration as id 0 is refused while the member there has a higher state
    # version. Some thawed brokers' first registration passes it: every name server, Apache's too, then
    # names the thawed broker for a moment, until it registers as a slave. So a node of ours naming it
    # fails only where Apache's log says it refused that broker's registration
    refused = refusals_at_apache(world, frozen.addr) - refused_before
    ours_stale = [(t, m) for t, m in stale if frozen.addr in (m[f"node-{i + 1}"] for i in range(len(world.ours)))]
    if ours_stale and not refused:
        report(
            f"master frozen: the thawed broker was master at every name server for a moment, Apache's too: {stale[0]}"
        )
    else:
        assert not ours_stale, (
            f"the thawed master's stale registration was taken where Apache refused it {refused} time(s): "
            f"first {ours_stale[0]}, {len(ours_stale)} looks"
        )
    wait_until(
        lambda: (current := controller_master(world.controller, GROUP)) not in (None, frozen.addr)
        and all(frozen.addr in (m := members_at(a)).values() and m.get(0) == current for a in world.addrs),
        60,
        f"{frozen.addr} back as a slave of the controller's master at every name server",
        state=lambda: (controller_master(world.controller, GROUP), {a: members_at(a) for a in world.addrs}),
    )
    report(f"master frozen: thawed -> registered as a slave everywhere {time.monotonic() - thawed:.1f} s")
    if (current := controller_master(world.controller, GROUP)) != newer:
        report(f"master frozen: the controller elected {current} after {newer} meanwhile")

    wait_until(lambda: not open_group_alerts(world), ALERT_RESOLVED_S, f"no GROUP_WITHOUT_MASTER open for {GROUP}",
               state=lambda: open_group_alerts(world))  # fmt: skip
