"""Hostile bytes against a live node: it never dies and keeps serving well-formed clients."""

from __future__ import annotations

import logging
import socket
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.protocol.codec import encode
from common.protocol.codes import RequestCode
from common.protocol.command import request
from namesrv import server as server_mod
from namesrv.client import NameServerClient
from tests.support.frames import json_frame

GOOD = encode(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}, opaque=1))

#: text as a peer may send it: control characters and lone surrogates (json.dumps escapes them as \ud800)
any_text = st.text(st.characters(blacklist_categories=()), max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


hostile = st.one_of(
    st.binary(max_size=64),  # random bytes
    st.integers(1, len(GOOD) - 1).map(lambda n: GOOD[:n]),  # truncated frame
    st.integers(16 * 1024 * 1024 - 3, 2**31 - 1).map(lambda n: struct.pack(">i", n) + b"\0\0\0\0"),  # oversized
    st.binary(min_size=1, max_size=20).map(json_frame),  # invalid JSON
    st.builds(  # wrong types in extFields and header keys
        lambda code, ext, opaque: json_frame({"code": code, "extFields": ext, "opaque": opaque, "flag": 0}),
        st.sampled_from([int(c) for c in RequestCode]) | json_values,
        st.dictionaries(
            st.sampled_from(
                [
                    "topic",
                    "brokerAddr",
                    "clusterName",
                    "brokerId",
                    "namespace",
                    "key",
                    "bodyCrc32",
                    "compressed",
                    "brokerName",
                ]
            ),
            json_values,
            max_size=5,
        )
        | json_values,
        st.integers(-(2**31), 2**31 - 1) | json_values,
    ),
    st.builds(  # a number of up to 6,000 digits where the header has an int
        lambda key, digits, quoted: json_frame(
            '{"code":105,"flag":0,"%s":%s}' % (key, f'"{digits}"' if quoted else digits)
        ),
        st.sampled_from(["code", "opaque", "flag", "version"]),
        st.integers(1, 6000).map(lambda n: "9" * n),
        st.booleans(),
    ),
    st.builds(  # every KV code with text that cannot be stored, logged or encoded as it is
        lambda code, ns, key, value: json_frame(
            {"code": code, "opaque": 5, "flag": 0, "extFields": {"namespace": ns, "key": key, "value": value}}
        ),
        st.sampled_from(
            [
                RequestCode.PUT_KV_CONFIG,
                RequestCode.GET_KV_CONFIG,
                RequestCode.DELETE_KV_CONFIG,
                RequestCode.GET_KVLIST_BY_NAMESPACE,
            ]
        ),
        any_text,
        any_text,
        any_text,
    ),
    st.builds(  # valid header, random body for every body-carrying code
        lambda code, body: json_frame(
            {
                "code": code,
                "opaque": 3,
                "flag": 0,
                "version": 479,
                "extFields": {
                    "clusterName": "c",
                    "brokerAddr": "a:1",
                    "brokerName": "b",
                    "brokerId": "0",
                    "topic": "t",
                },
            },
            body,
        ),
        st.sampled_from(
            [
                RequestCode.REGISTER_BROKER,
                RequestCode.QUERY_DATA_VERSION,
                RequestCode.REGISTER_TOPIC_IN_NAMESRV,
                RequestCode.UPDATE_NAMESRV_CONFIG,
            ]
        ),
        st.binary(max_size=64) | st.just(b"\x78\xda\x03\x00\x00\x00\x00\x01"),
    ),
)


def send_and_drop(addr: str, data: bytes) -> None:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as s:
        s.sendall(data)
        s.settimeout(0.05)
        try:
            while s.recv(65536):
                pass
        except (TimeoutError, ConnectionError):
            pass


def test_hostile_frames_never_stop_the_node_serving_others(node, caplog):
    caplog.set_level(logging.WARNING)
    with NameServerClient(node.addr) as healthy:
        healthy.cluster_info()

        @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
        @given(data=hostile)
        def attack(data: bytes) -> None:
            send_and_drop(node.addr, data)
            # the long-lived, well-formed client is answered after every attack
            assert healthy.call(RequestCode.GET_BROKER_CLUSTER_INFO).code == 0

        attack()
        # and a fresh well-formed connection still works at the end
        with NameServerClient(node.addr) as fresh:
            assert fresh.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicTest"}).code == 17
    # no "Fatal error on transport", no handler traceback: every failure was a clean refusal
    # (other tests' leftovers, e.g. kafka-python threads, may log in this process too: only ours count)
    ours = [r for r in caplog.records if r.name.split(".")[0] in ("namesrv", "asyncio")]
    assert not [r.getMessage()[:200] for r in ours if r.levelno >= logging.ERROR]
    # and the warnings for closed connections are rate-limited (the run takes a minute or two)
    assert sum(r.name == "namesrv.server" for r in caplog.records) <= 3 * server_mod._DROP_LOG_PER_MINUTE
