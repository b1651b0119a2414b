"""NOTIFY_MIN_BROKER_ID_CHANGE: telling a group's brokers that its lowest broker id changed.

Every path that changes a group's minimum id (a registration, an unregistration, an expiry, warm
start's deadlines) hands the change to :meth:`BrokerNotifier.notify`, which sends the oneway request
to each member named in the change over a connection of its own, as Apache's RouteInfoManager does.
The notifier is built before the parts that report changes, and the node stops it after its server.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from common.protocol.codec import encode
from common.protocol.codes import RequestCode, SerializeType
from common.protocol.command import RemotingCommand
from common.protocol.command import request as new_request
from common.protocol.headers import NotifyMinBrokerIdChangeHeader, encode_header
from common.routes.model import MinBrokerIdChange
from namesrv.client import parse_addr
from namesrv.config import NamesrvConfig

log = logging.getLogger("namesrv.notify")

#: how long Java's name-server client waits for a connection (NettyClientConfig.connectTimeoutMillis)
NOTIFY_CONNECT_TIMEOUT_S = 3.0
#: and for a oneway NOTIFY_MIN_BROKER_ID_CHANGE to be written (RouteInfoManager passes 300 ms)
NOTIFY_SEND_TIMEOUT_S = 0.3


def min_broker_id_change_request(change: MinBrokerIdChange, opaque: int) -> RemotingCommand:
    """The oneway NOTIFY_MIN_BROKER_ID_CHANGE a member of ``change``'s group is sent (absent values omitted)."""
    header = NotifyMinBrokerIdChangeHeader(
        change.min_broker_id, change.min_broker_addr, change.offline_broker_addr, change.ha_broker_addr
    )
    return new_request(RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE, encode_header(header), opaque=opaque, oneway=True)


class BrokerNotifier:
    """Sends each change to its targets in the background; failures are logged, never raised."""

    def __init__(self, serialize_type: SerializeType = SerializeType.JSON) -> None:
        #: how the requests' headers are written
        self.serialize_type = serialize_type
        self._opaque = itertools.count(1)
        #: the sends under way, so :meth:`stop` can find and cancel them
        self.tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_config(cls, config: NamesrvConfig) -> BrokerNotifier:
        """Headers written as the node writes its answers (``responseSerializeType``; ECHO, which follows
        each request, writes JSON here, where there is no request to follow)."""
        mode = config.response_serialize_type.upper()
        return cls(SerializeType.ROCKETMQ if mode == "ROCKETMQ" else SerializeType.JSON)

    def notify(self, change: MinBrokerIdChange) -> None:
        """Start sending ``change`` to each of its targets; on the event loop, returns at once."""
        log.info(
            "min broker id of %s is now %d (%s), offline %s: notifying %s",
            change.broker_name,
            change.min_broker_id,
            change.min_broker_addr,
            change.offline_broker_addr,
            list(change.notify_addrs),
        )
        loop = asyncio.get_running_loop()
        for addr in change.notify_addrs:
            cmd = min_broker_id_change_request(change, next(self._opaque))
            cmd.serialize_type = self.serialize_type
            task = loop.create_task(_send_oneway(addr, encode(cmd)), name=f"notify-{addr}")
            self.tasks.add(task)
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    async def stop(self, timeout: float = 5.0) -> None:
        """Cancel the sends still under way and wait up to ``timeout`` for them to end."""
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout)


async def _send_oneway(addr: str, frame: bytes) -> None:
    try:
        host, port = parse_addr(addr)
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), NOTIFY_CONNECT_TIMEOUT_S)
    except (OSError, ValueError, asyncio.TimeoutError) as e:
        log.info("could not connect to broker %s to notify it: %r", addr, e)
        return
    try:
        writer.write(frame)
        await asyncio.wait_for(writer.drain(), NOTIFY_SEND_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError) as e:
        log.info("could not notify broker %s: %r", addr, e)
    finally:
        writer.close()  # flushes what is buffered, then closes
