"""Hostile peers' attacks as frames and threads, and a well-formed client that times its route lookups.

Shared by the conformance tests (bounded counts) and ``bench/soak.py`` (minutes, all at once).
Every attacker uses one connection, reconnecting when the node closes it, and counts what happened.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from common.protocol.codec import FrameDecoder, encode
from common.protocol.codes import RequestCode, ResponseCode
from common.protocol.command import request
from common.protocol.types import TopicConfig
from namesrv.client import NameServerClient
from namesrv.handlers import MAX_REQUEST_HEADER_BYTES
from tests.support.brokers import registration
from tests.support.frames import json_frame

MiB = 1024 * 1024
GOOD_TOPIC = "GoodTopic"


#: who the attacks register as
ATTACKER = {"broker_addr": "127.0.0.9:10911", "broker_name": "attacker", "cluster": "AttackCluster",
            "ha_server_addr": "127.0.0.9:10912"}  # fmt: skip


def _registration(compressed: bool, **kw) -> bytes:
    """The attacker's REGISTER_BROKER, without a bodyCrc32: what the node does with the body is the attack."""
    ext, body = registration(**ATTACKER, compressed=compressed, crc=False, **kw)
    return encode(request(RequestCode.REGISTER_BROKER, ext, body, opaque=1))


def _attack_topics(topics: int) -> dict[str, TopicConfig]:
    return {f"AttackTopic{i}": TopicConfig(f"AttackTopic{i}", 8, 8) for i in range(topics)}


#: what a gigabyte bomb inflates to (1.2 GB, from a frame of 1.2 MB)
GIGABYTE_BOMB = 1200 * MiB
#: past the node's 16 MiB cap from a body of about 32 KB, the size of a small broker's registration
SMALL_BOMB = 32 * MiB


def zip_bomb_registration(inflated: int = 256 * MiB) -> bytes:
    """A compressed REGISTER_BROKER of ~1/1000 its inflated size, all zeros inside."""
    deflater = zlib.compressobj(9)
    zeros = bytes(MiB)
    parts = [deflater.compress(zeros) for _ in range(inflated // MiB)]
    parts.append(deflater.flush())
    return _registration(True, body=b"".join(parts))


def big_registration(topics: int = 100_000, compressed: bool = True) -> bytes:
    return _registration(compressed, configs=_attack_topics(topics))


def reused_registrations(topics: int = 1_800) -> Callable[[int], bytes]:
    """The same topic table (~245 KB, just within what a node applies on its loop when it is the
    broker's last one) with a new DataVersion each time: every request takes the full row rewrite."""
    _, body = registration(**ATTACKER, configs=_attack_topics(topics), counter=1)
    return lambda i: _registration(False, body=body.replace(b'"counter":1,', b'"counter":%d,' % (i + 2), 1))


def huge_config_update(keys: int = 900_000) -> bytes:
    text = "".join(f"k{i}=v\n" for i in range(keys)).encode()
    return encode(request(RequestCode.UPDATE_NAMESRV_CONFIG, None, text, opaque=1))


def kv_put(i: int) -> bytes:
    """PUT_KV_CONFIG with a NUL and an escape sequence in the key and a lone surrogate every third time."""
    value = "\ud800" if i % 3 == 0 else f"v{i}"
    return json_frame(
        {
            "code": int(RequestCode.PUT_KV_CONFIG),
            "flag": 0,
            "opaque": i,
            "version": 479,
            "extFields": {"namespace": f"ATTACK{i % 7}", "key": f"k\x00\x1b[2J{i % 500}", "value": value},
        }
    )


def unknown_topic_lookup(size: int = MiB) -> bytes:
    """A route lookup of a ``size``-character topic; by default its header is over the node's limit."""
    return encode(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "u" * size}, opaque=1))


#: the longest unknown topic a node still reads, parses and answers
LONGEST_READ_TOPIC = MAX_REQUEST_HEADER_BYTES - 200


def garbage(i: int) -> bytes:
    """Malformed frames: a lone surrogate topic, a 5,001-digit opaque, an unknown serialize type."""
    kind = i % 3
    if kind == 0:
        return json_frame({"code": 105, "flag": 0, "opaque": i, "extFields": {"topic": f"t\ud800{i}"}})
    if kind == 1:
        return json_frame(b'{"code":105,"flag":0,"opaque":' + b"9" * 5001 + b"}")
    return b"\x00\x00\x00\x10\x07\x00\x00\x00\x1b[2J\x00\nlevel=x"


@dataclass
class Attacker:
    """Sends ``frames(i)`` on one connection, one at a time, reading each answer (or the close)."""

    addr: str
    name: str
    frames: Callable[[int], bytes]
    #: an unfinished frame is sent instead: its header, then the body bytes trickle until the node stops reading
    sent: int = 0
    answered: int = 0
    closed: int = 0
    codes: dict[int, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> Attacker:
        self.thread = threading.Thread(target=self._run, name=f"attack-{self.name}", daemon=True)
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)

    def _run(self) -> None:
        host, port = self.addr.rsplit(":", 1)
        sock: socket.socket | None = None
        decoder = FrameDecoder()
        i = 0
        while not self.stop.is_set():
            try:
                if sock is None:
                    sock = socket.create_connection((host, int(port)), timeout=5)
                    decoder = FrameDecoder()
                sock.sendall(self.frames(i))
                self.sent += 1
                i += 1
                while (answer := decoder.next_command()) is None:
                    data = sock.recv(65536)
                    if not data:
                        raise ConnectionError("closed")
                    decoder.feed(data)
                self.answered += 1
                self.codes[answer.code] = self.codes.get(answer.code, 0) + 1
            except (OSError, ConnectionError):
                self.closed += 1
                if sock is not None:
                    sock.close()
                sock = None
        if sock is not None:
            sock.close()


class UnfinishedFrames:
    """``connections`` sockets each sending most of a ``size``-byte frame and never its end."""

    def __init__(self, addr: str, connections: int = 20, size: int = 16 * MiB - 8) -> None:
        self.addr, self.connections, self.size = addr, connections, size
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, name="attack-unfinished", daemon=True)

    def start(self) -> UnfinishedFrames:
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(30)

    def _run(self) -> None:
        host, port = self.addr.rsplit(":", 1)
        chunk = bytes(256 * 1024)
        while not self.stop.is_set():  # a round: open, send until closed (idle limit) or stopped
            socks, left = [], []
            for _ in range(self.connections):
                s = socket.create_connection((host, int(port)))
                s.sendall(struct.pack(">II", self.size, 2) + b"{}")
                s.setblocking(False)
                socks.append(s)
                left.append(self.size - 16 * 1024)
            while not self.stop.is_set() and any(n > 0 for n in left):
                progress = False
                for k, s in enumerate(socks):
                    if left[k] <= 0:
                        continue
                    try:
                        n = s.send(chunk[: min(len(chunk), left[k])])
                        left[k] -= n
                        self.sent += n
                        progress = True
                    except BlockingIOError:
                        pass
                    except OSError:  # closed by the node
                        left[k] = 0
                if not progress:
                    self.stop.wait(0.02)
            for s in socks:
                s.close()


class LatencyProbe:
    """A well-formed client: route lookups of ``GOOD_TOPIC`` one after another, each one timed."""

    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="probe", daemon=True)

    def start(self) -> LatencyProbe:
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(30)

    def lookups(self, count: int) -> list[float]:
        """``count`` timed lookups on this thread (no background thread)."""
        with NameServerClient(self.addr, timeout=10) as client:
            out = []
            for _ in range(count):
                out.append(self._one(client))
            return out

    def lookups_for(self, seconds: float, pause: float = 0.002) -> list[float]:
        """Timed lookups for ``seconds`` on this thread, ``pause`` apart: a client that asks now and then,
        so a lookup lands in a stall as often as the node is stalled (back to back, only one would)."""
        deadline = time.monotonic() + seconds
        with NameServerClient(self.addr, timeout=10) as client:
            out = []
            while time.monotonic() < deadline:
                out.append(self._one(client))
                time.sleep(pause)
            return out

    def _one(self, client: NameServerClient) -> float:
        start = time.perf_counter()
        response = client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": GOOD_TOPIC})
        took = time.perf_counter() - start
        if response is None or response.code != ResponseCode.SUCCESS:
            self.failures.append(f"code {None if response is None else response.code}")
        return took

    def _run(self) -> None:
        with NameServerClient(self.addr, timeout=10) as client:
            while not self.stop.is_set():
                try:
                    self.latencies.append(self._one(client))
                except OSError as e:
                    self.failures.append(repr(e))
                    return


#: the attacks by name, for an attacker in another process (its work must not share the probe's GIL)
ATTACKS: dict[str, Callable[[], Callable[[int], bytes]]] = {
    "zip-bomb": lambda: (lambda frame: lambda i: frame)(zip_bomb_registration()),
    "gigabyte-zip-bombs": lambda: (lambda frame: lambda i: frame)(zip_bomb_registration(GIGABYTE_BOMB)),
    "small-zip-bombs": lambda: (lambda frame: lambda i: frame)(zip_bomb_registration(SMALL_BOMB)),
    "100k-topics": lambda: (lambda frame: lambda i: frame)(big_registration()),
    "huge-config": lambda: (lambda frame: lambda i: frame)(huge_config_update()),
    "kv-puts": lambda: kv_put,
    "huge-unknown-topic": lambda: (lambda frame: lambda i: frame)(unknown_topic_lookup()),
    "long-unknown-topic": lambda: (lambda frame: lambda i: frame)(unknown_topic_lookup(LONGEST_READ_TOPIC)),
    "garbage": lambda: garbage,
    "reused-registrations": reused_registrations,
}


def _attack_main(addr: str, kind: str, ready, stop, results) -> None:
    if kind == "unfinished-frames":
        attack = UnfinishedFrames(addr)
    else:
        attack = Attacker(addr, kind, ATTACKS[kind]())
    attack.start()
    ready.set()
    stop.wait()
    attack.halt()
    if isinstance(attack, UnfinishedFrames):
        results.put({"sent_bytes": attack.sent})
    else:
        results.put({"sent": attack.sent, "answered": attack.answered, "closed": attack.closed, "codes": attack.codes})


class AttackProcess:
    """One attack (a name of :data:`ATTACKS` or ``unfinished-frames``) in a child process."""

    def __init__(self, addr: str, kind: str) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.kind = kind
        self._ready, self._stop, self._results = ctx.Event(), ctx.Event(), ctx.Queue()
        self.process = ctx.Process(
            target=_attack_main,
            args=(addr, kind, self._ready, self._stop, self._results),
            name=f"attack-{kind}",
            daemon=True,
        )

    def __enter__(self) -> AttackProcess:
        self.process.start()
        if not self._ready.wait(60):
            raise AssertionError(f"the {self.kind} attacker did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.is_alive():
            self.stop()

    def stop(self) -> dict:
        """Stop the attack; what it did (frames sent, answered, connections closed by the node, codes)."""
        self._stop.set()
        try:
            result = self._results.get(timeout=60)
        finally:
            self.process.join(10)
            if self.process.is_alive():
                self.process.kill()
        return result


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
