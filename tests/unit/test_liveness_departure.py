"""Why a broker left: the words each cause carries (docs/events.md's CHANNEL_CLOSED reasons)."""

from __future__ import annotations

import pytest

from namesrv.liveness import Cause, Departure, departure


def test_connection_ends_carry_the_documented_reasons():
    assert str(departure.PEER_CLOSED) == "connection closed"
    assert str(departure.connection_error(ConnectionResetError("reset by peer"))) == "connection error: reset by peer"
    assert str(departure.idle(120)) == "idle for 120 s (serverChannelMaxIdleTimeSeconds)"
    assert str(departure.malformed_frame(ValueError("frame of 17 MiB"))) == "malformed frame: frame of 17 MiB"
    assert str(departure.read_failed(KeyError("x"))) == "KeyError: 'x'"
    ends = [
        departure.PEER_CLOSED,
        departure.connection_error(OSError()),
        departure.idle(1),
        departure.malformed_frame(ValueError()),
        departure.read_failed(KeyError()),
        departure.NODE_STOPPING,
    ]
    assert all(d.cause.connection_ended for d in ends)
    decided = [departure.BROKER_ASKED, departure.LOCAL_EXPIRY, departure.MONITOR_EXPIRE, departure.MONITOR_REMOVE]
    assert not any(d.cause.connection_ended for d in decided)
    assert {d.cause for d in ends + decided} == set(Cause)


def test_a_long_reason_is_bounded_and_says_how_long_it_was():
    long = departure.malformed_frame(ValueError("x" * 1000))
    bounded = long.bounded(300)
    assert bounded.cause is Cause.MALFORMED_FRAME
    assert bounded.reason == long.reason[:300] + "... (1017 characters)"
    short = Departure(Cause.IDLE, "idle")
    assert short.bounded(300) is short


@pytest.mark.parametrize(
    ("node_stopping", "catching_up", "policy"),
    [
        (False, False, departure.OnConnectionEnd.UNREGISTER),
        (True, False, departure.OnConnectionEnd.UNREGISTER_SILENTLY),
        (True, True, departure.OnConnectionEnd.UNREGISTER_SILENTLY),  # a node stopping is not standing still
        (False, True, departure.OnConnectionEnd.LEAVE_TO_DEADLINE),
    ],
)
def test_what_a_connection_s_end_does_to_its_brokers(node_stopping, catching_up, policy):
    assert departure.on_connection_end(node_stopping=node_stopping, catching_up=catching_up) is policy
