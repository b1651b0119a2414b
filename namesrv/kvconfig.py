"""The KV config store: namespace -> key -> value, persisted as RocketMQ's ``kvConfig.json``.

One committed table, always equal to what the file holds.  A change is checked first
(:meth:`KVConfigManager.refusal`), then one writer thread applies every change waiting at that
moment to a copy, writes the whole file once (:func:`namesrv.fileio.write_atomically`), and only
then commits the copy and completes each change: concurrent PUT_KV_CONFIGs share one write, none of
it on the event loop, and a failed write changes nothing in memory.  (Java changes memory first and
rewrites the file in place.)  The file is fastjson's compact JSON with keys sorted; a ``None`` value
is kept until a restart, as Java keeps it.  Sizes are bounded so that every namespace fits one
answer and every acceptable request fits the header limit.  ``version`` grows on every change, so
callers can cache encoded answers.  ``docs/internals/kvconfig.md`` has the limits and the reasons.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from namesrv.config import ConfigError
from namesrv.fileio import backup_path, write_atomically

__all__ = ["KVConfigManager", "ConfigError", "KVRefused", "MAX_NAME_CHARS", "MAX_VALUE_CHARS", "MAX_TABLE_CHARS"]

log = logging.getLogger(__name__)

Table = dict[str, dict[str, str | None]]

MAX_NAME_CHARS = 1024
MAX_VALUE_CHARS = 16 * 1024
MAX_TABLE_CHARS = 2 * 1024 * 1024


class KVRefused(ValueError):
    """A change the store will not take (unencodable, or beyond a limit); nothing was changed."""


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no file or answer could carry it
        return True
    return False


def _entry_chars(namespace: str, key: str, value: str | None) -> int:
    return len(key) + (len(value) if value is not None else 0)


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


@dataclass
class _Change:
    namespace: str
    key: str
    value: str | None
    delete: bool
    future: Future = field(default_factory=Future)


class KVConfigManager:
    """Namespace -> key -> value, persisted to ``path`` before any change is acknowledged."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # guards the swap of _table and _version
        self._table: Table = {}  # the committed table: replaced, never changed in place
        self._chars = 0
        self._version = 0
        self._queue: queue.SimpleQueue[_Change | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None

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
                    self.path,
                    problem or "empty",
                    bak,
                )
            elif problem is not None:
                raise ConfigError(
                    f"KV config file {self.path} is corrupt: {problem}, and {bak} is missing or "
                    f"corrupt too; repair the file, or move it away to start with an empty KV store"
                )
        table = table or {}
        with self._lock:
            self._table = table
            self._chars = sum(_entry_chars(ns, k, v) for ns, kv in table.items() for k, v in kv.items())
            self._chars += sum(len(ns) for ns in table)
            self._version += 1
        log.info("loaded KV config from %s: %d namespaces", self.path, len(table))

    # -- mutations -------------------------------------------------------------------------

    @staticmethod
    def refusal(namespace: str, key: str, value: str | None) -> str | None:
        """Why a put of this entry is refused (a remark for the client), or None when it may be stored."""
        for what, text, limit in (
            ("namespace", namespace, MAX_NAME_CHARS),
            ("key", key, MAX_NAME_CHARS),
            ("value", value, MAX_VALUE_CHARS),
        ):
            if text is None:
                continue
            if len(text) > limit:
                return f"KV {what} of {len(text)} characters exceeds the limit of {limit}"
            if _unencodable(text):
                return f"KV {what} is not valid Unicode (a lone surrogate); it cannot be stored"
        return None

    def submit_put(self, namespace: str, key: str, value: str | None) -> Future:
        """Queue a put; the future completes (None, or an exception) once the file holds it.

        Raises :class:`KVRefused` at once, before anything changes, for an entry :meth:`refusal` refuses.
        """
        problem = self.refusal(namespace, key, value)
        if problem is not None:
            raise KVRefused(problem)
        return self._submit(_Change(namespace, key, value, delete=False))

    def submit_delete(self, namespace: str, key: str) -> Future:
        """Queue a delete; the namespace stays even when it becomes empty."""
        return self._submit(_Change(namespace, key, None, delete=True))

    def put(self, namespace: str, key: str, value: str | None) -> None:
        """Store ``value`` (None is kept in memory, dropped on disk); returns once it is on disk."""
        self.submit_put(namespace, key, value).result()

    def delete(self, namespace: str, key: str) -> None:
        self.submit_delete(namespace, key).result()

    def close(self) -> None:
        """Stop the writer thread after the changes already queued (it is started again on demand)."""
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            self._queue.put(None)
            writer.join()

    def _submit(self, change: _Change) -> Future:
        with self._lock:
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
                self._writer.start()
            self._queue.put(change)
        return change.future

    def _write_loop(self) -> None:
        while True:
            change = self._queue.get()
            if change is None:
                return
            batch = [change]
            stop = False
            while True:  # everything queued meanwhile goes into the same write
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.append(more)
            try:
                self._commit(batch)
            except BaseException as exc:  # a failure of one batch must not end the writer
                log.error("KV writer failed: %s", exc)
                if len(batch) > 1:
                    for one in batch:
                        try:
                            self._commit([one])
                        except BaseException as single:
                            one.future.set_exception(single)
                else:
                    change.future.set_exception(exc)
            if stop:
                return

    def _commit(self, batch: list[_Change]) -> None:
        """Apply ``batch`` to a copy, write it, then make the copy the committed table."""
        committed = self._table
        table = dict(committed)
        copied: set[str] = set()
        chars = self._chars
        changed = False
        accepted: list[_Change] = []
        for ch in batch:
            kv = table.get(ch.namespace)
            if ch.delete:
                if kv is None or ch.key not in kv:
                    accepted.append(ch)
                    continue
                previous = kv[ch.key]
                if ch.namespace not in copied:
                    kv = table[ch.namespace] = dict(kv)
                    copied.add(ch.namespace)
                del kv[ch.key]
                chars -= _entry_chars(ch.namespace, ch.key, previous)
                changed = True
                accepted.append(ch)
                continue
            had = kv is not None and ch.key in kv
            previous = kv.get(ch.key) if kv is not None else None
            if kv is not None and had and previous == ch.value:
                accepted.append(ch)
                continue
            grow = _entry_chars(ch.namespace, ch.key, ch.value) + (len(ch.namespace) if kv is None else 0)
            if had:
                grow -= _entry_chars(ch.namespace, ch.key, previous)
            if chars + grow > MAX_TABLE_CHARS:
                ch.future.set_exception(
                    KVRefused(
                        f"the KV store holds {chars} characters; this entry would take it past the limit of "
                        f"{MAX_TABLE_CHARS}: delete entries first"
                    )
                )
                continue
            if kv is None:
                kv = table[ch.namespace] = {}
                copied.add(ch.namespace)
            elif ch.namespace not in copied:
                kv = table[ch.namespace] = dict(kv)
                copied.add(ch.namespace)
            kv[ch.key] = ch.value
            chars += grow
            changed = True
            accepted.append(ch)
        if changed:
            write_atomically(self.path, _encode_table(table))
            with self._lock:
                self._table = table
                self._chars = chars
                self._version += 1
        for ch in accepted:
            if ch.delete:
                log.info("KV delete %s/%s", ch.namespace, ch.key)
            else:
                log.info("KV put %s/%s=%r", ch.namespace, ch.key, ch.value)
            ch.future.set_result(None)

    # -- reads -----------------------------------------------------------------------------

    # the committed table is replaced, never changed in place, so a reader needs no lock

    def get(self, namespace: str, key: str) -> str | None:
        kv = self._table.get(namespace)
        return None if kv is None else kv.get(key)

    def get_namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of the namespace without null values; None when the namespace does not exist."""
        kv = self._table.get(namespace)
        if kv is None:
            return None
        return {k: v for k, v in kv.items() if v is not None}

    def snapshot(self) -> dict[str, dict[str, str]]:
        """A deep copy of the whole table without null values (what the file holds)."""
        return {ns: {k: v for k, v in kv.items() if v is not None} for ns, kv in self._table.items()}
