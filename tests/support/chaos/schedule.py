"""The fault schedule of ``make chaos``: which faults, in which order, held how long. Pure data.

A :class:`Fault` names one fault of the replicated topology (:mod:`infra.topology`), the kind of part it
hits, how long it is held before it is healed, and how late a broker that dies meanwhile may leave the
system: its deadline + 2 s, or + 5 s while the fault is on Kafka, Redis or the monitor (the issue's
bounds). :func:`schedule` orders them by a seed, so a run is reproducible; :data:`SHORT` is the few
faults ``make test`` runs. Each fault is held at least :data:`HOLD_FLOOR_S`, past a simulated broker's
deadline, so a broker that dies as the fault begins expires while it is in force.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["BROKER_TIMEOUT_S", "FAULTS", "HOLD_FLOOR_S", "SHORT", "Fault", "On", "schedule"]

#: the simulated brokers' own heartbeat timeout, as a registration carries it (the system's settings are
#: the shipped conf/ ones; a short broker timeout cannot hide how late the system acts on it)
BROKER_TIMEOUT_S = 10.0
#: held past a broker's deadline: a broker that falls silent as the fault begins expires within it
HOLD_FLOOR_S = BROKER_TIMEOUT_S + 6.0


class On(StrEnum):
    """What a fault is on; it sets the bound on how late a dead broker may go."""

    KAFKA = "kafka"
    REDIS = "redis"
    MONITOR = "monitor"
    NAMESRV = "namesrv"
    ROCKETMQ = "rocketmq"


@dataclass(frozen=True)
class Fault:
    name: str
    on: On
    #: "kill" (SIGKILL, then the heal starts it again) or "freeze" (SIGSTOP, then SIGCONT)
    action: str
    #: seconds between the fault and its heal
    hold_s: float
    #: words for the results
    what: str

    @property
    def bound_s(self) -> float:
        """Past its deadline, how late a broker that dies during this fault may still be anywhere."""
        return 5.0 if self.on in (On.KAFKA, On.REDIS, On.MONITOR) else 2.0


FAULTS: tuple[Fault, ...] = (
    Fault("kafka-leader-kill", On.KAFKA, "kill", HOLD_FLOOR_S + 4, "kill -9 the Kafka node leading the events partitions, restart it"),
    Fault("kafka-freeze", On.KAFKA, "freeze", 30.0, "SIGSTOP a Kafka node for 30 s"),
    Fault("redis-master-kill", On.REDIS, "kill", HOLD_FLOOR_S, "kill -9 the Redis master of the routes' slot, restart it as a replica"),
    Fault("spark-worker-kill", On.MONITOR, "kill", HOLD_FLOOR_S, "kill -9 a Spark worker with its executor, restart it"),
    Fault("driver-kill", On.MONITOR, "kill", HOLD_FLOOR_S, "kill -9 the job's driver; the supervisor restarts it"),
    Fault("driver-freeze", On.MONITOR, "freeze", 60.0, "SIGSTOP the job's driver for 60 s"),
    Fault("namesrv-kill", On.NAMESRV, "kill", HOLD_FLOOR_S, "kill -9 a name-server node, restart it warm from Redis"),
    Fault("namesrv-freeze", On.NAMESRV, "freeze", 60.0, "SIGSTOP a name-server node for 60 s"),
    Fault("rocketmq-master-kill", On.ROCKETMQ, "kill", HOLD_FLOOR_S, "kill -9 a RocketMQ master; the controller elects its slave"),
    Fault("rocketmq-broker-freeze", On.ROCKETMQ, "freeze", HOLD_FLOOR_S, "SIGSTOP a RocketMQ slave past its deadline; it must expire"),
)  # fmt: skip

#: what `make test` runs: one fault on each of the monitor, Redis and a name-server node. The monitor's is a
#: Spark worker's death, not the driver's: a killed driver is back only after the supervisor's restart, the
#: session and the executors (minutes on the cluster here), and the suite kills the job on the process stack
#: already (test_monitor_recovery, test_stack_supervision, test_liveness_deadline ...)
SHORT = ("spark-worker-kill", "redis-master-kill", "namesrv-kill")


def schedule(seed: int, names: tuple[str, ...] | None = None, *, rocketmq: bool = True) -> list[Fault]:
    """The faults (all, or those ``names``), in an order drawn from ``seed``; RocketMQ's only with ``rocketmq``."""
    chosen = [f for f in FAULTS if (names is None or f.name in names) and (rocketmq or f.on is not On.ROCKETMQ)]
    unknown = set(names or ()) - {f.name for f in FAULTS}
    if unknown:
        raise ValueError(f"no such fault: {sorted(unknown)}; the faults are {[f.name for f in FAULTS]}")
    random.Random(seed).shuffle(chosen)
    return chosen
