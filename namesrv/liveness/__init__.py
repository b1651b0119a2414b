"""Node-side liveness: how brokers leave this node's tables, and who decides when they expire.

While the streaming monitor is heard it decides expiry for every node and the node applies its
actions; while it is away the node's own scan decides, as Apache RocketMQ's does.  This package is
that hand-over and what surrounds it (docs/internals/node-liveness.md tells the whole story):

* :class:`ExpiryScan`: the fallback scan, on while the node decides itself;
* :class:`MonitorWatchdog`: hands expiry to the monitor when it is heard, takes it back after silence, and
  expires a broker the monitor has not decided within the grace past its deadline;
* :class:`SilenceWatch`: the deadlines behind the SILENT events that let the monitor decide sooner;
* :class:`UnregisterBatcher`: every decided removal, applied in batches off the event loop;
* :class:`RedisFallback`: dead brokers the monitor has not decided in time out of the routes in Redis (one node at a time);
* :class:`MonitorTrust`: which monitor is obeyed, on the watchdog's clock of when it was last heard;
* :class:`MonitorDownPager` (:mod:`~namesrv.liveness.monitor_down`): the page when no monitor decides;
* :class:`Departure`, :class:`Cause` and :mod:`~namesrv.liveness.departure`: why a broker left, and
  what a connection's end does to its brokers (:class:`OnConnectionEnd`).

The rest of the node imports from here, never from the modules (tests/unit/test_liveness_boundary.py).
"""

from namesrv.liveness import departure, monitor_down
from namesrv.liveness.departure import Cause, Departure, OnConnectionEnd
from namesrv.liveness.expiry import ExpiryScan
from namesrv.liveness.monitor_down import MonitorDownPager
from namesrv.liveness.redis_fallback import Departures, RedisFallback, RedisLease
from namesrv.liveness.silence import Silence, SilenceWatch
from namesrv.liveness.trust import REFUSAL_LOG_INTERVAL_S, MonitorTrust, trusted_monitors
from namesrv.liveness.unregister_batcher import MinIdOutlet, UnregisterBatcher, forward_min_broker_id_changes
from namesrv.liveness.watchdog import MonitorWatchdog

__all__ = [
    "REFUSAL_LOG_INTERVAL_S",
    "Cause",
    "Departure",
    "Departures",
    "ExpiryScan",
    "MinIdOutlet",
    "MonitorDownPager",
    "MonitorTrust",
    "MonitorWatchdog",
    "OnConnectionEnd",
    "RedisFallback",
    "RedisLease",
    "Silence",
    "SilenceWatch",
    "UnregisterBatcher",
    "departure",
    "forward_min_broker_id_changes",
    "monitor_down",
    "trusted_monitors",
]
