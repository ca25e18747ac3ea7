"""The state directory of one `sluice up`: kept private to its user (0700, files 0600), and
held by one process at a time through an OS lock that a crash releases."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import IO

from sluice.core import Conflict

__all__ = ["hold_state_dir"]

_LOCK_FILE = "sluice.lock"


def hold_state_dir(home: Path, control_file: Path) -> IO[str]:
    """Make `home` private and lock it for this process; the lock lasts while the returned
    file stays open (closing it, or dying, releases it). A second `sluice up` on the same
    directory gets a Conflict naming the running one, before it touches anything."""
    os.umask(0o077)  # everything this process creates: 0600 files, 0700 directories
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    lock = open(home / _LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 (held until exit)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise Conflict(
            f"sluice is already running on state directory {home} ({_describe(control_file)}); "
            "stop it first, or use another --home / $SLUICE_HOME",
            home=str(home),
        ) from None
    _make_private(home)
    return lock


def _describe(control_file: Path) -> str:
    try:
        info = json.loads(control_file.read_text())
    except (OSError, ValueError):
        return "still starting"
    return (
        f"pid {info.get('pid')}, endpoint {info.get('endpoint')}, control {info.get('control_url')}"
    )


def _make_private(home: Path) -> None:
    """Files an older version (or another umask) left readable by others: 0600 now."""
    for path in home.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_symlink():
                continue
            path.chmod(0o700 if path.is_dir() else 0o600)
