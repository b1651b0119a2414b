"""namesrv/routes/javaorder.py against Java itself: the key orders of tests/vectors/topic_list_order.json
(``key_orders``, written by the JDK's own ConcurrentHashMap and HashSet, see its TopicListOrder.java)."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from namesrv.routes.javaorder import (
    ConcurrentHashMapKeys,
    JavaOrderDict,
    concurrent_hash_map_table_size,
    hash_set_order,
    hashed,
    java_string_hash,
    key_set_order,
    spread,
)
from tests.support.node import VECTORS

ORDER = json.loads((VECTORS / "topic_list_order.json").read_text())
#: key sets with nine or more names in one HashMap bucket
HASH_SET_TREES = {"32 names with one hash"}


@pytest.mark.parametrize(
    "s, h",
    [
        ("", 0),
        ("a", 97),
        ("Aa", 2112),
        ("BB", 2112),
        ("hello", 99162322),
        ("polygenelubricants", -(2**31)),  # Integer.MIN_VALUE
        ("\U0001f600", 31 * 0xD83D + 0xDE00),  # two UTF-16 code units
        ("主题", 31 * 0x4E3B + 0x9898),
    ],
)
def test_string_hash_code_as_java(s, h):
    assert java_string_hash(s) == h & 0xFFFFFFFF


def test_spread_folds_the_high_half_and_clears_the_sign():
    assert spread(0x80000000) == 0x8000
    assert spread(0xFFFFFFFF) == 0x7FFF0000


def test_constructor_table_sizes_of_route_info_manager():
    assert [concurrent_hash_map_table_size(c) for c in (1024, 128, 32, 256)] == [2048, 256, 64, 512]


def _replayed(steps: list[str], keys: ConcurrentHashMapKeys) -> list[str]:
    for step in steps:
        (keys.put if step[0] == "+" else keys.remove)(step[1:])
    return keys.keys()


@pytest.mark.parametrize("name", list(ORDER["key_sets"]))
def test_key_orders_equal_the_jdks(name):
    steps, java = ORDER["key_sets"][name], ORDER["key_orders"][name]
    assert _replayed(steps, ConcurrentHashMapKeys()) == java["ConcurrentHashMap.newKeySet()"]
    sized = ConcurrentHashMapKeys(concurrent_hash_map_table_size(1024))
    assert _replayed(steps, sized) == java["new ConcurrentHashMap<>(1024)"]
    d: JavaOrderDict[int] = JavaOrderDict()
    for step in steps:
        if step[0] == "+":
            d[step[1:]] = 1
        else:
            del d[step[1:]]
    assert [k for _, k in d.java_order()] == java["new ConcurrentHashMap<>(1024)"]
    if all(step[0] == "+" for step in steps):
        assert key_set_order(hashed(s[1:] for s in steps)) == java["ConcurrentHashMap.newKeySet()"]
        # a HashSet's table holds its largest count, which only additions make the current one; a
        # bucket of nine names becomes a tree, whose order hash_set_order does not follow (its docstring)
        if name not in HASH_SET_TREES:
            assert hash_set_order(s[1:] for s in steps) == java["new HashSet<>()"]


def test_a_key_set_takes_repeats_once():
    assert key_set_order(hashed(["T2", "T1", "T2", "T3", "T1"])) == key_set_order(hashed(["T2", "T1", "T3"]))


def test_every_dict_method_that_adds_or_removes_keys_is_seen():
    d: JavaOrderDict[int] = JavaOrderDict({"a": 1, "b": 2})
    d["c"] = 3
    d["a"] = 4  # a new value only
    d.setdefault("d", 5)
    d.setdefault("a", 6)
    d.update({"e": 7}, f=8)
    d |= {"g": 9}
    del d["b"]
    assert d.pop("c") == 3 and d.pop("nope", None) is None
    key, _ = d.popitem()
    java = ConcurrentHashMapKeys(concurrent_hash_map_table_size(1024))
    for k in ("a", "b", "c", "d", "e", "f", "g"):
        java.put(k)
    for k in ("b", "c", key):
        java.remove(k)
    assert [k for _, k in d.java_order()] == java.keys()
    assert set(d) == set(java.keys()) == {"a", "d", "e", "f", "g"} - {key} and d["a"] == 4
    d.clear()
    assert d.java_order() == [] and not d


def test_a_batch_goes_to_java_in_its_source_order():
    d: JavaOrderDict[int] = JavaOrderDict()
    d["old"] = 0
    d.begin_batch()
    for k in ("x", "y", "z"):
        d[k] = 1
    d.end_batch(lambda: ["z", "old", "x", "y"])
    java = ConcurrentHashMapKeys(concurrent_hash_map_table_size(1024))
    for k in ("old", "z", "x", "y"):
        java.put(k)
    assert d.java_order() == list(java.hashed())


def test_the_log_is_replayed_once_it_outgrows_the_dict():
    d: JavaOrderDict[int] = JavaOrderDict()
    for i in range(10_000):
        d["k"] = i
        del d["k"]
    assert len(d._log) <= 2 * len(d) + 4096 + 1
    assert d.java_order() == []


def test_a_copy_keeps_the_java_order():
    d: JavaOrderDict[int] = JavaOrderDict()
    for k in ORDER["key_sets"]["one hash among others, then removed"]:
        if k[0] == "+":
            d[k[1:]] = 1
        else:
            del d[k[1:]]
    pickled = pickle.loads(pickle.dumps(d))
    assert pickled == d and pickled.java_order() == d.java_order() == copy.deepcopy(d).java_order()
    for copied in (pickled, copy.copy(d)):
        copied["new"] = 2  # a copy goes on on its own
        assert "new" not in d and len(copied.java_order()) == len(d.java_order()) + 1
