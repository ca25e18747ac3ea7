"""The causal reference (issue 16): window k's count reads only arrivals before window k, is
asked for no earlier than the window's start, cannot foresee a step up, and on stationary
traffic costs about what the best fixed fleet does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sluice.sim import (
    SimResult,
    WindowPlanPolicy,
    best_fixed,
    causal,
    oracle,
    prepare,
    run,
    trace_from_rows,
    warm_start,
)
from sluice.sim.causal import RULES, causal_plan, window_needs
from tests.unit.test_sim_single import fixed_service, poisson

CURRENT = SimResult.TIMELINE_COLUMNS.index("current")
READY = SimResult.TIMELINE_COLUMNS.index("ready")


def rows_of(t: np.ndarray[Any, Any]) -> Any:
    return trace_from_rows((float(x), 1, 1) for x in np.sort(t))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_window_k_reads_only_arrivals_before_it(seed: int) -> None:
    """Perturbing arrivals at or after window k's start leaves N_0..N_k unchanged (and does
    change later counts: the test is not vacuous)."""
    model = fixed_service(0.5, startup_s=30)
    rng = np.random.default_rng(seed)
    w = 30.0
    t = np.sort(rng.uniform(0, 600, int(rng.integers(3000, 6000))))
    k = int(rng.integers(2, 15))
    cut = k * w
    past = t[t < cut]
    # another future: a burst right at window k's start, thinned and shifted arrivals later
    later = t[t >= cut]
    later = later[rng.random(later.size) < 0.5] + rng.uniform(0, 5, 1)
    burst = cut + rng.uniform(0, w, 2000)
    changed = np.concatenate([past, later[later < 600], burst])
    a = window_needs(prepare(model, rows_of(t)), w)
    b = window_needs(prepare(model, rows_of(changed)), w)
    assert a[:k] == b[:k]  # the needs of windows before k are untouched
    assert b[k] > a[k]  # the burst is in window k
    for rule, back in RULES.items():
        for h in (1.0, 1.5):
            pa = causal_plan(a, back, 2, 1, 1000, headroom=h)
            pb = causal_plan(b, back, 2, 1, 1000, headroom=h)
            assert pa[: k + 1] == pb[: k + 1], (rule, h)
            assert pa[k + 1] < pb[k + 1], (rule, h)  # the burst shows one window later


def test_causal_candidates_run_the_causal_plans() -> None:
    """Every candidate's plan is `causal_plan` of the window needs at its own headroom."""
    model = fixed_service(0.5, startup_s=30)
    work = prepare(model, poisson(20, 300, 4))
    res = causal(work, windows=(30.0, 60.0))
    assert len(res.candidates) == 4 and res.start == 1
    for c in res.candidates:
        needs = list(res.needs[c.window_s])
        assert needs == window_needs(work, c.window_s)
        plan = causal_plan(needs, RULES[c.rule], res.start, 1, 1000, headroom=c.headroom)
        assert list(c.plan) == plan
        assert c.plan[0] == res.start  # window 0 has no past: the starting fleet


def test_a_window_count_is_asked_for_at_its_start_not_before() -> None:
    model = fixed_service(0.5, startup_s=30)
    work = prepare(model, trace_from_rows((i * 0.5, 1, 1) for i in range(400)))
    res = run(work, WindowPlanPolicy([1, 5, 2], 60.0, 1_767_225_600.0))
    t = res.column("t")
    current = res.timeline[:, CURRENT]
    ready = res.timeline[:, READY]
    assert (current[t < 60] == 1).all()  # nothing launched ahead of window 1
    assert current[t == 60][0] == 5
    assert (ready[t < 90] <= 1).all() and ready[t == 90][0] == 5  # ready start-up later
    assert (current[(t >= 120) & (t < 180)] == 2).all()


def test_a_step_up_cannot_be_foreseen() -> None:
    """1 req/s, then 40 req/s (0.5 s each: 20 busy slots, 5+ instances of 4): the oracle
    launches ahead of the step and meets the target; every causal candidate learns of the
    step only after it, so even the best of the family misses more (its headroom tops out
    at 4x the quiet need)."""
    model = fixed_service(0.5, startup_s=30)
    rows = [(float(i), 1, 1) for i in range(200)]
    rows += [(200 + i / 40.0, 1, 1) for i in range(40 * 200)]
    work = prepare(model, trace_from_rows(rows))
    o = oracle(work).result
    res = causal(work, windows=(10.0, 60.0, 300.0))
    target = model.slo.target
    assert o.summary()["slo_attainment"] >= target
    assert res.chosen_for == "best_attainment"
    assert not any(c.reaches_target for c in res.candidates)
    assert res.best.slo_attainment < o.summary()["slo_attainment"]

    def missed_after_step(r: SimResult) -> int:
        lat = r.done - work.trace.t
        miss = (r.done < 0) | (lat > work.limit + 1e-9)
        return int(np.count_nonzero(miss & (work.trace.t >= 200) & (work.trace.t < 260)))

    assert missed_after_step(res.best.result) > 100 * max(1, missed_after_step(o))


def test_on_stationary_traffic_it_meets_the_slo_near_the_best_fixed_cost() -> None:
    model = fixed_service(0.5, startup_s=30)
    work = prepare(model, poisson(40, 300, 1))  # 20 busy slots: 5-6 instances
    ws = warm_start(work)
    n, fixed = best_fixed(work)
    assert n is not None
    res = causal(work, ws.options)
    assert res.start == ws.count
    assert res.chosen_for == "slo_target" and res.best.reaches_target
    assert res.result.summary()["slo_attainment"] >= model.slo.target
    assert res.best.instance_seconds == res.result.instance_seconds
    assert 0.9 * fixed.instance_seconds <= res.best.instance_seconds
    assert res.best.instance_seconds <= 1.1 * fixed.instance_seconds
    cheapest = min(c.instance_seconds for c in res.candidates if c.reaches_target)
    assert res.best.instance_seconds == cheapest
