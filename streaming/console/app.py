"""The console's web application: one page, a server-sent event stream, a route lookup.

One :class:`Poller` task per process reads Redis every ``poll_ms`` (on a worker thread: the client
is redis-py's blocking one) and, when the page's document changed, stores the new version and wakes
every stream.  ``GET /events`` sends the current document, then each new version (a slow browser
skips versions rather than queueing them), so a change reaches the page within one poll, without a
reload.  With Redis unreachable the page keeps the last data and says so.  Everything read is
checked by :mod:`streaming.health`, the page only ever sets ``textContent``, and a
Content-Security-Policy forbids inline script; streams, topic queries, matches and routes are
bounded (the ``MAX_*`` constants).  Routes: ``GET /``, ``/events``, ``/api/state``,
``/api/route?topic=T``; ``docs/internals/console.md`` has the details.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import orjson
from aiohttp import web

from common import redis_clients
from common.contract import MAX_NAME_CHARS
from streaming.console import snapshot
from streaming.health import HealthReader

log = logging.getLogger("streaming.console")

HERE = Path(__file__).resolve().parent
MAX_STREAMS = 64
KEEPALIVE_S = 15.0
MAX_MATCHES = 20
MAX_SCAN_STEPS = 50
MAX_ROUTE_BYTES = 4 * 1024 * 1024
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class ConsoleSettings:
    redis_url: str
    prefix: str = "namesrv"
    poll_ms: int = 300


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Poller:
    """Reads Redis every ``poll_ms``; holds the current document and its version, wakes the streams."""

    def __init__(self, read: Callable[[], dict[str, Any]], poll_ms: int) -> None:
        self.read = read
        self.poll_s = poll_ms / 1000
        self.version = 0
        self.doc: dict[str, Any] = {"redis": {"ok": False, "error": "not read yet"}}
        self.changed = asyncio.Condition()
        self.closing = False
        self._last_error: str | None = None

    async def poll_once(self) -> None:
        try:
            doc = await asyncio.to_thread(self.read)
            doc["redis"] = {"ok": True, "error": None}
            if self._last_error is not None:
                log.warning("redis answers again")
            self._last_error = None
        except Exception as exc:  # noqa: BLE001 - any failure to read is shown, never fatal
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            if error != self._last_error:
                log.warning("cannot read redis: %s", error)
            self._last_error = error
            doc = {**self.doc, "redis": {"ok": False, "error": error}}
        if doc != self.doc:
            async with self.changed:
                self.doc = doc
                self.version += 1
                self.changed.notify_all()

    async def run(self) -> None:
        while not self.closing:
            await self.poll_once()
            await asyncio.sleep(self.poll_s)

    async def wait_past(self, version: int, timeout_s: float) -> bool:
        """Wait until the version is not ``version`` (or closing); False after ``timeout_s`` without one."""

        def moved() -> bool:
            return self.version != version or self.closing

        try:
            async with self.changed:
                await asyncio.wait_for(self.changed.wait_for(moved), timeout_s)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        self.closing = True
        async with self.changed:
            self.changed.notify_all()

    def payload(self) -> bytes:
        return orjson.dumps({**self.doc, "now": _now_ms(), "version": self.version})


def _escape_glob(text: str) -> str:
    """``text`` as a literal inside a Redis MATCH pattern."""
    return "".join("\\" + c if c in "\\*?[]^-" else c for c in text)


def _check_topic(query: str) -> str | None:
    """Why ``query`` is not a topic to look up, or None."""
    if not query:
        return "give a topic name: ?topic=T"
    if len(query) > MAX_NAME_CHARS:
        return f"a topic name is at most {MAX_NAME_CHARS} characters"
    if any(not c.isprintable() for c in query):
        return "a topic name has no control characters"
    return None


class RouteSearch:
    """A topic's route as Redis holds it (``streaming.routes.RouteLookup``), and topics whose name contains a text."""

    def __init__(self, client: redis_clients.Client, prefix: str, redis_url: str = "") -> None:
        from streaming.routes import RouteLookup

        self.lookup = RouteLookup(redis_url, prefix, client=client)  # the URL says whether keys are hash-tagged
        self.client = client

    def find(self, query: str) -> dict[str, Any]:
        raw = self.lookup.get_raw(query)
        route: Any = None
        note = None
        if raw is not None and len(raw) > MAX_ROUTE_BYTES:
            note = f"the stored route is {len(raw)} bytes, more than the {MAX_ROUTE_BYTES} shown"
        elif raw is not None:
            try:
                route = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                note = f"the stored route is not JSON: {exc}"
        matches: list[str] = []
        cursor = 0
        pattern = f"*{_escape_glob(query)}*"
        for _ in range(MAX_SCAN_STEPS):
            cursor, found = self.client.sscan(self.lookup.keys.topics, cursor, match=pattern, count=1000)
            for t in found:
                name = t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
                if len(name) <= MAX_NAME_CHARS:
                    matches.append(name)
            if cursor == 0 or len(matches) >= MAX_MATCHES:
                break
        return {
            "topic": query,
            "found": raw is not None,
            "route": route,
            "note": note,
            "matches": sorted(matches)[:MAX_MATCHES],
        }


@web.middleware
async def _headers(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    response.headers.setdefault("X-Frame-Options", "DENY")
    return response


POLLER = web.AppKey("poller", Poller)
SEARCH = web.AppKey("search", RouteSearch)
SETTINGS = web.AppKey("settings", ConsoleSettings)
STREAMS: web.AppKey[set[Any]] = web.AppKey("streams")
JINJA = web.AppKey("jinja", jinja2.Environment)


async def _page(request: web.Request) -> web.Response:
    env = request.app[JINJA]
    s = request.app[SETTINGS]
    html = env.get_template("console.html").render(
        prefix=s.prefix, redis=snapshot.shown_redis_url(s.redis_url), poll_ms=s.poll_ms
    )
    return web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-store"})


async def _state(request: web.Request) -> web.Response:
    return web.Response(body=request.app[POLLER].payload(), content_type="application/json")


async def _events(request: web.Request) -> web.StreamResponse:
    poller = request.app[POLLER]
    streams = request.app[STREAMS]
    if len(streams) >= MAX_STREAMS:
        raise web.HTTPServiceUnavailable(text=f"at most {MAX_STREAMS} consoles at once")
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    task = asyncio.current_task()
    streams.add(task)
    try:
        seen = -1
        while not poller.closing:
            if poller.version != seen:
                seen = poller.version
                await response.write(b"data: " + poller.payload() + b"\n\n")
                continue
            if not await poller.wait_past(seen, KEEPALIVE_S):
                await response.write(b": keepalive\n\n")
    except ConnectionResetError:  # the browser went away
        pass
    finally:
        streams.discard(task)
    return response


async def _route(request: web.Request) -> web.Response:
    query = request.query.get("topic", "")
    problem = _check_topic(query)
    if problem is not None:
        return web.json_response({"error": problem}, status=400)
    try:
        found = await asyncio.to_thread(request.app[SEARCH].find, query)
    except Exception as exc:  # noqa: BLE001 - Redis down or refusing: say so
        return web.json_response({"error": f"cannot read redis: {type(exc).__name__}: {str(exc)[:300]}"}, status=503)
    return web.Response(body=orjson.dumps(found), content_type="application/json")


async def _no_content(request: web.Request) -> web.Response:
    return web.Response(status=204)


def build_app(settings: ConsoleSettings, client: redis_clients.Client) -> web.Application:
    """The application; it starts polling ``client`` when it starts and stops when it shuts down."""
    reader = HealthReader(client, settings.prefix, hash_tag=redis_clients.is_cluster(settings.redis_url))
    app = web.Application(middlewares=[_headers])
    app[SETTINGS] = settings
    app[POLLER] = Poller(lambda: snapshot.build(reader.read()), settings.poll_ms)
    app[SEARCH] = RouteSearch(client, settings.prefix, settings.redis_url)
    app[STREAMS] = set()
    app[JINJA] = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=jinja2.select_autoescape(["html"]),
        undefined=jinja2.StrictUndefined,
    )
    app.router.add_get("/", _page)
    app.router.add_get("/events", _events)
    app.router.add_get("/api/state", _state)
    app.router.add_get("/api/route", _route)
    app.router.add_get("/favicon.ico", _no_content)
    app.router.add_static("/static", HERE / "static", append_version=False)

    async def polling(app: web.Application) -> Any:
        task = asyncio.create_task(app[POLLER].run(), name="console-poller")
        yield
        await app[POLLER].close()
        task.cancel()
        streams: set[Any] = app[STREAMS]
        for stream in list(streams):
            stream.cancel()

    app.cleanup_ctx.append(polling)

    async def closing(app: web.Application) -> None:  # before the server waits for open streams
        await app[POLLER].close()

    app.on_shutdown.append(closing)
    return app
