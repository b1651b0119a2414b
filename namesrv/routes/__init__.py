"""The route tables: who serves which topic, which brokers are alive, and the operations on them.

See :mod:`namesrv.routes.manager` for the lock discipline and how unregistrations are fenced.
"""

from namesrv.routes.manager import RouteInfoManager, RouteSettingsLike, monotonic_ms
from namesrv.routes.model import (
    BrokerAddrInfo,
    BrokerLiveInfo,
    FencedRequest,
    FenceReason,
    MinBrokerIdChange,
    RegisterBrokerResult,
    RouteSettings,
    UnregisterOutcome,
    UnregisterRequest,
)

__all__ = [
    "BrokerAddrInfo",
    "BrokerLiveInfo",
    "FenceReason",
    "FencedRequest",
    "MinBrokerIdChange",
    "RegisterBrokerResult",
    "RouteInfoManager",
    "RouteSettings",
    "RouteSettingsLike",
    "UnregisterOutcome",
    "UnregisterRequest",
    "monotonic_ms",
]
