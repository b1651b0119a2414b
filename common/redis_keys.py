"""The Redis key layout the monitor writes and the node and the console read, under one prefix.

One class names every key and channel, so a writer and its readers cannot drift apart; what each key
holds is in ``docs/redis-keys.md``.
"""

from __future__ import annotations

from dataclasses import dataclass


def broker_field(cluster_name: str, broker_addr: str) -> str:
    """A broker as the hashes and sets under the prefix name it: the route tables' key, ``cluster|addr``."""
    return f"{cluster_name}|{broker_addr}"


@dataclass(frozen=True)
class RedisKeys:
    """Every key and channel the job writes under its prefix; ``docs/redis-keys.md`` explains each.

    ``hash_tag`` (a Redis Cluster) writes the prefix as a hash tag, ``{namesrv}:route:T``: Redis
    Cluster places a key by the part in braces only, so every key of the prefix shares one slot and a
    MULTI/EXEC over them is allowed. A prefix holding a brace cannot be a tag and is refused.
    """

    prefix: str = "namesrv"
    hash_tag: bool = False

    def __post_init__(self) -> None:
        if self.hash_tag and ("{" in self.prefix or "}" in self.prefix or not self.prefix):
            raise ValueError(
                f"Redis key prefix {self.prefix!r}: on a Redis Cluster the prefix is the keys' hash tag, "
                "so it must be non-empty and hold no '{' or '}'"
            )

    @property
    def base(self) -> str:
        """What every key starts with: the prefix, in braces on a cluster."""
        return f"{{{self.prefix}}}" if self.hash_tag else self.prefix

    def route(self, topic: str) -> str:
        return f"{self.base}:route:{topic}"

    @property
    def route_pattern(self) -> str:
        return f"{self.base}:route:*"

    @property
    def topics(self) -> str:
        return f"{self.base}:topics"

    @property
    def cluster(self) -> str:
        return f"{self.base}:cluster"

    @property
    def alerts(self) -> str:
        return f"{self.base}:alerts"

    @property
    def alerts_outbox(self) -> str:
        return f"{self.base}:alerts:outbox"

    @property
    def meta(self) -> str:
        return f"{self.base}:meta"

    @property
    def model_topics(self) -> str:
        return f"{self.base}:model:topics"

    @property
    def model_brokers(self) -> str:
        return f"{self.base}:model:brokers"

    @property
    def model_removed(self) -> str:
        """Brokers a node's fallback writer removed while no monitor decided (the job honours them)."""
        return f"{self.base}:model:removed"

    @property
    def fallback_lease(self) -> str:
        """Which node may write while no monitor decides: one at a time (SET NX PX, renewed)."""
        return f"{self.base}:fallback:lease"

    @property
    def fallback_nodes(self) -> str:
        """The nodes whose fallback writers share what they hold: node name -> wall ms of its last look."""
        return f"{self.base}:fallback:nodes"

    def fallback_holds(self, node: str) -> str:
        """The brokers one node holds (in its tables, not past their deadline there), ``cluster|addr``; expires
        unless the node renews it, so a dead or frozen node holds nothing."""
        return f"{self.base}:fallback:holds:{node}"

    @property
    def monitor_down(self) -> str:
        """The open MONITOR_DOWN as the nodes paged it (its notice): the one a node resolves, with its labels."""
        return f"{self.base}:alerts:monitor-down"

    @property
    def monitor_down_resend(self) -> str:
        """Which node sends the open MONITOR_DOWN in this resend interval (SET NX PX): one at a time."""
        return f"{self.base}:alerts:monitor-down:resend"

    @property
    def channel(self) -> str:
        return f"{self.base}:routes:changed"

    @property
    def alerts_resolved(self) -> str:
        return f"{self.base}:alerts:resolved"

    @property
    def health_brokers(self) -> str:
        return f"{self.base}:health:brokers"

    @property
    def health_nodes(self) -> str:
        return f"{self.base}:health:nodes"

    @property
    def health_monitor(self) -> str:
        return f"{self.base}:health:monitor"
