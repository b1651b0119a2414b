"""`namesrv simulate` against two real in-process nodes: registration, silence, unregistration, restarts."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from common.protocol.codes import ResponseCode
from namesrv.client import NameServerClient, RemoteError
from namesrv.simulate import Backoff, Fleet, FleetConfig, HeartbeatKind, State, parse_namesrv_list
from tests.support.node import REPO, NodeThread, free_port, running_node
from tests.support.routes import brokers_at
from tests.support.wait import wait_until

NAMESRV = [sys.executable, "-m", "namesrv"]
#: expiry settings small enough for a test: brokers time out after 1.5 s, the node scans every 200 ms
FAST_EXPIRY = {"scanNotActiveBrokerInterval": "200"}


@contextmanager
def node_at(tmp_path: Path, name: str, port: int | None = None) -> Iterator[NodeThread]:
    data = tmp_path / name
    data.mkdir(exist_ok=True)
    with running_node(data, listenPort=str(port or free_port()), **FAST_EXPIRY) as n:
        yield n


@pytest.fixture
def nodes(tmp_path) -> Iterator[tuple[NodeThread, NodeThread]]:
    with node_at(tmp_path, "a") as a, node_at(tmp_path, "b") as b:
        yield a, b


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def __call__(self, kind: str, fields: dict) -> None:
        self.events.append((kind, fields))

    def of(self, kind: str) -> list[dict]:
        return [f for k, f in self.events if k == kind]


@pytest.fixture
def make_fleet() -> Iterator[Callable[..., tuple[Fleet, Recorder]]]:
    fleets: list[Fleet] = []

    def make(namesrv: list[str], **kw) -> tuple[Fleet, Recorder]:
        rec = Recorder()
        fleet = Fleet(FleetConfig(namesrv=tuple(namesrv), **kw), on_event=rec, rng=random.Random(7))
        fleets.append(fleet)
        return fleet, rec

    yield make
    for f in fleets:
        f.close()


def test_every_broker_registers_with_every_node_with_its_topics_and_slaves(nodes, make_fleet):
    a, b = nodes
    fleet, rec = make_fleet([a.addr, b.addr], brokers=3, topics=2, slaves_per_group=1, addr_base="127.0.0.1:40000")
    fleet.tick(0)

    expected = {f"broker-{g}": {0: f"127.0.0.1:{40000 + 4 * g}", 1: f"127.0.0.1:{40002 + 4 * g}"} for g in range(3)}
    for node in (a, b):
        assert brokers_at(node.addr) == expected
        with NameServerClient(node.addr) as c:
            assert c.cluster_info().cluster_addr_table == {"DefaultCluster": ["broker-0", "broker-1", "broker-2"]}
            for topic_index in range(6):
                route = c.topic_route(f"T{topic_index}")  # group g owns T<2g>, T<2g+1>, as rmq-loadgen
                owner = f"broker-{topic_index // 2}"
                assert [(q.broker_name, q.read_queue_nums, q.write_queue_nums, q.perm) for q in route.queue_datas] == [
                    (owner, 8, 8, 6)
                ]
                assert [bd.broker_addrs for bd in route.broker_datas] == [expected[owner]]
            with pytest.raises(RemoteError) as e:
                c.topic_route("T6")
            assert e.value.code == ResponseCode.TOPIC_NOT_EXIST
    assert len(rec.of("registered")) == 12 and fleet.counters["registrations"] == 12

    # RocketMQ's schedule: again 10 s after the first registration, then every register interval
    fleet.tick(9.9)
    assert fleet.counters["registrations"] == 12
    fleet.tick(10)
    fleet.tick(39.9)
    assert fleet.counters["registrations"] == 24
    fleet.tick(40)
    assert fleet.counters["registrations"] == 36
    # re-registrations are quiet: still one event per broker and node
    assert len(rec.of("registered")) == 12 and not rec.of("reconnect")


@pytest.mark.parametrize("kind", list(HeartbeatKind))
def test_heartbeats_alone_keep_brokers_alive_past_their_timeout(nodes, make_fleet, kind):
    a, b = nodes
    fleet, rec = make_fleet(
        [a.addr, b.addr],
        brokers=2,
        heartbeat_timeout_ms=1500,
        register_interval=3600,
        heartbeat_interval=0.3,
        heartbeat_kind=kind,
    )
    start = time.monotonic()
    while time.monotonic() - start < 2.5:  # well past 1.5 s: only the heartbeats refresh the brokers
        fleet.tick(time.monotonic() - start)
        time.sleep(0.05)
    assert fleet.counters["registrations"] == 4 and fleet.counters["heartbeats"] >= 4 * 6
    assert sorted(brokers_at(a.addr)) == sorted(brokers_at(b.addr)) == ["broker-0", "broker-1"]


def test_a_silent_broker_stays_until_expiry_then_leaves_both_nodes(nodes, make_fleet):
    a, b = nodes
    fleet, rec = make_fleet(
        [a.addr, b.addr],
        brokers=3,
        topics=1,
        silent=1,
        silent_after=0.5,
        heartbeat_timeout_ms=1500,
        register_interval=0.4,
    )
    start = time.monotonic()

    def tick() -> None:
        fleet.tick(time.monotonic() - start)

    wait_until(lambda: bool(rec.of("silent")), 5, "the silent event", during=tick)
    assert [e["broker"] for e in rec.of("silent")] == ["broker-2"]
    silent_since = time.monotonic()
    # half-open: its connections stay open, so only liveness expiry can remove it
    silent_member = next(m for m in fleet.members if m.name == "broker-2")
    assert silent_member.state is State.SILENT and all(link.conn.connected for link in silent_member.links.values())
    assert all("broker-2" in brokers_at(n.addr) for n in (a, b))

    wait_until(lambda: all("broker-2" not in brokers_at(n.addr) for n in (a, b)), 10, "expiry", during=tick)
    gone_after = time.monotonic() - silent_since
    # its last registration was at most 0.4 s before it went silent, and the timeout is 1.5 s
    assert gone_after >= 0.9, gone_after
    for n in (a, b):
        assert sorted(brokers_at(n.addr)) == ["broker-0", "broker-1"]
        with NameServerClient(n.addr) as c, pytest.raises(RemoteError) as e:
            c.topic_route("T2")
        assert e.value.code == ResponseCode.TOPIC_NOT_EXIST
    assert not rec.of("reconnect")


def test_an_unregistering_broker_leaves_both_nodes_promptly(nodes, make_fleet):
    a, b = nodes
    fleet, rec = make_fleet([a.addr, b.addr], brokers=2, slaves_per_group=1, unregister=1, unregister_after=5)
    fleet.tick(0)
    assert all(sorted(brokers_at(n.addr)) == ["broker-0", "broker-1"] for n in (a, b))
    fleet.tick(5)
    unregs = rec.of("unregistered")
    assert sorted((e["broker"], e["id"], e["namesrv"]) for e in unregs) == sorted(
        ("broker-1", i, n.addr) for i in (0, 1) for n in (a, b)
    )
    assert all(e["acked"] and e["reason"] == "scheduled" for e in unregs)
    start = time.monotonic()
    wait_until(lambda: all(sorted(brokers_at(n.addr)) == ["broker-0"] for n in (a, b)), 3, "unregistration")
    took = time.monotonic() - start
    assert took < 1.0
    fleet.tick(10)  # the unregistered group stays away; the other keeps registering
    assert fleet.summary()["states"] == {"live": 2, "silent": 0, "unregistered": 2, "stopped": 0}
    assert all(sorted(brokers_at(n.addr)) == ["broker-0"] for n in (a, b))


def test_a_restarted_node_gets_the_brokers_back(tmp_path, make_fleet):
    port_b = free_port()
    with ExitStack() as stack:
        a = stack.enter_context(node_at(tmp_path, "a"))
        b_ctx = ExitStack()
        b = b_ctx.enter_context(node_at(tmp_path, "b", port_b))
        stack.callback(lambda: b_ctx.close())
        b_addr = b.addr
        fleet, rec = make_fleet([a.addr, b_addr], brokers=2, topics=2)
        fleet.tick(0)
        assert all(sorted(brokers_at(n)) == ["broker-0", "broker-1"] for n in (a.addr, b_addr))

        b_ctx.close()  # node b goes down: its connections close
        t = [1.0]

        def tick() -> None:
            t[0] += 0.01
            fleet.tick(t[0])

        wait_until(lambda: len(rec.of("reconnect")) == 2, 5, "the fleet to notice node b went down", during=tick)
        assert {(e["broker"], e["namesrv"]) for e in rec.of("reconnect")} == {
            ("broker-0", b_addr),
            ("broker-1", b_addr),
        }
        fleet.tick(5)  # b still down: refused, retried later, no crash and no new event lines
        assert len(rec.of("reconnect")) == 2 and fleet.counters["failures"] >= 3
        assert sorted(brokers_at(a.addr)) == ["broker-0", "broker-1"]

        b_ctx = ExitStack()
        b2 = b_ctx.enter_context(node_at(tmp_path, "b2", port_b))
        assert brokers_at(b2.addr) == {}
        fleet.tick(60)
        again = [e for e in rec.of("registered") if e["again"]]
        assert sorted(e["broker"] for e in again) == ["broker-0", "broker-1"]
        assert all(e["namesrv"] == b2.addr for e in again)
        assert sorted(brokers_at(b2.addr)) == ["broker-0", "broker-1"]
        with NameServerClient(b2.addr) as c:
            assert c.topic_route("T3").queue_datas[0].broker_name == "broker-1"
        assert fleet.summary()["links_up"] == {a.addr: 2, b_addr: 2}


def test_a_node_that_is_down_is_retried_with_growing_delays_without_noise(make_fleet):
    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    fleet, rec = make_fleet([down], brokers=3, register_interval=30, summary_interval=1000)
    fleet.tick(0)
    assert len(rec.of("reconnect")) == 3  # one line per broker when its link goes down
    assert fleet.counters["failures"] == 1  # the first refusal spares the other brokers a connect this tick
    link = fleet.members[0].links[down]
    delays = []
    now = 0.0
    for _ in range(8):
        now = link.retry_at
        fleet.tick(now)
        delays.append(link.retry_at - now)
    assert len(rec.of("reconnect")) == 3 and not rec.of("registered")
    assert delays[0] == pytest.approx(2, rel=0.21) and delays[1] == pytest.approx(4, rel=0.21)
    assert all(d <= 30 * 1.2 for d in delays) and delays[-1] == pytest.approx(30, rel=0.21)
    assert fleet.next_due() == min(m.links[down].retry_at for m in fleet.members)


def test_backoff_and_config_validation():
    backoff = Backoff(1.0, 8.0, random.Random(1), jitter=0.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]
    assert parse_namesrv_list("127.0.0.1:9876; 127.0.0.1:9877;") == ("127.0.0.1:9876", "127.0.0.1:9877")
    with pytest.raises(ValueError, match="host:port"):
        parse_namesrv_list("127.0.0.1")
    with pytest.raises(ValueError, match="exceed --brokers"):
        FleetConfig(namesrv=("127.0.0.1:9876",), brokers=2, silent=1, unregister=2)
    with pytest.raises(ValueError, match="lower the base port"):
        FleetConfig(namesrv=("127.0.0.1:9876",), brokers=10, addr_base="127.0.0.1:65530")
    fleet = Fleet(FleetConfig(namesrv=("127.0.0.1:9876",), brokers=5, silent=2, unregister=1), on_event=lambda *_: None)
    assert (fleet.silent_groups, fleet.unregister_groups) == ([2, 3], [4])


def simulate(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [*NAMESRV, "simulate", *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def test_cli_runs_for_a_duration_and_prints_a_json_summary(nodes):
    a, b = nodes
    proc = simulate(
        "-n",
        f"{a.addr};{b.addr}",
        "--brokers",
        "2",
        "--topics",
        "3",
        "--duration",
        "1.5",
        "--summary-interval",
        "0.5",
        "--json",
    )
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["registrations"] == 4 and summary["topics"] == 6
    assert summary["links_up"] == {a.addr: 2, b.addr: 2}
    assert summary["states"]["stopped"] == 2 and summary["unregistrations"] == 4
    lines = err.splitlines()
    assert sum("msg=registered" in line for line in lines) == 4
    assert sum("msg=unregistered" in line and "reason=exit" in line for line in lines) == 4
    assert any("msg=summary" in line for line in lines)
    wait_until(lambda: all(brokers_at(n.addr) == {} for n in (a, b)), 3, "the brokers to leave")


def test_cli_stops_cleanly_on_sigterm_and_unregisters(nodes):
    a, b = nodes
    proc = simulate("-n", f"{a.addr};{b.addr}", "--brokers", "1")
    try:
        wait_until(lambda: all("broker-0" in brokers_at(n.addr) for n in (a, b)), 20, "the simulator to register")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "stopped" in out and err.count("msg=unregistered") == 2 and "acked=true" in err
    wait_until(lambda: all(brokers_at(n.addr) == {} for n in (a, b)), 3, "the brokers to leave")


def test_cli_rejects_a_bad_fleet_with_a_clear_message():
    done = subprocess.run(
        [*NAMESRV, "simulate", "--brokers", "1", "--silent", "2"], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "--silent 2 plus --unregister 0 exceed --brokers 1" in done.stderr
