"""A well-formed client's route lookups while one connection attacks the node.

The node runs in its own process and each attacker in another, so neither shares a GIL with the timed
client.  The goal is p99 <= 5 ms and max <= 50 ms, asserted as it stands whenever unattacked lookups just
before and just after the attack meet it; on a machine too loaded for that, the attacked figures are
held to that baseline instead (10x, with floors), which still catches the stalls of the node's own that
these attacks once caused.  Attacks whose cost adds up (bombs one after another) are timed over seconds
of lookups 2 ms apart, their baselines too.  A miss is measured up to twice more before it fails: a stall
the node causes shows up every time, a neighbour's burst seldom does.  The figures of every try are
printed.
``docs/internals/testing.md`` has the reasoning and what each attack took to meet the goal.
"""

from __future__ import annotations

import time

import pytest

from common.protocol.codes import ResponseCode
from namesrv.client import NameServerClient
from tests.support import attacks
from tests.support.brokers import register_broker
from tests.support.process import node_process
from tests.support.wait import wait_until

LOOKUPS = 400
MS = 1e-3
#: the goal for a well-formed client's route lookups under attack
GOAL_P99, GOAL_MAX = 5 * MS, 50 * MS
#: when the machine itself misses the goal: bounds relative to the unattacked baseline, with floors
RATIO, FLOOR_P99, FLOOR_MAX = 10, 50 * MS, 250 * MS
TRIES = 3
#: attacks whose cost adds up are timed for seconds of paced lookups, baselines too (bombs one after
#: another on one connection)
SUSTAINED_S = {"gigabyte-zip-bombs": 6.0, "small-zip-bombs": 6.0}


@pytest.fixture(scope="module")
def attacked_node(tmp_path_factory):
    with node_process(tmp_path_factory.mktemp("attacked")) as n, NameServerClient(n.addr) as broker:
        register_broker(broker, broker_addr="127.0.0.1:10911", topics=[attacks.GOOD_TOPIC])
        yield n


def meets_goal(latencies: list[float]) -> bool:
    return attacks.percentile(latencies, 0.99) <= GOAL_P99 and max(latencies) <= GOAL_MAX


def verdict(before: list[float], during: list[float], after: list[float]) -> str | None:
    """None if ``during`` passes; else what it missed (the absolute goal when the machine is quiet)."""
    p99, worst = attacks.percentile(during, 0.99), max(during)
    if meets_goal(before) and meets_goal(after):
        if p99 > GOAL_P99 or worst > GOAL_MAX:
            return f"goal missed on a quiet machine: p99 {p99 / MS:.2f} ms, max {worst / MS:.1f} ms"
        return None
    p99_bound = max(RATIO * attacks.percentile(before, 0.99), FLOOR_P99)
    max_bound = max(RATIO * max(before), FLOOR_MAX)
    if p99 > p99_bound or worst > max_bound:
        return (
            f"p99 {p99 / MS:.2f} ms (bound {p99_bound / MS:.1f}), max {worst / MS:.1f} ms (bound {max_bound / MS:.1f})"
        )
    return None


def timed_lookups(probe: attacks.LatencyProbe, kind: str, share: float = 1.0) -> list[float]:
    if kind in SUSTAINED_S:
        return probe.lookups_for(SUSTAINED_S[kind] * share)
    return probe.lookups(int(LOOKUPS * share))


def summary(kind: str, before: list[float], during: list[float], after: list[float], took: float) -> str:
    def figures(values: list[float]) -> str:
        return f"p99 {attacks.percentile(values, 0.99) / MS:.2f} max {max(values) / MS:.1f} ms"

    return f"{kind}: before {figures(before)}; attacked {figures(during)} over {took:.1f} s; after {figures(after)}"


@pytest.mark.parametrize("kind", [*attacks.ATTACKS, "unfinished-frames"])
def test_route_lookups_stay_fast_under_attack(attacked_node, kind, capsys):
    probe = attacks.LatencyProbe(attacked_node.addr)
    for attempt in range(1, TRIES + 1):
        before = timed_lookups(probe, kind)
        with attacks.AttackProcess(attacked_node.addr, kind) as attack:
            start = time.monotonic()
            during = timed_lookups(probe, kind)
            took = time.monotonic() - start
            result = attack.stop()
        after = timed_lookups(probe, kind, 0.5)
        missed = verdict(before, during, after)
        with capsys.disabled():
            print(f"\n[try {attempt}] {summary(kind, before, during, after, took)}; attacker {result}")
        if missed is None:
            break
    assert not probe.failures, probe.failures  # nothing refused or lost for the good client
    assert missed is None, missed

    # the attack did happen, and the attacker itself was answered or cut off cleanly
    if kind == "unfinished-frames":
        assert result["sent_bytes"] > 16 * attacks.MiB
    else:
        assert result["sent"] >= 1 and result["answered"] + result["closed"] >= result["sent"] - 1
    if kind == "kv-puts":
        assert result["codes"].get(ResponseCode.SUCCESS) and result["codes"].get(ResponseCode.SYSTEM_ERROR)
    wait_until(lambda: attacked_node.rss() < 256 * attacks.MiB, 30, "RSS under 256 MiB")
