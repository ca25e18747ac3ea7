"""Runs each instance through its lifecycle: launch, ready probe, warm-up, health, drain.

One task per instance. The controller decides *what* (launch, drain, remove); this module
does it and reports state changes through `changed`, so routing follows at once:

    PENDING -launch-> STARTING -/ready-> WARMING -warm-up-> READY -drain-> DRAINING -> STOPPED
    any state -(exit, probe failures, timeout)-> FAILED   (the controller then replaces it)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from sluice.control.events import EventLog, store_outage
from sluice.core import Clock, InstanceState, InstanceStatus, SluiceError
from sluice.policy import Endpoint, ProbeRecord, record_probe
from sluice.runtime import InstanceHandle, LaunchRequest, Runtime
from sluice.spec import GroupSpec
from sluice.store import InstanceRecord, Store

__all__ = ["InstanceSupervisor"]

log = logging.getLogger("sluice.supervisor")

EXIT_POLL_S = 0.2
"""How often a running instance's process is checked: a kill -9 is seen within this."""
DRAIN_SETTLE_S = 0.5
"""After leaving the routing table, requests already on their way may still arrive."""
STOP_GRACE_S = 5.0
"""SIGTERM to SIGKILL, at least: a drained instance gets what is left of its group's
`drain_timeout_s` if that is more (a request may slip in after the last idle poll)."""
DRAIN_POLL_S = 0.1
STATS_TIMEOUT_S = 2.0
"""One `/stats` read while draining; a failed one is retried until `drain_timeout_s`."""
WRITE_RETRY_MAX_S = 30.0
"""A refused instance record is retried after 1 s, doubling to this."""


class _Failed(Exception):
    pass


class _PollFailed(Exception):
    pass


@dataclass(eq=False)
class _Instance:
    id: str
    spec: GroupSpec
    template: str
    created_at: float
    state: InstanceState = InstanceState.PENDING
    handle: InstanceHandle | None = None
    ready_at: float | None = None
    reason: str = ""
    closing: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def status(self) -> InstanceStatus:
        return InstanceStatus(
            id=self.id,
            group=self.spec.name,
            template=self.template,
            state=self.state,
            created_at=self.created_at,
            url=self.handle.url if self.handle else None,
            ready_at=self.ready_at,
            reason=self.reason,
            pid=self.handle.pid if self.handle else None,
        )


class InstanceSupervisor:
    def __init__(
        self,
        runtime: Runtime,
        store: Store,
        clock: Clock,
        events: EventLog,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        """`http`: the client for probes, warm-up and /stats (default: made by `start`)."""
        self._runtime = runtime
        self._store = store
        self._clock = clock
        self._events = events
        self._instances: dict[str, _Instance] = {}
        self._http: httpx.AsyncClient | None = http
        self._writes: asyncio.Queue[InstanceRecord | str | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self.changed = asyncio.Event()

    async def start(self) -> None:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10.0, trust_env=False)
        self._writer = asyncio.get_running_loop().create_task(self._write_records())

    # --- what the controller sees -------------------------------------------------------

    def statuses(self) -> list[InstanceStatus]:
        return [i.status() for i in self._instances.values()]

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
                    )
                )
        return out

    # --- what the controller asks -------------------------------------------------------

    def launch(self, spec: GroupSpec, template: str, reason: str) -> str:
        inst = _Instance(f"{spec.name}-{uuid.uuid4().hex[:8]}", spec, template, self._clock.now())
        self._instances[inst.id] = inst
        self._spawn(inst, self._lifecycle(inst, reason))
        return inst.id

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

    async def recover(self, groups: dict[str, GroupSpec]) -> None:
        """Adopt the ready instances a previous run left behind; stop all others."""
        records = await asyncio.to_thread(self._store.list_instances)
        for rec in records:
            handle = (
                InstanceHandle(rec.id, rec.host, rec.port, rec.pid)
                if rec.host and rec.port
                else None
            )
            spec = groups.get(rec.group)
            alive = handle is not None and self._runtime.adopt(handle)
            # /ready, not /health: a worker still loading its model is alive but must not
            # be routed to; it is replaced like any other instance that is not ready.
            ready = alive and handle is not None and await self._probe(handle, path="/ready")
            if ready and spec is not None and handle is not None:
                inst = _Instance(
                    rec.id,
                    spec,
                    rec.template,
                    rec.created_at,
                    InstanceState.READY,
                    handle,
                    self._clock.now(),
                )
                self._instances[inst.id] = inst
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
                    else "process gone"
                ),
            )
        self.changed.set()

    async def shutdown(self) -> None:
        """Stop every instance (drain READY ones) and wait for all of them."""
        for inst in list(self._instances.values()):
            if inst.state is InstanceState.READY:
                self.drain(inst.id, "sluice is shutting down")
            else:
                self.remove(inst.id, "sluice is shutting down")
        tasks = [i.task for i in self._instances.values() if i.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        self._closing.set()
        self._writes.put_nowait(None)
        if self._writer is not None:
            await self._writer
        if self._http is not None:
            await self._http.aclose()

    # --- lifecycle ----------------------------------------------------------------------

    async def _lifecycle(self, inst: _Instance, reason: str) -> None:
        spec = inst.spec
        await self._events.emit(spec.name, inst.id, "launch", reason, template=inst.template)
        try:
            inst.handle = await self._runtime.launch(self._launch_request(inst))
            self._set_state(inst, InstanceState.STARTING, "process started")
            await self._wait_ready(inst)
            self._set_state(inst, InstanceState.WARMING, "model loaded")
            await self._warm_up(inst)
            inst.ready_at = self._clock.now()
            took = inst.ready_at - inst.created_at
            self._set_state(inst, InstanceState.READY, f"ready in {took:.1f}s")
            await self._events.emit(
                spec.name, inst.id, "ready", f"ready {took:.1f}s after launch", startup_s=took
            )
            await self._watch(inst)
        except (_Failed, SluiceError) as exc:
            await self._fail(inst, str(exc))

    async def _wait_ready(self, inst: _Instance) -> None:
        assert inst.handle is not None and self._http is not None
        deadline = self._clock.now() + inst.spec.health.startup_timeout_s
        while True:
            self._check_exit(inst)
            with contextlib.suppress(httpx.HTTPError):
                r = await self._http.get(f"{inst.handle.url}/ready", timeout=2.0)
                if r.status_code == 200:
                    return
            if self._clock.now() > deadline:
                raise _Failed(f"not ready {inst.spec.health.startup_timeout_s:g}s after launch")
            await asyncio.sleep(0.1)

    async def _warm_up(self, inst: _Instance) -> None:
        """S3: each model answers `warmup.requests` real requests before taking traffic."""
        assert inst.handle is not None and self._http is not None
        warm = inst.spec.warmup
        for model_id, model in inst.spec.models.items():
            body: dict[str, Any]
            if model.runtime == "embedding":
                path, body = "/v1/embeddings", {"model": model_id, "input": "warm-up"}
            else:
                path, body = (
                    "/v1/chat/completions",
                    {
                        "model": model_id,
                        "max_tokens": 4,
                        "messages": [{"role": "user", "content": "warm-up"}],
                    },
                )
            for _ in range(warm.requests):
                try:
                    r = await self._http.post(
                        inst.handle.url + path, json=body, timeout=warm.timeout_s
                    )
                except httpx.HTTPError as exc:
                    raise _Failed(f"warm-up of {model_id} failed: {exc!r}") from None
                if r.status_code != 200:
                    raise _Failed(f"warm-up of {model_id} answered {r.status_code}: {r.text[:200]}")

    async def _watch(self, inst: _Instance) -> None:
        """S10: a dead process or `failure_threshold` failed probes in a row fail it."""
        assert inst.handle is not None
        health = inst.spec.health
        record = ProbeRecord()
        loop = asyncio.get_running_loop()
        next_probe = loop.time() + health.interval_s
        while True:
            self._check_exit(inst)
            if loop.time() >= next_probe:
                ok = await self._probe(inst.handle, health.timeout_s)
                record, unhealthy = record_probe(
                    record, ok, "health probe failed", health.failure_threshold
                )
                if unhealthy:
                    raise _Failed(f"{record.consecutive_failures} health probes failed in a row")
                next_probe = loop.time() + health.interval_s
            await asyncio.sleep(EXIT_POLL_S)

    async def _drain(self, inst: _Instance, reason: str) -> None:
        """S6: out of routing first, then wait until in-flight requests finish (two idle
        `/stats` reads in a row), then stop. A failed read proves nothing: it is retried
        until `drain_timeout_s`; only a process that is gone ends the wait early. SIGTERM
        then lets the worker finish what it still has for the rest of that time (at least
        STOP_GRACE_S) before SIGKILL."""
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
            except _PollFailed as exc:
                failed, error, idle_polls = failed + 1, str(exc), 0
                await asyncio.sleep(min(1.0, DRAIN_POLL_S * 2**failed, max(0.0, left)))
                continue
            idle_polls = idle_polls + 1 if inflight == 0 else 0
            if idle_polls >= 2:
                drained = True
                break
            await asyncio.sleep(DRAIN_POLL_S)
        if not drained:
            unread = f"; /stats failed {failed} times (last: {error})" if failed else ""
            await self._events.emit(
                spec.name,
                inst.id,
                "drain-timeout",
                f"requests may still be in flight after {spec.drain_timeout_s:g}s"
                f"{unread}; stopping anyway",
            )
        grace = max(STOP_GRACE_S, deadline - self._clock.now())
        await self._stop(inst, reason, grace_s=grace)

    async def _stop(self, inst: _Instance, reason: str, grace_s: float) -> None:
        if inst.handle is not None:
            code = await self._runtime.stop(inst.handle, grace_s)
            detail = f" (exit code {code})" if code not in (0, None) else ""
        else:
            detail = ""
        inst.state, inst.reason = InstanceState.STOPPED, reason
        self._instances.pop(inst.id, None)
        self._writes.put_nowait(inst.id)
        await self._events.emit(inst.spec.name, inst.id, "stopped", reason + detail)
        self.changed.set()

    async def _fail(self, inst: _Instance, why: str) -> None:
        """Record why, then mark FAILED: the controller reacts to the state at once (it
        removes the instance, which stops the process and cancels this task), so the event
        must be written first."""
        log_path = self._runtime.log_path(inst.id)
        await self._events.emit(inst.spec.name, inst.id, "failed", why, log=log_path)
        self._set_state(inst, InstanceState.FAILED, why)

    # --- helpers ------------------------------------------------------------------------

    def _check_exit(self, inst: _Instance) -> None:
        assert inst.handle is not None
        code = self._runtime.exit_code(inst.handle)
        if code is not None:
            raise _Failed(f"process exited with code {code}")

    async def _probe(
        self, handle: InstanceHandle, timeout_s: float = 2.0, path: str = "/health"
    ) -> bool:
        assert self._http is not None
        try:
            r = await self._http.get(f"{handle.url}{path}", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def _exited(self, inst: _Instance) -> bool:
        return inst.handle is None or self._runtime.exit_code(inst.handle) is not None

    async def _inflight(self, inst: _Instance, timeout_s: float) -> int:
        """Requests the instance is serving now; _PollFailed if it did not say."""
        assert inst.handle is not None and self._http is not None
        try:
            r = await self._http.get(f"{inst.handle.url}/stats", timeout=timeout_s)
            r.raise_for_status()
            return int(r.json()["inflight"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise _PollFailed(f"{type(exc).__name__}: {exc}"[:200]) from None

    def _launch_request(self, inst: _Instance) -> LaunchRequest:
        spec = inst.spec
        config: dict[str, Any] = {
            "instance_id": inst.id,
            "group": spec.name,
            "max_concurrency": spec.max_concurrency,
            "models": {k: m.model_dump(mode="json") for k, m in spec.models.items()},
        }
        env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        return LaunchRequest(inst.id, spec.name, config, env)

    def _set_state(self, inst: _Instance, state: InstanceState, reason: str) -> None:
        inst.state, inst.reason = state, reason
        rec = InstanceRecord(
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
        )
        self._writes.put_nowait(rec)
        self.changed.set()

    async def _write_records(self) -> None:
        """One writer, in order, off the event loop: a record, an id to delete, or None
        to finish. Order matters: a late upsert must never resurrect a deleted instance.
        A write the store refuses is retried (1 s doubling to 30 s; once only while
        shutting down); any other error is logged and the record skipped, so the writer
        never stops."""
        while (item := await self._writes.get()) is not None:
            retry = 1.0
            while True:
                try:
                    if isinstance(item, str):
                        await asyncio.to_thread(self._store.delete_instance, item)
                    else:
                        await asyncio.to_thread(self._store.upsert_instance, item)
                    break
                except Exception as exc:
                    problem = store_outage(exc)
                    what = item if isinstance(item, str) else item.id
                    if problem is None:
                        log.exception("instance record of %s not written", what)
                        break
                    self._events.health.refuse(problem, exc, self._clock.now())
                    if self._closing.is_set():
                        log.error("%s: instance record of %s not written", problem, what)
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._closing.wait(), retry)
                    retry = min(WRITE_RETRY_MAX_S, retry * 2)

    def _spawn(self, inst: _Instance, coro: Any) -> None:
        inst.task = asyncio.get_running_loop().create_task(coro, name=f"instance:{inst.id}")
        inst.task.add_done_callback(self._task_done)

    def _cancel(self, inst: _Instance) -> None:
        if inst.task is not None and not inst.task.done():
            inst.task.cancel()

    @staticmethod
    def _task_done(task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("instance task %s crashed", task.get_name(), exc_info=task.exception())
