"""A broker's periodic re-registration of an unchanged topic table: not parsed again, applied on the loop."""

from __future__ import annotations

from common.protocol import bodies
from common.protocol.codes import RequestCode, ResponseCode
from common.protocol.command import request
from common.protocol.types import DataVersion, TopicConfig
from common.routes.manager import RouteInfoManager
from namesrv.config import load_config
from namesrv.handlers import OFF_LOOP_BODY_BYTES, REUSED_ON_LOOP_BODY_BYTES, HandlerContext, Pending, dispatch
from namesrv.kvconfig import KVConfigManager
from tests.support.brokers import registration

TOPICS = 800  # ~100 KB: past the off-loop size, within the size a reused table is applied on the loop
BROKER = {"cluster": "C", "broker_addr": "127.0.0.1:10911", "broker_name": "b", "ha_server_addr": "127.0.0.1:10912"}


def node(tmp_path) -> HandlerContext:
    config = load_config(None, {"kvConfigPath": str(tmp_path / "kv.json"), "configStorePath": str(tmp_path / "p")})
    return HandlerContext(config, RouteInfoManager(config), KVConfigManager(tmp_path / "kv.json"), lambda r: True)


def reregistration(counter: int, perm_of_t0: int = 6):
    """The broker's registration at DataVersion ``counter``: always the same topics, T0's perm as given."""
    topics = {f"T{i}": TopicConfig(f"T{i}", 8, 8, perm_of_t0 if i == 0 else 6) for i in range(TOPICS)}
    ext, body = registration(**BROKER, configs=topics, data_version=DataVersion(counter, 0, 1))
    assert OFF_LOOP_BODY_BYTES < len(body) <= REUSED_ON_LOOP_BODY_BYTES
    return request(RequestCode.REGISTER_BROKER, ext, body)


def answer(n: HandlerContext, req):
    got = dispatch(n, req, "channel", wait=False)
    return ("worker", got.resolve()) if isinstance(got, Pending) else ("loop", got)


def perm_of(n: HandlerContext, topic: str = "T0") -> int:
    route = dispatch(n, request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), None)
    assert route.code == ResponseCode.SUCCESS
    return bodies.decode_route(route.body).queue_datas[0].perm


def test_an_unchanged_table_is_applied_on_the_loop_and_a_changed_one_on_the_worker(tmp_path):
    n = node(tmp_path)
    try:
        where, first = answer(n, reregistration(1))
        assert (where, first.code) == ("worker", ResponseCode.SUCCESS)
        where, again = answer(n, reregistration(2))  # a new DataVersion, the same topics
        assert (where, again.code) == ("loop", ResponseCode.SUCCESS)
        assert n.routes.touch("C", "127.0.0.1:10911") == DataVersion(2, 0, 1)
        where, changed = answer(n, reregistration(3, perm_of_t0=4))
        assert (where, changed.code) == ("worker", ResponseCode.SUCCESS)
        assert perm_of(n) == 4
        # a name-server-side wipe is undone by the next changed DataVersion (as in Java), reused table or not
        wipe = dispatch(n, request(RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "b"}), None)
        assert wipe.code == ResponseCode.SUCCESS and perm_of(n, "T1") == 4
        assert answer(n, reregistration(4, perm_of_t0=4))[0] == "loop"
        assert (perm_of(n), perm_of(n, "T1")) == (4, 6)
        assert n.register_bodies.hits == 2
    finally:
        n.close()


def test_a_reused_body_still_has_its_crc_checked(tmp_path):
    n = node(tmp_path)
    try:
        answer(n, reregistration(1))
        bad = reregistration(2)
        bad.ext_fields["bodyCrc32"] = "1"
        where, refused = answer(n, bad)
        assert refused.code == ResponseCode.SYSTEM_ERROR and refused.remark == "crc32 not match"
        assert n.routes.touch("C", "127.0.0.1:10911") == DataVersion(1, 0, 1)
    finally:
        n.close()
