"""Instances as local subprocesses on free 127.0.0.1 ports (the embedded default).

The worker binds its own socket on port 0 and writes the port the kernel gave it to
`<home>/instances/<id>.port`; `launch` waits for that file, so no other process can take the
port between its choice and its use. A worker that exits first, or does not report a port
within `port_timeout_s`, is a failed launch (`SluiceError`), and nothing of it is left running.

Each worker runs in its own session (process group) so a Ctrl-C on `sluice up` reaches only
Sluice, which then drains instances in order instead of having them die mid-request. Output
goes to `<home>/instances/<id>.log`, which the worker re-opens when housekeeping renames it
(rotation: `sluice.worker.logfile`). After a crash of Sluice, `adopt` recognises a surviving
worker by its pid and the instance id on its command line; anything else is not ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sluice.core import SluiceError
from sluice.runtime.base import InstanceHandle, LaunchRequest

__all__ = ["PORT_TIMEOUT_S", "LocalRuntime", "pid_runs_instance"]

PORT_TIMEOUT_S = 30.0
"""How long a new worker may take to bind its socket and report the port (normally < 1 s)."""
_PORT_POLL_S = 0.02


class LocalRuntime:
    def __init__(
        self,
        home: Path,
        host: str = "127.0.0.1",
        python: str = sys.executable,
        port_timeout_s: float = PORT_TIMEOUT_S,
    ):
        self._dir = home / "instances"
        self._host = host
        self._python = python
        self._port_timeout_s = port_timeout_s
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    async def launch(self, req: LaunchRequest) -> InstanceHandle:
        """Start the worker and return once it listens; SluiceError if it never does."""
        self._dir.mkdir(parents=True, exist_ok=True)
        port_file = self._dir / f"{req.instance_id}.port"
        port_file.unlink(missing_ok=True)  # a stale one from an earlier run must not be read
        log_path = self._dir / f"{req.instance_id}.log"
        config = {
            **req.worker_config,
            "host": self._host,
            "port": 0,
            "port_file": str(port_file),
            "log_file": str(log_path),  # it follows the file across rotation by rename
        }
        cmd = [self._python, "-m", "sluice.worker", "--config-json", json.dumps(config)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **req.env}
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
        try:
            port = await self._wait_for_port(req.instance_id, proc, port_file, log_path)
        except BaseException:  # a failure, or the launch was cancelled: leave nothing running
            self._kill(req.instance_id, proc)
            raise
        finally:
            port_file.unlink(missing_ok=True)
        return InstanceHandle(req.instance_id, self._host, port, proc.pid)

    async def _wait_for_port(
        self, instance_id: str, proc: subprocess.Popen[bytes], port_file: Path, log_path: Path
    ) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._port_timeout_s
        while True:
            port = _read_port(port_file)
            if port is not None:
                return port
            code = proc.poll()
            if code is not None:
                raise SluiceError(
                    f"worker {instance_id} exited with code {code} before it listened on a "
                    f"port; see {log_path}",
                    instance_id=instance_id,
                    exit_code=code,
                    log=str(log_path),
                )
            if loop.time() >= deadline:
                raise SluiceError(
                    f"worker {instance_id} did not report a listening port within "
                    f"{self._port_timeout_s:g}s; killed it; see {log_path}",
                    instance_id=instance_id,
                    log=str(log_path),
                )
            await asyncio.sleep(_PORT_POLL_S)

    def _kill(self, instance_id: str, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker's whole process group and reap it (it is our child)."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self._children.pop(instance_id, None)

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


def _read_port(path: Path) -> int | None:
    """The port in a worker's port file; None while it is not there (or not yet whole)."""
    try:
        port = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None
