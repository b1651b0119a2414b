"""Apache RocketMQ's own brokers, Java client, mqadmin and NameServers against our nodes.

One world per release, shared by the module's tests so its JVMs start once: two of our nodes (A
and B, in this process), Apache's NameServer of that release, and one broker of that release
registered with all of them. The broker is also given a third node with ``aclEnable=true`` and nobody
whitelisted, which it cannot register with since it signs nothing (the last test). The 4.x world also runs Apache's 5.5.0 NameServer, because 5.5.0 is the
release our node matches byte for byte (the spec's 5.3.3 answers with 5.5.0's version stamp); the 4.9.7 NameServer's
answers must then equal ours apart from what 5.0 changed (``FIVE_ZERO``). The jars are the pinned
ones ``make setup`` resolved (:mod:`tests.support.rocketmq`).

The comparisons run once every name server holds the same DataVersion for the broker (asked with
QUERY_DATA_VERSION), i.e. after the same registrations reached all of them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from common.protocol import fastjson
from common.protocol.codes import RequestCode, Version
from namesrv.acl import BROKER_WARNING_S
from namesrv.client import NameServerClient
from tests.support.node import NodeThread, running_node
from tests.support.rocketmq import (
    ROCKETMQ_4,
    ROCKETMQ_5,
    JavaBroker,
    JavaNamesrv,
    Release,
    broker_runtime_info,
    client_probe,
    compile_client_probe,
    exchange_frame,
    java_broker,
    java_namesrv,
    mqadmin,
    registered,
    split_frame,
    stored_data_version,
)
from tests.support.wait import wait_until

pytestmark = [pytest.mark.rocketmq, pytest.mark.timeout(600)]

#: a Java client of 4.9.4 or later gets standard JSON routes, an older one (and the C++ client) legacy
JAVA_CLIENT, OLD_CLIENT = int(Version.CURRENT), 63
MESSAGES = 40
KV = ("RealNamespace", "realKey", "a value/with:{json} characters")
#: the broker's registration period: RocketMQ's shortest (its default is 30 s, the first repeat comes 10 s
#: after start-up either way), so an ACL node sees it retry within a test's patience
REGISTER_PERIOD_MS = 10_000
#: the ACL node's accounts file at first: ACL on, no account, nobody whitelisted (RocketMQ's own is empty)
NOBODY_LISTED = "globalWhiteRemoteAddresses: []\naccounts: []\n"


class Records(logging.Handler):
    """Every record of a logger, kept for the assertions (the node logs from its own thread)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.DEBUG) -> list[str]:
        return [r.getMessage() for r in list(self.records) if r.levelno >= level]


@dataclass
class World:
    release: Release
    base: Path
    a: NodeThread
    b: NodeThread
    #: Apache's NameServer of the release
    java: JavaNamesrv
    #: Apache's 5.5.0 NameServer (the same one in the 5.x world)
    java5: JavaNamesrv
    broker: JavaBroker
    probe_classes: Path
    #: our node with aclEnable=true, which the broker is given too, and its accounts file
    acl: NodeThread
    acl_file: Path
    #: everything the ACL node's refusals logged (logger namesrv.acl, from DEBUG up) while the world lived
    acl_log: Records

    def namesrvs(self) -> dict[str, str]:
        """Every name server the broker registered with, by label (one Java NameServer in the 5.x world);
        not the ACL node, which refuses it."""
        return {
            "node A": self.a.addr,
            "node B": self.b.addr,
            f"Java {self.java.release.server_version}": self.java.addr,
            f"Java {self.java5.release.server_version}": self.java5.addr,
        }

    def mqadmin(self, *args: str) -> str:
        done = mqadmin(self.release, self.base, *args)
        assert done.returncode == 0, f"mqadmin {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        return done.stdout


@pytest.fixture(
    scope="module",
    params=[pytest.param(ROCKETMQ_5, id="rocketmq-5"), pytest.param(ROCKETMQ_4, id="rocketmq-4")],
)
def world(request, tmp_path_factory) -> Iterator[World]:
    release: Release = request.param
    base = tmp_path_factory.mktemp(release.server_module)
    # javac first: it would compete with the JVMs starting below for the two cores
    classes = compile_client_probe(release, base / "probe-classes")
    acl_file = base / "plain_acl.yml"
    acl_file.write_text(NOBODY_LISTED)
    acl_log, acl_logger = Records(), logging.getLogger("namesrv.acl")
    with ExitStack() as stack:
        for home in ("node-a", "node-b", "node-acl"):
            (base / home).mkdir()
        a = stack.enter_context(running_node(base / "node-a"))
        b = stack.enter_context(running_node(base / "node-b"))
        # a changed accounts file is read again within 0.2 s
        acl_props = {"aclEnable": "true", "aclFile": str(acl_file), "aclReloadIntervalMillis": "200"}
        acl = stack.enter_context(running_node(base / "node-acl", **acl_props))
        java = stack.enter_context(java_namesrv(release, base, "namesrv"))
        java5 = java if release == ROCKETMQ_5 else stack.enter_context(java_namesrv(ROCKETMQ_5, base, "namesrv-5"))
        addrs = list(dict.fromkeys([a.addr, b.addr, java.addr, java5.addr]))
        # a repeated refusal is logged at DEBUG: kept here to see that the broker tried again
        level = acl_logger.level
        acl_logger.setLevel(logging.DEBUG)
        acl_logger.addHandler(acl_log)
        stack.callback(acl_logger.setLevel, level)
        stack.callback(acl_logger.removeHandler, acl_log)
        broker = stack.enter_context(
            java_broker(
                release,
                base,
                [*addrs, acl.addr],
                refused_by=[acl.addr],
                extra={"registerNameServerPeriod": str(REGISTER_PERIOD_MS)},
            )
        )
        yield World(release, base, a, b, java, java5, broker, classes, acl, acl_file, acl_log)


def settled(world: World) -> None:
    """Wait until every name server holds the broker's latest DataVersion (the same registrations arrived)."""

    def versions() -> dict[str, Any]:
        return {label: stored_data_version(addr, world.broker) for label, addr in world.namesrvs().items()}

    def same() -> bool:
        seen = set(versions().values())
        return len(seen) == 1 and None not in seen

    wait_until(
        same,
        30,
        "the same DataVersion of the broker on every name server",
        state=versions,
    )


# --------------------------------------------------------------------------- registration


def test_broker_registers_with_both_nodes_and_the_java_namesrvs(world):
    broker = world.broker
    for label, addr in world.namesrvs().items():
        with NameServerClient(addr) as c:
            info = c.cluster_info()
            # every broker has a topic named after itself, and one named after its cluster
            own = c.topic_route(broker.name)
        assert info.cluster_addr_table == {broker.cluster: [broker.name]}, label
        assert info.broker_addr_table[broker.name].broker_addrs == {0: broker.addr}, label
        assert [b.broker_addrs for b in own.broker_datas] == [{0: broker.addr}], label
        assert [q.broker_name for q in own.queue_datas] == [broker.name], label
    settled(world)


def test_mqadmin_lists_the_cluster_through_our_node(world):
    broker = world.broker
    version = "V" + world.release.server_version.replace(".", "_")
    # mqadmin shows what the broker itself says about its version, asked at the address our node gave
    info = wait_until(lambda: broker_runtime_info(broker), 30, f"runtime info from the broker at {broker.addr}")
    assert info["brokerVersionDesc"] == version
    out = world.mqadmin("clusterList", "-n", world.a.addr)
    assert re.search(rf"^{broker.cluster}\s+{broker.name}\s+0\s+{re.escape(broker.addr)}\s+{version}\s", out, re.M), out


# --------------------------------------------------------------------------- messages


def test_java_producer_through_node_a_and_consumer_through_node_b(world):
    topic, broker = "RealTopic", world.broker
    out = world.mqadmin("updateTopic", "-n", world.a.addr, "-c", broker.cluster, "-t", topic, "-r", "4", "-w", "4")
    assert f"create topic to {broker.addr} success" in out, out

    def queues_on_b() -> list[tuple[str, int, int, int]]:
        with NameServerClient(world.b.addr) as c:
            if topic not in c.topic_list():
                return []
            route = c.topic_route(topic)
        return [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas]

    # mqadmin asked node A for the cluster; node B hears of the topic from the broker only
    wait_until(lambda: queues_on_b() == [(broker.name, 4, 4, 6)], 30, f"{topic} in node B's routes", state=queues_on_b)

    common = ("--topic", topic, "--count", str(MESSAGES))
    code, sent = client_probe(
        world.release, world.probe_classes, world.base, "produce", "--namesrv", world.a.addr, *common
    )
    assert code == 0 and sent["ok"], sent
    assert [s["status"] for s in sent["sent"]] == ["SEND_OK"] * MESSAGES
    # the producer spread its sends over every write queue of the route node A gave it
    assert {(s["broker"], s["queue"]) for s in sent["sent"]} == {(broker.name, q) for q in range(4)}

    code, got = client_probe(
        world.release, world.probe_classes, world.base, "consume", "--namesrv", world.b.addr, *common,
        "--timeout-ms", "60000",
    )  # fmt: skip
    assert code == 0 and got["ok"], got
    assert sorted(got["queues"]) == sorted(f"{broker.name}:{q}" for q in range(4))
    assert sorted(got["bodies"]) == sorted(s["body"] for s in sent["sent"])


# --------------------------------------------------------------------------- the same answers as Java

#: what the 4.9.7 NameServer answers differently from 5.5.0, by design of 5.0: its own version stamp
#: in every header, no BrokerData.enableActingMaster (RIP-32), and the FAQ link of TOPIC_NOT_EXIST
FIVE_ZERO = {
    "remark": ("https://rocketmq.apache.org/docs/bestPractice/06FAQ", "http://rocketmq.apache.org/docs/faq/"),
    "body key": "enableActingMaster",
}


def _as_4x(frame: bytes) -> tuple[dict, Any]:
    header, body = split_frame(frame)
    header.pop("version")
    if "remark" in header:
        header["remark"] = header["remark"].replace(*FIVE_ZERO["remark"])
    return header, _without(fastjson.loads(body), FIVE_ZERO["body key"]) if body else None


def _without(value: Any, key: str) -> Any:
    if isinstance(value, dict):
        return {k: _without(v, key) for k, v in value.items() if k != key}
    if isinstance(value, list):
        return [_without(v, key) for v in value]
    return value


def _show(frame: bytes) -> str:
    header, body = split_frame(frame)
    return f"{header} {body.decode(errors='replace')}"


def assert_same_answer(world: World, code: int, ext: dict[str, str] | None = None, *, version: int) -> bytes:
    """Our node's answer equals Apache 5.5.0's byte for byte, and the release's own NameServer's up to FIVE_ZERO."""
    ours = exchange_frame(world.a.addr, code, ext, version=version)
    java5 = exchange_frame(world.java5.addr, code, ext, version=version)
    assert ours == java5, f"code {code} {ext} v{version}\n ours: {_show(ours)}\n java: {_show(java5)}"
    assert exchange_frame(world.b.addr, code, ext, version=version) == ours, "node B answers as node A"
    if world.java is not world.java5:
        java = exchange_frame(world.java.addr, code, ext, version=version)
        assert _as_4x(ours) == _as_4x(java), f"code {code} {ext} v{version}\n ours: {_show(ours)}\n java: {_show(java)}"
    return ours


def test_cluster_list_is_the_same_as_java(world):
    settled(world)
    for version in (JAVA_CLIENT, OLD_CLIENT):
        frame = assert_same_answer(world, RequestCode.GET_BROKER_CLUSTER_INFO, version=version)
        # legacy fastjson for every client version: the broker id is a bare number
        assert f'"brokerAddrs":{{0:"{world.broker.addr}"}}'.encode() in frame


def test_topic_routes_are_the_same_as_java(world):
    settled(world)
    with NameServerClient(world.java.addr) as c:
        topics = sorted(c.topic_list())
    assert world.broker.name in topics and "TBW102" in topics
    for topic in topics:
        for version in (JAVA_CLIENT, OLD_CLIENT):
            assert_same_answer(world, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, version=version)
    frame = assert_same_answer(world, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "NoSuchTopic"}, version=JAVA_CLIENT)
    assert split_frame(frame)[0]["code"] == 17


@pytest.mark.parametrize(
    "code, ext",
    [(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, None), (RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": ""})],
    ids=["all", "by-cluster"],
)
def test_topic_lists_are_the_same_as_java(world, code, ext):
    """The same topics; in any order (a Java HashSet's: the spec does not fix it)."""
    settled(world)
    if ext is not None:
        ext = {"cluster": world.broker.cluster}
    answers = {}
    for label, addr in world.namesrvs().items():
        header, body = split_frame(exchange_frame(addr, code, ext, version=JAVA_CLIENT))
        header.pop("version")
        topics = fastjson.loads(body)["topicList"]
        assert len(topics) == len(set(topics)), (label, topics)
        answers[label] = (header, sorted(topics))
    ours = answers["node A"]
    assert ours[0]["code"] == 0
    for label, answer in answers.items():
        assert answer == ours, f"{label}: {answer}\n node A: {ours}"


@pytest.fixture(scope="module")
def kv_everywhere(world: World) -> tuple[str, str, str]:
    """KV put by mqadmin into every name server of the world at once (it sends PUT_KV_CONFIG to each)."""
    namespace, key, value = KV
    world.mqadmin("updateKvConfig", "-n", ";".join(world.namesrvs().values()), "-s", namespace, "-k", key, "-v", value)
    return KV


def test_kv_config_is_the_same_as_java(world, kv_everywhere):
    namespace, key, value = kv_everywhere
    frame = assert_same_answer(
        world, RequestCode.GET_KV_CONFIG, {"namespace": namespace, "key": key}, version=JAVA_CLIENT
    )
    assert split_frame(frame)[0]["extFields"] == {"value": value}
    missing = {"namespace": namespace, "key": "noSuchKey"}
    frame = assert_same_answer(world, RequestCode.GET_KV_CONFIG, missing, version=JAVA_CLIENT)
    assert split_frame(frame)[0]["code"] == 22
    assert_same_answer(world, RequestCode.GET_KV_CONFIG, {"namespace": "NoSuchNs", "key": key}, version=JAVA_CLIENT)
    frame = assert_same_answer(
        world, RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": namespace}, version=JAVA_CLIENT
    )
    assert fastjson.loads(split_frame(frame)[1]) == {"table": {key: value}}


def test_mqadmin_reads_the_same_from_our_node_as_from_java(world):
    """mqadmin's own rendering of a route and of the topic list, through our node and through Java's."""
    settled(world)
    topic = world.broker.cluster
    ours, java = (world.mqadmin("topicRoute", "-n", addr, "-t", topic) for addr in (world.a.addr, world.java.addr))
    assert world.broker.addr in ours
    assert ours == java
    ours, java = (world.mqadmin("topicList", "-n", addr) for addr in (world.a.addr, world.java.addr))
    assert world.broker.name in ours.split()
    assert sorted(ours.split()) == sorted(java.split())


# --------------------------------------------------------------------------- a node with ACL on

#: the one WARNING the ACL node gives about a broker it refuses: who, from where, and what to change where
REFUSED_BROKER = re.compile(
    r"refused broker (?P<name>\S+) at (?P<addr>\S+) \(cluster (?P<cluster>\S+), connected from (?P<peer>\S+)\):"
    r" No accessKey is configured: request code=103 .*; to let it register,"
    r" list its address (?P<listed>\S+) in globalWhiteRemoteAddresses of aclFile=(?P<file>\S+)"
    r" \(said once per broker every (?P<hours>\S+) h\)"
)


def whitelist_advice(message: str, broker: JavaBroker, acl_file: Path) -> str | None:
    """The address the node's warning says to list, when ``message`` is that warning about ``broker``
    (its name, address and cluster, the address it connected from, the key and the file); else None."""
    m = REFUSED_BROKER.fullmatch(message)
    if m is None:
        return None
    said = (m["name"], m["addr"], m["cluster"], m["peer"].rpartition(":")[0], m["file"], m["hours"])
    meant = (broker.name, broker.addr, broker.cluster, m["listed"], str(acl_file), f"{BROKER_WARNING_S / 3600:g}")
    return m["listed"] if said == meant else None


def broker_log(broker: JavaBroker) -> str:
    try:
        return broker.process.log.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def test_an_acl_node_refuses_the_unsigned_broker_names_it_once_and_takes_it_once_listed(world):
    """A broker that signs nothing (4.9 cannot; 5.5.0 is given no account here) on a node with
    aclEnable=true and nobody whitelisted: refused with code 16 at
    every registration while its console says "boot success"; the node names it and the fix in one
    WARNING however often it retries, and takes it once its address is listed as that WARNING says."""
    broker, node, wait_s = world.broker, world.acl, 6 * REGISTER_PERIOD_MS / 1000

    def refused() -> int:
        return node.call(lambda: node.running.context.acl.refused)

    def tried_again() -> list[str]:
        return [m for m in world.acl_log.messages() if m.startswith("refused code=103 ") and " again: " in m]

    # the broker was answered NO_PERMISSION with the node's remark, at start-up and again a period later
    # (REGISTER_PERIOD_MS): only its own log says so
    code_16 = re.compile(r"CODE: 16\s+DESC: No accessKey is configured: request code=103 ")
    wait_until(lambda: len(code_16.findall(broker_log(broker))) >= 2, wait_s, "two refusals in the broker's log",
               state=lambda: broker_log(broker)[-2000:])  # fmt: skip
    assert refused() >= 2
    with NameServerClient(node.addr) as c:
        assert broker.name not in c.cluster_info().broker_addr_table
    # one WARNING however often it tries; the node says the repeats at DEBUG only
    warnings = world.acl_log.messages(logging.WARNING)
    assert len(warnings) == 1, warnings
    assert tried_again(), world.acl_log.messages()
    listed = whitelist_advice(warnings[0], broker, world.acl_file)
    assert listed == "127.0.0.1", warnings[0]

    # as the warning says: its address in globalWhiteRemoteAddresses (the node reads the changed file)
    world.acl_file.write_text(f"globalWhiteRemoteAddresses:\n  - {listed}\naccounts: []\n")
    wait_until(lambda: registered(node.addr, broker.name, broker.broker_id, broker.addr), wait_s,
               f"{broker.name} registered with the ACL node once listed", state=refused)  # fmt: skip
    with NameServerClient(node.addr) as c:
        info = c.cluster_info()
    assert info.cluster_addr_table == {broker.cluster: [broker.name]}
    assert info.broker_addr_table[broker.name].broker_addrs == {0: broker.addr}
    assert world.acl_log.messages(logging.WARNING) == warnings
