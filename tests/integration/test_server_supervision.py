"""The supervisor with servers that know nothing of Sluice (the OpenAI stub as a `command`,
or as an `external` endpoint): readiness from /v1/models, a drain that waits on the
gateway's in-flight count, pinned devices, endpoints going out of routing and back, and a
failed launch whose event carries the server's last log lines."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from sluice.control import EventLog, InstanceSupervisor
from sluice.core import InstanceState, SystemClock
from sluice.runtime import LocalRuntime
from sluice.spec import GroupSpec, PoolSpec, load_spec_text
from sluice.store import Store

STUB = str(Path(__file__).parents[1] / "e2e" / "openai_stub.py")

GROUP = """
pools:
  - {{name: gpu, count: 2, memory_gb: 16, devices: [GPU-a, GPU-b]}}
groups:
  - name: grp
    owner: a@example.com
    business: b
    alert_channel: "#c"
    models:
      m-stub:
{model}
    resources: {{pool: gpu, accelerators: 1, memory_gb: 1}}
    replicas: {replicas}
    warmup: {{requests: 2}}
    health: {{interval_s: 0.3, failure_threshold: 2, timeout_s: 1, startup_timeout_s: {startup}}}
    drain_timeout_s: {drain}
"""

COMMAND = f"""\
        runtime: command
        command:
          argv: [{sys.executable}, {STUB}, --host, "{{host}}", --port, "{{port}}",
                 --model, "{{model}}", --name, "{{gpu_ids}}"{{extra}}]
          stop_grace_s: 1
"""


def platform(
    model: str, replicas: int = 1, startup: float = 20, drain: float = 10
) -> tuple[GroupSpec, PoolSpec]:
    spec = load_spec_text(
        GROUP.format(model=model, replicas=replicas, startup=startup, drain=drain)
    ).spec
    return spec.groups[0], spec.pools[0]


def command(extra: str = "") -> str:
    return COMMAND.replace("{extra}", extra)


@asynccontextmanager
async def supervisor(
    home: Path,
    inflight: Callable[[], dict[str, int]] | None = None,
    environ: dict[str, str] | None = None,
) -> AsyncIterator[tuple[InstanceSupervisor, Store]]:
    with Store.for_home(home) as store:
        clock = SystemClock()
        sup = InstanceSupervisor(
            LocalRuntime(home),
            store,
            clock,
            EventLog(store, clock),
            inflight=inflight,
            environ=environ,
        )
        await sup.start()
        try:
            yield sup, store
        finally:
            await sup.shutdown()


async def until(what: str, pred: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def state(sup: InstanceSupervisor, iid: str) -> InstanceState | None:
    return next((s.state for s in sup.statuses() if s.id == iid), None)


def events(store: Store, kind: str) -> list[Any]:
    return [e for e in store.list_events(limit=500) if e.kind == kind]


def test_command_warms_up_pins_distinct_devices_and_drains_on_the_gateways_count(
    tmp_path: Path,
) -> None:
    counts: dict[str, int] = {}

    async def run() -> None:
        group, pool = platform(command())
        async with supervisor(tmp_path, inflight=lambda: dict(counts)) as (sup, store):
            a = sup.launch(group, group.template(), "test", pool)
            b = sup.launch(group, group.template(), "test", pool)
            await until("both ready", lambda: state(sup, a) is state(sup, b) is InstanceState.READY)
            devices = {s.id: s.labels["devices"] for s in sup.statuses()}
            assert sorted(devices.values()) == ["GPU-a", "GPU-b"]
            for iid in (a, b):  # warm-up reached each server twice before it was READY
                log = (tmp_path / "instances" / f"{iid}.log").read_text()
                assert log.count("POST /v1/chat/completions") == 2
                assert f"stub {devices[iid]}: listening" in log  # {gpu_ids} reached argv
            counts[a] = 3  # the gateway has three requests in flight to `a`
            sup.drain(a, "test drain")
            await asyncio.sleep(2.0)
            assert state(sup, a) is InstanceState.DRAINING  # waits while they run
            counts.pop(a)
            started = time.monotonic()
            await until("a stopped", lambda: state(sup, a) is None, timeout=5)
            assert time.monotonic() - started < 2.0
            assert not events(store, "drain-timeout")
            # the devices of `a` are free again: a new instance gets them
            c = sup.launch(group, group.template(), "test", pool)
            await until("c ready", lambda: state(sup, c) is InstanceState.READY)
            assert {s.id: s.labels["devices"] for s in sup.statuses()}[c] == devices[a]

    asyncio.run(run())


def test_an_instance_waits_for_a_device_instead_of_sharing_one(tmp_path: Path) -> None:
    async def run() -> None:
        group, pool = platform(command())
        async with supervisor(tmp_path, inflight=dict) as (sup, _):
            ids = [sup.launch(group, group.template(), "test", pool) for _ in range(3)]
            await until(
                "two ready", lambda: sum(state(sup, i) is InstanceState.READY for i in ids) == 2
            )
            [waiting] = [s for s in sup.statuses() if s.state is InstanceState.PENDING]
            assert "waiting for devices of pool 'gpu'" in waiting.reason and not waiting.labels
            first = next(i for i in ids if state(sup, i) is InstanceState.READY)
            sup.remove(first, "make room")
            await until(
                "the third placed and ready", lambda: state(sup, waiting.id) is InstanceState.READY
            )

    asyncio.run(run())


def test_a_lent_sleepers_device_takes_a_borrower_last_and_its_wake_waits_for_it(
    tmp_path: Path,
) -> None:
    """A sleeping standby whose units are lent (`lent`) holds no device: a launch takes a free
    device first, then the sleeper's; the sleeper may wake only once that one is gone."""

    async def run() -> None:
        three = GROUP.replace(
            "count: 2, memory_gb: 16, devices: [GPU-a, GPU-b]",
            "count: 3, memory_gb: 16, devices: [GPU-a, GPU-b, GPU-c]",
        )
        spec = load_spec_text(three.format(model=command(), replicas=1, startup=20, drain=1)).spec
        group, pool = spec.groups[0], spec.pools[0]
        async with supervisor(tmp_path, inflight=dict) as (sup, _):

            def devices(iid: str) -> str:
                return next(s.labels.get("devices", "") for s in sup.statuses() if s.id == iid)

            a, b = (sup.launch(group, group.template(), "test", pool) for _ in range(2))
            await until("a, b ready", lambda: state(sup, a) is state(sup, b) is InstanceState.READY)
            assert sorted([devices(a), devices(b)]) == ["GPU-a", "GPU-b"]
            sup.lent = frozenset({a})  # asleep, its units lent
            c = sup.launch(group, group.template(), "borrower", pool)
            await until("c ready", lambda: state(sup, c) is InstanceState.READY)
            assert devices(c) == "GPU-c"  # the free device first
            assert sup.devices_free_for(a)
            d = sup.launch(group, group.template(), "borrower", pool)
            await until("d ready", lambda: state(sup, d) is InstanceState.READY)
            assert devices(d) == devices(a)  # then the sleeper's, not a wait
            assert not sup.devices_free_for(a) and sup.devices_free_for(b)
            sup.remove(d, "reclaimed")
            await until("a's device free", lambda: sup.devices_free_for(a), timeout=10)

    asyncio.run(run())


def test_without_a_gateway_count_a_drain_waits_out_its_timeout_and_says_why(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        group, pool = platform(command(), drain=1.5)
        async with supervisor(tmp_path) as (sup, store):
            iid = sup.launch(group, group.template(), "test", pool)
            await until("ready", lambda: state(sup, iid) is InstanceState.READY)
            sup.drain(iid, "test")
            await until("stopped", lambda: state(sup, iid) is None, timeout=10)
            [timeout] = events(store, "drain-timeout")
            assert "no gateway in this process counts its requests" in timeout.message

    asyncio.run(run())


@pytest.mark.parametrize(
    ("extra", "says", "in_log"),
    [
        (", --never-ready", "/v1/models answered 503, not 200", "GET /v1/models"),
        (", --garbage", "not an OpenAI model list", "binary noise"),
        (", --model-is, other", None, "error: unrecognized arguments"),
    ],
)
def test_a_server_that_never_becomes_ready_fails_with_its_last_log_lines(
    tmp_path: Path, extra: str, says: str | None, in_log: str
) -> None:
    async def run() -> None:
        group, pool = platform(command(extra), startup=3)
        async with supervisor(tmp_path) as (sup, store):
            iid = sup.launch(group, group.template(), "test", pool)
            await until("failed", lambda: state(sup, iid) is InstanceState.FAILED, timeout=15)
            [failed] = events(store, "failed")
            if says is not None:
                assert "not ready 3s after launch" in failed.message and says in failed.message
            else:
                assert "exited with code 2 before it listened" in failed.message
            assert any(in_log in line for line in failed.detail["log_tail"])
            assert in_log in failed.message  # the last lines are in the message too
            assert all(line.isprintable() for line in failed.detail["log_tail"])

    asyncio.run(run())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stub(port: int, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            STUB,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            "m-stub",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def external(port: int, key_env: str | None = None) -> str:
    key = f", api_key_env: {key_env}" if key_env else ""
    return f"""\
        runtime: external
        external:
          endpoints: [{{url: "http://127.0.0.1:{port}"{key}}}]
          health_path: /health
"""


def test_an_external_endpoint_goes_out_of_routing_and_back_and_is_never_replaced(
    tmp_path: Path,
) -> None:
    port = free_port()
    server = stub(port, "--require-key", "k-123")

    async def run() -> None:
        nonlocal server
        group, pool = platform(external(port, "FLEET_KEY"))
        async with supervisor(tmp_path, inflight=dict, environ={"FLEET_KEY": "k-123"}) as (
            sup,
            store,
        ):
            iid = sup.launch(group, group.template(), "test", pool)
            await until("ready", lambda: state(sup, iid) is InstanceState.READY)
            [ep] = sup.ready_endpoints()["grp"]
            assert (ep.port, ep.api_key_env) == (port, "FLEET_KEY")  # the name, never the key
            server.kill()
            server.wait()
            await until(
                "out of routing", lambda: state(sup, iid) is InstanceState.STARTING, timeout=10
            )
            assert sup.ready_endpoints() == {}
            reason = next(s.reason for s in sup.statuses() if s.id == iid)
            assert reason.startswith(("out of routing", "/v1/models: ")), reason
            server = stub(port, "--require-key", "k-123")
            await until("back", lambda: state(sup, iid) is InstanceState.READY, timeout=20)

            def kinds() -> list[str]:
                return [e.kind for e in store.list_events(limit=50) if e.instance == iid]

            # the state flips first; its event is stored just after (a loaded machine: later)
            await until("the recovery's event", lambda: kinds()[:1] == ["recovered"], timeout=5)
            assert kinds()[:3] == [
                "recovered",
                "unhealthy",
                "ready",
            ]
            assert len(sup.statuses()) == 1  # the same instance throughout
            sup.drain(iid, "test")
            await until("drained", lambda: state(sup, iid) is None, timeout=5)
            assert server.poll() is None  # draining an external endpoint leaves it running

    try:
        asyncio.run(run())
    finally:
        server.kill()
        server.wait()


def test_an_external_endpoint_whose_key_is_not_set_fails_naming_the_variable(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        group, pool = platform(external(free_port(), "FLEET_KEY"))
        async with supervisor(tmp_path, environ={}) as (sup, store):
            iid = sup.launch(group, group.template(), "test", pool)
            await until("failed", lambda: state(sup, iid) is InstanceState.FAILED)
            [failed] = events(store, "failed")
            assert "$FLEET_KEY" in failed.message and "unset, empty or not a key" in failed.message

    asyncio.run(run())
