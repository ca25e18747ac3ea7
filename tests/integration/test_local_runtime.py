"""LocalRuntime with real `python -m sluice.worker` subprocesses: the worker binds port 0
itself and reports the port it got, so no other process can take it in between."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from sluice.core import SluiceError
from sluice.runtime import InstanceHandle, LaunchRequest, LocalRuntime
from sluice.runtime.local import pid_runs_instance
from sluice.worker import WorkerConfig

START_TIMEOUT_S = 20.0
SIM = {"runtime": "sim", "version": "v1", "sim": {"service_time": {"kind": "fixed", "seconds": 0}}}


def request(instance_id: str, **config: object) -> LaunchRequest:
    worker_config = {"instance_id": instance_id, "group": "grp", "models": {"m": SIM}} | config
    return LaunchRequest(instance_id, "grp", worker_config, {})


def new_id() -> str:
    return f"grp-{uuid.uuid4().hex[:8]}"


def processes_of(instance_id: str) -> list[int]:
    """Live (non-zombie) processes whose command line names `instance_id`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and pid_runs_instance(int(proc.name), instance_id):
            found.append(int(proc.name))
    return found


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(proc.name))
    return found


def group_gone(pgid: int, within_s: float = 5.0) -> bool:
    """True once process group `pgid` has no live member (SIGKILL reaches a grandchild
    asynchronously: the runtime reaps its child, not the child's children)."""
    deadline = time.monotonic() + within_s
    while group_members(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


async def health(handle: InstanceHandle) -> dict[str, object]:
    """/health of the worker behind `handle`, polled until it answers 200."""
    deadline = time.monotonic() + START_TIMEOUT_S
    async with httpx.AsyncClient(trust_env=False) as client:
        while True:
            try:
                r = await client.get(f"{handle.url}/health", timeout=5)
                if r.status_code == 200:
                    return dict(r.json())
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            assert time.monotonic() < deadline, f"/health not 200 at {handle.url}"
            await asyncio.sleep(0.05)


def fake_python(tmp_path: Path) -> Path:
    """Stands in for the interpreter: a process that runs as `... -m sluice.worker ...` but
    never binds a port, with a child in its process group; it writes its pid to $PID_FILE."""
    script = tmp_path / "fake-python"
    script.write_text('#!/bin/sh\necho $$ > "$PID_FILE"\nsleep 60 &\nwait\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


async def wait_for_file(path: Path, timeout: float = START_TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)
    return path.read_text().strip()


@pytest.mark.asyncio
async def test_launch_returns_the_port_the_worker_listens_on(tmp_path: Path) -> None:
    runtime = LocalRuntime(tmp_path)
    first_id, second_id = new_id(), new_id()
    # A stale port file from an earlier run, naming a port someone else listens on.
    stranger = socket.create_server(("127.0.0.1", 0))
    stale_port = stranger.getsockname()[1]
    (tmp_path / "instances").mkdir()
    (tmp_path / "instances" / f"{first_id}.port").write_text(f"{stale_port}\n")
    handles: list[InstanceHandle] = []
    try:
        for instance_id in (first_id, second_id):
            handle = await runtime.launch(request(instance_id))
            handles.append(handle)
            # Returned once the worker listens: a connection is accepted (queued) at once.
            socket.create_connection((handle.host, handle.port), timeout=2).close()
            assert not (tmp_path / "instances" / f"{instance_id}.port").exists()
        first, second = handles
        assert (first.host, second.host) == ("127.0.0.1", "127.0.0.1")
        assert first.port != second.port
        assert stale_port not in (first.port, second.port)
        assert first.pid is not None and pid_runs_instance(first.pid, first_id)
        assert (await health(first))["instance_id"] == first_id
        assert (await health(second))["instance_id"] == second_id
        assert runtime.exit_code(first) is None
    finally:
        stranger.close()
        codes = [await runtime.stop(handle, grace_s=10) for handle in handles]
    assert codes == [0, 0]
    assert processes_of(first_id) == [] and processes_of(second_id) == []


@pytest.mark.asyncio
async def test_the_worker_follows_its_log_file_when_rotation_renames_it(tmp_path: Path) -> None:
    runtime = LocalRuntime(tmp_path)
    instance_id = new_id()
    handle = await runtime.launch(request(instance_id))
    log = tmp_path / "instances" / f"{instance_id}.log"
    try:
        assert handle.pid is not None
        fds = [Path(f"/proc/{handle.pid}/fd/{fd}") for fd in (1, 2)]
        assert [fd.readlink() for fd in fds] == [log, log]
        log.rename(log.with_name(f"{log.name}.1"))  # as housekeeping rotates it
        deadline = time.monotonic() + 5
        while [fd.readlink() for fd in fds] != [log, log]:  # (.1 until the worker notices)
            assert time.monotonic() < deadline, [fd.readlink() for fd in fds]
            await asyncio.sleep(0.05)
        assert log.exists()  # nothing but the worker creates it
    finally:
        assert await runtime.stop(handle, grace_s=10) == 0


@pytest.mark.asyncio
async def test_a_worker_that_exits_before_listening_fails_the_launch_promptly(
    tmp_path: Path,
) -> None:
    runtime = LocalRuntime(tmp_path)
    instance_id = new_id()
    bad = request(instance_id, models={})  # invalid: the worker exits 2 before it binds
    started = time.monotonic()
    with pytest.raises(SluiceError, match="exited with code 2") as failed:
        await runtime.launch(bad)
    assert time.monotonic() - started < START_TIMEOUT_S
    assert failed.value.detail["exit_code"] == 2
    log_path = runtime.log_path(instance_id)
    assert log_path is not None and failed.value.detail["log"] == log_path
    assert "invalid config" in Path(log_path).read_text()
    assert not (tmp_path / "instances" / f"{instance_id}.port").exists()
    assert processes_of(instance_id) == []


@pytest.mark.asyncio
async def test_a_worker_that_never_reports_a_port_is_killed_at_the_timeout(
    tmp_path: Path,
) -> None:
    runtime = LocalRuntime(tmp_path, python=str(fake_python(tmp_path)), port_timeout_s=0.5)
    instance_id = new_id()
    pid_file = tmp_path / "fake.pid"
    hung = request(instance_id)
    hung = LaunchRequest(instance_id, "grp", hung.worker_config, {"PID_FILE": str(pid_file)})
    started = time.monotonic()
    with pytest.raises(SluiceError, match=r"did not report a listening port within 0\.5s"):
        await runtime.launch(hung)
    assert time.monotonic() - started < 5
    pid = int(pid_file.read_text())
    assert group_gone(pid), "the worker or its child outlived the failed launch"
    assert processes_of(instance_id) == []


@pytest.mark.asyncio
async def test_a_cancelled_launch_leaves_no_process(tmp_path: Path) -> None:
    runtime = LocalRuntime(tmp_path, python=str(fake_python(tmp_path)))
    instance_id = new_id()
    pid_file = tmp_path / "fake.pid"
    hung = request(instance_id)
    hung = LaunchRequest(instance_id, "grp", hung.worker_config, {"PID_FILE": str(pid_file)})
    launching = asyncio.create_task(runtime.launch(hung))
    pid = int(await wait_for_file(pid_file))
    assert group_members(pid) != []
    launching.cancel()
    with pytest.raises(asyncio.CancelledError):
        await launching
    assert group_gone(pid)
    assert processes_of(instance_id) == []


def test_the_worker_exits_3_when_its_port_is_taken(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        port_file = tmp_path / "w.port"
        config = request(new_id(), host="127.0.0.1", port=port, port_file=str(port_file))
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "sluice.worker",
                "--config-json",
                json.dumps(config.worker_config),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 3, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert not port_file.exists()
    assert list(tmp_path.iterdir()) == []  # no temp file either


def test_worker_config_takes_port_0_and_a_port_file() -> None:
    base = {"instance_id": "i", "group": "g", "models": {"m": SIM}}
    picked = WorkerConfig.model_validate(base | {"port": 0, "port_file": "/tmp/i.port"})
    assert (picked.port, picked.port_file, picked.log_file) == (0, "/tmp/i.port", None)
    assert WorkerConfig.model_validate(base | {"port": 8000}).port_file is None
    for bad in ({"port": -1}, {"port": 65536}, {"port": 0, "port_file": ""}, {"port": 0, "x": 1}):
        with pytest.raises(ValidationError):
            WorkerConfig.model_validate(base | bad)
