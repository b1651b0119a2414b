"""Remoting frames written by hand, and frames read back, for the tests and the attack tools.

:func:`json_frame` writes the bytes our own encoder never would: a header that is not what a peer
should send (wrong types, lone surrogates, a 5,001-digit number), or a length prefix a test chooses.
Everything a well-formed peer sends goes through ``common.protocol.codec.encode`` instead.
"""

from __future__ import annotations

import json
import struct

from common.protocol.codec import FrameDecoder, decode_frame
from common.protocol.command import RemotingCommand


def json_frame(header: object, body: bytes = b"", type_byte: int = 0) -> bytes:
    """A frame with a JSON header: the length, the type byte and header length, the header, the body.

    ``header`` as bytes or text is sent as it is; any other value is written by the json module, so
    ASCII with lone surrogates escaped as ``\\ud800``. ``type_byte`` is the serialize type in the
    length word's top byte (0: JSON).
    """
    if isinstance(header, str):
        h = header.encode()
    elif isinstance(header, bytes):
        h = header
    else:
        h = json.dumps(header).encode()
    return struct.pack(">II", 4 + len(h) + len(body), (type_byte << 24) | len(h)) + h + body


def loadgen_header(
    code: int, ext: list[tuple[str, str]], opaque: int | str, flag: int = 0, version: int = 409
) -> bytes:
    """A request's JSON header as rmq-loadgen writes it (tools/rmq-loadgen/src/lib.rs, push_request_header):
    its own key order, the ext values as they are. ``opaque`` as text lets a test write it as Java never would."""
    fields = ",".join(f'"{k}":"{v}"' for k, v in ext)
    return (
        f'{{"code":{code},"extFields":{{{fields}}},"flag":{flag},"language":"JAVA","opaque":{opaque},'
        f'"serializeTypeCurrentRPC":"JSON","version":{version}}}'
    ).encode()


def commands(data: bytes) -> list[RemotingCommand]:
    """The commands in ``data``, which must end on a frame's end (a node never writes part of one)."""
    decoder = FrameDecoder()
    decoder.feed(data)
    out = []
    while (cmd := decoder.next_command()) is not None:
        out.append(cmd)
    assert decoder.buffered == 0, f"{decoder.buffered} bytes of a part frame after {len(out)} commands"
    return out


def assert_truncation_changes_nothing(frame: bytes) -> None:
    """Cut ``frame`` at every offset: the first part gives no command and stays buffered whole, however
    often it is asked, and the rest completes the very command the whole frame decodes to."""
    whole = decode_frame(frame)
    for cut in range(len(frame)):
        decoder = FrameDecoder()
        decoder.feed(frame[:cut])
        assert decoder.next_command() is None
        assert decoder.next_command() is None
        assert decoder.buffered == cut
        decoder.feed(frame[cut:])
        assert decoder.next_command() == whole
