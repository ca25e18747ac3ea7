"""Quota allocation by example: one readable test per rule and per refusal reason."""

from __future__ import annotations

from collections.abc import Sequence

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

# 2026-11-30T00:00:00Z: 24 hours left in the month.
T0 = 1_795_996_800.0
GPU = PoolState("gpu", "inference", 10, price_per_hour=2.0)


def running(prefix: str, n: int, t0: float = 0.0) -> tuple[RunningInstance, ...]:
    return tuple(RunningInstance(f"{prefix}{i}", t0 + i) for i in range(n))


def claim(
    name: str,
    wanted: int,
    *,
    up: int = 0,
    u: int = 1,
    pool: str = "gpu",
    draining: int = 0,
    budget: BudgetSpec | None = None,
    spent: float = 0.0,
    **quota: object,
) -> GroupClaim:
    return GroupClaim(
        name=name,
        pool=pool,
        units_per_instance=u,
        wanted=wanted,
        quota=QuotaSpec.model_validate(quota),
        running=running(name, up),
        draining_units=draining,
        budget=budget,
        spent_this_month=spent,
    )


def run(
    claims: Sequence[GroupClaim],
    *,
    pools: Sequence[PoolState] = (GPU,),
    state: QuotaState | None = None,
    now: float = T0,
    budget: BudgetSpec | None = None,
    spent: float = 0.0,
) -> Allocation:
    return allocate(
        pools, claims, state or QuotaState(), now, budget=budget, spent_this_month=spent
    )


def counts(alloc: Allocation) -> dict[str, int]:
    return {name: g.instances for name, g in alloc.grants.items()}


def test_hours_left_in_month_is_utc_calendar() -> None:
    assert hours_left_in_month(T0) == 24.0
    assert hours_left_in_month(T0 + 23.5 * 3600) == 0.5
    assert hours_left_in_month(T0 - 29 * 86400) == 30 * 24  # 2026-11-01
    # December rolls into January of the next year.
    assert hours_left_in_month(T0 + 86400) == 31 * 24


def test_own_guarantee_first_then_borrowing() -> None:
    a = run([claim("a", 4, guaranteed=4), claim("b", 9, guaranteed=2)])
    assert counts(a) == {"a": 4, "b": 6}
    assert a.grants["b"].own_units == 2 and a.grants["b"].borrowed_units == 4
    assert a.refusals["b"].startswith("pool 'gpu' full: 10 of 10 units held")
    assert "a" not in a.refusals
    assert a.grants["a"].reason == "4 of 4 wanted instance(s): 4 own + 0 borrowed units"
    assert a.grants["a"].spend_per_hour == 8.0 and a.spend_per_hour == 20.0


def test_borrowing_uses_unassigned_units_then_idle_lendable_guarantees() -> None:
    a = run([claim("idle", 0, guaranteed=4, lendable=1), claim("b", 10, guaranteed=2)])
    # 4 unassigned + 1 lendable of idle's 4: b runs 2 own + 5 borrowed; 3 stay idle.
    assert counts(a) == {"idle": 0, "b": 7}
    assert "idle guaranteed units of idle are not lendable" in a.refusals["b"]
    lenders = {(x.lender, x.borrower): x.units for x in a.loans}
    assert lenders == {(None, "b"): 4, ("idle", "b"): 1}


def test_limit_reached() -> None:
    a = run([claim("a", 8, guaranteed=2, limit=5)])
    assert counts(a) == {"a": 5}
    assert a.refusals["a"] == "limit 5 units reached (1 per instance)"


def test_borrow_limit_reached() -> None:
    a = run([claim("a", 8, guaranteed=2, borrow_limit=1)])
    assert counts(a) == {"a": 3}
    assert a.refusals["a"].startswith("borrow_limit 1 reached (guarantee 2 + 1 borrowed")


def test_units_per_instance_and_a_partial_guarantee() -> None:
    # guarantee 3 with 2 units per instance: 1 own instance, the 2nd borrows 1 unit.
    a = run([claim("a", 3, u=2, guaranteed=3, borrow_limit=1)])
    assert counts(a) == {"a": 2}
    assert (a.grants["a"].own_units, a.grants["a"].borrowed_units) == (3, 1)
    assert "borrow_limit 1 reached" in a.refusals["a"]


def test_priority_then_fairness_decide_who_borrows() -> None:
    a = run([claim("lo", 10, priority=-1), claim("hi", 10, priority=5), claim("mid", 3)])
    assert counts(a) == {"lo": 0, "hi": 10, "mid": 0}
    fair = run([claim("x", 10), claim("y", 10), claim("z", 1)])
    # Equal priority: one instance at a time to the least borrowed group.
    assert counts(fair) == {"x": 5, "y": 4, "z": 1} or counts(fair) == {"x": 4, "y": 5, "z": 1}
    assert sum(counts(fair).values()) == 10


def test_draining_units_are_held_until_released() -> None:
    a = run([claim("a", 10, draining=3)])
    assert counts(a) == {"a": 7}
    capped = run([claim("a", 10, draining=3, limit=8)])
    assert counts(capped) == {"a": 5}


def test_reclaim_waits_for_grace_then_drains_newest_borrowed_first() -> None:
    b_running = claim("b", 10, up=10, guaranteed=4)
    a_wants = claim("a", 6, guaranteed=6, reclaim_grace_s=5)
    first = run([a_wants, b_running], now=T0)
    assert counts(first) == {"a": 0, "b": 10}
    assert first.reclaims == ()
    assert first.refusals["a"] == (
        "pool 'gpu' full: 6 units of its guarantee are borrowed; reclaim starts in 5.0 s "
        "(reclaim_grace_s 5)"
    )
    assert first.wake_at == T0 + 5
    early = run([a_wants, b_running], state=first.state, now=T0 + 4.9)
    assert early.reclaims == () and "reclaim starts in 0.1 s" in early.refusals["a"]
    due = run([a_wants, b_running], state=early.state, now=T0 + 5)
    [rec] = due.reclaims
    assert (rec.borrower, rec.lender, rec.units) == ("b", "a", 6)
    assert rec.instance_ids == ("b9", "b8", "b7", "b6", "b5", "b4")
    assert rec.drain_deadline == T0 + 5 + 30
    # Nothing starts for a until the units are released: no instance waits for quota.
    assert counts(due) == {"a": 0, "b": 4}
    assert due.refusals["a"] == "pool 'gpu' full: waiting for units reclaimed from b"
    assert due.refusals["b"].startswith("'a' wants 6 units of its guarantee back (reclaim)")
    # The controller has not drained yet: the same instances are asked again, nothing more.
    again = run([a_wants, b_running], state=due.state, now=T0 + 6)
    assert sorted(i for r in again.reclaims for i in r.instance_ids) == sorted(rec.instance_ids)
    # Draining: b holds 4 running + 6 draining; still no start for a.
    b_draining = claim("b", 10, up=4, draining=6, guaranteed=4)
    wait = run([a_wants, b_draining], state=again.state, now=T0 + 7)
    assert counts(wait) == {"a": 0, "b": 4} and wait.reclaims == ()
    assert "draining instances are releasing" in wait.refusals["a"]
    # Released: a starts its guarantee, b cannot borrow them back.
    b_done = claim("b", 10, up=4, guaranteed=4)
    done = run([a_wants, b_done], state=wait.state, now=T0 + 20)
    assert counts(done) == {"a": 6, "b": 4}
    assert done.state.claims_since == {}


def test_lowest_priority_borrower_is_reclaimed_first() -> None:
    hi = claim("hi", 4, up=4, priority=3)
    lo = claim("lo", 3, up=3, priority=-3)
    owner = claim("own", 6, guaranteed=6, reclaim_grace_s=0)
    a = run([hi, lo, owner])
    # 3 free units start at once; the other 3 come back from the lowest priority borrower.
    assert {r.borrower: r.units for r in a.reclaims} == {"lo": 3}
    assert counts(a) == {"hi": 4, "lo": 0, "own": 3}


def test_lendable_zero_is_never_borrowed() -> None:
    a = run([claim("core", 0, guaranteed=8, lendable=0), claim("b", 10)])
    assert counts(a) == {"core": 0, "b": 2}
    assert "idle guaranteed units of core are not lendable" in a.refusals["b"]


def test_pool_shrink_reserved_groups_keep_their_guarantee_first() -> None:
    small = PoolState("gpu", "inference", 6, 2.0)
    core = claim("core", 4, up=4, guaranteed=4, reserved=True)
    batch = claim("batch", 6, up=6, guaranteed=6)
    a = run([core, batch], pools=[small])
    assert counts(a) == {"core": 4, "batch": 2}
    [cut] = a.reclaims
    assert cut.lender is None and cut.borrower == "batch" and cut.units == 4
    assert cut.instance_ids == ("batch5", "batch4", "batch3", "batch2")
    assert "shrank to 6 units" in cut.reason
    assert a.refusals["batch"].startswith("pool 'gpu' shrank to 6 units")


def test_shrunk_pool_reserved_group_reclaims_from_cut_groups() -> None:
    small = PoolState("gpu", "inference", 6, 2.0)
    core = claim("core", 4, guaranteed=4, reserved=True, reclaim_grace_s=0)
    batch = claim("batch", 6, up=6, guaranteed=6)
    a = run([core, batch], pools=[small])
    # batch's guarantee is cut to 2: its 4 newest instances go back to core.
    assert [(r.borrower, r.lender, r.units) for r in a.reclaims] == [("batch", "core", 4)]
    assert counts(a) == {"core": 0, "batch": 2}
    assert "guarantee cut from 6 to 2" not in a.refusals.get("core", "")


def test_never_across_purpose() -> None:
    train = PoolState("train", "training", 8, 1.0)
    c = GroupClaim("a", "train", 1, wanted=2)
    a = run([c], pools=[GPU, train])
    assert counts(a) == {"a": 0}
    assert a.refusals["a"] == "pool 'train' is a training pool; inference groups never use it (Q5)"
    unknown = run([GroupClaim("a", "nope", 1, wanted=1)])
    assert unknown.refusals["a"] == "no pool named 'nope'"


def test_group_budget_per_hour_refuses_the_start() -> None:
    a = run([claim("a", 8, budget=BudgetSpec(per_hour=10.0))])
    assert counts(a) == {"a": 5}
    assert a.refusals["a"] == (
        "budget: one more instance (2/h) would take the spend rate from 10/h above "
        "group 'a' per_hour 10"
    )


def test_global_budget_counts_every_group_and_draining_units() -> None:
    a = run([claim("a", 3, draining=2), claim("b", 5)], budget=BudgetSpec(per_hour=12.0))
    assert sum(counts(a).values()) == 4 and a.spend_per_hour == 12.0
    assert "global per_hour 12" in a.refusals["b"]


def test_month_budget_spreads_what_is_left_over_the_hours_left() -> None:
    # 24 h left, 480 - 240 spent = 240 left -> 10/h -> 5 instances at 2/h.
    month = BudgetSpec(per_month=480.0)
    a = run([claim("a", 8, budget=month, spent=240.0)])
    assert counts(a) == {"a": 5}
    assert "group 'a' per_month 480 (240 left over 24.0 h = 10/h)" in a.refusals["a"]
    g = run([claim("a", 8)], budget=month, spent=432.0)  # 48 left -> 2/h -> 1 instance
    assert counts(g) == {"a": 1}


def test_budget_refusal_does_not_trigger_a_reclaim() -> None:
    b = claim("b", 10, up=10)
    a = claim("a", 4, guaranteed=4, reclaim_grace_s=0, budget=BudgetSpec(per_hour=1.0))
    alloc = run([a, b])
    assert alloc.reclaims == ()
    assert alloc.refusals["a"].startswith("budget:")


def test_lowered_limit_scales_down_through_the_grant() -> None:
    a = run([claim("a", 6, up=6, limit=4)])
    assert counts(a) == {"a": 4} and a.reclaims == ()
    assert a.refusals["a"] == "limit 4 units reached (1 per instance)"


def test_loans_stay_attributed_across_rounds() -> None:
    first = run([claim("l1", 0, guaranteed=3), claim("l2", 0, guaranteed=3), claim("b", 5)])
    before = {(x.lender, x.borrower): x.units for x in first.loans}
    assert before == {(None, "b"): 4, ("l1", "b"): 1}
    second = run(
        [claim("l1", 0, guaranteed=3), claim("l2", 0, guaranteed=3), claim("b", 6, up=5)],
        state=first.state,
    )
    after = {(x.lender, x.borrower): x.units for x in second.loans}
    # Last round's loans stay; the new unit comes from the most idle lender.
    assert after == {(None, "b"): 4, ("l1", "b"): 1, ("l2", "b"): 1}


def test_state_round_trips_through_json() -> None:
    b = claim("b", 10, up=10)
    a = claim("a", 6, guaranteed=6, reclaim_grace_s=0)
    alloc = run([a, b])
    assert alloc.state.reclaiming and alloc.state.loans
    assert QuotaState.from_json(alloc.state.to_json()) == alloc.state
