"""The liveness rules as plain functions: a broker's or node's state and events in, new state and outputs out.

When a broker expires (event time reaches ``lastSeen + timeout + 1``), when it is removed (it
unregistered, or its connection is gone at every node that held one), which registrations the route
materialisation must see, and which alerts open and resolve: all of it is decided here, and every
time computation (deadlines, watermark-time wake-ups, the flapping window, node silence) is made
here. :mod:`streaming.liveness` is the Spark side: it keeps these states in Spark's state store,
packs brokers into buckets with one Spark timer each, and turns the outputs into the step's rows.
Nothing here imports Spark or reads a clock, so each rule is tested with plain values. The whole
design: docs/internals/monitor-liveness.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypedDict

import orjson

from common.contract import ActionType, EventType, UnregisterSource
from common.protocol.codes import MASTER_ID
from streaming.alerts import AlertKind, AlertState, Severity
from streaming.health import scan_state

#: no wake-up wanted
NO_TIMER = -1
#: nodes remembered per broker in ``links``; a fleet has a handful, this bounds what a bad stream can add
_MAX_LINKS = 64
#: N nodes report each periodic re-registration within moments; pass one of them
REPLAY_GAP_MS = 10_000
#: registration fields that do not change what it says about the broker
_VOLATILE = ("node", "eventTime", "seq", "reason")


@dataclass(frozen=True)
class LivenessSettings:
    heartbeat_timeout_ms: int = 120_000
    flap_threshold: int = 3
    flap_window_ms: int = 600_000
    node_silent_ms: int = 30_000
    remove_on_channel_close: bool = False
    #: how late an event may arrive (Spark's watermark delay); timers are shifted by it, decisions are not
    watermark_delay_ms: int = 120_000
    #: a broker gone this long (event time) is forgotten: its state is dropped, its incidents resolved
    forget_after_ms: int = 86_400_000

    def timer_at(self, event_time: int) -> int:
        """The watermark at which event time reaches ``event_time``: where a wake-up for it goes."""
        return event_time - self.watermark_delay_ms

    def event_time_at(self, watermark: int) -> int:
        """The event time (largest seen) that a watermark stands for."""
        return watermark + self.watermark_delay_ms


@dataclass
class BrokerState:
    cluster_name: str
    broker_addr: str
    broker_name: str | None = None
    broker_id: int | None = None
    #: newest REGISTER/HEARTBEAT event time
    last_seen: int = 0
    timeout_ms: int = 120_000
    #: its next wake-up (watermark time): the liveness deadline ``last_seen + timeout_ms + 1`` while
    #: alive, the forget deadline ``gone_at + forget_after_ms`` while gone; -1 for none
    deadline: int = NO_TIMER
    alive: bool = True
    #: event time of the EXPIRE/REMOVE
    gone_at: int = 0
    expired_open: bool = False
    removed_open: bool = False
    flapping_open: bool = False
    #: the flapping re-check wake-up (watermark time), or -1
    flap_timer: int = NO_TIMER
    #: fingerprint of the last registration passed to the route materialisation
    registration: str = ""
    #: event time the last registration was passed again for an unchanged re-registration
    replayed_at: int = 0
    #: JSON ``{node: [eventTime, open]}``: each node's last word on its connection (:class:`Links`)
    links: str = "{}"
    #: JSON list of the event times of its expiries and comebacks within the flapping window. Kept in
    #: this row rather than a list state: every state variable costs a JVM round trip per task to open
    #: and per key to read, and the list is at most ``flap_threshold + 1`` long
    flaps: str = "[]"

    @classmethod
    def from_tuple(cls, values: tuple) -> BrokerState:
        return cls(*values)


@dataclass
class NodeState:
    node: str
    last_tick: int = 0
    #: the earliest Spark timer registered for the node (watermark time), or -1; kept by the adapter
    deadline: int = NO_TIMER
    silent_open: bool = False

    @classmethod
    def from_tuple(cls, values: tuple) -> NodeState:
        return cls(*values)


class PackedEvent(TypedDict):
    """An event as the stateful step gets it: :data:`streaming.events.PACKED_FIELDS`, nulls included."""

    type: str
    node: str
    eventTime: int
    seq: int
    #: set in every event of a broker (the schema requires them); null only in node-keyed ones
    clusterName: str
    brokerAddr: str
    brokerName: str | None
    brokerId: int | None
    source: str | None
    heartbeatTimeoutMillis: int | None
    localScan: bool | None
    #: set for the types that carry their JSON (streaming.events.RAW_TYPES), the only ones that read it
    raw: str


# --------------------------------------------------------------------------- outputs


@dataclass(slots=True)
class Broker:
    """The broker an output is about, as it was known when the output was made."""

    cluster_name: str
    broker_addr: str
    broker_name: str | None
    broker_id: int | None


@dataclass(slots=True)
class ActionRow:
    """EXPIRE or REMOVE, for the nodes to apply."""

    #: event time the decision stands at (every output's ``at`` orders the batch's outputs)
    at: int
    type: ActionType
    cause: str
    #: the newest event time seen for the broker: a node that saw anything newer ignores the action
    last_heartbeat: int
    watermark: int
    reason: str
    broker: Broker
    #: the event that decided it, if one did (a timer decides an EXPIRE)
    node: str | None = None
    seq: int | None = None


@dataclass(slots=True)
class RouteRow:
    """What the route materialisation applies: a registration, or an ADMIN / ORDER_TOPIC_CONF event."""

    at: int
    type: str
    #: the event's JSON
    raw: str
    node: str
    seq: int
    #: None for a new registration; COMEBACK or REREGISTER for the last one passed again
    cause: str | None = None
    broker: Broker | None = None


@dataclass(slots=True)
class AlertChange:
    """An incident opened or resolved (streaming.alerts keeps and publishes them).

    Its severity is the incident's, the same on both (Alertmanager identifies an alert by its labels).
    """

    at: int
    kind: AlertKind
    state: AlertState
    severity: Severity
    message: str
    broker: Broker | None = None
    #: the node it is about (NODE_SILENT); a broker's incident names none, whichever node reported it
    node: str | None = None
    seq: int | None = None


@dataclass(slots=True)
class HealthRow:
    """For the console: a broker's newest heartbeat and state, or a node's newest tick and scan state."""

    at: int
    last_heartbeat: int
    state: str | None
    broker: Broker | None = None
    timeout_ms: int | None = None
    node: str | None = None


Output = ActionRow | RouteRow | AlertChange | HealthRow


class BrokerUpdate(NamedTuple):
    #: the state to keep; None when there is nothing to remember about the broker
    state: BrokerState | None
    outputs: list[Output]
    #: a registration that differs from the last one passed: the caller keeps it for replays
    registration: str | None


# --------------------------------------------------------------------------- brokers

#: event types as module constants: an enum's class attribute is dear to look up once per event
_REGISTER, _SILENT = EventType.REGISTER, EventType.SILENT
_UNREGISTER, _CHANNEL_CLOSED = EventType.UNREGISTER, EventType.CHANNEL_CLOSED
#: proof of life; a departure (compared with ==: the events' types are the JSON's text)
_ALIVE_TYPES = (_REGISTER, EventType.HEARTBEAT)
_GONE_TYPES = (_UNREGISTER, _CHANNEL_CLOSED)


def broker_events(
    held: BrokerState | None,
    events: Sequence[PackedEvent],
    watermark: int,
    settings: LivenessSettings,
    stored_registration: Callable[[], str | None],
) -> BrokerUpdate:
    """One broker's events of a batch, in event-time order; ``held`` is updated in place.

    ``stored_registration`` returns the last registration kept (:attr:`BrokerUpdate.registration`),
    called only when one is to be passed again: reading it is a round trip to Spark's state store.
    """
    first = events[0]
    st = held
    if st is None:
        st = BrokerState(
            first["clusterName"], first["brokerAddr"], timeout_ms=settings.heartbeat_timeout_ms, alive=False
        )
    batch = _BrokerBatch(st, held is not None, watermark, settings, stored_registration)
    for e in events:
        etype = e["type"]
        if etype in _ALIVE_TYPES:
            batch.heard(e)
        elif etype == _SILENT:
            batch.silent(e)
        elif etype in _GONE_TYPES:
            batch.departed(e)
    return batch.finish(events[-1]["eventTime"])


class _BrokerBatch:
    """The working set of :func:`broker_events`: links and flaps are parsed once and written back once."""

    def __init__(
        self,
        st: BrokerState,
        known: bool,
        watermark: int,
        settings: LivenessSettings,
        stored_registration: Callable[[], str | None],
    ) -> None:
        self.st = st
        self.watermark = watermark
        #: the event time the watermark stands for: what is past its deadline by then is decided
        self.now = settings.event_time_at(watermark)
        self.settings = settings
        self.stored_registration = stored_registration
        #: a broker with no state before this batch is remembered only once it is heard from
        self.known = known
        self.flaps = _flaps(st)
        self.links = Links.load(st.links)
        self.out: list[Output] = []
        self.new_registration: str | None = None

    def heard(self, e: PackedEvent) -> None:
        """REGISTER or HEARTBEAT: proof of life, at ``e['node']``, at its event time."""
        st, t = self.st, int(e["eventTime"])
        if self.known and not st.alive and (t <= st.last_seen or t + st.timeout_ms < self.now):
            # Old news, not a comeback: no newer than what its departure counted (a node woken from
            # standing still stamps what queued up for it with when it stopped), or past its own deadline
            # already (a node's events read late). A registration is kept for the comeback that replays it.
            if e["type"] == _REGISTER:
                st.registration = registration_fingerprint(e["raw"])
                self.new_registration = e["raw"]
            return
        # its incidents resolve with the severity they opened with, whatever brokerId it comes back with
        held_id = st.broker_id
        self.links.report(e["node"], t, connected=True)
        if e["brokerName"] is not None:
            st.broker_name = e["brokerName"]
        if e["brokerId"] is not None:
            st.broker_id = int(e["brokerId"])
        if e["heartbeatTimeoutMillis"] is not None:
            st.timeout_ms = int(e["heartbeatTimeoutMillis"])
        comeback = not st.alive
        st.alive = True
        st.last_seen = max(st.last_seen, t)
        if e["type"] == _REGISTER:
            fingerprint = registration_fingerprint(e["raw"])
            if comeback or fingerprint != st.registration:
                st.registration = fingerprint
                self.new_registration = e["raw"]
                self.out.append(RouteRow(t, e["type"], e["raw"], e["node"], e["seq"], broker=_broker(st)))
        elif (comeback or (e["source"] == "REGISTER_BROKER" and t - st.replayed_at >= REPLAY_GAP_MS)) and (
            raw := self._last_registration()
        ) is not None:
            # A comeback: nodes that did not apply our removal send no topic table, so bring the last
            # one back. An unchanged re-registration: nodes re-add topics an admin deleted meanwhile,
            # so the route model must see it too.
            st.replayed_at = t
            cause = "COMEBACK" if comeback else "REREGISTER"
            self.out.append(RouteRow(t, _REGISTER, raw, e["node"], e["seq"], cause=cause, broker=_broker(st)))
        if comeback and self.known:
            self.flaps.append(t)
            _resolve_gone(st, t, e["node"], held_id, self.out)
        self.known = True

    def _last_registration(self) -> str | None:
        # (the stored one is read only here, and only when needed: a state read is a JVM round trip)
        return self.new_registration if self.new_registration is not None else self.stored_registration()

    def silent(self, e: PackedEvent) -> None:
        """A node's clock passed its own deadline for the broker: decide now if ours has passed too
        (every node's heartbeats counted, not just that node's), rather than at the timer a batch later."""
        st, t = self.st, int(e["eventTime"])
        if st.alive and self.known and t >= broker_due(st, self.settings):
            _expire(st, t, t, self.watermark, self.flaps, self.out)

    def departed(self, e: PackedEvent) -> None:
        """UNREGISTER or CHANNEL_CLOSED: REMOVE once when the broker asked, or no node holds a connection."""
        st, t, etype = self.st, int(e["eventTime"]), e["type"]
        closed = etype == _CHANNEL_CLOSED and self.links.report(e["node"], t, connected=False)
        if not st.alive or t < st.last_seen:
            return  # already gone, or the broker proved alive after this report
        asked = etype == _UNREGISTER and e["source"] == UnregisterSource.UNREGISTER_BROKER
        everywhere = closed and not self.links.holders()
        if not (asked or everywhere or (closed and self.settings.remove_on_channel_close)):
            return  # an echo of an expiry or of our own action, or a close at only some nodes
        cause = str(UnregisterSource.UNREGISTER_BROKER) if asked else str(EventType.CHANNEL_CLOSED)
        if asked:
            how, reason = "unregistered", f"{cause} reported by {e['node']} at {t}"
        elif everywhere:
            how = "lost its connection at every node that held one"
            reason = f"{cause} at {self.links.describe_closed()}"
        else:
            how, reason = "lost its connection", f"{cause} reported by {e['node']} at {t}"
        st.alive = False
        st.gone_at = t
        broker = _broker(st)
        action = ActionRow(t, ActionType.REMOVE, cause, t, self.watermark, reason, broker, node=e["node"], seq=e["seq"])
        self.out.append(action)
        if st.removed_open:
            return
        message = f"broker {_name(st)} {how} ({reason}); removed at every node"
        kind = AlertKind.BROKER_REMOVED
        if asked:
            # a clean shutdown is someone's intent, not a fault: a notice, opened and resolved at once, that
            # pages nobody (docs/monitor.md, "Alerts")
            self.out.append(AlertChange(t, kind, AlertState.OPEN, Severity.INFO, message, broker))
            notice = f"broker {_name(st)} unregistered (a clean shutdown): a notice, nothing stays open"
            self.out.append(AlertChange(t, kind, AlertState.RESOLVED, Severity.INFO, notice, broker))
        else:
            st.removed_open = True
            self.out.append(AlertChange(t, kind, AlertState.OPEN, _severity(kind, st.broker_id), message, broker))

    def finish(self, last_event_time: int) -> BrokerUpdate:
        st = self.st
        if not self.known:
            return BrokerUpdate(None, [], None)  # only reports of its departure: nothing to remember
        st.links = self.links.dump()
        state = "ALIVE" if st.alive else "EXPIRED" if st.expired_open else "REMOVED"
        self.out.append(HealthRow(last_event_time, st.last_seen, state, _broker(st), st.timeout_ms))
        _check_flapping(st, self.flaps, last_event_time, self.settings, self.out)
        _arm(st, self.settings)
        st.flaps = orjson.dumps(self.flaps).decode()
        return BrokerUpdate(st, self.out, self.new_registration)


def broker_timer(
    st: BrokerState, watermark: int, settings: LivenessSettings
) -> tuple[BrokerState | None, list[Output]]:
    """The broker's wake-up has come (watermark time); ``st`` is updated in place, None: forget it."""
    out: list[Output] = []
    flaps = _flaps(st)
    now = settings.event_time_at(watermark)
    if st.deadline != NO_TIMER and st.deadline <= watermark:
        # a wake-up, not a verdict: look at the deadline as it is now
        st.deadline = NO_TIMER
        due = broker_due(st, settings)
        if due <= now and not st.alive:
            _forget(st, due, settings, out)
            return None, out
        if due <= now:
            _expire(st, due, now, watermark, flaps, out)
    if st.flap_timer != NO_TIMER and st.flap_timer <= watermark:
        st.flap_timer = NO_TIMER
    _check_flapping(st, flaps, now, settings, out)
    _arm(st, settings)
    st.flaps = orjson.dumps(flaps).decode()
    return st, out


def broker_due(st: BrokerState, settings: LivenessSettings) -> int:
    """Event time of the broker's next decision: expiry while alive (once *past* ``last_seen + timeout``,
    as RocketMQ's ``last + timeout < now``), forgetting it while gone."""
    return st.last_seen + st.timeout_ms + 1 if st.alive else st.gone_at + settings.forget_after_ms


def _arm(st: BrokerState, settings: LivenessSettings) -> None:
    """The broker's wake-up at its next decision; the adapter's Spark timer follows it."""
    st.deadline = settings.timer_at(broker_due(st, settings))


def _expire(st: BrokerState, due: int, now: int, watermark: int, flaps: list[int], out: list[Output]) -> None:
    """EXPIRE once, at event time ``due``: nothing was heard from the broker at any node since ``last_seen``."""
    st.alive = False
    st.gone_at = due
    reason = (
        f"no heartbeat at any node for {(now - st.last_seen) / 1000:.1f} s "
        f"(timeout {st.timeout_ms} ms, last heartbeat at {st.last_seen}, event time now {now})"
    )
    broker = _broker(st)
    out.append(ActionRow(due, ActionType.EXPIRE, "TIMEOUT", st.last_seen, watermark, reason, broker))
    flaps.append(due)
    if not st.expired_open:
        st.expired_open = True
        severity = _severity(AlertKind.BROKER_EXPIRED, st.broker_id)
        message = f"broker {_name(st)} expired: {reason}"
        out.append(AlertChange(due, AlertKind.BROKER_EXPIRED, AlertState.OPEN, severity, message, broker))


def _severity(kind: AlertKind, broker_id: int | None) -> Severity:
    """A broker incident's severity, when it opens and when it resolves: a master's expiry stops its
    group's writes (CRITICAL); the rest is a WARNING."""
    critical = kind is AlertKind.BROKER_EXPIRED and broker_id == MASTER_ID
    return Severity.CRITICAL if critical else Severity.WARNING


def _forget(st: BrokerState, at: int, settings: LivenessSettings, out: list[Output]) -> None:
    """Gone for ``forget_after_ms``: end its incidents; the caller drops everything kept about it."""
    days = settings.forget_after_ms / 86_400_000
    for is_open, kind in (
        (st.expired_open, AlertKind.BROKER_EXPIRED),
        (st.removed_open, AlertKind.BROKER_REMOVED),
        (st.flapping_open, AlertKind.BROKER_FLAPPING),
    ):
        if is_open:
            message = f"broker {_name(st)} has been gone for {days:g} day(s); forgotten"
            out.append(AlertChange(at, kind, AlertState.RESOLVED, _severity(kind, st.broker_id), message, _broker(st)))


def _resolve_gone(st: BrokerState, t: int, node: str, gone_as: int | None, out: list[Output]) -> None:
    """A comeback at event time ``t`` (reported by ``node``) resolves BROKER_EXPIRED and BROKER_REMOVED,
    with the severity they opened with while it was broker id ``gone_as``."""
    for flag, kind in (("expired_open", AlertKind.BROKER_EXPIRED), ("removed_open", AlertKind.BROKER_REMOVED)):
        if getattr(st, flag):
            setattr(st, flag, False)
            message = f"broker {_name(st)} is back (event at {t} from {node})"
            severity = _severity(kind, gone_as)
            out.append(AlertChange(t, kind, AlertState.RESOLVED, severity, message, _broker(st)))


def _check_flapping(st: BrokerState, flaps: list[int], now: int, s: LivenessSettings, out: list[Output]) -> None:
    """Open or resolve BROKER_FLAPPING from the expiries and comebacks within the window."""
    flaps[:] = [a for a in flaps if a > now - s.flap_window_ms]
    if len(flaps) > s.flap_threshold and not st.flapping_open:
        st.flapping_open = True
        message = (
            f"broker {_name(st)} expired or came back {len(flaps)} times within "
            f"{s.flap_window_ms / 1000:.0f} s (threshold {s.flap_threshold})"
        )
        severity = _severity(AlertKind.BROKER_FLAPPING, st.broker_id)
        out.append(AlertChange(now, AlertKind.BROKER_FLAPPING, AlertState.OPEN, severity, message, _broker(st)))
    elif len(flaps) <= s.flap_threshold and st.flapping_open:
        st.flapping_open = False
        message = f"broker {_name(st)} is stable again"
        severity = _severity(AlertKind.BROKER_FLAPPING, st.broker_id)
        out.append(AlertChange(now, AlertKind.BROKER_FLAPPING, AlertState.RESOLVED, severity, message, _broker(st)))
    # re-check when the oldest counted change leaves the window
    st.flap_timer = s.timer_at(min(flaps) + s.flap_window_ms) if st.flapping_open and flaps else NO_TIMER


def registration_fingerprint(raw: str) -> str:
    """Equal for two reports of the same registration by different nodes or at different times."""
    d = orjson.loads(raw)
    for key in _VOLATILE:
        d.pop(key, None)
    return hashlib.sha1(orjson.dumps(d, option=orjson.OPT_SORT_KEYS)).hexdigest()


class Links:
    """Per node, its last word on the broker's connection: open (it heard the broker) or closed.

    Kept in :attr:`BrokerState.links` as JSON; a report older than the node's last word is ignored,
    so a late CHANNEL_CLOSED cannot undo a newer registration at the same node.
    """

    def __init__(self, by_node: dict[str, list[int]]) -> None:
        self.by_node = by_node

    @classmethod
    def load(cls, text: str) -> Links:
        return cls(orjson.loads(text) if text else {})

    def dump(self) -> str:
        if len(self.by_node) > _MAX_LINKS:  # keep the newest words
            newest = sorted(self.by_node.items(), key=lambda kv: kv[1][0])[-_MAX_LINKS:]
            self.by_node = dict(newest)
        return orjson.dumps(self.by_node, option=orjson.OPT_SORT_KEYS).decode()

    def report(self, node: str, t: int, *, connected: bool) -> bool:
        """Record a node's report; False if that node already said something newer."""
        prior = self.by_node.get(node)
        if prior is not None and prior[0] > t:
            return False
        self.by_node[node] = [t, 1 if connected else 0]
        return True

    def holders(self) -> list[str]:
        """Nodes whose last word is that they hold a connection."""
        return sorted(n for n, (_, is_open) in self.by_node.items() if is_open)

    def describe_closed(self) -> str:
        return ", ".join(f"{n} at {t}" for n, (t, is_open) in sorted(self.by_node.items()) if not is_open)


def _flaps(st: BrokerState) -> list[int]:
    return [int(a) for a in orjson.loads(st.flaps)]


def _broker(st: BrokerState) -> Broker:
    return Broker(st.cluster_name, st.broker_addr, st.broker_name, st.broker_id)


def _name(st: BrokerState) -> str:
    ident = f"{st.broker_name}[{st.broker_id}]" if st.broker_name is not None else "?"
    return f"{ident} {st.broker_addr} ({st.cluster_name})"


# --------------------------------------------------------------------------- nodes and admin events


def node_ticks(
    held: NodeState | None, node: str, events: Sequence[PackedEvent], settings: LivenessSettings
) -> tuple[NodeState, list[Output], int | None]:
    """A node's TICKs of a batch; returns its state (``held`` updated in place), the outputs, and the
    wake-up (watermark time) its silence deadline now wants, or None when it did not move."""
    st = held if held is not None else NodeState(node)
    out: list[Output] = []
    wake = None
    last = max(int(e["eventTime"]) for e in events)
    if last > st.last_tick:
        st.last_tick = last
        if st.silent_open:
            st.silent_open = False
            message = f"name-server node {node} ticks again"
            out.append(
                AlertChange(last, AlertKind.NODE_SILENT, AlertState.RESOLVED, Severity.WARNING, message, node=node)
            )
        wake = settings.timer_at(_node_due(st, settings))
    out.append(HealthRow(st.last_tick, st.last_tick, scan_state(events[-1].get("localScan")), node=node))
    return st, out, wake


def node_timer(st: NodeState, watermark: int, settings: LivenessSettings) -> tuple[NodeState, list[Output], int | None]:
    """The node's wake-up has come: NODE_SILENT opens if no tick came since; else the next wake-up."""
    now = settings.event_time_at(watermark)
    due = _node_due(st, settings)
    if due > now:  # ticks came since the wake-up was set: wake up at the new deadline
        return st, [], settings.timer_at(due)
    if st.silent_open:
        return st, [], None
    st.silent_open = True
    message = f"name-server node {st.node} sent no tick for {(now - st.last_tick) / 1000:.0f} s of event time"
    return st, [AlertChange(due, AlertKind.NODE_SILENT, AlertState.OPEN, Severity.WARNING, message, node=st.node)], None


def _node_due(st: NodeState, settings: LivenessSettings) -> int:
    """Event time at which a node that sent no tick since ``last_tick`` is silent."""
    return st.last_tick + settings.node_silent_ms + 1


def admin_events(events: Sequence[PackedEvent]) -> list[Output]:
    """ADMIN and ORDER_TOPIC_CONF events: passed to the route materialisation as they are, in order."""
    return [RouteRow(e["eventTime"], e["type"], e["raw"], e["node"], e["seq"]) for e in events]
