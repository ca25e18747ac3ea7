"""`sluice up`: the composition root. Picks the clock, store, runtime and wires controller,
gateway and control API into one process (the embedded default)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import socket
import sys
import time
from collections.abc import Iterator
from typing import TextIO

import uvicorn

from sluice.config import Settings
from sluice.control import (
    Controller,
    EventLog,
    InstanceSupervisor,
    ReviewBoard,
    build_control_api,
)
from sluice.core import Conflict, InstanceState, NotFound, SystemClock
from sluice.gateway import Gateway
from sluice.runtime import LocalRuntime
from sluice.spec import LoadedSpec, PlatformSpec, load_spec_text
from sluice.store import Revision, Store

__all__ = ["serve"]

log = logging.getLogger("sluice.up")


class _ControlServer(uvicorn.Server):
    """uvicorn without its own signal handling: `sluice up` owns SIGINT/SIGTERM and shuts
    everything down in order (gateway, then instances), not just the API."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(
    settings: Settings, loaded: LoadedSpec | None, port: int | None, reason: str | None = None
) -> None:
    """Run until SIGINT/SIGTERM. `loaded` (from `up -f`) is applied if the state directory
    is empty or it is the live revision already; a file that differs from the live revision
    needs a `reason` (then it becomes the next revision, review rules included), so that
    re-running `up -f` never silently reverts a later `sluice apply`. Plain `up` resumes."""
    started = time.monotonic()
    settings.home.mkdir(parents=True, exist_ok=True)
    store = await asyncio.to_thread(Store.for_home, settings.home)
    if loaded is not None and reason is None:
        try:
            _refuse_silent_revert(loaded, await asyncio.to_thread(store.latest_revision))
        except Conflict:
            store.close()
            raise
    clock = SystemClock()
    events = EventLog(store, clock)
    supervisor = InstanceSupervisor(LocalRuntime(settings.home), store, clock, events)
    # Buffered: the gateway flushes every 0.1 s and on stop (a line per syscall costs ~10%).
    access_log = open(settings.access_log, "a", buffering=1 << 16, encoding="utf-8")  # noqa: SIM115
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await supervisor.start()
        await _run(
            settings,
            loaded,
            reason,
            port,
            store,
            clock,
            events,
            supervisor,
            access_log,
            stop,
            started,
        )
    finally:
        with contextlib.suppress(FileNotFoundError):
            settings.control_file.unlink()
        await supervisor.shutdown()
        access_log.close()
        store.close()
        print("sluice stopped; all instances stopped", flush=True)


def _refuse_silent_revert(loaded: LoadedSpec, latest: Revision | None) -> None:
    if latest is None or latest.yaml_text == loaded.text:
        return
    raise Conflict(
        f"revision {latest.number} is live (applied by {latest.author}: {latest.reason!r}) "
        f"and {loaded.source} differs from it. Run `sluice up` to resume revision "
        f"{latest.number}, or `sluice up -f {loaded.source} --reason WHY` to apply the file "
        f"as revision {latest.number + 1}. Nothing was started or stopped; instances a "
        "previous run left behind are taken over by the next `sluice up`.",
        live_revision=latest.number,
    )


async def _latest_spec(store: Store) -> PlatformSpec:
    latest = await asyncio.to_thread(store.latest_revision)
    if latest is None:
        raise NotFound("no spec in this state directory yet: start with `sluice up -f FILE`")
    return load_spec_text(latest.yaml_text, f"revision {latest.number}").spec


async def _run(
    settings: Settings,
    loaded: LoadedSpec | None,
    reason: str | None,
    port: int | None,
    store: Store,
    clock: SystemClock,
    events: EventLog,
    supervisor: InstanceSupervisor,
    access_log: TextIO,
    stop: asyncio.Event,
    started: float,
) -> None:
    listen = (loaded.spec if loaded else await _latest_spec(store)).gateway
    gateway = Gateway(
        host=listen.host,
        port=listen.port if port is None else port,
        rng=random.Random(),
        access_log=access_log,
    )
    controller = Controller(
        store, supervisor, events, clock, publish=gateway.update, traffic=gateway.traffic
    )
    await controller.load_state()
    if loaded is not None:
        await controller.apply(loaded, settings.actor, reason or f"sluice up -f {loaded.source}")
    spec = controller.spec
    await supervisor.recover({g.name: g for g in spec.groups})
    try:
        await gateway.start()
    except OSError as exc:
        raise Conflict(
            f"the gateway cannot listen on {gateway.host}:{gateway.port}: {exc.strerror}; "
            "free the port or pick another with --port"
        ) from None
    control_sock = socket.create_server((spec.control.host, spec.control.port))
    control_port = control_sock.getsockname()[1]
    review = ReviewBoard(controller, store, clock, access_log=settings.access_log)
    api = build_control_api(controller, supervisor, store, data_plane=gateway.status, review=review)
    server = _ControlServer(
        uvicorn.Config(api, log_level="warning", lifespan="off", access_log=False)
    )
    control_url = f"http://{spec.control.host}:{control_port}"
    endpoint = f"http://{spec.gateway.host}:{gateway.port}"
    settings.control_file.write_text(
        json.dumps({"control_url": control_url, "endpoint": endpoint, "pid": os.getpid()})
    )

    tasks = [
        asyncio.create_task(controller.run(), name="controller"),
        asyncio.create_task(server.serve(sockets=[control_sock]), name="control-api"),
    ]
    print(f"endpoint: {endpoint}", flush=True)
    print(f"control: {control_url}", flush=True)
    print(f"state: {settings.home}  revision: {controller.revision}", flush=True)
    announcer = asyncio.create_task(_announce_ready(controller, supervisor, started))
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    print("stopping: gateway first, then draining instances", file=sys.stderr, flush=True)
    server.should_exit = True
    await gateway.stop()
    for task in [announcer, stopper, *tasks]:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await controller.close()
    for task, result in zip(tasks, results, strict=True):
        if task in done and isinstance(result, BaseException):
            raise result


async def _announce_ready(
    controller: Controller, supervisor: InstanceSupervisor, started: float
) -> None:
    """Print `ready: chat 2/2, embed 1/1 in 4.1 s` once every group that should serve has a
    ready instance: `endpoint:` comes first, before any model has loaded, and a request
    before this line may get 503. A group still not ready after its start-up timeout is
    named once, with where to look."""
    patience = max((g.health.startup_timeout_s for g in controller.spec.groups), default=0.0)
    warned = False
    while True:
        counts = _ready_counts(controller, supervisor)
        waiting = [g for g, (ready, desired) in counts.items() if desired > 0 and ready == 0]
        took = time.monotonic() - started
        if not waiting:
            shown = ", ".join(f"{g} {r}/{d}" for g, (r, d) in counts.items())
            print(f"ready: {shown or 'no groups'} in {took:.1f} s", flush=True)
            return
        if not warned and took > patience:
            warned = True
            print(
                f"not ready after {took:.0f} s: {', '.join(waiting)} "
                "(`sluice get instances` and `sluice events GROUP` say why)",
                flush=True,
            )
        await asyncio.sleep(0.1)


def _ready_counts(
    controller: Controller, supervisor: InstanceSupervisor
) -> dict[str, tuple[int, int]]:
    """Per group of the live spec: (ready instances, instances wanted)."""
    ready: dict[str, int] = {}
    for s in supervisor.statuses():
        if s.state is InstanceState.READY:
            ready[s.group] = ready.get(s.group, 0) + 1
    return {
        g.name: (ready.get(g.name, 0), controller.desired_replicas(g.name))
        for g in controller.spec.groups
    }
