"""The route tables: who serves which topic, which brokers are alive, and the operations on them.

The tables are plain data (:mod:`namesrv.routes.tables`) and the operations are functions, one
module per concern; :class:`RouteInfoManager` (:mod:`namesrv.routes.manager`) puts them behind
the lock and is the only way in from outside this package.  :mod:`namesrv.routes.snapshot` is the
route model the streaming job keeps in Redis.
"""

from namesrv.routes.manager import RouteInfoManager, monotonic_ms
from namesrv.routes.model import (
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
