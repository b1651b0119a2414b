"""The order Apache RocketMQ's NameServer lists topics in: Java's hash tables, emulated.

Theory of operation: Apache's topic lists (GET_ALL_TOPIC_LIST_FROM_NAMESERVER, GET_TOPICS_BY_CLUSTER,
the unit-topic lists, GET_SYSTEM_TOPIC_LIST_FROM_NS) are a ``TopicList`` whose ``topicList`` is a fresh
``ConcurrentHashMap.newKeySet()``, filled by walking ``RouteInfoManager``'s ``topicQueueTable`` (a
``ConcurrentHashMap(1024)``) and serialised in the set's iteration order (5.0 to 5.5.0; 4.9.x used a
``HashMap`` and a ``HashSet`` instead).  So a client sees the topics in the order a Java hash table
keeps them: by bin, the bin being the low bits of the spread ``String.hashCode``; within a bin, in the
order the table's history left them.  :class:`ConcurrentHashMapKeys` keeps that order for a sequence
of insertions and removals as ``java.util.concurrent.ConcurrentHashMap`` (JDK 8 to 25) does for one
writer: the table allocated at the first insertion (16 bins, or the size the constructor derived
from its capacity), a resize to twice the bins once the count reaches three quarters of them, each
bin split by one more hash bit on a resize, the nodes of a list bin before its last run of one
side re-linked in reverse (``transfer``'s ``lastRun``), a bin of nine or more names turned into a
tree bin (or, below 64 bins, the table grown instead), new names put at the front of a tree bin and
at the end of a list bin, and a split tree half of six or fewer names turned back into a list.

One thing is not modelled: Java turns a tree bin back into a list on a removal when its red-black
tree is "too small", a property of the tree's shape, which we do not build; we take a tree bin of
six or fewer names as too small.  That only matters once nine names share a bin, i.e. for names
crafted to collide, and then only after removals; docs/protocol.md says so.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

_V = TypeVar("_V")

_MAX_CAPACITY = 1 << 30
_DEFAULT_CAPACITY = 16
_TREEIFY_THRESHOLD = 8
_UNTREEIFY_THRESHOLD = 6
_MIN_TREEIFY_CAPACITY = 64
_HASH_BITS = 0x7FFFFFFF
_MASK32 = 0xFFFFFFFF


def java_string_hash(s: str) -> int:
    """``String.hashCode()`` of ``s`` as an unsigned 32-bit pattern (over its UTF-16 code units)."""
    h = 0
    if s.isascii():
        for c in s.encode():
            h = (31 * h + c) & _MASK32
        return h
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & _MASK32
    return h


def spread(h: int) -> int:
    """``ConcurrentHashMap.spread``: the high half folded into the low, the sign bit cleared."""
    return (h ^ (h >> 16)) & _HASH_BITS


def _table_size_for(c: int) -> int:
    n = 1
    while n < c:
        n <<= 1
    return min(n, _MAX_CAPACITY)


def concurrent_hash_map_table_size(initial_capacity: int) -> int:
    """The first table size of ``new ConcurrentHashMap<>(initialCapacity)`` (JDK 11 and later; JDK 8's
    ``tableSizeFor(c + c/2 + 1)`` gives the same for the capacities RocketMQ passes)."""
    size = int(1.0 + initial_capacity / 0.75)
    return _MAX_CAPACITY if size >= _MAX_CAPACITY else _table_size_for(size)


class ConcurrentHashMapKeys:
    """The keys of one ``java.util.concurrent.ConcurrentHashMap`` (one writer), in its iteration order.

    ``initial_table`` is the table size its constructor derived (:func:`concurrent_hash_map_table_size`);
    None for the no-argument constructor, whose first table has 16 bins.  Only the bins that hold keys
    are kept, so a table's size costs nothing, and a resize costs its keys, not its bins.
    """

    __slots__ = ("_n", "_bins", "_trees", "_size", "_size_ctl")

    def __init__(self, initial_table: int | None = None) -> None:
        #: the table size, 0 until the first insertion allocates it
        self._n = 0
        #: the non-empty bins by index: (spread hash, key) in iteration order
        self._bins: dict[int, list[tuple[int, str]]] = {}
        #: indexes of the bins that are tree bins
        self._trees: set[int] = set()
        self._size = 0
        #: Java's sizeCtl while no resize runs: the first table size, then the count that resizes
        self._size_ctl = initial_table or 0

    def __len__(self) -> int:
        return self._size

    @property
    def table_size(self) -> int:
        """Its bins: now, or once its first insertion allocates them."""
        return self._n or self._size_ctl or _DEFAULT_CAPACITY

    def hashed(self) -> Iterator[tuple[int, str]]:
        """(spread hash, key) of every key in iteration order."""
        bins = self._bins
        for i in sorted(bins):
            yield from bins[i]

    def keys(self) -> list[str]:
        return [k for _, k in self.hashed()]

    def put(self, key: str, h: int | None = None) -> bool:
        """``put`` / ``putIfAbsent`` / a key set's ``add`` (the same here); True if ``key`` was new.

        ``h``: ``spread(java_string_hash(key))`` when the caller has it.
        """
        if h is None:
            h = spread(java_string_hash(key))
        if not self._n:
            n = self._size_ctl if self._size_ctl > 0 else _DEFAULT_CAPACITY
            self._n, self._size_ctl = n, n - (n >> 2)
        i = h & (self._n - 1)
        b = self._bins.get(i)
        if b is None:
            self._bins[i] = [(h, key)]
        elif i in self._trees:
            for _, k in b:
                if k == key:
                    return False
            b.insert(0, (h, key))  # a tree bin links a new node in front of its first
        else:
            for position, (_, k) in enumerate(b, 1):
                if k == key:
                    # Java counts the nodes it walked, found or not, and treeifies on that count
                    if position >= _TREEIFY_THRESHOLD:
                        self._treeify_bin(i)
                    return False
            b.append((h, key))
            if len(b) > _TREEIFY_THRESHOLD:  # it walked the eight or more it had
                self._treeify_bin(i)
        self._size += 1
        self._grow()
        return True

    def add_all(self, keys: Iterable[tuple[int, str]]) -> None:
        """:meth:`put` of each (spread hash, key), in order: the same table, at a third of the cost (a
        short list bin, the common case, is handled here; anything else by :meth:`put`)."""
        if not self._n:
            n = self._size_ctl if self._size_ctl > 0 else _DEFAULT_CAPACITY
            self._n, self._size_ctl = n, n - (n >> 2)
        bins, trees, mask, size_ctl = self._bins, self._trees, self._n - 1, self._size_ctl
        for h, key in keys:
            i = h & mask
            b = bins.get(i)
            if b is None:
                bins[i] = [(h, key)]
            elif len(b) < _TREEIFY_THRESHOLD and i not in trees:
                for _, k in b:
                    if k == key:
                        break
                else:
                    b.append((h, key))
                    self._size += 1
                    if self._size >= size_ctl:
                        self._grow()
                        bins, trees, mask, size_ctl = self._bins, self._trees, self._n - 1, self._size_ctl
                continue
            else:
                self.put(key, h)
                bins, trees, mask, size_ctl = self._bins, self._trees, self._n - 1, self._size_ctl
                continue
            self._size += 1
            if self._size >= size_ctl:
                self._grow()
                bins, trees, mask, size_ctl = self._bins, self._trees, self._n - 1, self._size_ctl

    def _grow(self) -> None:
        while self._size >= self._size_ctl and self._n < _MAX_CAPACITY:
            self._transfer()

    def remove(self, key: str, h: int | None = None) -> bool:
        """``remove``; True if ``key`` was there. A table never shrinks."""
        if not self._n:
            return False
        if h is None:
            h = spread(java_string_hash(key))
        i = h & (self._n - 1)
        b = self._bins.get(i)
        if b is None:
            return False
        for position, (_, k) in enumerate(b):
            if k == key:
                if i in self._trees and len(b) <= _UNTREEIFY_THRESHOLD:
                    self._trees.discard(i)  # "too small": see the module docstring
                del b[position]
                if not b:
                    del self._bins[i]
                    self._trees.discard(i)
                self._size -= 1
                return True
        return False

    def _treeify_bin(self, i: int) -> None:
        if self._n < _MIN_TREEIFY_CAPACITY:
            self._try_presize(self._n << 1)
        elif i in self._bins:
            self._trees.add(i)  # the list becomes a tree bin in the same order

    def _try_presize(self, size: int) -> None:
        c = _MAX_CAPACITY if size >= (_MAX_CAPACITY >> 1) else _table_size_for(size + (size >> 1) + 1)
        while c > self._size_ctl and self._n < _MAX_CAPACITY:
            self._transfer()

    def _transfer(self) -> None:
        """Double the table: each bin splits on the hash bit ``n`` into bins i and i + n."""
        n = self._n
        new: dict[int, list[tuple[int, str]]] = {}
        trees: set[int] = set()
        for i, b in self._bins.items():
            if len(b) == 1:
                new[i | (b[0][0] & n)] = b
                continue
            if i in self._trees:
                lo = [e for e in b if not e[0] & n]
                hi = [e for e in b if e[0] & n]
                # a half of more than six names stays a tree bin (the whole bin when the other is empty)
                trees.update(j for j, half in ((i, lo), (i + n, hi)) if len(half) > _UNTREEIFY_THRESHOLD)
            else:
                # the nodes from the last run of one side on are moved as they are; the ones before it
                # are linked in front of their side's list one by one, so they come out in reverse
                last_run = len(b) - 1
                run_bit = b[last_run][0] & n
                while last_run > 0 and (b[last_run - 1][0] & n) == run_bit:
                    last_run -= 1
                lo, hi = [], []
                (hi if run_bit else lo).extend(b[last_run:])
                for e in b[:last_run]:
                    (hi if e[0] & n else lo).insert(0, e)
            if lo:
                new[i] = lo
            if hi:
                new[i + n] = hi
        self._bins, self._trees, self._n = new, trees, n << 1
        self._size_ctl = (n << 1) - (n >> 1)


def hashed(keys: Iterable[str]) -> Iterator[tuple[int, str]]:
    """(spread hash, key) of each key, for :func:`key_set_order` and :meth:`ConcurrentHashMapKeys.put`."""
    for k in keys:
        yield spread(java_string_hash(k)), k


def key_set_order(keys: Iterable[tuple[int, str]]) -> list[str]:
    """The iteration order of a fresh ``ConcurrentHashMap.newKeySet()`` after adding ``keys`` ((spread
    hash, key) pairs, repeats allowed) one by one: the order of a ``TopicList`` body's topics."""
    s = ConcurrentHashMapKeys()
    s.add_all(keys)
    return s.keys()


def hash_set_order(keys: Iterable[str]) -> list[str]:
    """The iteration order of a ``java.util.HashSet`` (a ``HashMap``) holding ``keys``, given in the order
    they were added: by bucket, the low bits of the folded ``String.hashCode`` over a table of 16 or
    the next power of two holding them at three quarters, and in a bucket in the order added.

    A table keeps the size its largest count needed, and a bucket of nine or more becomes a tree with
    an order of its own; a set whose history we do not keep is taken as never larger than now, with no
    such bucket (see docs/protocol.md).
    """
    ordered = list(keys)
    n = _DEFAULT_CAPACITY
    while len(ordered) > n - (n >> 2) and n < _MAX_CAPACITY:
        n <<= 1
    rank = {k: i for i, k in enumerate(ordered)}
    return sorted(ordered, key=lambda k: (spread(java_string_hash(k)) & (n - 1), rank[k]))


#: a log entry's hash for a removal; None is an addition whose hash is not computed yet
_REMOVED = -1


class JavaOrderDict(dict[str, _V]):
    """A dict that also knows the order a ``ConcurrentHashMap`` holding the same keys, put and removed
    in the same order, iterates them in (:meth:`java_order`).

    Every change of its keys is noted in a log (one entry per key added or removed, whatever dict
    method made it), replayed into a :class:`ConcurrentHashMapKeys` when the order is asked for, or
    when the log outgrows the dict; reads are a dict's.  ``initial_capacity`` is what Java's
    constructor was given.
    """

    __slots__ = ("_log", "_java", "_batch_start", "_key_set")

    def __init__(self, items: Iterable[tuple[str, _V]] | Mapping[str, _V] = (), *, initial_capacity: int = 1024):
        super().__init__()
        #: (key, its spread hash, None until computed, or _REMOVED)
        self._log: list[tuple[str, int | None]] = []
        self._java = ConcurrentHashMapKeys(concurrent_hash_map_table_size(initial_capacity))
        #: where the open batch's changes start in the log (None: no batch open)
        self._batch_start: int | None = None
        #: :meth:`java_key_set_order`'s answer while no key changed since
        self._key_set: list[str] | None = None
        self.update(items)

    def begin_batch(self) -> None:
        """Keys added from now to :meth:`end_batch` are one batch (a registration's new topics)."""
        self._batch_start = len(self._log)

    def end_batch(self, source: Callable[[], Iterable[str]]) -> None:
        """The keys the batch added go to Java in the order a fresh ``ConcurrentHashMap`` filled with
        ``source()``'s keys in their order iterates them: Java adds a registration's topics walking the
        topic table it decoded from the body into such a map, ``source()`` being the body's order.

        That order only matters for new keys that share a bin of Java's table, so ``source`` is called
        only when two do: a registration of topics new to the table, not the periodic one.
        """
        start, self._batch_start = self._batch_start, None
        assert start is not None
        log = self._log
        added = [i for i in range(start, len(log)) if log[i][1] != _REMOVED]
        if len(added) < 2:
            return
        keys = [log[i][0] for i in added]
        hashes = {k: spread(java_string_hash(k)) for k in keys}
        if len(hashes) < len(keys):
            return  # a key added, removed and added again: no one map order to follow
        mask = self._java.table_size - 1  # not replayed yet: the table's size or smaller
        if len({h & mask for h in hashes.values()}) == len(keys):
            for i in added:
                log[i] = (log[i][0], hashes[log[i][0]])
            return
        body = ((hashes[k] if k in hashes else spread(java_string_hash(k)), k) for k in source())
        rank = {k: n for n, k in enumerate(key_set_order(body))}
        keys.sort(key=lambda k: rank.get(k, len(rank)))
        for i, k in zip(added, keys, strict=True):
            log[i] = (k, hashes[k])

    def __reduce__(self) -> tuple[Any, ...]:
        # a copy (pickle, copy) carries the log and the emulated table: the same Java order as the original
        return (_restore, (dict(self), list(self._log), self._java))

    def java_order(self) -> list[tuple[int, str]]:
        """(spread hash, key) of every key, in the order Java's map iterates them."""
        self._replay()
        return list(self._java.hashed())

    def java_key_set_order(self) -> list[str]:
        """:func:`key_set_order` of :meth:`java_order` (a ``TopicList`` of every key), kept until a key
        is added or removed."""
        self._replay()
        if self._key_set is None:
            self._key_set = key_set_order(self._java.hashed())
        return list(self._key_set)

    def _replay(self) -> None:
        java, log = self._java, self._log
        if not log:
            return
        self._key_set = None
        start = 0
        while start < len(log):
            end = start
            while end < len(log) and log[end][1] != _REMOVED:
                end += 1
            java.add_all((spread(java_string_hash(k)) if h is None else h, k) for k, h in log[start:end])
            if end < len(log):
                java.remove(log[end][0])
                end += 1
            start = end
        log.clear()

    def _note(self, key: str, h: int | None) -> None:
        self._log.append((key, h))
        if len(self._log) > 2 * len(self) + 4096 and self._batch_start is None:
            self._replay()

    def __setitem__(self, key: str, value: _V) -> None:
        if key not in self:
            self._note(key, None)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._note(key, _REMOVED)

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            self._note(key, _REMOVED)
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, _V]:
        key, value = super().popitem()
        self._note(key, _REMOVED)
        return key, value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self._note(key, None)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: _V) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> JavaOrderDict[_V]:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        for key in self:
            self._log.append((key, _REMOVED))
        super().clear()
        self._replay()


def _restore(
    items: dict[str, Any], log: list[tuple[str, int | None]], java: ConcurrentHashMapKeys
) -> JavaOrderDict[Any]:
    d: JavaOrderDict[Any] = JavaOrderDict()
    super(JavaOrderDict, d).update(items)  # dict's own: these keys are in the log already
    d._log, d._java = log, copy.deepcopy(java)  # a shallow copy must not share the table either
    return d
