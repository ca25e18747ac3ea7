"""LocalRuntime running servers Sluice did not write (`LaunchRequest.command`): the port it
picks reaches the server through the argv template, the launch returns once the server's
own processes listen there, and every way a command goes wrong is a failed launch that says
what happened and leaves nothing running."""

from __future__ import annotations

import asyncio
import socket
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from sluice.core import SluiceError
from sluice.runtime import CommandLaunch, InstanceHandle, LaunchRequest, LocalRuntime
from sluice.runtime.command import pick_port
from sluice.runtime.local import pid_runs_instance
from tests.integration.test_local_runtime import group_members, processes_of

STUB = str(Path(__file__).parents[1] / "e2e" / "openai_stub.py")
STUB_ARGV = (sys.executable, STUB, "--host", "{host}", "--port", "{port}", "--model", "{model}")

SIGNAL_ECHO = """
import signal, socket, sys
s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()
def bye(sig, _):
    print("got", signal.Signals(sig).name, flush=True); sys.exit(0)
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, bye)
print("listening", flush=True)
signal.pause()
"""


def new_id() -> str:
    return f"cmd-{uuid.uuid4().hex[:8]}"


def command(
    iid: str,
    argv: tuple[str, ...] = STUB_ARGV,
    *,
    env: dict[str, str] | None = None,
    stop_signal: str = "SIGTERM",
    listen_timeout_s: float = 20.0,
    devices: str = "",
) -> LaunchRequest:
    launch = CommandLaunch(
        argv,
        {"model": "m-stub", "model_path": "/models/x", "gpu_ids": devices},
        env or {},
        stop_signal,
        listen_timeout_s,
    )
    pinned = {"CUDA_VISIBLE_DEVICES": devices} if devices else {}
    return LaunchRequest(iid, "grp", {}, pinned, command=launch)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


async def launch_failure(rt: LocalRuntime, req: LaunchRequest) -> SluiceError:
    with pytest.raises(SluiceError) as caught:
        await rt.launch(req)
    assert processes_of(req.instance_id) == []  # nothing of it is left running
    return caught.value


def test_a_command_gets_its_port_devices_and_environment_and_stops_with_its_group(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        rt = LocalRuntime(tmp_path)
        iid = new_id()
        req = command(iid, env={"STUB_PORT_IS": "{port}", "SERVED": "{model}"}, devices="2,3")
        handle = await rt.launch(req)
        try:
            async with httpx.AsyncClient(trust_env=False) as http:
                r = await http.get(handle.url + "/v1/models")
            assert r.json()["data"][0]["id"] == "m-stub"  # {model} reached the server
            env = environ_of(handle.pid or 0)
            assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
            assert env["STUB_PORT_IS"] == str(handle.port) and env["SERVED"] == "m-stub"
            assert env["SLUICE_INSTANCE_ID"] == iid
            assert pid_runs_instance(handle.pid or 0, iid)
            # a restarted Sluice knows the server by the id in its environment
            assert LocalRuntime(tmp_path).adopt(handle)
            assert not LocalRuntime(tmp_path).adopt(InstanceHandle("cmd-other", "h", 1, handle.pid))
        finally:
            code = await rt.stop(handle, grace_s=5)
        assert code == -15 and processes_of(iid) == []
        log = (tmp_path / "instances" / f"{iid}.log").read_text()
        assert f"starting {sys.executable} on 127.0.0.1:{handle.port}" in log
        assert "GET /v1/models" in log  # the server's own output is captured

    asyncio.run(run())


def test_a_command_inherits_no_secret_of_sluices_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Servers log and dump their environment: keys the spec reads from Sluice's (tenants',
    endpoints'), a drill's key and the CLI's token must not be in it; what a model server
    needs (PATH, HF_HOME...) is."""
    monkeypatch.setenv("TENANT_KEYS", "sk-tenant-secret-0a312270ec024a22")
    monkeypatch.setenv("SLUICE_TOKEN", "slc_secret")
    # the README's `sluice up` example
    monkeypatch.setenv("SLUICE_DRILL_KEY", "sk-ops-c391959605db2757")
    monkeypatch.setenv("HF_HOME", "/models/cache")

    async def run() -> None:
        rt = LocalRuntime(tmp_path)
        req = replace(command(new_id()), withheld_env=frozenset({"TENANT_KEYS"}))
        handle = await rt.launch(req)
        try:
            env = environ_of(handle.pid or 0)
        finally:
            await rt.stop(handle, grace_s=5)
        assert "TENANT_KEYS" not in env and "SLUICE_TOKEN" not in env
        assert "SLUICE_DRILL_KEY" not in env
        assert "sk-ops-c391959605db2757" not in "\0".join(env.values())
        assert env["HF_HOME"] == "/models/cache" and "PATH" in env

    asyncio.run(run())


def test_the_stop_signal_is_the_commands_own_and_forked_workers_go_too(tmp_path: Path) -> None:
    async def run() -> None:
        rt = LocalRuntime(tmp_path)
        iid = new_id()
        script = f'sleep 300 & exec {sys.executable} -c \'{SIGNAL_ECHO}\' "$0" "$1"'
        handle = await rt.launch(
            command(iid, ("sh", "-c", script, "{host}", "{port}"), stop_signal="SIGINT")
        )
        assert handle.pid is not None
        assert len(group_members(handle.pid)) == 2  # the server and the worker it forked
        assert await rt.stop(handle, grace_s=5) == 0
        assert "got SIGINT" in (tmp_path / "instances" / f"{iid}.log").read_text()
        # the forked `sleep` did not outlive it (SIGKILL is sent to the group; it takes the
        # kernel a moment to end a process, so look for up to 2 s)
        for _ in range(40):
            if not group_members(handle.pid):
                break
            await asyncio.sleep(0.05)
        assert group_members(handle.pid) == []

    asyncio.run(run())


def test_a_command_that_exits_at_once_is_a_failed_launch_with_its_code(tmp_path: Path) -> None:
    async def run() -> None:
        rt = LocalRuntime(tmp_path)
        iid = new_id()
        argv = (
            sys.executable,
            "-c",
            "import sys; print('fatal: no model at', sys.argv[1]); sys.exit(3)",
            "{port}",
        )
        err = await launch_failure(rt, command(iid, argv))
        assert "exited with code 3 before it listened" in err.message
        assert "fatal: no model at" in (tmp_path / "instances" / f"{iid}.log").read_text()

    asyncio.run(run())


def test_a_program_that_does_not_exist_says_so_in_the_error_and_the_log(tmp_path: Path) -> None:
    async def run() -> None:
        rt = LocalRuntime(tmp_path)
        iid = new_id()
        err = await launch_failure(rt, command(iid, ("/nonexistent/vllm", "--port", "{port}")))
        assert "cannot run '/nonexistent/vllm'" in err.message
        assert "cannot run" in (tmp_path / "instances" / f"{iid}.log").read_text()

    asyncio.run(run())


def test_a_server_on_the_wrong_port_fails_naming_the_port_it_took(tmp_path: Path) -> None:
    async def run() -> None:
        rt = LocalRuntime(tmp_path)
        iid = new_id()
        wrong = (sys.executable, STUB, "--host", "{host}", "--port", "0", "--model", "m")
        err = await launch_failure(rt, command(iid, wrong, env={"P": "{port}"}, listen_timeout_s=3))
        assert "did not listen on 127.0.0.1:" in err.message
        assert "it listens on 127.0.0.1:" in err.message  # the port it bound instead

    asyncio.run(run())


def test_a_server_that_never_listens_names_no_port(tmp_path: Path) -> None:
    async def run() -> None:
        rt = LocalRuntime(tmp_path)
        err = await launch_failure(
            rt, command(new_id(), ("sleep", "30", "{port}"), listen_timeout_s=1)
        )
        assert "within 1s; it listens on no TCP port" in err.message

    asyncio.run(run())


def test_a_stranger_on_the_picked_port_is_not_taken_for_the_server(tmp_path: Path) -> None:
    """The bind-then-close race lost: another program took the port before the server."""
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        taken = stranger.getsockname()[1]

        async def run() -> None:
            rt = LocalRuntime(tmp_path, port_picker=lambda host: taken)
            script = f"exec {sys.executable} -c 'import time; time.sleep(30)' {{port}}"
            err = await launch_failure(rt, command(new_id(), ("sh", "-c", script)))
            assert f"port {taken} answers, but not from the server" in err.message

        asyncio.run(run())


def test_pick_port_gives_a_port_nothing_listens_on() -> None:
    port = pick_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free: a fresh bind succeeds
