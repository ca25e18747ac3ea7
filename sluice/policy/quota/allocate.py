"""Quota allocation (Q1-Q6): how many instances each group may run now, in accelerator units.

One call per controller tick: `allocate(pools, claims, state, now)` -> `Allocation`. Pure: the
caller passes the time, the month-to-date spend and accelerator-hours, and the state the last
call returned.

Units are accelerators of a pool; an instance of a group holds `units_per_instance` of them,
from its start until its drain completes. Pools never share units, so a group only ever uses
(and borrows within) its own pool, and only a pool of its purpose (Q5). Each round:

| step | rule                                                                                   |
|------|----------------------------------------------------------------------------------------|
| 1    | guarantees that fit: if the pool shrank below the sum of guarantees, reserved groups     |
|      | keep theirs first, then by priority (higher first), then name; the rest are cut (Q2)   |
| 2    | over capacity (running units > count): drain the newest instances above guarantee,     |
|      | non-reserved and lowest priority first, at once (the units are gone)                   |
| 3    | over budget (a cap lowered below what runs, Q6): each group above one of its own caps  |
|      | drains its newest instances above its guarantee until within; then, for the global     |
|      | caps, every pool's groups in step 2's order. Never below a guarantee                   |
| 4    | own starts: within the (effective) guarantee, reserved then priority order (Q1)        |
| 5    | reclaim: a group still short of its guarantee once every drain completes waits         |
|      | `reclaim_grace_s`, then the newest borrowed instances are drained (lowest priority     |
|      | borrower first, then the one above its guarantee most); it starts on those units only  |
|      | once they are released, so nothing is started and then left waiting (Q4)              |
| 6    | borrowing: unassigned units (count - guarantees) and idle lendable guarantees          |
|      | (min(lendable, guaranteed - used)), one instance at a time to the highest priority,    |
|      | then least borrowed group, up to `borrow_limit` and `limit`                             |
| any  | every start also keeps `limit` and the budgets (group and global, Q6)                  |

Budgets cap spend (price units: an instance costs its units x the pool's price) and units
(an instance costs its units), each per hour (`per_hour`, `max_accelerators`) and per month
(`per_month`, `accelerator_hours_per_month`: what is left, spread over the hours left).

Draining units count as held (against the pool, the limit and the budgets) until released.
Step 3 leaves them out: they still count while they drain, so counting them would cut again
every round until they are released.
A lender gets its units within its `reclaim_grace_s` + the borrower's `drain_timeout_s`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Final

from sluice.policy.quota.budget import BudgetCap, budget_caps
from sluice.policy.quota.loans import Holding, attribute_loans
from sluice.policy.quota.model import (
    Allocation,
    Grant,
    GroupClaim,
    Loan,
    PendingReclaim,
    PoolState,
    QuotaState,
    Reclaim,
    Running,
    hours_left_in_month,
)
from sluice.spec.quota import BudgetSpec

__all__ = ["allocate"]

_EPS: Final = 1e-9


class _Group:
    """Working copy of one claim during a round (mutable, private)."""

    __slots__ = (
        "block",
        "c",
        "cap_borrow",
        "cap_limit",
        "caps",
        "d",
        "ends",
        "eq",
        "kept",
        "lend",
        "max_inst",
        "order",
        "pool",
        "price",
        "q",
        "running",
        "shortfall",
        "start",
        "u",
        "unit_price",
        "usable",
        "victim",
    )

    def __init__(
        self, c: GroupClaim, pool: PoolState | None, pending: Mapping[str, PendingReclaim]
    ) -> None:
        self.c = c
        self.q = c.quota
        self.u = c.units_per_instance
        self.pool = pool
        self.usable = pool is not None and pool.purpose == c.purpose
        self.running: Sequence[Running]
        if pending:
            self.running = [r for r in c.running if r.id not in pending]
        else:  # shared, not copied: a round only ever replaces it (`_take`)
            self.running = c.running
        self.kept = len(self.running)
        self.start = 0
        self.d = c.draining_units + (len(c.running) - self.kept) * self.u
        self.eq = 0
        self.max_inst = 0
        self.lend = c.quota.guaranteed if c.quota.lendable is None else c.quota.lendable
        self.unit_price = pool.price_per_hour if pool else 0.0
        self.price = self.unit_price * self.u
        self.caps: list[BudgetCap] = []
        self.block: str | None = None
        self.shortfall = 0
        self.cap_limit = 0
        self.cap_borrow = False
        self.ends = 0.0
        self.victim = False
        # who keeps a guarantee and starts first (`_order`), once a round, not per sort
        self.order = (not self.q.reserved, -self.q.priority, c.name)

    @property
    def held(self) -> int:
        return (self.kept + self.start) * self.u + self.d

    @property
    def rate(self) -> float:
        return self.held * self.unit_price

    @property
    def cap_why(self) -> str:
        """Why no more starts: the cap `_effective_guarantees` set (worded when read)."""
        if self.cap_borrow:
            return (
                f"borrow_limit {self.q.borrow_limit} reached (guarantee {self.eq} + "
                f"{self.q.borrow_limit} borrowed, {self.u} per instance)"
            )
        return f"limit {self.cap_limit} units reached ({self.u} per instance)"


def allocate(
    pools: Sequence[PoolState],
    claims: Sequence[GroupClaim],
    state: QuotaState,
    now: float,
    *,
    budget: BudgetSpec | None = None,
    spent_this_month: float = 0.0,
    other_spend_per_hour: float = 0.0,
    unit_hours_this_month: float = 0.0,
    other_units_held: int = 0,
) -> Allocation:
    """Decide every group's grant for this round. `now`: epoch seconds (also the calendar
    month for the per-month caps). `budget`: the global budget; `spent_this_month`,
    `unit_hours_this_month`: its month-to-date spend and accelerator-hours.
    `other_spend_per_hour`, `other_units_held`: the rate and units held outside `claims`
    (advisory-quota groups, `sluice.policy.quota.advisory`), which the global budget counts too.

    pre: group names are unique; units_per_instance >= 1; wanted >= 0.
    """
    hours_left = hours_left_in_month(now)
    by_pool = {p.name: p for p in pools}
    groups: list[_Group] = []
    for c in claims:
        pool = by_pool.get(c.pool)
        g = _Group(c, pool, state.reclaiming)
        if pool is None:
            g.block = f"no pool named {c.pool!r}"
        elif pool.purpose != c.purpose:
            g.block = (
                f"pool {pool.name!r} is a {pool.purpose} pool; {c.purpose} groups never use it (Q5)"
            )
        if c.budget is not None:  # none: no caps (a `_Group` starts with none)
            scope = f"group {c.name!r}"
            g.caps = budget_caps(
                c.budget, c.spent_this_month, c.unit_hours_this_month, hours_left, scope
            )
        groups.append(g)
    live = [g for g in groups if g.usable]
    caps = budget_caps(budget, spent_this_month, unit_hours_this_month, hours_left, "global")
    glob = _Global(caps, other_spend_per_hour, other_units_held)
    # `g.rate` and `g.held` of every group, without two property calls each
    glob.rate += sum(((g.kept + g.start) * g.u + g.d) * g.unit_price for g in groups)
    glob.units += sum((g.kept + g.start) * g.u + g.d for g in groups)
    members: dict[str, list[_Group]] = {p.name: [] for p in pools}
    for g in live:
        members[g.c.pool].append(g)
        # Own starts go first to the claim that has waited longest past its grace period.
        since = state.claims_since.get(g.c.name, now)
        g.ends = since + g.q.reclaim_grace_s

    reclaims: list[Reclaim] = []
    new_pending: dict[str, PendingReclaim] = {}
    # Re-issue drains asked for earlier whose instances are still listed as running.
    for c in claims if state.reclaiming else ():
        for r in c.running:
            p = state.reclaiming.get(r.id)
            if p is not None:
                new_pending[r.id] = p
                reclaims.append(
                    Reclaim(c.name, p.lender, c.pool, (r.id,), p.units, p.reason, p.deadline)
                )
    claims_since: dict[str, float] = {}
    wake: list[float] = []
    for pool in pools:
        gs = members[pool.name]
        if gs:
            _effective_guarantees(pool, gs)
            reclaims += _cut_over_capacity(pool, gs, now, new_pending)
    reclaims += _cut_over_budget(live, glob, now, new_pending)
    for pool in pools:
        gs = members[pool.name]
        if not gs:
            continue
        _own_starts(pool, gs, glob)
        reclaims += _reclaim(pool, gs, state, now, claims_since, wake, new_pending)
        _borrow(pool, gs, glob)
    loans: list[Loan] = []
    previous: dict[str, list[Loan]] = {p.name: [] for p in pools}
    for x in state.loans:
        previous.setdefault(x.pool, []).append(x)
    for pool in pools:
        gs = members[pool.name]
        holdings = [Holding(g.c.name, g.eq, (g.kept + g.start) * g.u + g.d) for g in gs]
        loans += attribute_loans(pool.name, pool.count, holdings, previous[pool.name])

    grants: dict[str, Grant] = {}
    refusals: dict[str, str] = {}
    notes: dict[tuple[int, int, int, int], str] = {}  # most groups' counts repeat others'
    for g in groups:
        name, wanted, u = g.c.name, g.c.wanted, g.u
        n = (wanted if wanted < g.kept + g.start else g.kept + g.start) if g.usable else 0
        if wanted > n and g.block is None:
            g.block = "no free units"
        units = n * u
        own = units if units < g.eq else g.eq  # min(units, g.eq)
        counted = (n, wanted, own, units - own)
        note = notes.get(counted)
        if note is None:
            note = notes[counted] = (
                f"{n} of {wanted} wanted instance(s): {own} own + {units - own} borrowed units"
            )
        if wanted > n and g.block:
            refusals[name] = g.block
            note += f"; {g.block}"
        held = (g.kept + g.start) * u + g.d  # `g.held`, and `g.rate` below
        grants[name] = Grant(name, n, own, units - own, note, held * g.unit_price, held)
    next_state = QuotaState(claims_since, new_pending, tuple(loans))
    return Allocation(
        grants=grants,
        loans=tuple(loans),
        reclaims=tuple(reclaims),
        refusals=refusals,
        state=next_state,
        spend_per_hour=glob.rate,
        wake_at=min(wake) if wake else None,
        units_held=glob.units,
    )


class _Global:
    """The global caps and what all groups hold (draining too), advisory groups' included."""

    __slots__ = ("caps", "other_rate", "other_units", "rate", "units")

    def __init__(self, caps: list[BudgetCap], other_rate: float, other_units: int) -> None:
        self.caps = caps
        self.other_rate = other_rate
        self.other_units = other_units
        self.rate = other_rate
        self.units = other_units

    def level(self, cap: BudgetCap) -> float:
        return float(self.units) if cap.units else self.rate


def _order(g: _Group) -> tuple[bool, int, str]:
    """Who keeps a guarantee and starts first: reserved, then higher priority, then name."""
    return g.order


_ORDER: Final = attrgetter("order")
"""`_order`, without a Python call per group (a sort key for 1,000 groups a round)"""


def _effective_guarantees(pool: PoolState, gs: list[_Group]) -> None:
    """Step 1: guarantees that fit the pool as it is now (Q2), and each group's caps."""
    left = pool.count
    for g in sorted(gs, key=_ORDER):
        g.eq = min(g.q.guaranteed, left)
        left -= g.eq
        limit = pool.count if g.q.limit is None else g.q.limit
        cap = g.cap_limit = limit  # `g.cap_why` words it, when a refusal reads it
        g.cap_borrow = False
        if g.q.borrow_limit is not None and g.eq + g.q.borrow_limit < cap:
            cap = g.eq + g.q.borrow_limit
            g.cap_borrow = True
        # Starts keep held units (draining included) <= cap; running ones above cap // u (the
        # spec lowered the cap) count as draining: the controller scales down to the grant.
        g.max_inst = max(0, (cap - g.d) // g.u)
        over = g.kept - cap // g.u
        if over > 0:
            g.kept -= over
            g.d += over * g.u
            g.block = g.cap_why
        if g.eq < g.q.guaranteed:
            g.block = (
                f"pool {pool.name!r} has {pool.count} units now: guarantee cut from "
                f"{g.q.guaranteed} to {g.eq} (reserved groups keep theirs first)"
            )


def _victim_order(g: _Group) -> tuple[bool, int, int, str]:
    """Drained first: non-reserved, lowest priority, most units above guarantee, name."""
    return (g.q.reserved, g.q.priority, -(g.kept * g.u - g.eq), g.c.name)


def _take(
    g: _Group,
    need: int,
    lender: str | None,
    now: float,
    reason: str,
    pending: dict[str, PendingReclaim],
    only: frozenset[str] | None = None,
) -> tuple[Reclaim | None, int]:
    """Drain g's newest instances above its guarantee until `need` units are freed; with
    `only`, just those of them (`GroupClaim.reclaim_first`)."""
    excess = g.kept * g.u - g.eq
    if excess <= 0 or need <= 0:
        return None, 0
    n = min(math.ceil(min(excess, need) / g.u), g.kept)
    # Keep the running list ordered so that the kept ones are the oldest (`only`: the
    # others), and the drained ones last.
    if only is None:
        ordered = sorted(g.running[: g.kept], key=lambda r: (r.started_at, r.id))
    else:
        ordered = sorted(g.running[: g.kept], key=lambda r: (r.id in only, r.started_at, r.id))
        n = min(n, sum(r.id in only for r in ordered))
        if n == 0:
            return None, 0
    victims = ordered[len(ordered) - n :][::-1]
    g.running = ordered[: len(ordered) - n]
    g.kept -= n
    g.d += n * g.u
    deadline = now + g.c.drain_timeout_s
    for r in victims:
        pending[r.id] = PendingReclaim(g.c.name, lender, g.u, deadline, reason)
    g.victim = True
    g.block = f"{reason}: {n} instance(s) drain"
    ids = tuple(r.id for r in victims)
    return Reclaim(g.c.name, lender, g.c.pool, ids, n * g.u, reason, deadline), n * g.u


def _cut_over_capacity(
    pool: PoolState, gs: list[_Group], now: float, pending: dict[str, PendingReclaim]
) -> list[Reclaim]:
    """Step 2: the pool has fewer units than running instances hold: drain the excess now."""
    deficit = sum(g.kept * g.u for g in gs) - pool.count
    out: list[Reclaim] = []
    if deficit <= 0:  # most rounds: no order needed
        return out
    for g in sorted(gs, key=_victim_order):
        if deficit <= 0:
            break
        why = (
            f"pool {pool.name!r} shrank to {pool.count} units; {g.c.name!r} is above its "
            f"guarantee {g.eq}, so its newest instances drain"
        )
        rec, freed = _take(g, deficit, None, now, why, pending)
        if rec is not None:
            out.append(rec)
            deficit -= freed
    return out


def _cut_over_budget(
    live: list[_Group], glob: _Global, now: float, pending: dict[str, PendingReclaim]
) -> list[Reclaim]:
    """Step 3: a budget cap lowered below what runs shrinks the fleet (Q6), never below a
    guarantee: each group to its own caps, then all groups to the global caps. Units already
    draining are left out: they count until released, so counting them would cut again
    every round while they drain."""
    out: list[Reclaim] = []
    for g in live:
        for cap in g.caps:
            cost = cap.cost(g.u, g.price)  # a free instance (price 0) is never over a spend cap
            if cost <= 0 or g.kept * cost <= cap.limit + _EPS:
                continue
            keep = max(0, math.floor(cap.limit / cost + _EPS))
            why = (
                f"budget: {cap.exceeded(g.kept * cost)}: its newest instances above its "
                f"guarantee {g.eq} drain"
            )
            rec, _ = _take(g, (g.kept - keep) * g.u, None, now, why, pending)
            if rec is not None:
                out.append(rec)
    for cap in glob.caps:
        others = glob.other_units if cap.units else glob.other_rate
        level = others + sum(g.kept * cap.cost(g.u, g.price) for g in live)
        if level <= cap.limit + _EPS:
            continue
        text = cap.exceeded(level)
        for g in sorted(live, key=_victim_order):
            cost = cap.cost(g.u, g.price)
            if level <= cap.limit + _EPS:
                break
            if cost <= 0:
                continue
            n = math.ceil((level - cap.limit) / cost - _EPS)
            why = (
                f"budget: {text}: {g.c.name!r} is above its guarantee {g.eq}, so its newest "
                "instances drain (lowest priority first)"
            )
            rec, freed = _take(g, n * g.u, None, now, why, pending)
            if rec is not None:
                out.append(rec)
                level -= freed // g.u * cost
    return out


def _budget_room(g: _Group, n: int, glob: _Global) -> int:
    """How many of `n` more instances the group and global caps allow (draining counted)."""
    if n <= 0 or not (g.caps or glob.caps):  # no budget: no cap to keep
        return n
    spend, units = g.rate, float(g.held)
    mine = [(c, units if c.units else spend) for c in g.caps]
    for cap, base in mine + [(c, glob.level(c)) for c in glob.caps]:
        cost = cap.cost(g.u, g.price)
        if cost <= 0:
            continue
        room = math.floor((cap.limit - base) / cost + _EPS)
        if room < n:
            n = max(0, room)
            g.block = cap.refusal(g.u, g.price, base)
    return n


def _grow(g: _Group, n: int, glob: _Global) -> None:
    g.start += n
    glob.rate += n * g.price
    glob.units += n * g.u


def _own_starts(pool: PoolState, gs: list[_Group], glob: _Global) -> None:
    """Step 4: starts within each group's effective guarantee, if units are free now."""
    free = pool.count - sum((g.kept + g.start) * g.u + g.d for g in gs)  # `g.held`s
    # a group's want is its own (its claim, its caps): only those that want a start are
    # ordered (most rounds none), in the order of the whole pool's (its keys are unique)
    wanting = []
    for g in gs:
        target = min(g.c.wanted, g.max_inst, g.eq // g.u)
        if target - g.kept > 0:
            wanting.append((g, target))
    wanting.sort(key=lambda gt: (gt[0].ends, *gt[0].order))
    for g, target in wanting:
        want = target - g.kept
        n = _budget_room(g, min(want, max(0, free) // g.u), glob)
        _grow(g, n, glob)
        free -= n * g.u
        if g.kept + g.start < target and _budget_room(g, 1, glob) == 1:
            g.shortfall = (target - g.kept - g.start) * g.u


def _reclaim(
    pool: PoolState,
    gs: list[_Group],
    state: QuotaState,
    now: float,
    claims_since: dict[str, float],
    wake: list[float],
    pending: dict[str, PendingReclaim],
) -> list[Reclaim]:
    """Step 5: drain borrowers for groups short of their guarantee, after the grace period."""
    short = [g for g in gs if g.shortfall > 0]
    if not short:
        return []
    after_drains = pool.count - sum((g.kept + g.start) * g.u for g in gs)
    need = sum(g.shortfall for g in short) - after_drains
    out: list[Reclaim] = []
    victims = sorted((g for g in gs if g.shortfall == 0 and g.kept * g.u > g.eq), key=_victim_order)
    vi = 0
    for g in sorted(short, key=_order):
        since = state.claims_since.get(g.c.name, now)
        claims_since[g.c.name] = since
        ends = since + g.q.reclaim_grace_s
        mine = min(g.shortfall, need)
        if mine <= 0:
            g.block = (
                f"pool {pool.name!r} full: waiting for {g.shortfall} units of its guarantee "
                "that draining instances are releasing"
            )
            continue
        if now + _EPS < ends:
            wake.append(ends)
            g.block = (
                f"pool {pool.name!r} full: {mine} units of its guarantee are borrowed; "
                f"reclaim starts in {ends - now:.1f} s (reclaim_grace_s {g.q.reclaim_grace_s:g})"
            )
            continue
        why = f"{g.c.name!r} wants {mine} units of its guarantee back (reclaim)"
        names = []
        for v in victims if g.c.reclaim_first else ():  # those on its sleepers' devices
            rec, freed = _take(v, mine, g.c.name, now, why, pending, g.c.reclaim_first)
            if rec is not None:
                out.append(rec)
                names.append(v.c.name)
                mine -= freed
                need -= freed
        while mine > 0 and vi < len(victims):
            v = victims[vi]
            rec, freed = _take(v, mine, g.c.name, now, why, pending)
            if rec is not None:
                out.append(rec)
                names.append(v.c.name)
                mine -= freed
                need -= freed
            if rec is None or v.kept * v.u <= v.eq:
                vi += 1  # this borrower has nothing above its guarantee left
        g.block = (
            f"pool {pool.name!r} full: waiting for units reclaimed from {', '.join(names)}"
            if names
            else f"pool {pool.name!r} full: waiting for draining instances"
        )
    return out


def _borrow(pool: PoolState, gs: list[_Group], glob: _Global) -> None:
    """Step 6: lend unassigned units and idle lendable guarantees, one instance at a time."""
    free = pool.count - sum((g.kept + g.start) * g.u + g.d for g in gs)  # `g.held`s
    protected: dict[str, int] = {}
    for g in gs:  # `_protected(g)` of each, inline
        unused = g.eq - ((g.kept + g.start) * g.u + g.d)
        if unused < 0:
            unused = 0
        lend = g.lend
        protected[g.c.name] = unused if g.shortfall else (unused - lend if unused > lend else 0)
    spare = free - sum(protected.values())
    heap = [
        (-g.q.priority, max(0, g.held - g.eq), g.c.name, i)
        for i, g in enumerate(gs)
        if g.kept + g.start < g.c.wanted and g.shortfall == 0 and not g.victim
    ]
    heapq.heapify(heap)
    idle: str | None = None  # computed once, on the first refusal
    full: tuple[int, str] | None = None  # the last refusal's (free, words): most repeat
    while heap:
        _, _, name, i = heapq.heappop(heap)
        g = gs[i]
        if g.kept + g.start >= g.max_inst:
            g.block = g.cap_why
            continue
        if _budget_room(g, 1, glob) < 1:
            continue
        after = _protected_after(g, g.u)
        if free < g.u or spare - g.u + protected[name] - after < 0:
            if idle is None:
                idle = _not_lendable(gs)
            if full is None or full[0] != free:
                full = (free, _full(pool, free, idle))
            g.block = full[1]
            continue
        _grow(g, 1, glob)
        free -= g.u
        spare += protected[name] - after - g.u
        protected[name] = after
        if g.kept + g.start < g.c.wanted:
            heapq.heappush(heap, (-g.q.priority, max(0, g.held - g.eq), name, i))


def _protected(g: _Group) -> int:
    """Idle guarantee units nobody else may borrow: beyond `lendable`, or wanted by g."""
    idle = max(0, g.eq - g.held)
    return idle if g.shortfall else max(0, idle - g.lend)


def _protected_after(g: _Group, extra: int) -> int:
    idle = max(0, g.eq - g.held - extra)
    return max(0, idle - g.lend)


def _full(pool: PoolState, free: int, idle: str) -> str:
    text = f"pool {pool.name!r} full: {pool.count - free} of {pool.count} units held"
    return f"{text}; idle guaranteed units of {idle} are not lendable" if idle else text


def _not_lendable(gs: list[_Group]) -> str:
    """Groups whose idle guarantee nobody may borrow (beyond `lendable`, or being claimed)."""
    idle = sorted(g.c.name for g in gs if _protected(g) > 0)
    return ", ".join(idle[:5]) + (", ..." if len(idle) > 5 else "")
