"""Scale-out without a cluster at hand: the job's Python on any master, its JVM's signals, Redis Cluster URLs and keys.

The clusters themselves are in tests/integration/test_spark_cluster.py and test_redis_cluster.py.
"""

from __future__ import annotations

import select
import socket
from pathlib import Path

import pytest
import redis

from common import redis_clients
from common.options import ConfigError
from common.redis_keys import RedisKeys
from streaming import session
from streaming.config import load_config

# --------------------------------------------------------------------------- the job's Python


def test_every_python_of_the_job_is_this_interpreter_unless_the_settings_say_otherwise():
    python, conf = session.python_settings({}, {}, executable="/venv/bin/python", root=Path("/src"), installed=False)
    assert python == "/venv/bin/python"
    assert conf == {
        "spark.pyspark.python": "/venv/bin/python",
        "spark.pyspark.driver.python": "/venv/bin/python",
        "spark.python.daemon.module": "streaming.spark_daemon",
        # run from a source tree: the executors import the tree
        "spark.executorEnv.PYTHONPATH": "/src",
    }


def test_an_installed_project_adds_no_pythonpath_and_given_settings_win():
    python, conf = session.python_settings(
        {"spark.pyspark.python": "/opt/py", "spark.executorEnv.PYTHONPATH": "/x", "spark.python.daemon.module": "d"},
        {"PYSPARK_PYTHON": "/env/py"},
        executable="/venv/bin/python",
        root=Path("/src"),
        installed=True,
    )
    assert python == "/opt/py"  # spark.pyspark.python outranks $PYSPARK_PYTHON, as in Spark
    assert conf == {"spark.pyspark.driver.python": "/venv/bin/python"}  # nothing given is overridden
    python, _ = session.python_settings(
        {}, {"PYSPARK_PYTHON": "/env/py"}, executable="/v", root=Path("/s"), installed=True
    )
    assert python == "/env/py"


def test_the_project_root_is_where_the_packages_are():
    assert (session._PROJECT_ROOT / "streaming" / "job.py").is_file()
    assert (session._PROJECT_ROOT / "namesrv").is_dir()


# --------------------------------------------------------------------------- the JVM's signals


class _Sig:
    def __init__(self, name: str) -> None:
        self.name = name

    def getName(self) -> str:
        return self.name


class _JavaHandler:
    def __init__(self, cls: str) -> None:
        self.cls, self.handled = cls, []

    def getClass(self):
        return self

    def getName(self) -> str:
        return self.cls

    def handle(self, sig) -> None:
        self.handled.append(sig.getName())


def test_the_first_signal_to_the_jvm_goes_to_the_driver_a_second_to_the_jvm():
    told: list[str] = []
    handler = session._JvmSignalHandler(told.append)
    term = handler.previous["TERM"] = _JavaHandler("java.lang.Terminator$1")
    native = handler.previous["INT"] = _JavaHandler("sun.misc.NativeSignalHandler")  # SIG_DFL, SIG_IGN

    handler.handle(_Sig("TERM"))
    assert told == ["TERM"] and term.handled == []  # the JVM does not shut down under the query
    handler.handle(_Sig("TERM"))
    assert told == ["TERM"] and term.handled == ["TERM"]  # the second one is the JVM's own: exit 143
    handler.handle(_Sig("INT"))
    handler.handle(_Sig("INT"))  # a native default cannot be called from Java: nothing more happens
    assert told == ["TERM", "INT"] and native.handled == []
    assert handler.Java.implements == ["sun.misc.SignalHandler"]


# --------------------------------------------------------------------------- Redis Cluster


def test_a_cluster_is_chosen_by_the_url_scheme():
    assert redis_clients.is_cluster("redis+cluster://h:7000")
    assert redis_clients.is_cluster(" REDISS+CLUSTER://u:p@h:7000/0")
    assert not redis_clients.is_cluster("redis://h:6379/0")
    assert not redis_clients.is_cluster("unix:///tmp/redis.sock")
    assert redis_clients._cluster_url("redis+cluster://u:p@h:7000/0") == "redis://u:p@h:7000"
    assert redis_clients._cluster_url("rediss+cluster://h:7000") == "rediss://h:7000"


def test_a_cluster_url_may_name_several_nodes_and_each_seeds_the_client():
    # a client made while the one node a URL named is down (a master that failed over) would find no cluster
    url = "redis+cluster://u:secret@h1:7000, h2:7001,[::1]:7002/0"
    assert redis_clients.check_url(url) == url
    assert redis_clients._cluster_seeds(url) == [("h1", 7000), ("h2", 7001), ("::1", 7002)]
    assert redis_clients._cluster_url(url) == "redis://u:secret@h1:7000"
    assert redis_clients.redact_url(url) == "redis+cluster://u:***@h1:7000, h2:7001,[::1]:7002/0"
    assert redis_clients._cluster_seeds("rediss+cluster://h1,h2:7001") == [("h1", 6379), ("h2", 7001)]
    assert redis_clients._cluster_url("redis+cluster://[::1]:7002,h2:7001") == "redis://[::1]:7002"
    client = redis_clients.connect(url)
    assert client._seeds == [("h1", 7000), ("h2", 7001), ("::1", 7002)]  # type: ignore[attr-defined]
    client.close()


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://h:7000/2", "redis+cluster:///0", "redis+cluster://h:7000,h2:x/0", "redis+cluster://h:7000,/0"],
)
def test_a_cluster_url_that_cannot_work_is_refused_without_echoing_credentials(url):
    with pytest.raises(ValueError) as raised:
        redis_clients.check_url(url.replace("//", "//user:secret@", 1))
    assert "secret" not in str(raised.value)


def _connected_to(listener: socket.socket) -> bool:
    """True when a connection to ``listener`` was made (it waits to be accepted); poll, not select, which
    refuses a descriptor above 1023 (the whole suite in one process has many open)."""
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    return bool(poller.poll(0))


def test_a_cluster_client_connects_at_its_first_command_not_when_made():
    with socket.create_server(("127.0.0.1", 0)) as listener:  # listens, never answers: no Redis
        url = f"redis+cluster://127.0.0.1:{listener.getsockname()[1]}"
        redis_clients.connect(url, timeout_s=0.2, retries=False).close()
        assert not _connected_to(listener)  # made and closed: nothing was connected
        client = redis_clients.connect(url, timeout_s=0.2, retries=False)
        assert not _connected_to(listener)
        with pytest.raises(redis.exceptions.ConnectionError, match="Redis Cluster"):
            client.ping()  # no answer: an outage, as for a single Redis
        assert _connected_to(listener)  # the first command connected


def test_single_redis_keys_are_unchanged_and_cluster_keys_share_one_hash_tag():
    plain, tagged = RedisKeys("east"), RedisKeys("east", hash_tag=True)
    assert (plain.route("T"), plain.meta, plain.channel) == ("east:route:T", "east:meta", "east:routes:changed")
    assert (tagged.route("T"), tagged.meta, tagged.model_brokers, tagged.route_pattern, tagged.channel) == (
        "{east}:route:T", "{east}:meta", "{east}:model:brokers", "{east}:route:*", "{east}:routes:changed",
    )  # fmt: skip
    for bad in ("a{b", "a}b", ""):
        with pytest.raises(ValueError, match="hash tag"):
            RedisKeys(bad, hash_tag=True)
    RedisKeys("a{b")  # a single Redis has no slots: any prefix works as before


def test_the_job_refuses_a_cluster_url_or_prefix_that_cannot_work_at_start_up():
    assert load_config(None, {"redis.url": "redis+cluster://h:7000", "redis.keyPrefix": "east"}).redis_url
    with pytest.raises(ConfigError, match="redis.keyPrefix"):
        load_config(None, {"redis.url": "redis+cluster://h:7000", "redis.keyPrefix": "a{b}"})
    with pytest.raises(ConfigError, match="database 0 only"):
        load_config(None, {"redis.url": "redis+cluster://h:7000/1"})


def test_every_key_of_a_cluster_prefix_carries_its_hash_tag():
    # one slot for everything a batch writes, or its MULTI/EXEC is refused (CROSSSLOT)
    from common.redis_keys import RedisKeys

    keys = RedisKeys("namesrv", hash_tag=True)
    names = [n for n in dir(RedisKeys) if isinstance(getattr(RedisKeys, n), property) and n != "base"]
    assert len(names) >= 10
    for name in names:
        assert getattr(keys, name).startswith("{namesrv}:"), name
    assert keys.route("T").startswith("{namesrv}:")
