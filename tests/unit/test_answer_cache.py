"""The answer cache: built once per generation, dropped at once when it changes, bounded in bytes."""

from __future__ import annotations

from namesrv.answer_cache import ENTRY_OVERHEAD, AnswerCache, entry_cost


class Builds:
    """A build function that counts its calls."""

    def __init__(self, body: bytes) -> None:
        self.body, self.calls = body, 0

    def __call__(self) -> bytes:
        self.calls += 1
        return self.body


def test_an_answer_is_built_once_per_generation():
    cache = AnswerCache()
    build = Builds(b"route")
    assert cache.get_or_build(("route", "T"), 1, build) == b"route"
    assert cache.get_or_build(("route", "T"), 1, build) == b"route"
    assert build.calls == 1
    assert cache.get_or_build(("route", "T"), 2, build) == b"route"
    assert build.calls == 2


def test_a_new_generation_drops_every_answer_at_once():
    cache = AnswerCache()
    cache.get_or_build("cluster", (1, 1), Builds(b"c"))
    cache.get_or_build(("route", "T"), (1, 1), Builds(b"r"))
    assert len(cache) == 2
    cache.get_or_build("cluster", (2, 1), Builds(b"c2"))
    assert len(cache) == 1 and cache.size == entry_cost("cluster", b"c2")


def test_an_empty_answer_is_kept_too():
    cache = AnswerCache()
    build = Builds(b"")  # a topic without a route
    cache.get_or_build(("route", "nope"), 1, build)
    cache.get_or_build(("route", "nope"), 1, build)
    assert build.calls == 1


def test_a_route_key_counts_its_topic_name():
    assert entry_cost(("route", "T" * 100, True, None, False), b"x" * 10) == 10 + 100 + ENTRY_OVERHEAD
    assert entry_cost("cluster", b"x" * 10) == entry_cost(105, b"x" * 10) == 10 + ENTRY_OVERHEAD


def test_the_oldest_answers_make_way_for_a_new_one():
    cost = entry_cost(("route", "T0"), b"x" * 100)
    cache = AnswerCache(max_bytes=4 * cost)
    for i in range(4):
        cache.get_or_build(("route", f"T{i}"), 1, Builds(b"x" * 100))
    assert len(cache) == 4 and cache.size == 4 * cost
    cache.get_or_build(("route", "T4"), 1, Builds(b"x" * 100))
    assert len(cache) == 4 and cache.size == 4 * cost
    again = Builds(b"x" * 100)
    cache.get_or_build(("route", "T0"), 1, again)  # the oldest went first
    cache.get_or_build(("route", "T4"), 1, again)
    assert again.calls == 1


def test_an_answer_over_a_quarter_of_the_bound_is_built_every_time():
    cache = AnswerCache(max_bytes=4000)
    large = Builds(b"x" * (1000 - ENTRY_OVERHEAD + 1))
    cache.get_or_build("cluster", 1, large)
    cache.get_or_build("cluster", 1, large)
    assert large.calls == 2 and len(cache) == 0 and cache.size == 0
    fits = Builds(b"x" * (1000 - ENTRY_OVERHEAD - len("T")))
    cache.get_or_build(("route", "T"), 1, fits)
    cache.get_or_build(("route", "T"), 1, fits)
    assert fits.calls == 1 and cache.size == 1000
