"""One reconcile tick's decision, pure: autoscale -> quota -> plan.

The live controller (`sluice.control.controller.Controller.tick`) and the fleet simulator
(`sluice.sim.fleet`) both call `decide` and only apply what it returns: the controller
journals, meters and persists, and hands the actions to the supervisor; the simulator
applies them to its simulated instances. So what a simulation says about a spec is what
the controller would do with it.

The steps, in order:

1. each autoscaled group that is due decides (`Autoscaler.decide`); an active group wants
   that count (a running rollout's baseline keeps its floor, warm standby is added);
   every other group wants the count in force (`replicas` or an operator's override);
2. the quota allocator grants instances for those wants (`allocate_advised`): guarantees,
   borrowing, reclaims, pool shrink and budgets; an autoscaler's count is clipped to it;
   an advisory autoscaler's count is previewed against quota and changes nothing;
3. reclaimed instances drain first (before the planner sees the fleet);
4. each group is planned toward its grant (`plan_group`), surging only into spare units.

Every instance is also told its tier (S9): `stable` while it runs on the group's own
guaranteed units, `burst` above them (borrowed or unassigned units). Scale-down, reclaim,
a shrinking pool and a lowered budget all take the newest instances above the guarantee
first, so the burst part always goes first.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sluice.core.instances import ALIVE_STATES, InstanceState, InstanceStatus
from sluice.policy.autoscale import Autoscaler, Decision, GroupLoad
from sluice.policy.plan import Action, Drain, GroupTarget, plan_group
from sluice.policy.quota import (
    AdvisedAllocation,
    Allocation,
    GroupClaim,
    PoolState,
    QuotaState,
    allocate_advised,
)
from sluice.policy.quota.metering import TOTAL, Meter
from sluice.spec import GroupSpec, PlatformSpec

__all__ = [
    "BURST",
    "STABLE",
    "Scaled",
    "TickDecision",
    "TickInput",
    "clipped",
    "decide",
    "is_advisory",
    "standby",
]

STABLE, BURST = "stable", "burst"
_RUNNING = frozenset(
    {InstanceState.PENDING, InstanceState.STARTING, InstanceState.WARMING, InstanceState.READY}
)


def is_advisory(g: GroupSpec) -> bool:
    """The group's autoscaler only advises: its count is `replicas` or an override."""
    return g.autoscaling is not None and g.autoscaling.mode == "advisory"


def standby(g: GroupSpec) -> int:
    """Warm standby instances kept out of rotation (an active autoscaler's only)."""
    if g.autoscaling is None or is_advisory(g):
        return 0
    return g.autoscaling.warm_standby


@dataclass(frozen=True, slots=True)
class TickInput:
    """What one tick decides on.

    `counts`: each group's count in force (what the autoscaler set last, else an override,
    else `replicas`). `loads`: the autoscaled groups due this tick, with the policy object
    of each in `scalers` (policies keep their own memory between ticks). `floors`: rollout
    baselines' counts. `quota`/`advice`: the allocator's memories; `meter`: month-to-date
    spend and accelerator-hours, advanced to `now`."""

    spec: PlatformSpec
    observed: Sequence[InstanceStatus]
    counts: Mapping[str, int]
    now: float
    loads: Mapping[str, GroupLoad] = dataclasses.field(default_factory=dict)
    scalers: Mapping[str, Autoscaler] = dataclasses.field(default_factory=dict)
    floors: Mapping[str, int] = dataclasses.field(default_factory=dict)
    quota: QuotaState = dataclasses.field(default_factory=QuotaState)
    advice: QuotaState = dataclasses.field(default_factory=QuotaState)
    meter: Meter = dataclasses.field(default_factory=Meter)


@dataclass(frozen=True, slots=True)
class Scaled:
    """One autoscaled group's decision, settled: `count` is what quota and a rollout floor
    leave of it (for an advisory group, what it would have been), `actual` the count in
    force before it."""

    group: GroupSpec
    load: GroupLoad
    decision: Decision
    policy: str
    count: int
    guards: tuple[str, ...]
    reason: str
    advisory: bool

    @property
    def actual(self) -> int:
        return self.load.current


@dataclass(frozen=True, slots=True)
class TickDecision:
    """What the tick decided. `counts`: the active autoscaled groups' new counts (those that
    moved). `observed`: the fleet as the planner saw it (reclaimed instances draining).
    `actions`: reclaim drains first, then each group's plan. `spare`: units per pool
    neither held nor granted (room to surge). `held`: units per group now. `tiers`: alive
    instance id -> `stable` | `burst`."""

    scaled: tuple[Scaled, ...]
    counts: Mapping[str, int]
    allocation: AdvisedAllocation
    preview: Allocation | None
    claims: tuple[GroupClaim, ...]
    observed: tuple[InstanceStatus, ...]
    targets: tuple[GroupTarget, ...]
    actions: tuple[Action, ...]
    spare: Mapping[str, int]
    held: Mapping[str, int]
    tiers: Mapping[str, str]

    @property
    def grants(self) -> Mapping[str, int]:
        return {name: g.instances for name, g in self.allocation.enforced.grants.items()}


def clipped(
    group: GroupSpec, decision: Decision, granted: int, floor: int, allocation: Allocation
) -> tuple[int, tuple[str, ...], str]:
    """What quota (`granted` instances, standby included) and a rollout's baseline floor
    leave of the decision: (count, guards that clipped it, reason). S11: a quota or budget
    refusal shows as the guard that clipped it; C2: a baseline keeps its count."""
    want = max(decision.desired, floor)
    desired = min(want, max(0, granted - standby(group)))
    guards, reason = decision.clipped_by, decision.reason
    if want > decision.desired:
        guards += ("rollout",)
        reason += f"; kept at {floor}: baseline of a running rollout"
    refusal = allocation.refusals.get(group.name)
    if desired < want and refusal:
        guards += ("budget" if refusal.startswith("budget") else "quota",)
        reason += f"; {refusal}"
    return desired, guards, reason


def decide(inp: TickInput) -> TickDecision:
    """The whole tick's decision (module docstring); mutates only the policies' memory."""
    spec, now = inp.spec, inp.now
    index = _index(spec)
    by_group: dict[str, list[InstanceStatus]] = {}
    for inst in inp.observed:
        by_group.setdefault(inst.group, []).append(inst)
    decisions = {
        name: inp.scalers[name].decide(load, now)
        for name, load in inp.loads.items()
        if name in index.groups
    }
    wanted = {g.name: inp.counts.get(g.name, g.replicas) + standby(g) for g in spec.groups}
    for name, d in decisions.items():
        g = index.groups[name]
        if not is_advisory(g):
            wanted[name] = max(d.desired, inp.floors.get(name, 0)) + standby(g)
    claims = [_claim(g, by_group.get(g.name, ()), wanted[g.name], inp.meter) for g in spec.groups]
    advised = _allocate(spec, index, claims, inp, inp.quota, inp.advice)
    alloc = advised.enforced
    scaled: list[Scaled] = []
    counts: dict[str, int] = {}
    advising = {n: d for n, d in decisions.items() if is_advisory(index.groups[n])}
    for name, d in decisions.items():
        if name in advising:
            continue
        g, floor = index.groups[name], inp.floors.get(name, 0)
        count, guards, reason = clipped(g, d, alloc.grants[name].instances, floor, alloc)
        load = inp.loads[name]
        scaled.append(Scaled(g, load, d, inp.scalers[name].name, count, guards, reason, False))
        if count != load.current:
            counts[name] = count
    preview = None
    if advising:
        asked = {n: max(d.desired, inp.floors.get(n, 0)) for n, d in advising.items()}
        shown = [dataclasses.replace(c, wanted=asked.get(c.name, c.wanted)) for c in claims]
        # on this round's memory: what the next round would grant the advised counts
        preview = _allocate(spec, index, shown, inp, alloc.state, advised.advice.state).enforced
        for name, d in advising.items():
            g, floor = index.groups[name], inp.floors.get(name, 0)
            count, guards, reason = clipped(g, d, preview.grants[name].instances, floor, preview)
            load = inp.loads[name]
            scaled.append(Scaled(g, load, d, inp.scalers[name].name, count, guards, reason, True))
    actions: list[Action] = []
    draining: dict[str, str] = {}
    for r in alloc.reclaims:  # serving-aware: out of routing, drained, then released
        for iid in r.instance_ids:
            draining[iid] = r.reason
            actions.append(Drain(r.borrower, iid, r.reason))
    observed = tuple(inp.observed)
    if draining:
        observed = tuple(
            dataclasses.replace(i, state=InstanceState.DRAINING, reason=draining[i.id])
            if i.id in draining and i.state in ALIVE_STATES
            else i
            for i in observed
        )
        by_group = {}
        for inst in observed:
            by_group.setdefault(inst.group, []).append(inst)
    held = {c.name: len(c.running) * c.units_per_instance + c.draining_units for c in claims}
    spare = {p.name: p.count for p in spec.pools}
    for c in claims:
        granted = alloc.grants[c.name].instances * c.units_per_instance
        if c.pool in spare:
            spare[c.pool] -= max(held[c.name], granted)
    targets = [
        _target(g, index.templates[g.name], alloc.grants[g.name].instances, spare)
        for g in spec.groups
    ]
    targets += [GroupTarget(name, "", 0) for name in by_group.keys() - index.groups.keys()]
    for t in targets:
        mine = by_group.get(t.group, ())
        if not _settled(t, mine):
            actions += plan_group(t, mine)
    tiers: dict[str, str] = {}
    for g in spec.groups:
        own = alloc.grants[g.name].own_units // g.resources.accelerators
        _tier(by_group.get(g.name, ()), own, tiers)
    return TickDecision(
        scaled=tuple(scaled),
        counts=counts,
        allocation=advised,
        preview=preview,
        claims=tuple(claims),
        observed=observed,
        targets=tuple(targets),
        actions=tuple(actions),
        spare={k: max(0, v) for k, v in spare.items()},
        held=held,
        tiers=tiers,
    )


@dataclass(frozen=True, slots=True)
class _Index:
    """Per-spec lookups built once (a template is a hash of the group's models)."""

    groups: Mapping[str, GroupSpec]
    templates: Mapping[str, str]
    pools: tuple[PoolState, ...]
    advisory: frozenset[str]


_INDEXES: OrderedDict[int, tuple[PlatformSpec, _Index]] = OrderedDict()
"""The few specs in use (live: the current one), by identity: a spec is immutable."""


def _index(spec: PlatformSpec) -> _Index:
    kept = _INDEXES.get(id(spec))
    if kept is not None and kept[0] is spec:
        _INDEXES.move_to_end(id(spec))
        return kept[1]
    found = _Index(
        groups={g.name: g for g in spec.groups},
        templates={g.name: g.template() for g in spec.groups},
        pools=tuple(PoolState(p.name, p.purpose, p.count, p.price_per_hour) for p in spec.pools),
        advisory=frozenset(g.name for g in spec.groups if g.quota.mode == "advisory"),
    )
    _INDEXES[id(spec)] = (spec, found)
    while len(_INDEXES) > 4:
        _INDEXES.popitem(last=False)
    return found


def _claim(g: GroupSpec, mine: Sequence[InstanceStatus], wanted: int, meter: Meter) -> GroupClaim:
    running = []
    draining = 0
    for i in mine:
        if i.state in _RUNNING:
            running.append(i)
        elif i.state is InstanceState.DRAINING:
            draining += 1
    return GroupClaim(
        name=g.name,
        pool=g.resources.pool,
        units_per_instance=g.resources.accelerators,
        wanted=wanted,
        quota=g.quota,
        running=running,
        draining_units=draining * g.resources.accelerators,
        budget=g.budget,
        spent_this_month=meter.spent_by(g.name),
        unit_hours_this_month=meter.hours_by(g.name),
        drain_timeout_s=g.drain_timeout_s,
    )


def _allocate(
    spec: PlatformSpec,
    index: _Index,
    claims: Sequence[GroupClaim],
    inp: TickInput,
    state: QuotaState,
    advice: QuotaState,
) -> AdvisedAllocation:
    return allocate_advised(
        index.pools,
        claims,
        state,
        advice,
        inp.now,
        advisory=index.advisory,
        budget=spec.budget,
        spent_this_month=inp.meter.spent_by(TOTAL),
        unit_hours_this_month=inp.meter.hours_by(TOTAL),
    )


def _target(g: GroupSpec, template: str, instances: int, spare: Mapping[str, int]) -> GroupTarget:
    """A rolling update surges only into units the pool has spare; with none, it replaces
    one instance at a time instead of starting one the quota has no unit for."""
    room = max(0, spare.get(g.resources.pool, 0)) // g.resources.accelerators
    if min(g.max_surge, room) > 0:
        return GroupTarget(g.name, template, instances, min(g.max_surge, room))
    return GroupTarget(g.name, template, instances, max_surge=0, max_unavailable=1)


def _settled(target: GroupTarget, mine: Sequence[InstanceStatus]) -> bool:
    """Nothing to plan: exactly `replicas` alive instances, all of the target's template,
    none failed (most groups on most ticks; `plan_group` would return no action)."""
    alive = 0
    for i in mine:
        if i.state in ALIVE_STATES:
            if i.template != target.template:
                return False
            alive += 1
        elif i.state is InstanceState.FAILED:
            return False
    return alive == target.replicas


def _tier(mine: Sequence[InstanceStatus], own: int, out: dict[str, str]) -> None:
    """The oldest ready instances, then the oldest not yet ready, up to the instances the
    group's own guaranteed units carry, are its stable part; the rest are burst."""
    alive = [i for i in mine if i.state in _RUNNING]
    if own >= len(alive) or own <= 0:  # one tier only: no order needed
        tier = STABLE if own > 0 else BURST
        for inst in alive:
            out[inst.id] = tier
        return
    alive.sort(key=lambda i: (i.state is not InstanceState.READY, i.created_at, i.id))
    for n, inst in enumerate(alive):
        out[inst.id] = STABLE if n < own else BURST
