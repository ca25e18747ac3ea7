"""The statistics of `sluice.policy.evidence` moved to libraries (issue 37): Holm to
statsmodels' `multipletests`, each stratum's hypergeometric law to `scipy.stats.hypergeom`.
The hand-written versions they replaced are kept here as oracles, and random inputs must
give the same answers: the same thresholds exactly (ties too), the same p-values to
rounding."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special

from sluice.policy.evidence import Table, holm, stratified_exact

_TAIL = 60.0


def holm_by_hand(p_values: Mapping[str, float], alpha: float) -> dict[str, float]:
    """The step-down loop `holm` was before statsmodels."""
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


def _log_pmf_by_gammaln(t: Table) -> tuple[int, np.ndarray]:
    total = t.n_base + t.n_canary
    hits = t.hits_base + t.hits_canary
    lo, hi = max(0, t.n_canary + hits - total), min(hits, t.n_canary)
    k = np.arange(lo, hi + 1, dtype=float)

    def lchoose(n: float, r: np.ndarray | float) -> np.ndarray:
        return np.asarray(
            special.gammaln(n + 1) - special.gammaln(r + 1) - special.gammaln(n - r + 1)
        )

    lp = lchoose(hits, k) + lchoose(total - hits, t.n_canary - k) - lchoose(total, t.n_canary)
    return lo, lp


def stratified_exact_by_gammaln(tables: Sequence[Table]) -> float:
    """`stratified_exact` as it was, strata from log-gamma."""
    used = [t for t in tables if t.n_base > 0 and t.n_canary > 0]
    if not used:
        return 1.0
    offset, dist = 0, np.ones(1)
    for t in used:
        lo, lp = _log_pmf_by_gammaln(t)
        keep = lp >= lp.max() - _TAIL
        first = int(np.argmax(keep))
        last = len(keep) - int(np.argmax(keep[::-1]))
        dist = np.convolve(dist, np.exp(lp[first:last]))
        offset += lo + first
    i = sum(t.hits_canary for t in used) - offset
    if i <= 0:
        return 1.0
    if i >= len(dist):
        return 0.0
    return float(min(1.0, dist[i:].sum() / dist.sum()))


# p-values as analysis makes them, with ties and the boundaries alpha / k hit exactly
_P = st.one_of(
    st.floats(0.0, 1.0),
    st.sampled_from([0.0, 1e-300, 0.0125, 0.05 / 3, 0.025, 0.05, 0.1, 1.0]),
)
_ALPHA = st.sampled_from([0.05, 0.01, 0.1, 0.025, 1e-4, 0.5])


@settings(max_examples=80, deadline=None)  # each call runs gc.collect() (statsmodels' own)
@given(ps=st.lists(_P, max_size=12), alpha=st.one_of(_ALPHA, st.floats(1e-6, 1.0)))
def test_holm_from_statsmodels_is_the_hand_written_step_down(ps: list[float], alpha: float) -> None:
    p_values = {f"c{i}": p for i, p in enumerate(ps)}
    new, old = holm(p_values, alpha), holm_by_hand(p_values, alpha)
    assert new == old and list(new) == list(old)  # same levels, in the same order


@st.composite
def _table(draw: st.DrawFn) -> Table:
    n_base = draw(st.integers(0, 3000))
    n_canary = draw(st.integers(0, 3000))
    return Table(draw(st.integers(0, n_base)), n_base, draw(st.integers(0, n_canary)), n_canary)


@settings(max_examples=300, deadline=None)
@given(tables=st.lists(_table(), max_size=6))
def test_hypergeom_strata_give_the_gammaln_p_values(tables: list[Table]) -> None:
    new, old = stratified_exact(tables), stratified_exact_by_gammaln(tables)
    assert new == pytest.approx(old, rel=1e-9, abs=1e-15)
