"""KV config store: file format, persistence on every change, crash safety, .bak fallback."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from namesrv import fileio
from namesrv.config import ConfigError
from namesrv.kvconfig import KVConfigManager
from tests.support.node import VECTORS

# spec §3.9 / vectors.json "kvConfig.json" (fastjson output)
VECTOR = b'{"configTable":{"ORDER_TOPIC_CONFIG":{"TopicOrder":"broker-a:4"}}}'
# fastjson's pretty form: tabs and newlines
PRETTY = b'{\n\t"configTable":{\n\t\t"ORDER_TOPIC_CONFIG":{\n\t\t\t"TopicOrder":"broker-a:4"\n\t\t}\n\t}\n}'


def loaded(path: Path) -> KVConfigManager:
    kv = KVConfigManager(path)
    kv.load()
    return kv


def test_embedded_vector_matches_the_spec_vector() -> None:
    bodies = json.loads((VECTORS / "vectors.json").read_text())["json_bodies"]
    assert bodies["kvConfig.json"].encode() == VECTOR


def test_vector_round_trips_byte_identical(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_bytes(VECTOR)
    kv = loaded(path)
    assert kv.get("ORDER_TOPIC_CONFIG", "TopicOrder") == "broker-a:4"
    kv.put("ORDER_TOPIC_CONFIG", "TopicOrder", "other")
    kv.put("ORDER_TOPIC_CONFIG", "TopicOrder", "broker-a:4")  # rewrites the file
    assert path.read_bytes() == VECTOR


def test_put_into_empty_store_writes_fastjson_bytes_and_creates_parents(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "kvConfig.json"
    kv = loaded(path)
    assert kv.snapshot() == {}
    kv.put("ORDER_TOPIC_CONFIG", "TopicOrder", "broker-a:4")
    assert path.read_bytes() == VECTOR


def test_pretty_form_and_raw_utf8_load(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_bytes(PRETTY)
    assert loaded(path).snapshot() == {"ORDER_TOPIC_CONFIG": {"TopicOrder": "broker-a:4"}}

    path.write_bytes('{\n  "configTable" : {\n    "名前" : { "clé" : "värde ✓" }\n  }\n}\n'.encode())
    kv = loaded(path)
    assert kv.get("名前", "clé") == "värde ✓"
    kv.put("名前", "x", "y")
    # written back as raw UTF-8, as fastjson does, not as \u escapes
    assert "värde ✓".encode() in path.read_bytes()


def test_every_mutation_is_on_disk_before_returning(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    kv = loaded(path)
    kv.put("ns", "a", "1")
    kv.put("ns", "b", "2")
    assert loaded(path).get_namespace("ns") == {"a": "1", "b": "2"}
    kv.delete("ns", "a")
    assert loaded(path).get_namespace("ns") == {"b": "2"}


def test_delete_keeps_the_empty_namespace(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    kv = loaded(path)
    kv.put("ns", "k", "v")
    kv.delete("ns", "k")
    assert kv.get_namespace("ns") == {}
    assert kv.get("ns", "k") is None
    assert path.read_bytes() == b'{"configTable":{"ns":{}}}'
    kv.delete("unknown", "k")  # no error, namespace not created
    assert kv.get_namespace("unknown") is None


def test_null_value_is_kept_in_memory_but_not_written(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    kv = loaded(path)
    kv.put("ns", "gone", None)
    kv.put("ns", "kept", "v")
    assert kv.get("ns", "gone") is None
    assert kv.get_namespace("ns") == {"kept": "v"}
    assert path.read_bytes() == b'{"configTable":{"ns":{"kept":"v"}}}'

    only_null = KVConfigManager(tmp_path / "other.json")
    only_null.put("fresh", "k", None)
    assert only_null.get_namespace("fresh") == {}  # the namespace exists


def test_version_grows_only_on_change(tmp_path: Path) -> None:
    kv = loaded(tmp_path / "kvConfig.json")
    v0 = kv.version
    kv.put("ns", "k", "v")
    v1 = kv.version
    kv.put("ns", "k", "v")
    kv.delete("ns", "missing")
    assert v1 > v0 and kv.version == v1
    kv.put("ns", "k", "w")
    v2 = kv.version
    kv.delete("ns", "k")
    assert kv.version > v2 > v1


def test_crash_between_tmp_write_and_rename_keeps_the_original(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_bytes(VECTOR)
    kv = loaded(path)

    def crash(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", crash)
    with pytest.raises(OSError):
        kv.put("ORDER_TOPIC_CONFIG", "TopicOrder", "broker-b:8")
    assert path.read_bytes() == VECTOR
    assert fileio.temp_path(path).exists()  # the new content got as far as the staging file
    # memory was rolled back to what the disk says
    assert kv.get("ORDER_TOPIC_CONFIG", "TopicOrder") == "broker-a:4"
    with pytest.raises(OSError):
        kv.put("NEW_NS", "k", "v")
    assert kv.get_namespace("NEW_NS") is None

    monkeypatch.undo()
    kv.put("ORDER_TOPIC_CONFIG", "TopicOrder", "broker-b:8")  # a stale .tmp does not get in the way
    assert loaded(path).get("ORDER_TOPIC_CONFIG", "TopicOrder") == "broker-b:8"
    assert fileio.backup_path(path).read_bytes() == VECTOR


def test_corrupt_file_falls_back_to_bak_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_bytes(b'{"configTable":{"ORDER_TOPIC_CON')  # torn write
    fileio.backup_path(path).write_bytes(VECTOR)
    with caplog.at_level(logging.WARNING, logger="namesrv.kvconfig"):
        kv = loaded(path)
    assert kv.get("ORDER_TOPIC_CONFIG", "TopicOrder") == "broker-a:4"
    assert any(".bak" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_empty_file_left_by_a_java_crash_falls_back_to_bak(tmp_path: Path) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_bytes(b"")
    fileio.backup_path(path).write_bytes(VECTOR)
    assert loaded(path).get("ORDER_TOPIC_CONFIG", "TopicOrder") == "broker-a:4"
    fileio.backup_path(path).unlink()
    assert loaded(path).snapshot() == {}


@pytest.mark.parametrize(
    "content",
    [b"not json", b'["configTable"]', b'{"configTable":{"ns":"flat"}}', b'{"configTable":{"ns":{"k":1}}}'],
)
def test_corrupt_file_without_usable_bak_names_the_file_and_the_way_out(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "kvConfig.json"
    path.write_bytes(content)
    fileio.backup_path(path).write_bytes(b"{also broken")
    with pytest.raises(ConfigError) as err:
        loaded(path)
    message = str(err.value)
    assert str(path) in message and "move it away" in message


def test_missing_file_is_an_empty_store(tmp_path: Path) -> None:
    kv = loaded(tmp_path / "nothing" / "kvConfig.json")
    assert kv.snapshot() == {} and kv.get("a", "b") is None and kv.get_namespace("a") is None


def test_snapshot_and_namespace_are_copies(tmp_path: Path) -> None:
    kv = loaded(tmp_path / "kvConfig.json")
    kv.put("ns", "k", "v")
    kv.snapshot()["ns"]["k"] = "changed"
    kv.get_namespace("ns")["k"] = "changed"  # type: ignore[index]
    assert kv.get("ns", "k") == "v"


# --- nothing a request does can leave the store stuck --------------------------------------------


def test_a_write_failing_in_any_way_changes_nothing_and_later_writes_work(tmp_path: Path, monkeypatch) -> None:
    from namesrv import kvconfig

    path = tmp_path / "kvConfig.json"
    kv = loaded(path)
    kv.put("ns", "k", "v")
    real = kvconfig.write_atomically

    def broken(target: Path, data: bytes) -> None:
        raise RuntimeError("not an OSError")

    monkeypatch.setattr(kvconfig, "write_atomically", broken)
    with pytest.raises(RuntimeError):
        kv.put("ns", "k", "changed")
    with pytest.raises(RuntimeError):
        kv.put("other", "k", "v")
    assert kv.snapshot() == {"ns": {"k": "v"}}
    monkeypatch.setattr(kvconfig, "write_atomically", real)
    kv.put("other", "k", "v")
    assert loaded(path).snapshot() == {"ns": {"k": "v"}, "other": {"k": "v"}}


@pytest.mark.parametrize(
    "namespace, key, value",
    [("ns", "k", "\ud800"), ("\udc00", "k", "v"), ("ns", "k" * 1025, "v"), ("ns", "k", "v" * (64 * 1024 + 1))],
)
def test_an_entry_that_cannot_be_stored_is_refused_before_anything_changes(tmp_path, namespace, key, value) -> None:
    from namesrv.kvconfig import KVRefused

    kv = loaded(tmp_path / "kvConfig.json")
    assert kv.refusal(namespace, key, value) is not None
    with pytest.raises(KVRefused):
        kv.put(namespace, key, value)
    assert kv.snapshot() == {} and kv.version == 1
    kv.put("ns", "k", "v\x00 control characters are fine, as in Java")
    assert loaded(tmp_path / "kvConfig.json").get("ns", "k").startswith("v\x00")


def test_the_whole_table_is_bounded(tmp_path: Path, monkeypatch) -> None:
    from namesrv import kvconfig
    from namesrv.kvconfig import MAX_VALUE_CHARS, KVRefused

    # a bound of eight values is reached as the real one of 128 is, without rewriting megabytes per put
    bound = 8 * MAX_VALUE_CHARS
    monkeypatch.setattr(kvconfig, "MAX_TABLE_CHARS", bound)
    kv = loaded(tmp_path / "kvConfig.json")
    n = 0
    with pytest.raises(KVRefused) as refused:
        while n < bound // MAX_VALUE_CHARS + 2:
            kv.put("ns", f"k{n}", "v" * MAX_VALUE_CHARS)
            n += 1
    assert f"past the limit of {bound}: delete entries first" in str(refused.value)
    assert n == bound // (MAX_VALUE_CHARS + 3)  # the one that did not fit changed nothing
    kv.put("ns", "k0", "small")  # replacing an entry with a smaller one always fits
    kv.delete("ns", "k1")
    kv.put("ns", "new", "v" * 1000)


def test_concurrent_changes_share_writes(tmp_path: Path, monkeypatch) -> None:
    from concurrent.futures import wait

    from namesrv import kvconfig

    writes = []
    real = kvconfig.write_atomically
    monkeypatch.setattr(kvconfig, "write_atomically", lambda p, d: (writes.append(d), real(p, d)))
    kv = loaded(tmp_path / "kvConfig.json")
    futures = [kv.submit_put("ns", f"k{i}", str(i)) for i in range(200)]
    wait(futures, timeout=30)
    assert all(f.result() is None for f in futures)
    assert loaded(tmp_path / "kvConfig.json").get_namespace("ns") == {f"k{i}": str(i) for i in range(200)}
    assert len(writes) < 200  # group commit: one write covers every change queued meanwhile
    kv.close()
