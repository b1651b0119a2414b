"""Encoded answers, kept until something they were built from changes.

A route lookup, the cluster info and the topic lists are answered with bytes built for an earlier
request, as long as nothing those bytes depend on has changed since.  The caller names what they
depend on as a *generation* (for the handlers, :meth:`namesrv.handlers.HandlerContext.answer_generation`:
the route tables' and the KV store's versions and the settings that shape answers); the first
request of a new generation drops every entry at once.  The cache is bounded in bytes, oldest out
first.  docs/internals/caches.md says what it keeps and what it pays for itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

#: bytes of encoded answers (and their keys) kept; route answers are a few KiB each
MAX_BYTES = 32 * 1024 * 1024
#: a dict slot, the key tuple and the bytes object's header, roughly
ENTRY_OVERHEAD = 200


class AnswerCache:
    """Encoded answers by key, every one valid for the same generation; used on the event loop only."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._answers: dict[Hashable, bytes] = {}
        self._generation: Hashable = None
        self._bytes = 0

    @property
    def size(self) -> int:
        """Bytes held, as counted against ``max_bytes`` (:func:`entry_cost`)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._answers)

    def get_or_build(self, key: Hashable, generation: Hashable, build: Callable[[], bytes]) -> bytes:
        """The answer kept for ``key`` if it was built in ``generation``; else ``build()``'s, kept
        unless it alone would take more than a quarter of ``max_bytes`` (then it is built every time)."""
        if generation != self._generation:
            self._answers.clear()
            self._bytes = 0
            self._generation = generation
        body = self._answers.get(key)
        if body is None:
            body = build()
            cost = entry_cost(key, body)
            if cost <= self.max_bytes // 4:
                while self._bytes + cost > self.max_bytes:
                    old_key = next(iter(self._answers))
                    self._bytes -= entry_cost(old_key, self._answers.pop(old_key))
                self._answers[key] = body
                self._bytes += cost
        return body


def entry_cost(key: Hashable, body: bytes) -> int:
    """The bytes an entry counts for: its body, :data:`ENTRY_OVERHEAD`, and the second member of a
    tuple key when it is a string (a route's topic name, which a client chooses)."""
    key_size = len(key[1]) if type(key) is tuple and len(key) > 1 and type(key[1]) is str else 0
    return len(body) + key_size + ENTRY_OVERHEAD
