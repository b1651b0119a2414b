"""Routes and cluster info as the nodes answer them, asked once or by a probe that keeps asking."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from common.protocol import bodies
from common.protocol.codes import RequestCode, ResponseCode
from namesrv.client import NameServerClient


@dataclass(frozen=True)
class Answer:
    at: float
    node: str
    #: "ok", a ResponseCode name, or "down"
    outcome: str
    broker_addrs: tuple[str, ...] = ()


def route_or_none(addr: str, topic: str, timeout: float = 3.0) -> bytes | None:
    """The route body ``addr`` answers for ``topic``, None for TOPIC_NOT_EXIST."""
    with NameServerClient(addr, timeout=timeout) as c:
        response = c.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert response is not None
    if response.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert response.code == ResponseCode.SUCCESS, (addr, topic, response.code, response.remark)
    return response.body


def same_route(a: bytes | None, b: bytes | None) -> bool:
    """Equal routes, whatever the order of their lists (clients sort them; two nodes that learnt the
    brokers in another order list them in another order, as Apache RocketMQ's HashMaps do)."""
    if a is None or b is None:
        return a is b
    ra, rb = bodies.decode_route(a), bodies.decode_route(b)
    for r in (ra, rb):
        r.queue_datas.sort(key=lambda q: q.broker_name)
        r.broker_datas.sort(key=lambda d: d.broker_name)
    return ra == rb


def brokers_at(addr: str, timeout: float = 3.0) -> dict[str, dict[int, str]]:
    """brokerName -> {brokerId: addr} from the node's cluster info (groups without addresses left out)."""
    with NameServerClient(addr, timeout=timeout) as c:
        table = c.cluster_info()[0]
    return {name: dict(b.broker_addrs) for name, b in table.items() if b.broker_addrs}


class RouteProbe:
    """Asks every node for ``topic``'s route every ``interval`` s, as a client would, and records the answers."""

    def __init__(self, addrs: list[str], topic: str, interval: float = 0.25) -> None:
        self.addrs = addrs
        self.topic = topic
        self.interval = interval
        self.answers: list[Answer] = []
        self._clients = {a: NameServerClient(a, timeout=2.0) for a in addrs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="route-probe", daemon=True)
        self._thread.start()

    def _ask(self, addr: str) -> Answer:
        client = self._clients[addr]
        try:
            response = client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": self.topic})
        except OSError:
            client.close()
            return Answer(time.monotonic(), addr, "down")
        assert response is not None
        if response.code != ResponseCode.SUCCESS:
            name = (
                ResponseCode(response.code).name
                if response.code in ResponseCode._value2member_map_
                else str(response.code)
            )
            return Answer(time.monotonic(), addr, name)
        route = bodies.decode_route(response.body)
        addrs = tuple(sorted(a for bd in route.broker_datas for a in bd.broker_addrs.values()))
        return Answer(time.monotonic(), addr, "ok", addrs)

    def _run(self) -> None:
        while not self._stop.is_set():
            for addr in self.addrs:
                answer = self._ask(addr)
                self.answers.append(answer)
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for client in self._clients.values():
            client.close()
