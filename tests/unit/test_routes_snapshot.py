"""The Redis route model (common.routes.snapshot): what the job writes, the job and warm start read back.

No Redis here: the values are the bytes the job's store would write (redis-py returns hash keys and
values as bytes, so they are handed over as bytes too).
"""

from __future__ import annotations

import logging

import orjson
import pytest
from routes_support import Clock

from common.contract import DataVersionInfo, Event, EventType, QueueInfo
from common.protocol import bodies, fastjson
from common.protocol.codes import DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS
from common.routes import BrokerAddrInfo, RouteInfoManager, RouteSettings
from common.routes.snapshot import OrderConf, SnapshotError, decode_model, encode_meta
from namesrv.warmstart import WarmStartError, load_model, parse_model
from streaming.routes import RouteModel

T0 = 1_700_000_000_000
SETTINGS = RouteSettings(support_acting_master=True)
A0, A1, A2 = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.9:1"
B0, C1 = "10.0.1.1:1", "10.0.2.2:1"


def reg(cluster: str, name: str, addr: str, bid: int, topics: dict[str, int], *, counter: int = 1,
        state_version: int = 0, timeout: int | None = 120_000, filters: list[str] | None = None,
        mappings: dict[str, dict] | None = None, zone: str | None = None, acting: bool | None = False,
        t: int = T0) -> Event:  # fmt: skip
    return Event(
        type=EventType.REGISTER, node="n1", event_time=t, seq=1, cluster_name=cluster, broker_name=name,
        broker_id=bid, broker_addr=addr, ha_server_addr=f"{addr}0", enable_acting_master=acting, zone_name=zone,
        heartbeat_timeout_millis=timeout, data_version=DataVersionInfo(counter, state_version, T0 + counter),
        topics={n: QueueInfo(q, q, 6) for n, q in topics.items()}, filter_server_list=filters,
        topic_queue_mapping_info_map=None if mappings is None else {
            topic: fastjson.dumps_legacy(info).decode() for topic, info in mappings.items()
        },
    )  # fmt: skip


def mapping(topic: str, bname: str, queues: int) -> dict:
    # more than ten queues: integer and text keys would sort differently
    return {
        "topic": topic,
        "bname": bname,
        "epoch": 1,
        "totalQueues": queues,
        "currIdMap": {i: i for i in range(queues)},
    }


def job_model() -> RouteModel:
    """Everything the snapshot carries: two clusters, slaves, zones, own timeouts, filter servers, static
    mappings, a masterless acting-master group, order confs, and the filter servers Java keeps for a
    broker whose registration lost the stateVersion check."""
    model = RouteModel(SETTINGS)
    for event in (
        reg("C1", "a", A0, 0, {"T1": 4, "T2": 8}, state_version=5, filters=["10.0.5.1:1"],
            mappings={"T1": mapping("T1", "a", 12)}, zone="z1"),
        reg("C1", "a", A1, 1, {"T1": 4, "T2": 8}, state_version=5, timeout=30_000, filters=["10.0.5.2:1"]),
        reg("C1", "a", A2, 2, {"T1": 4, "T2": 8}, state_version=5, filters=["10.0.5.9:1"]),
        # a2 claims id 0 with an older stateVersion: refused, its live entry dropped, its filter servers kept
        reg("C1", "a", A2, 0, {"T1": 4, "T2": 8}, counter=2, state_version=1),
        reg("C2", "b", B0, 0, {"T1": 2, "T3": 1}, timeout=None, mappings={"T3": mapping("T3", "b", 2)}),
        reg("C2", "c", C1, 1, {"T4": 1, "T5": 1}, acting=True),
    ):  # fmt: skip
        model.apply_event(event)
    model.apply_event(Event(type=EventType.ORDER_TOPIC_CONF, node="n2", event_time=T0 + 5, seq=7, topic="T1",
                            order_topic_conf="a:8"))  # fmt: skip
    return model


def written(model: RouteModel) -> tuple[dict[bytes, bytes], dict[bytes, bytes], bytes]:
    """``P:meta``, ``P:model:topics`` and ``P:model:brokers`` as the store writes them and redis-py reads them."""
    changes = model.changes(full=True)
    meta = {k.encode(): str(v).encode() for k, v in encode_meta("query-1", 42, T0 + 9_000, T0 + 1_000).items()}
    entries = {t.encode(): e for t, e in changes.model_topics.items() if e is not None}
    assert changes.model_brokers is not None
    return meta, entries, changes.model_brokers


def test_the_job_reads_back_exactly_what_it_wrote():
    model = job_model()
    meta, entries, brokers = written(model)
    snap = decode_model(meta, entries, brokers)
    assert (snap.batch_id, snap.lineage, snap.updated_at, snap.watermark) == (42, "query-1", T0 + 9_000, T0 + 1_000)
    assert BrokerAddrInfo("C1", A2) in snap.filter_servers and BrokerAddrInfo("C1", A2) not in snap.live
    assert snap.order_topic_conf == {"T1": OrderConf("a:8", T0 + 5, "n2", 7)}

    restored = RouteModel.from_snapshot(snap, SETTINGS)
    assert restored.changes().empty  # the same routes, cluster info, entries and brokers value
    assert restored.manager.encode_model_brokers(snap.order_topic_conf, snap.order_message_enable) == brokers
    for topic in model.topics():
        assert restored.route(topic) == model.route(topic)


def test_warm_start_reads_back_what_the_job_wrote_and_answers_the_same_routes():
    model = job_model()
    meta, entries, brokers = written(model)
    node = RouteInfoManager(SETTINGS, now_ms=Clock())
    report = load_model(node, parse_model(meta, entries, brokers), "test", wall_ms=T0 + 10_000)
    assert (report.batch_id, report.lineage, report.watermark, report.age_ms) == (42, "query-1", T0 + 1_000, 1_000)
    assert report.brokers == 4 and report.longest_timeout_ms == DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS

    assert sorted(node.get_all_topic_list()) == sorted(model.topics())
    for topic in [*model.topics(), "nope"]:
        route = node.pickup_topic_route_data(topic)
        assert (None if route is None else bodies.encode_route(route, standard=True)) == model.route(topic), topic
    assert bodies.encode_cluster_info(*node.get_all_cluster_info()) == model.cluster_info()

    job, warm = decode_model({}, {}, brokers), decode_model({}, {}, node.encode_model_brokers())
    assert warm.groups == job.groups and warm.clusters == job.clusters and warm.mappings == job.mappings
    # what a node serves provisionally: the job's live entries, its clock instead of theirs
    assert {k: v._replace(last_update=0) for k, v in warm.live.items()} == {
        k: v._replace(last_update=0) for k, v in job.live.items()
    }
    # filter servers belong to live entries on a node that starts warm (the refused a2's are not loaded)
    assert warm.filter_servers == {k: v for k, v in job.filter_servers.items() if k in job.live}
    assert all(node.is_provisional(k.cluster_name, k.broker_addr) for k in job.live)


def test_a_live_entry_without_a_timeout_gets_the_default_in_both_readers():
    brokers = orjson.dumps({"groups": {"a": {"cluster": "C", "brokerName": "a", "brokerAddrs": {"0": A0}}},
                            "clusters": {"C": ["a"]}, "live": {f"C|{A0}": {"dataVersion": {"counter": 1}}}})  # fmt: skip
    entries = {b"T": orjson.dumps({"a": {"brokerName": "a", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}})}
    restored = RouteModel.from_snapshot(decode_model({}, entries, brokers))
    node = RouteInfoManager(RouteSettings())
    load_model(node, parse_model({}, entries, brokers), "test", 0)
    for m in (restored.manager, node):
        (live,) = decode_model({}, {}, m.encode_model_brokers()).live.values()
        assert live.timeout_millis == DEFAULT_BROKER_CHANNEL_EXPIRED_MILLIS


def doc(**fields) -> bytes:
    return orjson.dumps(fields)


@pytest.mark.parametrize(
    ("brokers", "names"),
    [
        (b"not json", "model:brokers is not JSON"),
        (b"[1, 2]", "not the documented object"),
        (doc(groups=[]), "groups"),
        (doc(groups={"a": {"brokerAddrs": {"x": A0}}}), "groups['a']"),
        (doc(groups={"a": {"brokerAddrs": {}, "zoneName": 5}}), "groups['a'].zoneName"),
        (doc(clusters={"C": "a"}), "clusters['C']"),
        (doc(clusters={"C": [1]}), "clusters['C']"),
        (doc(live={"no-bar": {}}), "'no-bar'"),
        (doc(live={"C|": {}}), "'C|'"),
        (doc(live={"C|a:1": []}), "live['C|a:1']"),
        (doc(live={"C|a:1": {"timeoutMillis": "30000"}}), "live['C|a:1'].timeoutMillis"),
        (doc(live={"C|a:1": {"timeoutMillis": True}}), "live['C|a:1'].timeoutMillis"),
        (doc(live={"C|a:1": {"lastUpdate": "x"}}), "live['C|a:1'].lastUpdate"),
        (doc(live={"C|a:1": {"haServerAddr": 5}}), "live['C|a:1'].haServerAddr"),
        (doc(live={"C|a:1": {"dataVersion": {"counter": "x"}}}), "live['C|a:1'].dataVersion"),
        (doc(filterServers={"C|a:1": "a:2"}), "filterServers['C|a:1']"),
        (doc(filterServers={"no-bar": []}), "'no-bar'"),
        (doc(mappings={"T": ["b"]}), "mappings['T']"),
        (doc(mappings={"T": {"b": "{not json"}}), "mappings['T']['b']"),
        (doc(mappings={"T": {"b": {"epoch": 1}}}), "mappings['T']['b']"),
        (doc(orderTopicConf={"T": {"conf": "a:8", "eventTime": "1", "node": "n", "seq": 1}}),
         "orderTopicConf['T'].eventTime"),
        (doc(orderTopicConf={"T": {"conf": "a:8", "eventTime": 1, "seq": 1}}), "orderTopicConf['T'].node"),
        (doc(orderMessageEnable="yes"), "orderMessageEnable"),
    ],
)  # fmt: skip
def test_one_validation_refuses_a_malformed_brokers_value_for_both_readers_naming_the_field(brokers, names):
    with pytest.raises(SnapshotError, match="model:brokers") as job_error:
        decode_model({}, {}, brokers)
    assert names in str(job_error.value)
    with pytest.raises(WarmStartError) as warm_error:
        parse_model({}, {}, brokers)
    assert str(warm_error.value) == str(job_error.value)


@pytest.mark.parametrize(
    ("meta", "entries", "names"),
    [
        ({b"batchId": b"x"}, {}, "meta field batchId"),
        ({}, {b"T": b"not json"}, "model:topics field 'T'"),
        ({}, {b"T": b"[]"}, "model:topics field 'T'"),
        ({}, {b"T": orjson.dumps({"b": {"readQueueNums": 1}})}, "model:topics field 'T'"),  # no brokerName
        ({}, {b"\xff": b"{}"}, "not UTF-8"),
    ],
)
def test_malformed_meta_and_topic_entries_are_refused_naming_the_key(meta, entries, names):
    with pytest.raises(SnapshotError, match=names.replace("'", ".")):
        decode_model(meta, entries, None)


def test_a_job_that_finds_an_unreadable_model_starts_empty_and_rewrites_everything(caplog):
    from streaming.config import load_config
    from streaming.sink import BatchSink

    class UnreadableStore:
        replaced: list[bool] = []

        def load(self, *_, **__):
            raise SnapshotError("model:brokers live['no-bar']: not cluster|addr")

        def commit(self, lineage, batch_id, changes, alerts, *, replace, **_):
            self.replaced.append(replace)

        def fallback_removals(self):
            return {}

    class Publisher:
        def send(self, *_): ...
        def flush(self, *_): ...

    cfg = load_config(None, {"redis.url": "redis://unused", "monitor.id": "m"})
    store = UnreadableStore()
    sink = BatchSink(cfg, Publisher(), store, clock=lambda: T0)
    with caplog.at_level(logging.ERROR, "streaming.sink"):
        sink.set_lineage("query-1")
    assert "unreadable route model" in caplog.text and "not cluster|addr" in caplog.text
    assert sink.model.topics() == []
    sink.process([], 0)
    assert store.replaced == [True]  # the first write replaces what could not be read
