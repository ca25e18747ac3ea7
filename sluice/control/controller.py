"""The reconcile loop: drive every group to its desired instances, and keep routing current.

`tick()` runs in numbered steps (snapshot, decide, keep, apply, publish); the decision is
one pure call, `sluice.policy.kernel.step`, the same one the fleet simulator makes.

`run()` never ends on an error and holds the last good state while the store refuses
writes (`sluice.control.ticks.TickLoop`); `status()` says how it goes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sluice.control.accelerators import AcceleratorWatch
from sluice.control.advisory import scaling_metrics, switched_modes
from sluice.control.autoscaling import LiveAutoscaling, TrafficSource
from sluice.control.decisions import DecisionJournal
from sluice.control.events import EventLog, store_error_text, store_outage
from sluice.control.explain import tier_counts
from sluice.control.fits import StoredFits
from sluice.control.fleet_metrics import FleetView, fleet_metrics
from sluice.control.inventory import ClusterPools
from sluice.control.keysources import spec_with_key_sources
from sluice.control.observer import Observation
from sluice.control.pins import Pins
from sluice.control.quota import LiveQuota
from sluice.control.review import gated_changes
from sluice.control.rollouts import ACTIONS, RolloutRunner
from sluice.control.routing_publisher import RoutingPublisher
from sluice.control.samples import GatewaySampleSource, SampleCollector
from sluice.control.scraper import ServerScraper, scrape_targets
from sluice.control.sleepers import FENCES_KEY, Sleepers, fences_record
from sluice.control.spec_work import offload
from sluice.control.supervisor import InstanceSupervisor
from sluice.control.ticks import TickLoop
from sluice.core import Clock, Conflict, InstanceState, InstanceStatus, NotFound
from sluice.policy import (
    Drain,
    Launch,
    Remove,
    RoutingSnapshot,
    failover_problem,
    stranded_failovers,
)
from sluice.policy.autoscale import ScalingPolicy
from sluice.policy.autoscale.factory import held_window
from sluice.policy.gain import NoGainHold
from sluice.policy.kernel import (
    Compiled,
    FittedServer,
    Memory,
    World,
    compile_spec,
    count_in_force,
    due,
    handed_back,
    serving_in_force,
    step,
)
from sluice.policy.tick import TickDecision, is_advisory, standby
from sluice.spec import (
    GroupSpec,
    LoadedSpec,
    PlatformSpec,
    Sealer,
    draft_revision,
    open_revision,
)
from sluice.spec.secrets import secret_env_names
from sluice.spec.servers import external_scale_problem
from sluice.store import Fenced, Pin, Revision, Store

__all__ = ["Controller"]

log = logging.getLogger("sluice.controller")


class Controller:
    def __init__(
        self,
        store: Store,
        supervisor: InstanceSupervisor,
        events: EventLog,
        clock: Clock,
        publish: Callable[[RoutingSnapshot], None],
        traffic: TrafficSource | None = None,
        samples: GatewaySampleSource | None = None,
        inventory: Callable[[], Mapping[str, int]] | None = None,
        *,
        sealer: Sealer,
        oldest_served: Callable[[int], int | None] = lambda _epoch: None,
    ) -> None:
        """`samples`: the gateway's per-request rows, which stand in for the samples of
        servers that keep none (command, external) under a rollout (None: such a rollout's
        analysis has no answers of them). `inventory`: the cluster's accelerators per type
        now (`RayRuntime.inventory`, a blocking call), which size `inventory: cluster`
        pools. `oldest_served(epoch)`: the oldest routing snapshot version of the epoch a
        remote gateway serves (`Fleet.oldest_served`; None: none is live)."""
        self.sealer = sealer
        """seals and opens the secrets of stored revisions (the installation's key)"""
        self._store = store
        self._supervisor = supervisor
        self._events = events
        self._clock = clock
        self._routing = RoutingPublisher(publish, lambda: store.write_fence)
        self._spec: PlatformSpec | None = None
        self._revision = 0
        self._overrides: dict[str, int] = {}
        self._failovers: dict[str, str] = {}
        self._wake = supervisor.changed
        self._servers = ServerScraper(clock.now)
        self.accelerators = AcceleratorWatch()
        """NVML's devices of pools that list them, attributed to instances"""
        self._autoscaling = LiveAutoscaling(traffic, self._servers.load)
        self._tiers: Mapping[str, str] = {}
        self._cluster_pools = ClusterPools(inventory, events)
        self._holds: Callable[[], Mapping[str, NoGainHold]] = dict
        self._memory = Memory()
        """What one tick hands the next (`sluice.policy.kernel`): among it the autoscalers'
        counts (journaled as decisions, so they survive a restart), the policies' memories,
        quota's (kept by `LiveQuota`)"""
        self._compiled: Compiled | None = None
        self.fits = StoredFits(store)
        """each autoscaled group's newest stored batching fit, handed to `compile_spec`"""
        self._compiled_fits: Mapping[str, FittedServer] = {}
        self.journal: Callable[[Memory, World, float, TickDecision], None] | None = None
        """told every tick's memory, world, time and decision (a replay's record)"""
        self._decisions = DecisionJournal(store, events)
        self._quota = LiveQuota(store, events)
        self.pins = Pins(store, events, self.audit, self._wake.set)
        self._rollouts = RolloutRunner(
            store,
            events,
            SampleCollector(gateway=samples),
            on_change=lambda: self._publish_routing(self.spec),
            wake=self._wake.set,
            traffic=traffic,
            servers=self._servers,
        )
        self._rollouts.point_at(self._ready_url)
        self._traffic = traffic
        self._sleepers = Sleepers(
            events,
            lambda iid: self._supervisor.inflight(iid),
            lambda iid: iid in self._supervisor.adopted,
            self._wake.set,
            clock.now,
            lambda iid: self._supervisor.devices_free_for(iid),
        )
        self._oldest_served = oldest_served
        self._lent: frozenset[str] = frozenset()
        self._fences_kept = fences_record((), ())
        """the fence as the store keeps it (`_keep_fences`)"""
        self._loop = TickLoop(self._leader_tick, self._wake, store, events, clock)
        self._deposed = False
        self._refused: str | None = None
        """the last `Fenced` refusal of a tick, said once"""

    # --- state ---------------------------------------------------------------------------

    @property
    def spec(self) -> PlatformSpec:
        if self._spec is None:
            raise NotFound("no spec has been applied yet")
        return self._spec

    @property
    def revision(self) -> int:
        return self._revision

    def group(self, name: str) -> GroupSpec:
        """The live spec's group `name`; an unknown name is a 404."""
        g = self.spec.group(name)
        if g is None:
            raise NotFound(f"no group named {name!r}")
        return g

    def desired_replicas(self, group: str) -> int:
        """Instances that serve: the autoscaler's count, else a manual override, else the
        spec's `replicas` (an advisory autoscaler's group counts as not autoscaled); a pin
        (`sluice.control.pins`) beats them all (`sluice.policy.kernel.count_in_force`)."""
        spec = self.group(group)
        pins = self.pins.counts(self._clock.now())
        return count_in_force(spec, self._memory.counts, self._overrides, pins)

    def serving_replicas(self, group: str) -> int:
        """Of `desired_replicas`, the instances that serve: a group with sleeping standby
        keeps the rest asleep (`sluice.policy.kernel.serving_in_force`)."""
        return serving_in_force(
            self.group(group), self._memory, self._overrides, self.pins.counts(self._clock.now())
        )

    def _set_scaled(self, group: str, count: int | None) -> None:
        """An autoscaled group's count set (None: dropped) outside a tick: on a restart, or
        a switch of `autoscaling.mode`."""
        counts = {g: c for g, c in self._memory.counts.items() if g != group}
        if count is not None:
            counts[group] = count
        self._memory = dataclasses.replace(self._memory, counts=counts)

    def _instances_wanted(self, g: GroupSpec) -> int:
        """Serving instances plus the warm standby kept out of rotation."""
        return self.desired_replicas(g.name) + standby(g)

    async def close(self) -> None:
        """Keep what must survive a restart (quota timers, month-to-date spend); a store
        that refuses the write is logged, and stopping goes on."""
        try:
            await self._quota.close(self._clock.now())
        except Fenced as exc:  # deposed: the new leader keeps its own, nothing to add
            log.warning("quota timers and spend not kept: %s", exc)
        except Exception as exc:
            problem = store_outage(exc)
            if problem is None:
                raise
            log.error("%s: quota timers and spend not kept: %s", problem, store_error_text(exc))
        finally:
            await self._rollouts.aclose()
            await self._servers.aclose()
            await self.accelerators.aclose()
            await self._sleepers.close()

    async def rollout(self, name: str, action: str, actor: str, reason: str) -> dict[str, Any]:
        """`sluice rollout start|pause|resume|promote|abort NAME`, audited; the new split is
        published at once (a rollback or abort reaches the gateway in this call)."""
        now = self._clock.now()
        if action == "start":
            state = await self._rollouts.start(
                self.spec, name, self.desired_replicas, actor, reason, now
            )
        elif action in ACTIONS:
            state = await self._rollouts.act(name, action, actor, reason, now)
        else:
            raise NotFound(f"no rollout action {action!r}; actions: start, {', '.join(ACTIONS)}")
        detail = {"phase": state.phase.value, "percent": state.percent}
        await self.audit(actor, f"rollout-{action}", f"rollout/{name}", reason, detail)
        self._wake.set()
        return state.to_json()

    def _ready_url(self, group: str) -> str | None:
        return next(
            (
                i.url
                for i in self._supervisor.statuses()
                if i.group == group and i.state is InstanceState.READY and i.url
            ),
            None,
        )

    def rollout_plan(self, name: str) -> dict[str, Any]:
        return self._rollouts.plan(self.spec, name)

    def rollout_live(self, name: str) -> dict[str, Any] | None:
        return self._rollouts.live_json(name)

    def server_metrics(self) -> bytes:
        """The scraped servers' signals as `sluice_server_*` Prometheus gauges, each group's
        desired vs advised instances, instances by state and tier, quota units, spend and
        rollout phases (`sluice_group_*`, `sluice_rollout_*`: `sluice.control.fleet_metrics`),
        and the controller's tick and decision times (`sluice_controller_*_seconds`)."""
        groups = b""
        if self._spec is not None:
            advice = self._decisions.advice
            groups = scaling_metrics(
                self._spec, self.desired_replicas, advice, self._quota.advice_for
            )
            obs = self.observation()
            assert obs is not None
            view = FleetView(
                obs.spec, obs.instances, self._tiers, obs.allocation, obs.meter,
                self._rollouts.phases(),
            )  # fmt: skip
            groups += fleet_metrics(view)
        return (
            self._servers.prometheus_text() + groups + self.accelerators.prometheus_text()
            + self._loop.prometheus_text()
        )  # fmt: skip

    def observation(self) -> Observation | None:
        """The fleet as the observer reads it (None before any spec)."""
        if self._spec is None:
            return None
        counts = {g.name: self._instances_wanted(g) for g in self._spec.groups}
        return Observation(
            self._spec, self._supervisor.statuses(), self._quota.last, self._quota.metered,
            counts, self._failovers, self.accelerators.view,
        )  # fmt: skip

    def hold_scale_up(self, holds: Callable[[], Mapping[str, NoGainHold]]) -> None:
        """S12: where more instances did not help, the autoscaler stops adding."""
        self._holds = holds

    def _sized_spec(self) -> PlatformSpec:
        """The live spec with each cluster-sized pool at the cluster's count (what the ticks
        decide on)."""
        return self._cluster_pools.with_counts(self.spec)

    async def quota_report(self, window_s: float, below: float) -> dict[str, Any]:
        """`sluice quota`: pools, guarantees, use, loans, spend, under-used groups."""
        loans = await asyncio.to_thread(self._store.list_loans, limit=200)
        return self._quota.report(self._sized_spec(), loans, self._clock.now(), window_s, below)

    def explain_state(self, group: str) -> dict[str, Any]:
        """What explain shows besides the journal: the policy and its mode, the count it
        holds now, the measured start-up time, and an advisory group's latest advice (of
        its autoscaler; of quota: what it would grant vs what it did)."""
        spec = self.group(group)
        st = self._autoscaling.state(group)
        advice = self._decisions.advice.get(group)
        return {
            "autoscaled": spec.autoscaling is not None,
            "mode": spec.autoscaling.mode if spec.autoscaling is not None else None,
            "policy": policy.name if (policy := self._policy(group)) else None,
            "desired": self.desired_replicas(group),
            "startup_s": round(st.startup_s, 3) if st and st.startup_s is not None else None,
            "advised": advice.to_json() if advice is not None else None,
            "quota": {"mode": spec.quota.mode, "advice": self._quota.advice_for(group)},
            "tiers": tier_counts(spec, self._supervisor.statuses(), self._tiers, self._quota.last),
            "no_gain_hold": hold.to_json() if (hold := self._holds().get(group)) else None,
            "held_tier": dict(zip(("after_s", "why"), held_window(spec), strict=True)),
        }

    async def adopted(self) -> None:
        """The supervisor has adopted the previous run's instances: learn which of them sleep
        before the first tick publishes a routing snapshot (`Sleepers.ask_adopted`)."""
        await self._sleepers.ask_adopted(self.spec, self._supervisor.ready_endpoints())

    async def load_state(self) -> None:
        """Resume from the store: the latest revision and live overrides."""
        latest = await asyncio.to_thread(self._store.latest_revision)
        if latest is not None:
            loaded = await offload(
                open_revision, latest.yaml_text, f"revision {latest.number}", self.sealer
            )
            self._spec = spec_with_key_sources(loaded)
            self._revision = latest.number
        self._overrides = await asyncio.to_thread(self._store.replicas_overrides)
        self._failovers = await asyncio.to_thread(self._store.failovers)
        await self.pins.load()
        await self._quota.load()
        fences = await asyncio.to_thread(self._store.get_state, FENCES_KEY)
        if fences:  # a previous controller's: lent units stay lent, their sleepers unwakeable
            self._lent = self._supervisor.lent = self._sleepers.restore(fences)
            self._fences_kept = fences_record(self._sleepers.fencing, self._lent)
        quota, advice = self._quota.memory
        self._memory = Memory(quota=quota, advice=advice, meter=self._quota.metered)
        if self._spec is not None:
            await self._rollouts.load(self._spec)
        if self._spec is not None:
            for g in self._spec.groups:
                if g.autoscaling is None or is_advisory(g):
                    continue
                last = await asyncio.to_thread(self._store.list_decisions, group=g.name, limit=1)
                if last:  # advice was not acted on: the count in force then was `current`
                    advised = last[0].detail.get("mode") == "advisory"
                    count = last[0].current if advised else last[0].desired
                    self._set_scaled(g.name, min(max(count, g.autoscaling.min), g.autoscaling.max))

    # --- operator actions ----------------------------------------------------------------

    async def apply(
        self, loaded: LoadedSpec, author: str, reason: str, reviewed: bool = False
    ) -> Revision | None:
        """Record a new numbered revision (with its diff) and reconcile toward it.

        Returns None when the YAML is identical to the current revision (nothing to do).
        A group whose `replicas` changed in the spec drops its manual override.
        With `control.review.routes` on, a change to the gated sections is a Conflict unless
        `reviewed` (an approved proposal, `ReviewBoard.approve`).
        """
        latest = await asyncio.to_thread(self._store.latest_revision)
        number = (latest.number if latest else 0) + 1
        previous = latest.yaml_text if latest else None
        # no plain key is ever stored; parsed, checked and diffed off the event loop
        draft = await offload(
            draft_revision, loaded.text, loaded.source, previous, number, self.sealer
        )
        if previous == draft.text:
            return None
        # The spec as it will read back from the store (keys as digests), so that comparing
        # it with the live spec after a restart sees the same tenants.
        spec = spec_with_key_sources(draft.loaded)
        stranded = stranded_failovers(spec, self._failovers)
        if stranded:
            raise Conflict(
                f"this spec would strand {'; '.join(stranded)}. `sluice route restore` "
                "(or fail over to another backup) first, then apply",
                failovers=sorted(self._failovers),
            )
        gated = [] if reviewed else gated_changes(self._spec, spec)
        if gated:
            raise Conflict(
                f"this change touches {', '.join(gated)}, which need review "
                "(control.review.routes is on): run `sluice propose -f "
                f"{loaded.source} --reason ...` and have another person `sluice approve` it",
                sections=gated,
            )
        diff = draft.diff
        rev = await asyncio.to_thread(
            self._store.add_revision,
            yaml_text=draft.text,
            author=author,
            reason=reason,
            diff=diff,
            now=self._clock.now(),
        )
        old = self._spec
        counts = {g.name: self.desired_replicas(g.name) for g in old.groups} if old else {}
        for group in spec.groups:
            before = old.group(group.name) if old else None
            if group.name in self._overrides and (
                before is None or before.replicas != group.replicas
            ):
                await asyncio.to_thread(self._store.clear_replicas_override, group.name)
                self._overrides.pop(group.name)
        await self.audit(
            author, "apply", f"revision/{rev.number}", reason, {"lines_changed": diff.count("\n")}
        )
        self._spec, self._revision = spec, rev.number
        for switch in switched_modes(old, spec, counts):
            await self._switch_mode(switch.group, switch.to, switch.count, author)
        self._wake.set()
        return rev

    async def _switch_mode(self, group: str, to: str, count: int | None, actor: str) -> None:
        """`sluice.control.advisory`: a switch of autoscaling.mode keeps the fleet's count."""
        now = self._clock.now()
        if to == "advisory":
            self._set_scaled(group, None)
            g = self.spec.group(group)
            assert g is not None
            if count is not None and count != g.replicas:
                why = f"kept at {count}: autoscaling.mode active -> advisory"
                await asyncio.to_thread(
                    self._store.set_replicas_override,
                    group=group,
                    replicas=count,
                    actor=actor,
                    reason=why,
                    now=now,
                )
                await self.audit(actor, "scale", f"group/{group}", why, {"to": count})
                self._overrides[group] = count
        else:
            assert count is not None
            self._set_scaled(group, count)
            if self._overrides.pop(group, None) is not None:
                await asyncio.to_thread(self._store.clear_replicas_override, group)
        kept = self.desired_replicas(group)
        await self._events.emit(group, None, "mode", f"autoscaling.mode -> {to}: {kept} kept")

    async def scale(self, group: str, replicas: int, actor: str, reason: str) -> int:
        """S1: manual replica count, effective on the next tick, audited. Returns the old."""
        spec = self.group(group)
        if replicas < 0:
            raise Conflict(f"replicas must be >= 0, got {replicas}")
        if spec.autoscaling is not None and not is_advisory(spec):
            raise Conflict(
                f"group {group!r} is autoscaled ({spec.autoscaling.policy}, "
                f"min {spec.autoscaling.min}, max {spec.autoscaling.max}); change "
                "autoscaling.min/max in the spec and `sluice apply` it instead (or set "
                "autoscaling.mode: advisory to drive the count by hand while it advises)",
                group=group,
            )
        self._check_count(spec, replicas)
        before = self.desired_replicas(group)
        await asyncio.to_thread(
            self._store.set_replicas_override,
            group=group,
            replicas=replicas,
            actor=actor,
            reason=reason,
            now=self._clock.now(),
        )
        await self.audit(actor, "scale", f"group/{group}", reason, {"from": before, "to": replicas})
        self._overrides[group] = replicas
        await self._events.emit(
            group, None, "scale", f"manual scale {before} -> {replicas} by {actor}: {reason}"
        )
        self._wake.set()
        return before

    async def pin(self, group: str, replicas: int, for_s: float, actor: str, reason: str) -> Pin:
        """Hold `group` at `replicas` for `for_s` seconds (`sluice.control.pins`)."""
        self._check_count(self.group(group), replicas)
        return await self.pins.hold(group, replicas, for_s, actor, reason, self._clock.now())

    async def hand_back(self, group: str, replicas: int, actor: str, reason: str) -> dict[str, Any]:
        """After a test that moved `group` (a peak drill): its autoscaler starts afresh from
        `replicas` (`sluice.policy.kernel.handed_back`), so the test's load no longer holds
        instances through its cooldown. A pin is not the test's to lift: the answer names
        one in force. Conflict for a group not actively autoscaled."""
        before = self.desired_replicas(group)  # NotFound for an unknown group
        try:
            compiled = self._compiled or self._compiled_for(self.spec)  # the last tick's
            to, self._memory = handed_back(self._memory, compiled, group, replicas)
        except KeyError:
            raise Conflict(
                f"group {group!r} is not actively autoscaled: its count is its replicas or an "
                "operator's override, and nothing of a test stays in it",
                group=group,
            ) from None
        detail = {"from": before, "to": to}
        await self.audit(actor, "hand-back", f"group/{group}", reason, detail)
        message = f"autoscaler restarted at {to} (was {before}) by {actor}: {reason}"
        await self._events.emit(group, None, "hand-back", message, **detail)
        self._wake.set()
        pin = self.pins.get(group)
        held = pin is not None and self._clock.now() < pin.until
        return {"group": group, **detail, "pin": pin.to_json() if pin and held else None}

    def _check_count(self, spec: GroupSpec, replicas: int) -> None:
        """Refuse a count the group's servers or its pool cannot have."""
        if too_many := external_scale_problem(spec, replicas):
            raise Conflict(too_many, group=spec.name)
        sized = self._sized_spec()  # a cluster-sized pool has the cluster's count
        pool = sized.pool(spec.resources.pool)
        assert pool is not None  # the spec checks guarantee it
        others = self._pool_held_by_others(sized, spec)
        if others + replicas * spec.resources.accelerators > pool.count:
            raise Conflict(
                f"pool {pool.name!r} has {pool.count} accelerators; other groups hold "
                f"{others}, so {spec.name!r} can have at most "
                f"{(pool.count - others) // spec.resources.accelerators} replicas",
                pool=pool.name,
                free=pool.count - others,
            )

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
        source = self.group(group)
        problem = failover_problem(spec, group, backup)
        if problem is not None:
            raise Conflict(problem, group=group)
        target_name = backup or source.backup
        assert target_name is not None  # failover_problem says so otherwise
        await asyncio.to_thread(
            self._store.set_failover,
            group=group,
            backup=target_name,
            actor=actor,
            reason=reason,
            now=self._clock.now(),
        )
        await self.audit(actor, "failover", f"group/{group}", reason, {"to": target_name})
        self._failovers[group] = target_name
        self._publish_routing(spec)
        await self._events.emit(group, None, "failover", f"all traffic -> {target_name}: {reason}")
        return target_name

    async def restore(self, group: str, actor: str, reason: str) -> str | None:
        """Undo `failover`; returns the backup it pointed to (None if none was in force)."""
        self.group(group)
        backup = self._failovers.get(group)
        if backup is None:
            return None
        await asyncio.to_thread(self._store.clear_failover, group)
        await self.audit(actor, "restore", f"group/{group}", reason, {"from": backup})
        del self._failovers[group]
        self._publish_routing(self.spec)
        await self._events.emit(group, None, "restore", f"traffic back from {backup}: {reason}")
        return backup

    async def audit(
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
        """Tick until cancelled; an error never ends this (`TickLoop`)."""
        await self._loop.run()

    def status(self) -> dict[str, Any]:
        """ok, or degraded with why: the store refuses writes, or ticks keep failing. With
        the controller's tick counters and the sample poller's state."""
        why = self._loop.degraded
        return {
            "status": "degraded" if why else "ok",
            "degraded": why,
            "revision": self._revision,
            "controller": self._loop.to_json(),
            "store": self._events.health.to_json(),
            "samples": self._rollouts.sampling_status(),
            "servers": self._servers.status(),
            "accelerators": self.accelerators.status(),
        }

    def store_refused(self, exc: Exception) -> None:
        """Someone else (an operator's call) saw the store refuse a write."""
        self._events.health.saw(exc, self._clock.now())

    @property
    def degraded(self) -> bool:
        return self._loop.degraded is not None

    async def _leader_tick(self) -> None:
        """`tick` while this controller leads. A `Fenced` refusal (a write, the routing)
        ends the tick, said once and without a traceback: once another controller leads
        this one is stepping down and ticks no more; while its renewals are only late
        (the store is away) the next tick tries again."""
        if self._deposed:
            return
        try:
            await self.tick()
        except Fenced as exc:
            fence = self._store.write_fence
            self._deposed = fence is not None and fence.deposed
            if str(exc) != self._refused:
                log.warning("tick refused: %s", exc)
            self._refused = str(exc)
        else:
            self._refused = None

    async def tick(self) -> None:
        if self._spec is None:
            return
        if (fence := self._store.write_fence) is not None:
            # not while the lease's renewals are late (the store was away): nothing the
            # tick would launch, stop or publish is allowed until the next renewal
            fence.require("reconcile the fleet")
        now = self._clock.now()
        spec = await self._cluster_pools.sized(self._spec, now)
        # 1. Snapshot: desired state (spec + overrides) and what the instances report.
        observed = self._supervisor.statuses()
        await self.pins.expire(now, {g.name for g in spec.groups})
        await self.fits.refresh(spec, now)
        compiled = self._compiled_for(spec)
        due_now = due(self._memory, compiled, now)
        loads = self._autoscaling.read(spec, observed, due_now, now, self.desired_replicas)
        self._servers.watch(scrape_targets(spec, observed))  # read in their own task
        self.accelerators.watch(spec, observed)  # NVML too
        world = World(
            compiled=compiled,
            observed=observed,
            loads=loads,
            overrides=dict(self._overrides),
            pins=self.pins.counts(now),
            floors=dict(self._rollouts.baseline_floors()),
            holds=dict(self._holds()),
            asleep=(asleep := self._asleep_now(spec)),
            fenced=self._fenced(asleep),
        )
        # 2. Decide: the one pure step the simulator runs too (`sluice.policy.kernel`):
        #    autoscalers, then quota (no instance starts without its units), then the plan.
        before = self._memory
        with self._loop.timing_decision():
            decision, self._memory = step(before, world, now)
        # ^ in force at once, before any await: whatever reads the counts from here on (the
        # follow-ups setting a no-gain hold) sees this decision with the holds it obeyed
        if self.journal is not None:
            self.journal(before, world, now, decision)
        await self._keep_fences(decision.fence, world.fenced & decision.fence, now)
        # 3. Keep what follows: quota memory and ledger, the decisions' journal.
        await self._quota.record(spec, decision, self._memory.meter, now)
        for scaled in decision.scaled:
            st = self._autoscaling.state(scaled.group.name)
            await self._decisions.record(scaled, st.server if st else None, now)
        self._decisions.keep_only({g.name for g in spec.groups if is_advisory(g)})
        self._tiers = decision.tiers  # worked out when first read
        self._sleepers.fence(decision.fence, decision.unwoken)
        # lent now: released (fenced) and still fenced; one this tick lets wake is back
        await self._lending(observed, world.fenced & decision.fence)
        # 4. Apply (the kernel held back the launches of crash-looping groups).
        for group_name, backoff in decision.crash_waits:
            await self._events.emit(
                group_name,
                None,
                "backoff",
                f"{backoff.failures} failures in a row; next launch in "
                f"{backoff.not_before - now:.0f}s",
            )
        self._supervisor.withheld_env = secret_env_names(spec)
        for action in decision.actions:
            if isinstance(action, Launch):
                group = spec.group(action.group)
                assert group is not None
                pool = spec.pool(group.resources.pool)
                self._supervisor.launch(group, action.template, action.reason, pool)
            elif isinstance(action, Drain):
                self._supervisor.drain(action.instance_id, action.reason)
            elif isinstance(action, Remove):
                self._supervisor.remove(action.instance_id, action.reason)
        # 5. Canary analysis of running rollouts, then publish the routing snapshot when the
        #    ready set, a split or the spec changed (a rollback reaches the gateway here).
        await self._rollouts.tick(spec, decision.observed, now)
        self._publish_routing(spec)

    def _compiled_for(self, spec: PlatformSpec) -> Compiled:
        """The spec's lookups and policies, built again only when the spec or a group's
        stored fit changes. A `sim` group's declared batching server is the simulator's:
        the live `sim` worker sleeps its service time, it does not batch."""
        fits = self.fits.servers()
        if self._compiled is None or self._compiled.spec is not spec or fits != self._compiled_fits:
            self._compiled = compile_spec(spec, servers=fits, declared=False)
            self._compiled_fits = fits
        return self._compiled

    def _policy(self, group: str) -> ScalingPolicy[Any] | None:
        return self._compiled.policies.get(group) if self._compiled is not None else None

    def tier(self, instance_id: str) -> str | None:
        """`stable` (on its group's guaranteed units) or `burst`, as of the last tick."""
        return self._tiers.get(instance_id)

    def asleep(self, instance_id: str) -> bool:
        """A sleeping standby this controller put to sleep (or adopted and counts asleep)."""
        return instance_id in self._sleepers.asleep

    def units_lent(self, instance_id: str) -> bool:
        """A sleeping standby whose units the last tick left to other groups (fenced)."""
        return instance_id in self._lent

    def _pool_held_by_others(self, spec: PlatformSpec, group: GroupSpec) -> int:
        return sum(
            self._instances_wanted(g) * g.resources.accelerators
            for g in spec.groups
            if g.resources.pool == group.resources.pool and g.name != group.name
        )

    def _publish_routing(self, spec: PlatformSpec) -> None:
        placed = self._routing.update(
            spec,
            self._revision,
            self._failovers,
            self._supervisor.ready_endpoints(),
            self._rollouts.splits(spec),
            self.serving_replicas,
            self._sleepers.asleep,
            self._woken_by_gateways(spec),
            self._sleepers.fencing,
            self._memory.standby_at,
        )
        self._sleepers.published(self._routing.published[1])
        if placed:
            self._sleepers.act(spec, placed)

    async def _keep_fences(self, fencing: frozenset[str], lent: frozenset[str], now: float) -> None:
        """Keep the tick's fence in the store before anything acts on it (a borrower's
        launch, a snapshot, a wake), so that the next controller takes it up
        (`Sleepers.restore`); written only when it changed."""
        record = fences_record(fencing, lent)
        if record != self._fences_kept:
            await asyncio.to_thread(self._store.put_state, FENCES_KEY, record, now)
            self._fences_kept = record

    async def _lending(self, observed: Sequence[InstanceStatus], lent: frozenset[str]) -> None:
        """Keep which sleepers' units serve other groups now, with an event when that
        changes (`units-lent`, `units-back`)."""
        before, self._lent = self._lent, lent
        self._supervisor.lent = lent  # their devices may take a borrower
        if lent == before:
            return
        group = {i.id: i.group for i in observed}
        for iid in sorted(lent - before):
            if iid in group:
                text = "asleep: its units may serve other groups"
                await self._events.emit(group[iid], iid, "units-lent", text)
        for iid in sorted(before - lent):
            if iid in group:  # (an instance gone needs no word)
                await self._events.emit(group[iid], iid, "units-back", "its units are its own")

    def _asleep_now(self, spec: PlatformSpec) -> frozenset[str]:
        """The sleepers asleep as this tick begins, as far as their units go
        (`Sleepers.holding_nothing`): a gateway's wake reported since the last tick counts
        first (a sleeper it woke must not have its units lent)."""
        self._woken_by_gateways(spec)
        return self._sleepers.holding_nothing()

    def _fenced(self, asleep: frozenset[str]) -> frozenset[str]:
        """Sleepers of `asleep` (`_asleep_now`) left out of a snapshot every gateway serves:
        their units may be lent."""
        if not self._sleepers.fencing:
            return frozenset()
        return self._sleepers.fenced(self._oldest_served(self._routing.published[0])) & asleep

    def _woken_by_gateways(self, spec: PlatformSpec) -> frozenset[str]:
        """The sleeping standby the gateways woke and route to (requests waited): awake now,
        and not to be put back to sleep while they route to it."""
        if self._traffic is None or not any(
            g.autoscaling is not None and g.autoscaling.sleeping_standby for g in spec.groups
        ):
            return frozenset()
        try:
            samples = self._traffic()
        except Exception:  # the gateways' counters are unreadable: nothing is known woken
            return frozenset()
        woken = frozenset(i for s in samples.values() for i in s.woken)
        self._sleepers.woken(woken)
        return woken
