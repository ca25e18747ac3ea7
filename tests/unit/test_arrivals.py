"""Open-loop arrival schedules (O4/O5): shapes, Poisson and evenly spaced times."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from sluice.policy.arrivals import (
    MAX_ARRIVALS,
    RateShape,
    constant,
    peak_shape,
    poisson_times,
    uniform_times,
)

STEP = peak_shape(10, 50, shape="step", warm_s=20, ramp_s=99, hold_s=30, cool_s=10)
RAMP = peak_shape(10, 50, shape="ramp", warm_s=20, ramp_s=10, hold_s=30, cool_s=10)


def cumulative(shape: RateShape, t: np.ndarray) -> np.ndarray:
    """Λ(t) by brute force on a fine grid of rate_at, independent of the module's algebra."""
    grid = np.linspace(0.0, shape.duration_s, 200_001)
    rates = np.array([shape.rate_at(x) for x in grid])
    cum = np.concatenate(([0.0], np.cumsum(np.diff(grid) * (rates[:-1] + rates[1:]) / 2)))
    out: np.ndarray = np.interp(t, grid, cum)
    return out


def test_constant_shape_boundaries() -> None:
    c = constant(4.0, 10.0)
    assert c.duration_s == 10.0 and c.peak_rps() == 4.0
    assert c.expected_requests() == pytest.approx(40.0)
    assert c.rate_at(0.0) == 4.0 and c.rate_at(9.999) == 4.0
    assert c.rate_at(10.0) == 0.0 and c.rate_at(-0.1) == 0.0


def test_step_peak_is_instant_at_both_edges_and_ignores_ramp() -> None:
    assert STEP.duration_s == 60.0 and STEP.peak_rps() == 50.0
    assert STEP.rate_at(19.999) == 10.0 and STEP.rate_at(20.0) == 50.0
    assert STEP.rate_at(49.999) == 50.0 and STEP.rate_at(50.0) == 10.0
    assert STEP.expected_requests() == pytest.approx(20 * 10 + 30 * 50 + 10 * 10)
    other = peak_shape(10, 50, shape="step", warm_s=20, ramp_s=0, hold_s=30, cool_s=10)
    assert other == STEP


def test_ramp_peak_is_linear_over_ramp_s() -> None:
    assert RAMP.duration_s == 70.0
    assert RAMP.rate_at(20.0) == 10.0 and RAMP.rate_at(25.0) == pytest.approx(30.0)
    assert RAMP.rate_at(30.0) == 50.0 and RAMP.rate_at(59.999) == 50.0
    assert RAMP.rate_at(60.0) == 10.0
    assert RAMP.expected_requests() == pytest.approx(200 + 300 + 1500 + 100)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: constant(-1, 10), "rps"),
        (lambda: constant(1, 0), "seconds"),
        (lambda: constant(float("nan"), 1), "rps"),
        (lambda: peak_shape(10, 5, shape="step", warm_s=1, ramp_s=0, hold_s=1, cool_s=0), "peak"),
        (lambda: peak_shape(1, 5, shape="spike", warm_s=1, ramp_s=0, hold_s=1, cool_s=0), "shape"),  # type: ignore[arg-type]
        (lambda: peak_shape(1, 5, shape="ramp", warm_s=-1, ramp_s=0, hold_s=1, cool_s=0), "warm_s"),
        (lambda: peak_shape(1, 5, shape="ramp", warm_s=1, ramp_s=-2, hold_s=1, cool_s=0), "ramp_s"),
        (lambda: peak_shape(1, 5, shape="step", warm_s=1, ramp_s=0, hold_s=0, cool_s=0), "hold_s"),
        (lambda: RateShape(((1.0, 1.0), (2.0, 1.0))), "t_s=0"),
        (lambda: RateShape(((0.0, 1.0), (2.0, 1.0), (1.0, 1.0))), "decrease"),
        (lambda: RateShape(((0.0, -1.0), (2.0, 1.0))), "rps >= 0"),
        (lambda: RateShape(((0.0, 1.0),)), "at least 2"),
    ],
)
def test_bad_arguments_are_value_errors_naming_the_argument(call: object, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        call()  # type: ignore[operator]


@pytest.mark.parametrize("shape", [constant(200, 20), STEP, RAMP])
def test_poisson_counts_are_within_statistical_bounds_of_the_integral(shape: RateShape) -> None:
    mean = shape.expected_requests()
    counts = np.array([poisson_times(shape, seed).size for seed in range(30)])
    # each count within 4 sd; the mean of 30 within 4 sd of the mean
    assert np.all(np.abs(counts - mean) < 4 * np.sqrt(mean))
    assert abs(counts.mean() - mean) < 4 * np.sqrt(mean / 30)


@pytest.mark.parametrize("shape", [constant(200, 20), STEP, RAMP])
def test_poisson_times_follow_the_shape(shape: RateShape) -> None:
    """Λ(t)/Λ(end) of the arrivals is uniform iff their density follows the rate."""
    t = poisson_times(shape, seed=7)
    u = cumulative(shape, t) / shape.expected_requests()
    assert stats.kstest(u, "uniform").pvalue > 0.001


def test_poisson_segment_counts_match_each_piece() -> None:
    t = poisson_times(STEP, seed=3)
    for lo, hi, mean in ((0, 20, 200), (20, 50, 1500), (50, 60, 100)):
        n = np.count_nonzero((t >= lo) & (t < hi))
        assert abs(n - mean) < 4 * np.sqrt(mean)


def test_poisson_is_seeded_and_zero_rate_gives_none() -> None:
    a, b = poisson_times(RAMP, 5), poisson_times(RAMP, 5)
    assert np.array_equal(a, b) and not np.array_equal(a, poisson_times(RAMP, 6))
    assert a.dtype == np.float64
    assert poisson_times(constant(0, 100), 1).size == 0
    gap = RateShape(((0.0, 0.0), (10.0, 0.0), (10.0, 100.0), (20.0, 100.0)))
    t = poisson_times(gap, 2)
    assert t.size > 0 and t.min() >= 10.0


def test_poisson_handles_many_arrivals_fast() -> None:
    began = time.perf_counter()
    t = poisson_times(constant(100_000, 3), seed=1)
    assert time.perf_counter() - began < 1.0
    assert abs(t.size - 300_000) < 4 * np.sqrt(300_000)
    assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] < 3


def test_too_many_arrivals_are_refused_before_allocating() -> None:
    with pytest.raises(ValueError, match="shape"):
        poisson_times(constant(MAX_ARRIVALS, 2), seed=0)
    with pytest.raises(ValueError, match="limit"):
        uniform_times(constant(MAX_ARRIVALS, 2))


def test_uniform_times_are_centred_in_each_slot() -> None:
    assert np.allclose(uniform_times(constant(2, 3)), [0.25, 0.75, 1.25, 1.75, 2.25, 2.75])
    t = uniform_times(RAMP)
    assert t.size == 2100
    k = np.arange(1, t.size + 1)
    assert np.allclose(cumulative(RAMP, t), k - 0.5, atol=1e-3)
    assert uniform_times(constant(0, 5)).size == 0


pieces = st.lists(st.tuples(st.floats(0.0, 20.0), st.floats(0.0, 300.0)), min_size=1, max_size=6)


def shape_of(steps: list[tuple[float, float]], first: float) -> RateShape:
    pts = [(0.0, first)]
    for dt, r in steps:
        pts.append((pts[-1][0] + dt, r))
    if pts[-1][0] <= 0:
        pts.append((1.0, first))
    return RateShape(tuple(pts))


@settings(max_examples=60, deadline=None)
@given(pieces, st.floats(0.0, 300.0), st.integers(0, 2**32 - 1))
def test_any_shape_gives_sorted_times_inside_the_run(
    steps: list[tuple[float, float]], first: float, seed: int
) -> None:
    shape = shape_of(steps, first)
    for t in (poisson_times(shape, seed), uniform_times(shape)):
        assert t.dtype == np.float64
        assert np.all(np.diff(t) >= 0)
        assert t.size == 0 or (t[0] >= 0 and t[-1] < shape.duration_s)
    # the k-th arrival sits at Λ = k - 0.5: all k with k - 0.5 < Λ(end)
    assert uniform_times(shape).size == int(np.ceil(shape.expected_requests() + 0.5)) - 1
