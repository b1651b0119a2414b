"""The job's Spark session: its Python, its Kafka connector, its log, and how its JVM takes a stop signal.

:func:`build_spark` starts (or joins, under ``spark-submit``) the driver's JVM with the job's
settings: every Python worker runs this interpreter and can import ``common`` and ``streaming``
(:func:`python_settings`), Spark's Kafka connector is on the driver's class path
(:func:`launch_settings`, checked by :func:`check_connector`, which says how to fix it), and
Spark's per-batch chatter is kept out of the job's log (:data:`QUIET_SPARK_LOGGERS`). A JVM it
starts itself starts fast: C1-compiled only (:data:`~streaming.config.SPARK_DEFAULTS`), with Spark's
classes from a class-data-sharing archive (:mod:`streaming.class_archive`).

:func:`forward_jvm_signals`: under ``spark-submit`` the JVM is the process a supervisor signals;
this has it hand the signal to the Python driver, which stops the query cleanly, instead of
shutting Spark down under the running query.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streaming.class_archive import ClassArchive
from streaming.config import CONNECTOR_CLASS, CONNECTOR_DIR, ConfigError, StreamingConfig, connector_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: the directory holding the common and streaming packages this driver runs
_PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _installed(root: Path) -> bool:
    """True when ``root`` is a site-packages directory: the project is installed, not run from a tree."""
    import site

    installed = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())}
    return root in installed


#: the Python worker daemon the executors run
DAEMON_MODULE = "streaming.spark_daemon"


def python_settings(
    spark_conf: Mapping[str, str],
    environ: Mapping[str, str],
    *,
    executable: str = sys.executable,
    root: Path = _PROJECT_ROOT,
    installed: bool | None = None,
) -> tuple[str, dict[str, str]]:
    """The Python that Spark must run for this job, and the ``spark.*`` settings that say so.

    Every Python worker of the job must import ``common`` and ``streaming`` and run the same
    PySpark as the driver. PySpark runs ``$PYSPARK_PYTHON``, else ``python3`` from PATH, which
    outside an activated venv has neither. So, whatever the master and launcher:
    ``spark.pyspark.python`` if given (``spark_conf``: the job's settings and the launcher's), else
    ``$PYSPARK_PYTHON``, else this interpreter (on a cluster: install the project at the same path on
    every host, as the deployment's one image does). When the project is not installed for that
    interpreter but run from a source tree, the tree goes to the executors' ``PYTHONPATH`` too,
    unless the settings give ``spark.executorEnv.PYTHONPATH``. Workers are forked from
    :mod:`streaming.spark_daemon` unless ``spark.python.daemon.module`` is given.
    """
    python = spark_conf.get("spark.pyspark.python") or environ.get("PYSPARK_PYTHON") or executable
    conf = {
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": executable,
        # workers forked with the job's imports done (see streaming.spark_daemon)
        "spark.python.daemon.module": DAEMON_MODULE,
    }
    if not (_installed(root) if installed is None else installed):
        conf["spark.executorEnv.PYTHONPATH"] = str(root)
    return python, {k: v for k, v in conf.items() if k not in spark_conf}


#: settings the driver's JVM takes only when it starts: given to its launcher (:func:`launch_settings`)
LAUNCH_ONLY = ("spark.jars", "spark.driver.extraJavaOptions")


def launch_settings(cfg: StreamingConfig) -> dict[str, str]:
    """What the driver's JVM must start with, when the job starts it: Spark's Kafka connector (``spark.jars``)
    and the JVM's options (``spark.driver.extraJavaOptions``, by default C1 only: a faster start).

    ``spark.jars`` set on the session builder reaches the executors but not the driver's own class path,
    which is fixed when its JVM starts: so the job's ``spark.jars``, by default the jars ``make setup`` put
    in :data:`~streaming.config.CONNECTOR_DIR`, is given to the launcher. No jars when they are not there:
    :func:`check_connector` then says what is missing.
    """
    settings = {key: cfg.spark[key] for key in LAUNCH_ONLY if key in cfg.spark}
    if "spark.jars" not in settings:
        with contextlib.suppress(ConfigError):
            settings["spark.jars"] = connector_jars()
    return settings


def check_connector(spark: SparkSession, cfg: StreamingConfig, *, submitted: bool) -> None:
    """ConfigError unless ``format("kafka")`` can load on the driver; the message says how to give it the jars."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session has its JVM
    try:
        jvm.java.lang.Class.forName(
            CONNECTOR_CLASS, False, jvm.java.lang.Thread.currentThread().getContextClassLoader()
        )
        return
    except Py4JJavaError:
        pass
    given = spark.sparkContext.getConf().get("spark.jars") or "(none)"
    if submitted:
        how = (
            f"spark-submit starts the driver's JVM, so give it the jars: spark-submit --jars '{CONNECTOR_DIR}/*.jar' "
            "streaming/__main__.py ..."
        )
    else:
        how = "spark.jars must list them (unset: the jars in " + str(CONNECTOR_DIR) + ")"
    raise ConfigError(
        f"kafka.format=kafka: Spark's Kafka connector ({CONNECTOR_CLASS}) is not on the driver's class path "
        f"(spark.jars={given}); {how}; `make setup` resolves them once"
    )


#: Spark's loggers the job's log takes only errors from: ProcessingTimeExecutor warns at every batch
#: slower than the trigger, hundreds of times a run on a busy machine; streaming.progress says it once
#: an episode, with figures
QUIET_SPARK_LOGGERS = ("org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor",)


def quiet_spark_loggers(spark: SparkSession) -> None:
    """Set :data:`QUIET_SPARK_LOGGERS` to ERROR in the driver's log4j (``setLogLevel`` leaves them so)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # a running session has its JVM
    error = jvm.org.apache.logging.log4j.Level.ERROR
    for name in QUIET_SPARK_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, error)


def build_spark(cfg: StreamingConfig) -> SparkSession:
    """A session with the job's Spark settings, Spark's Kafka connector on the driver's and the executors' class path."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if cfg.spark.get("spark.master", "").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # before the JVM starts, below
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    # read by PySpark when it creates the context (every Python function it ships names it); set before
    # the JVM starts too, so that it inherits it
    os.environ["PYSPARK_PYTHON"] = python_settings(cfg.spark, os.environ)[0]
    # under spark-submit the driver's JVM runs already, with the class path spark-submit gave it
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    # taken only when this starts the JVM: not under spark-submit, nor again in a process that started it
    settings = launch_settings(cfg)
    archive = None if submitted else ClassArchive.find()
    if archive is not None:
        java = settings.get("spark.driver.extraJavaOptions", "")
        settings["spark.driver.extraJavaOptions"] = archive.java_options(java)
    launch = SparkConf(loadDefaults=False).setAll(list(settings.items()))
    # what the launcher already set (spark-submit --conf, spark-defaults.conf) counts as given, as the job's own
    # keys do: read from the JVM, which this starts (under spark-submit it runs already)
    SparkContext._ensure_initialized(conf=launch)
    given = {**dict(SparkConf(_jvm=SparkContext._jvm).getAll()), **cfg.spark}
    python, conf = python_settings(given, os.environ)
    os.environ["PYSPARK_PYTHON"] = python
    for key, value in {**conf, **cfg.spark}.items():
        # given to the launcher: too late for a running JVM, and the launcher resolves spark.jars's glob
        if key not in LAUNCH_ONLY:
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    check_connector(spark, cfg, submitted=submitted)
    quiet_spark_loggers(spark)
    jvm = getattr(spark.sparkContext._gateway, "proc", None)  # the JVM PySpark launched, if this process did
    if archive is not None and jvm is not None:
        archive.build_later(jvm.pid)
    return spark


# --------------------------------------------------------------------------- stop signals


class _JvmSignalHandler:
    """A ``sun.misc.SignalHandler`` of the driver's JVM, implemented here (py4j calls it back).

    Under ``spark-submit`` the JVM is the process a supervisor signals, and its default SIGTERM
    handling is a JVM shutdown: its hooks stop the SparkContext under the running query
    (``NullPointerException: dagScheduler() is null``) and it exits 143. With this handler the
    JVM only tells the Python driver, which stops the query, then the session, and returns; the
    JVM then exits with the driver's code (0). A second signal gets the JVM's own handling.
    """

    def __init__(self, on_signal: Callable[[str], None]) -> None:
        self.on_signal = on_signal
        self.previous: dict[str, Any] = {}
        self.seen: set[str] = set()

    def handle(self, sig: Any) -> None:  # called by the JVM's signal dispatcher, through py4j
        name = str(sig.getName())
        if name in self.seen:
            previous = self.previous.get(name)
            if previous is not None and "NativeSignalHandler" not in previous.getClass().getName():
                log.warning("second SIG%s to the JVM: stopping it now", name)
                try:
                    previous.handle(
                        sig
                    )  # the JVM's shutdown (exit 128 + the signal's number): the call never returns an answer
                except Exception:  # noqa: BLE001 - py4j's connection ends with the JVM
                    pass
            return
        self.seen.add(name)
        self.on_signal(name)

    class Java:
        implements = ["sun.misc.SignalHandler"]


def forward_jvm_signals(
    spark: SparkSession, on_signal: Callable[[str], None], signals: Iterable[str] = ("TERM", "INT")
) -> None:
    """Have the driver's JVM pass ``signals`` to ``on_signal`` instead of shutting down (see _JvmSignalHandler).

    A signal the JVM was started ignoring (PySpark starts its gateway JVM ignoring SIGINT) stays ignored.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    sc = spark.sparkContext
    ensure_callback_server_started(sc._gateway)
    handler = _JvmSignalHandler(on_signal)
    assert sc._jvm is not None  # a running session has its JVM
    jvm_signal = sc._jvm.sun.misc.Signal
    for name in signals:
        handler.previous[name] = jvm_signal.handle(jvm_signal(name), handler)
