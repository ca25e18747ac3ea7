"""Tenant keys a spec names by source (`api_keys_env`, `api_keys_file`), read on the
controller's machine: the I/O edge of the pure `spec.secrets.resolve_key_sources`.

A secret file is opened only if it is one: `read_secret_file` takes an absolute path to a
regular file of at most `SECRET_FILE_MAX_BYTES` and nothing else. A named pipe, a device
(`/dev/zero`), a directory or a socket is refused without being read, so the controller
never waits on a pipe with no writer nor fills its memory from a device; what the file holds
is then checked line by line by the pure code (each line a key of the required form).

Symlinks are followed: a Kubernetes secret volume is a chain of them
(`keys -> ..data/keys -> ..2024_05_01/keys`), so refusing them (O_NOFOLLOW) would refuse the
usual way secrets reach a pod. What decides is what the path leads to, checked with `stat`
before opening and again with `fstat` on the open descriptor (the path may have been swapped
in between).
"""

from __future__ import annotations

import os
import stat

from sluice.spec import LoadedSpec, PlatformSpec
from sluice.spec.keys import SECRET_FILE_MAX_BYTES, SecretFileError
from sluice.spec.secrets import resolve_key_sources

__all__ = ["SECRET_FILE_MAX_BYTES", "read_secret_file", "spec_with_key_sources"]

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
"""O_NONBLOCK: opening a FIFO returns at once (a blocking open waits for a writer), and a
pseudo-file that honours it (`/proc/kmsg`) answers EAGAIN instead of waiting for data.
O_NOCTTY: a terminal named by mistake does not become Sluice's controlling terminal."""


def spec_with_key_sources(loaded: LoadedSpec) -> PlatformSpec:
    """Tenant keys named by `api_keys_env` / `api_keys_file`, read here on the controller's
    machine (the spec names the source, never holds the keys) and kept as digests.

    The controller calls this on its event loop (at `apply` and at start). That is safe only
    because each file read is `read_secret_file`: no open or read can block (a pipe or
    device is refused before any read) and at most `SECRET_FILE_MAX_BYTES` are read per file
    from the local disk. Raises SpecError naming the field (`tenants[i].api_keys_file`), why
    and the fix."""
    return resolve_key_sources(
        loaded.spec,
        os.environ,
        read_secret_file,
        text=loaded.text,
        source=loaded.source,
    )


def read_secret_file(path: str, limit: int = SECRET_FILE_MAX_BYTES) -> str:
    """The UTF-8 text of the regular file at the absolute `path`, at most `limit` bytes.

    Raises `SecretFileError` (an OSError whose `strerror` says what the path is and whose
    `fix` says what to do) for a relative path, anything that is not a regular file (after
    following symlinks) or a file over `limit`; OSError for a missing or unreadable one;
    UnicodeDecodeError for text that is not UTF-8. Never blocks: the file is opened
    non-blocking and at most `limit + 1` bytes are read."""
    if not path.startswith("/"):
        raise SecretFileError(
            "is not an absolute path",
            "write its absolute path (e.g. /etc/sluice/tenant.keys): it is read on the "
            "controller's machine, not relative to where Sluice was started",
        )
    before = os.stat(path)  # a pipe or device is refused before it is even opened
    _check_regular(before.st_mode, limit, before.st_size)
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)  # what was opened, whatever the path names now
        _check_regular(st.st_mode, limit, st.st_size)
        data = bytearray()
        while len(data) <= limit:  # pseudo-files say size 0: the bound is the read's own
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _too_large(limit)
    return data.decode("utf-8")


def _check_regular(mode: int, limit: int, size: int) -> None:
    if not stat.S_ISREG(mode):
        raise SecretFileError(
            f"is {_kind(mode)}, not a regular file",
            "name a regular file instead (a symlink to one is fine), one key per line",
        )
    if size > limit:
        raise _too_large(limit)


def _too_large(limit: int) -> SecretFileError:
    return SecretFileError(
        f"is larger than {limit // 1024} KiB, which no keys file is (a few hundred keys at most)",
        "name the keys file instead, one key per line",
    )


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
