"""The PROXY protocol parser: v1 and v2 preambles whole, byte by byte and with what follows them;
every way a preamble can be wrong; bounds; and random bytes, which give a header or a clean refusal."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.protocol.codec import RemoteProtocolError
from common.protocol.proxy import (
    V1_MAX_BYTES,
    V2_HEADER_BYTES,
    V2_SIGNATURE,
    Detected,
    ProxyHeader,
    ProxyParser,
    ProxyProtocolError,
    detect,
    parse,
)

FRAME = b"\x00\x00\x00\x1c\x00\x00\x00\x18" + b'{"code":106,"flag":0}xxx'  # whatever follows the preamble
TLS_HELLO_START = b"\x16\x03\x01\x02\x00\x01"


def v2(command: int, family: int, payload: bytes) -> bytes:
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack(">H", len(payload)) + payload


def inet(src: str, dst: str, sport: int, dport: int) -> bytes:
    return bytes(map(int, src.split("."))) + bytes(map(int, dst.split("."))) + struct.pack(">HH", sport, dport)


def tlv(kind: int, value: bytes) -> bytes:
    return struct.pack(">BH", kind, len(value)) + value


def three_ways(preamble: bytes, after: bytes = FRAME) -> ProxyHeader:
    """Whole with what follows it, one byte at a time, and in two random-ish halves: same header,
    and the parser takes exactly the preamble's bytes (what follows stays with the caller)."""
    header, taken = parse(preamble + after)
    assert header is not None and taken == len(preamble) == header.length
    parser = ProxyParser()
    for i in range(len(preamble)):
        assert parser.header is None
        assert parser.feed(preamble[i : i + 1]) == 1
    assert parser.header == header
    assert parser.feed(after) == 0  # done: takes nothing more
    for cut in (1, len(preamble) // 2, len(preamble) - 1):
        parser = ProxyParser()
        assert parser.feed(preamble[:cut]) == cut and not parser.done
        assert parser.feed(preamble[cut:] + after) == len(preamble) - cut
        assert parser.header == header
    return header


# --- detection ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first, expected",
    [(b"P", Detected.V1), (b"\r", Detected.V2), (b"\x16", Detected.NONE), (b"\x00", Detected.NONE)],
)
def test_the_first_byte_alone_says_whether_a_preamble_starts(first, expected):
    assert detect(first + b"anything") is expected
    assert detect(first) is expected


def test_neither_preamble_can_start_a_frame_the_node_accepts():
    # as a frame's length word, 'P' or '\r' first means more than the 16 MiB frame limit
    assert int.from_bytes(b"P\x00\x00\x00", "big") > 16 * 1024 * 1024
    assert int.from_bytes(b"\r\x00\x00\x00", "big") > 16 * 1024 * 1024


# --- version 1 ---------------------------------------------------------------------------------


def test_v1_tcp4():
    h = three_ways(b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 9876\r\n")
    assert (h.version, h.source, h.destination) == (1, ("203.0.113.7", 51234), ("10.0.0.1", 9876))


def test_v1_tcp6_is_normalised_and_tls_may_follow():
    h = three_ways(b"PROXY TCP6 2001:DB8:0:0::7 ::1 0 65535\r\n", after=TLS_HELLO_START)
    assert h.source == ("2001:db8::7", 0) and h.destination == ("::1", 65535)


def test_v1_unknown_keeps_the_connections_own_address():
    assert three_ways(b"PROXY UNKNOWN\r\n").source is None
    assert three_ways(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n").source is None


def test_v1_longest_line_is_accepted_and_one_byte_more_is_refused_after_107_bytes():
    longest = b"PROXY UNKNOWN " + b"x" * (V1_MAX_BYTES - 16) + b"\r\n"
    assert len(longest) == V1_MAX_BYTES
    three_ways(longest)
    too_long = b"PROXY UNKNOWN " + b"x" * (V1_MAX_BYTES - 15) + b"\r\n"
    parser = ProxyParser()
    with pytest.raises(ProxyProtocolError, match="longer than 107"):
        parser.feed(too_long + FRAME)
    assert len(parser._buf) <= V1_MAX_BYTES  # never buffers more than the spec allows
    # and fed byte by byte, it gives up at byte 107 too
    parser = ProxyParser()
    fed = 0
    with pytest.raises(ProxyProtocolError):
        for b in too_long:
            fed += 1
            parser.feed(bytes([b]))
    assert fed == V1_MAX_BYTES


@pytest.mark.parametrize(
    "line, message",
    [
        (b"PROXX TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "not a PROXY protocol v1 line"),
        (b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", "must be"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "must be"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", "must be"),
        (b"PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", "must be"),
        (b"PROXY TCP4 1.2.3.4 ::1 1 2\r\n", "not TCP4 addresses"),
        (b"PROXY TCP6 1.2.3.4 ::1 1 2\r\n", "not TCP6 addresses"),
        (b"PROXY TCP4 1.2.3.256 5.6.7.8 1 2\r\n", "not TCP4 addresses"),
        (b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", "not TCP4 addresses"),
        (b"PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n", "scope id"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "port"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n", "port"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n", "port"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 \xd9\xa1 2\r\n", "not ASCII"),
        (b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "CRLF"),
    ],
)
def test_v1_malformed_lines_are_refused_with_a_reason(line, message):
    with pytest.raises(ProxyProtocolError, match=message):
        parse(line + FRAME)


def test_refusals_are_the_codecs_remote_protocol_errors():
    # the server closes the connection for these, as for a malformed frame
    assert issubclass(ProxyProtocolError, RemoteProtocolError)


# --- version 2 ---------------------------------------------------------------------------------


def test_v2_inet_with_tlvs():
    pre = v2(1, 0x11, inet("203.0.113.7", "10.0.0.1", 51234, 9876) + tlv(0x05, b"id-1") + tlv(0x04, b""))
    h = three_ways(pre)
    assert (h.version, h.source, h.destination) == (2, ("203.0.113.7", 51234), ("10.0.0.1", 9876))
    assert h.tlvs == ((0x05, b"id-1"), (0x04, b""))


def test_v2_inet6():
    src, dst = bytes(15) + b"\x07", bytes(15) + b"\x01"
    h = three_ways(v2(1, 0x21, src + dst + struct.pack(">HH", 443, 9876)), after=TLS_HELLO_START)
    assert h.source == ("::7", 443) and h.destination == ("::1", 9876)


@pytest.mark.parametrize(
    "preamble",
    [
        v2(0, 0x00, b""),  # LOCAL: the proxy's health check
        v2(0, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2)),  # LOCAL with addresses: ignored
        v2(0, 0x11, b"\x01\x02"),  # LOCAL with a partial address block: ignored
        v2(1, 0x00, b""),  # PROXY, unspecified family
        v2(1, 0x31, b"/tmp/a".ljust(108, b"\0") + b"/tmp/b".ljust(108, b"\0")),  # PROXY over a Unix socket
    ],
)
def test_v2_without_a_usable_client_address_keeps_the_connections_own(preamble):
    h = three_ways(preamble)
    assert h.source is None and h.destination is None


def test_v2_length_beyond_the_bound_is_refused_from_the_16_byte_header():
    header = V2_SIGNATURE + bytes([0x21, 0x11]) + struct.pack(">H", 5000)
    parser = ProxyParser()
    with pytest.raises(ProxyProtocolError, match="5000 bytes, more than the 4096"):
        parser.feed(header)
    assert len(parser._buf) == V2_HEADER_BYTES
    # the bound is the caller's to choose, up to the spec's 65535
    assert parse(v2(1, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2) + tlv(1, b"x" * 5000)), max_v2_length=65535)[0]
    with pytest.raises(ValueError):
        ProxyParser(max_v2_length=65536)


@pytest.mark.parametrize(
    "preamble, message",
    [
        (b"\r\n\r\n\x00\r\nQUIX\n" + bytes(4), "signature"),
        (V2_SIGNATURE + b"\x11\x11\x00\x0c" + bytes(12), "version 1"),
        (V2_SIGNATURE + b"\x22\x11\x00\x0c" + bytes(12), "unknown command 2"),
        (V2_SIGNATURE + b"\x21\x41\x00\x0c" + bytes(12), "family"),
        (V2_SIGNATURE + b"\x21\x13\x00\x0c" + bytes(12), "family"),
        (v2(1, 0x11, bytes(11)), "too few for its addresses"),
        (v2(1, 0x21, bytes(35)), "too few for its addresses"),
        (v2(1, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2) + b"\x01\x00"), "stray bytes"),
        (v2(1, 0x11, inet("1.2.3.4", "5.6.7.8", 1, 2) + b"\x01\x00\x05abc"), "overruns"),
    ],
)
def test_v2_malformed_headers_are_refused_with_a_reason(preamble, message):
    with pytest.raises(ProxyProtocolError, match=message):
        parse(preamble + FRAME)


def test_a_connection_without_a_preamble_is_refused_where_one_is_required():
    for start in (FRAME, TLS_HELLO_START, b"GET / HTTP/1.1\r\n"):
        with pytest.raises(ProxyProtocolError, match="no PROXY protocol preamble"):
            ProxyParser().feed(start)


def test_an_error_message_quotes_at_most_a_few_escaped_bytes():
    with pytest.raises(ProxyProtocolError) as e:
        parse(b"\x00\x1b[31m" + b"A" * 10_000)
    assert len(str(e.value)) < 120 and "\x1b" not in str(e.value)


# --- fuzzing -----------------------------------------------------------------------------------

GOOD = [
    b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 9876\r\n",
    b"PROXY TCP6 2001:db8::7 ::1 1 2\r\n",
    b"PROXY UNKNOWN\r\n",
    v2(1, 0x11, inet("203.0.113.7", "10.0.0.1", 51234, 9876) + tlv(5, b"abc")),
    v2(0, 0x00, b""),
]


def _mutate(data: bytes, at: int, value: int) -> bytes:
    at %= len(data)
    return data[:at] + bytes([value]) + data[at + 1 :]


preambles = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=200).map(lambda b: b"PROXY " + b),
    st.binary(max_size=200).map(lambda b: V2_SIGNATURE + b),
    st.builds(_mutate, st.sampled_from(GOOD), st.integers(0, 200), st.integers(0, 255)),
    st.builds(lambda g, n: g[:n], st.sampled_from(GOOD), st.integers(0, 60)),
)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None)
@given(data=preambles, cut=st.integers(0, 300))
def test_random_bytes_give_a_header_or_a_clean_refusal_and_split_reads_agree(data, cut):
    def run(chunks: list[bytes]) -> tuple[object, int]:
        parser = ProxyParser()
        taken = 0
        try:
            for chunk in chunks:
                n = parser.feed(chunk)
                assert 0 <= n <= len(chunk)
                taken += n
                if parser.done:
                    break
                assert n == len(chunk)  # unfinished: everything offered was preamble
        except ProxyProtocolError as e:
            return type(e), -1
        assert len(parser._buf) <= max(V1_MAX_BYTES, V2_HEADER_BYTES + parser.max_v2_length)
        return parser.header, taken

    whole = run([data])
    assert run([data[:cut], data[cut:]]) == whole
    header, taken = whole
    if isinstance(header, ProxyHeader):
        assert taken == header.length <= len(data)
