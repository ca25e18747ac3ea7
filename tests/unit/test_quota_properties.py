"""Quota invariants over random pools, quotas, budgets and demand, with a fake controller
applying every round's grants and reclaims (drains complete after a few ticks)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sluice.policy.quota import (
    Allocation,
    GroupClaim,
    PoolState,
    QuotaState,
    RunningInstance,
    allocate,
    hours_left_in_month,
)
from sluice.spec.quota import BudgetSpec, QuotaSpec

T0 = 1_795_996_800.0  # 2026-11-30T00:00Z: 24 h left in the month
PHASE = 10  # rounds (1 s each) per demand phase
EPS = 1e-6


@dataclass
class Group:
    name: str
    pool: str
    u: int
    quota: QuotaSpec
    drain_ticks: int
    budget: BudgetSpec | None = None
    running: list[RunningInstance] = field(default_factory=list)
    draining: list[tuple[float, int]] = field(default_factory=list)  # (release at, units)
    spent: float = 0.0
    unit_hours: float = 0.0
    made: int = 0

    def held(self) -> int:
        return len(self.running) * self.u + sum(units for _, units in self.draining)


@dataclass
class World:
    pools: list[PoolState]
    groups: list[Group]
    demand: list[list[int]]  # per phase, per group: wanted instances
    shrink: tuple[int, int] | None  # (round, new count of pool 0)
    budget: BudgetSpec | None
    lag: bool  # the controller applies reclaims one round late, every other round
    # (round, every group's budget, the global budget): the spec changes the budgets then
    rebudget: tuple[int, list[BudgetSpec | None], BudgetSpec | None] | None = None


def budget_specs(draw: st.DrawFn, scale: int) -> BudgetSpec:
    """A budget with any of its caps; `scale`: 1 for a group, 2 for all groups."""
    return BudgetSpec(
        per_hour=draw(st.none() | st.floats(0.5 * scale, 20 * scale)),
        per_month=draw(st.none() | st.floats(10 * scale, 450 * scale)),
        max_accelerators=draw(st.none() | st.integers(1, 10 * scale)),
        accelerator_hours_per_month=draw(st.none() | st.floats(5 * scale, 250 * scale)),
    )


@st.composite
def worlds(draw: st.DrawFn, *, budgets: bool, shrink: bool, rebudget: bool = False) -> World:
    pools = [
        PoolState("gpu", "inference", draw(st.integers(1, 12)), draw(st.sampled_from([0, 1, 2.5]))),
        PoolState("train", "training", draw(st.integers(1, 6)), 1.0),
    ]
    left = {p.name: p.count for p in pools}
    groups = []
    for i in range(draw(st.integers(1, 5))):
        pool = draw(st.sampled_from(pools))
        guaranteed = draw(st.integers(0, left[pool.name]))
        left[pool.name] -= guaranteed
        limit = draw(st.none() | st.integers(guaranteed, guaranteed + 6))
        quota = QuotaSpec(
            guaranteed=guaranteed,
            limit=limit,
            lendable=draw(st.none() | st.integers(0, guaranteed)),
            borrow_limit=draw(st.none() | st.integers(0, 4)),
            reserved=draw(st.booleans()),
            priority=draw(st.integers(-2, 2)),
            reclaim_grace_s=draw(st.integers(0, 3)),
        )
        budget = budget_specs(draw, 1) if budgets and draw(st.booleans()) else None
        groups.append(
            Group(
                f"g{i}", pool.name, draw(st.integers(1, 3)), quota, draw(st.integers(1, 3)), budget
            )
        )
    phases = draw(st.integers(2, 3))
    demand = [[draw(st.integers(0, 7)) for _ in groups] for _ in range(phases)]
    cut = None
    if shrink:
        cut = (draw(st.integers(0, phases * PHASE - 1)), draw(st.integers(0, pools[0].count)))
    budget = budget_specs(draw, 2) if budgets else None
    later = None
    if rebudget:
        at = draw(st.integers(1, phases * PHASE - 1))
        mine = [budget_specs(draw, 1) if draw(st.booleans()) else None for _ in groups]
        later = (at, mine, budget_specs(draw, 2) if draw(st.booleans()) else None)
    return World(pools, groups, demand, cut, budget, draw(st.booleans()), later)


def claims_of(world: World, wanted: Sequence[int]) -> list[GroupClaim]:
    """Each group's claim for one round: what it runs, drains and spent, and `wanted`."""
    return [
        GroupClaim(
            name=g.name,
            pool=g.pool,
            units_per_instance=g.u,
            wanted=wanted[i],
            quota=g.quota,
            running=tuple(g.running),
            draining_units=g.held() - len(g.running) * g.u,
            budget=g.budget,
            spent_this_month=g.spent,
            unit_hours_this_month=g.unit_hours,
            drain_timeout_s=float(g.drain_ticks),
            purpose="training" if g.pool == "train" else "inference",
        )
        for i, g in enumerate(world.groups)
    ]


def simulate(world: World) -> list[list[tuple[int, int]]]:
    """Run every round; check per-round invariants; return (wanted, running) per round/group."""
    state = QuotaState()
    pools = list(world.pools)
    budget = world.budget
    spent = unit_hours = 0.0
    history: list[list[tuple[int, int]]] = []
    rounds = len(world.demand) * PHASE
    for r in range(rounds):
        now = T0 + r
        if world.shrink is not None and r == world.shrink[0]:
            pools[0] = PoolState(
                pools[0].name, "inference", world.shrink[1], pools[0].price_per_hour
            )
        if world.rebudget is not None and r == world.rebudget[0]:
            for g, later in zip(world.groups, world.rebudget[1], strict=True):
                g.budget = later
            budget = world.rebudget[2]
        for g in world.groups:
            g.draining = [(t, u) for t, u in g.draining if t > now]
        wanted = world.demand[r // PHASE]
        claims = claims_of(world, wanted)
        alloc = allocate(
            pools,
            claims,
            state,
            now,
            budget=budget,
            spent_this_month=spent,
            unit_hours_this_month=unit_hours,
        )
        state = alloc.state
        lag = world.lag and r % 2 == 0
        started = apply(world, alloc, now, lag=lag)
        check_round(world, pools, alloc, started, (budget, spent, unit_hours), now, lag=lag)
        if any(x.reason.startswith("budget:") for x in alloc.reclaims):
            event("budget cut")
        rate = sum(g.held() * price(pools, g) for g in world.groups)
        for g in world.groups:
            g.spent += g.held() * price(pools, g) / 3600
            g.unit_hours += g.held() / 3600
        spent += rate / 3600
        unit_hours += sum(g.held() for g in world.groups) / 3600
        history.append([(wanted[i], len(g.running)) for i, g in enumerate(world.groups)])
    if world.rebudget is None:  # a lowered month budget may be spent already
        check_month(world, pools, budget, spent, unit_hours, T0 + rounds)
    return history


def price(pools: list[PoolState], g: Group) -> float:
    return next(p.price_per_hour for p in pools if p.name == g.pool)


def apply(world: World, alloc: Allocation, now: float, *, lag: bool) -> set[str]:
    """What a controller does with an allocation; returns the groups that started some."""
    by_name = {g.name: g for g in world.groups}
    asked = {i: rec.borrower for rec in alloc.reclaims for i in rec.instance_ids}
    if alloc.reclaims:
        event("reclaims")
    # A lagging controller leaves the reclaimed groups alone this round (the allocator must
    # ask again, and not ask for more).
    skip = set(asked.values()) if lag else set()
    for iid, name in asked.items():
        if name not in skip:
            g = by_name[name]
            drain(g, [x for x in g.running if x.id == iid], now)
    started = set()
    for g in world.groups:
        grant = alloc.grants[g.name]
        if g.name in skip:
            assert grant.instances <= len(g.running)
            continue
        pending = [x for x in g.running if x.id in asked]
        free = [x for x in g.running if x not in pending]
        if grant.instances < len(g.running):
            extra = len(g.running) - grant.instances
            # Drain the instances already reclaimed first, then the newest.
            victims = (pending + sorted(free, key=lambda x: x.started_at, reverse=True))[:extra]
            drain(g, victims, now)
        for _ in range(grant.instances - len(g.running)):
            g.running.append(RunningInstance(f"{g.name}-{g.made}", now))
            g.made += 1
            started.add(g.name)
    return started


def drain(g: Group, victims: list[RunningInstance], now: float) -> None:
    for v in victims:
        if v in g.running:
            g.running.remove(v)
            g.draining.append((now + g.drain_ticks, g.u))


def check_round(
    world: World,
    pools: list[PoolState],
    alloc: Allocation,
    started: set[str],
    meters: tuple[BudgetSpec | None, float, float],
    now: float,
    *,
    lag: bool,
) -> None:
    budget, spent, unit_hours = meters
    for pool in pools:
        members = [g for g in world.groups if g.pool == pool.name]
        granted = sum(alloc.grants[g.name].instances * g.u for g in members)
        assert granted <= pool.count, f"pool {pool.name}: {granted} units granted of {pool.count}"
        if started & {g.name for g in members}:
            held = sum(g.held() for g in members)
            assert held <= pool.count, f"started into a full pool: {held} > {pool.count}"
    assert alloc.units_held == sum(x.units_held for x in alloc.grants.values())
    for g in world.groups:
        grant = alloc.grants[g.name]
        assert grant.own_units + grant.borrowed_units == grant.instances * g.u
        if not lag:  # what the controller holds once it applied the grant
            assert grant.units_held == g.held(), (g.name, grant, g.held())
        if g.quota.limit is not None:
            assert grant.instances * g.u <= g.quota.limit
            if g.name in started:
                assert g.held() <= g.quota.limit
        if g.name in started and g.quota.borrow_limit is not None:
            assert grant.borrowed_units <= g.quota.borrow_limit
        if g.budget is not None:
            for cap, cost in caps(g.budget, g.spent, g.unit_hours, now, g.u, price(pools, g)):
                if cost <= 0:  # a free instance: no spend cap binds it
                    continue
                # a budget binds every start; a cap lowered below what runs cuts the rest
                # down to it, but never below the guarantee
                if g.name in started:
                    assert g.held() * cost / g.u <= cap + EPS, f"{g.name} holds above {cap}"
                allowed = max(math.floor(cap / cost + EPS), g.quota.guaranteed // g.u)
                assert grant.instances <= allowed, f"{g.name}: {grant.instances} > {allowed}"
    if budget is not None:
        mine = [caps(budget, spent, unit_hours, now, g.u, price(pools, g)) for g in world.groups]
        for i, (cap, _) in enumerate(mine[0]):
            cost = {g.name: c[i][1] for g, c in zip(world.groups, mine, strict=True)}
            check_global_cap(world, alloc, started, cap, cost)


def check_global_cap(
    world: World, alloc: Allocation, started: set[str], cap: float, cost: dict[str, float]
) -> None:
    """Starts keep all groups within a global cap (`cost`: what one instance of each group
    costs against it); a cap lowered below what runs is granted down to it, or down to every
    guarantee."""
    if any(cost[name] > 0 for name in started):
        held = sum(g.held() // g.u * cost[g.name] for g in world.groups)
        assert held <= cap + EPS, f"all groups hold {held} above {cap}"
    granted = sum(alloc.grants[g.name].instances * cost[g.name] for g in world.groups)
    at_guarantees = all(
        alloc.grants[g.name].instances <= g.quota.guaranteed // g.u
        for g in world.groups
        if cost[g.name] > 0
    )
    assert granted <= cap + EPS or at_guarantees, f"all groups granted {granted} above {cap}"


def caps(
    budget: BudgetSpec, spent: float, unit_hours: float, now: float, u: int, unit_price: float
) -> list[tuple[float, float]]:
    """Every cap of `budget` now, with what one instance (`u` units at `unit_price`) costs
    against it."""
    hours = hours_left_in_month(now)
    spend, units = u * unit_price, float(u)
    out = [] if budget.per_hour is None else [(budget.per_hour, spend)]
    if budget.per_month is not None:
        out.append(((budget.per_month - spent) / hours, spend))
    if budget.max_accelerators is not None:
        out.append((budget.max_accelerators, units))
    if budget.accelerator_hours_per_month is not None:
        out.append(((budget.accelerator_hours_per_month - unit_hours) / hours, units))
    return out


def check_month(
    world: World,
    pools: list[PoolState],
    budget: BudgetSpec | None,
    spent: float,
    unit_hours: float,
    end: float,
) -> None:
    """Running on at the final rate to the month's end stays within every per-month cap."""
    hours = hours_left_in_month(end)
    rate = sum(g.held() * price(pools, g) for g in world.groups)
    units = sum(g.held() for g in world.groups)
    within(budget, spent + rate * hours, unit_hours + units * hours)
    for g in world.groups:
        rate, units = g.held() * price(pools, g), g.held()
        within(g.budget, g.spent + rate * hours, g.unit_hours + units * hours)


def within(budget: BudgetSpec | None, spend: float, unit_hours: float) -> None:
    if budget is not None and budget.per_month is not None:
        assert spend <= budget.per_month + EPS
    if budget is not None and budget.accelerator_hours_per_month is not None:
        assert unit_hours <= budget.accelerator_hours_per_month + EPS


def check_guarantees(world: World, history: list[list[tuple[int, int]]]) -> None:
    """A group asking for at least its guarantee has it within grace + drain (+ ticks)."""
    slowest = max(g.drain_ticks for g in world.groups)
    for i, g in enumerate(world.groups):
        target = g.quota.guaranteed // g.u
        if target == 0 or not keeps_guarantee(world, g):
            continue
        bound = math.ceil(g.quota.reclaim_grace_s) + slowest + 2 + (2 if world.lag else 0)
        start = 0
        if world.shrink is not None and g.pool == "gpu":
            start = world.shrink[0]
        for r in range(start + bound, len(history)):
            window = [history[k][i][0] for k in range(r - bound, r + 1)]
            if min(window) >= target:
                event("guarantee checked")
                assert history[r][i][1] >= target, (
                    f"{g.name} wants >= {target} instances since round {r - bound} but runs "
                    f"{history[r][i][1]} at round {r}"
                )


def keeps_guarantee(world: World, g: Group) -> bool:
    """Without a shrink every group keeps its guarantee; after one, the reserved groups do
    when their guarantees fit the new count."""
    if world.shrink is None or g.pool != "gpu":
        return True
    reserved = sum(x.quota.guaranteed for x in world.groups if x.pool == "gpu" and x.quota.reserved)
    return g.quota.reserved and reserved <= world.shrink[1]


FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(worlds(budgets=False, shrink=False))
def test_units_limits_and_guarantees_without_budgets(world: World) -> None:
    history = simulate(world)
    check_guarantees(world, history)


@FAST
@given(worlds(budgets=False, shrink=True))
def test_reserved_groups_keep_their_guarantee_when_the_pool_shrinks(world: World) -> None:
    history = simulate(world)
    check_guarantees(world, history)


@FAST
@given(worlds(budgets=True, shrink=False))
def test_budgets_are_never_exceeded(world: World) -> None:
    simulate(world)


@FAST
@given(worlds(budgets=True, shrink=False, rebudget=True))
def test_budgets_lowered_below_what_runs_shrink_the_fleet_to_them(world: World) -> None:
    simulate(world)  # (a budget may refuse a guarantee's start: none is checked here)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 8),
    st.lists(st.tuples(st.sampled_from(["inference", "training"]), st.integers(0, 5)), max_size=4),
)
def test_never_across_purpose(count: int, asks: list[tuple[str, int]]) -> None:
    pools = [PoolState("gpu", "inference", count), PoolState("train", "training", count)]
    claims = [
        GroupClaim(f"g{i}", "gpu" if i % 2 else "train", 1, wanted=n, purpose=purpose)  # type: ignore[arg-type]
        for i, (purpose, n) in enumerate(asks)
    ]
    alloc = allocate(pools, claims, QuotaState(), T0)
    for c in claims:
        pool = next(p for p in pools if p.name == c.pool)
        if pool.purpose != c.purpose:
            assert alloc.grants[c.name].instances == 0
            assert "(Q5)" in alloc.refusals.get(c.name, "(Q5)")
