"""The statistics of `sluice.policy.evidence` against libraries (issue 37): each stratum's
hypergeometric law is `scipy.stats.hypergeom` (the log-gamma version it replaced is kept
here as an oracle); Holm stays a hand-written loop (statsmodels brings pandas and a full
collection a call, see `holm`), checked against statsmodels' `multipletests`. Random inputs
must give the same answers: the same thresholds exactly (ties too), the same p-values to
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


def holm_by_statsmodels(p_values: Mapping[str, float], alpha: float) -> dict[str, float]:
    """Holm's levels as statsmodels' `multipletests(method="holm")` rejects: p-values sorted
    stably (ties keep their order), alpha / (m - rank) up to and including the first
    acceptance, 0.0 after it."""
    from statsmodels.stats.multitest import multipletests

    order = sorted(p_values, key=lambda k: p_values[k])
    m = len(order)
    if m == 0:
        return {}
    reject = multipletests(
        [p_values[k] for k in order], alpha=alpha, method="holm", is_sorted=True
    )[0]
    rejected = int(np.count_nonzero(reject))  # a prefix: step-down stops at an acceptance
    return {k: alpha / (m - i) if i <= rejected else 0.0 for i, k in enumerate(order)}


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
def test_holm_is_statsmodels_step_down(ps: list[float], alpha: float) -> None:
    p_values = {f"c{i}": p for i, p in enumerate(ps)}
    ours, theirs = holm(p_values, alpha), holm_by_statsmodels(p_values, alpha)
    assert ours == theirs and list(ours) == list(theirs)  # same levels, in the same order


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
