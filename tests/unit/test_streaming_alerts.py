from __future__ import annotations

import logging

import pytest

from namesrv.protocol.types import BrokerData, QueueData
from namesrv.routes.queries import route_health
from namesrv.routes.tables import RouteTables
from streaming.alerts import (
    Alert,
    AlertBook,
    AlertKind,
    AlertState,
    Severity,
    decode_alert,
    encode_alert,
    incident_id,
    lag_incident,
    log_alert,
    route_incidents,
)

T0 = 1_700_000_000_000


def test_open_and_resolved_of_one_incident_share_its_id_and_json_round_trips():
    a = Alert(
        AlertKind.BROKER_EXPIRED,
        AlertState.OPEN,
        Severity.CRITICAL,
        "silent",
        T0,
        cluster_name="C",
        broker_name="b",
        broker_addr="1.2.3.4:5",
        node="n1",
    )
    r = a.resolved("back", T0 + 1)
    assert a.incident == r.incident == "BROKER_EXPIRED|C|1.2.3.4:5"
    assert decode_alert(encode_alert(a, monitor="m", emitted_at=T0)) == a
    assert decode_alert(encode_alert(r, monitor="m", emitted_at=T0)) == r
    with pytest.raises(ValueError):
        decode_alert(b'{"v": 2}')
    with pytest.raises(ValueError):
        decode_alert(b'{"v": 1, "kind": "NOPE"}')


def test_incident_ids_name_what_the_alert_is_about():
    assert incident_id(AlertKind.TOPIC_NOT_WRITABLE, topic="T") == "TOPIC_NOT_WRITABLE|T"
    assert incident_id(AlertKind.NODE_SILENT, node="n2") == "NODE_SILENT|n2"
    assert incident_id(AlertKind.GROUP_WITHOUT_MASTER, cluster_name="C", broker_name="b") == "GROUP_WITHOUT_MASTER|C|b"
    assert incident_id(AlertKind.MONITOR_LAGGING) == "MONITOR_LAGGING"


def test_route_incidents_find_masterless_groups_unwritable_and_lost_topics():
    groups = {"a": BrokerData("C", "a", {1: "x:1"}), "b": BrokerData("C", "b", {0: "y:1"})}
    topics = {
        "ok": {"b": QueueData("b", 4, 4, 6)},
        "ro": {"b": QueueData("b", 4, 4, 4), "a": QueueData("a", 4, 0, 6)},
    }
    health = route_health(RouteTables(topic_queue_table=topics, broker_addr_table=groups), ["gone", "ok"])
    found = route_incidents(health, at=T0)
    assert set(found) == {"GROUP_WITHOUT_MASTER|C|a", "TOPIC_NOT_WRITABLE|ro", "TOPIC_NOT_WRITABLE|gone"}
    assert all(a.severity is Severity.CRITICAL for a in found.values())


def test_lag_is_event_time_behind_the_clock_beyond_the_threshold():
    assert lag_incident(None, 120_000, T0, 60_000) == {}
    assert lag_incident(T0 - 120_000 - 60_000, 120_000, T0, 60_000) == {}
    assert set(lag_incident(T0 - 120_000 - 60_001, 120_000, T0, 60_000)) == {"MONITOR_LAGGING"}


def test_the_book_says_each_incident_once_and_resolves_it_once():
    book = AlertBook()
    lag = lag_incident(1, 0, T0, 10)
    assert [a.state for a in book.reconcile([AlertKind.MONITOR_LAGGING], lag, T0)] == [AlertState.OPEN]
    assert book.reconcile([AlertKind.MONITOR_LAGGING], lag, T0 + 1) == []
    # other kinds are not resolved by a reconcile that does not cover them
    other = Alert(AlertKind.NODE_SILENT, AlertState.OPEN, Severity.WARNING, "quiet", T0, node="n1")
    assert book.record(other) and not book.record(other)
    out = book.reconcile([AlertKind.MONITOR_LAGGING], {}, T0 + 2)
    assert [(a.kind, a.state) for a in out] == [(AlertKind.MONITOR_LAGGING, AlertState.RESOLVED)]
    assert set(book.open) == {other.incident}
    assert book.record(other.resolved("back", T0 + 3)) and book.open == {}


def test_an_alert_is_one_log_line_at_its_severity(caplog):
    a = Alert(AlertKind.TOPIC_NOT_WRITABLE, AlertState.OPEN, Severity.CRITICAL, "no writable queue", T0, topic="T")
    with caplog.at_level(logging.INFO, logger="streaming.alerts"):
        log_alert(a)
    (rec,) = caplog.records
    assert rec.levelno == logging.ERROR
    assert rec.getMessage() == "ALERT OPEN CRITICAL TOPIC_NOT_WRITABLE topic=T: no writable queue"
