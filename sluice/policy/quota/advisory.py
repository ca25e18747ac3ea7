"""Advisory quota (`quota.mode: advisory`): the allocator decides for such a group as usual,
but its grant does not follow that decision; the decision is kept as advice.

One round makes two passes (with no advisory group, both are one ordinary `allocate`):

- the advice: `allocate` over every claim with every quota in force, on its own memory:
  what the allocator would grant, refuse, reclaim and lend if every group were active;
- the enforced round: the active groups alone, on what the advisory groups leave of each
  pool (the units they hold come off its count; their spend rate and units count against
  the global budget), then each advisory group, highest priority first, gets its `wanted`
  count as far as the pool's free units allow. Quota neither limits an advisory group nor
  protects it: it is never reclaimed from, never reclaims, ignores its limit, borrow limit
  and budgets, and its idle guarantee is lent like unassigned units. Physical capacity
  always holds: an advisory group starts only on free units, and a pool made smaller than
  what it holds drains it (lowest priority first) like anyone else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Set
from dataclasses import dataclass, replace

from sluice.core.frozen import fast_init
from sluice.policy.quota.allocate import allocate
from sluice.policy.quota.model import Allocation, Grant, GroupClaim, PoolState, QuotaState
from sluice.spec.quota import BudgetSpec

__all__ = ["AdvisedAllocation", "allocate_advised"]


@fast_init
@dataclass(frozen=True, slots=True)
class AdvisedAllocation:
    """`enforced`: what the controller applies (its `state` is the allocator's memory).
    `advice`: the allocator's decision with every quota in force (its `state` is the
    advice's own memory). `advisory`: the groups whose grant is not held to the advice."""

    enforced: Allocation
    advice: Allocation
    advisory: frozenset[str]


def allocate_advised(
    pools: Sequence[PoolState],
    claims: Sequence[GroupClaim],
    state: QuotaState,
    advice_state: QuotaState,
    now: float,
    *,
    advisory: Set[str],
    budget: BudgetSpec | None = None,
    spent_this_month: float = 0.0,
    unit_hours_this_month: float = 0.0,
) -> AdvisedAllocation:
    """One round for `claims`, where the groups named in `advisory` are only advised.
    `state`: the enforced round's memory; `advice_state`: the advice's (the same object
    while no group is advisory). The global `budget` and its meters as for `allocate`."""
    mine = (  # no advisory group (the usual case): no walk over the claims
        sorted((c for c in claims if c.name in advisory), key=lambda c: (-c.quota.priority, c.name))
        if advisory
        else []
    )
    if not mine:
        alloc = allocate(
            pools,
            claims,
            state,
            now,
            budget=budget,
            spent_this_month=spent_this_month,
            unit_hours_this_month=unit_hours_this_month,
        )
        return AdvisedAllocation(alloc, alloc, frozenset())
    advice = allocate(
        pools,
        claims,
        advice_state,
        now,
        budget=budget,
        spent_this_month=spent_this_month,
        unit_hours_this_month=unit_hours_this_month,
    )
    others = [c for c in claims if c.name not in advisory]
    by_pool = {p.name: p for p in pools}
    held = {p.name: 0 for p in pools}
    for c in mine:
        if c.pool in held:
            held[c.pool] += _held(c, len(c.running))
    rest = [replace(p, count=max(0, p.count - held[p.name])) for p in pools]
    rate = sum(held[p.name] * p.price_per_hour for p in pools)
    active = allocate(
        rest,
        others,
        state,
        now,
        budget=budget,
        other_spend_per_hour=rate,
        other_units_held=sum(held.values()),
        spent_this_month=spent_this_month,
        unit_hours_this_month=unit_hours_this_month,
    )
    free = {p.name: p.count - held[p.name] for p in pools}
    settled = {p.name: 0 for p in pools}  # active units once their drains complete
    for c in others:
        if c.pool in free:
            n = active.grants[c.name].instances
            free[c.pool] -= _held(c, max(len(c.running), n))
            settled[c.pool] += n * c.units_per_instance
    counts: dict[str, int] = {}
    refusals = {
        name: _note_advisory_holders(why, by_pool.get(_pool_of(claims, name)), held, mine)
        for name, why in active.refusals.items()
    }
    for c in mine:
        pool = by_pool.get(c.pool)
        running = len(c.running)
        if pool is None or pool.purpose != c.purpose:  # physics, not policy: never advisory
            counts[c.name] = 0
            refusals[c.name] = advice.refusals.get(c.name, f"no usable pool {c.pool!r}")
            continue
        n = min(c.wanted, running)
        if c.wanted > running:
            n += min(c.wanted - running, max(0, free[c.pool]) // c.units_per_instance)
            free[c.pool] -= (n - running) * c.units_per_instance
            if n < c.wanted:
                refusals[c.name] = (
                    f"pool {pool.name!r} full: {pool.count - max(0, free[pool.name])} of "
                    f"{pool.count} units held (advisory quota: only free units bound it)"
                )
        counts[c.name] = n
    for pool in pools:  # a pool smaller than what is held: advisory groups drain too
        over = sum(counts[c.name] * c.units_per_instance for c in mine if c.pool == pool.name)
        over -= pool.count - settled[pool.name]
        for c in reversed(mine):
            if over <= 0:
                break
            if c.pool != pool.name or counts[c.name] == 0:
                continue
            cut = min(counts[c.name], math.ceil(over / c.units_per_instance))
            counts[c.name] -= cut
            over -= cut * c.units_per_instance
            refusals[c.name] = (
                f"pool {pool.name!r} has {pool.count} units: {cut} instance(s) drain "
                "(physical capacity binds advisory groups too)"
            )
    grants = dict(active.grants)
    growth = 0.0
    grown = 0  # units the advisory groups start
    for c in mine:
        pool = by_pool.get(c.pool)
        price = pool.price_per_hour if pool else 0.0
        n = counts[c.name]
        units = n * c.units_per_instance
        own = min(units, c.quota.guaranteed)
        told = advice.grants[c.name]
        extra = max(0, n - len(c.running))
        growth += extra * c.units_per_instance * price
        grown += extra * c.units_per_instance
        held_after = _held(c, max(len(c.running), n))
        grants[c.name] = Grant(
            c.name,
            n,
            own,
            units - own,
            f"advisory quota: {n} of {c.wanted} wanted instance(s), bounded only by free "
            f"units; enforced: {told.reason}",
            held_after * price,
            held_after,
        )
    enforced = Allocation(
        grants=grants,
        loans=active.loans,
        reclaims=active.reclaims,
        refusals=refusals,
        state=active.state,
        spend_per_hour=active.spend_per_hour + growth,
        wake_at=active.wake_at,
        units_held=active.units_held + grown,
    )
    return AdvisedAllocation(enforced, advice, frozenset(c.name for c in mine))


def _held(c: GroupClaim, instances: int) -> int:
    return instances * c.units_per_instance + c.draining_units


def _pool_of(claims: Sequence[GroupClaim], name: str) -> str:
    return next((c.pool for c in claims if c.name == name), "")


def _note_advisory_holders(
    why: str, pool: PoolState | None, held: dict[str, int], mine: Sequence[GroupClaim]
) -> str:
    """An active group's refusal in a pool where advisory groups hold units says so: those
    units are not reclaimed, whatever their quota."""
    if pool is None or not held.get(pool.name):
        return why
    names = ", ".join(c.name for c in mine if c.pool == pool.name)
    return (
        f"{why}; {held[pool.name]} of its {pool.count} units are held by advisory-quota "
        f"group(s) {names}, which quota does not reclaim from"
    )
