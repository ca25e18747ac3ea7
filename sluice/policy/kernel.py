"""The tick kernel: `step(memory, world, now) -> (decision, memory)`, values in and out.

Everything a reconcile tick carries to the next is one frozen `Memory`: the counts the
autoscalers set, each autoscaled group's policy memory and when it is next due, the quota
allocator's and the advice's memories, the month-to-date meter, and each group's crash-loop
backoff (a crash-looping group's launches wait: `TickDecision.withheld`). Everything it reads is
one `World`: the spec (with its lookups, `compile_spec`), the fleet as observed, the due
groups' load readings, and what operators and other loops hold (overrides, pins, rollout
floors, no-gain holds). `step` decides through `sluice.policy.tick.decide` and returns the
next memory; it mutates nothing it is given, so the same memory and world always give the
same decision, and a recorded run replays tick by tick.

Live and simulated runs differ only in their ports: the sensors that fill `World` (the
live controller reads the gateway's counters for the groups `due` names; the fleet simulator
its own lanes), the actuator that applies `TickDecision.actions`, and the journal that keeps
decisions and memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sluice.core.frozen import fast_init
from sluice.core.instances import InstanceStatus
from sluice.policy.autoscale import GroupLoad, ScalingPolicy, build_policy
from sluice.policy.autoscale.batching import ServerModel
from sluice.policy.backoff import CrashLoops
from sluice.policy.gain import NoGainHold
from sluice.policy.plan import Action, Launch
from sluice.policy.quota import QuotaState
from sluice.policy.quota.metering import Meter
from sluice.policy.tick import (
    SpecIndex,
    TickDecision,
    TickInput,
    decide,
    index_spec,
    is_advisory,
    spec_count,
)
from sluice.spec import GroupSpec, PlatformSpec

__all__ = [
    "Compiled",
    "FittedServer",
    "GroupMemory",
    "Memory",
    "World",
    "compile_spec",
    "count_in_force",
    "due",
    "handed_back",
    "policy_key",
    "serving_in_force",
    "step",
]


def policy_key(g: GroupSpec, spec: PlatformSpec) -> str:
    """What a group's policy is built from: its autoscaling knobs and the schedule templates.
    A switch of `mode` is not in it: what the policy learned while advising carries over."""
    assert g.autoscaling is not None
    knobs = g.autoscaling.model_dump_json(exclude={"mode"})
    return knobs + repr(sorted(spec.schedule_templates.items()))


@dataclass(frozen=True, slots=True)
class Compiled:
    """A spec with what each tick looks up in it, built once per spec (`compile_spec`)."""

    spec: PlatformSpec
    index: SpecIndex
    policies: Mapping[str, ScalingPolicy[Any]]
    """each autoscaled group's policy (configuration only: its memory is in `Memory`)"""
    keys: Mapping[str, str]
    """each autoscaled group's `policy_key`, plus the policy it was told to run and the
    fitted server it was given (`compile_spec`)"""


@dataclass(frozen=True, slots=True)
class FittedServer:
    """A group's batching server as a capacity test measured it (`sluice loadtest --fit`,
    stored under the group's model version): what the live controller hands `compile_spec`
    (the kernel reads no store)."""

    server: ServerModel
    source: str
    """where it came from, for the decisions' reasons: e.g. 'load test #12 (v3)'"""


def compile_spec(
    spec: PlatformSpec,
    policies: Mapping[str, str] | None = None,
    servers: Mapping[str, FittedServer] | None = None,
    declared: bool = True,
) -> Compiled:
    """`spec` ready for `step`; `policies` names another policy for a group (a study's
    `--policy`); `servers` gives a group's fitted batching server, which sizes it on its
    capacity at the SLO (`build_policy`'s `server`; its policy key then names the fit, so
    a new fit builds the policy anew); `declared` False: the models' `sim.batching` blocks
    do not describe the instances (the live controller's: its `sim` worker does not batch).
    Raises ValueError for an unknown policy name (`build_policy`)."""
    chosen = policies or {}
    fits = servers or {}
    scaled = [g for g in spec.groups if g.autoscaling is not None]
    built: dict[str, ScalingPolicy[Any]] = {}
    keys: dict[str, str] = {}
    for g in scaled:
        fit = fits.get(g.name)
        built[g.name] = build_policy(
            g,
            spec.schedule_templates,
            chosen.get(g.name),
            fit.server if fit is not None else None,
            declared=declared,
            server_from=fit.source if fit is not None else None,
        )
        key = policy_key(g, spec) + f"|{chosen.get(g.name)}"
        if fit is not None:
            key += f"|fit:{fit.server!r}"
        keys[g.name] = key
    return Compiled(spec=spec, index=index_spec(spec), policies=built, keys=keys)


@fast_init
@dataclass(frozen=True, slots=True)
class GroupMemory:
    """What one autoscaled group carries between ticks."""

    key: str
    """the `Compiled.keys` entry its policy was built under: another means a new policy"""
    policy: Any
    """the policy's memory value (`ScalingPolicy.step` returns the next one)"""
    next_at: float = float("-inf")
    """when it is next due (every `autoscaling.interval_s`)"""


@fast_init
@dataclass(frozen=True, slots=True)
class Memory:
    """Everything one tick hands the next (module docstring)."""

    counts: Mapping[str, int] = field(default_factory=dict)
    """the count each actively autoscaled group's last decision set"""
    groups: Mapping[str, GroupMemory] = field(default_factory=dict)
    quota: QuotaState = field(default_factory=QuotaState)
    advice: QuotaState = field(default_factory=QuotaState)
    meter: Meter = field(default_factory=Meter)
    """month-to-date spend and accelerator-hours, as of the last tick, holding its round"""
    crashes: CrashLoops = field(default_factory=CrashLoops)
    awake: Mapping[str, int] = field(default_factory=dict)
    """of the count of a group with sleeping standby, the instances that serve
    (`TickDecision.awake`); the rest sleep. Absent: all serve"""
    standby_at: Mapping[str, float] = field(default_factory=dict)
    """each standby group's `standby_level`, as its last decision left it"""


@dataclass(frozen=True, slots=True)
class World:
    """What one tick reads. `loads`: a reading of each group `due` named (its `current` is
    set by `step` from the counts); `overrides`: operators' counts of groups not actively
    autoscaled; `pins`: pinned counts, beating every other; `floors`: running rollouts'
    baseline counts; `holds`: groups where more instances were seen not to help;
    `asleep`: sleeping standby known asleep, `fenced` those of them no gateway may wake."""

    compiled: Compiled
    observed: Sequence[InstanceStatus]
    loads: Mapping[str, GroupLoad] = field(default_factory=dict)
    overrides: Mapping[str, int] = field(default_factory=dict)
    pins: Mapping[str, int] = field(default_factory=dict)
    floors: Mapping[str, int] = field(default_factory=dict)
    holds: Mapping[str, NoGainHold] = field(default_factory=dict)
    asleep: frozenset[str] = frozenset()
    fenced: frozenset[str] = frozenset()


def serving_in_force(
    g: GroupSpec, memory: Memory, overrides: Mapping[str, int], pins: Mapping[str, int]
) -> int:
    """Of the count in force, the instances that serve: the rest of a group with sleeping
    standby's count is held asleep (`Memory.awake`), unless a pin set the count."""
    n = count_in_force(g, memory.counts, overrides, pins)
    awake = memory.awake.get(g.name)
    return n if awake is None or g.name in pins else min(n, awake)


def count_in_force(
    g: GroupSpec, counts: Mapping[str, int], overrides: Mapping[str, int], pins: Mapping[str, int]
) -> int:
    """Instances that serve: a pin, else the autoscaler's count, else a manual override,
    else the spec's `replicas` (an advisory autoscaler's group counts as not autoscaled)."""
    if g.name in pins:
        return pins[g.name]
    if g.autoscaling is not None and not is_advisory(g):
        return counts.get(g.name, spec_count(g))
    return overrides.get(g.name, g.replicas)


def _counts_in_force(
    index: SpecIndex,
    counts: Mapping[str, int],
    overrides: Mapping[str, int],
    pins: Mapping[str, int],
) -> dict[str, int]:
    """`count_in_force` of every group, in spec order, from the index's `spec_count`s (a
    group not actively autoscaled has `replicas` there)."""
    out: dict[str, int] = {}
    autoscaled = index.autoscaled
    for name, n in index.counts.items():
        if name in pins:
            out[name] = pins[name]
        elif name in autoscaled:
            out[name] = counts.get(name, n)
        else:
            out[name] = overrides.get(name, n)
    return out


def handed_back(memory: Memory, compiled: Compiled, group: str, count: int) -> tuple[int, Memory]:
    """`memory` with the actively autoscaled `group` handed back after a test that moved it
    (a peak drill): its autoscaler starts afresh (its windows, cooldowns and stabilization
    forget the test's load, which no caller sent) from `count` instances, kept within
    [max(min, stable), max], and decides again at the next tick. Returns (the count set,
    the memory). Raises KeyError for a group not actively autoscaled (its count is its
    `replicas` or an operator's override: nothing of a test's stays in it)."""
    if group not in compiled.index.autoscaled:
        raise KeyError(group)
    key = compiled.keys[group]
    auto = compiled.index.groups[group].autoscaling
    assert auto is not None  # it has a key
    kept = min(max(count, auto.min, auto.stable), auto.max)
    fresh = GroupMemory(key, compiled.policies[group].initial())
    counts = {**memory.counts, group: kept}
    return kept, replace(memory, counts=counts, groups={**memory.groups, group: fresh})


def due(memory: Memory, compiled: Compiled, now: float) -> frozenset[str]:
    """The autoscaled groups whose interval has come at `now`: the ones whose load the
    sensors read for this tick's `World`."""
    out = []
    for name, key in compiled.keys.items():
        mine = memory.groups.get(name)
        if mine is None or mine.key != key or now >= mine.next_at:
            out.append(name)
    return frozenset(out)


def step(memory: Memory, world: World, now: float) -> tuple[TickDecision, Memory]:
    """One tick: the due groups' policies step on their memories (a pinned group's does
    not: its count is the pin's), quota grants on its memory and the meter advanced to
    `now`, the plan, a crash-looping group's launches held back; returns the decision and
    the memory for the next tick."""
    compiled = world.compiled
    spec = compiled.spec
    counts = _counts_in_force(compiled.index, memory.counts, world.overrides, world.pins)
    groups = {n: m for n, m in memory.groups.items() if n in compiled.keys}
    policy_memory: dict[str, Any] = {}
    loads: dict[str, GroupLoad] = {}
    next_at: dict[str, float] = {}
    for name, key in compiled.keys.items():
        mine = groups.get(name)
        if mine is None or mine.key != key:
            mine = groups[name] = GroupMemory(key, compiled.policies[name].initial())
        load = world.loads.get(name)
        if load is None or now < mine.next_at:
            continue
        g = compiled.index.groups[name]
        assert g.autoscaling is not None
        next_at[name] = now + g.autoscaling.interval_s
        if name not in world.pins:
            # the sensors usually fill in the count in force; a copy only where they did not
            current = counts[name]
            loads[name] = load if load.current == current else replace(load, current=current)
            policy_memory[name] = mine.policy
    meter = memory.meter.advanced(now)
    decision = decide(
        TickInput(
            spec=spec,
            observed=world.observed,
            counts=counts,
            now=now,
            loads=loads,
            scalers=compiled.policies,
            memories=policy_memory,
            index=compiled.index,
            floors=world.floors,
            quota=memory.quota,
            advice=memory.advice,
            meter=meter,
            holds=world.holds,
            asleep=world.asleep,
            fenced=world.fenced,
            awake=memory.awake,
        )
    )
    for name, due_at in next_at.items():  # one new value per group that was due
        mine = groups[name]
        policy = decision.memories.get(name, mine.policy)
        groups[name] = GroupMemory(mine.key, policy, due_at)
    crashes, waits = memory.crashes.track(decision.observed, now)
    kept: list[Action] = []
    held_back: list[Launch] = []
    for a in decision.actions:
        if isinstance(a, Launch) and not crashes.launch_allowed(a.group, now):
            held_back.append(a)
        else:
            kept.append(a)
    if held_back or waits:
        decision = replace(
            decision, actions=tuple(kept), withheld=tuple(held_back), crash_waits=waits
        )
    alloc = decision.allocation.enforced
    counts_kept = {n: c for n, c in memory.counts.items() if n in compiled.keys}
    return decision, Memory(
        counts={**counts_kept, **decision.counts},
        groups=groups,
        quota=alloc.state,
        advice=decision.allocation.advice.state,
        meter=meter.holding(alloc),
        crashes=crashes,
        awake=decision.awake,
        standby_at={  # a group that decided anew has its level, or none
            **{
                n: v
                for n, v in memory.standby_at.items()
                if n in compiled.keys and n not in decision.memories
            },
            **decision.standby_at,
        },
    )
