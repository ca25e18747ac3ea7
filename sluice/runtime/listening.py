"""Who listens on which TCP port, read from Linux's /proc (no `ss` or `lsof` needed).

A launched server runs in its own process group; `group_listens` says whether a process of
that group (the server may fork workers) holds the listening socket of a port, so a port
answering because some stranger took it is not mistaken for our server, and
`group_listening` names the ports a server did listen on when it never took its own.
Where /proc cannot be read (not Linux), both answer None: the caller falls back to
"something answers on the port".
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["group_listening", "group_listens", "group_pids"]

_PROC = Path("/proc")
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


def group_pids(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (zombies excluded)."""
    pids: list[int] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        # after "pid (comm)": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            pids.append(int(entry.name))
    return pids


def _listening_sockets() -> dict[int, tuple[str, int]] | None:
    """Socket inode -> (address, port) of every listening TCP socket (v4 and v6)."""
    out: dict[int, tuple[str, int]] = {}
    found = False
    for name in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != _LISTEN:
                continue
            addr, _, port = cols[1].partition(":")
            out[int(cols[9])] = (_address(addr), int(port, 16))
    return out if found else None


def _address(hex_addr: str) -> str:
    """/proc/net/tcp's little-endian hex address, readable (v4 dotted; v6 as hex)."""
    if len(hex_addr) == 8:
        return ".".join(str(int(hex_addr[i : i + 2], 16)) for i in (6, 4, 2, 0))
    return hex_addr.lower()


def _socket_inodes(pids: list[int]) -> set[int]:
    inodes: set[int] = set()
    for pid in pids:
        fd_dir = _PROC / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in names:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def group_listening(pgid: int) -> list[tuple[str, int]] | None:
    """(address, port) of every TCP socket the process group listens on, sorted."""
    sockets = _listening_sockets()
    if sockets is None:
        return None
    mine = _socket_inodes(group_pids(pgid))
    return sorted({sockets[i] for i in mine if i in sockets}, key=lambda a: (a[1], a[0]))


def group_listens(pgid: int, port: int) -> bool | None:
    """True if a process of the group listens on `port`; None if /proc cannot tell."""
    ports = group_listening(pgid)
    return None if ports is None else any(p == port for _, p in ports)
