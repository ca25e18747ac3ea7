"""Canary analysis: KS against known values, every criterion fails on its own regression,
noise waits instead of failing, thin data waits and never passes, embeddings skip style."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.analysis import (
    Analysis,
    Criterion,
    RequestSample,
    ResourceUse,
    analyze,
    style_features,
)
from sluice.policy.significance import (
    kolmogorov_sf,
    ks_two_sample,
    normal_upper_quantile,
    quantile_bounds,
    two_proportion_p,
)
from sluice.spec.rollout import CRITERIA, AnalysisSpec

SPEC = AnalysisSpec()
N = 400
WORDS = ["the", "model", "answers", "questions", "about", "orders", "shipping", "refunds"]
WORDS += ["and", "accounts", "with", "short", "clear", "sentences", "that", "name", "next"]


# --- builders --------------------------------------------------------------------------------


def sentence(rng: np.random.Generator) -> str:
    n = int(rng.integers(6, 16))
    return " ".join(str(w) for w in rng.choice(WORDS, n)).capitalize() + "."


def clean(n: int = N, seed: int = 0) -> list[RequestSample]:
    """Generated answers of one healthy version: lognormal latency around 200 ms, streamed
    timings, output lengths 20-200 tokens, plain prose."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        tokens = int(rng.integers(20, 200))
        tpot = float(rng.lognormal(math.log(0.02), 0.1))
        ttft = float(rng.lognormal(math.log(0.05), 0.2))
        text = " ".join(sentence(rng) for _ in range(int(rng.integers(2, 5))))
        out.append(
            RequestSample(
                status=200,
                latency_s=ttft + tokens * tpot,
                ttft_s=ttft,
                tpot_s=tpot,
                output_tokens=tokens,
                finish_reason="stop",
                text=text,
            )
        )
    return out


def embeddings(n: int = N, seed: int = 0) -> list[RequestSample]:
    rng = np.random.default_rng(seed)
    return [RequestSample(200, float(rng.lognormal(math.log(0.01), 0.2))) for _ in range(n)]


def use(n: int = N, cpu_per_request: float = 0.01, memory_gb: float | None = 20.0) -> ResourceUse:
    return ResourceUse(requests=n, cpu_s=n * cpu_per_request, memory_gb=memory_gb)


Bad = Callable[[list[RequestSample]], list[RequestSample]]


def every(k: int, fn: Callable[[RequestSample], RequestSample]) -> Bad:
    """Apply `fn` to every k-th sample of a clean canary."""

    def bad(samples: list[RequestSample]) -> list[RequestSample]:
        return [fn(s) if i % k == 0 else s for i, s in enumerate(samples)]

    return bad


def markdown(s: RequestSample) -> RequestSample:
    text = "## Answer\n" + "\n".join(f"- **{part.strip()}**" for part in (s.text or "").split("."))
    return replace(s, text=text)


# One regression per criterion: (criterion, canary samples transform, canary resource use).
REGRESSIONS: dict[str, tuple[Bad, ResourceUse]] = {
    "error_rate": (every(10, lambda s: RequestSample(500, 0.01)), use()),
    "latency_p50": (lambda xs: [replace(s, latency_s=s.latency_s * 1.6) for s in xs], use()),
    "latency_p95": (every(6, lambda s: replace(s, latency_s=s.latency_s * 5)), use()),
    "ttft_p95": (lambda xs: [replace(s, ttft_s=(s.ttft_s or 0) * 2.0) for s in xs], use()),
    "tpot_p50": (lambda xs: [replace(s, tpot_s=(s.tpot_s or 0) * 1.5) for s in xs], use()),
    "output_length": (
        lambda xs: [replace(s, output_tokens=max(1, (s.output_tokens or 0) // 2)) for s in xs],
        use(),
    ),
    "empty_rate": (every(10, lambda s: replace(s, output_tokens=0, text="")), use()),
    "truncated_rate": (every(8, lambda s: replace(s, finish_reason="length")), use()),
    "cpu_per_request": (lambda xs: xs, use(cpu_per_request=0.02)),
    "memory": (lambda xs: xs, use(memory_gb=30.0)),
    "style_drift": (lambda xs: [markdown(s) for s in xs], use()),
}


def run(canary: list[RequestSample], canary_use: ResourceUse | None = None) -> Analysis:
    return analyze(clean(seed=1), canary, use(), canary_use or use(), SPEC)


def verdict(a: Analysis, name: str) -> str | None:
    crit = a.criterion(name)
    return None if crit is None else crit.verdict


def failed(a: Analysis) -> set[str]:
    return {c.name for c in a.criteria if c.verdict == "fail"}


# --- KS and tests ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "sf"),
    [
        (0.5, 0.9639452436648751),
        (1.0, 0.2699996716773546),
        (1.36, 0.0494858767),
        (2.0, 6.709253e-4),
    ],
)
def test_kolmogorov_tail_matches_tabulated_values(x: float, sf: float) -> None:
    assert kolmogorov_sf(x) == pytest.approx(sf, rel=1e-6)


def test_kolmogorov_tail_is_continuous_and_decreasing() -> None:
    assert kolmogorov_sf(1.18 - 1e-9) == pytest.approx(kolmogorov_sf(1.18), abs=1e-8)
    xs = np.linspace(0.01, 3.0, 300)
    values = [kolmogorov_sf(float(x)) for x in xs]
    assert all(a >= b for a, b in itertools.pairwise(values))
    assert kolmogorov_sf(0.0) == 1.0 and kolmogorov_sf(5.0) < 1e-20


def test_ks_statistic_on_hand_computed_cases() -> None:
    assert ks_two_sample([1, 2, 3], [4, 5, 6])[0] == 1.0
    assert ks_two_sample([1, 2, 3, 4], [2.5, 5])[0] == 0.5  # at x=2: 2/4 vs 0; at x=4: 1 vs 1/2
    assert ks_two_sample([1, 1, 2], [1, 2, 2])[0] == pytest.approx(1 / 3)  # ties: 2/3 vs 1/3
    # lambda = (sqrt(1.5) + 0.12 + 0.11 / sqrt(1.5)) x 1 = 1.4345; Q(1.4345) = 0.0326
    assert ks_two_sample([1, 2, 3], [4, 5, 6])[1] == pytest.approx(0.0326, abs=2e-4)
    assert ks_two_sample([], [1.0]) == (0.0, 1.0)


def test_ks_p_value_is_high_for_one_distribution_and_tiny_for_a_shift() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=500), rng.normal(size=500)
    d, p = ks_two_sample(a.tolist(), b.tolist())
    assert d < 0.08 and p > 0.1
    d, p = ks_two_sample(a.tolist(), (b + 0.5).tolist())
    assert d > 0.15 and p < 1e-6
    assert ks_two_sample(a.tolist(), a.tolist()) == (0.0, 1.0)


def test_two_proportion_test() -> None:
    # pooled 2%, se = sqrt(.02 x .98 x 2/1000) = .00626, z = 3.194
    assert two_proportion_p(10, 1000, 30, 1000) == pytest.approx(7.0e-4, rel=0.05)
    assert two_proportion_p(10, 1000, 10, 1000) == 0.5
    assert two_proportion_p(0, 100, 0, 100) == 1.0
    assert two_proportion_p(30, 1000, 10, 1000) > 0.99


def test_normal_quantile_and_quantile_bounds() -> None:
    assert normal_upper_quantile(0.05) == pytest.approx(1.644854, abs=1e-5)
    assert normal_upper_quantile(0.01) == pytest.approx(2.326348, abs=1e-5)
    xs = np.arange(1.0, 101.0)  # 1..100: the p50 lies in [50 -/+ 2.33 x 5] by rank
    assert quantile_bounds(xs, 0.5, 2.326348) == (38.0, 62.0)
    lo, hi = quantile_bounds(xs, 0.95, 2.326348)  # ranks 95 -/+ 5.07
    assert (lo, hi) == (89.0, 100.0)


def test_style_features_see_formatting_repetition_and_refusals() -> None:
    plain = style_features("The order ships today. It arrives on Monday.")
    assert plain[0] == 4.0 and plain[1] == 1.0 and plain[3] == 0.0
    assert style_features("## Title\n- **a**\n- **b**")[2] > 10 * plain[2]
    assert style_features("yes yes yes yes yes yes")[1] == pytest.approx(1 / 6)
    assert style_features("I'm sorry, but I cannot help with that.")[3] == 1.0


# --- analyze ---------------------------------------------------------------------------------


def test_same_version_passes_every_criterion() -> None:
    a = run(clean(seed=2))
    assert a.verdict == "pass", a.reason
    assert {c.name for c in a.criteria} == set(CRITERIA)
    assert all(c.verdict == "pass" for c in a.criteria), [
        c for c in a.criteria if c.verdict != "pass"
    ]


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_each_regression_fails_its_own_criterion(name: str) -> None:
    transform, canary_use = REGRESSIONS[name]
    a = run(transform(clean(seed=2)), canary_use)
    assert a.verdict == "fail"
    assert name in failed(a), a.reason
    assert name in a.reason
    crit = a.criterion(name)
    assert crit is not None and crit.statistic is not None and crit.threshold is not None


@pytest.mark.parametrize(
    "name",
    [
        "error_rate",
        "latency_p95",
        "ttft_p95",
        "tpot_p50",
        "output_length",
        "empty_rate",
        "truncated_rate",
        "cpu_per_request",
        "memory",
        "style_drift",
    ],
)
def test_regressions_do_not_blame_unrelated_criteria(name: str) -> None:
    transform, canary_use = REGRESSIONS[name]
    assert failed(run(transform(clean(seed=2)), canary_use)) == {name}


def test_refusals_count_as_style_drift() -> None:
    refuse = every(4, lambda s: replace(s, text="I'm sorry, but I cannot help with that."))
    a = run(refuse(clean(seed=2)))
    crit = a.criterion("style_drift")
    assert crit is not None and crit.verdict == "fail" and "refusal" in crit.reason


def test_noise_above_the_threshold_waits_instead_of_failing() -> None:
    base = clean(100, seed=1)
    canary = [RequestSample(500, 0.01) if i < 3 else s for i, s in enumerate(clean(100, seed=2))]
    a = analyze(base, canary, use(100), use(100), SPEC)
    crit = a.criterion("error_rate")
    assert crit is not None and crit.verdict == "wait"  # +3 points, but p = 0.04 > 0.01
    assert "not yet significant" in crit.reason and a.verdict == "wait"


@pytest.mark.parametrize(
    ("n_base", "n_canary"), [(0, 0), (0, N), (N, 0), (99, 400), (400, 99), (50, 50)]
)
def test_thin_data_waits_on_everything_even_for_a_broken_canary(n_base: int, n_canary: int) -> None:
    broken = [RequestSample(500, 9.0)] * n_canary
    for canary in (clean(n_canary, seed=2), broken):
        a = analyze(clean(n_base, seed=1), canary, use(n_base), use(n_canary), SPEC)
        assert a.verdict == "wait"
        assert {c.verdict for c in a.criteria} == {"wait"}
        assert "too few" in a.reason


@settings(max_examples=40, deadline=None)
@given(
    n_base=st.integers(0, 120),
    n_canary=st.integers(0, 120),
    error_share=st.floats(0, 1),
    slow=st.floats(0.1, 10),
)
def test_analysis_never_passes_below_min_samples(
    n_base: int, n_canary: int, error_share: float, slow: float
) -> None:
    spec = AnalysisSpec(min_samples=100)
    canary = [
        RequestSample(500 if i < error_share * n_canary else 200, 0.1 * slow)
        for i in range(n_canary)
    ]
    base = [RequestSample(200, 0.1) for _ in range(n_base)]
    a = analyze(base, canary, None, None, spec)
    if min(n_base, n_canary) < 100:
        assert a.verdict == "wait"
    else:
        assert a.verdict in ("pass", "fail", "wait")


def test_embeddings_skip_generation_criteria_but_still_judge_latency_and_errors() -> None:
    a = analyze(embeddings(seed=1), embeddings(seed=2), use(), use(), SPEC)
    assert a.verdict == "pass", a.reason
    verdicts = {c.name: c.verdict for c in a.criteria}
    for name in (
        "ttft_p95",
        "tpot_p50",
        "output_length",
        "empty_rate",
        "truncated_rate",
        "style_drift",
    ):
        assert verdicts[name] == "skip", name
    assert verdicts["error_rate"] == verdicts["latency_p95"] == "pass"
    slow = [replace(s, latency_s=s.latency_s * 2) for s in embeddings(seed=2)]
    assert "latency_p50" in failed(analyze(embeddings(seed=1), slow, use(), use(), SPEC))


def test_disabled_criteria_and_missing_resources_skip() -> None:
    transform, canary_use = REGRESSIONS["memory"]
    spec = AnalysisSpec(disable=["memory", "style_drift"])
    a = analyze(clean(seed=1), transform(clean(seed=2)), use(), canary_use, spec)
    assert a.verdict == "pass"
    assert a.criterion("memory") == Criterion("memory", "skip", "disabled in the rollout spec")
    a = analyze(clean(seed=1), clean(seed=2), None, None, SPEC)
    assert a.verdict == "pass" and verdict(a, "cpu_per_request") == "skip"
    a = analyze(clean(seed=1), clean(seed=2), use(memory_gb=None), use(memory_gb=None), SPEC)
    assert verdict(a, "memory") == "skip" and verdict(a, "cpu_per_request") == "pass"


def test_small_absolute_latency_growth_never_fails() -> None:
    fast = [replace(s, latency_s=0.001) for s in clean(seed=1)]
    slower = [replace(s, latency_s=0.002) for s in clean(seed=2)]  # x2, but only +1 ms
    a = analyze(fast, slower, use(), use(), SPEC)
    assert verdict(a, "latency_p50") == "pass"


def test_analysis_round_trips_through_json() -> None:
    transform, canary_use = REGRESSIONS["error_rate"]
    a = run(transform(clean(seed=2)), canary_use)
    text = json.dumps(a.to_json(), allow_nan=False)
    assert Analysis.from_json(json.loads(text)) == a


def test_samples_read_from_worker_rows() -> None:
    row = {"seq": 3, "at": 1.0, "model": "m", "status": 200, "latency_s": 0.5, "ttft_s": 0.1}
    row |= {"tpot_s": None, "output_tokens": 12, "finish_reason": "stop", "text": "Hi."}
    assert RequestSample.from_json(row) == RequestSample(200, 0.5, 0.1, None, 12, "stop", "Hi.")
    assert RequestSample.from_json({"status": 502, "latency_s": 0}) == RequestSample(502, 0.0)
