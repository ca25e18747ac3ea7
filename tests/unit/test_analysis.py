"""Canary analysis: the exact and sequential tests against scipy and known values, every
criterion fails on its own regression, noise and trivial effects pass, thin data waits and
never passes, planned looks, the fast path for gross failures, embeddings skip style."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from sluice.policy.analysis import (
    Analysis,
    Criterion,
    Prior,
    RequestSample,
    ResourceUse,
    analyze,
    style_features,
)
from sluice.policy.canary_plan import StepPlan
from sluice.policy.evidence import (
    Table,
    holm,
    ks_test,
    mh_difference,
    sprt_log_ratio,
    stratified_exact,
)
from sluice.spec.rollouts import CRITERIA, AnalysisSpec

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


# --- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "t", [(1, 120, 6, 30), (0, 60, 3, 15), (10, 1000, 30, 1000), (25, 5000, 5, 700), (0, 5, 0, 5)]
)
def test_one_stratum_is_fishers_exact_test(t: tuple[int, int, int, int]) -> None:
    hb, nb, hc, nc = t
    fisher = stats.fisher_exact([[hc, nc - hc], [hb, nb - hb]], alternative="greater")
    assert stratified_exact([Table(*t)]) == pytest.approx(fisher.pvalue, rel=1e-9, abs=1e-15)


def test_stratified_exact_is_calibrated_with_rare_events() -> None:
    """Three steps of 400 vs 100 answers at a 1% rate, no difference: a level-a test must
    reject at most a of the time (exact tests are conservative), unlike the z-test on 1-3
    events that the issue measured."""
    rng = np.random.default_rng(11)

    def step() -> Table:
        return Table(int(rng.binomial(400, 0.01)), 400, int(rng.binomial(100, 0.01)), 100)

    ps = np.array([stratified_exact([step(), step(), step()]) for _ in range(3000)])
    for a in (0.01, 0.05, 0.1):
        assert (ps <= a).mean() <= a


def test_strata_pool_evidence_and_keep_a_trend_from_faking_a_difference() -> None:
    one = Table(5, 500, 3, 100)  # 1% vs 3%: not much on its own
    assert stratified_exact([one]) > 0.05
    assert stratified_exact([one, one, one]) < stratified_exact([one]) / 5
    # A busy step with 10% errors on both sides, where the canary had more of the answers,
    # then a quiet one at 1%: pooled as one table the canary looks worse, by step it is not.
    busy, quiet = Table(40, 400, 40, 400), Table(16, 1600, 1, 100)
    merged = Table(56, 2000, 41, 500)
    assert stratified_exact([merged]) < 1e-6
    assert stratified_exact([busy, quiet]) > 0.3
    assert mh_difference([busy, quiet]) == pytest.approx(0.0, abs=1e-12)
    assert mh_difference([Table(10, 1000, 30, 1000)]) == pytest.approx(0.02)


def test_ks_test_is_scipys() -> None:
    rng = np.random.default_rng(7)
    a, b = rng.normal(size=500), rng.normal(size=500)
    d, p = ks_test(a.tolist(), b.tolist())
    assert (d, p) == pytest.approx(tuple(stats.ks_2samp(a, b)))
    assert d < 0.08 and p > 0.1
    d, p = ks_test(a.tolist(), (b + 0.5).tolist())
    assert d > 0.15 and p < 1e-6
    assert ks_test([], [1.0]) == (0.0, 1.0)


def test_holm_steps_down_and_stops_at_the_first_acceptance() -> None:
    levels = holm({"a": 0.001, "b": 0.02, "c": 0.2, "d": 0.0001}, 0.05)
    assert levels == {"d": 0.0125, "a": 0.05 / 3, "b": 0.025, "c": 0.05}
    # c fails its level, so b (p above c's) can no longer be rejected at all
    assert holm({"a": 0.001, "b": 0.04, "c": 0.03}, 0.05) == {"a": 0.05 / 3, "c": 0.025, "b": 0.0}
    assert holm({"a": 0.03, "b": 0.001}, 0.05) == {"b": 0.025, "a": 0.05}  # both rejected
    assert holm({}, 0.05) == {}


def test_sequential_ratio_crosses_rarely_under_the_null_however_often_it_is_read() -> None:
    """Read after every answer for 1,000 answers at the null rate: Ville's inequality says
    it reaches 1/alpha in at most alpha of the runs."""
    rng = np.random.default_rng(3)
    alpha, crossed = 0.05, 0
    for _ in range(2000):
        hits = np.cumsum(rng.random(1000) < 0.05)
        llr = [sprt_log_ratio(int(h), n + 1, 0.05, 0.2) for n, h in enumerate(hits)]
        crossed += max(llr) >= math.log(1 / alpha)
    assert crossed / 2000 <= alpha
    assert sprt_log_ratio(0, 0, 0.05, 0.2) == 0.0
    assert sprt_log_ratio(20, 20, 0.05, 0.2) == pytest.approx(20 * math.log(4))


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


def test_noise_is_no_evidence_and_passes() -> None:
    """+3 points on 100 answers (3 errors against none) is p = 0.12: the old z-test
    called it significant at 0.04; the exact test, at this look's level, passes it."""
    base = clean(100, seed=1)
    canary = [RequestSample(500, 0.01) if i < 3 else s for i, s in enumerate(clean(100, seed=2))]
    a = analyze(base, canary, use(100), use(100), SPEC)
    crit = a.criterion("error_rate")
    assert crit is not None and crit.verdict == "pass" and a.verdict == "pass"
    assert crit.p_value == pytest.approx(0.1231, abs=1e-3) and "would need p <=" in crit.reason


def test_a_significant_but_trivial_regression_passes() -> None:
    """At 5,000 answers a side, 1.0% vs 0.3% errors is significant, but a rise of 0.7
    points is under half of the +2 points worth catching: no rollback."""
    base = [RequestSample(500 if i % 300 == 0 else 200, 0.1) for i in range(5000)]
    canary = [RequestSample(500 if i % 100 == 0 else 200, 0.1) for i in range(5000)]
    crit = analyze(base, canary, None, None, SPEC).criterion("error_rate")
    assert crit is not None and crit.verdict == "pass" and crit.p_value is not None
    assert crit.p_value < 1e-4 and "under half the smallest regression" in crit.reason


@pytest.mark.parametrize(
    ("n_base", "n_canary"), [(0, 0), (0, N), (N, 0), (99, 400), (400, 99), (50, 50)]
)
def test_thin_data_waits_on_everything(n_base: int, n_canary: int) -> None:
    a = analyze(clean(n_base, seed=1), clean(n_canary, seed=2), use(n_base), use(n_canary), SPEC)
    assert a.verdict == "wait" and a.look == 0
    assert {c.verdict for c in a.criteria} == {"wait"}
    assert "too few" in a.reason


def test_a_broken_canary_on_thin_data_fails_fast_only_with_sequential_evidence() -> None:
    """The fast path needs the baseline shown healthy (~170 answers) and the canary shown
    failing; a canary answering nothing but 500s then fails on its 6th answer."""
    broken = [RequestSample(500, 9.0)] * 6
    a = analyze(clean(99, seed=1), broken, None, None, SPEC)
    assert a.verdict == "wait" and not a.fast  # 99 baseline answers prove nothing yet
    a = analyze(clean(200, seed=1), broken[:4], None, None, SPEC)
    assert a.verdict == "wait"  # 4 failures of 4 are e^5.5, short of 1/0.001
    a = analyze(clean(200, seed=1), broken, None, None, SPEC)
    assert a.verdict == "fail" and a.fast and a.look == 0
    crit = a.criterion("error_rate")
    assert crit is not None and crit.verdict == "fail" and crit.canary == 1.0
    assert "gross failure" in crit.reason and "6 of 6" in crit.reason
    assert {c.verdict for c in a.criteria if c.name != "error_rate"} == {"wait"}


def test_the_fast_path_counts_earlier_steps_and_spares_a_failing_baseline() -> None:
    broken = [RequestSample(500, 9.0)] * 3
    # the earlier steps: 300 healthy baseline answers, 3 canary failures of 3
    prior = Prior(fast=Table(0, 300, 3, 3))
    a = analyze(clean(50, seed=1), broken, None, None, SPEC, prior=prior)
    assert a.fast and "6 of 6" in a.reason and "0 of 350" in a.reason
    # the baseline fails 20% too: not the canary's doing, no gross failure
    sick = every(5, lambda s: RequestSample(500, 0.01))(clean(400, seed=1))
    canary = every(5, lambda s: RequestSample(500, 0.01))(clean(400, seed=2))
    assert not analyze(sick, canary, None, None, SPEC).fast
    # a 20%-failing canary beside a healthy baseline is caught, look or not
    a = analyze(clean(400, seed=1), canary[:60], None, None, SPEC)
    assert a.fast and a.look == 0


def test_planned_looks_are_taken_once_and_the_last_waits_for_the_hold() -> None:
    step = StepPlan(0, 1.0, 100, (25, 50, 100), (0.001, 0.001, 0.002))
    base, canary = clean(400, seed=1), clean(400, seed=2)
    a = analyze(base[:30], canary[:30], None, None, SPEC, step)
    assert (a.look, a.verdict, a.alpha, a.next_look) == (1, "wait", 0.001, 50)
    assert "look 1/3 failed nothing" in a.reason
    a = analyze(base[:30], canary[:30], None, None, SPEC, step, looks_done=1)
    assert a.look == 0 and "too few answers for look 2/3" in a.reason
    # enough for the last look, but the hold is not over: looks 2 is taken, with 1's alpha
    a = analyze(base, canary, None, None, SPEC, step, looks_done=0, final_ready=False)
    assert (a.look, a.verdict, a.alpha) == (2, "wait", 0.002)
    a = analyze(base, canary, None, None, SPEC, step, looks_done=2, final_ready=False)
    assert a.look == 0 and "waits for the hold" in a.reason
    a = analyze(base, canary, None, None, SPEC, step, looks_done=2)
    assert (a.look, a.verdict, a.alpha) == (3, "pass", 0.002)
    assert set(a.tables) >= {"fast", "error_rate", "latency_p95", "refusal"}


def test_earlier_steps_strata_are_pooled() -> None:
    """+2 points at 300 answers a side is not enough alone; with three earlier steps'
    tables like it, it is."""
    base = clean(300, seed=1)
    canary = every(50, lambda s: RequestSample(500, 0.01))(clean(300, seed=2))  # 6 of 300
    crit = analyze(base, canary, None, None, SPEC).criterion("error_rate")
    assert crit is not None and crit.verdict == "pass"
    prior = Prior(strata=({"error_rate": Table(0, 300, 6, 300)},) * 3)
    crit = analyze(base, canary, None, None, SPEC, prior=prior).criterion("error_rate")
    assert crit is not None and crit.verdict == "fail" and "pooled over 4 steps" in crit.reason


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
        assert a.verdict != "pass"
        assert a.verdict == "wait" or a.fast  # only gross failures decide on thin data
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
    want = RequestSample(200, 0.5, 0.1, None, 12, "stop", "Hi.", arrived_at=0.5)
    assert RequestSample.from_json(row) == want  # arrived: finished at 1.0 after 0.5 s
    assert RequestSample.from_json({"status": 502, "latency_s": 0}) == RequestSample(502, 0.0)


def test_cpu_per_request_is_compared_only_at_matching_per_instance_load() -> None:
    """Idle CPU (probes, polls, GC) is spent per second, not per request: at a 20% step with
    equal instance counts a good canary looks ~2x costlier per request, so the gate waits for
    loads within LOAD_MATCH; at matching load a real 2x regression still fails it."""
    from sluice.policy.criteria import LOAD_MATCH, _resources

    idle_per_s, per_request, seconds = 0.003, 0.001, 600.0

    def side(rate_per_instance: float, instances: int, cost: float) -> ResourceUse:
        n = int(rate_per_instance * instances * seconds)
        cpu = n * cost + idle_per_s * instances * seconds
        return ResourceUse(n, cpu, instance_s=instances * seconds)

    base, good_light = side(8.0, 2, per_request), side(2.0, 2, per_request)
    [cpu, _] = _resources(base, good_light, SPEC)
    assert cpu.skip is not None and "load differs x4.0" in cpu.skip
    bad_even = side(8.0 / LOAD_MATCH**0.5, 2, 2 * per_request)
    [cpu, _] = _resources(base, bad_even, SPEC)
    assert cpu.skip is None and cpu.act, cpu.text
    [cpu, _] = _resources(base, side(8.0, 2, per_request), SPEC)
    assert cpu.skip is None and not cpu.act


def test_the_100_percent_step_judges_no_timing_against_an_earlier_windows_baseline() -> None:
    """With the baseline's answers from the step before, a slower canary is no evidence (the
    load and the machine changed between the windows); its errors and lengths still are."""
    slow = [
        replace(s, latency_s=s.latency_s * 1.6, tpot_s=(s.tpot_s or 0) * 1.5) for s in clean(seed=2)
    ]
    assert {"latency_p50", "tpot_p50"} <= failed(run(slow))  # side by side: caught
    a = analyze(clean(seed=1), slow, use(), use(), SPEC, baseline_reused=True)
    assert a.verdict == "pass", a.reason
    for name in ("latency_p50", "latency_p95", "ttft_p95", "tpot_p50"):
        crit = a.criterion(name)
        assert crit is not None and crit.verdict == "skip" and "step before's" in crit.reason
    assert "not observed by the samples' source" not in a.reason
    cut = [replace(s, output_tokens=max(1, (s.output_tokens or 0) // 2)) for s in slow]
    a = analyze(clean(seed=1), cut, use(), use(), SPEC, baseline_reused=True)
    assert failed(a) == {"output_length"}, a.reason
