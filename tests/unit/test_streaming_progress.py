"""Batches slower than the trigger: one line when they fall behind, one when they catch up, and Spark's own
per-batch warning kept out of the job's log."""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pyspark

from streaming.progress import CAUGHT_UP_BATCHES, Lateness, progress_logger
from streaming.session import QUIET_SPARK_LOGGERS
from streaming.status import MonitorStatus

T0 = 1_700_000_000_000


def test_a_long_stretch_of_slow_batches_is_one_line_when_it_starts_and_one_when_it_ends():
    lateness = Lateness(trigger_ms=100)
    said = []
    durations = [80, 90] + [1027, 1902, 90, 9432] * 300 + [60] * CAUGHT_UP_BATCHES + [70, 2000]
    for batch, ms in enumerate(durations):
        line = lateness.batch(batch, ms, T0 + batch * 1000)
        if line is not None:
            said.append(line)
    assert said[0] == "batches are falling behind the 100 ms trigger: batch 2 took 1027 ms"
    late, total = 900, 1200 + CAUGHT_UP_BATCHES
    assert said[1] == (
        f"batches keep up with the 100 ms trigger again (batch {1201 + CAUGHT_UP_BATCHES}): for "
        f"{(1201 + CAUGHT_UP_BATCHES - 2):.1f} s, {late} of {total} batches took longer, the slowest 9432 ms"
    )
    assert said[2] == f"batches are falling behind the 100 ms trigger: batch {len(durations) - 1} took 2000 ms"
    assert len(said) == 3


def test_batches_within_the_trigger_say_nothing():
    lateness = Lateness(trigger_ms=100)
    assert [lateness.batch(b, 100, T0) for b in range(50)] == [None] * 50


def test_the_listener_logs_each_episode_once_at_warning(caplog):
    listener = progress_logger(MonitorStatus(), 120_000, 10_000, 100, lambda: "q")
    with caplog.at_level(logging.WARNING, logger="streaming.progress"):
        for batch, ms in enumerate([500, 700] + [50] * CAUGHT_UP_BATCHES):
            progress = SimpleNamespace(
                id="q", batchId=batch, numInputRows=1, inputRowsPerSecond=1.0, processedRowsPerSecond=1.0,
                batchDuration=ms, eventTime={}, observedMetrics={"events": {"events": 1, "bad": 0, "ahead": 0}},
            )  # fmt: skip
            listener.onQueryProgress(SimpleNamespace(progress=progress))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "batches are falling behind the 100 ms trigger",
        f"batches keep up with the 100 ms trigger again (batch {1 + CAUGHT_UP_BATCHES})",
    ]


def test_the_quieted_spark_loggers_are_classes_of_the_pinned_spark():
    # a logger named after a class Spark moved would silence nothing, and no test would notice
    jars = Path(pyspark.__file__).parent / "jars"
    classes = set()
    for jar in jars.glob("spark-sql_*.jar"):
        with zipfile.ZipFile(jar) as z:
            classes.update(n.removesuffix(".class").replace("/", ".") for n in z.namelist() if n.endswith(".class"))
    assert classes, f"no spark-sql jar in {jars}"
    assert [n for n in QUIET_SPARK_LOGGERS if n not in classes] == []
