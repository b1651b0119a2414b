"""The shared machinery of the option tables (common.options) and of Kafka clients (common.kafka_clients)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common import kafka_clients, options
from common.options import ConfigError


@pytest.mark.parametrize("raw, value", [("true", True), (" FALSE ", False), ("True", True), ("fAlSe", False)])
def test_one_boolean_syntax_true_or_false_in_any_case(raw, value):
    assert options.parse_bool(raw) is value


@pytest.mark.parametrize("raw", ["yes", "no", "1", "0", "on", "", "truth"])
def test_anything_else_is_not_a_boolean_and_the_message_says_what_is(raw):
    with pytest.raises(ConfigError) as err:
        options.convert("some config", "a.flag", raw, options.BOOLEAN)
    assert str(err.value) == f"some config: a.flag={raw!r} is not a valid boolean (true or false, any case)"


def test_integers_follow_java_syntax_and_bounds():
    port = options.port()
    assert port(" 9876 ") == 9876 and port("+80") == 80
    for bad in ("1_000", "0x50", "80.0", "0", "65536", "8 0", ""):
        with pytest.raises(ValueError):
            port(bad)
    assert options.integer(0)("0") == 0
    with pytest.raises(ConfigError, match=r"k='-1' is not a valid integer \(0\.\.9223372036854775807\)"):
        options.convert("src", "k", "-1", options.integer(0))


def test_choices_fold_and_name_every_choice():
    level = options.choice("DEBUG", "INFO", fold=str.upper)
    assert level(" info ") == "INFO"
    with pytest.raises(ConfigError, match="level='LOUD' is not a valid one of DEBUG, INFO"):
        options.convert("src", "level", "LOUD", level)


def test_bootstrap_lists_are_stripped_empties_dropped_and_refused_naming_the_key():
    assert kafka_clients.bootstrap_list(" a:1, ,b:2,", "k") == ["a:1", "b:2"]
    assert kafka_clients.bootstrap_list(["a:1 ", ""], "k") == ["a:1"]
    assert kafka_clients.bootstrap_list("localhost", "k") == ["localhost"]
    assert kafka_clients.BOOTSTRAP(" a:1 ,b:2 ") == "a:1,b:2"
    with pytest.raises(ConfigError, match="kafka.bootstrap=' , ' is not a valid .* names no server"):
        kafka_clients.bootstrap_list(" , ", "kafka.bootstrap")
    with pytest.raises(ConfigError, match="k='a:1,b:x' is not a valid .*: bad entry 'b:x'"):
        kafka_clients.bootstrap_list("a:1,b:x", "k")


def test_pinned_clients_get_the_one_api_version_and_timeouts_without_a_broker():
    # nothing listens on port 1: a pinned client is built without asking a broker anything
    producer = kafka_clients.producer(" 127.0.0.1:1 ,", pinned=True, timeout_ms=1234, max_block_ms=100)
    try:
        assert producer.config["api_version"] == kafka_clients.API_VERSION
        assert producer.config["bootstrap_servers"] == ["127.0.0.1:1"]
        assert producer.config["request_timeout_ms"] == 1234
    finally:
        producer.close(0)
    consumer = kafka_clients.consumer("127.0.0.1:1", pinned=True, timeout_ms=2000, fetch_max_wait_ms=10)
    try:
        assert consumer.config["api_version"] == kafka_clients.API_VERSION
        assert consumer.config["group_id"] is None and consumer.config["enable_auto_commit"] is False
        assert consumer.config["request_timeout_ms"] == 2000 and consumer.config["fetch_max_wait_ms"] == 10
    finally:
        consumer.close()


def test_the_shared_modules_import_only_the_standard_library():
    """The Kafka source imports them inside Spark's Python workers, and a node without Kafka never loads it."""
    code = (
        "import sys, common.kafka_clients, common.options\n"
        "heavy = {'kafka', 'pyspark', 'javaproperties', 'orjson', 'redis'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
