"""Runs each instance through its lifecycle: launch, ready probe, warm-up, health, drain.

One task per instance. The controller decides *what* (launch, drain, remove); this module
does it and reports state changes through `changed`, so routing follows at once:

    PENDING -launch-> STARTING -/ready-> WARMING -warm-up-> READY -drain-> DRAINING -> STOPPED
    any state -(exit, probe failures, timeout)-> FAILED   (the controller then replaces it)

What runs in an instance decides how it is asked (`control.probes`): Sluice's worker, a
`command` server on a local port, or an `external` endpoint. An external endpoint is never
replaced (it is the same URL): failed probes send it back to STARTING, out of routing, and
it is probed until it serves again. In a pool with real devices an instance waits in
PENDING until devices are free for it (`policy.devices`), then runs pinned to them.

A launch is first a store write (issue 31): the instance's record, fenced by the leader's
lease epoch like every write, must be stored before its process is spawned, and the
runtime's own lease check (`FencedRuntime`) runs in the same step of the event loop as the
spawn. A deposed controller therefore starts nothing, even one paused between deciding a
launch and making it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import httpx

from sluice.control.events import EventLog, store_outage
from sluice.control.logtail import log_tail
from sluice.control.servers import (
    ProbeFailed,
    Prober,
    Probes,
    launch_request,
    least_held_endpoint,
    placement_of,
    probes_for,
    runs_command,
    stop_grace_s,
)
from sluice.control.supervised import LaunchFailed, Supervised, Unhealthy
from sluice.core import Clock, InstanceState, InstanceStatus, SluiceError
from sluice.policy import Endpoint, ProbeRecord, record_probe
from sluice.policy.devices import DeviceHold, may_wake, place_beside_lent, units_on_each
from sluice.runtime import ExternalRuntime, InstanceHandle, LaunchRequest, Runtime
from sluice.spec import GroupSpec, PoolSpec
from sluice.spec.servers import EndpointSpec, usable_key
from sluice.store import Fenced, InstanceRecord
from sluice.store.ports import InstanceRecords

__all__ = ["InstanceSupervisor"]

log = logging.getLogger("sluice.supervisor")

EXIT_POLL_S = 0.2
"""How often a running instance's process is checked: a kill -9 is seen within this."""
DRAIN_SETTLE_S = 0.5
"""After leaving the routing table, requests already on their way may still arrive."""
LAUNCH_SETTLE_S = 15.0
"""How long a controller handing over lets launches under way finish (so each started
process is named in its record for the next leader)."""
STOP_GRACE_S = 5.0
"""SIGTERM to SIGKILL, at least: a drained instance gets what is left of its group's
`drain_timeout_s` if that is more (a request may slip in after the last idle poll)."""
DRAIN_POLL_S = 0.1
STATS_TIMEOUT_S = 2.0
"""One `/stats` read while draining; a failed one is retried until `drain_timeout_s`."""
WRITE_RETRY_MAX_S = 30.0
"""A refused instance record is retried after 1 s, doubling to this."""
PLACE_POLL_S = 0.2
"""How often an instance waiting for a free device looks again."""

_Durable = tuple[InstanceRecord, asyncio.Future[None]]
"""A record the caller waits for: the future is done once it is stored (or refused)."""

InflightSource = Callable[[], Mapping[str, int]]
"""The gateway's requests in flight per instance id (`Gateway.outstanding`)."""


class InstanceSupervisor:
    def __init__(
        self,
        runtime: Runtime,
        store: InstanceRecords,
        clock: Clock,
        events: EventLog,
        http: httpx.AsyncClient | None = None,
        inflight: InflightSource | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """`http`: the client for probes, warm-up and /stats (default: made by `start`).
        `inflight`: the gateway's in-flight counts, which drain a server that is not
        Sluice's worker (without it such a drain waits out `drain_timeout_s`). `environ`:
        where external endpoints' keys are read (default: this process's environment)."""
        self._runtime = runtime
        self.withheld_env: frozenset[str] = frozenset()
        """Variables holding the spec's secrets, kept out of every instance's environment
        (the controller sets it from each spec it applies: `spec.secrets.secret_env_names`)."""
        self._external = ExternalRuntime()
        self._gateway_inflight = inflight
        self.adopted: set[str] = set()
        """instances a previous run left behind that `recover` kept (their state is not known)"""
        self._environ = os.environ if environ is None else environ
        self._store = store
        self._clock = clock
        self._events = events
        self._instances: dict[str, Supervised] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.lent: frozenset[str] = frozenset()
        """sleeping standby whose units other groups may hold (the controller's, each tick):
        they hold no device, and a borrower may be placed on theirs (`_place`)"""
        self._launching: set[str] = set()
        """instances whose process is being started (`detach` lets them finish)"""
        self._http: httpx.AsyncClient | None = http
        self._asks: Prober | None = None
        self._writes: asyncio.Queue[InstanceRecord | str | _Durable | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._retry_now = asyncio.Event()
        """ends the record writer's backoff: stopping, or a launch waits for its record"""
        self.changed = asyncio.Event()

    async def start(self) -> None:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0, trust_env=False)
        self._asks = Prober(self._http)
        self._writer = asyncio.get_running_loop().create_task(self._write_records())

    # --- what the controller sees -------------------------------------------------------

    def statuses(self) -> list[InstanceStatus]:
        return [i.status() for i in self._instances.values()]

    def command_instances(self) -> set[str]:
        """Instances running a command server (housekeeping: logs that cannot follow a rename)."""
        return {i.id for i in self._instances.values() if runs_command(i.spec)}

    def ready_endpoints(self) -> dict[str, list[Endpoint]]:
        out: dict[str, list[Endpoint]] = {}
        for inst in self._instances.values():
            if inst.state is InstanceState.READY and inst.handle is not None:
                out.setdefault(inst.spec.name, []).append(
                    Endpoint(
                        inst.id,
                        inst.handle.host,
                        inst.handle.port,
                        inst.spec.max_concurrency,
                        inst.ready_at or 0.0,
                        inst.endpoint.api_key_env if inst.endpoint else None,
                    )
                )
        return out

    # --- what the controller asks -------------------------------------------------------

    def launch(
        self, spec: GroupSpec, template: str, reason: str, pool: PoolSpec | None = None
    ) -> str:
        """Start an instance of `spec`; `pool` (the group's) pins it to devices if it has
        any. An external group's instance takes the endpoint fewest of its instances front."""
        inst = Supervised(f"{spec.name}-{uuid.uuid4().hex[:8]}", spec, template, self._clock.now())
        inst.probes = probes_for(spec)
        inst.placement = placement_of(spec, pool)
        if pool is not None and pool.devices:
            inst.pool = pool
        inst.endpoint = self._free_endpoint(spec, template)
        self._instances[inst.id] = inst
        self._spawn(inst, self._lifecycle(inst, reason))
        return inst.id

    async def inflight(self, instance_id: str, timeout_s: float = 2.0) -> int:
        """Requests the instance serves now, as a drain counts them; ProbeFailed if that is
        not known."""
        inst = self._instances.get(instance_id)
        if inst is None or inst.handle is None:
            raise ProbeFailed(f"no running instance {instance_id}")
        return await self._inflight(inst, timeout_s)

    def _free_endpoint(self, spec: GroupSpec, template: str) -> EndpointSpec | None:
        mine = [
            i
            for i in self._instances.values()
            if (i.spec.name, i.template) == (spec.name, template)
        ]
        return least_held_endpoint(spec, [i.endpoint.url for i in mine if i.endpoint is not None])

    def drain(self, instance_id: str, reason: str) -> None:
        inst = self._instances.get(instance_id)
        if inst is None or inst.closing:
            return
        inst.closing = True
        self._cancel(inst)
        self._set_state(inst, InstanceState.DRAINING, reason)
        self._spawn(inst, self._drain(inst, reason))

    def remove(self, instance_id: str, reason: str) -> None:
        inst = self._instances.get(instance_id)
        if inst is None or inst.closing:
            return
        inst.closing = True
        self._cancel(inst)
        self._spawn(inst, self._stop(inst, reason, grace_s=STOP_GRACE_S))

    async def recover(
        self, groups: dict[str, GroupSpec], pools: Mapping[str, PoolSpec] | None = None
    ) -> None:
        """Adopt the ready instances a previous run left behind (with the devices they hold
        in `pools`); stop all others. External endpoints are claimed afresh by new
        instances: that costs a probe, not a start."""
        records = await asyncio.to_thread(self._store.list_instances)
        for rec in records:
            handle = (
                InstanceHandle(rec.id, rec.host, rec.port, rec.pid)
                if rec.host and rec.port
                else None
            )
            spec = groups.get(rec.group)
            alive = handle is not None and rec.pid is not None and self._runtime.adopt(handle)
            probes = probes_for(spec) if spec is not None else Probes()
            # The readiness probe, not /health: a worker still loading its model is alive but
            # must not be routed to; it is replaced like any other instance that is not ready.
            ready = (
                alive and handle is not None and not await self._prober.not_ready(handle, probes)
            )
            if ready and spec is not None and handle is not None:
                inst = Supervised(
                    rec.id,
                    spec,
                    rec.template,
                    rec.created_at,
                    InstanceState.READY,
                    handle,
                    self._clock.now(),
                    probes=probes,
                )
                pool = (pools or {}).get(spec.resources.pool)
                if pool is not None and pool.devices and rec.devices:
                    inst.pool, inst.devices = pool, tuple(rec.devices.split(","))
                    res = spec.resources
                    inst.device_units = units_on_each(
                        res.accelerators, pool.units_per_device, res.fractional
                    )
                self._instances[inst.id] = inst
                self.adopted.add(inst.id)
                self._spawn(inst, self._watch(inst))
                await self._events.emit(
                    rec.group, rec.id, "adopted", "instance of the previous run is ready; kept"
                )
                continue
            if alive and handle is not None:
                await self._runtime.stop(handle, grace_s=STOP_GRACE_S)
            self._writes.put_nowait(rec.id)
            await self._events.emit(
                rec.group,
                rec.id,
                "cleaned",
                "instance of the previous run stopped: "
                + (
                    "group no longer exists"
                    if spec is None
                    else "not ready (still loading, or unhealthy)"
                    if alive
                    else "an external endpoint, claimed afresh"
                    if rec.pid is None and rec.host
                    else "process gone"
                ),
            )
        self.changed.set()

    async def detach(self) -> int:
        """Stop supervising without stopping anything (a controller handing over): every
        instance keeps running under its record as last written, for the next leader to
        adopt (`recover`). Launches under way finish first (up to `LAUNCH_SETTLE_S`), so no
        process is left running that no record names. Returns the instances left."""
        settle = asyncio.get_running_loop().time() + LAUNCH_SETTLE_S
        while self._launching and asyncio.get_running_loop().time() < settle:
            await asyncio.sleep(0.05)
        left = len(self._instances)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._close_writer()
        return left

    async def shutdown(self) -> None:
        """Stop every instance (drain READY ones) and wait for all of them."""
        for inst in list(self._instances.values()):
            if inst.state is InstanceState.READY:
                self.drain(inst.id, "sluice is shutting down")
            else:
                self.remove(inst.id, "sluice is shutting down")
        # every task still running, also of instances already gone (writing "stopped")
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._close_writer()

    async def _close_writer(self) -> None:
        """Write what is queued (each record tried once more), then close."""
        self._closing.set()
        self._retry_now.set()
        self._writes.put_nowait(None)
        if self._writer is not None:
            await self._writer
        if self._http is not None:
            await self._http.aclose()

    # --- lifecycle ----------------------------------------------------------------------

    async def _lifecycle(self, inst: Supervised, reason: str) -> None:
        spec = inst.spec
        await self._events.emit(spec.name, inst.id, "launch", reason, template=inst.template)
        try:
            if inst.endpoint is not None:
                await self._front(inst, inst.endpoint)
                return
            # launch to ready within startup_timeout_s, whatever part each step takes
            deadline = inst.created_at + spec.health.startup_timeout_s
            await self._place(inst, deadline)
            listen_s = max(1.0, deadline - self._clock.now())
            request = replace(
                launch_request(inst.id, spec, inst.devices, listen_s),
                withheld_env=self.withheld_env,
                placement=inst.placement,
            )
            await self._record_launch(inst, deadline)
            self._launching.add(inst.id)
            try:
                inst.handle = await self._runtime.launch(request)
            finally:
                self._launching.discard(inst.id)
            self._set_state(inst, InstanceState.STARTING, "process started")
            await self._wait_ready(inst, deadline)
            self._set_state(inst, InstanceState.WARMING, "model loaded")
            await self._warm_up(inst)
            await self._became_ready(inst, "ready")
            await self._watch(inst)
        except Fenced as exc:
            fence = self._store.write_fence
            if fence is not None and fence.deposed:  # the new leader decides about this one
                log.warning("%s not launched: %s", inst.id, exc)
                return
            await self._fail(inst, str(exc))  # renewals late (the store away): replaced later
        except (LaunchFailed, SluiceError) as exc:
            await self._fail(inst, str(exc))

    async def _record_launch(self, inst: Supervised, deadline: float) -> None:
        """Store the launch (PENDING, "launching") and wait until it is: a fenced write,
        so a deposed controller learns it here, before any process exists. A store that
        does not take it by `deadline` (at least a second from now) fails the launch."""
        rec = self._record(inst, InstanceState.PENDING, "launching")
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writes.put_nowait((rec, stored))
        self._retry_now.set()  # a refused record before it is retried at once, not in 30 s
        self.changed.set()
        try:
            async with asyncio.timeout(max(1.0, deadline - self._clock.now())):
                await stored
        except TimeoutError:
            raise LaunchFailed(
                "the launch could not be recorded in the store in time "
                f"({self._events.health.problem or 'no answer'}): not started"
            ) from None

    async def _became_ready(self, inst: Supervised, kind: str) -> None:
        inst.ready_at = self._clock.now()
        took = inst.ready_at - inst.created_at
        self._set_state(inst, InstanceState.READY, f"ready in {took:.1f}s")
        await self._events.emit(
            inst.spec.name, inst.id, kind, f"ready {took:.1f}s after launch", startup_s=took
        )

    async def _front(self, inst: Supervised, endpoint: EndpointSpec) -> None:
        """An external endpoint: probe until it serves, warm it, route to it while its
        health probes pass; when they fail, out of routing and back to probing. It is the
        same URL whatever happens, so it is never failed for the controller to replace
        (only a missing key fails it: probing cannot fix that)."""
        spec = inst.spec
        key = None
        if endpoint.api_key_env is not None:
            key = self._environ.get(endpoint.api_key_env, "")
            if not usable_key(key):
                raise LaunchFailed(
                    f"endpoint {endpoint.url} takes its key from ${endpoint.api_key_env}, "
                    "which is unset, empty or not a key (printable ASCII, no spaces) in "
                    "Sluice's environment"
                )
        inst.probes = probes_for(spec, key)
        request = LaunchRequest(inst.id, spec.name, {}, {}, endpoint=endpoint.url)
        inst.handle = await self._external.launch(request)
        self._set_state(inst, InstanceState.STARTING, f"probing {endpoint.url}")
        kind = "ready"
        while True:
            await self._wait_ready(inst, None, warn=kind == "ready")
            try:
                self._set_state(inst, InstanceState.WARMING, "answers its readiness probe")
                await self._warm_up(inst)
                await self._became_ready(inst, kind)
                await self._watch(inst)
            except LaunchFailed as exc:
                why = f"out of routing: {exc}"
                self._set_state(inst, InstanceState.STARTING, why)
                await self._events.emit(spec.name, inst.id, "unhealthy", f"{endpoint.url} {why}")
                kind = "recovered"
                await asyncio.sleep(spec.health.interval_s)

    async def _place(self, inst: Supervised, deadline: float) -> None:
        """Devices for an instance of a pool that pins them: at once when free, else wait
        (PENDING, with the reason) until an instance holding some is gone."""
        pool = inst.pool
        if pool is None or not pool.devices:
            return
        res = inst.spec.resources
        while True:
            holds = self._device_holds(pool.name, inst.id)
            grant = place_beside_lent(
                pool.devices,
                pool.units_per_device,
                holds,
                res.accelerators,
                res.fractional,
                self.lent,
            )
            if grant.ok:
                inst.devices, inst.device_units = grant.devices, grant.units
                self._set_state(inst, InstanceState.PENDING, f"devices {','.join(grant.devices)}")
                return
            why = f"waiting for devices of pool {pool.name!r}: {grant.reason}"
            if self._clock.now() > deadline:
                raise LaunchFailed(
                    f"not placed {inst.spec.health.startup_timeout_s:g}s after launch; {why}"
                )
            if inst.reason != why:
                self._set_state(inst, InstanceState.PENDING, why)
            await asyncio.sleep(PLACE_POLL_S)

    def _device_holds(self, pool: str, but: str) -> list[DeviceHold]:
        """The devices of `pool` that instances other than `but` hold: every instance
        pinned there until its process is gone (the lent sleepers' too: the caller leaves
        them out)."""
        return [
            DeviceHold(i.id, i.devices, i.device_units)
            for i in self._instances.values()
            if i.pool is not None and i.pool.name == pool and i.devices and i.id != but
        ]

    def devices_free_for(self, instance_id: str) -> bool:
        """Whether a sleeper may wake where it lives: nothing else holds its devices (one
        placed there while its units were lent must be gone first). True off pinned pools."""
        inst = self._instances.get(instance_id)
        if inst is None or inst.pool is None or not inst.devices:
            return True
        me = DeviceHold(inst.id, inst.devices, inst.device_units)
        holds = self._device_holds(inst.pool.name, instance_id)
        return may_wake(me, inst.pool.units_per_device, holds, self.lent)

    async def _wait_ready(
        self, inst: Supervised, deadline: float | None, warn: bool = True
    ) -> None:
        """Until the readiness probe says ready; past `deadline`, fail. Without one (an
        external endpoint) it probes on, and says once that it is late."""
        assert inst.handle is not None
        url = inst.handle.url + inst.probes.ready_path
        late_at = inst.created_at + inst.spec.health.startup_timeout_s
        told = not warn  # (an endpoint back to probing was said "unhealthy" already)
        while True:
            self._check_exit(inst)
            why = await self._prober.not_ready(inst.handle, inst.probes)
            if not why:
                return
            if inst.reason != why:
                self._set_state(inst, inst.state, why)
            now = self._clock.now()
            if deadline is not None and now > deadline:
                raise LaunchFailed(
                    f"not ready {inst.spec.health.startup_timeout_s:g}s after launch; last: {why}"
                )
            if deadline is None and now > late_at and not told:
                told = True
                await self._events.emit(
                    inst.spec.name, inst.id, "not-ready", f"{url} not ready yet: {why}"
                )
            await asyncio.sleep(0.1)

    async def _warm_up(self, inst: Supervised) -> None:
        assert inst.handle is not None
        try:
            await self._prober.warm_up(inst.handle, inst.probes, inst.spec.warmup)
        except ProbeFailed as exc:
            raise LaunchFailed(str(exc)) from None

    async def _watch(self, inst: Supervised) -> None:
        """S10: a dead process or `failure_threshold` failed probes in a row fail it."""
        assert inst.handle is not None
        health = inst.spec.health
        record = ProbeRecord()
        loop = asyncio.get_running_loop()
        next_probe = loop.time() + health.interval_s
        while True:
            self._check_exit(inst)
            if loop.time() >= next_probe:
                ok = await self._prober.healthy(inst.handle, inst.probes, health.timeout_s)
                record, unhealthy = record_probe(
                    record, ok, "health probe failed", health.failure_threshold
                )
                if unhealthy:
                    raise Unhealthy(f"{record.consecutive_failures} health probes failed in a row")
                next_probe = loop.time() + health.interval_s
            await asyncio.sleep(EXIT_POLL_S)

    async def _drain(self, inst: Supervised, reason: str) -> None:
        """S6: out of routing first, then wait until in-flight requests finish (two idle
        reads in a row: the worker's `/stats`, or for a server that is not Sluice's, the
        gateway's count), then stop. A failed read proves nothing: it is retried until
        `drain_timeout_s`; only a process that is gone ends the wait early. SIGTERM (or the
        command's stop signal) then lets it finish what it still has for the rest of that
        time (at least STOP_GRACE_S, or the command's stop_grace_s) before SIGKILL."""
        spec = inst.spec
        await self._events.emit(spec.name, inst.id, "drain", reason)
        await asyncio.sleep(DRAIN_SETTLE_S)
        deadline = self._clock.now() + spec.drain_timeout_s
        idle_polls = failed = 0
        error = ""
        drained = False
        while (left := deadline - self._clock.now()) > 0:
            if self._exited(inst):
                drained = True  # nothing left to wait for
                break
            try:
                inflight = await self._inflight(inst, min(STATS_TIMEOUT_S, left))
            except ProbeFailed as exc:
                failed, error, idle_polls = failed + 1, str(exc), 0
                await asyncio.sleep(min(1.0, DRAIN_POLL_S * 2**failed, max(0.0, left)))
                continue
            idle_polls = idle_polls + 1 if inflight == 0 else 0
            if idle_polls >= 2:
                drained = True
                break
            await asyncio.sleep(DRAIN_POLL_S)
        if not drained:
            source = "/stats" if inst.probes.own_inflight else "the gateway's in-flight count"
            unread = f"; {source} failed {failed} times (last: {error})" if failed else ""
            await self._events.emit(
                spec.name,
                inst.id,
                "drain-timeout",
                f"requests may still be in flight after {spec.drain_timeout_s:g}s"
                f"{unread}; stopping anyway",
            )
        grace = max(STOP_GRACE_S, deadline - self._clock.now())
        await self._stop(inst, reason, grace_s=grace)

    async def _stop(self, inst: Supervised, reason: str, grace_s: float) -> None:
        if inst.handle is not None:
            grace = stop_grace_s(inst.spec, grace_s)
            code = await self._runtime_of(inst).stop(inst.handle, grace)
            detail = f" (exit code {code})" if code not in (0, None) else ""
        else:
            detail = ""
        inst.state, inst.reason = InstanceState.STOPPED, reason
        self._instances.pop(inst.id, None)
        self._writes.put_nowait(inst.id)
        await self._events.emit(inst.spec.name, inst.id, "stopped", reason + detail)
        self.changed.set()

    async def _fail(self, inst: Supervised, why: str) -> None:
        """Record why, with the last lines of the instance's log, then mark FAILED: the
        controller reacts to the state at once (it removes the instance, which stops the
        process and cancels this task), so the event must be written first."""
        log_path = self._runtime_of(inst).log_path(inst.id)
        tail = await asyncio.to_thread(log_tail, log_path)
        said = f"; its log ends: {' | '.join(tail[-3:])}" if tail else ""
        await self._events.emit(
            inst.spec.name, inst.id, "failed", why + said, log=log_path, log_tail=tail
        )
        self._set_state(inst, InstanceState.FAILED, why)

    # --- helpers ------------------------------------------------------------------------

    @property
    def _prober(self) -> Prober:
        assert self._asks is not None, "start() first"
        return self._asks

    def _runtime_of(self, inst: Supervised) -> Runtime:
        return self._external if inst.endpoint is not None else self._runtime

    def _check_exit(self, inst: Supervised) -> None:
        assert inst.handle is not None
        code = self._runtime_of(inst).exit_code(inst.handle)
        if code is not None:
            raise LaunchFailed(f"process exited with code {code}")

    def _exited(self, inst: Supervised) -> bool:
        return inst.handle is None or self._runtime_of(inst).exit_code(inst.handle) is not None

    async def _inflight(self, inst: Supervised, timeout_s: float) -> int:
        """Requests the instance is serving now; ProbeFailed if that is not known."""
        assert inst.handle is not None
        if not inst.probes.own_inflight:
            if self._gateway_inflight is None:
                raise ProbeFailed("no gateway in this process counts its requests")
            return self._gateway_inflight().get(inst.id, 0)
        return await self._prober.worker_inflight(inst.handle, timeout_s)

    def _set_state(self, inst: Supervised, state: InstanceState, reason: str) -> None:
        self._writes.put_nowait(self._record(inst, state, reason))
        self.changed.set()

    def _record(self, inst: Supervised, state: InstanceState, reason: str) -> InstanceRecord:
        """`inst` in `state` for `reason`, as the store keeps it."""
        inst.state, inst.reason = state, reason
        return InstanceRecord(
            id=inst.id,
            group=inst.spec.name,
            template=inst.template,
            state=state.value,
            pid=inst.handle.pid if inst.handle else None,
            host=inst.handle.host if inst.handle else None,
            port=inst.handle.port if inst.handle else None,
            created_at=inst.created_at,
            updated_at=self._clock.now(),
            reason=reason,
            devices=",".join(inst.devices),
        )

    async def _write_records(self) -> None:
        """One writer, in order, off the event loop: a record, an id to delete, or None
        to finish. Order matters: a late upsert must never resurrect a deleted instance.
        A write the store refuses is retried (1 s doubling to 30 s; once only while
        shutting down); a fenced one (this controller is deposed) is dropped, said once;
        any other error is logged and the record skipped, so the writer never stops. A
        record someone waits for (`_record_launch`) is told how its write ended."""
        fenced = False
        while (item := await self._writes.get()) is not None:
            retry = 1.0
            waiter: asyncio.Future[None] | None = None
            if isinstance(item, tuple):
                item, waiter = item
            while True:
                try:
                    if isinstance(item, str):
                        await asyncio.to_thread(self._store.delete_instance, item)
                    else:
                        await asyncio.to_thread(self._store.upsert_instance, item)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
                    break
                except Exception as exc:
                    problem = store_outage(exc)
                    what = item if isinstance(item, str) else item.id
                    gave_up = problem is None or self._closing.is_set()
                    if gave_up and waiter is not None and not waiter.done():
                        waiter.set_exception(exc)
                    if isinstance(exc, Fenced):
                        if not fenced:
                            log.warning("instance records are not written any more: %s", exc)
                        fenced = True
                        break
                    if problem is None:
                        log.exception("instance record of %s not written", what)
                        break
                    self._events.health.refuse(problem, exc, self._clock.now())
                    if self._closing.is_set():
                        log.error("%s: instance record of %s not written", problem, what)
                        break
                    self._retry_now.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(retry):
                            await self._retry_now.wait()
                    retry = min(WRITE_RETRY_MAX_S, retry * 2)

    def _spawn(self, inst: Supervised, coro: Any) -> None:
        inst.task = asyncio.get_running_loop().create_task(coro, name=f"instance:{inst.id}")
        self._tasks.add(inst.task)
        inst.task.add_done_callback(self._tasks.discard)
        inst.task.add_done_callback(self._task_done)

    def _cancel(self, inst: Supervised) -> None:
        if inst.task is not None and not inst.task.done():
            inst.task.cancel()

    @staticmethod
    def _task_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("instance task %s crashed", task.get_name(), exc_info=task.exception())
