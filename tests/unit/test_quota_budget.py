"""Budgets in accelerators and accelerator-hours, and caps lowered below what runs (Q6):
one readable test per rule and per reason, in the style of test_quota."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sluice.policy.quota import Allocation, GroupClaim, PoolState, QuotaState, allocate
from sluice.spec.quota import BudgetSpec
from tests.unit.test_quota import GPU, T0, claim, counts, run

BIG = PoolState("gpu", "inference", 20, price_per_hour=2.0)
FREE = PoolState("free", "inference", 10, price_per_hour=0.0)
T240 = T0 - 9 * 86400  # 2026-11-21T00:00Z: 240 hours left in the month


def hours_run(
    claims: Sequence[GroupClaim],
    *,
    now: float = T240,
    budget: BudgetSpec | None = None,
    unit_hours: float = 0.0,
) -> Allocation:
    return allocate(
        [BIG], claims, QuotaState(), now, budget=budget, unit_hours_this_month=unit_hours
    )


def ids(alloc: Allocation) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for r in alloc.reclaims:
        out[r.borrower] = out.get(r.borrower, ()) + r.instance_ids
    return out


def test_max_accelerators_refuses_a_start() -> None:
    cap = BudgetSpec(max_accelerators=9)
    a = run([claim("search", 6, up=4, u=2, budget=cap)], pools=[BIG])
    assert counts(a) == {"search": 4} and a.reclaims == ()
    assert a.refusals["search"] == (
        "budget: one more instance (2 units) would take the group 'search' from 8 to 10 "
        "accelerators, above group 'search' max_accelerators 9"
    )
    # Units bind on a pool without a price too, and globally across groups.
    free = run([claim("a", 8, pool="free", budget=cap)], pools=[FREE])
    assert counts(free) == {"a": 8}
    g = run([claim("a", 3), claim("b", 5)], budget=BudgetSpec(max_accelerators=6))
    assert sum(counts(g).values()) == 6
    assert (
        "would take all groups from 6 to 7 accelerators, above global max_accelerators 6"
        in (g.refusals["b"])
    )


def test_accelerator_hours_per_month_spreads_what_is_left_over_the_hours_left() -> None:
    # 5000 - 3800 used = 1200 accelerator-hours left over 240 h -> 5 units now.
    cap = BudgetSpec(accelerator_hours_per_month=5000)
    a = hours_run([replace(claim("a", 8, budget=cap), unit_hours_this_month=3800.0)])
    assert counts(a) == {"a": 5}
    assert a.refusals["a"] == (
        "budget: one more instance (1 unit) would take the group 'a' from 5 to 6 accelerators, "
        "above group 'a' accelerator_hours_per_month 5000 (1200 left over 240.0 h = 5 units)"
    )
    g = hours_run([claim("a", 4, u=2), claim("b", 8)], budget=cap, unit_hours=3800.0)
    assert counts(g) == {"a": 1, "b": 3}  # 5 units: one instance at a time, least borrowed
    assert g.refusals["b"].endswith(
        "above global accelerator_hours_per_month 5000 (1200 left over 240.0 h = 5 units)"
    )


def test_a_group_cap_lowered_below_what_it_holds_drains_its_newest_above_guarantee() -> None:
    search = claim("search", 10, up=10, guaranteed=4, budget=BudgetSpec(max_accelerators=6))
    a = run([search], pools=[BIG])
    [rec] = a.reclaims
    assert (rec.borrower, rec.lender, rec.units) == ("search", None, 4)
    assert rec.instance_ids == ("search9", "search8", "search7", "search6")
    why = (
        "budget: group 'search' max_accelerators lowered to 6 (holds 10): its newest "
        "instances above its guarantee 4 drain"
    )
    assert rec.reason == why and rec.drain_deadline == T0 + 30
    assert counts(a) == {"search": 6}
    assert a.refusals["search"] == f"{why}: 4 instance(s) drain"
    assert {i: p.reason for i, p in a.state.reclaiming.items()} == dict.fromkeys(
        rec.instance_ids, why
    )
    # Never below the guarantee: a cap of 2 leaves the 4 guaranteed instances running.
    low = run([replace(search, budget=BudgetSpec(max_accelerators=2))], pools=[BIG])
    assert counts(low) == {"search": 4} and len(low.reclaims[0].instance_ids) == 6
    # A spend cap the same way: 8 x 2/h = 16/h down to 10/h keeps 5.
    spend = run([claim("a", 8, up=8, budget=BudgetSpec(per_hour=10.0))])
    assert ids(spend) == {"a": ("a7", "a6", "a5")} and counts(spend) == {"a": 5}
    assert spend.reclaims[0].reason == (
        "budget: group 'a' per_hour lowered to 10/h (spends 16/h): its newest instances "
        "above its guarantee 0 drain"
    )


def test_a_month_cap_spent_shrinks_the_group_to_its_guarantee() -> None:
    month = BudgetSpec(per_month=480.0)
    a = run([claim("a", 6, up=6, guaranteed=2, budget=month, spent=480.0)])
    assert counts(a) == {"a": 2} and ids(a) == {"a": ("a5", "a4", "a3", "a2")}
    assert a.reclaims[0].reason.startswith(
        "budget: group 'a' per_month 480 (0 left over 24.0 h = 0/h) is exceeded (spends 12/h)"
    )


def test_a_global_cap_cut_takes_the_lowest_priority_non_reserved_group_first() -> None:
    other = PoolState("gpu2", "inference", 10, price_per_hour=1.0)
    claims = [
        claim("core", 4, up=4, guaranteed=2, reserved=True, priority=-5),
        claim("hi", 3, up=3, priority=3),
        claim("lo", 3, up=3, pool="gpu2", priority=-1),
    ]
    a = run(claims, pools=[GPU, other], budget=BudgetSpec(max_accelerators=5))
    # 10 units held, 5 allowed: lo (another pool) goes first, then hi's newest; the reserved
    # group keeps all it runs although its priority is the lowest.
    assert ids(a) == {"lo": ("lo2", "lo1", "lo0"), "hi": ("hi2", "hi1")}
    assert counts(a) == {"core": 4, "hi": 1, "lo": 0}
    assert {r.pool for r in a.reclaims} == {"gpu", "gpu2"}
    assert a.reclaims[0].reason == (
        "budget: global max_accelerators lowered to 5 (all groups hold 10): 'lo' is above "
        "its guarantee 0, so its newest instances drain (lowest priority first)"
    )
    # Down to the guarantees at most: the reserved group keeps its 2.
    tight = run(claims, pools=[GPU, other], budget=BudgetSpec(max_accelerators=1))
    assert counts(tight) == {"core": 2, "hi": 0, "lo": 0}


def test_draining_units_are_not_cut_twice() -> None:
    cap = BudgetSpec(max_accelerators=6)
    first = run([claim("search", 10, up=10, guaranteed=4, budget=cap)], pools=[BIG])
    asked = ids(first)["search"]
    # The controller has not drained yet: the same instances are asked again, nothing more.
    again = run(
        [claim("search", 10, up=10, guaranteed=4, budget=cap)], pools=[BIG], state=first.state
    )
    assert sorted(ids(again)["search"]) == sorted(asked) and counts(again) == {"search": 6}
    # Draining: 6 run, 4 drain; they still count (no start) but are not cut again.
    draining = claim("search", 10, up=6, draining=4, guaranteed=4, budget=cap)
    later = run([draining], pools=[BIG], state=again.state)
    assert later.reclaims == () and counts(later) == {"search": 6}
    assert later.refusals["search"].endswith(
        "from 10 to 11 accelerators, above group 'search' max_accelerators 6"
    )
    # The same for a global spend cap: 10 x 2/h down to 12/h, then the drains complete.
    glob = BudgetSpec(per_hour=12.0)
    cut = run([claim("a", 10, up=10)], budget=glob)
    assert counts(cut) == {"a": 6} and len(ids(cut)["a"]) == 4
    wait = run([claim("a", 10, up=6, draining=4)], budget=glob, state=cut.state)
    assert wait.reclaims == () and counts(wait) == {"a": 6}


def test_a_group_without_a_price_is_never_cut_by_a_spend_cap() -> None:
    # Its month is overspent (the allowed rate is below 0), yet it costs nothing per hour.
    month = BudgetSpec(per_month=100.0)
    a = run([claim("a", 8, up=8, pool="free", budget=month, spent=150.0)], pools=[FREE])
    assert a.reclaims == () and counts(a) == {"a": 8}
    # A global spend cap skips it too, although it is the lowest priority group.
    claims = [claim("f", 8, up=8, pool="free", priority=-3), claim("b", 3, up=3)]
    g = run(claims, pools=[FREE, GPU], budget=BudgetSpec(per_hour=4.0))
    assert ids(g) == {"b": ("b2",)} and counts(g) == {"f": 8, "b": 2}


def test_units_held_per_grant_and_in_total() -> None:
    a = run([claim("a", 5, up=3, draining=2), claim("b", 1, u=2), claim("c", 0, up=1)])
    held = {name: g.units_held for name, g in a.grants.items()}
    # a: 5 instances after starting 2, plus 2 units draining; c holds its one until the
    # controller drains it down to its grant of 0.
    assert held == {"a": 7, "b": 2, "c": 1}
    assert a.units_held == 10 and a.spend_per_hour == 20.0
    # A cut keeps counting the drained units until they are released.
    cut = run([claim("a", 8, up=8, budget=BudgetSpec(max_accelerators=5))])
    assert counts(cut) == {"a": 5} and cut.grants["a"].units_held == 8
    # Units held outside the claims count in the total and against the global caps.
    other = allocate(
        [GPU],
        [claim("a", 5)],
        QuotaState(),
        T0,
        budget=BudgetSpec(max_accelerators=6),
        other_units_held=3,
    )
    assert counts(other) == {"a": 3} and other.units_held == 6
