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
from sluice.core import Conflict, NotFound, SystemClock
from sluice.gateway import Gateway
from sluice.runtime import LocalRuntime
from sluice.spec import LoadedSpec, PlatformSpec, load_spec_text
from sluice.store import Store

__all__ = ["serve"]

log = logging.getLogger("sluice.up")


class _ControlServer(uvicorn.Server):
    """uvicorn without its own signal handling: `sluice up` owns SIGINT/SIGTERM and shuts
    everything down in order (gateway, then instances), not just the API."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(settings: Settings, loaded: LoadedSpec | None, port: int | None) -> None:
    settings.home.mkdir(parents=True, exist_ok=True)
    store = await asyncio.to_thread(Store.for_home, settings.home)
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
        await _run(settings, loaded, port, store, clock, events, supervisor, access_log, stop)
    finally:
        with contextlib.suppress(FileNotFoundError):
            settings.control_file.unlink()
        await supervisor.shutdown()
        access_log.close()
        store.close()
        print("sluice stopped; all instances stopped", flush=True)


async def _latest_spec(store: Store) -> PlatformSpec:
    latest = await asyncio.to_thread(store.latest_revision)
    if latest is None:
        raise NotFound("no spec in this state directory yet: start with `sluice up -f FILE`")
    return load_spec_text(latest.yaml_text, f"revision {latest.number}").spec


async def _run(
    settings: Settings,
    loaded: LoadedSpec | None,
    port: int | None,
    store: Store,
    clock: SystemClock,
    events: EventLog,
    supervisor: InstanceSupervisor,
    access_log: TextIO,
    stop: asyncio.Event,
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
        await controller.apply(loaded, settings.actor, f"sluice up -f {loaded.source}")
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
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    print("stopping: gateway first, then draining instances", file=sys.stderr, flush=True)
    server.should_exit = True
    await gateway.stop()
    for task in [stopper, *tasks]:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await controller.close()
    for task, result in zip(tasks, results, strict=True):
        if task in done and isinstance(result, BaseException):
            raise result
