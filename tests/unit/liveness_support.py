"""A node's handler context with an injected clock, for the liveness tests: no sleeping."""

from __future__ import annotations

import json

from common.protocol.codes import RequestCode
from common.protocol.command import request
from common.routes.manager import RouteInfoManager
from namesrv.config import load_config
from namesrv.handlers import HandlerContext, dispatch
from namesrv.kvconfig import KVConfigManager
from namesrv.liveness import ExpiryScan, UnregisterBatcher
from tests.support.clock import Clock
from tests.support.node import VECTORS

V = json.loads((VECTORS / "vectors.json").read_text())
V3_EXT = json.loads(next(f for f in V["frames"] if f["name"].startswith("REGISTER_BROKER request"))["header_json"])[
    "extFields"
]
BODY = (VECTORS / "register_broker_body.json").read_bytes()


class Channel:
    closed = False

    def close(self) -> None:
        self.closed = True


def make_node(tmp_path, clock: Clock) -> tuple[HandlerContext, UnregisterBatcher, ExpiryScan]:
    config = load_config(None, {"kvConfigPath": str(tmp_path / "kv.json"), "configStorePath": str(tmp_path / "p")})
    routes = RouteInfoManager(config, now_ms=clock)
    batch = UnregisterBatcher(routes, capacity=2)
    node = HandlerContext(config, routes, KVConfigManager(tmp_path / "kv.json"), batch.submit)
    return node, batch, ExpiryScan(routes, interval_ms=5000)


def route_code(node) -> int:
    return dispatch(node, request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}), None).code


def register(node, channel, **ext):
    assert dispatch(node, request(RequestCode.REGISTER_BROKER, {**V3_EXT, **ext}, BODY), channel).code == 0
