"""Instances as local subprocesses on free 127.0.0.1 ports (the embedded default).

The worker binds its own socket on port 0 and writes the port the kernel gave it to
`<home>/instances/<id>.port`; `launch` waits for that file, so no other process can take the
port between its choice and its use. A worker that exits first, or does not report a port
within `port_timeout_s`, is a failed launch (`SluiceError`), and nothing of it is left running.

A `command` instance (a server Sluice did not write) gets its port from the runtime instead
(`runtime.command`), runs with `SLUICE_INSTANCE_ID` and `SLUICE_STOP_SIGNAL` in its
environment, and is stopped with its own stop signal.

Either kind inherits from Sluice's environment only what a model server needs
(`runtime.environment`: an allow-list), never a key or token, plus what the runtime and the
spec set for it.

Each worker runs in its own session (process group) so a Ctrl-C on `sluice up` reaches only
Sluice, which then drains instances in order instead of having them die mid-request. Output
goes to `<home>/instances/<id>.log`, which the worker re-opens when housekeeping renames it
(rotation: `sluice.worker.logfile`; a command server cannot, so its log rotates by copy and
truncate). After a crash of Sluice, `adopt` recognises a surviving worker by its pid and the
instance id on its command line (a command server: in its environment); anything else is not
ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from sluice.core import SluiceError
from sluice.runtime.base import CommandLaunch, InstanceHandle, LaunchRequest
from sluice.runtime.command import pick_port, rendered, wait_listening
from sluice.runtime.environment import ALWAYS_WITHHELD, instance_environment

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
        port_picker: Callable[[str], int] = pick_port,
        die_with_parent: bool = False,
    ):
        """`port_picker`: chooses a command server's port on the host (`pick_port`).
        `die_with_parent`: the kernel kills each instance when the process that started it
        dies (Linux), and it starts with no signal blocked; for a host process that owns its
        instances (a Ray actor), unlike `sluice up`, whose instances outlive a crash to be
        adopted."""
        self._dir = home / "instances"
        self._pick_port = port_picker
        self._host = host
        self._python = python
        self._port_timeout_s = port_timeout_s
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._stop_signals: dict[str, signal.Signals] = {}
        self._preexec = _death_signal() if die_with_parent and sys.platform == "linux" else None

    async def launch(self, req: LaunchRequest) -> InstanceHandle:
        """Start the worker and return once it listens; SluiceError if it never does."""
        self._dir.mkdir(parents=True, exist_ok=True)
        if req.command is not None:
            return await self._launch_command(req, req.command)
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
        env = {**inherited_env(req), "PYTHONUNBUFFERED": "1", **req.env}
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
                preexec_fn=self._preexec,
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

    async def _launch_command(self, req: LaunchRequest, cmd: CommandLaunch) -> InstanceHandle:
        """Start a server from its argv template on a port picked here; return once its
        process group listens on it (`runtime.command`)."""
        port = self._pick_port(self._host)
        argv, extra = rendered(cmd, self._host, port)
        env = {
            **inherited_env(req),
            "PYTHONUNBUFFERED": "1",
            **extra,
            **req.env,
            "SLUICE_INSTANCE_ID": req.instance_id,
            "SLUICE_STOP_SIGNAL": cmd.stop_signal,
        }
        log_path = self._dir / f"{req.instance_id}.log"
        with open(log_path, "ab") as log:
            log.write(f"sluice: starting {argv[0]} on {self._host}:{port}\n".encode())
            log.flush()
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    preexec_fn=self._preexec,
                )
            except OSError as exc:  # not found, not executable: it never ran
                why = f"cannot run {argv[0]!r}: {exc.strerror or exc}"
                log.write(f"sluice: {why}\n".encode())
                raise SluiceError(
                    f"{why}; see {log_path}", instance_id=req.instance_id, log=str(log_path)
                ) from None
        self._children[req.instance_id] = proc
        self._stop_signals[req.instance_id] = _signal_named(cmd.stop_signal)
        try:
            await wait_listening(
                req.instance_id, proc, self._host, port, cmd.listen_timeout_s, str(log_path)
            )
        except BaseException:  # a failure, or the launch was cancelled: leave nothing running
            self._kill(req.instance_id, proc)
            raise
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
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # Also when the leader is gone: a server's forked workers may still hold the group.
            # The leader was reaped moments ago, and pids are handed out in turn, so its id
            # cannot belong to a new process group yet.
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        self._children.pop(instance_id, None)
        self._stop_signals.pop(instance_id, None)

    async def stop(self, handle: InstanceHandle, grace_s: float) -> int | None:
        """The instance's stop signal (SIGTERM unless its spec says otherwise) to its process
        group, SIGKILL after `grace_s`; then whatever of the group is left is killed too."""
        if handle.pid is None:
            return None
        self._signal(handle, self._stop_signal(handle))
        deadline = asyncio.get_running_loop().time() + grace_s
        while (code := self.exit_code(handle)) is None:
            if asyncio.get_running_loop().time() >= deadline:
                self._signal(handle, signal.SIGKILL)
                await asyncio.sleep(0.05)
                deadline = float("inf")
                continue
            await asyncio.sleep(0.05)
        child = self._children.get(handle.instance_id)
        if child is not None:
            self._kill(handle.instance_id, child)
        return code

    def _stop_signal(self, handle: InstanceHandle) -> signal.Signals:
        known = self._stop_signals.get(handle.instance_id)
        if known is not None:
            return known
        assert handle.pid is not None  # an adopted server says it in its environment
        return _signal_named(_environ(handle.pid).get(b"SLUICE_STOP_SIGNAL", b"").decode())

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
    """True if `pid` is alive, not a zombie, and is the worker (or command server, or one of
    its processes) of `instance_id`."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        return False
    if b"sluice.worker" in cmdline and f'"instance_id": "{instance_id}"'.encode() in cmdline:
        return True
    return _environ(pid).get(b"SLUICE_INSTANCE_ID") == instance_id.encode()


def inherited_env(req: LaunchRequest) -> dict[str, str]:
    """What of Sluice's environment the instance starts from: only what a model server
    needs (`runtime.environment`), never a tenant key, drill key, token or other `SLUICE_*`
    secret; a third-party server (or a model's code) logs, dumps or forwards its
    environment, so a key it never needed must not be in it."""
    return instance_environment(os.environ, ALWAYS_WITHHELD | req.withheld_env)


def _environ(pid: int) -> dict[bytes, bytes]:
    """The environment `pid` started with ({} if unreadable: not ours, or gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def _signal_named(name: str) -> signal.Signals:
    """SIGTERM for an unknown or empty name (the spec allows only real ones)."""
    return getattr(signal, name, signal.SIGTERM) if name.startswith("SIG") else signal.SIGTERM


def _death_signal() -> Callable[[], None]:
    """What a child runs before exec so the kernel SIGKILLs it once the thread that forked
    it exits (prctl PR_SET_PDEATHSIG), with no signal blocked (a host's thread may block
    some, e.g. a Ray actor's SIGINT, and a child inherits the mask); bound here, since a
    forked child must not import."""
    import ctypes

    pr_set_pdeathsig = 1
    prctl = functools.partial(ctypes.CDLL(None).prctl, pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)

    def setup() -> None:
        prctl()
        signal.pthread_sigmask(signal.SIG_SETMASK, ())

    return setup


def _read_port(path: Path) -> int | None:
    """The port in a worker's port file; None while it is not there (or not yet whole)."""
    try:
        port = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None
