"""The state directory of one `sluice up`: kept private to its user (0700, files 0600), and
held by one process at a time through an OS lock that a crash releases. A directory this
process cannot write (a read-only mount, another user's, a full disk) stops it at once with
one line naming the directory and the fix (`StoreUnavailable`, exit 7), never a traceback."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
from pathlib import Path
from typing import IO

from sluice.core import Conflict, StoreUnavailable

__all__ = ["hold_state_dir"]

_LOCK_FILE = "sluice.lock"


def hold_state_dir(home: Path, control_file: Path) -> IO[str]:
    """Make `home` private and lock it for this process; the lock lasts while the returned
    file stays open (closing it, or dying, releases it). A second `sluice up` on the same
    directory gets a Conflict naming the running one, before it touches anything."""
    os.umask(0o077)  # everything this process creates: 0600 files, 0700 directories
    try:
        home.mkdir(parents=True, exist_ok=True)
        home.chmod(0o700)
        lock = open(home / _LOCK_FILE, "a+", encoding="utf-8")  # noqa: SIM115 (held until exit)
    except OSError as exc:
        raise _unwritable(home, exc) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise Conflict(
            f"sluice is already running on state directory {home} ({_describe(control_file)}); "
            "stop it first, or use another --home / $SLUICE_HOME",
            home=str(home),
        ) from None
    try:
        _probe_write(home)
    except OSError as exc:
        lock.close()
        raise _unwritable(home, exc) from None
    _make_private(home)
    return lock


def _probe_write(home: Path) -> None:
    """Create, write and remove a file in `home`: a directory that looks fine but cannot
    take a byte (a full disk, a lock file left from before it turned read-only) fails here,
    not halfway through the start."""
    probe = home / f".write-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"sluice\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def _unwritable(home: Path, exc: OSError) -> StoreUnavailable:
    """The one line a state directory this process cannot write gets."""
    why = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        fix = "free space on its disk"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = (
            "make it writable by this user (remount read-write, or chown it), or point "
            "--home / $SLUICE_HOME at a writable directory"
        )
    else:
        fix = "fix it, or point --home / $SLUICE_HOME at another directory"
    return StoreUnavailable(
        f"the state directory {home} cannot be written ({why}): {fix}",
        home=str(home),
        reason=why,
    )


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
