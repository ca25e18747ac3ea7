"""Seeded trace families (issue 16): shape, determinism, rates, burstiness, token mixes, and a
simulation with the reference instance model."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from sluice.core.errors import NotFound
from sluice.policy.routing import PRIORITIES
from sluice.sim import (
    FAMILIES,
    Family,
    InstanceModel,
    generate,
    make_policy,
    pick_group,
    prepare,
    run,
    trace_from_rows,
)
from sluice.sim.families import MIXES, FlashCrowd, OnOff, Poisson
from sluice.spec import load_spec_file

REFERENCE = Path(__file__).parents[2] / "examples" / "reference-sim.yaml"
POISSON = [n for n, f in FAMILIES.items() if isinstance(f.arrivals, Poisson)]


def per_second(t: npt.NDArray[np.float64], duration_s: float) -> npt.NDArray[np.int64]:
    return np.bincount(np.floor(t).astype(np.int64), minlength=math.ceil(duration_s))


def dispersion(t: npt.NDArray[np.float64], duration_s: float) -> float:
    c = per_second(t, duration_s)
    return float(c.var() / c.mean())


def rate_in(t: npt.NDArray[np.float64], lo: float, hi: float) -> float:
    return float(np.count_nonzero((t >= lo) & (t < hi))) / (hi - lo)


def test_the_set_is_what_the_benchmark_expects() -> None:
    assert {"poisson-0.3", "poisson-1", "poisson-4", "poisson-16", "poisson-4-long"} <= set(POISSON)
    assert {"diurnal", "mmpp-onoff", "flash-crowd", "ramp"} <= set(FAMILIES)
    for name, f in FAMILIES.items():
        assert isinstance(f, Family) and f.name == name
        assert f.stationary == isinstance(f.arrivals, Poisson), name
        assert f.description and "\n" not in f.description
        assert 20 * 60 <= f.duration_s <= 2 * 3600
        assert f.mean_rate() * f.duration_s < 25_000, name


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_is_a_valid_sorted_trace_within_its_duration(name: str) -> None:
    f = FAMILIES[name]
    tr = generate(name)
    assert tr.name == f"family:{name}@seed0"
    assert len(tr) > 500
    assert tr.t.dtype == np.float64 and tr.t.flags.c_contiguous
    assert np.all(np.diff(tr.t) >= 0)
    assert tr.t[0] >= 0 and tr.t[-1] < f.duration_s
    for col, top in ((tr.input_tokens, f.mix.input_max), (tr.output_tokens, f.mix.output_max)):
        assert col.dtype == np.int64 and col.shape == tr.t.shape
        assert col.min() >= 1 and col.max() <= top
    # the defaults trace_from_rows gives: one model "", tenant "", priority normal
    ref = trace_from_rows([(float(tr.t[0]), 1, 1)])
    assert (tr.models, tr.tenants) == (ref.models, ref.tenants) == (("",), ("",))
    assert np.all(tr.model == 0) and np.all(tr.tenant == 0)
    assert np.all(tr.priority == ref.priority[0]) and PRIORITIES[ref.priority[0]] == "normal"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_same_seed_same_bytes_other_seed_other_trace(name: str) -> None:
    a, b, c = generate(name, 3), generate(name, 3), generate(name, 4)
    for col in ("t", "input_tokens", "output_tokens", "model", "priority", "tenant"):
        assert getattr(a, col).tobytes() == getattr(b, col).tobytes(), col
    assert a.name == b.name == f"family:{name}@seed3"
    assert len(a) != len(c) or not np.array_equal(a.t, c.t)
    assert not np.array_equal(a.input_tokens[:100], c.input_tokens[:100])


def test_families_draw_independent_streams() -> None:
    a, b = generate("poisson-4", 0), generate("poisson-4-long", 0)
    n = min(len(a), len(b))
    assert not np.allclose(a.t[:n], b.t[:n])


@pytest.mark.parametrize("name", POISSON)
def test_poisson_families_have_their_rate_and_poisson_dispersion(name: str) -> None:
    f = FAMILIES[name]
    assert isinstance(f.arrivals, Poisson)
    expected = f.arrivals.rate * f.duration_s
    for seed in range(4):
        tr = generate(name, seed)
        assert abs(len(tr) - expected) < 4 * math.sqrt(expected), (seed, len(tr))
        assert 0.8 <= dispersion(tr.t, f.duration_s) <= 1.25, seed
        gaps = np.diff(tr.t)  # exponential gaps: CV 1
        assert 0.9 < gaps.std() / gaps.mean() < 1.1


@pytest.mark.parametrize("name", ["diurnal", "flash-crowd", "ramp"])
def test_shaped_families_have_their_expected_count(name: str) -> None:
    f = FAMILIES[name]
    expected = f.mean_rate() * f.duration_s
    for seed in range(3):
        assert abs(len(generate(name, seed)) - expected) < 4 * math.sqrt(expected)


@pytest.mark.parametrize("name", ["mmpp-onoff", "flash-crowd"])
def test_bursty_families_are_overdispersed(name: str) -> None:
    f = FAMILIES[name]
    for seed in range(3):
        assert dispersion(generate(name, seed).t, f.duration_s) > 2.0


def test_mmpp_alternates_between_its_two_rates() -> None:
    f = FAMILIES["mmpp-onoff"]
    a = f.arrivals
    assert isinstance(a, OnOff)
    c = per_second(generate("mmpp-onoff", 0).t, f.duration_s)
    # 10-s windows: nearly all look like off (<= 3 req) or on (>= 100 req) or straddle a switch
    w = c[: c.shape[0] // 10 * 10].reshape(-1, 10).sum(axis=1)
    assert np.mean(w <= 15) > 0.5 and np.mean(w >= 120) > 0.1
    # the share of time "on" is near on_mean / (on_mean + off_mean) = 0.25 over many seeds
    counts = [len(generate("mmpp-onoff", s)) for s in range(30)]
    assert abs(np.mean(counts) / (a.mean_rate * f.duration_s) - 1) < 0.1


def test_diurnal_peak_quarter_is_far_above_the_trough_quarter() -> None:
    f = FAMILIES["diurnal"]
    tr = generate("diurnal", 0)
    p = 3600.0
    for k in range(2):  # each of the two days
        trough = (
            rate_in(tr.t, k * p, k * p + p / 8) + rate_in(tr.t, (k + 1) * p - p / 8, (k + 1) * p)
        ) / 2
        peak = rate_in(tr.t, k * p + 3 * p / 8, k * p + 5 * p / 8)
        assert peak > 3 * trough, (k, peak, trough)
        assert 4.5 < peak < 5.8 and 0.5 < trough < 1.3  # 3 x (1 +- 0.8 x 0.90)
    assert f.mean_rate() == pytest.approx(3.0, rel=1e-3)


def test_flash_crowd_holds_eight_times_the_base_then_returns() -> None:
    f = FAMILIES["flash-crowd"]
    a = f.arrivals
    assert isinstance(a, FlashCrowd)
    t0 = a.start_s(f.duration_s)
    assert t0 == pytest.approx(f.duration_s / 3)
    for seed in range(3):
        t = generate("flash-crowd", seed).t
        base = rate_in(t, 0, t0)
        hold = rate_in(t, t0 + a.rise_s, t0 + a.rise_s + a.hold_s)
        after = rate_in(t, t0 + a.rise_s + a.hold_s + a.decay_s, f.duration_s)
        assert 1.7 < base < 2.3 and 1.7 < after < 2.3
        assert 7.0 < hold / base < 9.0


def test_ramp_rises_then_falls() -> None:
    t = generate("ramp", 0).t
    start, top, end = rate_in(t, 0, 300), rate_in(t, 1650, 1950), rate_in(t, 3300, 3600)
    assert start < 2.5 and end < 2.5 and 10.5 < top < 13
    minutes = per_second(t, 3600).reshape(60, 60).sum(axis=1)
    assert np.corrcoef(np.arange(30), minutes[:30])[0, 1] > 0.95
    assert np.corrcoef(np.arange(30), minutes[30:])[0, 1] < -0.95


@pytest.mark.parametrize(
    ("name", "in_median", "out_median"),
    [("poisson-4", 314, 230), ("poisson-4-long", 11_587, 69), ("poisson-4-heavy", 314, 90)],
)
def test_token_mix_medians_match_their_targets(name: str, in_median: int, out_median: int) -> None:
    tr = generate(name, 0)
    assert np.median(tr.input_tokens) == pytest.approx(in_median, rel=0.15)
    assert np.median(tr.output_tokens) == pytest.approx(out_median, rel=0.15)


def test_token_mixes_fit_the_quoted_means() -> None:
    rng = np.random.default_rng(7)
    targets = {"short": (520, 277), "long": (15_325, 149), "heavy": (520, 277)}
    for name, (m_in, m_out) in targets.items():
        inp, out = MIXES[name].draw(rng, rng, 200_000)
        assert inp.mean() == pytest.approx(m_in, rel=0.05), name
        assert out.mean() == pytest.approx(m_out, rel=0.08), name
    assert MIXES["heavy"].output_sigma == 1.5
    assert MIXES["short"].input_sigma == pytest.approx(1.004, abs=1e-3)


def test_overrides_duration_and_rate_scale() -> None:
    short = generate("flash-crowd", 1, duration_s=600)
    assert short.name == "family:flash-crowd@seed1[600s]"
    assert short.t[-1] < 600
    scaled = generate("poisson-4", 1, rate_scale=2.5)
    assert scaled.name == "family:poisson-4@seed1[x2.5]"
    expected = 10.0 * 1800
    assert abs(len(scaled) - expected) < 4 * math.sqrt(expected)
    assert 0.8 <= dispersion(scaled.t, 1800) <= 1.25
    on = generate("mmpp-onoff", 1, rate_scale=0.5, duration_s=7200)
    assert on.t[-1] < 7200
    assert len(on) == pytest.approx(0.5 * 4.375 * 7200, rel=0.3)
    for bad in ({"duration_s": 0.0}, {"rate_scale": 0.0}, {"rate_scale": math.nan}):
        with pytest.raises(ValueError):
            generate("poisson-1", 0, **bad)


def test_unknown_family_names_the_known_ones() -> None:
    with pytest.raises(NotFound) as exc:
        generate("poisson-5")
    assert "poisson-5" in exc.value.message
    for name in FAMILIES:
        assert name in exc.value.message
    assert exc.value.detail["known"] == list(FAMILIES)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_generation_is_fast(name: str) -> None:
    t0 = time.perf_counter()
    generate(name, 11)
    assert time.perf_counter() - t0 < 1.0


def test_reference_model_prices_and_serves_every_request() -> None:
    spec = load_spec_file(REFERENCE).spec
    model = InstanceModel.from_spec(spec, pick_group(spec, None))
    tr = generate("mmpp-onoff", 0, duration_s=900)
    work = prepare(model, tr)
    expect = np.clip(0.05 + 0.0002 * tr.input_tokens + 0.02 * tr.output_tokens, 0.01, 30.0)
    np.testing.assert_allclose(work.service, expect)
    s = run(work, make_policy(model, None)).summary()
    assert s["requests"] == len(tr) > 1000
    assert s["completed"] + s["rejected"] + s["failed"] == len(tr)
    assert s["completed"] == len(tr)  # the reference queue never sheds and nothing crashes
    assert s["peak_instances"] > 1
