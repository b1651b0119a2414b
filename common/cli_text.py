"""What the two command lines (``namesrv``, ``namesrv-monitor``) print for people: a result as text.

:func:`human` shows a string as it is, a list of strings one a line, a list of rows as a
:func:`table` and a mapping as aligned ``key value`` lines.
"""

from __future__ import annotations

from typing import Any


def human(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, list):
        return "\n".join(human(r) for r in result) if result and isinstance(result[0], str) else table(result)
    if isinstance(result, dict):
        return "\n".join(f"{k:<40} {v}" for k, v in result.items())
    return str(result)


def table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(none)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)
