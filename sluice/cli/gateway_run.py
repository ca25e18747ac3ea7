"""The processes of `sluice gateway` (`sluice.cli.gateway` is the command): one gateway with
its sync loop, or, for `--workers N`, a parent that runs N of them on one port and starts
again any that dies.

A gateway listens first, unready (issue 33: `/readyz` and every request 503 with
`Retry-After`, never 401), so a load balancer sees it come up and a controller that is not
there yet costs callers a retry, not a refusal. Then it learns its name: a gateway token
names its gateway (issue 31), so the process asks the control API the token's name (`GET
/v1/whoami`, again every second while none answers); its id is then `--id` or `<token
name>-<host>-<port>`, and an id the token may not sync (`sluice.policy.gateways.
gateway_id_fits`) stops it. Then it syncs, and is ready once the first routes are in.
Worker i of `--workers N` is `<id>-w<i>`; each worker learns its name itself, and a worker
stopped by its token or its id (exit 2 or 5) stops the parent with that code."""

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
from sluice.core import Conflict, Forbidden, SpecError, SpecIssue, Unauthorized
from sluice.gateway import Gateway
from sluice.gateway.remote import ControlSync, Identity, whoami
from sluice.policy.gateways import GATEWAY_ID_PATTERN, gateway_id_fits, gateway_id_rule

__all__ = ["GatewayOptions", "choose_gateway_id", "run_gateways"]

log = logging.getLogger("sluice.gateway")

_WORKER_ENV = "SLUICE_GATEWAY_WORKER"
"""Set by the parent of `--workers N` in each worker's environment: its index (the worker
then binds with SO_REUSEPORT)."""
_RESTART_MAX_S = 30.0
_FATAL_EXITS = frozenset({SpecError.exit_code, Unauthorized.exit_code})
"""A worker's exit codes that another start would only repeat (2: its `--id` is refused;
5: its token is, or is not a gateway's): the parent stops every worker and exits so."""


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


def run_gateways(opts: GatewayOptions) -> int:
    """Serve until SIGINT/SIGTERM; the exit code (0, or a worker's `_FATAL_EXITS`). An
    error of this process (its token or id refused, its port taken) raises."""
    logging.basicConfig(
        level=opts.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per sync otherwise
    worker = os.environ.get(_WORKER_ENV)
    if opts.workers > 1 and worker is None:
        return _supervise(opts)
    access_log = opts.access_log
    if access_log is not None and worker is not None:
        access_log = access_log.with_name(f"{access_log.stem}.w{worker}{access_log.suffix}")
    uvloop.run(_serve(opts, worker, access_log))
    return 0


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


async def _serve(opts: GatewayOptions, worker: str | None, access_log: Path | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Buffered: the gateway flushes every 0.1 s and on stop.
    stream = access_log.open("a", buffering=1 << 16) if access_log is not None else None
    gateway = Gateway(
        opts.host, opts.port, rng=random.Random(), access_log=stream, controls=opts.controls
    )
    label = "gateway" if worker is None else f"gateway worker {worker}"
    try:
        await gateway.start(reuse_port=worker is not None)
    except OSError as exc:
        raise Conflict(
            f"{label} cannot listen on {opts.host}:{opts.port}: {exc.strerror}"
        ) from None
    host = f"[{opts.host}]" if ":" in opts.host else opts.host
    print(
        f"{label}: endpoint: http://{host}:{gateway.port} (GET /readyz: ready once it "
        "has synced with a controller)",
        flush=True,
    )
    metrics = None
    try:
        if opts.metrics_port is not None:
            index = int(worker or "0")
            metrics = _metrics_server(gateway, opts.metrics_host, opts.metrics_port + index)
            m_host = f"[{opts.metrics_host}]" if ":" in opts.metrics_host else opts.metrics_host
            print(f"{label}: metrics: http://{m_host}:{metrics.port}/metrics", flush=True)
        serving = asyncio.create_task(_identify_and_sync(opts, gateway, worker))
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait((serving, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (serving, stopping):
                task.cancel()
            await asyncio.gather(serving, stopping, return_exceptions=True)
        refused = None if serving.cancelled() else serving.exception()
        if refused is not None:  # its token or its id refused
            raise refused
    finally:
        if metrics is not None:
            await metrics.stop()
        await gateway.stop()
        if stream is not None:
            stream.close()
        print(f"{label}: stopped", flush=True)


async def _identify_and_sync(opts: GatewayOptions, gateway: Gateway, worker: str | None) -> None:
    """Learn this gateway's id from its token (`whoami`), then sync for ever; says when
    the first routes are in. Raises what stops the process: the token or the id refused."""
    verify: bool | str = str(opts.ca_file) if opts.ca_file is not None else True
    me = await whoami(opts.controls, opts.token, verify=verify, waiting=gateway.readiness.failed)
    chosen = choose_gateway_id(
        me, opts.gateway_id, socket.gethostname(), gateway.port, opts.workers
    )
    gateway_id = chosen if worker is None else f"{chosen}-w{worker}"
    log.info("gateway %s: token %r (%s)", gateway_id, me.name, me.role)
    sync = ControlSync(gateway, opts.controls, opts.token, gateway_id, verify=verify)
    syncing = asyncio.create_task(sync.run())
    synced = asyncio.create_task(sync.synced.wait())
    try:
        await asyncio.wait((syncing, synced), return_when=asyncio.FIRST_COMPLETED)
        if synced.done():
            print(f"gateway {gateway_id}: routing v{gateway.snapshot_version}", flush=True)
        await syncing
    finally:
        for task in (syncing, synced):
            task.cancel()


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
            async with asyncio.timeout(5):
                await self._task


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


def _supervise(opts: GatewayOptions) -> int:
    """Run `opts.workers` worker processes on one port until SIGINT/SIGTERM; one that dies
    is started again after a backoff (1 s, doubling to 30 s, reset once it ran a minute),
    unless its exit code is one of `_FATAL_EXITS`: then every worker is stopped and that
    code returned (the worker said why on stderr). 0 after a signal."""
    stopping = False
    fatal = 0

    def stop(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    argv = [sys.executable, "-m", "sluice", *sys.argv[1:]]
    env_base = {**os.environ, "SLUICE_GATEWAY_TOKEN": opts.token}
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
                    if proc.returncode in _FATAL_EXITS:
                        fatal = proc.returncode
                        stopping = True
                        break
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
    return fatal
