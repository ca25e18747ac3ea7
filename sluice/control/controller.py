"""The reconcile loop: drive every group to its desired instances, and keep routing current.

`tick()` is the whole brain, in numbered steps (snapshot, decide, apply, publish); the
decisions are `sluice.policy.plan_group`, the same code the simulator runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from sluice.control.events import EventLog
from sluice.control.supervisor import InstanceSupervisor
from sluice.core import Clock, Conflict, InstanceState, InstanceStatus, NotFound
from sluice.policy import (
    CrashBackoff,
    Drain,
    GroupTarget,
    Launch,
    Remove,
    RoutingSnapshot,
    build_routing_snapshot,
    plan_group,
)
from sluice.spec import LoadedSpec, PlatformSpec, load_spec_text, revision_diff
from sluice.store import Revision, Store

__all__ = ["Controller"]

log = logging.getLogger("sluice.controller")

TICK_S = 1.0
"""Longest pause between two reconcile passes; any instance state change wakes it sooner."""


class Controller:
    def __init__(
        self,
        store: Store,
        supervisor: InstanceSupervisor,
        events: EventLog,
        clock: Clock,
        publish: Callable[[RoutingSnapshot], None],
    ) -> None:
        self._store = store
        self._supervisor = supervisor
        self._events = events
        self._clock = clock
        self._publish = publish
        self._spec: PlatformSpec | None = None
        self._revision = 0
        self._overrides: dict[str, int] = {}
        self._failovers: dict[str, str] = {}
        self._routing_version = 0
        self._published_key: object = None
        self._wake = supervisor.changed
        self._backoff: dict[str, CrashBackoff] = {}
        self._seen: set[str] = set()
        """Instances already counted as failed or ready, for the crash-loop backoff."""

    # --- state ---------------------------------------------------------------------------

    @property
    def spec(self) -> PlatformSpec:
        if self._spec is None:
            raise NotFound("no spec has been applied yet")
        return self._spec

    @property
    def revision(self) -> int:
        return self._revision

    def desired_replicas(self, group: str) -> int:
        spec = self.spec.group(group)
        if spec is None:
            raise NotFound(f"no group named {group!r}")
        return self._overrides.get(group, spec.replicas)

    async def load_state(self) -> None:
        """Resume from the store: the latest revision and live overrides."""
        latest = await asyncio.to_thread(self._store.latest_revision)
        if latest is not None:
            self._spec = load_spec_text(latest.yaml_text, f"revision {latest.number}").spec
            self._revision = latest.number
        self._overrides = await asyncio.to_thread(self._store.replicas_overrides)
        self._failovers = await asyncio.to_thread(self._store.failovers)

    # --- operator actions ----------------------------------------------------------------

    async def apply(self, loaded: LoadedSpec, author: str, reason: str) -> Revision | None:
        """Record a new numbered revision (with its diff) and reconcile toward it.

        Returns None when the YAML is identical to the current revision (nothing to do).
        A group whose `replicas` changed in the spec drops its manual override.
        """
        latest = await asyncio.to_thread(self._store.latest_revision)
        if latest is not None and latest.yaml_text == loaded.text:
            return None
        number = (latest.number if latest else 0) + 1
        diff = revision_diff(latest.yaml_text if latest else None, loaded.text, number)
        rev = await asyncio.to_thread(
            self._store.add_revision,
            yaml_text=loaded.text,
            author=author,
            reason=reason,
            diff=diff,
            now=self._clock.now(),
        )
        old = self._spec
        for group in loaded.spec.groups:
            before = old.group(group.name) if old else None
            if group.name in self._overrides and (
                before is None or before.replicas != group.replicas
            ):
                await asyncio.to_thread(self._store.clear_replicas_override, group.name)
                self._overrides.pop(group.name)
        await self._audit(
            author, "apply", f"revision/{rev.number}", reason, {"lines_changed": diff.count("\n")}
        )
        self._spec, self._revision = loaded.spec, rev.number
        self._wake.set()
        return rev

    async def scale(self, group: str, replicas: int, actor: str, reason: str) -> int:
        """S1: manual replica count, effective on the next tick, audited. Returns the old."""
        spec = self.spec.group(group)
        if spec is None:
            raise NotFound(f"no group named {group!r}")
        if replicas < 0:
            raise Conflict(f"replicas must be >= 0, got {replicas}")
        pool = self.spec.pool(spec.resources.pool)
        assert pool is not None  # the spec checks guarantee it
        others = sum(
            self.desired_replicas(g.name) * g.resources.accelerators
            for g in self.spec.groups
            if g.resources.pool == pool.name and g.name != group
        )
        need = replicas * spec.resources.accelerators
        if others + need > pool.count:
            raise Conflict(
                f"pool {pool.name!r} has {pool.count} accelerators; other groups hold "
                f"{others}, so {group!r} can have at most "
                f"{(pool.count - others) // spec.resources.accelerators} replicas",
                pool=pool.name,
                free=pool.count - others,
            )
        before = self.desired_replicas(group)
        await asyncio.to_thread(
            self._store.set_replicas_override,
            group=group,
            replicas=replicas,
            actor=actor,
            reason=reason,
            now=self._clock.now(),
        )
        await self._audit(
            actor, "scale", f"group/{group}", reason, {"from": before, "to": replicas}
        )
        self._overrides[group] = replicas
        await self._events.emit(
            group, None, "scale", f"manual scale {before} -> {replicas} by {actor}: {reason}"
        )
        self._wake.set()
        return before

    @property
    def failovers(self) -> dict[str, str]:
        return dict(self._failovers)

    async def failover(self, group: str, backup: str | None, actor: str, reason: str) -> str:
        """R3: send all of `group`'s traffic to `backup` (default: the group's `backup`) at
        once, until `restore`. Audited; the gateway gets a new table right away.

        Refused when the backup could not serve every caller of the group: it must serve
        all the group's models and every tenant allowed the group must be allowed it too.
        """
        spec = self.spec
        source = spec.group(group)
        if source is None:
            raise NotFound(f"no group named {group!r}")
        target_name = backup or source.backup
        if target_name is None:
            raise Conflict(f"group {group!r} has no `backup` in the spec; pass --to BACKUP")
        target = spec.group(target_name)
        if target is None or target_name == group:
            raise Conflict(f"backup {target_name!r} must be another existing group")
        missing = sorted(set(source.models) - set(target.models))
        if missing:
            raise Conflict(
                f"{target_name!r} does not serve {', '.join(missing)}, which {group!r} serves"
            )
        shut_out = [
            t.name
            for t in spec.tenants
            if ("*" in t.groups or group in t.groups)
            and not ("*" in t.groups or target_name in t.groups)
        ]
        if shut_out:
            raise Conflict(
                f"tenant(s) {', '.join(shut_out)} may use {group!r} but not {target_name!r}"
            )
        await asyncio.to_thread(
            self._store.set_failover,
            group=group,
            backup=target_name,
            actor=actor,
            reason=reason,
            now=self._clock.now(),
        )
        await self._audit(actor, "failover", f"group/{group}", reason, {"to": target_name})
        self._failovers[group] = target_name
        self._publish_routing(spec)
        await self._events.emit(group, None, "failover", f"all traffic -> {target_name}: {reason}")
        return target_name

    async def restore(self, group: str, actor: str, reason: str) -> str | None:
        """Undo `failover`; returns the backup it pointed to (None if none was in force)."""
        if self.spec.group(group) is None:
            raise NotFound(f"no group named {group!r}")
        backup = self._failovers.get(group)
        if backup is None:
            return None
        await asyncio.to_thread(self._store.clear_failover, group)
        await self._audit(actor, "restore", f"group/{group}", reason, {"from": backup})
        del self._failovers[group]
        self._publish_routing(self.spec)
        await self._events.emit(group, None, "restore", f"traffic back from {backup}: {reason}")
        return backup

    async def _audit(
        self, actor: str, action: str, target: str, reason: str, detail: dict[str, Any]
    ) -> None:
        """Every operator change lands in the append-only audit log: who, what, why, when."""
        await asyncio.to_thread(
            self._store.append_audit,
            actor=actor,
            action=action,
            target=target,
            reason=reason,
            detail=detail,
            now=self._clock.now(),
        )

    # --- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            self._wake.clear()
            await self.tick()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)

    async def tick(self) -> None:
        if self._spec is None:
            return
        spec = self._spec
        # 1. Snapshot: desired state (spec + overrides) and what the instances report.
        observed = self._supervisor.statuses()
        targets = [
            GroupTarget(g.name, g.template(), self._overrides.get(g.name, g.replicas), g.max_surge)
            for g in spec.groups
        ]
        known = {g.name for g in spec.groups}
        targets += [GroupTarget(name, "", 0) for name in {i.group for i in observed} - known]
        now = self._clock.now()
        await self._track_crash_loops(observed, now)
        # 2. Decide, per group, with the pure planner.
        actions = [a for t in targets for a in plan_group(t, observed)]
        # 3. Apply (launches of a crash-looping group wait for its backoff).
        for action in actions:
            if isinstance(action, Launch):
                group = spec.group(action.group)
                assert group is not None
                if self._backoff.get(group.name, CrashBackoff()).launch_allowed(now):
                    self._supervisor.launch(group, action.template, action.reason)
            elif isinstance(action, Drain):
                self._supervisor.drain(action.instance_id, action.reason)
            elif isinstance(action, Remove):
                self._supervisor.remove(action.instance_id, action.reason)
        # 4. Publish the routing snapshot when the ready set or the spec changed.
        self._publish_routing(spec)

    async def _track_crash_loops(self, observed: list[InstanceStatus], now: float) -> None:
        """Count each failed instance once per group; a newly READY one resets the group."""
        for inst in observed:
            if inst.id in self._seen:
                continue
            if inst.state is InstanceState.READY:
                self._seen.add(inst.id)
                self._backoff.pop(inst.group, None)
            elif inst.state is InstanceState.FAILED:
                self._seen.add(inst.id)
                backoff = self._backoff.get(inst.group, CrashBackoff()).after_failure(now)
                self._backoff[inst.group] = backoff
                if backoff.not_before > now:
                    await self._events.emit(
                        inst.group,
                        None,
                        "backoff",
                        f"{backoff.failures} failures in a row; next launch in "
                        f"{backoff.not_before - now:.0f}s",
                    )
        self._seen &= {i.id for i in observed}

    def _publish_routing(self, spec: PlatformSpec) -> None:
        ready = self._supervisor.ready_endpoints()
        key = (
            self._revision,
            tuple(sorted(self._failovers.items())),
            tuple(sorted((g, tuple(e)) for g, e in ready.items())),
        )
        if key == self._published_key:
            return
        self._routing_version += 1
        self._publish(build_routing_snapshot(spec, ready, self._routing_version, self._failovers))
        self._published_key = key
