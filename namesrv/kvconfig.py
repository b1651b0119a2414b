"""The KV config store: namespace -> key -> value, persisted as RocketMQ's ``kvConfig.json``.

Theory of operation: one in-memory table guarded by its own lock.  Every put and delete rewrites the
whole file before returning (as Java's ``KVConfigManager`` does), but through
:func:`namesrv.fileio.write_atomically`, so a crash leaves either the old or the new file.  The file
is compact JSON ``{"configTable":{ns:{key:value}}}``, byte-identical to fastjson's for the same
content with keys in sorted order (Java's order is HashMap order, which no reader depends on).

A value may be ``None`` (Java stores the null, and fastjson leaves it out of the file and of every
KVTable body): the namespace then exists but the key reads as absent and is gone after a restart.

``version`` grows on every change of content, so callers can cache encoded answers.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import orjson

from namesrv.config import ConfigError
from namesrv.fileio import backup_path, write_atomically

__all__ = ["KVConfigManager", "ConfigError"]

log = logging.getLogger(__name__)

Table = dict[str, dict[str, str | None]]


class _Corrupt(ValueError):
    pass


def _decode_table(data: bytes) -> Table:
    """Parse kvConfig.json bytes (compact or pretty, UTF-8); raises _Corrupt."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        doc: Any = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _Corrupt(f"not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise _Corrupt("top level is not a JSON object")
    raw = doc.get("configTable")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _Corrupt('"configTable" is not an object')
    table: Table = {}
    for namespace, entries in raw.items():
        if entries is None:
            continue
        if not isinstance(entries, dict):
            raise _Corrupt(f"namespace {namespace!r} is not an object")
        kv: dict[str, str | None] = {}
        for key, value in entries.items():
            if value is None:
                continue
            if not isinstance(value, str):
                raise _Corrupt(f"value of {namespace!r}/{key!r} is not a string")
            kv[key] = value
        table[namespace] = kv
    return table


def _encode_table(table: Table) -> bytes:
    persisted = {ns: {k: v for k, v in kv.items() if v is not None} for ns, kv in table.items()}
    return orjson.dumps({"configTable": persisted}, option=orjson.OPT_SORT_KEYS)


class KVConfigManager:
    """Namespace -> key -> value, persisted to ``path`` on every change."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._table: Table = {}
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    # -- loading ---------------------------------------------------------------------------

    def _read(self, path: Path) -> Table | None:
        """The table in ``path``; None when the file does not exist or is empty."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if not data.strip():
            return None
        return _decode_table(data)

    def load(self) -> None:
        """Replace the table with the file's content.

        A missing file means an empty store.  A corrupt (or empty, as Java's non-atomic write can
        leave) file falls back to ``<path>.bak`` with a warning; with no usable backup a corrupt file
        raises :class:`ConfigError`.
        """
        bak = backup_path(self.path)
        problem: str | None = None
        try:
            table = self._read(self.path)
        except _Corrupt as exc:
            table, problem = None, str(exc)
        except OSError as exc:
            raise ConfigError(
                f"KV config file {self.path} cannot be read ({exc.strerror}); check its permissions"
            ) from None
        if table is None and (problem is not None or self.path.exists()):
            try:
                table = self._read(bak)
            except (_Corrupt, OSError):
                table = None
            if table is not None:
                log.warning(
                    "KV config file %s is %s; loaded the backup %s instead",
                    self.path, problem or "empty", bak,
                )
            elif problem is not None:
                raise ConfigError(
                    f"KV config file {self.path} is corrupt: {problem}, and {bak} is missing or "
                    f"corrupt too; repair the file, or move it away to start with an empty KV store"
                )
        with self._lock:
            self._table = table or {}
            self._version += 1
        log.info("loaded KV config from %s: %d namespaces", self.path, len(self._table))

    # -- mutations -------------------------------------------------------------------------

    def _persist_or_undo(self, undo: Any) -> None:
        try:
            write_atomically(self.path, _encode_table(self._table))
        except OSError:
            # Java keeps the change in memory only; we keep memory equal to disk and let the
            # caller answer with an error
            undo()
            raise

    def put(self, namespace: str, key: str, value: str | None) -> None:
        """Store ``value`` (None is kept in memory, dropped on disk) and persist."""
        with self._lock:
            created = namespace not in self._table
            kv = self._table.setdefault(namespace, {})
            had_key = key in kv
            previous = kv.get(key)
            kv[key] = value

            def undo() -> None:
                if created:
                    del self._table[namespace]
                elif had_key:
                    kv[key] = previous
                else:
                    del kv[key]

            self._persist_or_undo(undo)
            if created or not had_key or previous != value:
                self._version += 1
        log.info("KV put %s/%s=%r", namespace, key, value)

    def delete(self, namespace: str, key: str) -> None:
        """Remove ``key``; the namespace stays even when it becomes empty.  Always persists."""
        with self._lock:
            kv = self._table.get(namespace)
            had_key = kv is not None and key in kv
            previous = kv.pop(key) if kv is not None and had_key else None

            def undo() -> None:
                if kv is not None and had_key:
                    kv[key] = previous

            self._persist_or_undo(undo)
            if had_key:
                self._version += 1
        log.info("KV delete %s/%s", namespace, key)

    # -- reads -----------------------------------------------------------------------------

    def get(self, namespace: str, key: str) -> str | None:
        with self._lock:
            kv = self._table.get(namespace)
            return None if kv is None else kv.get(key)

    def get_namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of the namespace without null values; None when the namespace does not exist."""
        with self._lock:
            kv = self._table.get(namespace)
            if kv is None:
                return None
            return {k: v for k, v in kv.items() if v is not None}

    def snapshot(self) -> dict[str, dict[str, str]]:
        """A deep copy of the whole table without null values (what the file holds)."""
        with self._lock:
            return {ns: {k: v for k, v in kv.items() if v is not None} for ns, kv in self._table.items()}
