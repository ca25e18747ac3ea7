"""Launching a server Sluice did not write: its port, its argv, waiting until it listens.

The port: such a server cannot report a port it picked, so the runtime picks one first:
bind port 0 on the host, read the port the kernel chose, close, and pass it as `{port}`.
Between the close and the server's own bind another process could take that port (the
kernel hands out ephemeral ports in turn, so this is rare). Both outcomes are caught: the
server fails to bind and exits (a failed launch), or the port answers from a process that is
not in the server's process group (`listening.group_listens`), also a failed launch with
that said; either way the controller replaces the instance. Holding the socket open instead
(SO_REUSEPORT) would need the server's cooperation, which a server that knows nothing of
Sluice cannot give.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
from collections.abc import Mapping

from sluice.core import SluiceError
from sluice.core.argv import render
from sluice.runtime.base import CommandLaunch
from sluice.runtime.listening import group_listening, group_listens

__all__ = ["pick_port", "rendered", "wait_listening"]

_CONNECT_TIMEOUT_S = 0.5
_POLL_S = 0.1


def pick_port(host: str) -> int:
    """A port free on `host` now (see the module docstring for the race this leaves)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def rendered(cmd: CommandLaunch, host: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The argv and the extra environment of `cmd` with every placeholder filled."""
    values: Mapping[str, str] = {**cmd.values, "host": host, "port": str(port)}
    argv = [render(a, values) for a in cmd.argv]
    env = {k: render(v, values) for k, v in cmd.env.items()}
    return argv, env


async def _answers(host: str, port: int) -> bool:
    try:
        async with asyncio.timeout(_CONNECT_TIMEOUT_S):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def wait_listening(
    instance_id: str,
    proc: subprocess.Popen[bytes],
    host: str,
    port: int,
    timeout_s: float,
    log: str,
) -> None:
    """Return once `proc`'s process group listens on `port`; SluiceError (saying what it
    did instead) if it exits, if a stranger holds the port, or after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            raise SluiceError(
                f"server of {instance_id} exited with code {code} before it listened on port "
                f"{port}; see {log}",
                instance_id=instance_id,
                exit_code=code,
                log=log,
            )
        if await _answers(host, port):
            if group_listens(proc.pid, port) is False:
                raise SluiceError(
                    f"port {port} answers, but not from the server of {instance_id}: another "
                    "program took it between Sluice picking it and the server binding it",
                    instance_id=instance_id,
                    log=log,
                )
            return
        if loop.time() >= deadline:
            seen = group_listening(proc.pid)
            instead = (
                ""
                if seen is None
                else "; it listens on no TCP port"
                if not seen
                else "; it listens on " + ", ".join(f"{a}:{p}" for a, p in seen)
            )
            raise SluiceError(
                f"server of {instance_id} did not listen on {host}:{port} within "
                f"{timeout_s:g}s{instead} (does its argv pass {{port}} to the right "
                f"option?); see {log}",
                instance_id=instance_id,
                log=log,
            )
        await asyncio.sleep(_POLL_S)
