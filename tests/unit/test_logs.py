"""Log lines a peer cannot forge or break, and warnings it cannot flood."""

from __future__ import annotations

import logging

from common.logs import LogfmtFormatter, LogThrottle, RateLimited
from tests.support.clock import Clock


def line(msg: str, *args: object) -> str:
    return LogfmtFormatter().format(logging.LogRecord("t", logging.WARNING, __file__, 1, msg, args, None))


def test_control_characters_surrogates_and_line_separators_are_escaped():
    text = line("KV put %s", 'a\x00b\r\nlevel=error msg=\x1b[2J\x7f\x85\ud800\u2028"\\')
    assert text.isprintable() and "\n" not in text
    assert '\\x00b\\r\\nlevel=error msg=\\x1b[2J\\x7f\\x85\\ud800\\u2028\\"\\\\' in text
    text.encode("utf-8")  # a lone surrogate would make the stream handler fail


def test_plain_words_stay_unquoted():
    assert line("stats").endswith("msg=stats")
    assert line("broker-a:10911").endswith("msg=broker-a:10911")


def test_rate_limited_logs_a_budget_per_minute_then_counts_the_rest(caplog):
    limited = RateLimited(logging.getLogger("t.limited"), per_minute=3)
    with caplog.at_level(logging.WARNING, logger="t.limited"):
        written = [limited.log(logging.WARNING, "drop %d", i) for i in range(10)]
    assert written == [True] * 3 + [False] * 7
    assert [r.getMessage() for r in caplog.records] == ["drop 0", "drop 1", "drop 2"]
    limited._window -= 60  # the next minute
    with caplog.at_level(logging.WARNING, logger="t.limited"):
        assert limited.log(logging.WARNING, "drop %d", 10)
    assert caplog.records[-1].getMessage() == "drop 10 (7 similar lines suppressed)"


def test_log_throttle_allows_each_key_once_per_interval_and_remembers_a_bounded_number():
    clock = Clock(0)
    throttle = LogThrottle(60.0, clock.seconds, max_keys=3)
    assert [throttle.allow(k) for k in ("a", "a", "b")] == [True, False, True]
    clock.set(seconds=59.9)
    assert not throttle.allow("a")
    clock.set(seconds=60.0)
    assert throttle.allow("a")
    for key in ("c", "d"):  # a flood of new keys pushes out the oldest: memory stays bounded
        assert throttle.allow(key)
    assert throttle.allow("b")  # forgotten, so allowed early
