"""A real 5.5.0 master/slave group loses its master: reads go on from the slave, and our node's routes
equal Apache's 5.5.0 NameServer's at every step.

One group, ``broker-a``: a master (brokerId 0) and a slave (brokerId 1) of Apache RocketMQ 5.5.0,
registered with one of our nodes and with Apache's NameServer of the same release, both standalone.
The steps: both members registered, a topic on both, messages produced and copied to the slave; the
master SIGKILLed (its kernel closes its sockets, so both name servers drop it at once); a consumer
reads everything from the slave (``slaveReadEnable=true``); no producer can write; the slave
registers alone; the master comes back.  At each step the answers are compared parsed:
GET_BROKER_CLUSTER_INFO and the route of every topic either lists.  ``docs/internals/testing.md``
says how a dead master leaves the routes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from common.protocol import fastjson
from common.protocol.codes import RequestCode, Version
from namesrv.client import NameServerClient
from tests.support.node import NodeThread, running_node
from tests.support.rocketmq import (
    ROCKETMQ_5,
    JavaBroker,
    JavaNamesrv,
    broker_runtime_info,
    broker_topics,
    client_probe,
    compile_client_probe,
    exchange_frame,
    java_broker,
    java_namesrv,
    mqadmin,
    restart_broker,
    split_frame,
)
from tests.support.wait import wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(600)]

TOPIC = "GroupTopic"
MESSAGES = 24
QUEUES = 4
#: RocketMQ's read and write permission bits (PermName): 6 = read + write
PERM_READ_WRITE = 6
#: how soon a killed broker must be gone: far below the 120 s of silence after which the expiry scan drops it
CLOSE_S = 10
#: both brokers serve pulls (a slave refuses them otherwise) and re-register every 10 s, the least RocketMQ allows
GROUP_CONF = {"slaveReadEnable": "true", "registerNameServerPeriod": "10000"}


@dataclass
class Group:
    base: Path
    node: NodeThread
    java: JavaNamesrv
    master: JavaBroker
    slave: JavaBroker
    probe_classes: Path

    def namesrvs(self) -> dict[str, str]:
        return {"node": self.node.addr, "Java 5.5.0": self.java.addr}

    def mqadmin(self, *args: str) -> str:
        done = mqadmin(ROCKETMQ_5, self.base, *args)
        assert done.returncode == 0, f"mqadmin {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        return done.stdout


@pytest.fixture(scope="module")
def group(tmp_path_factory) -> Iterator[Group]:
    base = tmp_path_factory.mktemp("master-slave")
    classes = compile_client_probe(ROCKETMQ_5, base / "probe-classes")  # before the JVMs: two cores
    with ExitStack() as stack:
        (base / "node").mkdir()
        node = stack.enter_context(running_node(base / "node"))
        java = stack.enter_context(java_namesrv(ROCKETMQ_5, base, "namesrv"))
        addrs = [node.addr, java.addr]
        master = stack.enter_context(java_broker(ROCKETMQ_5, base, addrs, broker_id=0, extra=GROUP_CONF))
        slave = stack.enter_context(java_broker(ROCKETMQ_5, base, addrs, broker_id=1, extra=GROUP_CONF))
        yield Group(base, node, java, master, slave, classes)


# --------------------------------------------------------------------------- comparing the two name servers


def answer(addr: str, code: int, ext: dict[str, str] | None = None) -> tuple[dict, Any]:
    """One answer, parsed: its header without the version stamp, and its body as fastjson reads it."""
    header, body = split_frame(exchange_frame(addr, code, ext, version=int(Version.CURRENT)))
    header.pop("version")
    return header, fastjson.loads(body) if body else None


def answers(addr: str) -> dict[str, tuple[dict, Any]]:
    """Cluster info and the route of every topic the name server lists, by what was asked."""
    out = {"clusterList": answer(addr, RequestCode.GET_BROKER_CLUSTER_INFO)}
    _, topics = answer(addr, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    for topic in sorted(topics["topicList"]):
        out[f"topicRoute {topic}"] = answer(addr, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    return out


def members(addr: str) -> dict[int, str] | None:
    """The group's members by broker id, as the name server at ``addr`` lists them (None: no group)."""
    with NameServerClient(addr, timeout=3.0) as c:
        data = c.cluster_info().broker_addr_table.get("broker-a")
    return None if data is None else data.broker_addrs


def same_routes(group: Group, step: str) -> dict[str, tuple[dict, Any]]:
    """Wait until our node's answers equal the Java NameServer's (both got the same registrations); ours."""
    seen: dict[str, dict] = {}

    def equal() -> bool:
        seen["node"], seen["java"] = answers(group.node.addr), answers(group.java.addr)
        return seen["node"] == seen["java"]

    def differences() -> dict[str, Any]:
        ours, java = seen.get("node", {}), seen.get("java", {})
        return {k: {"node": ours.get(k), "java": java.get(k)} for k in sorted(ours.keys() | java.keys())
                if ours.get(k) != java.get(k)}  # fmt: skip

    wait_until(equal, 40, f"our node's routes equal the Java NameServer's ({step})", interval=0.5, state=differences)
    return seen["node"]


def route_of(seen: dict[str, tuple[dict, Any]], topic: str) -> dict:
    header, body = seen[f"topicRoute {topic}"]
    assert header["code"] == 0, header
    return body


def by_id(broker_addrs: dict) -> dict[int, str]:
    """brokerAddrs with integer ids: a route in standard JSON writes them as strings, cluster info bare."""
    return {int(k): v for k, v in broker_addrs.items()}


def caught_up(slave: JavaBroker, master: JavaBroker) -> bool:
    """The slave holds the master's whole commit log, and has indexed it into its consume queues."""
    ours, theirs = broker_runtime_info(slave), broker_runtime_info(master)
    return (
        ours is not None
        and theirs is not None
        and ours["commitLogMaxOffset"] == theirs["commitLogMaxOffset"]
        and ours["dispatchBehindBytes"] == "0"
    )


# --------------------------------------------------------------------------- the scenario


def test_master_killed_reads_go_on_from_the_slave_and_routes_equal_java_at_each_step(group):
    master, slave = group.master, group.slave
    both = {0: master.addr, 1: slave.addr}

    # 1. both members registered with both name servers; a topic on both. mqadmin's -c writes it to the
    # cluster's masters only, and a 5.5.0 slave copies its master's topics once a minute (the first time
    # 10 s after its start, maybe before it knew its master), so the slave gets it by address as well
    queues = ("-t", TOPIC, "-r", str(QUEUES), "-w", str(QUEUES))
    out = group.mqadmin("updateTopic", "-n", group.node.addr, "-c", master.cluster, *queues)
    assert f"create topic to {master.addr} success" in out, out
    assert slave.addr not in out
    out = group.mqadmin("updateTopic", "-n", group.node.addr, "-b", slave.addr, *queues)
    assert f"create topic to {slave.addr} success" in out, out
    assert {TOPIC in broker_topics(b) for b in (master, slave)} == {True}
    seen = same_routes(group, "both members")
    cluster = seen["clusterList"][1]
    assert cluster["clusterAddrTable"] == {master.cluster: ["broker-a"]}
    assert cluster["brokerAddrTable"]["broker-a"]["brokerAddrs"] == both
    route = route_of(seen, TOPIC)
    assert [by_id(b["brokerAddrs"]) for b in route["brokerDatas"]] == [both]
    assert [(q["brokerName"], q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in route["queueDatas"]] == [
        ("broker-a", QUEUES, QUEUES, PERM_READ_WRITE)
    ]

    # 2. messages produced through our node go to the master, which copies them to the slave
    common = ("--topic", TOPIC, "--count", str(MESSAGES))
    code, sent = client_probe(ROCKETMQ_5, group.probe_classes, group.base, "produce", "--namesrv", group.node.addr,
                              *common)  # fmt: skip
    assert code == 0 and sent["ok"], sent
    assert {(s["broker"], s["queue"]) for s in sent["sent"]} == {("broker-a", q) for q in range(QUEUES)}
    wait_until(lambda: caught_up(slave, master), 40, "the slave holding every message the master stored")
    before = broker_runtime_info(slave)
    assert before is not None

    # 3. the master is SIGKILLed: the kernel closes its connections, and each name server drops it at
    # once (a removal within CLOSE_S cannot be the expiry scan's, which waits for 120 s of silence)
    master.stop()
    for label, addr in group.namesrvs().items():
        wait_until(lambda a=addr: members(a) == {1: slave.addr}, CLOSE_S, f"the master gone from {label}",
                   interval=0.05, state=lambda a=addr: members(a))  # fmt: skip
    seen = same_routes(group, "master gone")
    cluster = seen["clusterList"][1]
    assert cluster["clusterAddrTable"] == {master.cluster: ["broker-a"]}
    assert cluster["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {1: slave.addr}
    route = route_of(seen, TOPIC)
    # the group's queues stay (its slave is alive), still writable in the route: the group has no acting
    # master (enableSlaveActingMaster is off), so neither name server wipes their write permission
    assert [by_id(b["brokerAddrs"]) for b in route["brokerDatas"]] == [{1: slave.addr}]
    assert [(q["brokerName"], q["perm"]) for q in route["queueDatas"]] == [("broker-a", PERM_READ_WRITE)]

    # 4. a consumer given only our node reads every message, from the slave (the only member left)
    code, got = client_probe(ROCKETMQ_5, group.probe_classes, group.base, "consume", "--namesrv", group.node.addr,
                             *common, "--timeout-ms", "60000")  # fmt: skip
    assert code == 0 and got["ok"], got
    assert sorted(got["queues"]) == sorted(f"broker-a:{q}" for q in range(QUEUES))
    assert sorted(got["bodies"]) == sorted(s["body"] for s in sent["sent"])
    after = broker_runtime_info(slave)
    assert after is not None
    assert int(after["msgGetTotalTodayNow"]) - int(before["msgGetTotalTodayNow"]) >= MESSAGES, (before, after)

    # 5. nothing can be written: a producer keeps only the queues of groups with a master in the route
    code, refused = client_probe(ROCKETMQ_5, group.probe_classes, group.base, "produce", "--namesrv",
                                 group.node.addr, "--topic", TOPIC, "--count", "1")  # fmt: skip
    assert code == 1 and not refused["ok"] and not refused["sent"], refused
    assert f"No route info of this topic: {TOPIC}" in refused["error"], refused

    # 6. the slave registers again on its own (every 10 s), now the group's smallest id, so its own
    # topic table is applied: still only the slave, and still the same routes on both
    routes = group.node.running.context.routes
    since = group.node.call(routes.now_ms)
    wait_until(lambda: (group.node.call(routes.last_seen, slave.cluster, slave.addr) or 0) > since, 40,
               "the slave's next registration at our node")  # fmt: skip
    seen = same_routes(group, "slave alone, registered again")
    assert seen["clusterList"][1]["brokerAddrTable"]["broker-a"]["brokerAddrs"] == {1: slave.addr}
    assert [(q["brokerName"], q["perm"]) for q in route_of(seen, TOPIC)["queueDatas"]] == [
        ("broker-a", PERM_READ_WRITE)
    ]

    # 7. the master comes back on its address, with its store: both members again on both name servers,
    # the same routes, and writes go through our node's route again
    restart_broker(master)
    seen = same_routes(group, "master back")
    assert seen["clusterList"][1]["brokerAddrTable"]["broker-a"]["brokerAddrs"] == both
    assert [by_id(b["brokerAddrs"]) for b in route_of(seen, TOPIC)["brokerDatas"]] == [both]
    code, sent = client_probe(ROCKETMQ_5, group.probe_classes, group.base, "produce", "--namesrv", group.node.addr,
                              "--topic", TOPIC, "--count", "4")  # fmt: skip
    assert code == 0 and sent["ok"], sent
