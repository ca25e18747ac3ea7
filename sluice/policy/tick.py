"""One reconcile tick's decision, pure: autoscale -> quota -> plan.

The live controller (`sluice.control.controller.Controller.tick`) and the fleet simulator
(`sluice.sim.fleet`) both call `decide` and only apply what it returns: the controller
journals, meters and persists, and hands the actions to the supervisor; the simulator
applies them to its simulated instances. So what a simulation says about a spec is what
the controller would do with it.

The steps, in order:

1. each autoscaled group that is due decides (`ScalingPolicy.step`, on the memory value it
   returned last time); an active group wants
   that count (a running rollout's baseline keeps its floor, warm standby is added);
   every other group wants the count in force (`replicas` or an operator's override);
2. the quota allocator grants instances for those wants (`allocate_advised`): guarantees,
   borrowing, reclaims, pool shrink and budgets; an autoscaler's count is clipped to it;
   an advisory autoscaler's count is previewed against quota and changes nothing;
3. reclaimed instances drain first (before the planner sees the fleet);
4. each group is planned toward its grant (`plan_group`), surging only into spare units.

A group's sleeping standby (`autoscaling.sleeping_standby`) leaves its claim once no gateway
may wake it (`TickInput.fenced`): its units are idle guarantee, lent like any other and
reclaimed when the count needs it awake (`sluice.policy.standby.sleeping_units`); the tick
says which sleepers to fence (`TickDecision.fence`) and which wait for their units before a
wake (`unwoken`), and its grant's spend is a released sleeper's host memory. On a pool that
pins devices a sleeper wakes only where its process lives: its reclaim drains the borrower
on its devices first, and it waits (unwoken) until that one is gone (`_clear_the_way`).

Every instance is also told its tier (S9): `stable` while it runs on the group's own
guaranteed units, `burst` above them (borrowed or unassigned units). Scale-down, reclaim,
a shrinking pool and a lowered budget all take the newest instances above the guarantee
first, so the burst part always goes first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sluice.core.frozen import fast_init
from sluice.core.instances import ALIVE_STATES, InstanceState, InstanceStatus
from sluice.policy.autoscale import Decision, GroupLoad, ScalingPolicy
from sluice.policy.backoff import CrashBackoff
from sluice.policy.devices import DeviceHold, in_the_way, units_on_each
from sluice.policy.gain import NoGainHold
from sluice.policy.plan import Action, Drain, GroupTarget, Launch, plan_group
from sluice.policy.quota import (
    AdvisedAllocation,
    Allocation,
    Grant,
    GroupClaim,
    PoolState,
    QuotaState,
    allocate_advised,
)
from sluice.policy.quota.metering import TOTAL, Meter
from sluice.policy.standby import SleepingUnits, sleeping_units, standby_level
from sluice.spec import GroupSpec, PlatformSpec

__all__ = [
    "BURST",
    "STABLE",
    "TICK_S",
    "Scaled",
    "SleepTerms",
    "SpecIndex",
    "TickDecision",
    "TickInput",
    "clipped",
    "decide",
    "index_spec",
    "is_advisory",
    "spec_count",
    "standby",
]

TICK_S: Final = 1.0
"""The longest pause between two reconcile ticks (the live loop ticks sooner when an
instance changes state; the fleet simulator ticks every `TICK_S` of virtual time)."""
STABLE, BURST = "stable", "burst"


def is_advisory(g: GroupSpec) -> bool:
    """The group's autoscaler only advises: its count is `replicas` or an override."""
    return g.autoscaling is not None and g.autoscaling.mode == "advisory"


def spec_count(g: GroupSpec) -> int:
    """The count a group runs before an autoscaler or an operator has set one: an active
    autoscaler's `replicas` within [max(min, stable), max], else `replicas`."""
    scaling = g.autoscaling
    if scaling is None or is_advisory(g):
        return g.replicas
    return min(max(g.replicas, scaling.min, scaling.stable), scaling.max)


def standby(g: GroupSpec) -> int:
    """Standby instances kept out of rotation, warm and sleeping (an active autoscaler's
    only): launched beside the count in force."""
    if g.autoscaling is None or is_advisory(g):
        return 0
    return g.autoscaling.warm_standby + g.autoscaling.sleeping_standby


@dataclass(frozen=True, slots=True)
class TickInput:
    """What one tick decides on.

    `counts`: each group's count in force (what the autoscaler set last, else an override,
    else `replicas`). `loads`: the autoscaled groups due this tick, with the policy of each
    in `scalers` and its memory from the last step in `memories` (none yet: its `initial()`).
    `index`: the spec's lookups (`index_spec`; built here when not given). `floors`: rollout
    baselines' counts. `quota`/`advice`: the allocator's memories; `meter`: month-to-date
    spend and accelerator-hours, advanced to `now`."""

    spec: PlatformSpec
    observed: Sequence[InstanceStatus]
    counts: Mapping[str, int]
    now: float
    loads: Mapping[str, GroupLoad] = dataclasses.field(default_factory=dict)
    scalers: Mapping[str, ScalingPolicy[Any]] = dataclasses.field(default_factory=dict)
    memories: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    index: SpecIndex | None = None
    floors: Mapping[str, int] = dataclasses.field(default_factory=dict)
    quota: QuotaState = dataclasses.field(default_factory=QuotaState)
    advice: QuotaState = dataclasses.field(default_factory=QuotaState)
    meter: Meter = dataclasses.field(default_factory=Meter)
    holds: Mapping[str, NoGainHold] = dataclasses.field(default_factory=dict)
    """groups where more instances were seen not to help (S12): no scale-up past the count"""
    asleep: frozenset[str] = frozenset()
    """instances known asleep (sleeping standby)"""
    fenced: frozenset[str] = frozenset()
    """asleep instances no gateway may wake any more: their units may be lent"""
    awake: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """of the count of a group with sleeping standby, the instances that serve (the last
    decision's `Decision.awake`); the rest sleep in sleeping places. Absent: all serve"""


@fast_init
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


@fast_init
@dataclass(frozen=True, slots=True)
class TickDecision:
    """What the tick decided. `counts`: the active autoscaled groups' new counts (those that
    moved). `observed`: the fleet as the planner saw it (reclaimed instances draining).
    `actions`: reclaim drains first, then each group's plan. `spare`: units per pool
    neither held nor granted (room to surge). `held`: units per group now. `tiers`: each
    instance running when the tick began (a reclaimed one included) -> `stable` | `burst`."""

    scaled: tuple[Scaled, ...]
    counts: Mapping[str, int]
    allocation: AdvisedAllocation
    preview: Allocation | None
    claims: tuple[GroupClaim, ...]
    observed: tuple[InstanceStatus, ...]
    actions: tuple[Action, ...]
    spare: Mapping[str, int]
    held: Mapping[str, int]
    tiers: Mapping[str, str]
    memories: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """each group that decided: its policy's memory after the step"""
    withheld: tuple[Launch, ...] = ()
    """launches of crash-looping groups, waiting for their backoff (`sluice.policy.kernel`)"""
    crash_waits: tuple[tuple[str, CrashBackoff], ...] = ()
    """groups whose launches started waiting this tick, with their backoff"""
    fence: frozenset[str] = frozenset()
    """sleepers gateways must not wake: their units are lent, or about to be"""
    unwoken: frozenset[str] = frozenset()
    """fenced sleepers the count needs awake whose units quota has not granted yet (a
    reclaim frees them): not woken until it does"""
    awake: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """`TickInput.awake` after this tick's decisions: the next tick's"""
    standby_at: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """each group with standby that decided: the in-flight requests per instance in
    rotation past which a gateway takes its standby in (`standby_level`)"""


def clipped(
    group: GroupSpec, decision: Decision, granted: int, floor: int, allocation: Allocation
) -> tuple[int, tuple[str, ...], str]:
    """What quota (`granted` instances) and a rollout's baseline floor leave of the
    decision: (count, guards that clipped it, reason). The count comes before the standby:
    where quota grants fewer than both, instances serve rather than wait. S11: a quota or
    budget refusal shows as the guard that clipped it; C2: a baseline keeps its count."""
    want = max(decision.desired, floor)
    desired = min(want, granted)
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
    """The whole tick's decision (module docstring); mutates nothing it is given."""
    index = inp.index if inp.index is not None else index_spec(inp.spec)
    by_group = _by_group(inp.observed)
    decisions: dict[str, Decision] = {}
    memories: dict[str, Any] = {}
    groups, scalers, now, holds = index.groups, inp.scalers, inp.now, inp.holds
    for name, load in inp.loads.items():
        if name not in groups:
            continue
        policy = scalers[name]
        memory = inp.memories[name] if name in inp.memories else policy.initial()
        d, memories[name] = policy.step(memory, load, now)
        if holds:
            d = _held(d, load, holds.get(name))
        promoted = load.standby_in_rotation > (d.desired if d.awake is None else d.awake)
        decisions[name] = _promoted(d, load) if promoted else d
    standbys = index.standby
    wanted = {name: inp.counts.get(name, n) + standbys[name] for name, n in index.counts.items()}
    awake = {name: n for name, n in inp.awake.items() if name in index.sleeping}
    standby_at: dict[str, float] = {}
    for name, d in decisions.items():
        if name not in index.advising:
            floor = inp.floors.get(name, 0)
            wanted[name] = max(d.desired, floor) + standbys[name]
            awake.pop(name, None)
            if d.awake is not None:
                awake[name] = max(d.awake, floor)
            if standbys[name]:
                level = standby_level(d.signals, groups[name].max_concurrency)
                if level is not None:
                    standby_at[name] = level
    sleeps = _sleeping(index, by_group, wanted, awake, inp) if inp.asleep and index.sleeping else {}
    blocked = _in_the_way(index, sleeps, inp.observed) if sleeps and index.device_share else {}
    claims: list[GroupClaim] = []
    uniform: dict[str, bool] = {}
    templates, meter = index.templates, inp.meter
    for g in inp.spec.groups:
        name = g.name
        mine = by_group.get(name, ())
        s = sleeps.get(name)
        if s is not None and s.released:  # its fenced sleepers hold no units
            kept = [i for i in mine if i.id not in s.released]
            claim, _ = _claim(g, templates[name], kept, wanted[name] - s.placed, meter)
            uniform[name] = False  # planned with its sleepers (below)
            if first := frozenset(b for iid in s.to_wake for b in blocked.get(iid, ())):
                claim = dataclasses.replace(claim, reclaim_first=first)
        else:
            claim, uniform[name] = _claim(g, templates[name], mine, wanted[name], meter)
        claims.append(claim)
    advised = _allocate(index, claims, inp, inp.quota, inp.advice)
    alloc = advised.enforced
    woken: dict[str, int] = {}
    kept_asleep: dict[str, int] = {}
    held_back: set[str] = set()
    evicted: list[Drain] = []
    for c in claims if sleeps else ():  # a start granted wakes a released sleeper first
        s = sleeps.get(c.name)
        if s is not None:
            starts = max(0, alloc.grants[c.name].instances - len(c.running))
            woken[c.name] = n = min(len(s.to_wake), starts)
            kept_asleep[c.name] = len(s.released) - n
            for iid in s.to_wake[:n] if blocked else ():
                if iid in blocked:  # its devices are not free yet
                    _clear_the_way(c.name, iid, blocked[iid], alloc, inp, held_back, evicted)
    scaled, counts, preview = _settle(index, inp, decisions, claims, advised, kept_asleep)
    actions: list[Action] = list(evicted)
    draining: dict[str, str] = {d.instance_id: d.reason for d in evicted}
    for r in alloc.reclaims:  # serving-aware: out of routing, drained, then released
        for iid in r.instance_ids:
            draining[iid] = r.reason
            actions.append(Drain(r.borrower, iid, r.reason))
    # of the fleet as the tick found it (a reclaimed one's too), worked out when read
    tiers = _Tiers(by_group, alloc.grants, index.groups)
    observed = tuple(inp.observed)
    if draining:
        observed = tuple(
            dataclasses.replace(i, state=InstanceState.DRAINING, reason=draining[i.id])
            if i.id in draining and i.state in ALIVE_STATES
            else i
            for i in observed
        )
        by_group = _by_group(observed)
        for r in alloc.reclaims:  # walked again below: its instances now drain
            uniform.pop(r.borrower, None)
        for drain in evicted:
            uniform.pop(drain.group, None)
    grants = alloc.grants
    held: dict[str, int] = {}
    running: dict[str, int] = {}
    spare = {p.name: p.count for p in index.pools}
    for c in claims:  # one walk: units held, instances running, what each pool has spare
        name, units, n = c.name, c.units_per_instance, len(c.running)
        running[name] = n
        held[name] = units_held = n * units + c.draining_units
        if c.pool in spare:
            spare[c.pool] -= max(units_held, grants[name].instances * units)
    for name, g in index.groups.items():
        grant, mine = grants[name], by_group.get(name, ())
        n = grant.instances + kept_asleep[name] if name in kept_asleep else grant.instances
        if name in uniform:  # walked once already, by its claim
            settled = uniform[name] and running[name] == n
        else:
            settled = _settled(index.templates[name], n, mine)
        if not settled:
            actions += plan_group(_target(g, index.templates[name], n, spare), mine)
    for name in by_group.keys() - index.groups.keys():  # groups gone from the spec
        actions += plan_group(GroupTarget(name, "", 0), by_group[name])
    fence, unwoken, sleep_rate = (
        _fences(index, sleeps, woken, frozenset(held_back), claims, alloc) if sleeps else _NONE
    )
    if sleep_rate:
        advised = dataclasses.replace(advised, enforced=_metered_asleep(alloc, sleep_rate))
    return TickDecision(
        scaled=tuple(scaled),
        counts=counts,
        allocation=advised,
        preview=preview,
        claims=tuple(claims),
        observed=observed,
        actions=tuple(actions),
        spare={k: max(0, v) for k, v in spare.items()},
        held=held,
        tiers=tiers,
        memories=memories,
        fence=fence,
        unwoken=unwoken,
        awake=awake,
        standby_at=standby_at,
    )


_OWN_LIMITS: Final = ("budget", "limit ", "borrow_limit ")
"""how a refusal for a group's own cap or budget begins (`sluice.policy.quota.allocate`):
lending it units would not help it"""
_NONE: tuple[frozenset[str], frozenset[str], Mapping[str, float]] = (frozenset(), frozenset(), {})


def _metered_asleep(alloc: Allocation, rate: Mapping[str, float]) -> Allocation:
    """`alloc` with the host memory of released sleepers in the groups' spend per hour (what
    the meter counts and the fleet shows); units held stay the accelerators'."""
    grants = dict(alloc.grants)
    for name, extra in rate.items():
        g = grants[name]
        grants[name] = dataclasses.replace(g, spend_per_hour=g.spend_per_hour + extra)
    total = alloc.spend_per_hour + sum(rate.values())
    return dataclasses.replace(alloc, grants=grants, spend_per_hour=total)


def _sleeping(
    index: SpecIndex,
    by_group: Mapping[str, Sequence[InstanceStatus]],
    wanted: Mapping[str, int],
    serve: Mapping[str, int],
    inp: TickInput,
) -> dict[str, SleepingUnits]:
    """Each sleeping-standby group's sleepers in quota (`sleeping_units`); `serve`: where
    fewer than its count serve (`TickInput.awake`)."""
    out: dict[str, SleepingUnits] = {}
    for name, terms in index.sleeping.items():
        asleep: list[tuple[float, str]] = []
        awake = 0
        for i in by_group.get(name, ()):
            if i.state is InstanceState.READY:
                if i.id in inp.asleep:
                    asleep.append((i.ready_at if i.ready_at is not None else i.created_at, i.id))
                else:
                    awake += 1
        if asleep:
            q = index.groups[name].quota
            serving = wanted[name] - index.standby[name]
            if name in serve:
                serving = min(serving, serve[name])
            out[name] = sleeping_units(
                asleep,
                awake,
                serving,
                terms.warm,
                terms.units,
                q.guaranteed,
                q.lendable,
                inp.fenced,
            )
    return out


def _in_the_way(
    index: SpecIndex, sleeps: Mapping[str, SleepingUnits], observed: Sequence[InstanceStatus]
) -> dict[str, tuple[str, ...]]:
    """Of the released sleepers the count needs awake on pools that pin devices, those whose
    devices other instances hold now (placed there while their units were lent), with
    those instances (`sluice.policy.devices.in_the_way`). Every instance pinned there holds
    its devices until it is gone, as the supervisor counts them, but the released
    sleepers."""
    shares = index.device_share
    waking = {iid: name for name, s in sleeps.items() if name in shares for iid in s.to_wake}
    if not waking:
        return {}
    released = frozenset().union(*(s.released for s in sleeps.values()))
    holds: list[DeviceHold] = []
    devices: dict[str, tuple[str, ...]] = {}
    for i in observed:
        pinned = i.devices
        if not pinned or i.state is InstanceState.STOPPED:
            continue
        if i.id in waking:
            devices[i.id] = pinned
        elif i.id not in released:  # a group gone from the spec: its whole devices
            each = shares[i.group][0] if i.group in shares else _WHOLE
            holds.append(DeviceHold(i.id, pinned, each))
    out: dict[str, tuple[str, ...]] = {}
    for iid, pinned in devices.items():
        each, per_device = shares[waking[iid]]
        if there := in_the_way(pinned, each, per_device, holds):
            out[iid] = there
    return out


_WHOLE: Final = 1 << 30
"""the units per device of an instance whose group left the spec: as if it filled them"""


def _clear_the_way(
    group: str,
    sleeper: str,
    there: Sequence[str],
    alloc: Allocation,
    inp: TickInput,
    held_back: set[str],
    evicted: list[Drain],
) -> None:
    """A sleeper granted its units back whose devices the instances `there` hold: it stays
    asleep (fenced, not woken) until they are gone. One of them leaving already (a reclaim
    of the borrower on its devices, `GroupClaim.reclaim_first`) is waited for. Else, where
    they are all borrowed instances of other groups (the grant came from units freed
    elsewhere), they drain: a borrower's instance starts again on those units, cold, and the
    guarantee's owner wakes in seconds. Else (an instance no reclaim may touch is there) the
    sleeper itself drains and the planner starts a fresh instance on the units the grant
    freed, rather than wait for ever."""
    held_back.add(sleeper)
    leaving = {iid for r in alloc.reclaims for iid in r.instance_ids}
    leaving.update(i.id for i in inp.observed if i.state is InstanceState.DRAINING)
    if leaving.intersection(there):
        return
    owner = {i.id: i.group for i in inp.observed if i.id in there}
    borrowers = {x.borrower for x in alloc.loans} - {group}
    if all(owner.get(iid) in borrowers for iid in there):
        why = f"borrowed, on the devices of {group}'s sleeper {sleeper}, which its count needs"
        evicted.extend(Drain(owner[iid], iid, why) for iid in there)
        return
    why = f"its devices are held by {', '.join(there)}, which no reclaim frees"
    evicted.append(Drain(group, sleeper, why + ": a fresh instance takes its place"))


def _fences(
    index: SpecIndex,
    sleeps: Mapping[str, SleepingUnits],
    woken: Mapping[str, int],
    held_back: frozenset[str],
    claims: Sequence[GroupClaim],
    alloc: Allocation,
) -> tuple[frozenset[str], frozenset[str], dict[str, float]]:
    """(sleepers to fence, released sleepers left asleep for want of units or of their
    devices (`held_back`), their host memory's spend per hour per group). A group's
    lendable sleepers are fenced while another group of its pool waits for units or it
    lends any; released ones stay fenced while it lends."""
    grants, refusals = alloc.grants, alloc.refusals
    short = {  # groups that wait for units, not for their own cap or budget
        c.pool
        for c in claims
        if c.name not in sleeps
        and grants[c.name].instances < c.wanted
        and not refusals.get(c.name, "").startswith(_OWN_LIMITS)
    }
    lenders = {x.lender for x in alloc.loans}
    fence: set[str] = set()
    unwoken: set[str] = set()
    rate: dict[str, float] = {}
    for name, s in sleeps.items():
        lends = name in lenders
        if lends or index.groups[name].resources.pool in short:
            fence.update(s.lendable)
        waiting = [*s.to_wake[woken[name] :], *held_back.intersection(s.to_wake)]
        unwoken.update(waiting)
        fence.update(waiting)
        if lends:
            fence.update(s.released.difference(s.to_wake))
        if s.released:
            rate[name] = len(s.released) * index.sleeping[name].rate
    return frozenset(fence), frozenset(unwoken), rate


def _held(d: Decision, load: GroupLoad, hold: NoGainHold | None) -> Decision:
    """S12: where more instances were seen not to help, no scale-up past the hold's count
    (guard `no_gain`); scaling down is never held."""
    if hold is None:
        return d
    cap = max(load.current, hold.count)
    if d.desired <= cap:
        return d
    return dataclasses.replace(
        d,
        desired=cap,
        clipped_by=(*d.clipped_by, "no_gain"),
        reason=f"{d.reason}; held at {cap}: {hold.reason}",
        unclipped=d.unclipped if d.unclipped is not None else d.desired,
    )


def _promoted(d: Decision, load: GroupLoad) -> Decision:
    """The fast tier, made lasting: a gateway put the group's warm standby in rotation
    because requests waited (`GroupLoad.standby_in_rotation`), so the count in force takes
    those instances in, and the standby is launched anew (`decide` adds it to every
    active group's want). Never lowers the count; the autoscaler scales down as usual."""
    n = load.standby_in_rotation
    if d.awake is not None and n > d.awake:  # what a gateway woke serves
        d = dataclasses.replace(d, awake=n if n < d.desired else None)
    if n <= d.desired:
        return d
    return dataclasses.replace(
        d,
        desired=n,
        winner="standby",
        reason=f"{d.reason}; {n} in rotation: a gateway promoted the warm standby "
        "(requests waited), a new one is launched",
    )


def _by_group(observed: Sequence[InstanceStatus]) -> dict[str, list[InstanceStatus]]:
    out: dict[str, list[InstanceStatus]] = {}
    for inst in observed:
        mine = out.get(inst.group)
        if mine is None:  # not setdefault: that builds a list per instance
            out[inst.group] = [inst]
        else:
            mine.append(inst)
    return out


def _settle(
    index: SpecIndex,
    inp: TickInput,
    decisions: Mapping[str, Decision],
    claims: Sequence[GroupClaim],
    advised: AdvisedAllocation,
    kept_asleep: Mapping[str, int],
) -> tuple[list[Scaled], dict[str, int], Allocation | None]:
    """Each decision as quota leaves it: an active one becomes the group's count (the
    moved ones in `counts`); an advisory one is previewed against quota on this round's
    memory (what the next round would grant it) and changes nothing. `kept_asleep`:
    released sleepers kept asleep, instances the group has without units."""
    alloc = advised.enforced
    scaled: list[Scaled] = []
    counts: dict[str, int] = {}
    advising = {n: d for n, d in decisions.items() if n in index.advising}
    preview = None
    if advising:
        asked = {n: max(d.desired, inp.floors.get(n, 0)) for n, d in advising.items()}
        shown = [dataclasses.replace(c, wanted=asked.get(c.name, c.wanted)) for c in claims]
        preview = _allocate(index, shown, inp, alloc.state, advised.advice.state).enforced
    groups, loads, floors, scalers = index.groups, inp.loads, inp.floors, inp.scalers
    for name, d in decisions.items():
        advisory = name in advising
        basis = preview if advisory and preview is not None else alloc
        g, load = groups[name], loads[name]
        granted = basis.grants[name].instances + kept_asleep.get(name, 0)
        count, guards, reason = clipped(g, d, granted, floors.get(name, 0), basis)
        scaled.append(Scaled(g, load, d, scalers[name].name, count, guards, reason, advisory))
        if not advisory and count != load.current:
            counts[name] = count
    return scaled, counts, preview


@dataclass(frozen=True, slots=True)
class SpecIndex:
    """Per-spec lookups, built once per spec by whoever holds it (a template is a hash of
    the group's models: too dear to work out for 1,000 groups every tick)."""

    groups: Mapping[str, GroupSpec]
    templates: Mapping[str, str]
    standby: Mapping[str, int]
    counts: Mapping[str, int]
    """each group's `spec_count` (worked out once: 1,000 groups look it up every tick)"""
    autoscaled: frozenset[str]
    """groups whose active autoscaler sets the count (not advisory)"""
    pools: tuple[PoolState, ...]
    advisory: frozenset[str]
    """groups whose quota only advises"""
    advising: frozenset[str]
    """groups whose autoscaler only advises"""
    sleeping: Mapping[str, SleepTerms] = dataclasses.field(default_factory=dict)
    """groups whose sleeping standby may lend its units"""
    device_share: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """groups on pools that pin devices: (units an instance holds on each of its devices,
    the pool's units per device)"""


@dataclass(frozen=True, slots=True)
class SleepTerms:
    """A sleeping-standby group's terms for lending its sleepers' units."""

    warm: int
    units: int
    """accelerator units per instance"""
    rate: float
    """spend per hour of one released sleeper: its host memory at the pool's price"""


def _sleep_terms(spec: PlatformSpec) -> dict[str, SleepTerms]:
    """Groups whose sleepers may lend their units. On a pool that pins devices the units
    are the sleeper's own devices: the borrower placed there is reclaimed first and the
    sleeper wakes once it is gone (`_in_the_way`)."""
    out: dict[str, SleepTerms] = {}
    for g in spec.groups:
        a, sleep = g.autoscaling, g.sleep
        pool = spec.pool(g.resources.pool)
        if a is None or is_advisory(g) or not a.sleeping_standby or sleep is None:
            continue
        if pool is None:
            continue
        rate = sleep.host_memory_gb * pool.host_memory_price_per_gb_hour
        out[g.name] = SleepTerms(a.warm_standby, g.resources.accelerators, rate)
    return out


def index_spec(spec: PlatformSpec) -> SpecIndex:
    """The lookups every tick makes in `spec`."""
    return SpecIndex(
        groups={g.name: g for g in spec.groups},
        templates={g.name: g.template() for g in spec.groups},
        standby={g.name: standby(g) for g in spec.groups},
        counts={g.name: spec_count(g) for g in spec.groups},
        autoscaled=frozenset(
            g.name for g in spec.groups if g.autoscaling is not None and not is_advisory(g)
        ),
        pools=tuple(PoolState(p.name, p.purpose, p.count, p.price_per_hour) for p in spec.pools),
        advisory=frozenset(g.name for g in spec.groups if g.quota.mode == "advisory"),
        advising=frozenset(g.name for g in spec.groups if is_advisory(g)),
        sleeping=_sleep_terms(spec),
        device_share=_device_shares(spec),
    )


def _device_shares(spec: PlatformSpec) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for g in spec.groups:
        pool, res = spec.pool(g.resources.pool), g.resources
        if pool is not None and pool.devices:
            each = units_on_each(res.accelerators, pool.units_per_device, res.fractional)
            out[g.name] = (each, pool.units_per_device)
    return out


def _claim(
    g: GroupSpec, template: str, mine: Sequence[InstanceStatus], wanted: int, meter: Meter
) -> tuple[GroupClaim, bool]:
    """The group's claim on quota, and whether its alive instances are all of `template`
    with none failed (then it is settled when their number is its grant: `_settled` in
    the same walk)."""
    running = []
    draining = 0
    uniform = True
    for i in mine:
        state = i.state
        if state in ALIVE_STATES:
            running.append(i)
            if i.template != template:
                uniform = False
        elif state is InstanceState.DRAINING:
            draining += 1
        elif state is InstanceState.FAILED:
            uniform = False
    name, resources = g.name, g.resources
    units = resources.accelerators
    claim = GroupClaim(  # by position, as declared (1,000 groups a tick)
        name,
        resources.pool,
        units,  # units_per_instance
        wanted,
        g.quota,
        running,
        draining * units,  # draining_units
        g.budget,
        meter.spent.get(name, 0.0),  # spent_this_month: `meter.spent_by(name)`
        g.drain_timeout_s,
        "inference",  # purpose
        meter.unit_hours.get(name, 0.0),  # unit_hours_this_month: `meter.hours_by(name)`
    )
    return claim, uniform


def _allocate(
    index: SpecIndex,
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
        budget=inp.spec.budget,
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


def _settled(template: str, replicas: int, mine: Sequence[InstanceStatus]) -> bool:
    """Nothing to plan: exactly `replicas` alive instances, all of `template`, none failed
    (most groups on most ticks; `plan_group` would return no action)."""
    alive = 0
    for i in mine:
        if i.state in ALIVE_STATES:
            if i.template != template:
                return False
            alive += 1
        elif i.state is InstanceState.FAILED:
            return False
    return alive == replicas


class _Tiers(Mapping[str, str]):
    """Instance id -> tier, worked out on first read (the live controller reads it when
    asked; a tick that nobody asks about pays nothing for it)."""

    def __init__(
        self,
        by_group: Mapping[str, Sequence[InstanceStatus]],
        grants: Mapping[str, Grant],
        groups: Mapping[str, GroupSpec],
    ):
        self._by_group, self._grants, self._groups = by_group, grants, groups
        self._tiers: dict[str, str] | None = None

    def _all(self) -> dict[str, str]:
        if self._tiers is None:
            self._tiers = {}
            for name, g in self._groups.items():  # the instances its own units carry
                own = self._grants[name].own_units // g.resources.accelerators
                _tier(self._by_group.get(name, ()), own, self._tiers)
        return self._tiers

    def __getitem__(self, key: str) -> str:
        return self._all()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def _tier(mine: Sequence[InstanceStatus], own: int, out: dict[str, str]) -> None:
    """The oldest ready instances, then the oldest not yet ready, up to the instances the
    group's own guaranteed units carry, are its stable part; the rest are burst."""
    alive = [i for i in mine if i.state in ALIVE_STATES]
    if own >= len(alive) or own <= 0:  # one tier only: no order needed
        tier = STABLE if own > 0 else BURST
        for inst in alive:
            out[inst.id] = tier
        return
    alive.sort(key=lambda i: (i.state is not InstanceState.READY, i.created_at, i.id))
    for n, inst in enumerate(alive):
        out[inst.id] = STABLE if n < own else BURST
