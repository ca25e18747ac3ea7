"""The last lines of an instance's log, for the event that says why it failed.

A person reading `sluice events` should see what the server said before it died without
opening the file. What a process prints is arbitrary bytes (binary, escape sequences,
megabytes on one line), so the tail is bounded and made printable before it goes anywhere.
"""

from __future__ import annotations

import os

__all__ = ["TAIL_LINES", "log_tail"]

TAIL_LINES = 10
_TAIL_BYTES = 8192
_LINE_CHARS = 300


def _printable(line: str) -> str:
    text = "".join(c if c.isprintable() or c == "\t" else "?" for c in line).strip()
    return text if len(text) <= _LINE_CHARS else text[: _LINE_CHARS - 3] + "..."


def log_tail(path: str | None, lines: int = TAIL_LINES) -> list[str]:
    """At most `lines` non-blank lines from the end of the file (its last 8 KiB), printable
    and at most 300 characters each; [] if there is no such file."""
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _TAIL_BYTES))
            data = f.read(_TAIL_BYTES)
    except OSError:
        return []
    text = data.decode("utf-8", "replace").replace("\r", "\n")
    kept = [p for p in (_printable(x) for x in text.split("\n")) if p]
    if size > _TAIL_BYTES and kept:
        kept = kept[1:]  # the first line was cut by the 8 KiB window
    return kept[-lines:]
