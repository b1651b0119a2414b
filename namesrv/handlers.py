"""One function per request code, and one table from code to function.

Handlers are plain functions ``(context, request, channel) -> response``: no sockets, no awaiting, so a
test calls them directly the way RocketMQ's ``RequestProcessorTest`` calls ``processRequest``.
:func:`dispatch` is the only place that turns an unknown code or an escaping exception into a
response, and the only place that knows oneway requests get no answer.

Work that blocks (writing the KV store or the configuration file, with their fsyncs) or that is large
(inflating and parsing a big registration body) does not run on the event loop: the handler starts it
on a worker thread and returns a :class:`Pending`, whose ``finish`` builds the answer, on the loop,
from the work's result.  ``dispatch`` waits for it unless the server asks for the Pending itself
(``wait=False``); the server then stops reading that connection until the answer is out, so its
requests are still answered in order.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from common.logs import RateLimited
from common.protocol import bodies, fastjson
from common.protocol.codes import (
    MASTER_ID,
    ORDER_TOPIC_CONFIG,
    ZONE_MODE_EXT,
    ZONE_NAME_EXT,
    RequestCode,
    ResponseCode,
    Version,
)
from common.protocol.command import RemotingCommand
from common.protocol.headers import (
    BrokerIdentityHeader,
    BrokerMemberGroupHeader,
    BrokerNameHeader,
    ClusterHeader,
    HeaderError,
    KVConfigHeader,
    RegisterBrokerHeader,
    TopicHeader,
    decode_header,
)
from common.protocol.types import BodyError, DataVersion, QueueData, RegisterBrokerBody, TopicRouteData
from common.routes.manager import RouteInfoManager, UnregisterRequest
from common.routes.model import MinBrokerIdChange, RegisterBrokerResult
from namesrv import config as config_mod
from namesrv import gcpolicy
from namesrv.acl import ACCESS_KEY, BROKER_CODES, BROKER_WARNING_S, Acl, peer_address
from namesrv.answer_cache import AnswerCache
from namesrv.config import NamesrvConfig
from namesrv.kvconfig import KVConfigManager, KVRefused
from namesrv.liveness import Departure, departure

log = logging.getLogger("namesrv.handlers")

FAQ_SUFFIX = "\nSee https://rocketmq.apache.org/docs/bestPractice/06FAQ for further details."


@dataclass(frozen=True, slots=True)
class AdminChange:
    """A route change made by an admin request; which fields are set depends on ``code``."""

    code: RequestCode
    #: WIPE / ADD_WRITE_PERM_OF_BROKER: the group, and how many of its topics changed
    broker_name: str | None = None
    topic_count: int | None = None
    #: DELETE_TOPIC_IN_NAMESRV (with the cluster it was limited to, if any), REGISTER_TOPIC_IN_NAMESRV
    topic: str | None = None
    cluster_name: str | None = None
    #: REGISTER_TOPIC_IN_NAMESRV: the queues registered
    queue_datas: tuple[QueueData, ...] | None = None


class NodeObserver:
    """What a node tells the outside world about brokers and routes (the event publisher overrides these).

    The default does nothing, which is a node that behaves exactly like Apache RocketMQ's.  Every
    call happens on the event loop, after the route tables changed.
    """

    #: a registration the tables accepted or refused (``result.conflict``): the body as decoded;
    #: ``heard_at_ms`` here and below: when it was heard, if not now (:attr:`HandlerContext.heard_at_ms`)
    def broker_registered(
        self,
        header: RegisterBrokerHeader,
        body: RegisterBrokerBody,
        result: RegisterBrokerResult,
        heard_at_ms: int | None = None,
    ) -> None: ...
    #: ``source`` is QUERY_DATA_VERSION or BROKER_HEARTBEAT
    def broker_heartbeat(
        self, cluster_name: str, broker_addr: str, source: RequestCode, heard_at_ms: int | None = None
    ) -> None: ...
    #: the broker's removal was queued, and why (see :mod:`namesrv.liveness.departure`)
    def broker_unregistered(self, request: UnregisterRequest, departure: Departure) -> None: ...
    def route_changed_by_admin(self, change: AdminChange) -> None: ...
    #: after PUT_KV_CONFIG (value as stored, possibly None) or DELETE_KV_CONFIG (value None)
    def kv_config_changed(self, namespace: str, key: str, value: str | None) -> None: ...


@dataclass(frozen=True, slots=True, eq=False)
class HandlerContext:
    """Everything a handler may touch: the tables, the KV store, the settings, and the outlets.

    Built whole, once, before the server serves (:func:`namesrv.app.build_node`); nothing is set on
    it afterwards.
    """

    config: NamesrvConfig
    routes: RouteInfoManager
    kv: KVConfigManager
    #: queue unregistrations for the batch service; False when its queue is full
    submit_unregister: Callable[[list[UnregisterRequest]], bool]
    #: told about brokers and routes (the event publisher, when the node has Kafka)
    observer: NodeObserver = field(default_factory=NodeObserver)
    #: monotonic seconds at start, for needWaitForService
    started_at: float = 0.0
    now: Callable[[], float] = field(default=lambda: 0.0)
    #: sends a NOTIFY_MIN_BROKER_ID_CHANGE to its targets without blocking
    #: (:meth:`namesrv.notify.BrokerNotifier.notify`); None: nothing is sent (a node without a server)
    notify_brokers: Callable[[MinBrokerIdChange], None] | None = None
    #: runs blocking or large work off the event loop (config persistence, big registration bodies);
    #: one thread, so such work from any number of connections never takes more than one core
    worker: Executor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="namesrv-worker"))
    #: signed-request checks (``aclEnable``); None: every request proceeds, as in Apache RocketMQ
    acl: Acl | None = None
    #: the topic tables brokers registered last, so an unchanged one is not parsed again
    register_bodies: bodies.RegisterBodyCache = field(default_factory=bodies.RegisterBodyCache)
    #: encoded answers, valid while :meth:`answer_generation` stays the same
    answers: AnswerCache = field(default_factory=AnswerCache)
    #: when a registration or heartbeat read now was heard, if not now (wall ms): the moment the node
    #: began to stand still, while it reads what queued up meanwhile (:meth:`MonitorWatchdog.heard_at_ms`)
    heard_at_ms: Callable[[], int | None] = field(default=lambda: None)

    def close(self) -> None:
        """Finish the work already started off the loop, then stop its threads."""
        self.worker.shutdown(wait=True)
        self.kv.close()

    def min_broker_id_changed(self, change: MinBrokerIdChange) -> None:
        """Every path that changes a group's minimum id reports here (the route tables decide when)."""
        if self.notify_brokers is not None:
            self.notify_brokers(change)

    def answer_generation(self) -> tuple[int, int, bool, bool]:
        """What cached answers depend on besides the request: it changes whenever one of them may."""
        config = self.config
        return (self.routes.version, self.kv.version, config.order_message_enable, config.support_acting_master)

    def cached(self, key: Hashable, build: Callable[[], bytes]) -> bytes:
        """The encoded answer for ``key``, built by ``build`` unless :attr:`answers` holds it for the
        current :meth:`answer_generation` (the route tables, the KV store and the settings unchanged)."""
        return self.answers.get_or_build(key, self.answer_generation(), build)


@dataclass(slots=True)
class Pending:
    """An answer that waits for work running off the event loop.

    ``finish`` runs on the loop with the work's result and returns the answer; an exception from the
    work or from ``finish`` becomes SYSTEM_ERROR exactly as a handler's would.
    """

    request: RemotingCommand
    future: Future
    finish: Callable[[Any], RemotingCommand]
    #: CPU seconds the work took on its thread, set before ``future`` is done (work started by
    #: :meth:`off_loop`; else 0): what the server charges the connection that asked for it
    cpu_seconds: float = 0.0

    @classmethod
    def off_loop(
        cls,
        executor: Executor,
        request: RemotingCommand,
        work: Callable[[], Any],
        finish: Callable[[Any], RemotingCommand],
    ) -> Pending:
        """``work()`` on ``executor``, its CPU time counted."""
        pending = cls(request, Future(), finish)  # the placeholder future makes way for the work's own
        pending.future = executor.submit(pending._timed, work)
        return pending

    def _timed(self, work: Callable[[], Any]) -> Any:
        start = time.thread_time()
        try:
            return work()
        finally:
            self.cpu_seconds = time.thread_time() - start

    def resolve(self) -> RemotingCommand | None:
        """The answer (None for a oneway request); blocks until the work is done."""
        request, future = self.request, self.future
        # the work's exception is taken, not raised again here: raising it would add this frame, and
        # with it this Pending and its future, to the exception's own traceback, a cycle holding the
        # request (a zip bomb's body, say) until a full collection (see namesrv/gcpolicy.py)
        error = future.exception()
        try:
            response = _failed(request, error) if isinstance(error, Exception) else self.finish(future.result())
        except Exception as e:
            response = _failed(request, e)
        return None if request.is_oneway else response


Handler = Callable[[HandlerContext, RemotingCommand, object], RemotingCommand | Pending]
#: looked up once: an enum member read through its class is a visible share of a heartbeat on 3.11
_QUERY_DATA_VERSION = RequestCode.QUERY_DATA_VERSION
HANDLERS: dict[int, Handler] = {}


def handles(code: RequestCode) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        HANDLERS[int(code)] = fn
        return fn

    return register


def dispatch(
    context: HandlerContext, request: RemotingCommand, channel: object, *, wait: bool = True
) -> RemotingCommand | Pending | None:
    """Answer one request, or None when no answer is owed (oneway requests, stray responses).

    A handler that runs work off the loop gives a :class:`Pending`: with ``wait`` (tests, tools) it
    is waited for here; without, it is returned and the caller calls its ``resolve`` once its
    future is done.
    """
    if request.is_response:
        log.debug("dropping a response frame nobody asked for: code=%s opaque=%s", request.code, request.opaque)
        return None
    handler = HANDLERS.get(request.code)
    acl = context.acl
    if handler is None:
        response = request.response(
            ResponseCode.REQUEST_CODE_NOT_SUPPORTED, f" request type {request.code} not supported"
        )
    elif acl is not None and (refusal := acl.check(request, getattr(channel, "peer", None))) is not None:
        # before the handler, so a refused request changes nothing
        _log_refusal(context, acl, request, getattr(channel, "peer", "?"), refusal)
        response = request.response(ResponseCode.NO_PERMISSION, refusal)
    else:
        try:
            answer = handler(context, request, channel)
        except Exception as e:
            answer = _failed(request, e)
        if isinstance(answer, Pending):
            return answer.resolve() if wait else answer
        response = answer
    return None if request.is_oneway else response


#: a request the node refuses for what it carries: SYSTEM_ERROR naming the problem, no traceback
_REFUSALS = (HeaderError, BodyError, fastjson.FastjsonError, KVRefused, OSError)
#: tracebacks of handler bugs: a peer that keeps triggering one must not flood the log
_bug_log = RateLimited(log, per_minute=10)
#: refused unsigned or wrongly signed requests: a misconfigured broker sends one every heartbeat
_acl_log = RateLimited(logging.getLogger("namesrv.acl"), per_minute=20)


def _log_refusal(context: HandlerContext, acl: Acl, request: RemotingCommand, peer: str, refusal: str) -> None:
    """A WARNING for each refused request but a broker's: one per broker every BROKER_WARNING_S, naming
    it and what to change (a broker that cannot sign, refused every 30 s, would say nothing new)."""
    broker = None
    if request.code in BROKER_CODES:
        try:
            broker = decode_header(BrokerIdentityHeader, request.ext_fields)
        except HeaderError:
            pass
    if broker is None:
        _acl_log.log(logging.WARNING, "refused code=%s peer=%s: %s", request.code, peer, refusal)
        return
    if not acl.warned_brokers.allow((broker.broker_name, broker.broker_addr)):
        _acl_log.logger.debug("refused code=%s peer=%s again: %s", request.code, peer, refusal)
        return
    if (request.ext_fields or {}).get(ACCESS_KEY):
        fix = "check its innerClientAuthenticationCredentials against the accounts in"
    else:  # RocketMQ 4.9 brokers never sign what they send name servers
        fix = f"list its address {peer_address(peer) or peer} in globalWhiteRemoteAddresses of"
    _acl_log.log(
        logging.WARNING,
        "refused broker %s at %s (cluster %s, connected from %s): %s; to let it register, %s aclFile=%s"
        " (said once per broker every %g h)",
        broker.broker_name,
        broker.broker_addr,
        broker.cluster_name,
        peer,
        refusal,
        fix,
        context.config.acl_file_path,
        BROKER_WARNING_S / 3600,
    )


def _failed(request: RemotingCommand, e: Exception) -> RemotingCommand:
    """The one place a failed request becomes SYSTEM_ERROR instead of a dead connection."""
    if not isinstance(e, _REFUSALS):
        _bug_log.log(logging.ERROR, "handler for code %s failed", request.code, exc_info=e)
    return request.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")


# --- KV config ------------------------------------------------------------------------------


@handles(RequestCode.PUT_KV_CONFIG)
def put_kv_config(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand | Pending:
    h = decode_header(KVConfigHeader, request.ext_fields)
    namespace, key, value = h.namespace, h.key, h.value
    if namespace is None or key is None:
        return request.response(ResponseCode.SYSTEM_ERROR, "namespace or key is null")
    problem = context.kv.refusal(namespace, key, value)
    if problem is not None:
        return request.response(ResponseCode.SYSTEM_ERROR, problem)

    def stored(_: None) -> RemotingCommand:
        context.observer.kv_config_changed(namespace, key, value)
        return request.response()

    return Pending(request, context.kv.submit_put(namespace, key, value), stored)


@handles(RequestCode.GET_KV_CONFIG)
def get_kv_config(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    h = decode_header(KVConfigHeader, request.ext_fields)
    value = context.kv.get(h.namespace, h.key) if h.namespace is not None and h.key is not None else None
    if value is None:
        return request.response(
            ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {h.namespace} Key: {h.key}", ext_fields={}
        )
    return request.response(ext_fields={"value": value})


@handles(RequestCode.DELETE_KV_CONFIG)
def delete_kv_config(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand | Pending:
    h = decode_header(KVConfigHeader, request.ext_fields)
    namespace, key = h.namespace, h.key
    if namespace is None or key is None:
        return request.response()

    def deleted(_: None) -> RemotingCommand:
        context.observer.kv_config_changed(namespace, key, None)
        return request.response()

    return Pending(request, context.kv.submit_delete(namespace, key), deleted)


@handles(RequestCode.GET_KVLIST_BY_NAMESPACE)
def get_kvlist_by_namespace(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    h = decode_header(KVConfigHeader, request.ext_fields)
    table = context.kv.get_namespace(h.namespace) if h.namespace is not None else None
    if table is None:
        return request.response(ResponseCode.QUERY_NOT_FOUND, f"No config item, Namespace: {h.namespace}")
    return request.response(body=bodies.encode_kv_table(table))


# --- brokers --------------------------------------------------------------------------------


#: a registration body this large is checked, inflated, parsed and applied on the worker thread: the
#: work grows with the broker's topics, and a large broker's would stall every other client on the
#: loop.  The route tables have their own lock; route answers served from the cache meanwhile need no
#: lock.
OFF_LOOP_BODY_BYTES = 64 * 1024
#: ... unless it is the topic table its broker registered last (the common case: every 30 s) and at
#: most this large: then nothing is parsed and the rows are mostly known to be written, which costs the
#: loop less than the hop to the worker thread and back (docs/internals/caches.md)
REUSED_ON_LOOP_BODY_BYTES = 256 * 1024


@handles(RequestCode.REGISTER_BROKER)
def register_broker(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand | Pending:
    h = decode_header(RegisterBrokerHeader, request.ext_fields)
    heard_at_ms = context.heard_at_ms()  # when it was read, not when the work off the loop gets to it
    key = (h.cluster_name, h.broker_addr)

    def register(reused: RegisterBrokerBody | None = None) -> Any:
        """The refusal, or the body and what registering it did (thread-safe: the tables lock)."""
        if h.body_crc32 and h.body_crc32 != bodies.body_crc32(request.body):
            return request.response(ResponseCode.SYSTEM_ERROR, "crc32 not match")
        body = (
            reused
            if reused is not None
            else context.register_bodies.decode(
                key, request.body, compressed=bool(h.compressed), version=request.version
            )
        )
        result = context.routes.register_broker(
            h.cluster_name,
            h.broker_addr,
            h.broker_name,
            h.broker_id,
            h.ha_server_addr,
            request.ext(ZONE_NAME_EXT),
            h.heartbeat_timeout_millis,
            h.enable_acting_master,
            body,
            channel,
            heard_at_ms,
        )
        return body, result

    def answer(registered: Any) -> RemotingCommand:
        """On the loop: tell the observer and the group's brokers, and answer."""
        if isinstance(registered, RemotingCommand):
            return registered
        body, result = registered
        if result is None:
            return request.response(ResponseCode.SYSTEM_ERROR, "register broker failed")
        context.observer.broker_registered(h, body, result, heard_at_ms)
        if result.min_broker_id_change is not None:
            context.min_broker_id_changed(result.min_broker_id_change)
        ext: dict[str, str] = {}
        if result.ha_server_addr is not None:
            ext["haServerAddr"] = result.ha_server_addr
        if result.master_addr is not None:
            ext["masterAddr"] = result.master_addr
        order_table = (
            context.kv.get_namespace(ORDER_TOPIC_CONFIG) if context.config.return_order_topic_config_to_broker else None
        )
        return request.response(
            ext_fields=ext, body=bodies.encode_kv_table(order_table) if order_table is not None else None
        )

    size = 0 if request.body is None else len(request.body)
    # a compressed body of any size may inflate to 16 MiB: never on the loop
    if size <= OFF_LOOP_BODY_BYTES and not bodies.inflates(
        request.body, compressed=bool(h.compressed), version=request.version
    ):
        return answer(register())
    if size <= REUSED_ON_LOOP_BODY_BYTES:
        # the broker's periodic re-registration of an unchanged table: no parse, a short walk of the rows
        reused = context.register_bodies.reuse(
            key, request.body, compressed=bool(h.compressed), version=request.version
        )
        if reused is not None:
            return answer(register(reused))
    return Pending.off_loop(context.worker, request, functools.partial(gcpolicy.run_large_change, register), answer)


@handles(RequestCode.UNREGISTER_BROKER)
def unregister_broker(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    h = decode_header(BrokerIdentityHeader, request.ext_fields)
    unregister = UnregisterRequest(
        cluster_name=h.cluster_name,
        broker_addr=h.broker_addr,
        broker_name=h.broker_name or "",
        broker_id=h.broker_id,
        decided_seq=context.routes.next_seq(),
    )
    if not context.submit_unregister([unregister]):
        return request.response(ResponseCode.SYSTEM_ERROR)
    context.observer.broker_unregistered(unregister, departure.BROKER_ASKED)
    return request.response()


@handles(RequestCode.QUERY_DATA_VERSION)
def query_data_version(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    h = decode_header(BrokerIdentityHeader, request.ext_fields)
    heard_at_ms = context.heard_at_ms()
    held = context.routes.touch(h.cluster_name, h.broker_addr, heard_at_ms)
    context.observer.broker_heartbeat(h.cluster_name, h.broker_addr, _QUERY_DATA_VERSION, heard_at_ms)
    return data_version_answer(request, held)


def data_version_answer(request: RemotingCommand, held: DataVersion | None) -> RemotingCommand:
    """QUERY_DATA_VERSION's answer when the node holds ``held`` for the broker (None: not registered)."""
    changed = held is None or held != bodies.decode_data_version(request.body)
    return request.response(
        ext_fields={"changed": "true" if changed else "false"},
        body=bodies.encode_data_version(held) if held is not None else None,
    )


@handles(RequestCode.BROKER_HEARTBEAT)
def broker_heartbeat(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    h = decode_header(BrokerIdentityHeader, request.ext_fields)
    heard_at_ms = context.heard_at_ms()
    context.routes.update_broker_info_update_timestamp(h.cluster_name, h.broker_addr, heard_at_ms)
    context.observer.broker_heartbeat(h.cluster_name, h.broker_addr, RequestCode.BROKER_HEARTBEAT, heard_at_ms)
    return request.response()


@handles(RequestCode.GET_BROKER_MEMBER_GROUP)
def get_broker_member_group(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    h = decode_header(BrokerMemberGroupHeader, request.ext_fields)
    # the group's own cluster label is not answered (the header's is): a request without one reads as ""
    group = context.routes.get_broker_member_group(h.cluster_name or "", h.broker_name)
    return request.response(body=bodies.encode_broker_member_group(h.cluster_name, h.broker_name, group.broker_addrs))


# --- routes ---------------------------------------------------------------------------------


@handles(RequestCode.GET_ROUTEINFO_BY_TOPIC)
def get_routeinfo_by_topic(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    cfg = context.config
    if cfg.need_wait_for_service and context.now() - context.started_at < cfg.wait_seconds_for_service:
        return request.response(ResponseCode.SYSTEM_ERROR, "name server not ready")
    h = decode_header(TopicHeader, request.ext_fields)
    zone = _zone_filter(request)
    standard = zone is None and (request.version >= Version.V4_9_4 or bool(h.accept_standard_json_only))
    # a client of 5.4.0 or later gets the standard dialect as its release's NameServer writes it (fastjson2)
    fj2 = standard and request.version >= Version.V5_4_0
    if len(h.topic) <= _TOPIC_MAX_CHARS:
        body = context.cached(
            ("route", h.topic, standard, zone, fj2), lambda: _encode_route(context, h.topic, standard, zone, fj2)
        )
        shown = h.topic
    else:  # no broker creates such a topic (RocketMQ's TopicValidator stops at 127): neither keep nor echo it
        body = _encode_route(context, h.topic, standard, zone, fj2)
        shown = f"{h.topic[:_TOPIC_MAX_CHARS]}... ({len(h.topic)} characters)"
    if not body:
        return request.response(
            ResponseCode.TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {shown}{FAQ_SUFFIX}"
        )
    return request.response(body=body)


#: topic names longer than this are not cached, and are cut short in the TOPIC_NOT_EXIST remark
_TOPIC_MAX_CHARS = 1024


def _zone_filter(request: RemotingCommand) -> str | None:
    """The zone a client restricts its routes to (ZoneRouteRPCHook), or None."""
    mode, zone = request.ext(ZONE_MODE_EXT), request.ext(ZONE_NAME_EXT)
    if mode is None or mode.strip().lower() != "true" or zone is None or not zone.strip():
        return None
    return zone


def _encode_route(context: HandlerContext, topic: str, standard: bool, zone: str | None, fastjson2: bool) -> bytes:
    """The encoded route of a topic, or b"" when there is none (cached like a route)."""
    route = context.routes.pickup_topic_route_data(topic)
    if route is None:
        return b""
    if context.config.order_message_enable:
        route.order_topic_conf = context.kv.get(ORDER_TOPIC_CONFIG, topic)
    if zone is not None:
        route = _keep_zone(route, zone)
    return bodies.encode_route(route, standard=standard, fastjson2=fastjson2)


def _keep_zone(route: TopicRouteData, zone: str) -> TopicRouteData:
    """Keep brokers of the client's zone, and any group whose master is down (cross-zone reads)."""
    kept = [
        b for b in route.broker_datas if MASTER_ID not in b.broker_addrs or (b.zone_name or "").lower() == zone.lower()
    ]
    names = {b.broker_name for b in kept}
    addrs = {a for b in kept for a in b.broker_addrs.values()}
    return TopicRouteData(
        queue_datas=[q for q in route.queue_datas if q.broker_name in names],
        broker_datas=kept,
        filter_server_table={a: s for a, s in route.filter_server_table.items() if a in addrs},
        order_topic_conf=route.order_topic_conf,
        topic_queue_mapping_by_broker=route.topic_queue_mapping_by_broker,
    )


@handles(RequestCode.GET_BROKER_CLUSTER_INFO)
def get_broker_cluster_info(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    return request.response(
        body=context.cached("cluster", lambda: bodies.encode_cluster_info(*context.routes.get_all_cluster_info()))
    )


def _write_perm_handler(code: RequestCode, change: Callable[[RouteInfoManager, str], int], count_key: str) -> None:
    """WIPE and ADD_WRITE_PERM_OF_BROKER differ only in what they do to each queue's perm."""

    def handler(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
        h = decode_header(BrokerNameHeader, request.ext_fields)
        count = change(context.routes, h.broker_name)
        context.observer.route_changed_by_admin(AdminChange(code, broker_name=h.broker_name, topic_count=count))
        return request.response(ext_fields={count_key: str(count)})

    handler.__name__ = code.name.lower()
    handles(code)(handler)


_write_perm_handler(RequestCode.WIPE_WRITE_PERM_OF_BROKER, RouteInfoManager.wipe_write_perm_of_broker, "wipeTopicCount")
_write_perm_handler(RequestCode.ADD_WRITE_PERM_OF_BROKER, RouteInfoManager.add_write_perm_of_broker, "addTopicCount")


@handles(RequestCode.DELETE_TOPIC_IN_NAMESRV)
def delete_topic_in_namesrv(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    h = decode_header(TopicHeader, request.ext_fields)
    context.routes.delete_topic(h.topic, h.cluster_name or None)
    context.observer.route_changed_by_admin(
        AdminChange(RequestCode.DELETE_TOPIC_IN_NAMESRV, topic=h.topic, cluster_name=h.cluster_name or None)
    )
    return request.response()


@handles(RequestCode.REGISTER_TOPIC_IN_NAMESRV)
def register_topic_in_namesrv(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    h = decode_header(TopicHeader, request.ext_fields)
    if request.body:
        queue_datas = bodies.decode_route(request.body).queue_datas
        if queue_datas:
            context.routes.register_topic(h.topic, queue_datas)
            context.observer.route_changed_by_admin(
                AdminChange(RequestCode.REGISTER_TOPIC_IN_NAMESRV, topic=h.topic, queue_datas=tuple(queue_datas))
            )
    return request.response()


# --- topic lists ----------------------------------------------------------------------------


def _topic_list_handler(code: RequestCode, list_topics: Callable[[RouteInfoManager], list[str]], switch: str) -> None:
    def handler(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
        if not getattr(context.config, switch):
            return request.response(ResponseCode.SYSTEM_ERROR, "disable")
        return request.response(
            body=context.cached(code, lambda: bodies.encode_topic_list(list_topics(context.routes)))
        )

    handler.__name__ = code.name.lower()
    handles(code)(handler)


_topic_list_handler(
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER, RouteInfoManager.get_all_topic_list, "enable_all_topic_list"
)
_topic_list_handler(RequestCode.GET_UNIT_TOPIC_LIST, RouteInfoManager.get_unit_topics, "enable_topic_list")
_topic_list_handler(
    RequestCode.GET_HAS_UNIT_SUB_TOPIC_LIST, RouteInfoManager.get_has_unit_sub_topic_list, "enable_topic_list"
)
_topic_list_handler(
    RequestCode.GET_HAS_UNIT_SUB_UNUNIT_TOPIC_LIST,
    RouteInfoManager.get_has_unit_sub_ununit_topic_list,
    "enable_topic_list",
)


@handles(RequestCode.GET_TOPICS_BY_CLUSTER)
def get_topics_by_cluster(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    if not context.config.enable_topic_list:
        return request.response(ResponseCode.SYSTEM_ERROR, "disable")
    h = decode_header(ClusterHeader, request.ext_fields)
    return request.response(body=bodies.encode_topic_list(context.routes.get_topics_by_cluster(h.cluster)))


@handles(RequestCode.GET_SYSTEM_TOPIC_LIST_FROM_NS)
def get_system_topic_list_from_ns(
    context: HandlerContext, request: RemotingCommand, channel: object
) -> RemotingCommand:
    topics, broker_addr = context.routes.get_system_topic_list()
    return request.response(body=bodies.encode_topic_list(topics, broker_addr))


# --- name-server settings -------------------------------------------------------------------


#: the most body bytes a request code may carry, for the server's decoders: a larger body is refused
#: as soon as its header is in and dropped unread as it arrives (``RemotingCommand.body_dropped``)
BODY_LIMITS: dict[int, int] = {int(RequestCode.UPDATE_NAMESRV_CONFIG): config_mod.MAX_UPDATE_BODY_BYTES}
#: the most header bytes a request may carry, for the server's decoders: a longer header closes the
#: connection from the frame's first 8 bytes, before it is buffered or parsed.  The largest header a
#: request the node accepts can have is PUT_KV_CONFIG's (a value of MAX_VALUE_CHARS, a namespace and
#: a key of MAX_NAME_CHARS): 108 KiB even with every character written as a 6-byte \uXXXX escape.
#: RocketMQ's own peers send far less (TopicValidator stops topics at 127 characters, Validators
#: groups at 255).  Java parses a header of up to 16 MiB; here the loop reads, parses and looks up a
#: header while no one else is served, in a time that grows with its size: a header of 128 KiB keeps
#: a well-formed client's lookups within their goal under attack, a 1 MB one did not
#: (docs/internals/testing.md, "Attack latency").  128 KiB also stays below the size from which each
#: buffer is a fresh memory mapping, whose pages fault in anew.
MAX_REQUEST_HEADER_BYTES = 128 * 1024


@handles(RequestCode.UPDATE_NAMESRV_CONFIG)
def update_namesrv_config(
    context: HandlerContext, request: RemotingCommand, channel: object
) -> RemotingCommand | Pending:
    if request.body_dropped:
        refused = config_mod.oversized_update(request.body_dropped)
        return request.response(refused.code, refused.remark)
    if not request.body:
        return request.response()
    update = functools.partial(config_mod.apply_update, context.config, request.body)
    return Pending.off_loop(
        context.worker, request, update, lambda result: request.response(result.code, result.remark)
    )


@handles(RequestCode.GET_NAMESRV_CONFIG)
def get_namesrv_config(context: HandlerContext, request: RemotingCommand, channel: object) -> RemotingCommand:
    # every key with its value, as Java answers, also those the option table marks as having no effect
    # here: tools compare this answer with Java's, so the annotation lives in the README only
    return request.response(body=config_mod.render_properties(context.config).encode("utf-8"))
