"""A short chaos schedule in ``make test``: the replicated topology under three faults, every invariant held.

The whole schedule is ``make chaos`` (``bench/chaos.py``, ``bench/CHAOS_RESULTS.md``); this runs its
:data:`~tests.support.chaos.schedule.SHORT` faults (a Spark worker killed with its executor, the Redis
master of the routes' slot killed, a name-server node killed), each held past a broker's deadline, with a broker
crashing and one falling silent while each is in force, on the same topology and with the same checks
(:mod:`tests.support.chaos.harness`): no wrong removal, every dead broker gone within its bound, the same
routes everywhere soon after each heal, every incident notified once and resolved once at Alertmanager,
every process up at the end and no traceback in our logs.
"""

from __future__ import annotations

import pytest

from tests.support import alertmanager
from tests.support.chaos.harness import Chaos
from tests.support.chaos.schedule import SHORT, schedule

pytestmark = [pytest.mark.alone, pytest.mark.timeout(1800)]

SEED = 31


@pytest.mark.skipif(not alertmanager.available(), reason="Debian's prometheus-alertmanager (make setup installs it)")
def test_a_short_chaos_schedule_keeps_every_promise(tmp_path):
    chaos = Chaos(tmp_path, SEED, rocketmq=False, say=print)
    try:
        chaos.start()
        for fault in schedule(SEED, SHORT, rocketmq=False):
            chaos.outcome.results.append(chaos.run_fault(fault))
        outcome = chaos.finish()
    finally:
        chaos.stop()
    lines = [r.line() for r in outcome.results] + [f"{k}: {v or 'held'}" for k, v in outcome.invariants.items()]
    print("\n".join(lines))
    assert sorted(r.fault.name for r in outcome.results) == sorted(SHORT)
    assert outcome.ok, "\n".join(lines)
