"""Send one message with the RocketMQ C++ client 1.0.1 (PyPI ``rocketmq==0.4.4``) and report it.

The producer asks the name server given by ``--namesrv`` for the route of ``--topic`` (header
version 63, so a Java name server answers in the legacy route dialect), connects to the broker
address in that route and sends the message there.  With the test's fake broker at that address,
a SEND_MESSAGE arriving there proves the C++ client accepted our route answer.

Prints one JSON line on stdout and exits 0 when the send returned, 1 when start or send failed,
2 when the client library cannot be loaded.  Run it as a subprocess: the C++ library owns threads
and can block in shutdown; ``--hard-exit`` skips that shutdown once the result is printed.

    python tests/peers/cpp_producer.py --namesrv 127.0.0.1:9876 --topic TopicTest [--access-key AK --secret-key SK]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

#: the header version this client stamps on every request (MQVersion ordinal of V3_4_x era)
CPP_CLIENT_HEADER_VERSION = 63


def _parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--namesrv", required=True, help="name server HOST:PORT (several: ';'-separated)")
    p.add_argument("--topic", required=True)
    p.add_argument("--group", default="peer_probe_cpp_producer")
    p.add_argument("--body", default="hello from the C++ client")
    p.add_argument("--tags", default="peer")
    p.add_argument("--send-timeout-ms", type=int, default=3000, help="the client's send timeout")
    p.add_argument(
        "--log-home",
        default=None,
        help="HOME for the C++ client, which logs to HOME/logs/rocketmq-cpp (default: a fresh temp dir)",
    )
    p.add_argument("--hard-exit", action="store_true", help="os._exit after printing, skipping the C++ shutdown")
    # the client's own signer (ClientRPCHook: AccessKey, OnsChannel and the header fields, HMAC-SHA1)
    p.add_argument("--access-key", default=os.environ.get("ROCKETMQ_ACCESS_KEY", ""), help="sign with this AccessKey")
    p.add_argument("--secret-key", default=os.environ.get("ROCKETMQ_SECRET_KEY", ""), help="... and this secret")
    return p.parse_args(argv)


def _emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def _log_tail(log_dir: str, lines: int = 8) -> list[str]:
    """The client's last warnings and errors: its exceptions say little, its log says why."""
    try:
        paths = sorted(os.path.join(log_dir, n) for n in os.listdir(log_dir))
    except OSError:
        return []
    found: list[str] = []
    for path in paths:
        with open(path, errors="replace") as fh:
            found += [ln.rstrip() for ln in fh if "(warning)" in ln or "(error)" in ln]
    return found[-lines:]


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    log_home = args.log_home or tempfile.mkdtemp(prefix="rocketmq-cpp-")
    log_dir = os.path.join(log_home, "logs", "rocketmq-cpp")
    # the library takes its log directory from $HOME; SetProducerLogPath does not move it in 1.0.1
    os.environ["HOME"] = log_home
    result: dict[str, Any] = {
        "ok": False,
        "namesrv": args.namesrv,
        "topic": args.topic,
        "client": {
            "name": "rocketmq-client-cpp",
            "pypi": "rocketmq==0.4.4",
            "header_version": CPP_CLIENT_HEADER_VERSION,
        },
        "log_dir": log_dir,
    }
    try:
        from rocketmq.client import Message, Producer
    except (ImportError, OSError) as exc:
        result.update(step="load", error=f"{type(exc).__name__}: {exc}; run tests/peers/install.sh")
        _emit(result)
        return 2

    t0 = time.monotonic()
    producer = Producer(args.group, timeout=args.send_timeout_ms)
    producer.set_namesrv_addr(args.namesrv)
    result["signed"] = bool(args.access_key and args.secret_key)
    if result["signed"]:
        producer.set_session_credentials(args.access_key, args.secret_key, "ALIYUN")
    step = "start"
    try:
        producer.start()
        result["start_ms"] = round((time.monotonic() - t0) * 1000)
        step = "send"
        msg = Message(args.topic)
        msg.set_tags(args.tags)
        msg.set_keys("peer-probe")
        msg.set_body(args.body)
        t1 = time.monotonic()
        sent = producer.send_sync(msg)
        result.update(
            ok=True,
            send_ms=round((time.monotonic() - t1) * 1000),
            status=sent.status.name,
            msg_id=sent.msg_id,
            offset=sent.offset,
        )
    except Exception as exc:  # the wrapper raises one class per C status; all mean "this step failed"
        result.update(step=step, error=f"{type(exc).__name__}: {exc}", log_tail=_log_tail(log_dir))
    _emit(result)
    if args.hard_exit:
        os._exit(0 if result["ok"] else 1)
    try:
        producer.shutdown()
    except Exception as exc:  # the outcome is already printed; shutdown trouble only goes to stderr
        print(f"shutdown failed: {exc}", file=sys.stderr)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
