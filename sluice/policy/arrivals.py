"""Open-loop arrival schedules (O4 capacity steps, O5 peak drills): the offered rate over
time as a piecewise-linear curve, and the request times it yields.

Open loop means the times are fixed before the run: a slow group does not slow the client
down, so a saturated group shows as a growing queue rather than as a lower offered rate.
Both schedules invert the cumulative rate Λ(t), so they cost O(n) in the requests (plus a
search over the curve's few segments) and a zero rate gives no requests.

Pure: the randomness is a seeded `numpy.random.default_rng`; no clock is read.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_ARRIVALS",
    "RateShape",
    "constant",
    "peak_shape",
    "poisson_times",
    "uniform_times",
]

MAX_ARRIVALS = 20_000_000
"""More expected requests than this are refused before any array is allocated: 2e7 times
are 160 MB, and the run that sends them keeps an answer for each (likely a typo'd rate)."""

Times = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class RateShape:
    """Offered rate over time as a piecewise-linear curve: points (t_s, rps), t ascending from
    0; the rate between points is linear, after the last point the run ends. Two points at the
    same t make an instant step (the rate at that t is the later point's)."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        pts = self.points
        if len(pts) < 2:
            raise ValueError(f"points: need at least 2 (t_s, rps) points, got {len(pts)}")
        if pts[0][0] != 0:
            raise ValueError(f"points: the first point must be at t_s=0, got {pts[0][0]}")
        for i, (t, r) in enumerate(pts):
            if not (math.isfinite(t) and math.isfinite(r)) or r < 0:
                raise ValueError(f"points[{i}]: t_s and rps must be finite, rps >= 0: {(t, r)}")
            if i and t < pts[i - 1][0]:
                raise ValueError(f"points[{i}]: t_s must not decrease ({pts[i - 1][0]} -> {t})")
        if pts[-1][0] <= 0:
            raise ValueError("points: the last point's t_s (the duration) must be > 0")

    @property
    def duration_s(self) -> float:
        return float(self.points[-1][0])

    def rate_at(self, t: float) -> float:
        """The offered rate at `t` (0 before the start and from the end on)."""
        if t < 0 or t >= self.duration_s:
            return 0.0
        ts = [p[0] for p in self.points]
        i = bisect.bisect_right(ts, t) - 1
        (t0, r0), (t1, r1) = self.points[i], self.points[i + 1]
        return float(r0 + (r1 - r0) * (t - t0) / (t1 - t0))

    def expected_requests(self) -> float:
        """Λ(duration): the integral of the rate, i.e. the mean request count."""
        return float(_cumulative(self)[-1])

    def peak_rps(self) -> float:
        return float(max(r for _, r in self.points))


def constant(rps: float, seconds: float) -> RateShape:
    """`rps` for `seconds`: one step of a capacity test."""
    if not math.isfinite(rps) or rps < 0:
        raise ValueError(f"rps must be a finite number >= 0, got {rps}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    return RateShape(((0.0, float(rps)), (float(seconds), float(rps))))


def peak_shape(
    base_rps: float,
    peak_rps: float,
    *,
    shape: Literal["step", "ramp"],
    warm_s: float,
    ramp_s: float,
    hold_s: float,
    cool_s: float,
) -> RateShape:
    """A drill's peak: `base_rps` for `warm_s`, then up to `peak_rps` (instantly for "step",
    linearly over `ramp_s` for "ramp"; "step" ignores `ramp_s`), `peak_rps` for `hold_s`, then
    back to base at once for `cool_s` (the drop is instant so the scale-down starts at a
    known time)."""
    for name, value in (("base_rps", base_rps), ("peak_rps", peak_rps)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    if peak_rps < base_rps:
        raise ValueError(f"peak_rps ({peak_rps}) must be >= base_rps ({base_rps})")
    if shape not in ("step", "ramp"):
        raise ValueError(f"shape must be 'step' or 'ramp', got {shape!r}")
    for name, value in (("warm_s", warm_s), ("ramp_s", ramp_s), ("cool_s", cool_s)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    if not math.isfinite(hold_s) or hold_s <= 0:
        raise ValueError(f"hold_s must be > 0, got {hold_s}")
    top = warm_s + (ramp_s if shape == "ramp" else 0.0)
    end = top + hold_s
    pts = [(0.0, base_rps), (warm_s, base_rps), (top, peak_rps), (end, peak_rps)]
    if cool_s > 0:
        pts += [(end, base_rps), (end + cool_s, base_rps)]
    return RateShape(tuple((float(t), float(r)) for t, r in pts))


def poisson_times(shape: RateShape, seed: int) -> Times:
    """Non-homogeneous Poisson arrivals for `shape`: sorted float64 seconds in
    [0, duration). The count is Poisson(Λ); given the count, the unit-rate times are uniform
    order statistics, drawn in O(n) as normalised cumulative sums of exponentials (no sort),
    then mapped through Λ⁻¹. Seeded: the same shape and seed give the same times."""
    total = _checked_total(shape)
    rng = np.random.default_rng(seed)
    n = int(rng.poisson(total))
    if n == 0:
        return np.empty(0, dtype=np.float64)
    sums = np.cumsum(rng.exponential(1.0, n + 1))
    return _invert(shape, sums[:-1] * (total / sums[-1]))


def uniform_times(shape: RateShape) -> Times:
    """Deterministic arrivals evenly spaced in Λ: the k-th (k = 1, 2, ...) at Λ⁻¹(k - 0.5),
    so constant rate r gives 1/r spacing centred in each slot: reproducible tests and drills
    without Poisson noise."""
    total = _checked_total(shape)
    levels = np.arange(0.5, total, 1.0, dtype=np.float64)
    return _invert(shape, levels)


def _checked_total(shape: RateShape) -> float:
    total = shape.expected_requests()
    if total > MAX_ARRIVALS:
        raise ValueError(
            f"shape: {total:.3g} expected requests, over the {MAX_ARRIVALS:,} limit "
            "(lower the rate or the duration)"
        )
    return total


def _cumulative(shape: RateShape) -> Times:
    """Λ at each point of `shape` (trapezoids of the linear pieces)."""
    t = np.array([p[0] for p in shape.points], dtype=np.float64)
    r = np.array([p[1] for p in shape.points], dtype=np.float64)
    areas = np.diff(t) * (r[:-1] + r[1:]) / 2.0
    return np.concatenate(([0.0], np.cumsum(areas)))


def _invert(shape: RateShape, levels: Times) -> Times:
    """Λ⁻¹ of ascending `levels` in [0, Λ(duration)). On a piece starting at t0 with rate a
    and slope b, Λ(t0 + τ) - Λ(t0) = aτ + bτ²/2 = y; τ = 2y / (a + sqrt(a² + 2by)) is that
    root in a form that neither cancels nor divides by zero when b = 0 or a = 0."""
    t = np.array([p[0] for p in shape.points], dtype=np.float64)
    r = np.array([p[1] for p in shape.points], dtype=np.float64)
    cum = _cumulative(shape)
    # side="right" skips pieces with no area (zero rate, or an instant step)
    seg = np.searchsorted(cum, levels, side="right") - 1
    seg = np.clip(seg, 0, len(t) - 2)
    t0, t1 = t[seg], t[seg + 1]
    a = r[seg]
    width = t1 - t0
    b = np.divide(r[seg + 1] - a, width, out=np.zeros_like(a), where=width > 0)
    y = levels - cum[seg]
    denom = a + np.sqrt(np.maximum(a * a + 2.0 * b * y, 0.0))
    tau = np.divide(2.0 * y, denom, out=np.zeros_like(y), where=denom > 0)
    out = np.clip(t0 + tau, t0, t1)
    # rounding may nudge a time a ulp backwards or onto the end: keep the promise
    out = np.maximum.accumulate(out)
    return np.minimum(out, np.nextafter(shape.duration_s, 0.0))
