"""Typed config: .properties parsing, start-up strictness, UPDATE/GET_NAMESRV_CONFIG semantics."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from common.properties import parse_properties
from common.protocol.codes import ResponseCode
from namesrv import fileio
from namesrv.config import (
    HARD_BLACKLIST,
    OPTIONS,
    OPTIONS_BY_KEY,
    Blacklisted,
    ConfigError,
    NamesrvConfig,
    PersistFailed,
    Unparsable,
    Updated,
    apply_update,
    load_config,
    options_markdown,
    render_properties,
)

REPO = Path(__file__).resolve().parents[2]


def cfg_in(tmp_path: Path, text: str = "") -> NamesrvConfig:
    path = tmp_path / "namesrv.properties"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


# --- .properties syntax (java.util.Properties.load) ------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=b\nc:d\ne f\ng\th\n", {"a": "b", "c": "d", "e": "f", "g": "h"}),
        ("# hash comment\n! bang comment\n   # indented comment\nk=v\n", {"k": "v"}),
        ("   key   =   value  \n", {"key": "value  "}),  # leading blanks of the value go, trailing stay
        ("k=first \\\n      second\n", {"k": "first second"}),  # continuation eats the next indent
        ("k=ends\\\\\nnext=1\n", {"k": "ends\\", "next": "1"}),  # an escaped backslash does not continue
        ("k=v\\\n# not a comment\n", {"k": "v# not a comment"}),
        ("k=\\u0041\\u00e9\\t|\n", {"k": "Aé\t|"}),
        ("a\\=b=c\na\\ b c\n", {"a=b": "c", "a b": "c"}),
        ("key\n=value\n", {"key": "", "": "value"}),
        ("a=1\r\nb=2\rc=3", {"a": "1", "b": "2", "c": "3"}),
        ("dup=1\ndup=2\n", {"dup": "2"}),
        ("a=b # not a comment\n", {"a": "b # not a comment"}),
    ],
)
def test_properties_syntax_follows_java(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected


def test_malformed_unicode_escape_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse_properties("k=\\u12zz\n")


# --- start-up -------------------------------------------------------------------------------


def test_defaults_without_a_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("ROCKETMQ_HOME", raising=False)
    cfg = load_config(None)
    assert cfg.listen_port == 9876
    assert cfg.server_channel_max_idle_time_seconds == 120
    assert cfg.scan_not_active_broker_interval == 5000
    assert cfg.kv_config_path == str(tmp_path / "namesrv" / "kvConfig.json")
    assert cfg.config_store_path == str(tmp_path / "namesrv" / "namesrv.properties")
    assert cfg.rocketmq_home == str(tmp_path)  # no abort when ROCKETMQ_HOME is unset
    assert cfg.response_serialize_type == "JSON" and cfg.log_level == "WARNING"
    assert cfg.kafka_bootstrap_servers == "" and cfg.redis_url == "" and not cfg.warm_start_from_redis
    monkeypatch.setenv("ROCKETMQ_HOME", "/opt/rocketmq")
    assert load_config(None).rocketmq_home == "/opt/rocketmq"


def test_file_values_are_typed_and_configstorepath_becomes_the_file(tmp_path: Path) -> None:
    cfg = cfg_in(
        tmp_path,
        "listenPort=19876\norderMessageEnable=TRUE\nscanNotActiveBrokerInterval=10000 \n"
        "bindAddress=  127.0.0.1  \nresponseSerializeType=echo\nrocketmq.client.x=1\n",
    )
    assert cfg.listen_port == 19876
    assert cfg.order_message_enable is True
    assert cfg.scan_not_active_broker_interval == 10000
    assert cfg.bind_address == "127.0.0.1"
    assert cfg.response_serialize_type == "ECHO"
    assert cfg.extras == {"rocketmq.client.x": "1"}
    assert cfg.config_store_path == str(tmp_path / "namesrv.properties")


def test_explicit_configstorepath_in_the_file_wins(tmp_path: Path) -> None:
    cfg = cfg_in(tmp_path, "configStorePath=run/elsewhere.properties\n")
    assert cfg.config_store_path == "run/elsewhere.properties"


def test_overrides_beat_the_file(tmp_path: Path) -> None:
    path = tmp_path / "n.properties"
    path.write_text("listenPort=1\nclusterTest=true\n")
    cfg = load_config(path, {"listenPort": "2"})
    assert cfg.listen_port == 2 and cfg.cluster_test is True


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("listenPort=abc", "int"),
        ("listenPort=70000", "int (0..65535)"),
        ("defaultThreadPoolNums=1_000", "int"),
        ("scanNotActiveBrokerInterval=5s", "long"),
        ("clusterTest=yes", "boolean (true or false, any case)"),
        ("logLevel=LOUD", "one of DEBUG"),
        ("responseSerializeType=XML", "one of JSON, ROCKETMQ, ECHO"),
    ],
)
def test_type_error_at_start_up_names_key_value_and_type(tmp_path: Path, line: str, expected: str) -> None:
    key, value = line.split("=", 1)
    with pytest.raises(ConfigError) as err:
        cfg_in(tmp_path, line + "\n")
    message = str(err.value)
    assert f"{key}={value!r}" in message
    assert expected in message
    assert "namesrv.properties" in message


def test_override_type_error_is_reported_too() -> None:
    with pytest.raises(ConfigError, match="listenPort='x'"):
        load_config(None, {"listenPort": "x"})


def test_missing_file_and_bad_escape_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.properties")
    with pytest.raises(ConfigError, match="not a valid .properties"):
        cfg_in(tmp_path, "k=\\uXYZW\n")


def test_shipped_conf_file_loads_and_listens_on_9876() -> None:
    cfg = load_config(REPO / "conf" / "namesrv.properties")
    assert cfg.listen_port == 9876
    assert cfg.kv_config_path.startswith("run/") and cfg.config_store_path.startswith("run/")
    assert cfg.extras == {}
    # every commented default in the file is the real default
    defaults = NamesrvConfig()
    for line in (REPO / "conf" / "namesrv.properties").read_text().splitlines():
        m = re.fullmatch(r"#([A-Za-z]+)=(.+)", line)
        if m and m.group(1) in OPTIONS_BY_KEY:
            opt = OPTIONS_BY_KEY[m.group(1)]
            assert render_line(defaults, opt.key) == f"{opt.key}={m.group(2)}"


def render_line(cfg: NamesrvConfig, key: str) -> str:
    return next(line for line in render_properties(cfg).splitlines() if line.startswith(key + "="))


# --- the option table ----------------------------------------------------------------------


def test_option_table_is_complete_and_consistent() -> None:
    keys = [o.key for o in OPTIONS]
    assert len(keys) == len(set(keys))
    for opt in OPTIONS:
        # the Python name is the Java key in snake_case (the Kafka client's dotted names: dots as underscores)
        assert re.sub(r"([A-Z])", r"_\1", opt.key).lower().replace(".", "_") == opt.attr
        assert opt.doc and opt.java_type in ("String", "int", "long", "boolean")
    for required in (
        "rocketmqHome",
        "kvConfigPath",
        "configStorePath",
        "productEnvName",
        "clusterTest",
        "orderMessageEnable",
        "returnOrderTopicConfigToBroker",
        "clientRequestThreadPoolNums",
        "clientRequestThreadPoolQueueCapacity",
        "defaultThreadPoolNums",
        "defaultThreadPoolQueueCapacity",
        "scanNotActiveBrokerInterval",
        "unRegisterBrokerQueueCapacity",
        "supportActingMaster",
        "enableAllTopicList",
        "enableTopicList",
        "notifyMinBrokerIdChanged",
        "enableControllerInNamesrv",
        "needWaitForService",
        "waitSecondsForService",
        "deleteTopicWithBrokerRegistration",
        "configBlackList",
        "bindAddress",
        "listenPort",
        "serverWorkerThreads",
        "serverCallbackExecutorThreads",
        "serverSelectorThreads",
        "serverOnewaySemaphoreValue",
        "serverAsyncSemaphoreValue",
        "serverChannelMaxIdleTimeSeconds",
        "serverSocketSndBufSize",
        "serverSocketRcvBufSize",
        "writeBufferHighWaterMark",
        "writeBufferLowWaterMark",
        "serverSocketBacklog",
        "serverNettyWorkerGroupEnable",
        "serverPooledByteBufAllocatorEnable",
        "enableShutdownGracefully",
        "shutdownWaitTimeSeconds",
        "useEpollNativeSelector",
        "responseSerializeType",
        "logLevel",
        "kafkaBootstrapServers",
        "eventsTopic",
        "actionsTopic",
        "monitorSilenceFallbackMillis",
        "nodeName",
        "tickIntervalMillis",
        "redisUrl",
        "redisKeyPrefix",
        "warmStartFromRedis",
    ):
        assert required in OPTIONS_BY_KEY, required
    table = options_markdown()
    assert all(f"`{k}`" in table for k in keys)


def test_options_marked_without_effect_are_exactly_those_nothing_reads() -> None:
    """``effect=False`` must stay true to the code: a key someone starts reading, or one nobody reads, fails here."""
    # the node's code, and the route tables it runs (their settings come from the node's options)
    files = sorted([*(REPO / "namesrv").rglob("*.py"), *(REPO / "common" / "routes").rglob("*.py")])
    sources = "\n".join(p.read_text() for p in files if p.name != "config.py")
    names = set(re.findall(r"\w+", sources))  # one pass, instead of a regex search of it all per option
    # kv_config_file, config_blacklist, acl_file_path
    read_in_config_py = {"kvConfigPath", "configStorePath", "configBlackList", "aclFile", "rocketmqHome"}
    read_in_config_py |= {o.key for o in OPTIONS if o.key.startswith("kafka.")}  # kafka_security
    read_in_config_py |= {"alerts.alertmanagerUrl", "alerts.webhookUrl"}  # alert_receivers
    for opt in OPTIONS:
        read = opt.key in read_in_config_py or opt.attr in names
        assert read == opt.effect, f"{opt.key}: read={read}, marked effect={opt.effect}"
    table = options_markdown()
    for opt in OPTIONS:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{opt.key}` |"))
        assert ("accepted, no effect" in row) == (not opt.effect), row
    # the four a user would rely on work (tests/conformance/test_wire.py); graceful shutdown does not
    assert {
        "serverSocketSndBufSize",
        "serverSocketRcvBufSize",
        "writeBufferHighWaterMark",
        "writeBufferLowWaterMark",
    } <= {o.key for o in OPTIONS if o.effect}
    assert not OPTIONS_BY_KEY["enableShutdownGracefully"].effect


def test_get_namesrv_config_answers_keys_without_effect_as_java_does() -> None:
    """The wire answer is key=value for every key, with no annotation: tools compare it with Java's."""
    cfg = NamesrvConfig(rocketmq_home="/rmq", kv_config_path="/kv.json", config_store_path="/ns.properties")
    assert render_line(cfg, "serverWorkerThreads") == "serverWorkerThreads=8"
    assert render_line(cfg, "enableShutdownGracefully") == "enableShutdownGracefully=false"
    assert "effect" not in render_properties(cfg)


def test_write_buffer_low_water_mark_above_the_high_one_stops_start_up() -> None:
    with pytest.raises(ConfigError, match="writeBufferLowWaterMark=9000 must not exceed writeBufferHighWaterMark=8192"):
        load_config(None, {"writeBufferHighWaterMark": "8192", "writeBufferLowWaterMark": "9000"})
    # each alone, or equal, is fine (Java's WriteBufferWaterMark allows low == high)
    load_config(None, {"writeBufferLowWaterMark": "9000"})
    load_config(None, {"writeBufferHighWaterMark": "8192", "writeBufferLowWaterMark": "8192"})


# --- GET_NAMESRV_CONFIG ----------------------------------------------------------------------


def test_render_is_sorted_java_formatted_and_includes_extras(tmp_path: Path) -> None:
    cfg = cfg_in(tmp_path, "zz.extra=last\nAA.extra=first\nclusterTest=true\n")
    body = render_properties(cfg)
    lines = body.splitlines()
    keys = [line.split("=", 1)[0] for line in lines]
    assert keys == sorted(keys)  # ASCII keys: Java's TreeMap order is plain order
    assert keys[0] == "AA.extra" and keys[-1] == "zz.extra"
    assert "clusterTest=true" in lines and "enableAllTopicList=true" in lines
    assert "listenPort=9876" in lines and "kafkaBootstrapServers=" in lines
    assert body.endswith("\n") and len(lines) == len(OPTIONS) + 2


def test_render_reloads_to_the_same_config(tmp_path: Path) -> None:
    cfg = cfg_in(tmp_path, "odd.value=  C:\\\\dir\\nnext  \nweird\\ key=x\nnodeName=ünïcode\n")
    assert cfg.extras["odd.value"] == "C:\\dir\nnext  "
    again = tmp_path / "again.properties"
    again.write_text(render_properties(cfg), encoding="utf-8")
    reloaded = load_config(again)
    assert reloaded.extras == cfg.extras
    assert reloaded.node_name == "ünïcode"
    # plain pairs keep Java's unescaped bytes
    assert "kafkaBootstrapServers=" in render_properties(cfg).splitlines()


# --- UPDATE_NAMESRV_CONFIG -------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(HARD_BLACKLIST))
def test_hard_blacklist_is_refused(tmp_path: Path, key: str) -> None:
    cfg = cfg_in(tmp_path, "configBlackList=\n")  # even with an empty configurable list
    result = apply_update(cfg, f"enableTopicList=false\n{key}=/tmp/x\n")
    assert isinstance(result, Blacklisted) and result.keys == (key,)
    assert result.code == ResponseCode.NO_PERMISSION
    assert result.remark == "Can not update config in black list."
    assert cfg.enable_topic_list is True  # nothing applied


def test_configured_blacklist_is_refused(tmp_path: Path) -> None:
    cfg = cfg_in(tmp_path, "configBlackList=configBlackList;listenPort\n")
    assert isinstance(apply_update(cfg, "listenPort=1\n"), Blacklisted)
    assert cfg.listen_port == 9876
    assert isinstance(apply_update(cfg, "clusterTest=true\n"), Updated)


def test_update_applies_java_semantics_and_persists(tmp_path: Path) -> None:
    cfg = cfg_in(tmp_path, "known.extra=1\n")
    result = apply_update(
        cfg,
        "enableAllTopicList=nope\n"  # parseBoolean: anything but "true" is false
        "listenPort=12x\n"  # bad int: ignored
        "waitSecondsForService=7 \n"  # Java does not trim numbers: ignored
        "productEnvName=  prod  \n"  # strings are trimmed
        "known.extra=2\n"  # existing extra: replaced
        "brand.new=3\n",  # unknown extra: dropped
    )
    assert isinstance(result, Updated) and result.code == ResponseCode.SUCCESS
    assert cfg.enable_all_topic_list is False
    assert cfg.listen_port == 9876 and cfg.wait_seconds_for_service == 45
    assert cfg.product_env_name == "prod"
    assert cfg.extras == {"known.extra": "2"}
    assert set(result.ignored) == {"listenPort", "waitSecondsForService"}
    assert result.dropped == ("brand.new",)
    stored = (tmp_path / "namesrv.properties").read_text()
    assert stored == render_properties(cfg)
    assert (tmp_path / "namesrv.properties.bak").read_text() == "known.extra=1\n"


def test_update_to_a_moved_store_path_creates_it(tmp_path: Path) -> None:
    cfg = cfg_in(tmp_path, f"configStorePath={tmp_path}/run/sub/namesrv.properties\n")
    assert isinstance(apply_update(cfg, "clusterTest=true\n"), Updated)
    assert load_config(tmp_path / "run" / "sub" / "namesrv.properties").cluster_test is True


def test_unparsable_update_changes_nothing(tmp_path: Path) -> None:
    cfg = cfg_in(tmp_path)
    before = dataclasses.asdict(cfg)
    result = apply_update(cfg, "clusterTest=true\nk=\\u00\n")
    assert isinstance(result, Unparsable) and result.code == ResponseCode.SYSTEM_ERROR
    assert dataclasses.asdict(cfg) == before


def test_update_that_cannot_be_persisted_is_rolled_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "namesrv.properties"
    path.write_text("clusterTest=false\n")
    cfg = load_config(path)

    def crash(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", crash)
    result = apply_update(cfg, "clusterTest=true\n")
    assert isinstance(result, PersistFailed) and "No space left" in result.remark
    assert cfg.cluster_test is False
    assert path.read_text() == "clusterTest=false\n"


def test_update_whose_persistence_fails_in_any_way_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from namesrv import config as config_mod

    cfg = cfg_in(tmp_path)
    before = dataclasses.asdict(cfg)

    def broken(target: object, data: bytes) -> None:
        raise RuntimeError("not an OSError")

    monkeypatch.setattr(config_mod, "write_atomically", broken)
    result = apply_update(cfg, "clusterTest=true\n")
    assert isinstance(result, PersistFailed) and "not an OSError" in result.remark
    assert dataclasses.asdict(cfg) == before
    monkeypatch.undo()
    assert isinstance(apply_update(cfg, "clusterTest=true\n"), Updated) and cfg.cluster_test is True


@pytest.mark.parametrize(
    "text",
    [
        "productEnvName=\\ud800\n",
        "productEnvName=a\\u0000b\n",
        "a\\u0007b=1\n",
        "productEnvName=" + "x" * 4097 + "\n",
        "".join(f"k{i}=1\n" for i in range(257)),
        b"x=" + b"y" * 64 * 1024,
    ],
)
def test_update_that_cannot_be_stored_is_refused_before_anything_changes(tmp_path: Path, text) -> None:
    from namesrv.config import UpdateRefused

    cfg = cfg_in(tmp_path)
    before = dataclasses.asdict(cfg)
    result = apply_update(cfg, text)
    assert isinstance(result, UpdateRefused) and result.code == ResponseCode.SYSTEM_ERROR and result.remark
    assert dataclasses.asdict(cfg) == before
    assert render_properties(cfg).encode("utf-8")
