"""The route tables: who serves which topic, which brokers are alive, and the operations on them.

The tables are plain data (:mod:`common.routes.tables`) and the operations are functions, one
module per concern; :class:`RouteInfoManager` (:mod:`common.routes.manager`) puts them behind
the lock and is the only way in from outside this package.  The node serves them; the streaming job
runs the same tables for the route model it keeps in Redis (:mod:`common.routes.materialised`, encoded
by :mod:`common.routes.snapshot`), so a route there is byte for byte what a node answers.
"""

from common.routes.manager import RouteInfoManager, monotonic_ms
from common.routes.model import (
    BrokerAddrInfo,
    BrokerLiveInfo,
    FencedRequest,
    FenceReason,
    MinBrokerIdChange,
    ProvisionalStats,
    RegisterBrokerResult,
    RouteCounts,
    RouteHealth,
    RouteSettings,
    RouteSettingsLike,
    UnregisterOutcome,
    UnregisterRequest,
)

__all__ = [
    "BrokerAddrInfo",
    "BrokerLiveInfo",
    "FenceReason",
    "FencedRequest",
    "MinBrokerIdChange",
    "ProvisionalStats",
    "RegisterBrokerResult",
    "RouteCounts",
    "RouteHealth",
    "RouteInfoManager",
    "RouteSettings",
    "RouteSettingsLike",
    "UnregisterOutcome",
    "UnregisterRequest",
    "monotonic_ms",
]
