"""``namesrv simulate``: a fleet of fake brokers talking to name servers over the real protocol.

Theory of operation: each simulated broker behaves like a RocketMQ 5.x broker (spec 3.11).  It keeps
one TCP connection per name server, registers with every name server at start, again 10 s later,
then every ``register_interval`` with an unchanged DataVersion, optionally sends oneway heartbeats,
and sends UNREGISTER_BROKER on shutdown.  Some broker groups can be told to go *silent* (connections
stay open, nothing more is sent: a half-open broker that only liveness expiry removes) or to
*unregister* (UNREGISTER_BROKER, then close) at a given time, so expiry, alerts and routes can be
watched changing without a RocketMQ cluster.

A closed connection unregisters the broker at that node, so the fleet notices closes on every tick
and reconnects with exponential backoff; a node that is down or restarting never stops the fleet.

:class:`Fleet` does no sleeping and reads no clock: :meth:`Fleet.tick` is given the time and does
whatever is due, so tests drive it step by step.  :func:`run` is the thin loop around it.
"""

from __future__ import annotations

import logging
import random
import signal
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from common.protocol import bodies
from common.protocol.codec import RemoteProtocolError
from common.protocol.codes import RequestCode, ResponseCode
from common.protocol.types import DataVersion, RegisterBrokerBody, TopicConfig
from namesrv.acl import Credentials
from namesrv.client import NameServerClient, parse_addr

log = logging.getLogger("namesrv.simulate")
#: one INFO line per event; the CLI turns this logger on while the rest stays quiet
events_log = logging.getLogger("namesrv.simulate.events")

#: a broker's second registration comes this soon after its first (BrokerController's initial delay)
SECOND_REGISTRATION_AFTER = 10.0


class HeartbeatKind(str, Enum):
    QUERY_DATA_VERSION = "query-data-version"  # what 5.x brokers send by default (compatibleWithOldNameSrv)
    BROKER_HEARTBEAT = "broker-heartbeat"


def parse_namesrv_list(text: str) -> tuple[str, ...]:
    """``host:port;host:port`` as in RocketMQ's ``namesrvAddr``; raises ValueError naming the bad part."""
    addrs = tuple(a.strip() for a in text.split(";") if a.strip())
    if not addrs:
        raise ValueError("no name-server address given: use -n host:port[;host:port...]")
    for a in addrs:
        parse_addr(a)
    if len(set(addrs)) != len(addrs):
        raise ValueError(f"a name-server address is listed twice in {text!r}")
    return addrs


@dataclass(frozen=True)
class FleetConfig:
    namesrv: tuple[str, ...]
    #: broker groups; each has one master and ``slaves_per_group`` slaves
    brokers: int = 1
    #: topics owned by each broker group (group b owns T<b*topics> .. T<b*topics+topics-1>, as rmq-loadgen)
    topics: int = 1
    cluster: str = "DefaultCluster"
    slaves_per_group: int = 0
    register_interval: float = 30.0
    #: 0 = no heartbeats between registrations (the 5.x default unless enableSlaveActingMaster)
    heartbeat_interval: float = 0.0
    heartbeat_kind: HeartbeatKind = HeartbeatKind.QUERY_DATA_VERSION
    #: sent as ``heartbeatTimeoutMillis``; None lets the node use its default (120 s)
    heartbeat_timeout_ms: int | None = None
    silent: int = 0
    silent_after: float = 60.0
    unregister: int = 0
    unregister_after: float = 60.0
    addr_base: str = "127.0.0.1:30000"
    queues: int = 8
    #: per request; a node that times out is skipped for the rest of a tick
    timeout: float = 3.0
    summary_interval: float = 10.0
    broker_prefix: str = "broker-"
    topic_prefix: str = "T"
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    #: sign every request (registrations, heartbeats, unregistrations) as a broker with ACL credentials does
    credentials: Credentials | None = None
    #: TLS towards every name server (``--tls`` and friends); None = plaintext
    tls: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        if not self.namesrv:
            raise ValueError("no name-server address given: use -n host:port[;host:port...]")
        value: float  # counts first, then intervals
        for name, value, low in (
            ("--brokers", self.brokers, 1),
            ("--topics", self.topics, 0),
            ("--slaves-per-group", self.slaves_per_group, 0),
            ("--silent", self.silent, 0),
            ("--unregister", self.unregister, 0),
            ("queues", self.queues, 1),
        ):
            if value < low:
                raise ValueError(f"{name} must be at least {low}, got {value}")
        if self.silent + self.unregister > self.brokers:
            raise ValueError(
                f"--silent {self.silent} plus --unregister {self.unregister} exceed --brokers {self.brokers}: "
                "each broker group can do only one of them"
            )
        for name, value in (
            ("--register-interval", self.register_interval),
            ("timeout", self.timeout),
            ("summary interval", self.summary_interval),
            ("backoff", self.backoff_initial),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        for name, value in (
            ("--heartbeat-interval", self.heartbeat_interval),
            ("--silent-after", self.silent_after),
            ("--unregister-after", self.unregister_after),
        ):
            if value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")
        if self.heartbeat_timeout_ms is not None and self.heartbeat_timeout_ms <= 0:
            raise ValueError(f"--heartbeat-timeout-ms must be positive, got {self.heartbeat_timeout_ms}")
        _, port = parse_addr(self.addr_base)
        last = port + 2 * (self.members - 1) + 1
        if last > 65535:
            raise ValueError(
                f"--addr-base {self.addr_base} leaves no room for {self.members} brokers "
                f"(each takes two ports; the last would be {last}): lower the base port"
            )

    @property
    def members(self) -> int:
        return self.brokers * (1 + self.slaves_per_group)


class State(str, Enum):
    LIVE = "live"
    SILENT = "silent"
    UNREGISTERED = "unregistered"
    #: was live when the fleet shut down
    STOPPED = "stopped"


class Backoff:
    """Exponential reconnect delays with jitter, so a returning node is not hit by every broker at once."""

    def __init__(self, initial: float, maximum: float, rng: random.Random, jitter: float = 0.2) -> None:
        self.initial = initial
        self.maximum = max(initial, maximum)
        self.rng = rng
        self.jitter = jitter

    def delay(self, failures: int) -> float:
        """Delay before the next attempt after ``failures`` consecutive failures (>= 1)."""
        base = min(self.maximum, self.initial * 2 ** max(0, failures - 1))
        return base * (1 + self.rng.uniform(-self.jitter, self.jitter))


class _Connection(NameServerClient):
    """One broker's connection to one name server, which can tell when the name server closed it."""

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        self._connect()

    def peer_closed(self) -> bool:
        """Read what is waiting without blocking; True (and closed) if the peer has gone away."""
        sock = self._sock
        if sock is None:
            return False
        sock.settimeout(0.0)
        try:
            data = sock.recv(65536)
        except (BlockingIOError, ssl.SSLWantReadError):  # nothing waiting (over TLS: no whole record yet)
            return False
        except OSError:
            self.close()
            return True
        finally:
            if self._sock is not None:
                sock.settimeout(self.timeout)
        if not data:
            self.close()
            return True
        # name servers may send brokers requests (NOTIFY_MIN_BROKER_ID_CHANGE) that a fake broker ignores
        self._decoder.feed(data)
        try:
            while self._decoder.next_command() is not None:
                pass
        except RemoteProtocolError:
            self.close()
            return True
        return False


@dataclass
class Link:
    """A member's state towards one name server."""

    namesrv: str
    conn: _Connection
    up: bool = False
    #: successful registrations on this link, over its whole life
    registrations: int = 0
    failures: int = 0
    retry_at: float = 0.0
    register_at: float = 0.0
    heartbeat_at: float = 0.0


@dataclass
class SimulatedBroker:
    """One simulated broker: a group's master (id 0) or one of its slaves."""

    group: int
    broker_id: int
    name: str
    addr: str
    ha_addr: str
    state: State
    register_ext: dict[str, str]
    register_body: bytes
    identity_ext: dict[str, str]
    data_version_body: bytes
    links: dict[str, Link] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        return {"broker": self.name, "id": self.broker_id, "addr": self.addr}


EventSink = Callable[[str, dict[str, Any]], None]


def log_event(kind: str, fields: dict[str, Any]) -> None:
    shown = {k: ("true" if v else "false") if isinstance(v, bool) else v for k, v in fields.items()}
    events_log.info(kind, extra={"fields": shown})


class Fleet:
    """The simulated brokers; call :meth:`tick` with the current time, :meth:`shutdown` at the end."""

    def __init__(
        self,
        config: FleetConfig,
        *,
        on_event: EventSink = log_event,
        rng: random.Random | None = None,
        wall_ms: int | None = None,
    ) -> None:
        self.config = config
        self.on_event = on_event
        self.backoff = Backoff(
            config.backoff_initial, min(config.backoff_max, max(config.register_interval, 1.0)), rng or random.Random()
        )
        self.counters = {"registrations": 0, "heartbeats": 0, "unregistrations": 0, "failures": 0, "reconnects": 0}
        self._start: float | None = None
        self._now = 0.0
        self._next_summary = 0.0
        self._links_up_at_exit: dict[str, int] | None = None
        data_version = DataVersion(1, 0, int(time.time() * 1000) if wall_ms is None else wall_ms)
        self.members = self._build_members(data_version)
        groups_from_end = list(range(config.brokers - 1, -1, -1))
        #: the last groups unregister, the ones before them go silent
        self.unregister_groups = sorted(groups_from_end[: config.unregister])
        self.silent_groups = sorted(groups_from_end[config.unregister : config.unregister + config.silent])

    def _build_members(self, dv: DataVersion) -> list[SimulatedBroker]:
        c = self.config
        host, base_port = parse_addr(c.addr_base)
        members = []
        for group in range(c.brokers):
            name = f"{c.broker_prefix}{group}"
            owned = [f"{c.topic_prefix}{group * c.topics + j}" for j in range(c.topics)]
            # every RocketMQ broker also has topics named after its cluster and itself, which keeps a
            # first registration clear of the name server's one-topic guard (spec 3.2 step 7)
            table = {t: TopicConfig(t, c.queues, c.queues) for t in [*owned, c.cluster, name]}
            raw = bodies.encode_register_broker_body(RegisterBrokerBody(dv, table, filter_server_list=[]))
            for broker_id in range(1 + c.slaves_per_group):
                port = base_port + 2 * (group * (1 + c.slaves_per_group) + broker_id)
                addr, ha = f"{host}:{port}", f"{host}:{port + 1}"
                identity = {
                    "brokerName": name,
                    "brokerAddr": addr,
                    "clusterName": c.cluster,
                    "brokerId": str(broker_id),
                }
                ext = {
                    **identity,
                    "haServerAddr": ha,
                    "enableActingMaster": "false",
                    "compressed": "false",
                    "bodyCrc32": str(bodies.body_crc32(raw)),
                }
                if c.heartbeat_timeout_ms is not None:
                    ext["heartbeatTimeoutMillis"] = str(c.heartbeat_timeout_ms)
                m = SimulatedBroker(
                    group, broker_id, name, addr, ha, State.LIVE, ext, raw, identity, bodies.encode_data_version(dv)
                )
                m.links = {
                    ns: Link(ns, _Connection(ns, timeout=c.timeout, credentials=c.credentials, tls=c.tls))
                    for ns in c.namesrv
                }
                members.append(m)
        return members

    # --- the step function ----------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Do everything due at ``now`` (seconds, any monotonic origin)."""
        if self._start is None:
            self._start = now
            self._next_summary = now + self.config.summary_interval
        self._now = now
        self._transitions(now)
        #: name servers that refused or timed out during this tick: skip them until the next one
        unreachable: dict[str, str] = {}
        for m in self.members:
            if m.state is State.LIVE:
                for link in m.links.values():
                    self._service(m, link, now, unreachable)
        if now >= self._next_summary:
            self._next_summary = now + self.config.summary_interval
            self.on_event("summary", self._summary_fields())

    def _started(self) -> float:
        return self._now if self._start is None else self._start

    def next_due(self) -> float:
        """The earliest time at which :meth:`tick` has something to do (closes are noticed only on ticks)."""
        c, start = self.config, self._started()
        due = [self._next_summary]
        if any(m.group in self.silent_groups and m.state is State.LIVE for m in self.members):
            due.append(start + c.silent_after)
        if any(m.group in self.unregister_groups and m.state is State.LIVE for m in self.members):
            due.append(start + c.unregister_after)
        for m in self.members:
            if m.state is State.LIVE:
                for link in m.links.values():
                    if not link.up:
                        due.append(link.retry_at)
                    else:
                        due.append(link.register_at)
                        if c.heartbeat_interval > 0:
                            due.append(link.heartbeat_at)
        return min(due)

    def _transitions(self, now: float) -> None:
        start = self._started()
        for m in self.members:
            if m.state is not State.LIVE:
                continue
            if m.group in self.silent_groups and now >= start + self.config.silent_after:
                m.state = State.SILENT
                # connections stay open: only the name servers' liveness expiry can remove it now
                self.on_event(
                    "silent", {**m.fields(), "heartbeat_timeout_ms": self.config.heartbeat_timeout_ms or 120_000}
                )
            elif m.group in self.unregister_groups and now >= start + self.config.unregister_after:
                self._unregister(m, reason="scheduled")

    def _service(self, m: SimulatedBroker, link: Link, now: float, unreachable: dict[str, str]) -> None:
        if link.up and link.conn.peer_closed():
            self._lost(m, link, now, "the name server closed the connection")
        if not link.up:
            if now < link.retry_at:
                return
            if link.namesrv in unreachable:
                self._lost(m, link, now, unreachable[link.namesrv], attempted=False)
                return
            self._register(m, link, now, unreachable)
        elif now >= link.register_at:
            self._register(m, link, now, unreachable)
        elif self.config.heartbeat_interval > 0 and now >= link.heartbeat_at:
            self._heartbeat(m, link, now, unreachable)

    def _register(self, m: SimulatedBroker, link: Link, now: float, unreachable: dict[str, str]) -> None:
        try:
            response = self._call(link, unreachable, RequestCode.REGISTER_BROKER, m.register_ext, m.register_body)
        except (OSError, RemoteProtocolError) as e:
            self._lost(m, link, now, _describe(e))
            return
        assert response is not None
        if response.code != ResponseCode.SUCCESS:
            # the node is there but refused this broker (e.g. a conflicting address); try again later
            self.counters["failures"] += 1
            link.failures += 1
            if link.up or link.failures == 1:
                self.on_event(
                    "error",
                    {**m.fields(), "namesrv": link.namesrv, "code": response.code, "remark": response.remark or ""},
                )
            link.up = False
            link.retry_at = now + self.backoff.delay(link.failures)
            return
        self.counters["registrations"] += 1
        link.registrations += 1
        if not link.up:
            link.up = True
            self.on_event("registered", {**m.fields(), "namesrv": link.namesrv, "again": link.registrations > 1})
        link.failures = 0
        interval = self.config.register_interval
        link.register_at = now + (min(SECOND_REGISTRATION_AFTER, interval) if link.registrations == 1 else interval)
        link.heartbeat_at = now + self.config.heartbeat_interval

    def _heartbeat(self, m: SimulatedBroker, link: Link, now: float, unreachable: dict[str, str]) -> None:
        if self.config.heartbeat_kind is HeartbeatKind.BROKER_HEARTBEAT:
            ext = dict(m.identity_ext)
            if self.config.heartbeat_timeout_ms is not None:
                ext["heartbeatTimeoutMills"] = str(self.config.heartbeat_timeout_ms)  # sic: 904's spelling
            code, body = RequestCode.BROKER_HEARTBEAT, None
        else:
            ext, code, body = m.identity_ext, RequestCode.QUERY_DATA_VERSION, m.data_version_body
        try:
            self._call(link, unreachable, code, ext, body, oneway=True)
        except (OSError, RemoteProtocolError) as e:
            self._lost(m, link, now, _describe(e))
            return
        self.counters["heartbeats"] += 1
        link.heartbeat_at = now + self.config.heartbeat_interval

    def _call(
        self,
        link: Link,
        unreachable: dict[str, str],
        code: RequestCode,
        ext: dict[str, str],
        body: bytes | None,
        *,
        oneway: bool = False,
    ):
        try:
            if not link.conn.connected:
                link.conn.connect()
            return link.conn.call(code, ext, body, oneway=oneway)
        except (ConnectionRefusedError, TimeoutError) as e:
            # every other broker would wait for the same dead or hung node: spare them this tick
            unreachable[link.namesrv] = _describe(e)
            link.conn.close()
            raise
        except (OSError, RemoteProtocolError):
            link.conn.close()
            raise

    def _lost(self, m: SimulatedBroker, link: Link, now: float, reason: str, *, attempted: bool = True) -> None:
        link.conn.close()
        if attempted:
            self.counters["failures"] += 1
        link.failures += 1
        delay = self.backoff.delay(link.failures)
        link.retry_at = now + delay
        if link.up or link.failures == 1:
            # one line when a link goes down; retries that keep failing are only debug
            self.counters["reconnects"] += 1
            self.on_event(
                "reconnect", {**m.fields(), "namesrv": link.namesrv, "reason": reason, "retry_in_s": round(delay, 2)}
            )
        else:
            log.debug("%s -> %s still unreachable (%s); retry in %.1f s", m.addr, link.namesrv, reason, delay)
        link.up = False

    def _unregister(
        self,
        m: SimulatedBroker,
        *,
        reason: str,
        unreachable: dict[str, str] | None = None,
        final: State = State.UNREGISTERED,
    ) -> None:
        """UNREGISTER_BROKER on every connected link, then close them all (a broker's shutdown)."""
        unreachable = {} if unreachable is None else unreachable
        for link in m.links.values():
            if link.up and link.namesrv not in unreachable and not link.conn.peer_closed():
                try:
                    response = self._call(link, unreachable, RequestCode.UNREGISTER_BROKER, m.identity_ext, None)
                    acked = response is not None and response.code == ResponseCode.SUCCESS
                except (OSError, RemoteProtocolError) as e:
                    log.debug("UNREGISTER_BROKER %s -> %s failed: %s", m.addr, link.namesrv, _describe(e))
                    acked = False
                self.counters["unregistrations"] += int(acked)
                self.on_event("unregistered", {**m.fields(), "namesrv": link.namesrv, "acked": acked, "reason": reason})
            link.conn.close()
            link.up = False
        m.state = final

    def shutdown(self, *, unregister: bool = True) -> None:
        """Stop every broker: live ones unregister (unless told not to, like a crash); all connections close.

        Closing is enough for the name servers to drop a broker, so even without UNREGISTER_BROKER the
        brokers leave the routes within milliseconds; silent brokers just close.
        """
        self._links_up_at_exit = self._links_up()
        unreachable: dict[str, str] = {}
        for m in self.members:
            if m.state is State.LIVE:
                if unregister:
                    self._unregister(m, reason="exit", unreachable=unreachable, final=State.STOPPED)
                m.state = State.STOPPED
        self.close()

    def close(self) -> None:
        """Drop every connection, sending nothing (also what an interrupted shutdown falls back to)."""
        for m in self.members:
            for link in m.links.values():
                link.conn.close()
                link.up = False

    # --- reporting ------------------------------------------------------------------------------

    def _links_up(self) -> dict[str, int]:
        """Per name server, how many live brokers are registered there."""
        live = [m for m in self.members if m.state is State.LIVE]
        return {ns: sum(m.links[ns].up for m in live) for ns in self.config.namesrv}

    def _summary_fields(self) -> dict[str, Any]:
        live = sum(m.state is State.LIVE for m in self.members)
        return {
            "elapsed_s": round(self._now - self._started(), 1),
            **{s.value: sum(m.state is s for m in self.members) for s in State if s is not State.STOPPED},
            "links_up": " ".join(f"{ns}={n}/{live}" for ns, n in self._links_up().items()),
            **self.counters,
        }

    def summary(self) -> dict[str, Any]:
        """Everything a run did, as plain JSON-ready values."""
        c = self.config
        return {
            "namesrv": list(c.namesrv),
            "cluster": c.cluster,
            "broker_groups": c.brokers,
            "brokers": len(self.members),
            "topics_per_group": c.topics,
            "topics": c.brokers * c.topics,
            "elapsed_s": round(self._now - self._started(), 3),
            "states": {s.value: sum(m.state is s for m in self.members) for s in State},
            #: at exit, once the fleet has shut down
            "links_up": self._links_up() if self._links_up_at_exit is None else self._links_up_at_exit,
            "silent_brokers": sorted({f"{c.broker_prefix}{g}" for g in self.silent_groups}),
            "unregistered_brokers": sorted({f"{c.broker_prefix}{g}" for g in self.unregister_groups}),
            **self.counters,
        }


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def run(
    fleet: Fleet,
    *,
    duration: float | None = None,
    unregister_on_exit: bool = True,
    clock: Callable[[], float] = time.monotonic,
    stop: threading.Event | None = None,
) -> dict[str, Any]:
    """Tick ``fleet`` until ``duration`` passes, ``stop`` is set, or SIGINT/SIGTERM; then shut it down.

    A second signal during the shutdown abandons the unregistrations and just closes the connections.
    """
    stop = stop or threading.Event()
    signals_seen = 0

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal signals_seen
        signals_seen += 1
        stop.set()
        if signals_seen > 1:
            raise KeyboardInterrupt

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        try:
            start = clock()
            end = None if duration is None else start + duration
            while not stop.is_set():
                now = clock()
                if end is not None and now >= end:
                    break
                fleet.tick(now)
                # wake at least once a second to notice closed connections and restarted nodes
                wake = min(fleet.next_due(), now + 1.0, end if end is not None else now + 1.0)
                stop.wait(max(0.01, wake - clock()))
            fleet.shutdown(unregister=unregister_on_exit)
        except KeyboardInterrupt:
            log.warning("interrupted twice: closing the connections without unregistering")
            fleet.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return fleet.summary()
