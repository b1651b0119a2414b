"""Crash-safe replacement of small state files (KV store, properties).

Theory of operation: RocketMQ's ``MixAll.string2File`` copies the old file to ``<path>.bak`` and then
truncates and rewrites ``<path>`` in place, so a crash mid-write leaves a torn file.  Here the new
content is written and fsynced to ``<path>.tmp`` first; only then is the old file copied to
``<path>.bak`` and the temporary file renamed over ``<path>`` (atomic on POSIX), and the directory is
fsynced so the rename itself survives a power cut.  At every instant ``<path>`` holds either the
complete old content or the complete new content.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["write_atomically", "backup_path", "temp_path"]


def backup_path(path: Path) -> Path:
    """The previous content of ``path`` (``<path>.bak``, the name RocketMQ uses too)."""
    return path.with_name(path.name + ".bak")


def temp_path(path: Path) -> Path:
    """Where the next content of ``path`` is staged before the rename."""
    return path.with_name(path.name + ".tmp")


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_and_sync(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash never leaves a partial file.

    Parent directories are created.  The previous content, if any, is kept in ``<path>.bak``.
    Raises ``OSError`` when the disk refuses; ``path`` is then unchanged.
    """
    path = Path(path)
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    _write_and_sync(tmp, data)
    if path.exists():
        bak = backup_path(path)
        shutil.copyfile(path, bak)
        # the backup is what a corrupt main file falls back to, so it must be on disk too
        with open(bak, "rb+") as handle:
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    _fsync_dir(directory)
