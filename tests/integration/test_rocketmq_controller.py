"""A 5.5.0 broker group in controller mode loses its master: Apache's controller elects a slave, the new
master registers with our nodes as id 0, and no acknowledged message is lost.

Apache's standalone controller runs one group, ``broker-a``, of three 5.5.0 brokers (a master and two
slaves, every acknowledged message on all three: ``allAckInSyncStateSet``), registered with two of our
nodes.  FlowClients (``tests/peers/java/FlowClients.java``) produces a message every ~50 ms and
consumes them through both nodes.  The master is SIGKILLed; the controller sees its connection close
and elects a slave, which registers with our nodes as the group's master.  The steps: every node lists
the new master within 2 s of the first that does; the producer's route names it and its sends go on;
every message acknowledged is consumed; the killed broker comes back as a slave.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
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
    kill_broker,
    master_addr,
    replica_info,
    restart_broker,
    start_controller,
    start_controller_group,
)
from namesrv.client import NameServerClient
from tests.support.node import running_node
from tests.support.rocketmq import broker_topics
from tests.support.wait import wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(420)]

GROUP = "broker-a"
CLUSTER = "ControllerCluster"
TOPIC = "FailoverTopic"
#: every node lists the new master within this long of the first node that does
EVERY_NODE_S = 2.0
#: the controller hears of a SIGKILL from the closed connection, not a heartbeat timeout
ELECTION_S = 30.0


@dataclass
class World:
    base: Path
    addrs: list[str]
    controller: Controller
    group: ControllerGroup
    flow_classes: Path


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    flow_classes = compile_flow_clients(tmp_path / "flow-classes")  # before the JVMs take the cores
    with ExitStack() as stack:
        addrs = []
        for name in ("node-1", "node-2"):
            (tmp_path / name).mkdir()
            addrs.append(stack.enter_context(running_node(tmp_path / name)).addr)
        controller = start_controller(tmp_path, addrs)
        stack.callback(controller.stop)
        group = start_controller_group(tmp_path, addrs, controller, name=GROUP, cluster=CLUSTER, members=3)
        stack.callback(group.stop)
        yield World(tmp_path, addrs, controller, group, flow_classes)


def masters(addrs: list[str]) -> dict[str, str | None]:
    return {a: master_addr(a, GROUP) for a in addrs}


def test_the_controller_elects_a_slave_and_no_acknowledged_message_is_lost(world: World):
    old = world.group.brokers[0]
    assert masters(world.addrs) == dict.fromkeys(world.addrs, old.addr)
    create_topic(world.addrs[0], TOPIC, [CLUSTER], base=world.base)
    # whichever slave is elected must already hold the topic to register it as master
    wait_until(lambda: all(TOPIC in broker_topics(b) for b in world.group.brokers[1:]), 60, f"{TOPIC} on the slaves")

    flow = FlowClients.start(world.base, ";".join(world.addrs), TOPIC, classes=world.flow_classes)
    try:
        wait_until(lambda: len(flow.received()) >= 40, 60, "the flow under way", state=flow.errors)
        assert {group for _, route in flow.routes() for group in route.items()} == {(GROUP, old.addr)}

        kill_broker(old)
        killed_at_ms = int(time.time() * 1000)
        elected = wait_until(
            lambda: (info := replica_info(world.controller, GROUP)) is not None
            and info.master_addr not in (None, old.addr)
            and info,
            ELECTION_S,
            "the controller to elect a slave",
            state=lambda: replica_info(world.controller, GROUP),
        )
        new = elected.master_addr
        assert new in {b.addr for b in world.group.brokers[1:]}

        wait_until(lambda: new in masters(world.addrs).values(), ELECTION_S, f"{new} at a node as id 0")
        wait_until(
            lambda: set(masters(world.addrs).values()) == {new},
            EVERY_NODE_S,
            f"{new} at every node as id 0 within {EVERY_NODE_S:g} s of the first",
            state=lambda: masters(world.addrs),
        )

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
    with NameServerClient(world.addrs[1], timeout=3.0) as c:
        members = c.cluster_info().broker_addr_table[GROUP].broker_addrs
    assert members[0] == new and old.addr in members.values()
