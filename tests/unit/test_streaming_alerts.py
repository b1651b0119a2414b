from __future__ import annotations

import logging

import orjson
import pytest

from common.protocol.types import BrokerData, QueueData
from common.routes.queries import route_health
from common.routes.tables import RouteTables
from streaming.alerts import (
    MAX_NAMED_TOPICS,
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
    lost_topics,
    route_incidents,
    topic_class,
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
    assert decode_alert(encode_alert(a, raised_by="m", emitted_at=T0)) == a
    assert decode_alert(encode_alert(r, raised_by="m", emitted_at=T0)) == r
    with pytest.raises(ValueError):
        decode_alert(b'{"v": 2}')
    with pytest.raises(ValueError):
        decode_alert(b'{"v": 1, "kind": "NOPE"}')


def test_incident_ids_name_what_the_alert_is_about():
    assert incident_id(AlertKind.TOPIC_NOT_WRITABLE, "C", broker_name="b") == "TOPIC_NOT_WRITABLE|C|b"
    assert incident_id(AlertKind.NODE_SILENT, node="n2") == "NODE_SILENT|n2"
    assert incident_id(AlertKind.GROUP_WITHOUT_MASTER, cluster_name="C", broker_name="b") == "GROUP_WITHOUT_MASTER|C|b"
    assert incident_id(AlertKind.MONITOR_LAGGING) == "MONITOR_LAGGING"


def _health(topics, groups, asked=()):
    return route_health(RouteTables(topic_queue_table=topics, broker_addr_table=groups), list(asked))


def test_route_incidents_are_one_per_broker_group_at_fault_never_one_per_topic():
    groups = {"a": BrokerData("C", "a", {1: "x:1"}), "b": BrokerData("C", "b", {0: "y:1"})}
    topics = {
        "ok": {"b": QueueData("b", 4, 4, 6)},
        "ro": {"b": QueueData("b", 4, 4, 4)},  # b's write permission wiped
        "only-a": {"a": QueueData("a", 4, 4, 6)},  # a has no master: nobody can write
        "a-and-b": {"a": QueueData("a", 4, 4, 6), "b": QueueData("b", 4, 4, 6)},  # b still takes writes
    }
    lost = {("C", "z"): {"gone", "%RETRY%cg", "z"}}  # z expired with its topics
    found = route_incidents(_health(topics, groups, ["gone", "%RETRY%cg", "z"]), at=T0, lost=lost)
    assert set(found) == {"GROUP_WITHOUT_MASTER|C|a", "TOPIC_NOT_WRITABLE|C|b", "TOPIC_NOT_WRITABLE|C|z"}
    assert found["GROUP_WITHOUT_MASTER|C|a"].topics == ("only-a",)
    assert found["TOPIC_NOT_WRITABLE|C|b"].topics == ("ro",)
    z = found["TOPIC_NOT_WRITABLE|C|z"]
    assert z.topics == ("%RETRY%cg", "gone", "z") and (z.cluster_name, z.broker_name) == ("C", "z")
    assert "is gone" in z.message and "1 topic(s): gone" in z.message
    assert "1 %RETRY%/%DLQ% topic(s)" in z.message and "1 system topic(s)" in z.message
    assert all(a.severity is Severity.CRITICAL for a in found.values())


def test_a_topic_that_came_back_or_two_broken_groups_share():
    groups = {"a": BrokerData("C", "a", {0: "x:1"}), "b": BrokerData("C", "b", {0: "y:1"})}
    topics = {
        "shared": {"a": QueueData("a", 4, 4, 4), "b": QueueData("b", 4, 0, 6)},
        "back": {"a": QueueData("a", 4, 4, 6)},
    }
    found = route_incidents(_health(topics, groups, ["back"]), at=T0, lost={("C", "z"): {"back"}})
    # both groups left "shared" unwritable: both name it; "back" has a route again, so z has no incident
    assert {i: a.topics for i, a in found.items()} == {
        "TOPIC_NOT_WRITABLE|C|a": ("shared",),
        "TOPIC_NOT_WRITABLE|C|b": ("shared",),
    }


def test_system_topics_alone_open_nothing_and_are_only_counted():
    """RocketMQ 5 creates rmq_sys_SYNC_BROKER_MEMBER_<name> with the inherit permission only, and the topics named
    after the broker and the cluster without write permission when brokerTopicEnable / clusterTopicEnable are off:
    a healthy cluster must not page for them."""
    groups = {"broker-a": BrokerData("DefaultCluster", "broker-a", {0: "x:1"})}
    inherit_only = QueueData("broker-a", 1, 1, 1)
    topics = {
        "rmq_sys_SYNC_BROKER_MEMBER_broker-a": {"broker-a": inherit_only},
        "broker-a": {"broker-a": inherit_only},
        "DefaultCluster": {"broker-a": inherit_only},
        "DefaultCluster_REPLY_TOPIC": {"broker-a": QueueData("broker-a", 1, 0, 6)},
        "TBW102": {"broker-a": QueueData("broker-a", 8, 0, 7)},
        "T": {"broker-a": QueueData("broker-a", 8, 8, 6)},
    }
    assert route_incidents(_health(topics, groups), at=T0) == {}
    # lost with its group, a broker's own topic is summarised, not named
    lost = {("DefaultCluster", "broker-b"): {"broker-b", "SCHEDULE_TOPIC_XXXX", "%DLQ%g"}}
    (z,) = route_incidents(_health(topics, groups, lost[("DefaultCluster", "broker-b")]), T0, lost).values()
    assert (
        "2 system topic(s)" in z.message and "1 %RETRY%/%DLQ% topic(s)" in z.message and "topic(s): " not in z.message
    )


def test_the_message_names_a_bounded_number_of_topics_and_the_json_a_bounded_list():
    many = {f"T{i:03}" for i in range(250)} | {f"%RETRY%g{i}" for i in range(30)}
    (a,) = route_incidents(_health({}, {}, sorted(many)), T0, {("C", "z"): many}).values()
    assert len(a.topics) == 280
    assert "250 topic(s): T000, T001" in a.message and f"T{MAX_NAMED_TOPICS - 1:03}" in a.message
    assert f"T{MAX_NAMED_TOPICS:03}" not in a.message and f"and {250 - MAX_NAMED_TOPICS} more" in a.message
    assert len(a.message) < 1000
    raw = orjson.loads(encode_alert(a, raised_by="m", emitted_at=T0))
    assert raw["topicCount"] == 280 and raw["topics"] == [f"T{i:03}" for i in range(MAX_NAMED_TOPICS)]
    full = decode_alert(encode_alert(a, raised_by="m", emitted_at=T0, max_topics=10_000))
    assert full == a


def test_lost_topics_carry_over_from_open_incidents_including_per_topic_ones_of_older_versions():
    grouped = Alert(AlertKind.TOPIC_NOT_WRITABLE, AlertState.OPEN, Severity.CRITICAL, "m", T0, cluster_name="C",
                    broker_name="z", topics=("A", "B"))  # fmt: skip
    legacy = Alert(AlertKind.TOPIC_NOT_WRITABLE, AlertState.OPEN, Severity.CRITICAL, "m", T0, topic="old")
    assert legacy.incident == "TOPIC_NOT_WRITABLE|old" and grouped.incident == "TOPIC_NOT_WRITABLE|C|z"
    carried = lost_topics([grouped, legacy], {("C", "y"): {"Y"}}, deleted={"B"})
    assert carried == {("C", "z"): {"A"}, ("", ""): {"old"}, ("C", "y"): {"Y"}}
    found = route_incidents(_health({}, {}, ["A", "old", "Y"]), T0, carried)
    assert "TOPIC_NOT_WRITABLE||" in found and "is unknown" in found["TOPIC_NOT_WRITABLE||"].message
    # the book resolves the per-topic incident and opens the grouped one: nothing is lost on upgrade
    book = AlertBook({legacy.incident: legacy, grouped.incident: grouped})
    out = book.reconcile([AlertKind.TOPIC_NOT_WRITABLE], found, T0 + 1)
    assert {(a.incident, a.state) for a in out} == {
        ("TOPIC_NOT_WRITABLE|old", AlertState.RESOLVED),
        ("TOPIC_NOT_WRITABLE||", AlertState.OPEN),
        ("TOPIC_NOT_WRITABLE|C|y", AlertState.OPEN),
    }
    # z's incident is still open, now naming only A: no transition, but a refresh keeping its start
    (refreshed,) = book.take_refreshed()
    assert (refreshed.incident, refreshed.topics, refreshed.event_time) == ("TOPIC_NOT_WRITABLE|C|z", ("A",), T0)
    assert book.take_refreshed() == []


def test_topic_classes():
    assert topic_class("%RETRY%cg") == topic_class("%DLQ%cg") == "retry"
    for t in ("TBW102", "rmq_sys_REVIVE_LOG_C", "SCHEDULE_TOPIC_XXXX", "C", "b", "C_REPLY_TOPIC"):
        assert topic_class(t, "C", "b") == "system", t
    assert topic_class("other-broker", "C", "b", frozenset({"other-broker"})) == "system"
    assert topic_class("Orders", "C", "b") == "topic"


#: TopicValidator.SYSTEM_TOPIC_SET of Apache RocketMQ 5.5.0 as its class initialiser fills it
ROCKETMQ_5_5_SYSTEM_TOPIC_SET = (
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
    "CHECKPOINT_TOPIC", "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC", "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC",
)  # fmt: skip


@pytest.mark.parametrize(
    "topic", [*ROCKETMQ_5_5_SYSTEM_TOPIC_SET, "DefaultHeartBeatSyncerTopic", "rmq_sys_wheel_timer"]
)
def test_rocketmq_5_5_system_topics_and_the_proxy_heartbeat_topic_are_system(topic):
    assert topic_class(topic, "C", "b") == "system"


def test_a_lost_5_5_group_names_only_its_user_topics():
    """A 5.5 broker group (with a 5.5 proxy beside it) gone: its RocksDB transaction and checkpoint topics
    and the proxy's heartbeat topic are counted as system topics, never named as a user's."""
    own = {"RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC", "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC", "CHECKPOINT_TOPIC"}
    lost = {("C", "z"): {"Orders", "DefaultHeartBeatSyncerTopic", *own}}
    (z,) = route_incidents(_health({}, {}, sorted(lost[("C", "z")])), T0, lost).values()
    assert "1 topic(s): Orders" in z.message and "4 system topic(s)" in z.message, z.message


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


def test_a_resolution_is_logged_as_info_and_keeps_the_incident_s_severity_for_alertmanager(caplog):
    groups = {"a": BrokerData("C", "a", {0: "x:1"})}
    book = AlertBook()
    wiped = route_incidents(_health({"T": {"a": QueueData("a", 4, 4, 4)}}, groups), at=T0)
    (opened,) = book.reconcile([AlertKind.TOPIC_NOT_WRITABLE], wiped, T0)
    (resolved,) = book.reconcile([AlertKind.TOPIC_NOT_WRITABLE], {}, T0 + 1)
    assert (resolved.state, resolved.severity) == (AlertState.RESOLVED, opened.severity) == ("RESOLVED", "CRITICAL")
    with caplog.at_level(logging.INFO, logger="streaming.alerts"):
        log_alert(resolved)
    (rec,) = caplog.records
    assert rec.levelno == logging.INFO
    assert rec.getMessage().startswith("ALERT RESOLVED INFO TOPIC_NOT_WRITABLE cluster=C broker=a: resolved: ")


def test_the_subject_of_a_broker_s_alert_is_the_broker_whichever_node_reported_it():
    back = Alert(
        AlertKind.BROKER_EXPIRED,
        AlertState.RESOLVED,
        Severity.INFO,
        "back",
        T0,
        cluster_name="C",
        broker_name="a",
        broker_addr="10.0.0.1:1",
        node="node-9876",
    )  # as versions before wrote it
    assert back.subject == "a 10.0.0.1:1"
    assert Alert(AlertKind.NODE_SILENT, AlertState.OPEN, Severity.WARNING, "", T0, node="n1").subject == "n1"
    group = Alert(AlertKind.TOPIC_NOT_WRITABLE, AlertState.OPEN, Severity.CRITICAL, "", T0, cluster_name="C",
                  broker_name="a", topics=("T",))  # fmt: skip
    assert group.subject == "a"
    assert Alert(AlertKind.MONITOR_LAGGING, AlertState.OPEN, Severity.WARNING, "", T0).subject == ""
