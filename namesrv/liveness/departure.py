"""Why a node removed a broker: one typed value from the place that decided to the event that says so.

A broker leaves for one of two families of reasons, and the published event says which
(docs/events.md): something *decided* it (the broker asked, the node's expiry scan, the monitor's
EXPIRE / REMOVE), an ``UNREGISTER`` event naming the decider; or the connection it registered on
*ended*, a ``CHANNEL_CLOSED`` event whose ``reason`` is :attr:`Departure.reason`. Whoever decides
builds a :class:`Departure` with the functions and constants below; the observer
(:meth:`namesrv.handlers.NodeObserver.broker_unregistered`) maps its :class:`Cause` to the event.
``NODE_STOPPING`` is never reported: a fleet-wide restart must not tell the monitor every broker left.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Cause(enum.Enum):
    """What made the node remove a broker (or close the connection it registered on)."""

    #: the broker asked (UNREGISTER_BROKER, code 104)
    UNREGISTER_BROKER = "UNREGISTER_BROKER"
    #: the node's own expiry scan (the fallback while the monitor is silent)
    LOCAL_EXPIRY = "LOCAL_EXPIRY"
    #: the node applied the monitor's EXPIRE action
    MONITOR_EXPIRE = "EXPIRE"
    #: the node applied the monitor's REMOVE action
    MONITOR_REMOVE = "REMOVE"
    #: the peer (or the network) closed the connection
    PEER_CLOSED = "PEER_CLOSED"
    #: the transport reported an error
    CONNECTION_ERROR = "CONNECTION_ERROR"
    #: the node closed it: nothing came for serverChannelMaxIdleTimeSeconds, or nothing could (it was
    #: held back for the buffer budget; never a connection a broker registered on)
    IDLE = "IDLE"
    #: the node closed it: the peer sent a frame the decoder refused
    MALFORMED_FRAME = "MALFORMED_FRAME"
    #: the node closed it: answering what the peer sent failed on our side
    READ_FAILED = "READ_FAILED"
    #: the node closed it because it is stopping (never reported)
    NODE_STOPPING = "NODE_STOPPING"

    @property
    def connection_ended(self) -> bool:
        """True for the causes that are a connection's end (CHANNEL_CLOSED), not a decision."""
        return self in _CONNECTION_ENDS


_CONNECTION_ENDS = frozenset({
    Cause.PEER_CLOSED, Cause.CONNECTION_ERROR, Cause.IDLE, Cause.MALFORMED_FRAME, Cause.READ_FAILED,
    Cause.NODE_STOPPING,
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Departure:
    """A :class:`Cause` and the words for people: a CHANNEL_CLOSED event's ``reason``, log lines."""

    cause: Cause
    reason: str

    def bounded(self, max_chars: int) -> Departure:
        """The same departure with its reason cut to ``max_chars`` (it may quote what a peer sent)."""
        if len(self.reason) <= max_chars:
            return self
        return Departure(self.cause, self.reason[:max_chars] + f"... ({len(self.reason)} characters)")

    def __str__(self) -> str:
        return self.reason


BROKER_ASKED = Departure(Cause.UNREGISTER_BROKER, "UNREGISTER_BROKER")
LOCAL_EXPIRY = Departure(Cause.LOCAL_EXPIRY, "expired")
MONITOR_EXPIRE = Departure(Cause.MONITOR_EXPIRE, "EXPIRE")
MONITOR_REMOVE = Departure(Cause.MONITOR_REMOVE, "REMOVE")
PEER_CLOSED = Departure(Cause.PEER_CLOSED, "connection closed")
NODE_STOPPING = Departure(Cause.NODE_STOPPING, "node stopping")


def connection_error(error: BaseException) -> Departure:
    return Departure(Cause.CONNECTION_ERROR, f"connection error: {error}")


def idle(limit_s: float) -> Departure:
    return Departure(Cause.IDLE, f"idle for {limit_s} s (serverChannelMaxIdleTimeSeconds)")


def stalled(held_back_s: float, unfinished: int) -> Departure:
    return Departure(
        Cause.IDLE,
        f"held back for the buffer budget for {held_back_s} s with {unfinished} bytes of an unfinished frame",
    )


def malformed_frame(error: BaseException) -> Departure:
    return Departure(Cause.MALFORMED_FRAME, f"malformed frame: {error}")


def read_failed(error: BaseException) -> Departure:
    return Departure(Cause.READ_FAILED, f"{type(error).__name__}: {error}")


class OnConnectionEnd(enum.Enum):
    """What a node does with the brokers registered on a connection that ended."""

    #: unregister them and report each departure (a CHANNEL_CLOSED event): Apache RocketMQ's behaviour
    UNREGISTER = "unregister"
    #: unregister them and report nothing: the node is stopping, not the brokers' connections, and a
    #: fleet-wide restart must not tell the monitor every broker left
    UNREGISTER_SILENTLY = "unregister silently"
    #: leave them to their deadlines: the node is catching up after it stood still, and a broker
    #: closes a connection whose requests time out, so the end says nothing of the broker (it
    #: registers again on a new connection)
    LEAVE_TO_DEADLINE = "leave to their deadlines"


def on_connection_end(*, node_stopping: bool, catching_up: bool) -> OnConnectionEnd:
    """The policy for the brokers of a connection that ended (see :class:`OnConnectionEnd`)."""
    if node_stopping:
        return OnConnectionEnd.UNREGISTER_SILENTLY
    if catching_up:
        return OnConnectionEnd.LEAVE_TO_DEADLINE
    return OnConnectionEnd.UNREGISTER
