"""The name server's own Python cost per REGISTER_BROKER, without sockets: rmq-loadgen's frames fed to a connection.

As ``rmq-loadgen register --brokers 100 --topics-per-broker 1000`` sends them (a ~140 kB plain body, a new
DataVersion in every request), after a first round that registers every broker: each re-registration
of an unchanged topic table with a new DataVersion, the broker's periodic one.  CPU time per
registration is printed; for instruction counts (stable on a shared machine) ``--count N`` feeds N
registrations and exits, and the difference of two counts under callgrind is the cost of feeding::

    for n in 200 1200; do PYTHONPATH=<tree> valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python bench/register_micro.py --count $n 2>&1 | grep Collected; done
    # (second - first) / 1000 = instructions per registration

Under valgrind OpenSSL does not see the CPU's SHA extensions, so a tree that hashes bodies counts more
instructions there than it runs natively.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib

# run as a script, this folder is first on sys.path; PYTHONPATH picks the tree measured
from hotpath_micro import Transport, frame

from common.protocol.codec import decode_frame
from common.protocol.command import RemotingCommand
from namesrv.app import build_node
from namesrv.config import load_config
from namesrv.handlers import dispatch
from namesrv.repeats import Repeats
from namesrv.server import Connection, RemotingServer

#: what rmq-loadgen writes before the DataVersion (tools/rmq-loadgen/src/main.rs, REG_PREFIX)
PREFIX = b'{"filterServerList":[],"topicConfigSerializeWrapper":{"dataVersion":'
#: frames built whatever --count is, so that two counts differ by the feeding alone
BUILT = 1200


def topic_table(b: int, topics: int) -> bytes:
    """Broker ``b``'s body after its DataVersion, as rmq-loadgen's topic_table_tail writes it."""
    rows = ",".join(
        f'"T{i}":{{"order":false,"perm":6,"readQueueNums":8,"topicFilterType":"SINGLE_TAG","topicName":"T{i}",'
        f'"topicSysFlag":0,"writeQueueNums":8}}'
        for i in range(b * topics, (b + 1) * topics)
    )
    return b',"topicConfigTable":{' + rows.encode() + b"}}}"


def registration(b: int, counter: int, tables: list[bytes]) -> bytes:
    dv = b'{"counter":%d,"stateVersion":0,"timestamp":%d}' % (counter, 1_700_000_000_000 + counter)
    body = PREFIX + dv + tables[b]
    ext = [
        ("brokerName", f"broker-{b}"), ("brokerAddr", f"127.0.0.1:{30000 + 2 * b}"),
        ("clusterName", "DefaultCluster"), ("haServerAddr", f"127.0.0.1:{30001 + 2 * b}"), ("brokerId", "0"),
        ("compressed", "false"), ("bodyCrc32", str(zlib.crc32(body) & 0x7FFFFFFF)),
    ]  # fmt: skip
    return frame(103, ext, counter, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=100)
    parser.add_argument("--topics", type=int, default=1000, help="topics per broker")
    parser.add_argument("--count", type=int, help="feed this many registrations once and exit (for callgrind)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="register-micro-")
    config = load_config(None, {"kvConfigPath": f"{tmp}/kv.json", "configStorePath": f"{tmp}/namesrv.properties"})
    context = build_node(config).context
    connection = Connection(RemotingServer(context, repeats=Repeats(context)))
    transport = Transport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    tables = [topic_table(b, args.topics) for b in range(args.brokers)]
    counter = 1
    for b in range(args.brokers):  # first registrations: parsed on the worker thread, waited for here
        response = dispatch(context, decode_frame(registration(b, counter, tables)), connection)
        assert isinstance(response, RemotingCommand) and response.code == 0, response
        counter += 1

    def feed(n: int) -> float:
        """Feed ``n`` re-registrations; the CPU seconds each took."""
        nonlocal counter
        frames = [registration(i % args.brokers, counter + i, tables) for i in range(max(n, BUILT))][:n]
        counter += len(frames)
        written = transport.written
        began = time.process_time()
        for data in frames:
            connection.data_received(data)
        spent = time.process_time() - began
        assert connection.pending is None, "a body this large is registered off the loop: not measured here"
        assert transport.written > written
        return spent / n

    feed(args.brokers)  # warm-up: every broker re-registered once
    if args.count is not None:
        feed(args.count)
        return
    best = min(feed(20 * args.brokers) for _ in range(5))
    print(f"{best * 1e6:.1f} us per registration (best of 5)")
    context.close()


if __name__ == "__main__":
    main()
