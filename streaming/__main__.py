"""``python -m streaming``: run the liveness monitor until interrupted.

``spark-submit streaming/__main__.py`` runs it too, from the activated venv or with
``PYSPARK_DRIVER_PYTHON`` set to its python; the job's ``spark.master`` (``-D spark.master=…``, default
``local[*]``) overrides spark-submit's ``--master``.  SIGTERM (or Ctrl-C) to this process, the driver, or to
the driver's JVM (under spark-submit, the PID spark-submit runs as: what a supervisor signals) stops the query
and the session, and the process exits 0 (spark-submit's JVM with the driver's code); a second signal to the
JVM stops it at once, with its own shutdown (exit 143 after SIGTERM). A query that fails is started
again from its checkpoint in this process, after 2 s doubling to 60 s; after more than five failures in
ten minutes the process exits 1 and leaves the restart to its supervisor (``make run``'s stack). What
waiting cannot mend exits 2 with a message at once: a setting that does not parse, Spark's Kafka connector
missing from the class path, Kafka refusing the job's credentials.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from common.logs import setup_logging
from streaming.config import DEFAULT_CONFIG_PATH, ConfigError, load_config, parse_overrides

log = logging.getLogger("streaming.main")
#: failures of the query within _FAILURE_WINDOW_S that the process recovers from by itself
_MAX_FAILURES = 5
_FAILURE_WINDOW_S = 600.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m streaming",
        description="The Spark Structured Streaming liveness monitor of the name servers: reads the "
        "events topic, publishes EXPIRE/REMOVE actions and alerts, keeps routes in Redis.",
    )
    parser.add_argument(
        "-c", "--config", type=Path, default=None,
        help=f"properties file (default: {DEFAULT_CONFIG_PATH} if present)",
    )  # fmt: skip
    parser.add_argument(
        "-D", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one key, e.g. -D monitor.watermarkDelayMillis=60000 -D spark.master=local[2]",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="log every batch")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    setup_logging("INFO" if args.verbose else "WARNING")  # logfmt lines, as the nodes write them
    # alerts and actions are what an operator watches, even without -v
    logging.getLogger("streaming.alerts").setLevel(logging.INFO)
    try:
        cfg = load_config(args.config, parse_overrides(args.overrides))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from streaming import job, session

    stopping = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        # only flag it: the main thread may be inside a py4j call, which must not be re-entered
        logging.getLogger(__name__).warning("signal %d: stopping the monitor", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        spark = session.build_spark(cfg)
    except ConfigError as exc:  # Spark's Kafka connector is missing
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spark.sparkContext.setLogLevel("WARN")

    def _jvm_stop(name: str) -> None:
        logging.getLogger(__name__).warning("SIG%s to the JVM: stopping the monitor", name)
        stopping.set()

    # under spark-submit the JVM is what a supervisor signals: it must leave the stop to us
    session.forward_jvm_signals(spark, _jvm_stop)
    failures: list[float] = []
    try:
        while True:
            try:
                monitor = job.start(spark, cfg, stopping=stopping)  # waits for Kafka
            except ConfigError as exc:  # Kafka refuses the credentials: waiting will not help
                print(f"error: {exc}", file=sys.stderr)
                return 2
            if monitor is None:
                return 0
            while not stopping.wait(1.0) and monitor.query.isActive:
                pass
            monitor.stop()
            failure = monitor.query.exception()
            if failure is None or stopping.is_set():
                return 0
            # A failed query is started again from its checkpoint, in this process: a Python worker
            # that did not connect back in time on a loaded machine, a Kafka hiccup mid-batch. Inputs
            # cannot fail it (they are checked), so a query failing again and again is something
            # else: after a few within the window, give up and let the supervisor restart the process.
            now = time.monotonic()
            failures = [t for t in failures if now - t < _FAILURE_WINDOW_S] + [now]
            first_line = str(failure).splitlines()[0] if str(failure) else repr(failure)
            if len(failures) > _MAX_FAILURES:
                print(
                    f"error: the streaming query failed {len(failures)} times within "
                    f"{_FAILURE_WINDOW_S:.0f} s; last: {first_line}",
                    file=sys.stderr,
                )
                return 1
            wait_s = min(60.0, 2.0 ** len(failures))
            log.error(
                "the streaming query failed (%s); starting it again from its checkpoint in %.0f s", first_line, wait_s
            )
            if stopping.wait(wait_s):
                return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
