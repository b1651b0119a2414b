"""Topic lists of a large table are built off the loop (Apache's order costs a walk of every topic) and
cached until the tables change, like the other answers."""

from __future__ import annotations

import pytest

from namesrv import handlers
from namesrv.config import load_config
from namesrv.handlers import HandlerContext, Pending, dispatch
from namesrv.kvconfig import KVConfigManager
from namesrv.protocol import bodies
from namesrv.protocol.codes import RequestCode, ResponseCode
from namesrv.protocol.command import request
from namesrv.routes.javaorder import ConcurrentHashMapKeys, concurrent_hash_map_table_size, hashed, key_set_order
from namesrv.routes.manager import RouteInfoManager
from tests.support.brokers import registration

TOPICS = [f"Topic{i}" for i in range(30)]
ASKS = [
    request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER),
    request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": "C"}),
]


@pytest.fixture
def node(tmp_path):
    config = load_config(None, {"kvConfigPath": str(tmp_path / "kv.json"), "configStorePath": str(tmp_path / "p")})
    n = HandlerContext(config, RouteInfoManager(config), KVConfigManager(tmp_path / "kv.json"), lambda r: True)
    ext, body = registration(broker_addr="127.0.0.1:10911", broker_name="b", cluster="C", topics=TOPICS)
    assert dispatch(n, request(RequestCode.REGISTER_BROKER, ext, body), "channel").code == ResponseCode.SUCCESS
    yield n
    n.close()


def answer(n: HandlerContext, req):
    got = dispatch(n, req, None, wait=False)
    return ("worker", got.resolve()) if isinstance(got, Pending) else ("loop", got)


@pytest.mark.parametrize("ask", ASKS, ids=["all", "by-cluster"])
def test_a_large_tables_list_is_built_off_the_loop_once(node, ask, monkeypatch):
    monkeypatch.setattr(handlers, "OFF_LOOP_TOPICS", len(TOPICS))  # 31 topics with the cluster's own
    where, first = answer(node, ask)
    assert where == "worker" and first.code == ResponseCode.SUCCESS
    # Apache's order: a fresh key set's, filled in the order of its topic table, a ConcurrentHashMap of
    # 2048 bins (these 31 names take a bin each, so the order they came in does not matter)
    table = ConcurrentHashMapKeys(concurrent_hash_map_table_size(1024))
    table.add_all(hashed([*TOPICS, "C"]))
    assert len({h & 2047 for h, _ in table.hashed()}) == len(TOPICS) + 1
    expected = key_set_order(table.hashed())
    assert bodies.decode_topic_list(first.body)[0] == expected
    assert answer(node, ask) == ("loop", first)  # kept: answered on the loop
    ext, body = registration(broker_addr="127.0.0.1:10921", broker_name="b2", cluster="C", topics=["New"])
    dispatch(node, request(RequestCode.REGISTER_BROKER, ext, body), "channel2")
    where, changed = answer(node, ask)
    assert where == "worker" and "New" in bodies.decode_topic_list(changed.body)[0]


def test_a_small_tables_list_is_built_on_the_loop(node):
    for ask in ASKS:
        where, got = answer(node, ask)
        assert where == "loop" and sorted(bodies.decode_topic_list(got.body)[0]) == sorted([*TOPICS, "C"])
