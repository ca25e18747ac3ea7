"""The rollout's sequential design: the budget adds up to the promise, looks spend it in
order and once, the samples follow from the knobs (and `min_samples` overrides them), the
power formulas agree with simulation, and the time estimate follows the traffic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sluice.control.rates import ArrivalRates
from sluice.control.rollouts import plan_report
from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.canary_plan import (
    FAST_SHARE,
    RATIO_CAP,
    StepPlan,
    plan_rollout,
    single_look,
    step_seconds,
)
from sluice.policy.evidence import Table, stratified_exact
from sluice.spec.rollouts import AnalysisSpec, RolloutSpec


def spec(**analysis: object) -> RolloutSpec:
    return RolloutSpec.model_validate(
        {"name": "r", "baseline": "a", "canary": "b", "analysis": analysis}
    )


def test_the_budget_adds_up_to_the_false_rollback_rate() -> None:
    for rate in (0.01, 0.05):
        plan = plan_rollout(spec(false_rollback_rate=rate))
        spent = plan.fast_alpha + sum(sum(s.alphas) for s in plan.steps)
        assert spent == pytest.approx(rate)
        assert plan.fast_alpha == pytest.approx(rate * FAST_SHARE)
        for s in plan.steps:  # a linear spending function: 1/4, 1/4, 1/2 of the step's share
            assert s.alphas == pytest.approx(tuple(plan.step_alpha * f for f in (0.25, 0.25, 0.5)))
            assert s.looks[-1] == s.samples and list(s.looks) == sorted(set(s.looks))


def test_samples_follow_the_smallest_regressions_worth_catching() -> None:
    default = plan_rollout(spec())
    assert default.catch_steps == 4  # 1, 2, 4, 8 %
    assert default.driver in default.needs
    n = default.steps[0].samples
    assert n == max(v for v in default.needs.values() if v is not None)
    # halving the smallest error rise worth catching needs about four times the answers
    finer = plan_rollout(spec(error_rate_max_increase=0.01, truncated_rate_max_increase=0.1))
    assert finer.driver == "error_rate"
    coarse = plan_rollout(spec(error_rate_max_increase=0.02, truncated_rate_max_increase=0.1))
    assert finer.needs["error_rate"] is not None and coarse.needs["error_rate"] is not None
    assert 3.0 < finer.needs["error_rate"] / coarse.needs["error_rate"] < 4.5
    # a stricter budget needs more; disabling a criterion removes its need
    assert plan_rollout(spec(false_rollback_rate=0.001)).steps[0].samples > n
    off = plan_rollout(spec(disable=["truncated_rate"]))
    assert off.needs["truncated_rate"] is None and off.steps[0].samples < n
    # the 50% step has no large side to lean on: (1 + 1) / (1 + 1/4) of the samples
    by_percent = {s.percent: s.samples for s in default.steps}
    assert by_percent[50] == math.ceil(n * 2 / (1 + 1 / RATIO_CAP))
    assert by_percent[1] == by_percent[95] == by_percent[100] == n


def test_min_samples_overrides_the_derived_count() -> None:
    plan = plan_rollout(spec(min_samples=30))
    assert {s.samples for s in plan.steps} == {30} and plan.driver is None
    assert plan.steps[0].looks == (15, 30)  # 30/4 < 10 answers: that look is dropped
    assert plan.steps[0].alphas == pytest.approx((plan.step_alpha / 2, plan.step_alpha / 2))
    assert single_look(AnalysisSpec(min_samples=30)).looks == (30,)


def test_a_look_is_due_once_and_the_last_waits_for_the_hold() -> None:
    s = StepPlan(0, 1.0, 100, (25, 50, 100), (0.1, 0.1, 0.2))
    assert s.due(24, 0, True) == 0 and s.due(25, 0, True) == 1 and s.due(30, 1, True) == 0
    assert s.due(200, 0, False) == 2 and s.due(200, 2, False) == 0 and s.due(200, 2, True) == 3
    assert s.spent(0, 2) == pytest.approx(0.2) and s.spent(2, 3) == pytest.approx(0.2)
    assert s.next_look(1) == 50 and s.next_look(3) is None


def test_the_error_rate_plan_has_the_power_it_claims() -> None:
    """Simulate what the plan assumes (1% baseline errors, +2 points on the canary, the
    baseline four times larger, four steps pooled) and test at the level the plan used:
    the share caught must reach the planned power (the exact test is conservative with
    rare events; the arcsine scale of the plan accounts for it)."""
    plan = plan_rollout(spec(disable=["truncated_rate", "empty_rate", "style_drift"]))
    n = plan.needs["error_rate"]
    assert n is not None
    family = 9 - 3
    level = plan.step_alpha * 0.5 / family
    rng = np.random.default_rng(5)
    caught = 0
    runs = 1000
    for _ in range(runs):
        strata = [
            Table(int(rng.binomial(4 * n, 0.01)), 4 * n, int(rng.binomial(n, 0.03)), n)
            for _ in range(plan.catch_steps)
        ]
        caught += stratified_exact(strata) <= level
    assert caught / runs >= plan.power - 0.02  # 0.007 is one standard error


def test_step_times_follow_the_traffic() -> None:
    rs = spec(min_samples=100)
    plan = plan_rollout(rs)
    at_10 = step_seconds(plan, rs, 10.0)
    assert at_10[0] == pytest.approx(100 / (10 * 0.01))  # 1%: 0.1 canary answers a second
    assert at_10[6] == rs.hold_s  # 50%: 100 answers a side in 20 s, the hold is longer
    assert at_10[-1] == rs.hold_s  # 100%: only the canary's answers count
    report = plan_report(rs, 10.0, 0.0)
    assert report["total_s"] == pytest.approx(sum(at_10))
    assert report["steps"][0]["seconds"] == at_10[0] and report["rate_rps"] == 10.0
    # answers that take seconds: a look counts requests a horizon old, so each step that
    # waits for its samples takes a horizon longer; a step held by hold_s does not
    slow = step_seconds(plan, rs, 10.0, horizon_s=30.0)
    assert slow[0] == pytest.approx(at_10[0] + 30.0)
    assert slow[6] == rs.hold_s
    report = plan_report(rs, 10.0, 30.0)
    assert report["horizon_s"] == 30.0 and report["total_s"] == pytest.approx(sum(slow))
    unknown = plan_report(rs, None, 0.5)
    assert unknown["total_s"] is None and unknown["steps"][0]["seconds"] is None


def test_arrival_rates_over_the_last_minute() -> None:
    rates = ArrivalRates(window_s=60.0)

    def at(t: float, arrivals: int) -> dict[str, TrafficSample]:
        return {"chat": TrafficSample(t, 0, 0, arrivals, arrivals, (), ())}

    assert rates.rate("chat") is None
    rates.observe(at(0.0, 0))
    assert rates.rate("chat") is None  # one reading is no rate
    for t in range(1, 121):
        rates.observe(at(float(t), 5 * t if t <= 60 else 300 + 20 * (t - 60)))
    assert rates.rate("chat") == pytest.approx(20.0, rel=0.05)  # the last minute only
    rates.observe(at(121.0, 3))  # the gateway restarted: counting begins again
    rates.observe(at(123.0, 13))
    assert rates.rate("chat") == pytest.approx(5.0)
