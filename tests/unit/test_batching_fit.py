"""Fitting the batching model's time parameters (sluice.policy.batching_fit): known
parameters come back from noisy synthetic points, the standard errors match the estimates'
actual scatter, what the points cannot tell apart is said, and degenerate inputs are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sluice.policy.batching_fit import (
    FitError,
    TpotPoint,
    TtftPoint,
    fit_batching,
    tpot_point,
)

BASE, PER_SEQ, PREFILL_TPS, OVERHEAD = 0.02, 0.005, 20_000.0, 0.004
OUT, SHORT = 32, 16
BATCHES = (1, 2, 4, 8)
PROMPTS = (128, 1024, 4096)


def synthetic(
    rng: np.random.Generator,
    noise: float = 0.03,
    per_kv: float = 0.0,
    per_level: int = 12,
    additive: bool = False,
) -> tuple[list[TpotPoint], list[TtftPoint]]:
    """A concurrency sweep at a short prompt and, at concurrency 1, three prompt lengths;
    every time off by a relative Gaussian error of `noise` (`additive`: of `noise` x 30 ms,
    the same for every point, as least squares' standard errors assume)."""

    def step(b: float, kv: float) -> float:
        return BASE + PER_SEQ * b + per_kv * kv

    def noisy(t: float) -> float:
        return t + noise * 0.03 * rng.normal() if additive else t * (1 + noise * rng.normal())

    tpot: list[TpotPoint] = []
    ttft: list[TtftPoint] = []
    for b in BATCHES:
        for _ in range(per_level):
            kv = b * (SHORT + OUT / 2)
            tpot.append(tpot_point(b, SHORT, OUT, noisy(step(b, kv))))
    for p in PROMPTS:
        for _ in range(per_level):
            kv = p + OUT / 2
            tpot.append(tpot_point(1, p, OUT, noisy(step(1, kv))))
            first = p / PREFILL_TPS + step(1, p) + OVERHEAD
            ttft.append(TtftPoint(p, noisy(first)))
    return tpot, ttft


def sweep(tpot: list[TpotPoint]) -> list[TpotPoint]:
    """The concurrency sweep's points alone (the short prompt): kv moves with b."""
    return [p for p in tpot if p.kv_tokens == p.batch * (SHORT + OUT / 2)]


def test_known_parameters_come_back_within_a_few_percent() -> None:
    fit = fit_batching(*synthetic(np.random.default_rng(7)))
    assert fit.step_base_s.value == pytest.approx(BASE, rel=0.03)
    assert fit.step_per_seq_s.value == pytest.approx(PER_SEQ, rel=0.03)
    assert fit.prefill_tps is not None
    assert fit.prefill_tps.value == pytest.approx(PREFILL_TPS, rel=0.05)
    # the intercept of TTFT is one step at b = 1 and the overhead
    assert fit.ttft_intercept_s.value == pytest.approx(BASE + PER_SEQ + OVERHEAD, rel=0.1)
    for est in (fit.step_base_s, fit.step_per_seq_s, fit.prefill_tps):
        assert est.stderr is not None and est.rel_err is not None
        assert 0 < est.rel_err < 0.05
    # the prompt lengths vary kv apart from b: identified, and not told apart from its true 0
    assert fit.kv_identified and "kept at 0" in fit.kv_note
    assert fit.step_per_kv_token_s.value == 0.0
    assert 0 < fit.tpot_rms_s < 0.01 and fit.tpot_r2 > 0.9
    doc = json.loads(json.dumps(fit.to_json()))  # plain JSON, no NaN or inf
    assert doc["params"]["step_base_s"] == fit.step_base_s.value
    assert doc["prefill_tps"]["rel_err"] == fit.prefill_tps.rel_err


def test_standard_errors_match_the_estimates_scatter() -> None:
    """Over many noisy repetitions (errors of equal variance, as least squares assumes;
    the sweep alone, so that every fit is the same two-parameter one), the spread of each
    estimate is what its standard error said (within a third), and about 95 % of +/- 2 SE
    intervals hold the truth."""
    rng = np.random.default_rng(11)
    fits = []
    for _ in range(200):
        tpot, ttft = synthetic(rng, per_level=6, additive=True)
        fits.append(fit_batching(sweep(tpot), ttft))
    for name, truth in (("step_base_s", BASE), ("step_per_seq_s", PER_SEQ)):
        values = np.array([getattr(f, name).value for f in fits])
        errors = np.array([getattr(f, name).stderr for f in fits])
        assert np.std(values) == pytest.approx(np.mean(errors), rel=0.33), name
        covered = np.mean(np.abs(values - truth) <= 2 * errors)
        assert covered > 0.88, (name, covered)
    slopes = np.array([f.prefill_s_per_token.value for f in fits])
    slope_se = np.array([f.prefill_s_per_token.stderr for f in fits])
    assert np.std(slopes) == pytest.approx(np.mean(slope_se), rel=0.33)
    # more noise, larger errors
    quiet = fit_batching(*synthetic(np.random.default_rng(3), noise=0.01))
    loud = fit_batching(*synthetic(np.random.default_rng(3), noise=0.05))
    assert quiet.step_per_seq_s.stderr is not None and loud.step_per_seq_s.stderr is not None
    assert loud.step_per_seq_s.stderr > 3 * quiet.step_per_seq_s.stderr


def test_a_real_kv_term_is_identified_and_fitted() -> None:
    per_kv = 2e-6  # 4096 tokens add 8 ms to a step
    fit = fit_batching(*synthetic(np.random.default_rng(5), noise=0.01, per_kv=per_kv))
    assert fit.kv_identified and fit.kv_note.startswith("identified")
    assert fit.step_per_kv_token_s.value == pytest.approx(per_kv, rel=0.15)
    assert fit.step_base_s.value == pytest.approx(BASE, rel=0.05)
    assert fit.step_per_seq_s.value == pytest.approx(PER_SEQ, rel=0.05)


def test_a_sweep_at_one_prompt_length_cannot_identify_the_kv_term() -> None:
    tpot, ttft = synthetic(np.random.default_rng(2))
    fit = fit_batching(sweep(tpot), ttft)
    assert not fit.kv_identified and fit.kv_note.startswith("not identified")
    assert fit.step_per_kv_token_s.value == 0.0 and fit.step_per_kv_token_s.stderr is None
    assert fit.step_per_seq_s.value == pytest.approx(PER_SEQ, rel=0.05)


def test_a_prefill_too_fast_to_see_is_not_identified() -> None:
    rng = np.random.default_rng(4)
    tpot, _ = synthetic(rng)
    flat = [TtftPoint(p, 0.03 * (1 + 0.05 * rng.normal())) for p in PROMPTS for _ in range(8)]
    fit = fit_batching(tpot, flat)
    assert fit.prefill_tps is None and "longer prompts" in fit.prefill_note
    assert fit.to_json()["params"]["prefill_tps"] is None


def test_degenerate_inputs_are_refused_with_what_to_measure() -> None:
    tpot, ttft = synthetic(np.random.default_rng(1))
    one_batch = [p for p in tpot if p.batch == 1]
    with pytest.raises(FitError, match=r"one batch size only.*two concurrencies"):
        fit_batching(one_batch, ttft)
    with pytest.raises(FitError, match="one prompt length only"):
        fit_batching(tpot, [TtftPoint(128, 0.03 + 0.001 * k) for k in range(5)])
    with pytest.raises(FitError, match="at least 3"):
        fit_batching([TpotPoint(1, 24, 0.025), TpotPoint(2, 48, 0.03)], ttft)
    with pytest.raises(FitError, match="finite"):
        fit_batching([*tpot, TpotPoint(2, 48, float("nan"))], ttft)
    with pytest.raises(FitError, match="negative"):
        fit_batching(tpot, [*ttft, TtftPoint(128, -0.1)])
    with pytest.raises(FitError):
        fit_batching([], [])


def test_reports_with_and_without_a_fit_are_read_and_judged() -> None:
    """A load test stored before `--fit` existed has no "fit" key: it still renders and is
    judged as before; a fit-only run is "fitted", a failed fit "inconclusive"."""
    from sluice.cli.capacity import _render_loadtest
    from sluice.tools.loadtest import stored_verdict

    knee = {"rate_rps": 40.0, "concurrency": 3.9, "latency_ms": 120.0, "limited_by": "slo"}
    old = {"group": "g", "version": "v1", "slo_ms": 800.0, "quantile": "p95", "steps": []}
    _render_loadtest({**old, "knee": knee, "recommendation": None})
    assert stored_verdict({**old, "knee": knee}) == "measured"
    assert stored_verdict({**old, "knee": None}) == "inconclusive"
    fitted = fit_batching(*synthetic(np.random.default_rng(9))).to_json()
    assert stored_verdict({"knee": None, "steps": [], "fit": fitted}) == "fitted"
    assert stored_verdict({"knee": None, "steps": [], "fit": {"error": "one"}}) == "inconclusive"


def test_what_one_streamed_answer_gives_the_fit() -> None:
    """One token a chunk: TPOT is the mean chunk gap; chunks of several tokens (usage says
    more tokens than chunks): first to last chunk over the tokens less one; the prompt's
    tokens from usage, else its words. The sweep's levels go by powers of two to the max."""
    from sluice.core import SpecError
    from sluice.tools.batchfit import FitOptions, _answer, fit_levels
    from sluice.tools.loadstats import Outcome

    gaps = (0.02, 0.03, 0.04)
    one = Outcome(0.0, 0.0, 0.2, 200, 0.11, gaps, 4, None, prompt_tokens=130)
    a = _answer(one, 128)
    assert a is not None and a.prompt_tokens == 130 and a.chunks == a.tokens == 4
    assert a.tpot_s == pytest.approx(0.03)
    several = Outcome(0.0, 0.0, 0.2, 200, 0.11, gaps, 10, None)  # 10 tokens in 4 chunks
    b = _answer(several, 128)
    assert b is not None and b.prompt_tokens == 128 and b.chunks == 4
    assert b.tpot_s == pytest.approx((0.2 - 0.11) / 9)
    assert _answer(Outcome(0.0, 0.0, 0.2, 500, None, (), None, "HTTP 500"), 128) is None
    assert fit_levels(FitOptions(), 8) == (1, 2, 4, 8)
    assert fit_levels(FitOptions(), 12) == (1, 2, 4, 8, 12)
    assert fit_levels(FitOptions(), 1) == (1,)  # one slot: no batch to fit (FitError says so)
    assert fit_levels(FitOptions(levels=(4, 1, 4, 2)), 64) == (1, 2, 4)
    with pytest.raises(SpecError, match="two distinct"):
        FitOptions(prompts=(128, 128))
