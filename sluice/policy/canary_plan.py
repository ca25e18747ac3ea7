"""The sequential design of a canary rollout: how the false-rollback budget is spent, when the
criteria are judged, and how many answers each step needs. Pure; no clock, no I/O.

**What a rollout promises.** A good canary (no worse than its baseline on any criterion) is
rolled back with probability at most `false_rollback_rate` (default 1%) over the WHOLE
rollout: every step, every criterion, every look. Why that holds:

1. The budget is split by a union bound (Bonferroni), which needs no independence: a
   tenth goes to the fast path for gross failures, the rest in equal shares to the steps.
2. Within a step, the criteria are judged only at a few *planned looks*, when the smaller
   side has 1/4, 1/2 and all of the step's samples (the last also waits for `hold_s`).
   Each look spends its part of the step's share (1/4, 1/4, 1/2: a linear spending
   function over the planned information), and a look is taken once however often the
   controller analyses (the state machine counts them), so a second's re-analysis is not a
   new test. This is group-sequential alpha spending, with union-bound boundaries rather
   than the tighter recursive ones, because those need a normal joint distribution that
   exact tests do not have.
3. At a look, the criteria are one family under Holm's step-down procedure at the look's
   alpha, which bounds the chance of any false failure for any dependence between them.
4. Every test is valid at any sample size, not just asymptotically: rates and quantile
   exceedances are exact conditional (Fisher) tests, stratified by step; distributions use
   scipy's two-sample Kolmogorov-Smirnov test, conservative with ties.
5. The fast path is a pair of Wald sequential probability ratio tests, which may be looked
   at after every answer (Ville's inequality): the canary's error rate is at least
   `gross_error_rate` G rather than at most G/4, and the baseline's is at most G/20 rather
   than at least G/4. Under any common error rate one of the two nulls holds, so both tests
   pass their bar together with probability at most the fast path's share.

6. The tests assume the two sides' answers are exchangeable when the canary is good. A
   look compares the requests that arrived under the step's split, cut at the same instant
   for both sides a horizon before it (`sluice.policy.windows`): answers that started
   under the step before, or that are still running, bias neither side however long
   answers take.

Resource gates (CPU per request, memory) are measured ratios, not tests: outside the budget.
The exact tests are conservative, so the rate measured by `bench/canary.py` sits below the
promise.

**How many samples.** Each step needs `samples` answers on its smaller side. Unless
`min_samples` sets it, it is the most any criterion needs to catch its smallest regression
worth catching with probability `power` by the last step at or below `catch_by_percent`,
planned with normal approximations to the tests above (`needs`): rates and quantiles pool
the evidence of those steps (so each step needs 1/k of it), distributions must be caught by
one of them. Plans assume the larger side at most RATIO_CAP times the smaller (the window
keeps that many), the baseline rates in PLAN_RATES and lognormal timings of spread
PLAN_SIGMA; steps nearer 50% need more per side, as neither side is much larger.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from sluice.spec.rollouts import AnalysisSpec, CriterionName, RolloutSpec

__all__ = [
    "FAST_SHARE",
    "LOOK_FRACTIONS",
    "MIN_LOOK",
    "RATIO_CAP",
    "TESTED",
    "RolloutPlan",
    "StepPlan",
    "plan_rollout",
    "single_look",
    "step_seconds",
]

FAST_SHARE = 0.1
"""Part of the false-rollback budget spent by the fast (gross failure) path."""
LOOK_FRACTIONS: tuple[float, ...] = (0.25, 0.5, 1.0)
"""A step's looks, as fractions of its samples; each spends that increment of its alpha."""
MIN_LOOK = 10
"""No look on fewer answers a side (an earlier look's alpha moves to the next one)."""
RATIO_CAP = 4.0
"""Plans count the larger side as at most this many times the smaller; the analysis window
keeps (RATIO_CAP + 1) x samples answers a side, so that much is there to compare with."""
PLAN_RATES: dict[str, float] = {
    "error_rate": 0.01,
    "empty_rate": 0.01,
    "truncated_rate": 0.05,
    "refusal": 0.02,
}
"""Baseline rates the sample sizes are planned for (a higher rate needs more samples)."""
PLAN_SIGMA = 0.5
"""Planned log-spread of latencies: a ratio r of quantiles moves ln(r)/sigma in z units."""
STYLE_TESTS = 4
"""style_drift tests four features, each at a quarter of its alpha (Bonferroni)."""

TESTED: tuple[CriterionName, ...] = (
    "error_rate",
    "latency_p50",
    "latency_p95",
    "ttft_p95",
    "tpot_p50",
    "output_length",
    "empty_rate",
    "truncated_rate",
    "style_drift",
)
"""The statistical criteria: one Holm family at each look (CPU and memory are ratios)."""


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One step: `samples` answers its smaller side needs before it may pass, the look sizes
    (answers a side; the last is `samples`), and the alpha each look spends."""

    index: int
    percent: float
    samples: int
    looks: tuple[int, ...]
    alphas: tuple[float, ...]

    def due(self, smaller: int, done: int, final_ready: bool) -> int:
        """The latest look index (1-based) that `smaller` answers a side allow; the last one
        only once `final_ready` (the hold is over). 0 when none is due beyond `done`."""
        k = sum(1 for n in self.looks if smaller >= n)
        if k == len(self.looks) and not final_ready:
            k -= 1
        return k if k > done else 0

    def spent(self, done: int, look: int) -> float:
        """Alpha a look at index `look` spends after `done` looks: the skipped ones' too."""
        return sum(self.alphas[done:look])

    def next_look(self, done: int) -> int | None:
        return self.looks[done] if done < len(self.looks) else None

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.index,
            "percent": self.percent,
            "samples": self.samples,
            "looks": list(self.looks),
            "alphas": list(self.alphas),
        }


@dataclass(frozen=True, slots=True)
class RolloutPlan:
    """The whole rollout's design. `needs`: samples a side each tested criterion asks per
    step (None: disabled); `driver`: the criterion that sets `samples` (None when
    `min_samples` does); `catch_steps`: steps at or below `catch_by_percent`."""

    false_rollback_rate: float
    fast_alpha: float
    step_alpha: float
    steps: tuple[StepPlan, ...]
    needs: dict[str, int | None]
    driver: str | None
    catch_steps: int
    power: float

    def step(self, index: int) -> StepPlan:
        return self.steps[index]

    def catch_samples(self) -> int:
        """Canary answers gathered by the end of the last step at or below catch_by_percent."""
        return sum(s.samples for s in self.steps[: self.catch_steps])

    def to_json(self) -> dict[str, object]:
        return {
            "false_rollback_rate": self.false_rollback_rate,
            "fast_alpha": self.fast_alpha,
            "step_alpha": self.step_alpha,
            "power": self.power,
            "catch_steps": self.catch_steps,
            "catch_samples": self.catch_samples(),
            "driver": self.driver,
            "needs": dict(self.needs),
            "steps": [s.to_json() for s in self.steps],
        }


def _z(p: float) -> float:
    """Upper normal quantile: P(Z > z) = p."""
    return float(stats.norm.isf(p))


def _rate_n(p0: float, delta: float, alpha: float, power: float, r: float) -> float:
    """Answers on the smaller side for a one-sided two-proportion test (level `alpha`, the
    other side r times larger) to see p0 -> p0 + delta with `power`. On the arcsine scale,
    2 asin(sqrt(p)), a rate's estimate has variance 1/n whatever p, which keeps the plan
    honest for rare events where the plain normal approximation promises too much (checked
    against the exact test by simulation in the tests)."""
    p1 = min(p0 + delta, 0.999)
    h = 2 * math.asin(math.sqrt(p1)) - 2 * math.asin(math.sqrt(p0))
    return ((_z(alpha) + _z(1 - power)) / h) ** 2 * (1 + 1 / r)


def _quantile_n(q: float, ratio: float, alpha: float, power: float, r: float) -> float:
    """Answers for the exceedance test of the q-quantile to see a ratio `ratio`: under
    lognormal timings of spread PLAN_SIGMA, the canary's share above the baseline's
    q-quantile grows from 1 - q to 1 - Phi(z_q - ln(ratio) / sigma)."""
    p0 = 1 - q
    p1 = float(stats.norm.sf(stats.norm.ppf(q) - math.log(ratio) / PLAN_SIGMA))
    return _rate_n(p0, p1 - p0, alpha, power, r)


def _ks_n(d: float, alpha: float, power: float, r: float) -> float:
    """Answers for the two-sided KS test to see distance `d`: the empirical distance at the
    true argmax has sd <= 1/(2 sqrt(n_e)), and the test rejects above sqrt(ln(2/alpha)/2) /
    sqrt(n_e), with n_e = n m / (n + m) the effective size."""
    c = math.sqrt(math.log(2 / alpha) / 2)
    n_e = ((c + _z(1 - power) / 2) / d) ** 2
    return n_e * (1 + 1 / r)


def _needs(spec: AnalysisSpec, alpha: float, power: float, k: int) -> dict[str, int | None]:
    """Samples a side per step each tested criterion needs, at per-criterion level `alpha`
    on the catch-by step's last look: pooled criteria gather over `k` steps, distribution
    criteria must be caught by one of them (per-step power 1 - (1 - power)^(1/k))."""
    off = set(spec.disable)
    once = 1 - (1 - power) ** (1 / k)
    r = RATIO_CAP
    style = alpha / STYLE_TESTS
    raw: dict[str, float] = {
        "error_rate": _rate_n(
            PLAN_RATES["error_rate"], spec.error_rate_max_increase, alpha, power, r
        )
        / k,
        "latency_p50": _quantile_n(0.5, spec.latency_p50_max_ratio, alpha, power, r) / k,
        "latency_p95": _quantile_n(0.95, spec.latency_p95_max_ratio, alpha, power, r) / k,
        "ttft_p95": _quantile_n(0.95, spec.ttft_p95_max_ratio, alpha, power, r) / k,
        "tpot_p50": _quantile_n(0.5, spec.tpot_p50_max_ratio, alpha, power, r) / k,
        "output_length": _ks_n(spec.output_length_max_ks, alpha, once, r),
        "empty_rate": _rate_n(
            PLAN_RATES["empty_rate"], spec.empty_rate_max_increase, alpha, power, r
        )
        / k,
        "truncated_rate": _rate_n(
            PLAN_RATES["truncated_rate"], spec.truncated_rate_max_increase, alpha, power, r
        )
        / k,
        "style_drift": max(
            _ks_n(spec.style_drift_max_ks, style, once, r),
            _rate_n(PLAN_RATES["refusal"], spec.refusal_rate_max_increase, style, power, r) / k,
        ),
    }
    return {name: None if name in off else math.ceil(n) for name, n in raw.items()}


def _looks(samples: int, step_alpha: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
    looks: list[int] = []
    alphas: list[float] = []
    spent = 0.0
    for f in LOOK_FRACTIONS:
        n = max(1, math.ceil(samples * f))
        if (n < MIN_LOOK and f < 1.0) or (looks and n <= looks[-1]):
            continue
        looks.append(n)
        alphas.append(step_alpha * f - spent)
        spent = step_alpha * f
    return tuple(looks), tuple(alphas)


def _ratio(percent: float, last: bool) -> float:
    """The larger side over the smaller at a step, as planned (at most RATIO_CAP)."""
    if last or percent >= 100:
        return RATIO_CAP
    small = min(percent, 100 - percent)
    return min(RATIO_CAP, (100 - small) / small)


def plan_rollout(spec: RolloutSpec) -> RolloutPlan:
    """The design of `spec`'s rollout (see the module docstring)."""
    a = spec.analysis
    fast = a.false_rollback_rate * FAST_SHARE
    step_alpha = (a.false_rollback_rate - fast) / len(spec.steps)
    k = max(1, sum(1 for p in spec.steps if p <= a.catch_by_percent))
    family = max(1, sum(1 for c in TESTED if c not in a.disable))
    per_criterion = step_alpha * (LOOK_FRACTIONS[-1] - LOOK_FRACTIONS[-2]) / family
    needs = _needs(a, per_criterion, a.power, k)
    wanted = {n: v for n, v in needs.items() if v is not None}
    driver = max(wanted, key=lambda n: wanted[n]) if wanted else None
    base = max(wanted.values(), default=MIN_LOOK)
    steps = []
    for i, p in enumerate(spec.steps):
        if a.min_samples is not None:
            n = a.min_samples
        else:
            r = _ratio(p, i == len(spec.steps) - 1)
            n = math.ceil(base * (1 + 1 / r) / (1 + 1 / RATIO_CAP))
        looks, alphas = _looks(n, step_alpha)
        steps.append(StepPlan(i, p, n, looks, alphas))
    return RolloutPlan(
        false_rollback_rate=a.false_rollback_rate,
        fast_alpha=fast,
        step_alpha=step_alpha,
        steps=tuple(steps),
        needs=needs,
        driver=driver if a.min_samples is None else None,
        catch_steps=k,
        power=a.power,
    )


def single_look(spec: AnalysisSpec, samples: int = 100) -> StepPlan:
    """A one-off comparison (no rollout around it): one look at `samples` answers a side
    (`min_samples` if set) spending the whole evidence budget."""
    n = spec.min_samples if spec.min_samples is not None else samples
    alpha = spec.false_rollback_rate * (1 - FAST_SHARE)
    return StepPlan(0, 0.0, n, (n,), (alpha,))


def step_seconds(
    plan: RolloutPlan, spec: RolloutSpec, rate_rps: float, horizon_s: float = 0.0
) -> list[float]:
    """How long each step takes when the baseline's traffic is `rate_rps` requests a second
    and the canary gets the step's percent of it (tenant pacing aside): the time its smaller
    side needs for `samples` answers, plus the look horizon (`sluice.policy.windows`: a
    look counts only requests that arrived `horizon_s` before it), at least `hold_s`. The
    last (100%) step compares with the step before's baseline, so only the canary's answers
    count. inf: no traffic."""
    out = []
    for s in plan.steps:
        share = 1.0 if s.percent >= 100 else min(s.percent, 100 - s.percent) / 100
        need = s.samples / (rate_rps * share) if rate_rps > 0 else math.inf
        out.append(max(spec.hold_s, need + horizon_s))
    return out
