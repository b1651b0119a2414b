"""The name server's own Python cost per request, without sockets: rmq-loadgen's frames fed to a connection.

A node holds 10 brokers x 100 topics (as ``rmq-loadgen setup`` registers them); a connection on a fake
transport is fed the frames rmq-loadgen's ``route`` (1,000 topics) or ``heartbeat`` (10 brokers)
workload sends, DEPTH frames per read, and the CPU time per request is printed.  On a shared machine
CPU time is noisy; instruction counts are not: ``--count N`` only feeds N requests (after a warm-up),
so under callgrind the difference of two counts is the instructions per request::

    for n in 960 20160; do PYTHONPATH=<tree> valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/hotpath_micro.py route 16 --count $n 2>&1 | grep Collected; done
    # (second - first) / 19200 = instructions per request

    PYTHONPATH=<tree> .venv/bin/python bench/hotpath_micro.py heartbeat 16      # microseconds per request
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parents[1]))  # tests.support.brokers; PYTHONPATH picks the tree

from common.protocol.codec import encode  # noqa: E402
from common.protocol.codes import RequestCode  # noqa: E402
from common.protocol.command import request  # noqa: E402
from namesrv.app import build_node  # noqa: E402
from namesrv.config import load_config  # noqa: E402
from namesrv.repeats import Repeats  # noqa: E402
from namesrv.server import Connection, RemotingServer  # noqa: E402
from tests.support.brokers import registration  # noqa: E402
from tests.support.frames import json_frame, loadgen_header  # noqa: E402

#: frames per pass: a multiple of every depth used, and of rmq-loadgen's 10 brokers
POOL = 960
#: the DataVersion rmq-loadgen's setup registers and its heartbeat workload sends
DATA_VERSION = b'{"counter":1,"stateVersion":0,"timestamp":1700000000000}'


class Transport:
    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def frame(code: int, ext: list[tuple[str, str]], opaque: int, body: bytes = b"") -> bytes:
    """A request as rmq-loadgen writes it."""
    return json_frame(loadgen_header(code, ext, opaque), body)


def workload_frame(workload: str, i: int, opaque: int) -> bytes:
    if workload == "route":
        return frame(105, [("topic", f"T{i % 1000}")], opaque)
    b = i % 10
    ext = [("brokerName", f"broker-{b}"), ("brokerAddr", f"127.0.0.1:{30000 + 2 * b}")]
    return frame(322, [*ext, ("clusterName", "DefaultCluster"), ("brokerId", "0")], opaque, DATA_VERSION)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=["route", "heartbeat"])
    parser.add_argument("depth", type=int, help="frames per read (rmq-loadgen's -d)")
    parser.add_argument("--count", type=int, help="feed this many requests once and exit (for callgrind)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="hotpath-")
    config = load_config(None, {"kvConfigPath": f"{tmp}/kv.json", "configStorePath": f"{tmp}/namesrv.properties"})
    context = build_node(config).context
    server = RemotingServer(context, repeats=Repeats(context))
    brokers = Connection(server)
    brokers.connection_made(Transport())  # type: ignore[arg-type]
    for b in range(10):
        topics = [f"T{b * 100 + i}" for i in range(100)]
        ext, raw = registration(
            broker_addr=f"127.0.0.1:{30000 + 2 * b}", broker_name=f"broker-{b}", topics=topics, queues=8
        )
        brokers.data_received(encode(request(RequestCode.REGISTER_BROKER, ext, raw, opaque=b + 1, version=409)))
    reads = [
        b"".join(workload_frame(args.workload, i + k, 100 + i + k) for k in range(args.depth))
        for i in range(0, POOL, args.depth)
    ]
    client = Connection(server)
    client.connection_made(Transport())  # type: ignore[arg-type]
    for _ in range(2):  # warm-up: every request seen twice
        for data in reads:
            client.data_received(data)
    if args.count is not None:
        for data in reads * (args.count // POOL):
            client.data_received(data)
        return
    best = float("inf")
    for _ in range(5):
        began = time.process_time()
        for data in reads * 100:
            client.data_received(data)
        best = min(best, time.process_time() - began)
    print(f"{args.workload}, {args.depth} per read: {best / (POOL * 100) * 1e6:.2f} us per request (best of 5)")
    context.close()


if __name__ == "__main__":
    main()
