"""The server's flow-control ledger as plain data: credit earned over time and spent, and the budget's choice.

Three limits keep one peer from taking the node (docs/internals/remoting-server.md says why each exists):

* each connection's CPU work off the loop (inflating and parsing registrations) is a :class:`Credit`
  earned at ``WORK_CPU_PER_S``; a connection in debt rests until it is paid back;
* the bytes of large frames read, node-wide, are a :class:`Credit` earned at ``LARGE_FRAME_BYTES_PER_S``;
* the bytes held for all peers have one budget; past it, :func:`large_holders` names the connections
  to hold back, and :func:`may_resume` says when they are read again.

Nothing here reads a clock or touches a connection: the server passes ``now`` and the holdings, and
acts on the answers (tests/unit/test_flow.py tests them as data).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")


@dataclass(slots=True)
class Credit:
    """A token bucket: ``rate`` earned per second up to ``burst``; spending may run it into debt (below 0)."""

    rate: float
    burst: float
    balance: float
    #: the time (the caller's clock, seconds) the balance is as of
    at: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> Credit:
        return cls(rate, burst, burst, now)

    def spend(self, now: float, amount: float) -> float:
        """Earn for the time since the last call (never past ``burst``), then spend ``amount``; the new balance."""
        self.balance = min(self.balance + (now - self.at) * self.rate, self.burst) - amount
        self.at = now
        return self.balance

    def wait_s(self, down_to: float = 0.0) -> float:
        """Seconds from ``at`` until the balance is back to ``down_to`` (0 if it is there already)."""
        return max(0.0, (down_to - self.balance) / self.rate)


def large_holders(holdings: Iterable[tuple[K, int]], offender_bytes: int) -> list[K]:
    """The holders of ``offender_bytes`` or more, largest first (equal ones in the order given): those
    held back once the node is past its budget; a smaller holder never is."""
    large = [(k, n) for k, n in holdings if n >= offender_bytes]
    large.sort(key=lambda kn: -kn[1])
    return [k for k, _ in large]


def may_resume(total_held: int, budget: int) -> bool:
    """Held-back connections are read again once the total is at or under three quarters of the budget."""
    return total_held <= budget * 3 // 4
