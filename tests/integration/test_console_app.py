"""The console against a real Redis, without Spark: the store writes health, the reader checks it, the app serves it.

Redis is a redis-server on a free loopback port (the ``redis_url`` fixture); the web application runs
in aiohttp's test server, so every request goes over real HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from types import SimpleNamespace

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from common import redis_clients
from streaming.alerts import Alert, AlertKind, AlertState, Severity
from streaming.console import ConsoleSettings, build_app
from streaming.health import KIND_HEALTH, HealthBook, HealthReader
from streaming.routes import RedisRouteStore, RouteChanges

T0 = time.time_ns() // 1_000_000
ROUTE = b'{"brokerDatas":[],"queueDatas":[{"brokerName":"a","perm":6,"readQueueNums":4,"writeQueueNums":4}]}'


def health_row(**kw) -> dict:
    base = dict.fromkeys(("node", "clusterName", "brokerName", "brokerId", "brokerAddr", "timeoutMillis", "state"))
    return {**base, "kind": KIND_HEALTH, "orderTime": T0, "lastHeartbeat": T0, **kw}


def broker(addr: str, state: str = "ALIVE", t: int = T0) -> dict:
    return health_row(clusterName="C", brokerName="g", brokerId=0, brokerAddr=addr, timeoutMillis=5_000, state=state,
                      orderTime=t, lastHeartbeat=t)  # fmt: skip


class Writer:
    """The job's side: a HealthBook and the store, one committed batch per :meth:`batch`."""

    def __init__(self, url: str, prefix: str) -> None:
        self.store = RedisRouteStore.from_url(url, prefix)
        self.store.reset()
        self.book = HealthBook()
        self.batch_id = 0

    def batch(self, rows: list[dict], alerts: list[Alert] = (), routes: dict | None = None) -> None:
        self.batch_id += 1
        status = SimpleNamespace(watermark_ms=T0 - 120_000, batches=self.batch_id, events=1, bad_events=0,
                                 batch_durations_ms=[100])  # fmt: skip
        at = time.time_ns() // 1_000_000
        self.book.observe(rows, list(alerts), at, batch_id=self.batch_id, monitor="m", status=status, delay_ms=120_000)
        self.store.commit("L", self.batch_id, RouteChanges(routes=routes or {}), alerts, watermark=status.watermark_ms,
                          monitor="m", replace=self.batch_id == 1, health=self.book.take(full=self.batch_id == 1))  # fmt: skip


@pytest.fixture
def writer(redis_url: str, request: pytest.FixtureRequest) -> Iterator[Writer]:
    w = Writer(redis_url, f"t{abs(hash(request.node.name)) % 10**8}")
    yield w
    w.store.reset()
    w.store.client.close()


def expired_alert(addr: str, state: AlertState = AlertState.OPEN) -> Alert:
    return Alert(AlertKind.BROKER_EXPIRED, state, Severity.CRITICAL, f"broker {addr} expired", T0, cluster_name="C",
                 broker_name="g", broker_addr=addr)  # fmt: skip


def test_what_the_job_writes_reads_back_checked_and_hostile_entries_are_left_out(writer: Writer):
    writer.batch([broker("10.0.0.1:1"), health_row(node="n1", state="SCAN_ON")], [expired_alert("10.0.0.9:1")])
    writer.batch([], [expired_alert("10.0.0.9:1", AlertState.RESOLVED)])
    k = writer.store.keys
    client = writer.store.client
    client.hset(k.health_brokers, "junk", b"\xff not json")
    client.hset(k.health_brokers, "big", b"{" + b" " * 100_000 + b"}")
    client.hset(k.health_nodes, "typed", orjson.dumps({"v": 1, "node": {"a": 1}, "lastTick": 1}))
    client.lpush(k.alerts_resolved, b'{"v":1,"kind":"NOPE"}')
    view = HealthReader(client, writer.store.keys.prefix).read()
    assert [(b.broker_addr, b.state, b.timeout_ms) for b in view.brokers] == [("10.0.0.1:1", "alive", 5_000)]
    assert [(n.node, n.local_scan) for n in view.nodes] == [("n1", True)]
    assert view.monitor is not None and view.monitor.batch_id == 2
    assert view.open_alerts == [] and [a.state for a in view.resolved_alerts] == ["RESOLVED"]
    assert view.skipped == 4 and len(view.problems) == 4
    assert any("more than the 16384 allowed" in p for p in view.problems)


def test_the_reader_reads_at_most_its_cap_of_brokers(writer: Writer):
    writer.batch([broker(f"10.0.0.{i}:1") for i in range(30)])
    view = HealthReader(writer.store.client, writer.store.keys.prefix, max_brokers=10).read()
    assert len(view.brokers) == 10 and view.not_read == {writer.store.keys.health_brokers: 20}


def test_resolved_alerts_are_a_bounded_list_newest_first(writer: Writer):
    for i in range(120):
        writer.batch([], [expired_alert(f"10.0.{i // 250}.{i % 250}:1", AlertState.RESOLVED)])
    stored = writer.store.client.lrange(writer.store.keys.alerts_resolved, 0, -1)
    assert len(stored) == 100 and b"10.0.0.119:1" in stored[0]


def run_app(writer: Writer, body: Callable[[TestClient], Awaitable[None]]) -> None:
    async def main() -> None:
        client = redis_clients.connect(_url(writer))
        app = build_app(ConsoleSettings(_url(writer), writer.store.keys.prefix, poll_ms=100), client)
        async with TestClient(TestServer(app)) as http:
            await body(http)
        client.close()

    asyncio.run(main())


def _url(writer: Writer) -> str:
    kw = writer.store.client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/0"


async def next_event(stream, timeout: float = 5.0) -> dict:
    """The next ``data:`` document on a server-sent event stream (comments skipped)."""
    while True:
        line = await asyncio.wait_for(stream.content.readline(), timeout)
        if line.startswith(b"data: "):
            return orjson.loads(line[6:])


def test_the_page_is_escaped_and_locked_down(writer: Writer):
    async def body(http: TestClient) -> None:
        page = await http.get("/")
        text = await page.text()
        assert page.status == 200 and "script-src 'self'" in page.headers["Content-Security-Policy"]
        assert '<script src="/static/console.js" defer></script>' in text and "<script>" not in text
        assert page.headers["X-Content-Type-Options"] == "nosniff"
        js = await http.get("/static/console.js")
        assert js.status == 200 and "innerHTML" not in await js.text()

    run_app(writer, body)


def test_a_change_in_redis_reaches_the_event_stream_within_a_second(writer: Writer):
    writer.batch([broker("10.0.0.1:1")])

    async def body(http: TestClient) -> None:
        stream = await http.get("/events")
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        first = await next_event(stream)
        while not first.get("clusters"):  # the poller's first read may still be under way
            first = await next_event(stream)
        assert first["redis"]["ok"] and first["clusters"][0]["groups"][0]["members"][0]["state"] == "alive"
        changed_at = time.monotonic()
        await asyncio.to_thread(writer.batch, [broker("10.0.0.1:1", state="EXPIRED", t=T0 + 6_000)],
                                [expired_alert("10.0.0.1:1")])  # fmt: skip
        doc = await next_event(stream)
        while doc["clusters"][0]["groups"][0]["members"][0]["state"] != "expired":
            doc = await next_event(stream)
        assert time.monotonic() - changed_at < 1.0
        assert [a["kind"] for a in doc["alerts"]["open"]] == ["BROKER_EXPIRED"]
        state = await (await http.get("/api/state")).json()
        assert state["monitor"]["batchId"] == writer.batch_id
        stream.close()

    run_app(writer, body)


def test_the_topic_search_shows_the_route_as_redis_holds_it_and_refuses_bad_queries(writer: Writer):
    writer.batch([], routes={"TopicA": ROUTE, "TopicB": ROUTE, "Other*[x]": ROUTE})

    async def body(http: TestClient) -> None:
        found = await (await http.get("/api/route", params={"topic": "TopicA"})).json()
        assert found["found"] and found["route"] == orjson.loads(ROUTE)
        assert found["matches"] == ["TopicA"]
        part = await (await http.get("/api/route", params={"topic": "Topic"})).json()
        assert (part["found"], part["matches"]) == (False, ["TopicA", "TopicB"])
        glob = await (await http.get("/api/route", params={"topic": "*[x]"})).json()
        assert glob["matches"] == ["Other*[x]"]  # a glob character is a character, not a pattern
        for bad in ("", "x" * 1025, "a\nb"):
            answer = await http.get("/api/route", params={"topic": bad})
            assert answer.status == 400 and "error" in await answer.json()

    run_app(writer, body)


def test_redis_unreachable_is_shown_not_fatal(writer: Writer):
    async def body(http: TestClient) -> None:
        stream = await http.get("/events")
        doc = await next_event(stream, timeout=10)
        while doc["redis"]["ok"] or doc["redis"]["error"] == "not read yet":
            doc = await next_event(stream, timeout=10)
        assert "Connection" in doc["redis"]["error"] or "Error" in doc["redis"]["error"]
        answer = await http.get("/api/route", params={"topic": "T"})
        assert answer.status == 503
        stream.close()

    async def main() -> None:
        from infra.processes import free_port

        url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
        client = redis_clients.connect(url, timeout_s=0.5)
        async with TestClient(TestServer(build_app(ConsoleSettings(url, "p", poll_ms=100), client))) as http:
            await body(http)
        client.close()

    asyncio.run(main())
