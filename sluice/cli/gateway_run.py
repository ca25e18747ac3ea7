"""The processes of `sluice gateway` (`sluice.cli.gateway` is the command): one gateway with
its sync loop, or, for `--workers N`, a parent that runs N of them on one port and starts
again any that dies.

A gateway token names its gateway (issue 31): first the process asks the control API the
token's name (`GET /v1/whoami`); its id is then `--id` or `<token name>-<host>-<port>`, and
an id the token may not sync (`sluice.policy.gateways.gateway_id_fits`) stops it at start.
Worker i of `--workers N` is `<id>-w<i>`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sluice.cli.serving import QuietServer
from sluice.core import Conflict, Forbidden, SpecError, SpecIssue
from sluice.gateway import Gateway
from sluice.gateway.remote import ControlSync, Identity, whoami
from sluice.policy.gateways import GATEWAY_ID_PATTERN, gateway_id_fits, gateway_id_rule

__all__ = ["GatewayOptions", "choose_gateway_id", "run_gateways"]

log = logging.getLogger("sluice.gateway")

_WORKER_ENV = "SLUICE_GATEWAY_WORKER"
"""Set by the parent of `--workers N` in each worker's environment: its index (the worker
then binds with SO_REUSEPORT)."""
_ID_ENV = "SLUICE_GATEWAY_WORKER_ID"
"""Set by the parent of `--workers N` with the id it chose: a worker takes it as it is."""
_RESTART_MAX_S = 30.0


@dataclass(frozen=True, slots=True)
class GatewayOptions:
    controls: tuple[str, ...]
    token: str
    host: str
    port: int
    workers: int
    gateway_id: str | None
    """`--id`; None: `<token name>-<host name>-<port>`"""
    access_log: Path | None
    ca_file: Path | None
    log_level: str
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    """Prometheus `/metrics` of each process here (worker i: this port + i); None: none"""


def run_gateways(opts: GatewayOptions) -> None:
    logging.basicConfig(
        level=opts.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per sync otherwise
    worker = os.environ.get(_WORKER_ENV)
    chosen = os.environ.get(_ID_ENV) if worker is not None else None
    if chosen is None:
        verify: bool | str = str(opts.ca_file) if opts.ca_file is not None else True
        me = whoami(opts.controls, opts.token, verify=verify)
        chosen = choose_gateway_id(
            me, opts.gateway_id, socket.gethostname(), opts.port, opts.workers
        )
        log.info("gateway %s: token %r (%s)", chosen, me.name, me.role)
    if opts.workers > 1 and worker is None:
        _supervise(opts, chosen)
        return
    gateway_id = chosen if worker is None else f"{chosen}-w{worker}"
    access_log = opts.access_log
    if access_log is not None and worker is not None:
        access_log = access_log.with_name(f"{access_log.stem}.w{worker}{access_log.suffix}")
    uvloop.run(_serve(opts, gateway_id, access_log, reuse_port=worker is not None))


def choose_gateway_id(
    me: Identity, explicit: str | None, hostname: str, port: int, workers: int
) -> str:
    """This gateway's id for the token `me`: `explicit` (`--id`) or `<token name>-<hostname>-
    <port>`; refused, with the reason, unless the token may sync it (and, for `--workers
    N`, every `<id>-w<i>`)."""
    if me.role not in ("gateway", "admin"):
        raise Forbidden(
            f"token {me.name!r} is a {me.role} token: a gateway syncs with a gateway token "
            "(`sluice token create NAME --role gateway`)",
            role=me.role,
        )
    gateway_id = explicit or f"{me.name}-{hostname}-{port}"
    if not gateway_id_fits(me.name, gateway_id):
        raise SpecError(
            [
                SpecIssue(
                    "--id",
                    f"{gateway_id!r} is not this token's gateway: a gateway token names its "
                    f"gateway, and token {me.name!r} may sync only {gateway_id_rule(me.name)} "
                    f"(leave --id out for '{me.name}-{hostname}-{port}')",
                )
            ]
        )
    longest = gateway_id if workers <= 1 else f"{gateway_id}-w{workers - 1}"
    if not re.fullmatch(GATEWAY_ID_PATTERN, longest):
        raise SpecError(
            [
                SpecIssue(
                    "--id",
                    f"{longest!r} is not a gateway id: at most 100 letters, digits and "
                    "'._:@-', starting with a letter or digit (give a shorter --id)",
                )
            ]
        )
    return gateway_id


async def _serve(
    opts: GatewayOptions, gateway_id: str, access_log: Path | None, *, reuse_port: bool
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Buffered: the gateway flushes every 0.1 s and on stop.
    stream = access_log.open("a", buffering=1 << 16) if access_log is not None else None
    gateway = Gateway(opts.host, opts.port, rng=random.Random(), access_log=stream)
    verify: bool | str = str(opts.ca_file) if opts.ca_file is not None else True
    sync = ControlSync(gateway, opts.controls, opts.token, gateway_id, verify=verify)
    try:
        await gateway.start(reuse_port=reuse_port)
    except OSError as exc:
        raise Conflict(
            f"gateway {gateway_id} cannot listen on {opts.host}:{opts.port}: {exc.strerror}"
        ) from None
    host = f"[{opts.host}]" if ":" in opts.host else opts.host
    print(f"gateway {gateway_id}: endpoint: http://{host}:{gateway.port}", flush=True)
    metrics = None
    if opts.metrics_port is not None:
        worker = int(os.environ.get(_WORKER_ENV, "0"))
        metrics = _metrics_server(gateway, opts.metrics_host, opts.metrics_port + worker)
        m_host = f"[{opts.metrics_host}]" if ":" in opts.metrics_host else opts.metrics_host
        port = metrics.port
        print(f"gateway {gateway_id}: metrics: http://{m_host}:{port}/metrics", flush=True)
    syncing = asyncio.create_task(sync.run())

    async def say_synced() -> None:
        await sync.synced.wait()
        print(f"gateway {gateway_id}: routing v{gateway.snapshot_version}", flush=True)

    saying = asyncio.create_task(say_synced())
    try:
        await stop.wait()
    finally:
        for task in (syncing, saying):
            task.cancel()
        if metrics is not None:
            await metrics.stop()
        await gateway.stop()
        if stream is not None:
            stream.close()
        print(f"gateway {gateway_id}: stopped", flush=True)


class _MetricsServer:
    """`GET /metrics` of one gateway process (its Prometheus text), on its own listener:
    the data-plane port serves the inference API only."""

    def __init__(self, server: QuietServer, sock: socket.socket) -> None:
        self._server = server
        self.port = int(sock.getsockname()[1])
        self._task = asyncio.create_task(server.serve(sockets=[sock]))

    async def stop(self) -> None:
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, SystemExit):
            await asyncio.wait_for(self._task, 5)


def _metrics_server(gateway: Gateway, host: str, port: int) -> _MetricsServer:
    async def metrics(_request: Request) -> Response:
        body, content_type = gateway.metrics_text()
        return Response(body, media_type=content_type)

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:
        raise Conflict(f"the metrics port cannot listen on {host}:{port}: {exc.strerror}") from None
    app = Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])
    config = uvicorn.Config(
        app, log_level="warning", lifespan="off", access_log=False, server_header=False
    )
    return _MetricsServer(QuietServer(config), sock)


def _supervise(opts: GatewayOptions, gateway_id: str) -> None:
    """Run `opts.workers` worker processes on one port until SIGINT/SIGTERM; one that dies
    is started again after a backoff (1 s, doubling to 30 s, reset once it ran a minute)."""
    stopping = False

    def stop(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    argv = [sys.executable, "-m", "sluice", *sys.argv[1:]]
    env_base = {**os.environ, "SLUICE_GATEWAY_TOKEN": opts.token, _ID_ENV: gateway_id}
    procs: dict[int, tuple[subprocess.Popen[bytes], float]] = {}
    backoff = dict.fromkeys(range(opts.workers), 1.0)
    due = dict.fromkeys(range(opts.workers), 0.0)

    def start(i: int) -> None:
        env = {**env_base, _WORKER_ENV: str(i)}
        procs[i] = (subprocess.Popen(argv, env=env, start_new_session=False), time.monotonic())

    try:
        while not stopping:
            now = time.monotonic()
            for i in range(opts.workers):
                entry = procs.get(i)
                if entry is not None and entry[0].poll() is not None:
                    proc, since = procs.pop(i)
                    ran = now - since
                    backoff[i] = 1.0 if ran > 60 else min(_RESTART_MAX_S, backoff[i] * 2)
                    due[i] = now + backoff[i]
                    log.warning(
                        "worker %d exited (%s) after %.0f s; starting it again in %.0f s",
                        i,
                        proc.returncode,
                        ran,
                        backoff[i],
                    )
                if i not in procs and now >= due[i]:
                    start(i)
            time.sleep(0.2)
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 35.0
        for proc, _ in procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
