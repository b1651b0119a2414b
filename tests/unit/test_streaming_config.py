from __future__ import annotations

from pathlib import Path

import pytest

from streaming import session
from streaming.config import (
    CONNECTOR_DIR,
    CONSUMER_OPTIONS,
    OPTIONS,
    ConfigError,
    StreamingConfig,
    connector_jars,
    load_config,
    parse_overrides,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_file_sets_only_known_keys_and_its_defaults_match_the_code(tmp_path):
    cfg = load_config(REPO / "conf" / "streaming.properties", base_dir=tmp_path)
    default = StreamingConfig()
    for opt in OPTIONS:
        if opt.attr != "checkpoint_dir":
            assert getattr(cfg, opt.attr) == getattr(default, opt.attr), opt.key
    assert cfg.checkpoint_dir == (tmp_path / "run/streaming/checkpoint").resolve()
    text = (REPO / "conf" / "streaming.properties").read_text()
    for opt in OPTIONS:
        assert f"{opt.key}=" in text, f"{opt.key} is not documented in conf/streaming.properties"


def test_overrides_win_and_spark_keys_pass_through(tmp_path):
    cfg = load_config(
        None,
        parse_overrides(["monitor.watermarkDelayMillis=50000", "spark.master=local[2]", "redis.url="]),
        base_dir=tmp_path,
    )
    assert cfg.watermark_delay_millis == 50000
    assert cfg.spark["spark.master"] == "local[2]"
    assert cfg.spark["spark.sql.session.timeZone"] == "UTC"  # defaults kept
    assert cfg.redis_url == ""
    assert not cfg.order_message_enable  # as on a node
    assert load_config(None, {"routes.orderMessageEnable": "true"}, base_dir=tmp_path).order_message_enable
    assert cfg.source_options()["subscribe"] == "namesrv-events"


@pytest.mark.parametrize(
    "item, message",
    [
        ("monitor.watermarkDelayMillis=soon", "monitor.watermarkDelayMillis='soon' is not a valid milliseconds"),
        ("monitor.watermarkDelay=5", "unknown key 'monitor.watermarkDelay'"),
        ("kafka.format=parquet", "kafka.format='parquet'"),
        # the Python source is gone, and its option with it
        ("kafka.format=namesrv-kafka", "kafka.format='namesrv-kafka' is not a valid one of kafka"),
        ("kafka.endOffsets=highwater", "unknown key 'kafka.endOffsets'"),
        ("alerts.flapThreshold=0", "alerts.flapThreshold='0'"),
        ("monitor.removeOnChannelClose=yes", "monitor.removeOnChannelClose='yes' is not a valid boolean (true or"),
        ("kafka.bootstrap=h:1,h:x", "kafka.bootstrap='h:1,h:x' is not a valid host:port"),
        ("kafka.bootstrap= , ", "kafka.bootstrap=' , '"),
        ("monitor.triggerIntervalMillis=1_000", "monitor.triggerIntervalMillis='1_000'"),
    ],
)
def test_a_bad_key_or_value_stops_start_up_naming_it(item, message, tmp_path):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config(None, parse_overrides([item]), base_dir=tmp_path)


@pytest.mark.parametrize(
    "items, keys",
    [
        # a node 10 s behind would see its on-time heartbeats dropped as late
        (
            ["monitor.watermarkDelayMillis=15000"],
            "monitor.watermarkDelayMillis=15000 must be at least 2 x "
            "monitor.maxClockSkewMillis + monitor.triggerIntervalMillis",
        ),
        (
            ["monitor.heartbeatTimeoutMillis=20000"],
            "monitor.heartbeatTimeoutMillis=20000 must exceed 2 x " "monitor.maxClockSkewMillis",
        ),
        (["alerts.nodeSilentMillis=500", "monitor.triggerIntervalMillis=1000"], "alerts.nodeSilentMillis=500"),
    ],
)
def test_settings_that_cannot_work_together_stop_start_up_naming_the_keys(items, keys, tmp_path):
    with pytest.raises(ConfigError, match=keys.replace("+", r"\+")):
        load_config(None, parse_overrides(items), base_dir=tmp_path)
    # the same delay works with a tighter skew
    if items[0].startswith("monitor.watermarkDelayMillis"):
        load_config(None, parse_overrides([*items, "monitor.maxClockSkewMillis=2000"]), base_dir=tmp_path)


def test_override_syntax():
    with pytest.raises(ConfigError, match="key=value"):
        parse_overrides(["novalue"])


def test_the_connector_s_jars_are_those_make_setup_resolved_unless_spark_jars_names_others(tmp_path):
    (tmp_path / "b.jar").touch()
    (tmp_path / "a.jar").touch()
    (tmp_path / "notes.txt").touch()
    assert connector_jars(tmp_path) == f"{tmp_path / 'a.jar'},{tmp_path / 'b.jar'}"
    with pytest.raises(
        ConfigError, match=r"kafka.format=kafka needs Spark's Kafka connector, and .* has no jars: run `make setup`"
    ):
        connector_jars(tmp_path / "nothing-here")
    # the driver's JVM starts with them: by default the tree's build/jvm/spark-kafka, else the operator's spark.jars
    assert CONNECTOR_DIR == REPO / "build" / "jvm" / "spark-kafka"
    shipped = load_config(REPO / "conf" / "streaming.properties", base_dir=tmp_path)
    c1_only = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}  # the driver's JVM starts faster
    if any(CONNECTOR_DIR.glob("*.jar")):
        assert session.launch_settings(shipped) == {"spark.jars": connector_jars(), **c1_only}
    given = load_config(None, {"spark.jars": "/opt/jars/*.jar"}, base_dir=tmp_path)
    assert session.launch_settings(given) == {"spark.jars": "/opt/jars/*.jar", **c1_only}
    own = load_config(None, {"spark.jars": "/opt/a.jar", "spark.driver.extraJavaOptions": "-Xss4m"}, base_dir=tmp_path)
    assert session.launch_settings(own) == {"spark.jars": "/opt/a.jar", "spark.driver.extraJavaOptions": "-Xss4m"}


def test_the_source_reads_with_spark_s_connector_and_its_consumers_tuned(tmp_path):
    options = load_config(None, {"kafka.maxOffsetsPerTrigger": "500"}, base_dir=tmp_path).source_options()
    assert options == {
        "kafka.bootstrap.servers": "127.0.0.1:19092", "subscribe": "namesrv-events", "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "500", "failOnDataLoss": "false", **CONSUMER_OPTIONS,
    }  # fmt: skip
    # a fetch the broker may hold for records to arrive would hold the next batch's task
    assert int(CONSUMER_OPTIONS["kafka.fetch.max.wait.ms"]) <= 10
