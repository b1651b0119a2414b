"""SilenceWatch: each broker's deadline from its last proof of life, each silence reported once."""

from __future__ import annotations

from namesrv.liveness import Silence, SilenceWatch

A, B = ("C", "10.0.0.1:10911"), ("C", "10.0.0.2:10911")


def test_a_deadline_is_the_last_proof_of_life_plus_the_registered_timeout():
    w = SilenceWatch(default_timeout_ms=120_000)
    w.heard(A, 1_000, timeout_ms=10_000)
    w.heard(B, 1_000)  # no registration seen: the default
    w.heard(A, 5_000)  # a heartbeat keeps the registration's timeout
    assert w.due(15_000) == []  # 5,000 + 10,000 is not *past* 15,000
    assert w.due(15_001) == [Silence(A, 5_000, 10_000)]
    assert w.due(121_001) == [Silence(B, 1_000, 120_000)]
    assert w.due(10**9) == [] and len(w) == 0


def test_an_older_report_never_moves_a_deadline_back_and_a_forgotten_broker_is_not_reported():
    w = SilenceWatch(default_timeout_ms=10_000)
    w.heard(A, 5_000)
    w.heard(A, 1_000)
    assert w.due(12_000) == []
    w.heard(B, 1_000)
    w.forget(B)
    assert w.due(10**9) == [Silence(A, 5_000, 10_000)]


def test_the_heap_stays_within_a_few_entries_per_broker_however_often_they_heartbeat():
    w = SilenceWatch(default_timeout_ms=86_400_000)  # a day: entries would otherwise pile up
    for t in range(100_000):
        w.heard(A, t)
    assert len(w._heap) <= 4 * len(w) + 1024
    assert w.due(10**12) == [Silence(A, 99_999, 86_400_000)]
