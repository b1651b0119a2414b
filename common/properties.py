"""Java ``.properties`` text, read as ``java.util.Properties`` reads it: the node's, the job's and
``tls.config.file`` all go through here, so the three files follow one set of rules."""

from __future__ import annotations

import javaproperties


def parse_properties(text: str) -> dict[str, str]:
    """``java.util.Properties.load`` of ``text``; the last of duplicate keys wins.

    Raises ``ValueError`` on a malformed ``\\uXXXX`` escape, where Java throws.
    """
    return dict(javaproperties.loads(text))


def decode_properties(data: bytes) -> str:
    """A .properties file's bytes as text: UTF-8, else Latin-1 (what java.util.Properties reads)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")
