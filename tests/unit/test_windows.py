"""A canary look's window at a step boundary (issue 32): answers that take seconds, the split
changing from 5% to 25% canary, identical baseline and canary (A/A). Keyed by arrival and
cut a horizon before the earlier side's read, the two sides are exchangeable: no criterion
fails in 1,000 seeded boundary cases. Keyed by finish time (the old window), long answers
that started under the old split land on the baseline, and `output_length` fails."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sluice.policy.analysis import RequestSample, analyze
from sluice.policy.canary_plan import StepPlan, plan_rollout
from sluice.policy.windows import HORIZON_MAX_S, HORIZON_MIN_S, horizon_s, look_rows
from sluice.spec.rollouts import RolloutSpec

SPEC = RolloutSpec(name="chat-v2", baseline="chat", canary="chat-v2")
PLAN = plan_rollout(SPEC)
LOOK_ALPHA = PLAN.step(1).alphas[0]
"""What the first look of a step spends (where the old window failed)."""
STEP_AT = 1_000.0
RATE = 200.0
OLD, NEW = 0.05, 0.25
WINDOW = 2000
"""Answers a window keeps a side here (the collector's reservoir keeps 5,000 or more)."""


def traffic(rng: np.random.Generator, start: float, end: float) -> dict[str, np.ndarray]:
    """Poisson arrivals, a third of them in bursts of long answers; lognormal TTFT,
    heavy-tailed output lengths; each request's side drawn at arrival from the split in
    force then (5% canary before the step, 25% after)."""
    n = rng.poisson(RATE * (end - start))
    at = np.sort(rng.uniform(start, end, n))
    burst = rng.random(n) < 0.3
    tokens = np.minimum(4000, np.ceil(rng.lognormal(np.where(burst, 5.5, 4.5), 1.0)))
    ttft = rng.lognormal(math.log(0.3), 0.6, n)
    tpot = 0.012 * rng.lognormal(0.0, 0.1, n)
    return {
        "at": at,
        "tokens": tokens,
        "ttft": ttft,
        "tpot": tpot,
        "latency": ttft + tokens * tpot,
        "status": np.where(rng.random(n) < 0.01, 500, 200),
        "canary": rng.random(n) < np.where(at < STEP_AT, OLD, NEW),
    }


def rows(t: dict[str, np.ndarray], keep: np.ndarray) -> list[RequestSample]:
    return [
        RequestSample(
            int(t["status"][i]),
            float(t["latency"][i]),
            ttft_s=float(t["ttft"][i]),
            tpot_s=float(t["tpot"][i]),
            output_tokens=int(t["tokens"][i]),
            finish_reason="stop",
            arrived_at=float(t["at"][i]),
        )
        for i in np.flatnonzero(keep)
    ]


def judge(base: list[RequestSample], canary: list[RequestSample]) -> list[str]:
    """The criteria failed at a look on these answers, at a step's first look's alpha."""
    n = min(len(base), len(canary))
    if n < 10:
        return []
    step = StepPlan(1, NEW * 100, n, (n,), (LOOK_ALPHA,))
    result = analyze(base, canary, None, None, SPEC.analysis, step)
    return [c.name for c in result.criteria if c.verdict == "fail"]


def boundary_case(seed: int) -> tuple[list[str] | None, list[str]]:
    """One step boundary: the failed criteria of a look with the new window (by arrival,
    common cut, horizon) and, for looks in the step's first 10 s (half of them), with the
    old one (by finish time, each side as read; None for later looks)."""
    rng = np.random.default_rng(seed)
    t = traffic(rng, STEP_AT - 60.0, STEP_AT + 100.0)
    done = t["at"] + t["latency"]
    horizon = horizon_s(t["latency"][done <= STEP_AT])  # what was seen before the step
    early = rng.random() < 0.5
    look = STEP_AT + (rng.uniform(3.0, 10.0) if early else rng.uniform(horizon, horizon + 40))
    reads = {True: look - rng.uniform(0, 1.5), False: look - rng.uniform(0, 1.5)}
    seen = {c: (t["canary"] == c) & (done <= reads[c]) for c in (True, False)}
    old = None
    if early:
        old = judge(*(rows(t, seen[c] & (done >= STEP_AT)) for c in (False, True)))
    through = min(reads.values())
    new = []
    for c in (False, True):
        window = np.flatnonzero(seen[c] & (t["at"] >= STEP_AT))
        if len(window) > WINDOW:  # the collector keeps a uniform sample (reservoir)
            window = rng.choice(window, WINDOW, replace=False)
        keep = np.zeros(len(done), dtype=bool)
        keep[window] = True
        new.append(look_rows(rows(t, keep), STEP_AT, through, horizon))
    return old, judge(*new)


def test_a_window_at_a_step_boundary_is_exchangeable_in_1000_seeded_cases() -> None:
    old_failures, new_failures, early = [], [], 0
    for seed in range(1000):
        old, new = boundary_case(seed)
        early += old is not None
        if old:
            old_failures.append((seed, old))
        if new:
            new_failures.append((seed, new))
    assert new_failures == []
    # the window by finish time, on the same answers, was not exchangeable
    assert len(old_failures) >= early // 5
    assert {c for _, failed in old_failures for c in failed} == {"output_length"}


def test_the_horizon_covers_the_slow_tail_within_bounds() -> None:
    assert horizon_s([]) == HORIZON_MIN_S
    assert horizon_s([0.01] * 5000) == HORIZON_MIN_S
    assert horizon_s([1.0] * 10 + [8.0]) == pytest.approx(12.0)  # few: the largest seen
    tail = [1.0] * 9990 + [30.0] * 10  # 0.1% at 30 s: the 99.9th percentile is 1 s
    assert horizon_s(tail) == pytest.approx(1.5)
    assert horizon_s([1.0] * 9980 + [30.0] * 20) == pytest.approx(45.0)
    assert horizon_s([1e6]) == HORIZON_MAX_S
    assert horizon_s([float("nan"), 2.0]) == pytest.approx(3.0)


def test_a_look_keeps_what_arrived_in_the_step_old_enough_and_finished() -> None:
    def row(arrived: float, latency: float) -> RequestSample:
        return RequestSample(200, latency, arrived_at=arrived)

    rows = [
        row(99.0, 0.5),  # arrived before the step: under the old split
        row(104.0, 1.0),  # kept
        row(101.0, 1.0),  # kept, and sorted before the one above
        row(108.5, 0.1),  # too recent: within the horizon of the cut
        row(105.0, 6.0),  # still running at the cut
        RequestSample(200, 1.0),  # no arrival time: kept as it is, last
    ]
    kept = look_rows(rows, since=100.0, through=110.0, horizon=2.0)
    assert [r.arrived_at for r in kept] == [101.0, 104.0, None]
    assert look_rows(rows, since=100.0, through=None, horizon=2.0) == []


def test_rows_know_when_they_arrived() -> None:
    worker = {"seq": 1, "at": 50.0, "status": 200, "latency_s": 2.5}
    assert RequestSample.from_json(worker).arrived_at == pytest.approx(47.5)
    explicit = {**worker, "arrived_at": 40.0}
    assert RequestSample.from_json(explicit).arrived_at == 40.0
    assert RequestSample.from_json({"status": 200, "latency_s": 1.0}).arrived_at is None
