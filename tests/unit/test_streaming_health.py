"""The console's health model: what the driver keeps per broker and node, and how hostile values read back."""

from __future__ import annotations

from types import SimpleNamespace

import orjson
import pytest

from common.contract import SchemaError
from streaming import liveness
from streaming.alerts import Alert, AlertKind, AlertState, Severity, encode_alert
from streaming.console.snapshot import build, shown_redis_url
from streaming.health import (
    KIND_ACTION,
    KIND_HEALTH,
    BrokerHealth,
    BrokerStatus,
    HealthBook,
    HealthView,
    NodeHealth,
    checked_alert,
    checked_meta,
    decode_broker,
    decode_monitor,
    decode_node,
    encode_broker,
    encode_node,
)

T0 = 1_700_000_000_000
AT = T0 + 1_500
STATUS = SimpleNamespace(watermark_ms=T0 - 120_000, batches=3, events=30, bad_events=1, batch_durations_ms=[900])


def row(kind: str, t: int, **kw) -> dict:
    out = {c: None for c, _ in liveness.OUTPUT_COLUMNS}
    out.update(kind=kind, orderTime=t, step=0, **kw)
    return out


def beat(t: int, addr: str = "10.0.0.1:1", broker_id: int = 0, state: str = "ALIVE", name: str = "a") -> dict:
    return row(KIND_HEALTH, t, clusterName="C", brokerName=name, brokerId=broker_id, brokerAddr=addr,
               lastHeartbeat=t, timeoutMillis=10_000, state=state)  # fmt: skip


def tick(t: int, node: str = "n1", scan: str | None = "SCAN_OFF") -> dict:
    return row(KIND_HEALTH, t, node=node, lastHeartbeat=t, state=scan)


def observe(book: HealthBook, rows: list[dict], alerts: list[Alert] = (), at: int = AT) -> None:
    book.observe(rows, list(alerts), at, batch_id=7, monitor="m", status=STATUS, delay_ms=120_000)


def flapping(state: AlertState) -> Alert:
    return Alert(AlertKind.BROKER_FLAPPING, state, Severity.WARNING, "flaps", T0, cluster_name="C",
                 broker_addr="10.0.0.1:1")  # fmt: skip


def test_the_output_kinds_are_the_stateful_steps():
    assert (KIND_ACTION, KIND_HEALTH) == (liveness.KIND_ACTION, "HEALTH")


def test_the_book_keeps_the_last_heartbeat_and_folds_in_expiry_comeback_and_flapping():
    book = HealthBook()
    observe(book, [beat(T0), beat(T0 + 1_000), tick(T0 + 900)])
    b = book.brokers["C|10.0.0.1:1"]
    assert (b.last_heartbeat, b.timeout_ms, b.deadline, b.shown_state) == (T0 + 1_000, 10_000, T0 + 11_000, "alive")
    (n,) = book.nodes.values()
    assert (n.last_tick, n.local_scan, n.clock_offset_ms, n.silent) == (T0 + 900, False, T0 + 900 - AT, False)
    writes = book.take()
    assert set(writes.brokers) == {"C|10.0.0.1:1"} and set(writes.nodes) == {"n1"}
    monitor = decode_monitor(writes.monitor)
    assert (monitor.batch_id, monitor.event_time, monitor.lag_ms, monitor.batch_ms) == (7, T0, AT - T0, 900)

    expire = row(KIND_ACTION, T0 + 11_001, type="EXPIRE", clusterName="C", brokerName="a", brokerId=0,
                 brokerAddr="10.0.0.1:1", lastHeartbeat=T0 + 1_000)  # fmt: skip
    observe(book, [expire])
    b = book.brokers["C|10.0.0.1:1"]
    assert (b.state, b.since, b.last_heartbeat) == (BrokerStatus.EXPIRED, T0 + 11_001, T0 + 1_000)
    assert decode_broker(book.take().brokers["C|10.0.0.1:1"]) == b

    observe(book, [beat(T0 + 20_000)], [flapping(AlertState.OPEN)])
    b = book.brokers["C|10.0.0.1:1"]
    assert (b.state, b.shown_state, b.since) == (BrokerStatus.ALIVE, BrokerStatus.FLAPPING, T0 + 20_000)
    assert orjson.loads(book.take().brokers["C|10.0.0.1:1"])["state"] == "flapping"
    observe(book, [], [flapping(AlertState.RESOLVED)])
    assert book.brokers["C|10.0.0.1:1"].shown_state is BrokerStatus.ALIVE


def test_only_changes_are_written_unless_a_full_rewrite_is_asked():
    book = HealthBook()
    observe(book, [beat(T0, "10.0.0.1:1"), beat(T0, "10.0.0.2:1", name="b")])
    book.take()
    observe(book, [beat(T0, "10.0.0.1:1"), beat(T0 + 1, "10.0.0.2:1", name="b")])  # the first is unchanged
    assert list(book.take().brokers) == ["C|10.0.0.2:1"]
    assert book.take().brokers == {}
    full = book.take(full=True)
    assert full.full and set(full.brokers) == {"C|10.0.0.1:1", "C|10.0.0.2:1"}


def test_gone_brokers_and_silent_nodes_are_forgotten_and_the_book_is_bounded():
    book = HealthBook(forget_after_ms=60_000, max_brokers=3)
    observe(book, [beat(T0, "10.0.0.1:1", state="REMOVED"), tick(T0, "old")])
    book.take()
    observe(book, [beat(T0 + 60_001, "10.0.0.2:1"), tick(T0 + 60_001, "new")])
    assert set(book.brokers) == {"C|10.0.0.2:1"} and set(book.nodes) == {"new"}
    assert book.take().brokers == {"C|10.0.0.1:1": None, "C|10.0.0.2:1": book.take(full=True).brokers["C|10.0.0.2:1"]}
    rows = [beat(T0 + 70_000 + i, f"10.0.1.{i}:1") for i in range(3)]
    observe(book, [*rows, beat(T0 + 60_500, "10.0.2.1:1", state="EXPIRED")])
    # four brokers, three allowed: the gone one goes first
    assert len(book.brokers) == 3 and "C|10.0.2.1:1" not in book.brokers
    assert book.take().brokers["C|10.0.2.1:1"] is None


GOOD_BROKER = encode_broker(BrokerHealth("C", "10.0.0.1:1", "a", 0, T0, 10_000, BrokerStatus.ALIVE, False, T0))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(v=2), "not a version-1 object"),
        (lambda d: d.pop("clusterName"), "broker.clusterName: missing"),
        (lambda d: d.update(brokerAddr=["x"]), "broker.brokerAddr: expected a string"),
        (lambda d: d.update(brokerName="x" * 1025), "broker.brokerName: 1025 characters"),
        (lambda d: d.update(lastHeartbeat=2**62), "broker.lastHeartbeat: .* out of range"),
        (lambda d: d.update(timeoutMillis=0), "broker.timeoutMillis: 0 is out of range"),
        (lambda d: d.update(flapping="yes"), "broker.flapping: expected true or false"),
        (lambda d: d.update(state="<b>zombie</b>"), "broker.state: unknown value"),
        (lambda d: d.update(brokerId=True), "broker.brokerId: expected an integer, got bool"),
    ],
)
def test_a_broker_entry_out_of_shape_is_refused_naming_the_field(mutate, message):
    d = orjson.loads(GOOD_BROKER)
    mutate(d)
    with pytest.raises(SchemaError, match=message):
        decode_broker(orjson.dumps(d))


def test_entries_that_are_not_json_or_too_big_are_refused_before_parsing():
    with pytest.raises(SchemaError, match="not JSON"):
        decode_node(b"\xff{")
    with pytest.raises(SchemaError, match="more than the 16384 allowed"):
        decode_node(b'{"v":1,"node":"' + b"x" * 20_000 + b'"}')
    with pytest.raises(SchemaError):  # past int64: orjson refuses it, which must not escape as another error
        decode_node(b'{"v":1,"node":"n","lastTick":' + b"9" * 100 + b',"clockOffsetMillis":0,"silent":false}')
    with pytest.raises(SchemaError, match="node.clockOffsetMillis: missing"):
        decode_node(b'{"v":1,"node":"n","lastTick":1,"silent":false}')
    n = NodeHealth("n", T0, None, -250, True)
    assert decode_node(encode_node(n)) == n


def test_alerts_read_from_redis_are_bounded_field_by_field():
    good = Alert(AlertKind.NODE_SILENT, AlertState.OPEN, Severity.WARNING, "m" * 10_000, T0, node="n1")
    assert len(checked_alert(encode_alert(good, raised_by="m", emitted_at=T0)).message) == 4096
    bad = orjson.loads(encode_alert(good, raised_by="m", emitted_at=T0))
    bad["node"] = {"nested": "object"}
    with pytest.raises(SchemaError, match="alert.node: expected a string"):
        checked_alert(orjson.dumps(bad))
    bad["node"], bad["eventTime"] = "n1", -5
    with pytest.raises(SchemaError, match="alert.eventTime"):
        checked_alert(orjson.dumps(bad))
    with pytest.raises(SchemaError, match="more than the 65536 allowed"):
        checked_alert(b"x" * 70_000)


def test_meta_keeps_only_known_well_formed_fields():
    raw = {b"batchId": b"12", b"watermark": b"x1", b"updatedAt": b"9" * 40, b"lineage": b"q", b"evil": b"<b>"}
    assert checked_meta(raw) == {"batchId": 12, "lineage": "q"}


def test_the_page_document_groups_brokers_master_first_and_flags_groups_without_a_live_master():
    brokers = [
        BrokerHealth("C", "10.0.0.3:1", "b", 1, T0, 10_000, BrokerStatus.ALIVE, False, T0),
        BrokerHealth("C", "10.0.0.2:1", "b", 0, T0, 10_000, BrokerStatus.EXPIRED, False, T0),
        BrokerHealth("C", "10.0.0.1:1", "a", 0, T0, 10_000, BrokerStatus.ALIVE, True, T0),
        BrokerHealth("B", "10.0.0.9:1", None, None, T0, None, BrokerStatus.REMOVED, False, T0),
    ]
    ahead = Alert(AlertKind.NODE_CLOCK_AHEAD, AlertState.OPEN, Severity.WARNING, "ahead", T0, node="n2")
    doc = build(HealthView(brokers=brokers, nodes=[NodeHealth("n2", T0, True, 5, False)], open_alerts=[ahead]))
    assert [c["name"] for c in doc["clusters"]] == ["B", "C"]
    groups = {g["name"]: g for g in doc["clusters"][1]["groups"]}
    assert [(m["id"], m["role"], m["state"]) for m in groups["b"]["members"]] == [
        (0, "master", "expired"), (1, "slave", "alive"),
    ]  # fmt: skip
    assert (groups["b"]["hasMaster"], groups["a"]["hasMaster"]) == (False, True)
    assert groups["a"]["members"][0]["state"] == "flapping"
    assert doc["clusters"][0]["groups"][0]["members"][0]["role"] == "?"
    assert doc["nodes"][0]["clockAhead"] is True
    assert doc["brokerStates"] == {"alive": 1, "flapping": 1, "expired": 1, "removed": 1}


def test_the_page_never_shows_the_redis_password():
    assert shown_redis_url("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert shown_redis_url("redis://:s3cret@h/0") == "redis://:***@h/0"
    assert shown_redis_url("redis://h:1/0") == "redis://h:1/0"


def test_the_page_names_the_broker_as_a_broker_alert_s_subject_and_shows_resolutions_as_info():
    expired = Alert(AlertKind.BROKER_EXPIRED, AlertState.RESOLVED, Severity.CRITICAL, "back", T0, cluster_name="C",
                    broker_name="a", broker_addr="10.0.0.1:1", node="node-9876")  # fmt: skip
    lost = Alert(AlertKind.TOPIC_NOT_WRITABLE, AlertState.RESOLVED, Severity.CRITICAL, "resolved", T0,
                 cluster_name="C", broker_name="a", topics=("T",))  # fmt: skip
    silent = Alert(AlertKind.NODE_SILENT, AlertState.OPEN, Severity.WARNING, "quiet", T0, node="n1")
    doc = build(HealthView(open_alerts=[silent], resolved_alerts=[expired, lost]))
    assert [(a["severity"], a["subject"]) for a in doc["alerts"]["resolved"]] == [
        ("INFO", "a 10.0.0.1:1"), ("INFO", "a"),
    ]  # fmt: skip
    assert [(a["severity"], a["subject"]) for a in doc["alerts"]["open"]] == [("WARNING", "n1")]
