"""Two-sample significance tests for canary analysis, in numpy alone (no scipy):
Kolmogorov-Smirnov with the Kolmogorov distribution, a two-proportion z-test, and
distribution-free confidence bounds of quantiles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "kolmogorov_sf",
    "ks_two_sample",
    "normal_upper_quantile",
    "quantile_bounds",
    "two_proportion_p",
]


def kolmogorov_sf(x: float) -> float:
    """P(K > x) for the Kolmogorov distribution (limit of sqrt(n) x KS statistic).

    Two series, each used where it converges in a few terms: for x < 1.18 the Jacobi-theta
    form of the CDF, sqrt(2 pi)/x sum exp(-(2j-1)^2 pi^2 / (8 x^2)); above, the alternating
    tail 2 sum (-1)^(j-1) exp(-2 j^2 x^2). Both agree to 1e-12 at the switch."""
    if x <= 0.0:
        return 1.0
    if x < 1.18:
        k = math.pi**2 / (8.0 * x * x)
        cdf = (
            math.sqrt(2.0 * math.pi)
            / x
            * sum(math.exp(-((2 * j - 1) ** 2) * k) for j in (1, 2, 3, 4, 5, 6))
        )
        return min(1.0, max(0.0, 1.0 - cdf))
    tail = 0.0
    for j in range(1, 101):
        term = math.exp(-2.0 * j * j * x * x)
        tail += term if j % 2 else -term
        if term < 1e-16:
            break
    return min(1.0, max(0.0, 2.0 * tail))


def ks_two_sample(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov: (D, asymptotic two-sided p-value).

    D = max |F_a(x) - F_b(x)| over both samples' points (ties handled: CDFs are taken right
    after each value). p uses the effective size n_e = n m / (n + m) with Stephens' small-n
    correction, lambda = (sqrt(n_e) + 0.12 + 0.11 / sqrt(n_e)) D (Numerical Recipes 14.3).
    An empty side gives (0.0, 1.0): no evidence either way (callers gate on size first)."""
    if len(a) == 0 or len(b) == 0:
        return 0.0, 1.0
    xa = np.sort(np.asarray(a, dtype=float))
    xb = np.sort(np.asarray(b, dtype=float))
    points = np.concatenate([xa, xb])
    fa = np.searchsorted(xa, points, side="right") / xa.size
    fb = np.searchsorted(xb, points, side="right") / xb.size
    d = float(np.max(np.abs(fa - fb)))
    en = math.sqrt(xa.size * xb.size / (xa.size + xb.size))
    return d, kolmogorov_sf((en + 0.12 + 0.11 / en) * d)


def two_proportion_p(x_base: int, n_base: int, x_canary: int, n_canary: int) -> float:
    """One-sided pooled z-test p-value that the canary's rate exceeds the baseline's.
    pre: n_base, n_canary > 0. Identical or all-0 / all-1 rates give 1.0."""
    diff = x_canary / n_canary - x_base / n_base
    pooled = (x_base + x_canary) / (n_base + n_canary)
    se = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n_base + 1.0 / n_canary))
    if se == 0.0:
        return 1.0 if diff <= 0 else 0.0
    return 0.5 * math.erfc(diff / se / math.sqrt(2.0))


def normal_upper_quantile(alpha: float) -> float:
    """Upper normal quantile: P(Z > z) = alpha, by bisection on erfc (pure, no scipy)."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(mid / math.sqrt(2.0)) > alpha:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def quantile_bounds(values: np.ndarray[Any, Any], q: float, z: float) -> tuple[float, float]:
    """Distribution-free confidence bounds of the q-quantile from order statistics: ranks
    n q -/+ z sqrt(n q (1-q)) (normal approximation of the binomial count below it)."""
    xs = np.sort(values)
    n = xs.size
    half = z * math.sqrt(n * q * (1.0 - q))
    lo = min(n - 1, max(0, math.floor(n * q - half) - 1))
    hi = min(n - 1, max(0, math.ceil(n * q + half) - 1))
    return float(xs[lo]), float(xs[hi])
