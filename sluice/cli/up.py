"""`sluice up` and `sluice controller`: the composition root. Picks the clock, store and
runtime and wires controller, control API and (for `up`, the embedded default) the gateway
into one process. `sluice controller` is the same without a gateway of its own: its data
plane is `sluice gateway` processes that sync with it (issue 21)."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import logging
import os
import random
import signal
import socket
import sys
import time
from asyncio import Task
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import uvicorn
from fastapi import APIRouter

from sluice.cli import heapdump, native_heap
from sluice.cli.common import state_store
from sluice.cli.control_port import PortInUse, bind_control, control_socket
from sluice.cli.serving import QuietServer, keep_serving, quiet_store_outages, until_stopped
from sluice.config import Settings
from sluice.control import (
    Controller,
    EventLog,
    Housekeeper,
    InstanceSupervisor,
    Observer,
    ReviewBoard,
    TokenAdmin,
    build_control_api,
)
from sluice.control.alerts import Alerting
from sluice.control.alerts_api import alert_routes
from sluice.control.capacity_api import capacity_routes
from sluice.control.capacity_watch import StaleTargets
from sluice.control.drills import DrillScheduler
from sluice.control.gateways import GatewayFleet, LocalGateway, gateway_routes
from sluice.control.handover import health_app, stop_route
from sluice.control.leadership import FencedRuntime, Leadership, new_holder
from sluice.control.reclaim import Reclaimer, reclaim_routes
from sluice.control.secrets_key import installation_sealer
from sluice.control.spec_work import warm_up
from sluice.core import Conflict, InstanceState, NotFound, SystemClock, collector
from sluice.gateway import Gateway
from sluice.gateway.metrics import CONTENT_TYPE, DURATION_BUCKETS_S
from sluice.policy.lease import LeaseTiming, takeover_bound_s
from sluice.runtime import LocalRuntime, Runtime
from sluice.spec import (
    ControlSpec,
    LoadedSpec,
    PlatformSpec,
    Sealer,
    open_revision,
    seal_secrets,
)
from sluice.store import Fenced, LeaseRecord, Store

__all__ = ["UpOptions", "serve"]

log = logging.getLogger("sluice.up")

LOCAL_ACTOR = f"local:{getpass.getuser()}"
"""Who `sluice up -f` acts as: whoever runs it on this machine (it holds the state dir)."""


@dataclass(frozen=True, slots=True)
class UpOptions:
    """What `sluice up` was asked: a spec file (and why it differs from the live one), a
    gateway port override, and whether a non-loopback control API may run without TLS.
    `gateway=False` is `sluice controller`: no gateway in process; `endpoint` is then where
    clients reach the gateways (a drill sends its load there), by default the spec's
    gateway address."""

    loaded: LoadedSpec | None = None
    reason: str | None = None
    port: int | None = None
    insecure: bool = False
    gateway: bool = True
    endpoint: str | None = None
    health_port: int | None = None
    health_host: str = "127.0.0.1"
    control_port: int | None = None
    """--control-port: overrides the spec's control.port (0: any free port now)"""


async def serve(settings: Settings, options: UpOptions) -> None:
    """Run until stopped, on a state directory the caller holds (`hold_state_dir`).

    The store is the truth after the first start: `options.loaded` (from `-f FILE`) seeds
    an empty store; on a store with a live revision the live revision runs, and a FILE that
    differs is said once and never applied (a standby started with `-f` must not revert a
    later `sluice apply` when it takes over, nor a restarted pod crash-loop on it). With
    `reason` FILE becomes the next revision (review rules included), but only if the live
    revision is still the one seen at start when this process comes to lead.

    Stopping: SIGTERM hands over (the lease is released, every instance keeps running for
    the next leader to adopt); SIGINT (Ctrl-C) and `sluice down` stop the fleet too."""
    started = time.monotonic()
    quiet_store_outages()  # a store outage is one line, then one a minute, not tracebacks
    store = await asyncio.to_thread(state_store, settings)
    if settings.database_url is not None:  # the default, state.db, goes without saying
        log.info("state: %s", store.location)
    try:
        sealer = installation_sealer(settings.home)
        latest = await asyncio.to_thread(store.latest_revision)
        first: PlatformSpec | None = None
        if latest is not None:  # it opens with this controller's secrets key, or no start:
            # a standby given another key would take the lease, then fail to read the spec
            first = open_revision(latest.yaml_text, f"revision {latest.number}", sealer).spec
        if options.loaded is not None and (latest is None or options.reason is not None):
            first = options.loaded.spec
        if first is None:
            raise NotFound("no spec in this state directory yet: start with `sluice up -f FILE`")
        live_at_start = None if latest is None else latest.number
        await _Up(settings, options, store, started, first, sealer, live_at_start).run()
    finally:
        store.close()


class _Up:
    def __init__(
        self,
        settings: Settings,
        options: UpOptions,
        store: Store,
        started: float,
        first: PlatformSpec,
        sealer: Sealer,
        live_at_start: int | None,
    ):
        """`first`: the spec at start (the live revision, or the file that seeds or
        replaces it): it picks the runtime and the lease timing, both read once per start.
        `live_at_start`: the live revision's number then (None: an empty store)."""
        self.settings = settings
        self.options = options
        self.store = store
        self.started = started
        self.sealer = sealer
        self.live_at_start = live_at_start
        self.clock = SystemClock()
        self.events = EventLog(store, self.clock)
        election = first.control.leader_election
        self.leadership = Leadership(
            store,
            LeaseTiming(**election.model_dump()),
            new_holder(),
            health=self.events.health,
        )
        self.fenced = False
        """lost the leader lease: stop without touching the instances (the leader's now)"""
        self.fleet = GatewayFleet(self.clock)
        runtime, self.inventory = _runtime(first, settings.home)
        self.supervisor = InstanceSupervisor(
            FencedRuntime(runtime, self.leadership),
            store,
            self.clock,
            self.events,
            inflight=self.fleet.in_flight,
        )
        self.stop = asyncio.Event()
        self.stop_fleet = False
        """how it stops: False hands over (instances left running), True stops them too"""
        self.stop_reason = ""
        self.stop_actor = LOCAL_ACTOR
        self._api_started: Callable[[], bool] = lambda: False

    def request_stop(self, fleet: bool, reason: str, actor: str = LOCAL_ACTOR) -> None:
        """Stop this process; `fleet`: its instances too (Ctrl-C, `sluice down`), else
        hand them over. A later request may widen a hand-over into a full stop."""
        if not self.stop.is_set() or (fleet and not self.stop_fleet):
            self.stop_fleet = self.stop_fleet or fleet
            self.stop_reason, self.stop_actor = reason, actor
        self.stop.set()

    async def run(self) -> None:
        self.access_log = _open_access_log(self.settings.access_log)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self.request_stop, True, "Ctrl-C (SIGINT)")
        loop.add_signal_handler(signal.SIGTERM, self.request_stop, False, "SIGTERM")
        heapdump.install(loop)  # debugging only: off unless its variable is set
        health = await self._health_server()
        trimming = asyncio.create_task(native_heap.trim_periodically(), name="malloc-trim")
        led = False
        try:
            led = await self._lead()
            if led:
                await self.supervisor.start()
                await self._serve(self.access_log)
        finally:
            trimming.cancel()
            with contextlib.suppress(FileNotFoundError):
                self.settings.control_file.unlink()
            if self.fenced:
                print("sluice stopped: deposed, its instances left to the new leader", flush=True)
            elif led:
                await self._step_down()
            if health is not None:
                health.should_exit = True
            self.access_log.close()

    async def _step_down(self) -> None:
        """Stop leading, said in the audit log: stop every instance (`stop_fleet`), or leave
        them running and release the lease so a standby takes over at once."""
        running = len(self.supervisor.statuses())
        what = "stopped every instance" if self.stop_fleet else f"left {running} running"
        with contextlib.suppress(Exception):  # the store may be away: the lease lapses then
            await asyncio.to_thread(
                self.store.append_audit,
                actor=self.stop_actor,
                action="stop" if self.stop_fleet else "hand-over",
                target="controller",
                reason=f"{self.stop_reason or 'stopped'}: {what}",
                detail={"holder": self.leadership.holder, "instances": running},
                now=self.clock.now(),
            )
        if self.stop_fleet:
            await self.supervisor.shutdown()
            await self.leadership.release()
            print("sluice stopped; all instances stopped", flush=True)
            return
        left = await self.supervisor.detach()
        await self.leadership.release()
        print(
            f"sluice stopped: handed over, {left} instance(s) left running for the next "
            "leader (a standby, or the next `sluice up`, adopts them; `sluice down` or "
            "Ctrl-C stops them)",
            flush=True,
        )

    async def _health_server(self) -> QuietServer | None:
        """`--health-port`: liveness (`/livez`, 200 while this process runs, leader or
        standby) and readiness (`/readyz`, 200 only while it leads with its control API
        up) over plain HTTP, for an orchestrator's probes; up before the lease is sought."""
        port = self.options.health_port
        if port is None:
            return None
        app = health_app(self._role, self._ready)
        server = QuietServer(
            uvicorn.Config(
                app, log_level="warning", lifespan="off", access_log=False, server_header=False
            )
        )
        host = self.options.health_host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host, port), family=family)
        except OSError as exc:
            raise Conflict(
                f"the health port cannot listen on {host}:{port}: {exc.strerror}"
            ) from None
        task = asyncio.create_task(server.serve(sockets=[sock]), name="health")
        task.add_done_callback(lambda _t: sock.close())
        return server

    def _role(self) -> str:
        if self.stop.is_set() or self.fenced:
            return "stopping"
        if self.leadership.lease is None:
            return "standby"
        return "leader" if self._api_started() else "starting"

    def _ready(self) -> bool:
        return self._role() == "leader"

    async def _file_to_apply(self) -> LoadedSpec | None:
        """The start-up file to apply now that this process leads, read against the live
        revision of now (a standby may have waited while others applied): the file seeds
        an empty store, and with `--reason` replaces the live revision only if that is
        still the one seen at start. Otherwise the live revision runs, and a file that
        differs from it is said once here."""
        loaded = self.options.loaded
        if loaded is None:
            return None
        latest = await asyncio.to_thread(self.store.latest_revision)
        if latest is None:
            return loaded
        if latest.yaml_text == seal_secrets(loaded.text, loaded.source, self.sealer):
            return None
        if self.options.reason is not None and latest.number == self.live_at_start:
            return loaded
        print(
            f"{loaded.source} differs from the live revision {latest.number} (applied by "
            f"{latest.author}: {latest.reason!r}): running revision {latest.number}. The "
            f"store holds the spec after the first start; `sluice apply -f {loaded.source} "
            "--reason WHY` makes the file live",
            flush=True,
        )
        return None

    def _bind_control(self, control: ControlSpec) -> tuple[socket.socket | None, int]:
        """The control API's socket and port (`sluice.cli.control_port`: configured, else
        remembered from the first start); no socket when `sluice controller` finds its
        configured port held (by a deposed controller on this host not yet gone): the API
        binds it once free."""
        flag = self.options.control_port
        try:
            bound = bind_control(control, self.settings.home, flag, self.options.insecure)
        except PortInUse:
            if self.options.gateway:
                raise
            port = flag or control.port
            print(
                f"the control port {control.host}:{port} is in use (a controller on "
                "this host that has not exited yet?): leading meanwhile, the control API "
                "listens once it is free",
                flush=True,
            )
            return None, port
        return bound.sock, bound.port

    async def _wait_for_port(self, control: ControlSpec) -> socket.socket:
        while True:
            with contextlib.suppress(PortInUse):
                return control_socket(control, self.options.insecure)
            await asyncio.sleep(self.leadership.timing.retry_period_s)

    async def _lead(self) -> bool:
        """Wait for the controller lease (at once unless another control plane on this
        database leads); False if stopped while waiting as a standby."""
        bound = takeover_bound_s(self.leadership.timing)

        def standby(current: LeaseRecord | None) -> None:
            if current is not None:
                print(
                    f"standby: {current.holder} leads (epoch {current.epoch}); taking over "
                    f"within {bound:.0f} s of its end",
                    flush=True,
                )

        warm_up()  # the spec worker starts while this one waits for the lease
        taking = asyncio.create_task(self.leadership.acquire(standby))
        stopping = asyncio.create_task(self.stop.wait())
        await asyncio.wait({taking, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not taking.done():
            taking.cancel()
            return False
        lease = taking.result()
        await asyncio.to_thread(
            self.store.append_audit,
            actor=LOCAL_ACTOR,
            action="lead",
            target="controller",
            reason=f"took the controller lease (epoch {lease.epoch})",
            detail={"holder": lease.holder, "epoch": lease.epoch},
            now=self.clock.now(),
        )
        return True

    async def _keep_leading(self) -> None:
        """Renew the lease; once it is lost, stop at once and touch no instance."""
        await self.leadership.keep()
        self.fenced = True
        print("lost the controller lease: stopping without touching the instances", flush=True)
        self.stop.set()

    async def _serve(self, access_log: TextIO) -> None:
        settings, options, store = self.settings, self.options, self.store
        # renew the lease from the start: the set-up below awaits spec work and the store
        leading = asyncio.create_task(self._keep_leading(), name="leadership")
        loaded = await self._file_to_apply()
        first = loaded.spec if loaded else await _latest_spec(store, self.sealer)
        control_sock, control_port = self._bind_control(first.control)
        gateway = None
        if options.gateway:
            gateway = Gateway(
                host=first.gateway.host,
                port=first.gateway.port if options.port is None else options.port,
                rng=random.Random(),
                access_log=access_log,
                limits=first.gateway.limits,
            )
            self.fleet.local = LocalGateway(
                gateway.update,
                gateway.traffic,
                gateway.status,
                gateway.sample_groups,
                gateway.samples,
                arrivals=gateway.tenant_arrivals,
                set_rates=gateway.set_rate_shares,
            )
        fleet = self.fleet
        controller = Controller(
            store,
            self.supervisor,
            self.events,
            self.clock,
            publish=fleet.publish,
            traffic=fleet.traffic,
            samples=fleet,
            inventory=self.inventory,
            sealer=self.sealer,
            oldest_served=fleet.oldest_served,
        )
        await controller.load_state()
        alerting = Alerting(
            store,
            self.events,
            lambda g: f"sluice explain {g} · GET {control_url}/v1/groups/{g}/explain",
        )
        await alerting.load()
        observer = Observer(
            store, self.events, self.clock, fleet.traffic, controller.observation, alerting
        )
        await observer.load()
        controller.hold_scale_up(observer.holds)
        if loaded is not None:
            why = options.reason or f"sluice up -f {loaded.source}: the first spec"
            await controller.apply(loaded, LOCAL_ACTOR, why)
        tokens = TokenAdmin(store, self.clock)
        admin_token = await tokens.bootstrap(settings.home)
        spec = controller.spec
        await self.supervisor.recover(
            {g.name: g for g in spec.groups}, {p.name: p for p in spec.pools}
        )
        await controller.adopted()
        if gateway is not None:
            try:
                await gateway.start()
            except OSError as exc:
                if control_sock is not None:
                    control_sock.close()
                raise Conflict(
                    f"the gateway cannot listen on {gateway.host}:{gateway.port}: "
                    f"{exc.strerror}; free the port or pick another with --port"
                ) from None
        tls = spec.control.tls
        scheme = "https" if tls else "http"
        control_url = f"{scheme}://{_url_host(spec.control.host)}:{control_port}"
        endpoint = options.endpoint or (
            f"http://{_url_host(spec.gateway.host)}:"
            f"{spec.gateway.port if gateway is None else gateway.port}"
        )
        review = ReviewBoard(controller, store, self.clock, access_log=settings.access_log)
        reclaimer = Reclaimer(store, review, controller.audit, self.clock)
        await reclaimer.load()
        keeper = Housekeeper(
            store,
            self.clock,
            settings.access_log,
            settings.home / "instances",
            running=lambda: {s.id for s in self.supervisor.statuses()},
            reopen_access_log=(lambda: self._reopen_access_log(gateway)) if gateway else None,
            copy_truncate=self.supervisor.command_instances,
        )

        drills = DrillScheduler(
            store,
            tokens,
            self.events,
            controller.audit,
            self.clock,
            home=settings.home,
            control_url=control_url,
            endpoint=endpoint,
        )
        await drills.load()

        def more_routes(api: APIRouter) -> None:
            stop_route(api, self.request_stop, lambda: len(self.supervisor.statuses()))
            alert_routes(api, alerting, lambda: controller.spec, DURATION_BUCKETS_S)
            stale = StaleTargets(store, alerting, review)
            capacity_routes(api, controller, store, self.clock.now, drills, stale)
            gateway_routes(api, fleet)
            reclaim_routes(api, reclaimer, lambda: controller.spec, self.clock.now)

        api = build_control_api(
            controller,
            self.supervisor,
            store,
            tokens,
            allowed_hosts=_allowed_hosts(spec.control),
            data_plane=fleet.status,
            review=review,
            metrics=lambda: _with_alerts(
                gateway.metrics_text() if gateway is not None else (b"", CONTENT_TYPE), alerting
            ),
            housekeeping=lambda: keeper.run_once(
                controller.spec.retention, controller.spec.observability.history
            ),
            more_routes=more_routes,
        )
        server = QuietServer(
            uvicorn.Config(
                api,
                log_level="warning",
                lifespan="off",
                access_log=False,
                server_header=False,
                ssl_certfile=tls.cert_file if tls else None,
                ssl_keyfile=tls.key_file if tls else None,
            )
        )
        settings.control_file.write_text(
            json.dumps({"control_url": control_url, "endpoint": endpoint, "pid": os.getpid()})
        )
        collector.settle()  # what this process keeps for its life is built

        current = server

        async def control_api(attempt: int) -> None:
            nonlocal current, control_sock
            if attempt or control_sock is None:  # a fresh socket, same address
                if control_sock is not None:
                    with contextlib.suppress(OSError):
                        control_sock.close()
                again = spec.control.model_copy(update={"port": control_port})
                control_sock = await self._wait_for_port(again)
            if attempt:
                current = QuietServer(server.config)
            await current.serve(sockets=[control_sock])

        async def control_loop(_attempt: int) -> None:
            await controller.run()

        async def housekeeping(_attempt: int) -> None:
            await keeper.loop(lambda: controller.spec)

        async def observing(_attempt: int) -> None:
            await observer.run()

        async def alert_delivery(_attempt: int) -> None:
            await alerting.run_delivery(lambda: controller.spec, self.clock)

        async def scheduled_drills(_attempt: int) -> None:
            await drills.run(lambda: controller.spec)

        async def scheduled_reclaim(_attempt: int) -> None:
            await reclaimer.run(lambda: controller.spec)

        stopping = self.stop
        where = store.location

        def part(name: str, run_once: Callable[[int], Awaitable[None]], task: str) -> Task[None]:
            started = (lambda: current.started) if name == "control API" else None
            return asyncio.create_task(
                keep_serving(name, run_once, stopping, started, store=where), name=task
            )

        tasks = [
            part("controller", control_loop, "controller"),
            part("control API", control_api, "control-api"),
            part("housekeeping", housekeeping, "housekeeping"),
            part("observer", observing, "observer"),
            part("alert delivery", alert_delivery, "alerts"),
            part("drill schedules", scheduled_drills, "drills"),
            part("quota reclaim", scheduled_reclaim, "reclaim"),
            leading,
        ]
        if gateway is not None:
            print(f"endpoint: {endpoint}", flush=True)
        else:
            print(
                f"no gateway in this process: `sluice gateway --control {control_url}` "
                f"serves the endpoint ({endpoint})",
                flush=True,
            )
        print(f"control: {control_url}  console: {control_url}/ui/", flush=True)
        print(f"state: {settings.home}  revision: {controller.revision}", flush=True)
        if (lease := self.leadership.lease) is not None:
            print(f"leader: {lease.holder} (epoch {lease.epoch})", flush=True)
        if admin_token is not None:
            print(f"admin token: written to {admin_token} (the CLI here uses it)", flush=True)
        print(
            "stop: Ctrl-C or `sluice down` stops every instance; SIGTERM hands over, leaving "
            "them running for the next leader",
            flush=True,
        )
        self._api_started = lambda: current.started
        announcer = asyncio.create_task(_announce_ready(controller, self.supervisor, self.started))
        stopper = asyncio.create_task(stopping.wait())
        failure = await until_stopped(stopper, tasks)
        if self.stop_fleet:
            print("stopping: gateway first, then draining instances", file=sys.stderr, flush=True)
        elif not self.fenced:
            print(
                f"handing over ({self.stop_reason or 'stopped'}): the instances keep running",
                file=sys.stderr,
                flush=True,
            )
        current.should_exit = True
        await drills.close()  # a drill cut short by the stop is closed as such, not judged
        if gateway is not None:
            await gateway.stop()
        for task in [announcer, stopper, *tasks]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await observer.close()
        except Fenced as exc:  # deposed: the new leader keeps the history from now on
            log.warning("the minute in progress of the metrics history was not stored: %s", exc)
        except Exception:
            log.exception("the minute in progress of the metrics history was not stored")
        await controller.close()
        if failure is not None:
            raise failure

    def _reopen_access_log(self, gateway: Gateway) -> None:
        """Once rotation renamed the access log, the gateway logs to a fresh file under its
        name (what it wrote in between went to the end of the renamed one: nothing lost)."""
        path = self.settings.access_log
        current = os.fstat(self.access_log.fileno())
        with contextlib.suppress(FileNotFoundError):
            named = os.stat(path)
            if (named.st_dev, named.st_ino) == (current.st_dev, current.st_ino):
                return
        fresh = _open_access_log(path)
        old = gateway.swap_access_log(fresh)
        self.access_log = fresh
        if old is not None:
            old.close()


def _with_alerts(metrics: tuple[bytes, str], alerting: Alerting) -> tuple[bytes, str]:
    """The gateway's metrics and the alerts' state (`sluice_alert_firing`), on one page."""
    body, content_type = metrics
    return body + alerting.prometheus_text(), content_type


def _open_access_log(path: Path) -> TextIO:
    # Buffered: the gateway flushes every 0.1 s and on stop (a line per syscall: ~10%).
    return open(path, "a", buffering=1 << 16, encoding="utf-8")


def _runtime(
    spec: PlatformSpec, home: Path
) -> tuple[Runtime, Callable[[], Mapping[str, int]] | None]:
    """Where instances run (`instances.runtime`, read at start), and for a cluster the call
    that reads its accelerators per type (pools with `inventory: cluster`). Ray is imported
    only here."""
    if spec.instances.runtime == "ray":
        from sluice.runtime.ray import RayRuntime

        ray = RayRuntime(spec.instances.ray.address, spec.instances.ray.namespace)
        return ray, ray.inventory
    return LocalRuntime(home), None


async def _latest_spec(store: Store, sealer: Sealer) -> PlatformSpec:
    latest = await asyncio.to_thread(store.latest_revision)
    if latest is None:
        raise NotFound("no spec in this state directory yet: start with `sluice up -f FILE`")
    return open_revision(latest.yaml_text, f"revision {latest.number}", sealer).spec


def _allowed_hosts(control: ControlSpec) -> list[str]:
    """Names a browser or client may use for the control API (checked against `Host`)."""
    return [control.host, "127.0.0.1", "localhost", "::1", *control.allowed_hosts]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


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
