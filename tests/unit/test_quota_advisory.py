"""Advisory quota (issue 16): the allocator's decision for an advisory group is advice; the
group's grant is bounded by the pool's free units only, and the pool is never exceeded."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.policy.quota import (
    AdvisedAllocation,
    GroupClaim,
    PoolState,
    QuotaState,
    RunningInstance,
    allocate,
    allocate_advised,
)
from sluice.spec.quota import BudgetSpec
from tests.unit.test_quota import GPU, T0, claim, counts
from tests.unit.test_quota_properties import PHASE, World, claims_of, drain, worlds


def advised(
    claims: Sequence[GroupClaim],
    advisory: set[str],
    *,
    pools: Sequence[PoolState] = (GPU,),
    state: QuotaState | None = None,
    budget: BudgetSpec | None = None,
) -> AdvisedAllocation:
    s = state or QuotaState()
    return allocate_advised(pools, claims, s, s, T0, advisory=advisory, budget=budget)


def test_without_advisory_groups_it_is_the_ordinary_round() -> None:
    claims = [claim("a", 4, guaranteed=4), claim("b", 9, guaranteed=2, limit=5)]
    r = advised(claims, set())
    assert r.enforced is r.advice
    assert r.enforced == allocate([GPU], claims, QuotaState(), T0)


def test_an_advisory_group_gets_what_it_asks_while_units_are_free() -> None:
    r = advised([claim("b", 8, up=2, guaranteed=2, limit=4)], {"b"})
    assert counts(r.advice) == {"b": 4}  # quota would hold it to its limit
    assert "limit 4 units reached" in r.advice.refusals["b"]
    assert counts(r.enforced) == {"b": 8}
    assert "b" not in r.enforced.refusals
    grant = r.enforced.grants["b"]
    assert (grant.own_units, grant.borrowed_units) == (2, 6)
    assert grant.reason.startswith("advisory quota: 8 of 8 wanted")
    assert "limit 4 units reached" in grant.reason  # what enforcing would have said
    assert r.advisory == {"b"}


def test_physical_capacity_binds_an_advisory_group() -> None:
    r = advised([claim("a", 3, up=3, guaranteed=3), claim("b", 20, up=2)], {"b"})
    assert counts(r.enforced) == {"a": 3, "b": 7}  # 10 units, a holds 3
    assert "pool 'gpu' full" in r.enforced.refusals["b"]


def test_an_advisory_group_is_never_reclaimed_from_nor_reclaims() -> None:
    # a's guarantee is lent to b, which runs all 10 units; a now wants its 4 back
    claims = [claim("a", 4, guaranteed=4, reclaim_grace_s=0), claim("b", 10, up=10)]
    r = advised(claims, {"b"})
    (reclaim,) = r.advice.reclaims  # enforcing would drain 4 of b's newest
    assert reclaim.borrower == "b" and len(reclaim.instance_ids) == 4
    assert r.enforced.reclaims == ()
    assert counts(r.enforced) == {"a": 0, "b": 10}
    assert "held by advisory-quota group(s) b" in r.enforced.refusals["a"]
    # and the other way round: an advisory owner does not get its guarantee back
    claims = [claim("a", 4, guaranteed=4, reclaim_grace_s=0), claim("b", 10, up=10)]
    r = advised(claims, {"a"})
    assert r.advice.reclaims and r.enforced.reclaims == ()
    assert counts(r.enforced) == {"a": 0, "b": 10}
    assert "pool 'gpu' full" in r.enforced.refusals["a"]


def test_budgets_do_not_bind_an_advisory_group_but_its_spend_counts_globally() -> None:
    low = BudgetSpec(per_hour=4.0)  # 2 instances at 2.0/h
    r = advised([claim("b", 5, budget=low)], {"b"})
    assert counts(r.advice) == {"b": 2} and r.advice.refusals["b"].startswith("budget")
    assert counts(r.enforced) == {"b": 5}
    assert r.enforced.spend_per_hour == 10.0
    # an active group's room under the global budget leaves out what b holds already
    claims = [claim("a", 5), claim("b", 3, up=3)]
    r = advised(claims, {"b"}, budget=BudgetSpec(per_hour=10.0))
    assert counts(r.enforced) == {"a": 2, "b": 3}  # 3 x 2.0 held by b + 2 x 2.0 = 10
    assert r.enforced.refusals["a"].startswith("budget")


def test_an_advisory_groups_units_count_against_the_global_unit_caps() -> None:
    cap = BudgetSpec(max_accelerators=5)
    r = advised([claim("a", 5), claim("b", 3, up=3)], {"b"}, budget=cap)
    assert counts(r.enforced) == {"a": 2, "b": 3}  # 3 units held by b + 2 = 5
    assert "from 5 to 6 accelerators, above global max_accelerators 5" in r.enforced.refusals["a"]
    assert r.enforced.grants["b"].units_held == 3 and r.enforced.units_held == 5
    # and a cap below what runs cuts the active groups for them (never the advisory one)
    r = advised([claim("a", 5, up=5), claim("b", 5, up=3)], {"b"}, budget=cap)
    assert [(x.borrower, len(x.instance_ids)) for x in r.enforced.reclaims] == [("a", 3)]
    assert counts(r.enforced) == {"a": 2, "b": 5}
    assert r.enforced.units_held == 5 + 2 + 3  # a: 2 running + 3 draining; b: 5
    # the meters pass through to both rounds
    hours = BudgetSpec(accelerator_hours_per_month=100)
    s = QuotaState()
    both = allocate_advised(
        [GPU],
        [claim("a", 5), claim("b", 1)],
        s,
        s,
        T0,
        advisory={"b"},
        budget=hours,
        unit_hours_this_month=52.0,  # 48 left over 24 h: 2 units
    )
    assert counts(both.advice) == {"a": 1, "b": 1}
    assert counts(both.enforced) == {"a": 2, "b": 1}  # b held nothing yet: a had 2 units


def test_a_pool_smaller_than_what_is_held_drains_advisory_groups_too() -> None:
    small = PoolState("gpu", "inference", 4, 2.0)
    claims = [claim("hi", 4, up=4, priority=1), claim("lo", 4, up=4)]
    r = advised(claims, {"hi", "lo"}, pools=[small])
    assert counts(r.enforced) == {"hi": 4, "lo": 0}  # lowest priority drains first
    assert "physical capacity" in r.enforced.refusals["lo"]


def simulate_advisory(world: World, advisory: set[str]) -> None:
    """A fake controller applying every round's enforced grants and reclaims; per round:
    the pool is never exceeded, no reclaim drains an advisory group, an advisory group is
    short of what it wants only when its pool has no room for one more, and the active
    groups keep their limits."""
    state = advice = QuotaState()
    for r in range(len(world.demand) * PHASE):
        now = T0 + r
        for g in world.groups:
            g.draining = [(t, u) for t, u in g.draining if t > now]
        wanted = world.demand[r // PHASE]
        claims = claims_of(world, wanted)  # (spend stays 0: this world is not metered)
        out = allocate_advised(world.pools, claims, state, advice, now, advisory=advisory)
        alloc = out.enforced
        state, advice = alloc.state, out.advice.state
        assert all(rec.borrower not in advisory for rec in alloc.reclaims)
        asked = {i for rec in alloc.reclaims for i in rec.instance_ids}
        for g in world.groups:
            drain(g, [x for x in g.running if x.id in asked], now)
            grant = alloc.grants[g.name].instances
            if grant < len(g.running):
                drain(g, sorted(g.running, key=lambda x: x.started_at)[grant:], now)
            for _ in range(grant - len(g.running)):
                g.running.append(RunningInstance(f"{g.name}-{g.made}", now))
                g.made += 1
        for pool in world.pools:
            members = [g for g in world.groups if g.pool == pool.name]
            assert sum(g.held() for g in members) <= pool.count, (pool, r)
            free = pool.count - sum(g.held() for g in members)
            for i, g in enumerate(world.groups):
                if g.pool != pool.name:
                    continue
                if g.name in advisory and len(g.running) < wanted[i]:
                    assert free < g.u, (g.name, r, free)
                if g.name not in advisory and g.quota.limit is not None:
                    assert len(g.running) * g.u <= g.quota.limit


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(budgets=False, shrink=False), st.data())
def test_advisory_groups_never_overfill_a_pool(world: World, data: st.DataObject) -> None:
    names = [g.name for g in world.groups]
    advisory = set(data.draw(st.lists(st.sampled_from(names), unique=True)))
    simulate_advisory(world, advisory)
