"""A route answer in the dialect of the client's release: standard JSON as fastjson writes it up to 5.3.3,
as fastjson2 does from 5.4.0 on (non-ASCII, "/" and DEL raw), legacy JSON before 4.9.4."""

from __future__ import annotations

import pytest

from common.protocol.codes import RequestCode, ResponseCode, Version
from common.protocol.command import request
from common.routes.manager import RouteInfoManager
from namesrv.config import load_config
from namesrv.handlers import HandlerContext, dispatch
from namesrv.kvconfig import KVConfigManager
from tests.support.brokers import registration

NAME = "broker/é"


@pytest.fixture
def node(tmp_path):
    config = load_config(None, {"kvConfigPath": str(tmp_path / "kv.json"), "configStorePath": str(tmp_path / "p")})
    n = HandlerContext(config, RouteInfoManager(config), KVConfigManager(tmp_path / "kv.json"), lambda r: True)
    ext, body = registration(broker_addr="127.0.0.1:10911", broker_name=NAME, cluster="C", topics=["T"])
    assert dispatch(n, request(RequestCode.REGISTER_BROKER, ext, body), "channel").code == ResponseCode.SUCCESS
    yield n
    n.close()


@pytest.mark.parametrize(
    "version, written",
    [
        (Version.CURRENT, '"brokerName":"broker/é"'),
        (Version.V5_4_0, '"brokerName":"broker/é"'),
        (Version.V5_3_3, '"brokerName":"broker\\/\\u00E9"'),
        (Version.V4_9_4, '"brokerName":"broker\\/\\u00E9"'),
        (63, '"brokerName":"broker/é"'),  # legacy: fastjson's default output, raw
    ],
)
def test_a_route_is_written_as_the_clients_release_writes_it(node, version, written):
    for _ in range(2):  # the second from the cache, which keeps the dialects apart
        got = dispatch(node, request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}, version=version), None)
        assert got.code == ResponseCode.SUCCESS and written.encode() in got.body, got.body
