"""``namesrv``: run a node, or talk to any name server the way mqadmin does."""

from __future__ import annotations

import argparse
import json
import logging
import os
import ssl
import sys
from pathlib import Path
from typing import Any

from common.cli_text import human
from common.logs import setup_logging


def _start(args: argparse.Namespace) -> int:
    from namesrv import app
    from namesrv.acl import AclFileError
    from namesrv.config import ConfigError, load_config, render_properties

    overrides = dict(kv.split("=", 1) for kv in args.set)
    try:
        config = load_config(Path(args.config) if args.config else None, overrides)
    except ConfigError as e:
        print(f"namesrv: bad configuration: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        sys.stdout.write(render_properties(config))
        return 0
    setup_logging(args.log_level or config.log_level)
    try:
        app.run(config)
    except AclFileError as e:  # aclEnable with an accounts file that cannot be used
        print(f"namesrv: bad configuration: aclFile: {e}", file=sys.stderr)
    except ConfigError as e:  # found once the node starts: a key that does not decrypt, a metrics port taken
        print(f"namesrv: bad configuration: {e}", file=sys.stderr)
        return 2
    return 0


def _credentials(args: argparse.Namespace) -> Any:
    """--access-key/--secret-key, each falling back to ROCKETMQ_ACCESS_KEY/ROCKETMQ_SECRET_KEY; None: unsigned."""
    import os

    from namesrv.acl import Credentials

    access = args.access_key or os.environ.get("ROCKETMQ_ACCESS_KEY", "")
    secret = args.secret_key or os.environ.get("ROCKETMQ_SECRET_KEY", "")
    if not access and not secret:
        return None
    if not access or not secret:
        missing = "--access-key (or ROCKETMQ_ACCESS_KEY)" if not access else "--secret-key (or ROCKETMQ_SECRET_KEY)"
        raise ValueError(f"signing needs both an access key and a secret key; {missing} is not set")
    return Credentials(access, secret, os.environ.get("ROCKETMQ_SECURITY_TOKEN") or None)


def _add_credential_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--access-key", help="sign requests with this account's AccessKey (default: $ROCKETMQ_ACCESS_KEY)")
    p.add_argument(
        "--secret-key",
        help="its secret key (default: $ROCKETMQ_SECRET_KEY, which keeps it out of the process list)",
    )


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """The clients' TLS options (``namesrv admin``, ``namesrv simulate``)."""
    group = parser.add_argument_group("TLS (for a node with tls.server.mode permissive or enforcing)")
    group.add_argument("--tls", action="store_true", help="connect with TLS (implied by the other --tls-* options)")
    group.add_argument(
        "--tls-ca", metavar="PEM", help="CA certificates to verify the node with (default: the system's)"
    )
    group.add_argument("--tls-cert", metavar="PEM", help="client certificate, for tls.server.need.client.auth")
    group.add_argument("--tls-key", metavar="PEM", help="its private key (default: in --tls-cert)")
    group.add_argument(
        "--tls-key-password-env",
        metavar="VAR",
        help="environment variable holding the password of an encrypted --tls-key (never on the command line)",
    )
    group.add_argument(
        "--tls-insecure",
        action="store_true",
        help="do not verify the node's certificate (as RocketMQ's Java client by default; test mode's certificate)",
    )


def tls_context_from_args(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context the options ask for, or None for plaintext; ValueError with a message for the user."""
    from namesrv.tls import client_context

    if not (args.tls or args.tls_ca or args.tls_cert or args.tls_key or args.tls_insecure):
        return None
    password = None
    if args.tls_key_password_env:
        password = os.environ.get(args.tls_key_password_env)
        if password is None:
            raise ValueError(f"--tls-key-password-env {args.tls_key_password_env}: no such environment variable")
    return client_context(
        ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, key_password=password, insecure=args.tls_insecure
    )


class NotFound(Exception):
    """An admin command found nothing where the user expected something (exit 1, message on stderr)."""


def _report_closed(args: argparse.Namespace, tls: bool, error: OSError) -> None:
    """The node hung up on us without a word (its log says why): say what to change, found by trying it
    the other way (namesrv.client.answers)."""
    from namesrv.client import answers

    proxy = "connect through the proxy in front of it, which sends the PROXY protocol preamble"
    try:
        if answers(args.namesrv, args.timeout, tls=True):
            hint = (
                # with TLS 1.3 a refused client certificate shows so
                "it refused our certificate (tls.server.need.client.auth): pass --tls-cert/--tls-key from a CA"
                " it trusts"
                if tls
                else "it requires TLS (tls.server.mode=enforcing): pass --tls (and --tls-ca)"
            )
        elif answers(args.namesrv, args.timeout, tls=False):
            hint = (
                "it serves plaintext only (no tls.server.certPath on the node): leave out the --tls options"
                if tls
                else "it answered a second try: try again"
            )
        else:
            hint = f"it closes TLS and plaintext alike, as a node with proxyProtocolMode=required does: {proxy}"
    except OSError:
        hint = f"if it runs tls.server.mode=enforcing, pass --tls; if it runs proxyProtocolMode=required, {proxy}"
    print(f"namesrv admin: {args.namesrv} closed the connection ({error}); {hint}", file=sys.stderr)


def _admin(args: argparse.Namespace) -> int:
    from namesrv.client import NameServerClient, RemoteError

    try:
        credentials = _credentials(args)
        tls = tls_context_from_args(args)
    except ValueError as e:
        print(f"namesrv admin: {e}", file=sys.stderr)
        return 2
    try:
        with NameServerClient(args.namesrv, timeout=args.timeout, credentials=credentials, tls=tls) as client:
            result = ADMIN_COMMANDS[args.admin_command][1](client, args)
    except (RemoteError, NotFound) as e:
        print(f"namesrv admin {args.admin_command}: {e}", file=sys.stderr)
        return 1
    except ssl.SSLError as e:
        if isinstance(e, ssl.SSLEOFError):  # closed during the handshake
            _report_closed(args, tls is not None, e)
            return 1
        print(f"namesrv admin: TLS with {args.namesrv} failed: {e}. Check --tls-ca / --tls-cert", file=sys.stderr)
        return 1
    except OSError as e:
        if type(e) is ConnectionError or isinstance(e, ConnectionResetError):
            _report_closed(args, tls is not None, e)
        else:
            print(
                f"namesrv admin: cannot reach {args.namesrv}: {e}. Is a name server listening there?", file=sys.stderr
            )
        return 1
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        print(human(result))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from namesrv import simulate

    try:
        tls = tls_context_from_args(args)
        config = simulate.FleetConfig(
            namesrv=simulate.parse_namesrv_list(args.namesrv),
            brokers=args.brokers,
            topics=args.topics,
            cluster=args.cluster,
            slaves_per_group=args.slaves_per_group,
            register_interval=args.register_interval,
            heartbeat_interval=args.heartbeat_interval,
            heartbeat_kind=simulate.HeartbeatKind(args.heartbeat_kind),
            heartbeat_timeout_ms=args.heartbeat_timeout_ms,
            silent=args.silent,
            silent_after=args.silent_after,
            unregister=args.unregister,
            unregister_after=args.unregister_after,
            addr_base=args.addr_base,
            timeout=args.timeout,
            summary_interval=args.summary_interval,
            credentials=_credentials(args),
            tls=tls,
        )
    except ValueError as e:
        print(f"namesrv simulate: {e}", file=sys.stderr)
        return 2
    setup_logging(args.log_level or "WARNING")
    logging.getLogger(simulate.events_log.name).setLevel(logging.INFO)
    summary = simulate.run(
        simulate.Fleet(config), duration=args.duration, unregister_on_exit=not args.no_unregister_on_exit
    )
    print(json.dumps(summary, indent=2, sort_keys=True) if args.json else human(summary))
    if summary["registrations"] == 0:
        print(
            f"namesrv simulate: no name server accepted a registration; is one listening at {args.namesrv}?",
            file=sys.stderr,
        )
        return 1
    return 0


def _cluster_list(client, args) -> list[dict[str, Any]]:
    brokers, clusters = client.cluster_info()
    rows = []
    for cluster, names in sorted(clusters.items()):
        for name in sorted(names):
            b = brokers.get(name)
            for broker_id, addr in sorted((b.broker_addrs if b else {}).items()):
                rows.append({"cluster": cluster, "brokerName": name, "brokerId": broker_id, "addr": addr})
    return rows


def _topic_route(client, args) -> Any:
    route = client.topic_route(args.topic)
    if args.json:
        return route.to_wire()
    rows = [
        {
            "brokerName": q.broker_name,
            "read": q.read_queue_nums,
            "write": q.write_queue_nums,
            "perm": q.perm,
            "addrs": " ".join(f"{i}={a}" for i, a in sorted(b.broker_addrs.items())),
        }
        for q in route.queue_datas
        for b in route.broker_datas
        if b.broker_name == q.broker_name
    ]
    return rows


def _kv_get(client, args) -> Any:
    value = client.get_kv(args.namespace, args.key)
    if value is None:  # QUERY_NOT_FOUND: a script must be able to tell it from a value
        raise NotFound(f"no value for key {args.key!r} in namespace {args.namespace!r}")
    return {"namespace": args.namespace, "key": args.key, "value": value}


ADMIN_COMMANDS: dict[str, tuple[str, Any, list[tuple[str, str]]]] = {
    "clusterList": ("brokers per cluster", _cluster_list, []),
    "topicRoute": ("route of one topic", _topic_route, [("-t", "topic")]),
    "topicList": ("all topics, or a cluster's", lambda c, a: c.topic_list(a.cluster), [("-c", "cluster?")]),
    "getKvConfig": ("one KV value", _kv_get, [("-s", "namespace"), ("-k", "key")]),
    "updateKvConfig": (
        "set a KV value",
        lambda c, a: c.put_kv(a.namespace, a.key, a.value) or "OK",
        [("-s", "namespace"), ("-k", "key"), ("-v", "value")],
    ),
    "deleteKvConfig": (
        "delete a KV value",
        lambda c, a: c.delete_kv(a.namespace, a.key) or "OK",
        [("-s", "namespace"), ("-k", "key")],
    ),
    "wipeWritePerm": (
        "clear write permission of a broker group",
        lambda c, a: {"brokerName": a.broker_name, "wipeTopicCount": c.wipe_write_perm(a.broker_name)},
        [("-b", "broker_name")],
    ),
    "addWritePerm": (
        "restore write permission of a broker group",
        lambda c, a: {"brokerName": a.broker_name, "addTopicCount": c.add_write_perm(a.broker_name)},
        [("-b", "broker_name")],
    ),
    "getNamesrvConfig": ("the name server's settings", lambda c, a: dict(sorted(c.get_config().items())), []),
    "updateNamesrvConfig": (
        "change one setting",
        lambda c, a: c.update_config({a.key: a.value}) or "OK",
        [("-k", "key"), ("-v", "value")],
    ),
}


def _admin_options(parser: argparse.ArgumentParser) -> None:
    """The options every admin command takes, before or after the command.  Neither parser has a
    default for them (argparse would let the command's default overwrite what was given before it):
    the admin parser's set_defaults puts them in once."""
    parser.add_argument("-n", "--namesrv", default=argparse.SUPPRESS, help="host:port (default 127.0.0.1:9876)")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    parser.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="seconds per request (default 5)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="namesrv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser("start", help="run a name-server node in the foreground")
    start.add_argument("-c", "--config", help="RocketMQ-style properties file (e.g. conf/namesrv.properties)")
    start.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override one property")
    start.add_argument("-p", "--print-config", action="store_true", help="print the effective configuration and exit")
    start.add_argument("--log-level", help="DEBUG, INFO, WARNING (default: the logLevel property)")
    start.set_defaults(func=_start)

    admin = sub.add_parser("admin", help="mqadmin's name-server commands against any name server")
    _admin_options(admin)
    _add_credential_options(admin)
    add_tls_arguments(admin)
    admin.set_defaults(func=_admin, namesrv="127.0.0.1:9876", json=False, timeout=5.0)
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    for name, (help_text, _fn, options) in ADMIN_COMMANDS.items():
        p = admin_sub.add_parser(name, help=help_text)
        # before or after the command, as mqadmin users type them (`clusterList -n H --json`)
        _admin_options(p)
        for flag, dest in options:
            optional = dest.endswith("?")
            dest = dest.rstrip("?")
            p.add_argument(flag, f"--{dest.replace('_', '-')}", dest=dest, required=not optional)

    sim = sub.add_parser(
        "simulate",
        help="a fleet of fake brokers registering with name servers over the real protocol",
        description="Simulated RocketMQ 5.x brokers: register with every name server, re-register "
        "every interval, optionally heartbeat; some can go silent (half-open, removed "
        "only by expiry) or unregister. Ctrl-C or SIGTERM unregisters the live ones.",
    )
    sim.add_argument(
        "-n",
        "--namesrv",
        default="127.0.0.1:9876",
        help="name servers, ';'-separated like namesrvAddr " "(quote it in a shell; default 127.0.0.1:9876)",
    )
    sim.add_argument("--brokers", type=int, default=1, help="broker groups, named broker-0.. (default 1)")
    sim.add_argument("--topics", type=int, default=1, help="topics per group: group b owns T<b*M>..T<b*M+M-1>")
    sim.add_argument("--cluster", default="DefaultCluster")
    sim.add_argument("--slaves-per-group", type=int, default=0, help="slaves (broker ids 1..K) beside each master")
    sim.add_argument(
        "--register-interval",
        type=float,
        default=30.0,
        metavar="S",
        help="re-register every S seconds (the second registration comes 10 s after the first)",
    )
    sim.add_argument(
        "--heartbeat-interval",
        type=float,
        default=0.0,
        metavar="S",
        help="oneway heartbeat every S seconds between registrations; 0 = none (default)",
    )
    sim.add_argument(
        "--heartbeat-kind",
        choices=["query-data-version", "broker-heartbeat"],
        default="query-data-version",
        help="QUERY_DATA_VERSION (5.x default) or BROKER_HEARTBEAT",
    )
    sim.add_argument(
        "--heartbeat-timeout-ms",
        type=int,
        metavar="T",
        help="heartbeatTimeoutMillis sent when registering (node default: 120000)",
    )
    sim.add_argument("--silent", type=int, default=0, metavar="K", help="K groups go silent (half-open) ...")
    sim.add_argument("--silent-after", type=float, default=60.0, metavar="S", help="... S seconds in (default 60)")
    sim.add_argument("--unregister", type=int, default=0, metavar="K", help="K groups unregister and leave ...")
    sim.add_argument("--unregister-after", type=float, default=60.0, metavar="S", help="... S seconds in (default 60)")
    sim.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: until Ctrl-C)")
    sim.add_argument(
        "--addr-base",
        default="127.0.0.1:30000",
        help="broker i gets host:(port+2i), its HA address port+1 (default 127.0.0.1:30000)",
    )
    sim.add_argument(
        "--no-unregister-on-exit", action="store_true", help="on exit just close the connections, like a crashed broker"
    )
    sim.add_argument("--summary-interval", type=float, default=10.0, metavar="S", help="summary line every S seconds")
    sim.add_argument("--timeout", type=float, default=3.0, help="per request, seconds")
    sim.add_argument("--json", action="store_true", help="print the final summary as JSON")
    sim.add_argument("--log-level", help="DEBUG shows every retry (events are always shown)")
    _add_credential_options(sim)
    add_tls_arguments(sim)
    sim.set_defaults(func=_simulate)
    return parser


#: commands that moved to the monitor's own CLI, which reads what the monitor keeps in Redis
_MOVED = {"routes": "namesrv-monitor routes", "console": "namesrv-monitor console"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in _MOVED:
        print(f"namesrv {argv[0]}: this is now `{_MOVED[argv[0]]}`", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
