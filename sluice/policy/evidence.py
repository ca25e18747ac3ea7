"""The tests canary analysis decides with, valid at any sample size: exact (Fisher) tests of
2x2 tables stratified by step (each stratum `scipy.stats.hypergeom`), two-sample
Kolmogorov-Smirnov (scipy), Holm's step-down procedure, and Wald's sequential probability
ratio for the fast path. Pure functions.

What is written here is what the libraries do not have or cost too much for: the
convolution of strata (the exact Cochran-Mantel-Haenszel law; scipy's `fisher_exact` takes
one table), the Mantel-Haenszel difference, the SPRT's log ratio (one line) and Holm (see
`holm`: statsmodels is its test's oracle)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = [
    "Table",
    "holm",
    "ks_test",
    "mh_difference",
    "sprt_log_ratio",
    "stratified_exact",
]

_TAIL = 60.0
"""Log-probability below a stratum's mode that is dropped (e^-60: no p-value notices it)."""


@dataclass(frozen=True, slots=True)
class Table:
    """One stratum's 2x2 table: hits (errors, empty answers, answers above a quantile, ...)
    among the baseline's `n_base` and the canary's `n_canary` answers."""

    hits_base: int
    n_base: int
    hits_canary: int
    n_canary: int

    def to_json(self) -> list[int]:
        return [self.hits_base, self.n_base, self.hits_canary, self.n_canary]

    @classmethod
    def from_json(cls, row: Sequence[int]) -> Table:
        hb, nb, hc, nc = (int(x) for x in row)
        return cls(hb, nb, hc, nc)


def _log_pmf(t: Table) -> tuple[int, np.ndarray]:
    """(first support point, log pmf) of the canary's hits given the table's margins: the
    hypergeometric law of an exchangeable split (`n_canary` drawn from `total` answers of
    which `hits` are hits), over its whole support."""
    total = t.n_base + t.n_canary
    hits = t.hits_base + t.hits_canary
    lo, hi = max(0, t.n_canary + hits - total), min(hits, t.n_canary)
    k = np.arange(lo, hi + 1)
    return lo, np.asarray(stats.hypergeom.logpmf(k, total, hits, t.n_canary), dtype=float)


def stratified_exact(tables: Sequence[Table]) -> float:
    """One-sided exact p-value that the canary has more hits than the baseline, pooling
    strata: P(T >= t) for T the sum of the canary's hits, each stratum hypergeometric given
    its margins when canary and baseline do not differ (the exact form of the Cochran-
    Mantel-Haenszel test; one stratum is Fisher's exact test). Strata keep a time trend
    (a busy hour in one step) from looking like a difference. 1.0 without data."""
    used = [t for t in tables if t.n_base > 0 and t.n_canary > 0]
    if not used:
        return 1.0
    offset, dist = 0, np.ones(1)
    for t in used:
        lo, lp = _log_pmf(t)
        keep = lp >= lp.max() - _TAIL
        first = int(np.argmax(keep))
        last = len(keep) - int(np.argmax(keep[::-1]))
        pmf = np.exp(lp[first:last])
        dist = np.convolve(dist, pmf)
        offset += lo + first
    observed = sum(t.hits_canary for t in used)
    i = observed - offset
    if i <= 0:
        return 1.0
    if i >= len(dist):
        return 0.0
    return float(min(1.0, dist[i:].sum() / dist.sum()))


def mh_difference(tables: Sequence[Table]) -> float:
    """The Mantel-Haenszel estimate of canary minus baseline hit rate over strata: each
    stratum's difference weighted by n_b n_c / (n_b + n_c). 0.0 without data."""
    num = den = 0.0
    for t in tables:
        if t.n_base <= 0 or t.n_canary <= 0:
            continue
        w = t.n_base * t.n_canary / (t.n_base + t.n_canary)
        num += w * (t.hits_canary / t.n_canary - t.hits_base / t.n_base)
        den += w
    return num / den if den > 0 else 0.0


def ks_test(base: Sequence[float], canary: Sequence[float]) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov (D, two-sided p) from scipy: exact for small samples,
    the asymptotic Kolmogorov law otherwise; ties (token counts) make it conservative.
    An empty side gives (0.0, 1.0)."""
    if len(base) == 0 or len(canary) == 0:
        return 0.0, 1.0
    res = stats.ks_2samp(np.asarray(base, dtype=float), np.asarray(canary, dtype=float))
    return float(res.statistic), float(res.pvalue)


def holm(p_values: Mapping[str, float], alpha: float) -> dict[str, float]:
    """Holm's step-down procedure: each hypothesis' threshold, alpha / m for the smallest p,
    alpha / (m - 1) for the next, ... A hypothesis is rejected when its p is at most its
    threshold and every smaller p was rejected too; thresholds after the first acceptance
    are 0.0 (not rejectable). The chance of any false rejection is at most alpha.

    Written here, not statsmodels' `multipletests(method="holm")` (the test's oracle, same
    levels on random inputs): that import brings pandas, +29.5 MB in the controller at its
    first look (the 10-minute soak's RSS slope went from ~1 to 3.3 MB/min on that step), and
    every call runs a full `gc.collect()` (17 ms in a bare process), for a six-line loop."""
    order = sorted(p_values, key=lambda k: p_values[k])
    m = len(order)
    out: dict[str, float] = {}
    open_ = True
    for i, name in enumerate(order):
        thr = alpha / (m - i) if open_ else 0.0
        if p_values[name] > thr:
            open_ = False
        out[name] = thr
    return out


def sprt_log_ratio(hits: int, n: int, p0: float, p1: float) -> float:
    """log of Wald's likelihood ratio for Bernoulli rate p1 against p0 after `hits` of `n`.
    For p0 < p1 it is a supermartingale under any rate <= p0 (and for p0 > p1 under any
    rate >= p0), so by Ville's inequality it ever reaches log(1/alpha) with probability at
    most alpha, however often it is read."""
    if n <= 0:
        return 0.0
    return hits * math.log(p1 / p0) + (n - hits) * math.log((1 - p1) / (1 - p0))
