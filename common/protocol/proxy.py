"""The HAProxy PROXY protocol, versions 1 and 2: the preamble a load balancer sends ahead of the
first frame to say whom it is relaying.  Bytes in, a :class:`ProxyHeader` out.  No I/O here.

:func:`detect` tells from the first byte alone (``P`` for v1, ``\\r`` for v2) whether a connection
starts with a preamble: neither can start a frame under the 16 MiB limit or a TLS record, and one
byte is what the server can always peek without waiting.  :class:`ProxyParser` takes only the
preamble's bytes: :meth:`ProxyParser.feed` returns how many of the offered bytes it consumed, never
past the preamble's end, and consumes everything offered until then, so the server can peek, feed,
and read exactly that count off the socket.  v1 lines and v2 lengths are bounded before anything is
buffered; whatever breaks the spec is a :class:`ProxyProtocolError`.  A preamble without a usable
client address (``UNKNOWN``, ``LOCAL``, Unix sockets) leaves :attr:`ProxyHeader.source` None.
``docs/internals/tls-and-proxy.md`` has the formats and bounds.
"""

from __future__ import annotations

import enum
import ipaddress
import struct
from dataclasses import dataclass

from common.protocol.codec import RemoteProtocolError

__all__ = [
    "V1_PREFIX",
    "V2_SIGNATURE",
    "V1_MAX_BYTES",
    "V2_HEADER_BYTES",
    "V2_MAX_LENGTH",
    "Detected",
    "detect",
    "ProxyHeader",
    "ProxyParser",
    "ProxyProtocolError",
    "parse",
]

#: a v1 preamble starts with these six bytes
V1_PREFIX = b"PROXY "
#: a v2 preamble starts with these twelve bytes
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
#: the longest v1 line the spec allows, "PROXY TCP6 <39> <39> <5> <5>\r\n" and CRLF included
V1_MAX_BYTES = 107
#: signature, version and command, family and transport, length
V2_HEADER_BYTES = 16
#: default bound of a v2 header's address-and-TLV part (the spec allows up to 65535)
V2_MAX_LENGTH = 4096

_V2_VERSION = 0x2
_V2_LOCAL, _V2_PROXY = 0x0, 0x1
_AF_UNSPEC, _AF_INET, _AF_INET6, _AF_UNIX = 0x0, 0x1, 0x2, 0x3
_TRANSPORT_UNSPEC, _TRANSPORT_STREAM, _TRANSPORT_DGRAM = 0x0, 0x1, 0x2
#: bytes of the address block of each family (source and destination address, then ports)
_V2_ADDRESS_BYTES = {_AF_UNSPEC: 0, _AF_INET: 12, _AF_INET6: 36, _AF_UNIX: 216}
_V1_PROTOCOLS = {"TCP4": ipaddress.IPv4Address, "TCP6": ipaddress.IPv6Address}
_TLV_HEADER = struct.Struct(">BH")


class ProxyProtocolError(RemoteProtocolError):
    """The peer's preamble does not follow the PROXY protocol (or is missing where one is required)."""


class Detected(enum.Enum):
    """What the first byte of a connection says."""

    V1 = "v1"
    V2 = "v2"
    #: not a PROXY preamble: TLS, a frame, or garbage for the next layer to judge
    NONE = "none"


def detect(first: bytes) -> Detected:
    """Which preamble ``first`` (at least one byte) can start; see the module docstring."""
    if not first:
        raise ValueError("detect() needs at least one byte")
    if first[0] == V1_PREFIX[0]:
        return Detected.V1
    if first[0] == V2_SIGNATURE[0]:
        return Detected.V2
    return Detected.NONE


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A parsed preamble."""

    version: int
    #: the client's address as (host, port); None: keep the address the connection came from
    source: tuple[str, int] | None
    #: the address the client connected to, at the proxy; None when ``source`` is
    destination: tuple[str, int] | None
    #: v2 type-length-value extensions, in the order sent
    tlvs: tuple[tuple[int, bytes], ...] = ()
    #: bytes the preamble took on the wire
    length: int = 0


def _shown(data: bytes, limit: int = 24) -> str:
    """A few bytes of the peer's, printable whatever they are."""
    text = repr(bytes(data[:limit]))
    return text + "..." if len(data) > limit else text


class ProxyParser:
    """Incremental parser of one preamble; see the module docstring for :meth:`feed`'s contract."""

    def __init__(self, *, max_v2_length: int = V2_MAX_LENGTH) -> None:
        if not 0 <= max_v2_length <= 0xFFFF:
            raise ValueError(f"max_v2_length must be within 0..65535, got {max_v2_length}")
        self.max_v2_length = max_v2_length
        self._buf = bytearray()
        self._version: int | None = None
        #: total bytes of a v2 preamble, known once its 16-byte header is in
        self._v2_total: int | None = None
        self.header: ProxyHeader | None = None

    @property
    def done(self) -> bool:
        return self.header is not None

    def feed(self, data: bytes) -> int:
        """Take the preamble's bytes from the start of ``data``; return how many were taken.

        Raises :class:`ProxyProtocolError` as soon as the bytes cannot be a valid preamble.  After
        the preamble is complete (:attr:`header` is set) it takes nothing more.
        """
        taken = 0
        while taken < len(data) and self.header is None:
            taken += self._step(memoryview(data)[taken:])
        return taken

    def _step(self, data: memoryview) -> int:
        buf = self._buf
        if self._version is None:
            kind = detect(bytes(data[:1]))
            if kind is Detected.NONE:
                raise ProxyProtocolError(f"no PROXY protocol preamble: the connection starts with {_shown(data)}")
            self._version = 1 if kind is Detected.V1 else 2
        if self._version == 1:
            return self._step_v1(data)
        if len(buf) < V2_HEADER_BYTES:
            take = min(len(data), V2_HEADER_BYTES - len(buf))
            buf += data[:take]
            n = min(len(buf), len(V2_SIGNATURE))
            if buf[:n] != V2_SIGNATURE[:n]:
                raise ProxyProtocolError(f"not a PROXY protocol v2 signature: {_shown(buf)}")
            if len(buf) == V2_HEADER_BYTES:
                self._v2_total = V2_HEADER_BYTES + self._check_v2_header(bytes(buf))
                if self._v2_total == len(buf):
                    self._finish_v2()
            return take
        assert self._v2_total is not None  # set when the 16-byte header completed
        take = min(len(data), self._v2_total - len(buf))
        buf += data[:take]
        if len(buf) == self._v2_total:
            self._finish_v2()
        return take

    # -- version 1 -----------------------------------------------------------------------------

    def _step_v1(self, data: memoryview) -> int:
        buf = self._buf
        start = len(buf)
        end = bytes(data[: V1_MAX_BYTES - start]).find(b"\n")
        if end < 0:
            take = min(len(data), V1_MAX_BYTES - start)
            buf += data[:take]
            self._check_v1_prefix()
            if len(buf) >= V1_MAX_BYTES:
                raise ProxyProtocolError(f"PROXY protocol v1 line longer than {V1_MAX_BYTES} bytes")
            return take
        buf += data[: end + 1]
        self._check_v1_prefix()
        self.header = _parse_v1(bytes(buf))
        return end + 1

    def _check_v1_prefix(self) -> None:
        n = min(len(self._buf), len(V1_PREFIX))
        if self._buf[:n] != V1_PREFIX[:n]:
            raise ProxyProtocolError(f"not a PROXY protocol v1 line: {_shown(self._buf)}")

    # -- version 2 -----------------------------------------------------------------------------

    def _check_v2_header(self, header: bytes) -> int:
        """The length the header announces, once version, command, family and bound are checked."""
        ver_cmd, fam, length = header[12], header[13], int.from_bytes(header[14:16], "big")
        if ver_cmd >> 4 != _V2_VERSION:
            raise ProxyProtocolError(f"PROXY protocol v2 header with version {ver_cmd >> 4}, expected 2")
        if ver_cmd & 0xF not in (_V2_LOCAL, _V2_PROXY):
            raise ProxyProtocolError(f"PROXY protocol v2 header with unknown command {ver_cmd & 0xF}")
        family, transport = fam >> 4, fam & 0xF
        if family not in _V2_ADDRESS_BYTES or transport not in (_TRANSPORT_UNSPEC, _TRANSPORT_STREAM, _TRANSPORT_DGRAM):
            raise ProxyProtocolError(f"PROXY protocol v2 header with unknown address family/transport 0x{fam:02x}")
        if length > self.max_v2_length:
            raise ProxyProtocolError(
                f"PROXY protocol v2 header announces {length} bytes, more than the {self.max_v2_length} allowed"
            )
        if ver_cmd & 0xF == _V2_PROXY and length < _V2_ADDRESS_BYTES[family]:
            raise ProxyProtocolError(
                f"PROXY protocol v2 header announces {length} bytes, too few for its addresses"
                f" ({_V2_ADDRESS_BYTES[family]})"
            )
        return length

    def _finish_v2(self) -> None:
        data = bytes(self._buf)
        command, family = data[12] & 0xF, data[13] >> 4
        payload = data[V2_HEADER_BYTES:]
        source = destination = None
        # always the full block for PROXY (checked); LOCAL may send less, and its addresses are ignored
        used = min(len(payload), _V2_ADDRESS_BYTES[family])
        if command == _V2_PROXY and family in (_AF_INET, _AF_INET6):
            size = 4 if family == _AF_INET else 16
            address = ipaddress.IPv4Address if family == _AF_INET else ipaddress.IPv6Address
            src, dst = address(payload[:size]), address(payload[size : 2 * size])
            sport, dport = struct.unpack_from(">HH", payload, 2 * size)
            source, destination = (str(src), sport), (str(dst), dport)
        # LOCAL (the proxy's own connection), UNSPEC and UNIX: no client address to use
        self.header = ProxyHeader(2, source, destination, _parse_tlvs(payload[used:]), len(data))


def _parse_tlvs(data: bytes) -> tuple[tuple[int, bytes], ...]:
    tlvs = []
    at = 0
    while at < len(data):
        if len(data) - at < _TLV_HEADER.size:
            raise ProxyProtocolError(f"PROXY protocol v2 header ends inside a TLV ({len(data) - at} stray bytes)")
        kind, length = _TLV_HEADER.unpack_from(data, at)
        at += _TLV_HEADER.size
        if at + length > len(data):
            raise ProxyProtocolError(f"PROXY protocol v2 TLV 0x{kind:02x} of {length} bytes overruns the header")
        tlvs.append((kind, data[at : at + length]))
        at += length
    return tuple(tlvs)


def _port(text: str) -> int:
    # decimal, 0..65535, no sign and no leading zero (the spec's own wording)
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0") or int(text) > 65535:
        raise ProxyProtocolError(f"PROXY protocol v1 port {text[:8]!r} is not a number within 0..65535")
    return int(text)


def _parse_v1(line: bytes) -> ProxyHeader:
    if not line.endswith(b"\r\n"):
        raise ProxyProtocolError("PROXY protocol v1 line does not end with CRLF")
    try:
        text = line[:-2].decode("ascii")
    except UnicodeDecodeError:
        raise ProxyProtocolError("PROXY protocol v1 line is not ASCII") from None
    parts = text.split(" ")
    if len(parts) >= 2 and parts[1] == "UNKNOWN":
        # the proxy does not know the client (or it is not TCP): anything may follow, and is ignored
        return ProxyHeader(1, None, None, (), len(line))
    if len(parts) != 6 or parts[1] not in _V1_PROTOCOLS:
        raise ProxyProtocolError(
            f"PROXY protocol v1 line must be 'PROXY TCP4|TCP6 src dst sport dport' or 'PROXY UNKNOWN', got {text[:60]!r}"
        )
    address = _V1_PROTOCOLS[parts[1]]
    if "%" in parts[2] or "%" in parts[3]:  # ipaddress takes IPv6 scope ids; the spec has none
        raise ProxyProtocolError(f"PROXY protocol v1 addresses carry a scope id: {text[:60]!r}")
    try:
        src, dst = address(parts[2]), address(parts[3])
    except ValueError:
        raise ProxyProtocolError(f"PROXY protocol v1 addresses are not {parts[1]} addresses: {text[:60]!r}") from None
    return ProxyHeader(1, (str(src), _port(parts[4])), (str(dst), _port(parts[5])), (), len(line))


def parse(data: bytes, *, max_v2_length: int = V2_MAX_LENGTH) -> tuple[ProxyHeader | None, int]:
    """One-shot: the preamble at the start of ``data`` and the bytes it took (None, n: incomplete)."""
    parser = ProxyParser(max_v2_length=max_v2_length)
    taken = parser.feed(data)
    return parser.header, taken
