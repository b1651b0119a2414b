"""The flow-control ledger as data: credit earned and spent on a given clock, and the budget's choices."""

from __future__ import annotations

import pytest

from namesrv.flow import Credit, large_holders, may_resume


@pytest.mark.parametrize(
    ("steps", "balances"),
    [
        # (now, amount) spent in turn, from a full bucket of 1.0 earning 0.1 a second
        ([(0.0, 0.4), (0.0, 0.4)], [0.6, 0.2]),
        ([(0.0, 0.5), (100.0, 0.0)], [0.5, 1.0]),  # earning stops at the burst
        ([(0.0, 1.5), (2.0, 0.0), (5.0, 0.0)], [-0.5, -0.3, 0.0]),  # a debt is earned back
        ([(0.0, 3.0), (0.0, 1.0)], [-2.0, -3.0]),  # spending in debt deepens it
    ],
)
def test_credit_is_earned_at_its_rate_up_to_its_burst_and_may_run_into_debt(steps, balances):
    credit = Credit.full(rate=0.1, burst=1.0, now=0.0)
    assert [pytest.approx(credit.spend(now, amount)) for now, amount in steps] == balances


@pytest.mark.parametrize(("balance", "down_to", "wait"), [(-0.5, 0.0, 5.0), (0.3, 0.0, 0.0), (-0.5, -0.2, 3.0)])
def test_a_debt_says_how_long_until_it_is_paid_back(balance, down_to, wait):
    credit = Credit(rate=0.1, burst=1.0, balance=balance, at=0.0)
    assert credit.wait_s(down_to) == pytest.approx(wait)


def test_the_large_holders_are_held_back_largest_first_and_the_small_never():
    holdings = [("a", 300), ("small", 255), ("b", 900), ("c", 300), ("d", 256)]
    assert large_holders(holdings, offender_bytes=256) == ["b", "a", "c", "d"]
    assert large_holders([("small", 10)], offender_bytes=256) == []


@pytest.mark.parametrize(("held", "resumes"), [(750, True), (751, False), (0, True), (1000, False)])
def test_held_back_connections_resume_at_three_quarters_of_the_budget(held, resumes):
    assert may_resume(held, budget=1000) is resumes
