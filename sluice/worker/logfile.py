"""The instance's log file follows rotation by rename, so rotating it loses no line.

The runtime starts the worker with stdout and stderr (fds 1 and 2) on `<id>.log`, opened for
appending, and names that file in the config (`log_file`). Housekeeping rotates it by
renaming it to `<id>.log.1`; the worker keeps writing into the renamed file (same open
file) until it notices, within `FOLLOW_S`, that the name now points elsewhere or nowhere,
and then opens a fresh `<id>.log` and moves fds 1 and 2 onto it. Every line lands in one
file or the other; nothing is copied, nothing truncated. (Copy-then-truncate, the way to
rotate a file whose writer cannot be told, loses whatever is written between the copy and
the truncation.) Working on the file descriptors, not on Python's streams, also moves what
the interpreter itself writes to fd 2, such as a traceback on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

__all__ = ["FOLLOW_S", "LogFile"]

FOLLOW_S = 1.0
"""How often the worker checks whether its log file was renamed: one `stat` and one `fstat`
a second; until it reopens, lines go to the end of the renamed file."""


class LogFile:
    """Fds 1 and 2 of this process, kept on the file named `path` (see the module)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def reopen_if_moved(self) -> bool:
        """If `path` is not the file fd 1 writes to (renamed away, removed, never opened),
        open it (appending, created if need be) and put fds 1 and 2 on it. True if it did."""
        try:
            named = os.stat(self.path)
            current = os.fstat(1)
            if (named.st_dev, named.st_ino) == (current.st_dev, current.st_ino):
                return False
        except FileNotFoundError:
            pass
        for stream in (sys.stdout, sys.stderr):  # what is buffered belongs to the old file
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        finally:
            os.close(fd)
        return True

    async def follow(self, every_s: float = FOLLOW_S) -> None:
        """Check every `every_s` seconds, until cancelled. A failed check (the directory
        gone, a full disk) leaves the output where it is and is tried again next time."""
        while True:
            await asyncio.sleep(every_s)
            with contextlib.suppress(OSError):
                self.reopen_if_moved()
