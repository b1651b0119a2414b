"""``namesrv-monitor``: read what the liveness monitor keeps in Redis, as text or as a live web page.

``routes`` prints a topic's route, the topics, the open alerts and the monitor's last write, or
follows route changes; ``console`` serves the cluster-health page. Both read Redis only, so they
work while any name-server node or the job itself is down. The job runs with ``python -m streaming``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from common.cli_text import human, table
from common.logs import setup_logging

#: where `namesrv-monitor routes` finds its Redis URL when --redis is not given (keeps a password off the command line)
REDIS_URL_ENV = "NAMESRV_REDIS_URL"


def _routes(args: argparse.Namespace) -> int:
    """Read what the streaming monitor materialised in Redis (docs/redis-keys.md)."""
    import redis

    from common.redis_clients import describe_error, redact_url
    from streaming.routes import RouteLookup

    shown = redact_url(args.redis)  # the URL may carry a password: only this form is ever printed
    try:
        lookup = RouteLookup(args.redis, prefix=args.prefix)
    except ValueError as e:  # ConfigError included; a cluster URL or prefix that cannot work
        print(f"namesrv-monitor routes: {e}", file=sys.stderr)
        return 2
    try:
        if args.routes_command == "get":
            raw = lookup.get_raw(args.topic)
            if raw is None:
                print(f"no route for {args.topic} in {shown} (is the streaming monitor running?)", file=sys.stderr)
                return 1
            print(json.dumps(json.loads(raw), indent=2) if args.pretty else raw.decode())
        elif args.routes_command == "watch":
            print(f"watching {shown} for route changes; Ctrl-C to stop", file=sys.stderr)
            for topic in lookup.watch():
                raw = lookup.get_raw(topic)
                print(json.dumps({"topic": topic, "route": None if raw is None else json.loads(raw)}), flush=True)
        elif args.routes_command == "topics":
            print("\n".join(lookup.topics()))
        elif args.routes_command == "alerts":
            print(
                table([{"severity": a.severity, "incident": a.incident, "message": a.message} for a in lookup.alerts()])
            )
        else:
            print(human(lookup.status() or "nothing written yet"))
    except redis.AuthenticationError as e:
        print(f"namesrv-monitor routes: {describe_error(e, args.redis)}", file=sys.stderr)
        return 1
    except redis.RedisError as e:
        print(
            f"namesrv-monitor routes: {describe_error(e, args.redis)}. Is Redis up (make run starts it)?",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        lookup.close()
    return 0


def _console(args: argparse.Namespace) -> int:
    """Serve the live cluster-health page (streaming/console)."""
    from streaming.console import ConsoleSettings, serve

    if not 50 <= args.poll_ms <= 5000:
        print(f"namesrv-monitor console: --poll-ms {args.poll_ms}: use 50 ..= 5000", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"namesrv-monitor console: --port {args.port}: use 0 ..= 65535", file=sys.stderr)
        return 2
    setup_logging(args.log_level or "WARNING")
    try:
        serve(ConsoleSettings(args.redis, args.prefix, args.poll_ms), args.host, args.port)
    except OSError as e:
        print(f"namesrv-monitor console: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="namesrv-monitor", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    routes = sub.add_parser("routes", help="routes, cluster info and alerts the streaming monitor keeps in Redis")
    routes.add_argument(
        "--redis",
        default=os.environ.get(REDIS_URL_ENV) or "redis://127.0.0.1:16379/0",
        help=f"Redis URL: redis://[[USER]:PASSWORD@]HOST:PORT/DB, rediss://... for TLS (?ssl_ca_certs=FILE), "
        "redis+cluster://HOST:PORT[,HOST:PORT...] for a Redis Cluster, or "
        f"${{env:NAME}} / ${{file:PATH}} (default: ${REDIS_URL_ENV}, else the local stack's; a password there stays "
        "off the command line)",
    )
    routes.add_argument("--prefix", default="namesrv", help="key prefix (the job's redis.keyPrefix)")
    routes.set_defaults(func=_routes)
    routes_sub = routes.add_subparsers(dest="routes_command", required=True)
    get = routes_sub.add_parser("get", help="one topic's route, the bytes a name server would answer")
    get.add_argument("topic")
    get.add_argument("--pretty", action="store_true", help="indent the JSON")
    routes_sub.add_parser("watch", help="print each topic's new route as it changes")
    routes_sub.add_parser("topics", help="every topic with a route")
    routes_sub.add_parser("alerts", help="open health incidents")
    routes_sub.add_parser("status", help="the monitor's last write: batch, watermark, time")

    console = sub.add_parser(
        "console",
        help="live cluster-health page in the browser, from what the streaming monitor keeps in Redis",
        description="Serve a web page that shows every cluster, broker group and broker (heartbeat age, "
        "countdown to expiry, state), the nodes, the monitor and its alerts, and looks up routes; it "
        "updates within a second of a change. It reads Redis only.",
    )
    console.add_argument("--redis", default="redis://127.0.0.1:16379/0", help="Redis URL (default: the local stack's)")
    console.add_argument("--prefix", default="namesrv", help="key prefix (the job's redis.keyPrefix)")
    console.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; no login)")
    console.add_argument("--port", type=int, default=18080, help="port to listen on (default 18080)")
    console.add_argument("--poll-ms", type=int, default=300, help="read Redis every N ms (default 300)")
    console.add_argument("--log-level", help="DEBUG, INFO, WARNING (default WARNING)")
    console.set_defaults(func=_console)

    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
