"""The chaos schedule is the same for the same seed, covers every fault once, and bounds each as the issue says."""

from __future__ import annotations

import pytest

from tests.support.chaos.schedule import BROKER_TIMEOUT_S, FAULTS, SHORT, On, schedule


def test_a_seed_gives_one_order_and_another_seed_another():
    assert schedule(7) == schedule(7)
    assert [f.name for f in schedule(7)] != [f.name for f in schedule(8)]


def test_every_fault_runs_once_and_rocketmq_s_only_when_asked():
    assert sorted(f.name for f in schedule(1)) == sorted(f.name for f in FAULTS)
    without = schedule(1, rocketmq=False)
    assert without and all(f.on is not On.ROCKETMQ for f in without)
    assert sorted(f.name for f in schedule(3, SHORT)) == sorted(SHORT)


def test_every_fault_is_held_past_a_broker_s_deadline_and_bounded_by_what_it_is_on():
    for fault in FAULTS:
        assert fault.hold_s > BROKER_TIMEOUT_S, fault
        assert fault.bound_s == (5.0 if fault.on in (On.KAFKA, On.REDIS, On.MONITOR) else 2.0), fault


def test_an_unknown_fault_is_refused_with_the_names_there_are():
    with pytest.raises(ValueError, match="kafka-freeze"):
        schedule(1, ("kafka-frieze",))


def test_an_incident_notified_twice_is_told_apart_from_two_incidents_of_one_kind():
    from tests.support.chaos.checks import Episodes

    one = (("alertname", "BROKER_EXPIRED"), ("broker", "b-0"))
    kind = (("alertname", "MONITOR_DOWN"),)
    fine = Episodes({one: ["firing", "resolved"], kind: ["firing", "resolved", "firing", "resolved"]})
    assert fine.broken() == [] and fine.incidents() == 3 and fine.still_firing() == []
    twice = Episodes({one: ["firing", "firing", "resolved"], kind: ["firing", "resolved", "resolved"]})
    assert len(twice.broken()) == 2
    assert Episodes({one: ["firing"]}).still_firing() and Episodes({one: ["firing"]}).broken() == []
