"""Instances as local subprocesses on free 127.0.0.1 ports (the embedded default).

Each worker runs in its own session (process group) so a Ctrl-C on `sluice up` reaches only
Sluice, which then drains instances in order instead of having them die mid-request. Output
goes to `<home>/instances/<id>.log`. After a crash of Sluice, `adopt` recognises a surviving
worker by its pid and the instance id on its command line; anything else is not ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from sluice.runtime.base import InstanceHandle, LaunchRequest

__all__ = ["LocalRuntime", "pid_runs_instance"]


class LocalRuntime:
    def __init__(self, home: Path, host: str = "127.0.0.1", python: str = sys.executable):
        self._dir = home / "instances"
        self._host = host
        self._python = python
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    async def launch(self, req: LaunchRequest) -> InstanceHandle:
        self._dir.mkdir(parents=True, exist_ok=True)
        port = _free_port(self._host)
        config = {**req.worker_config, "host": self._host, "port": port}
        cmd = [self._python, "-m", "sluice.worker", "--config-json", json.dumps(config)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **req.env}
        log_path = self._dir / f"{req.instance_id}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        self._children[req.instance_id] = proc
        return InstanceHandle(req.instance_id, self._host, port, proc.pid)

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        if handle.pid is None:
            return None
        self._signal(handle, signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + grace_s
        while (code := self.exit_code(handle)) is None:
            if asyncio.get_running_loop().time() >= deadline:
                self._signal(handle, signal.SIGKILL)
                await asyncio.sleep(0.05)
                deadline = float("inf")
                continue
            await asyncio.sleep(0.05)
        self._children.pop(handle.instance_id, None)
        return code

    def exit_code(self, handle: InstanceHandle) -> int | None:
        child = self._children.get(handle.instance_id)
        if child is not None:
            return child.poll()
        if handle.pid is None:
            return None
        # An adopted worker is not our child: we cannot wait for it, only look.
        return None if pid_runs_instance(handle.pid, handle.instance_id) else -1

    def adopt(self, handle: InstanceHandle) -> bool:
        return handle.pid is not None and pid_runs_instance(handle.pid, handle.instance_id)

    def log_path(self, instance_id: str) -> str | None:
        return str(self._dir / f"{instance_id}.log")

    def _signal(self, handle: InstanceHandle, sig: signal.Signals) -> None:
        assert handle.pid is not None
        if not pid_runs_instance(handle.pid, handle.instance_id) and (
            handle.instance_id not in self._children
        ):
            return  # gone, or the pid now belongs to someone else: never signal a stranger
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.pid, sig)


def pid_runs_instance(pid: int, instance_id: str) -> bool:
    """True if `pid` is alive, not a zombie, and is the worker of `instance_id`."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    return b"sluice.worker" in cmdline and f'"instance_id": "{instance_id}"'.encode() in cmdline


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
