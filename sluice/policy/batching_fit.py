"""Fitting the batching server model's time parameters to what a load test measured (pure:
no I/O, no clock).

`sluice.sim.batching.BatchingParams` says a decode step with `b` sequences holding `kv`
KV-cache tokens takes `step_base_s + step_per_seq_s x b + step_per_kv_token_s x kv`, and a
new sequence's prefill takes `prompt_tokens / prefill_tps` (prefill yields no token: the
first one comes from the first decode step after it). `sluice loadtest --fit`
(`sluice.tools.batchfit`) measures one instance with closed-loop streamed load and hands
this module two sets of points:

- **TPOT points**, one per streamed answer: the time per output token after the first
  (TPOT) at a batch of `b` sequences (the closed loop's concurrency: every caller sends its
  next request as soon as its answer ends, so `b` sequences run all the time) holding about
  `kv = b x (prompt + output / 2)` tokens (each sequence holds its prompt and, on average
  over its answer, half its output). Least squares of TPOT on `[1, b, kv]` gives the three
  step parameters, with the usual standard errors (`scipy.optimize.curve_fit`, whose
  covariance is the OLS one scaled by the residual variance).
- **TTFT points** at concurrency 1, at several prompt lengths: TTFT = prefill + one step +
  what the path adds (gateway, network), so the slope of TTFT on prompt tokens
  (`scipy.stats.linregress`) is `1 / prefill_tps` and the intercept one step plus that
  overhead; `prefill_tps` and its standard error follow by the delta method
  (`se(1/s) = se(s) / s**2`).

What the data can tell apart, and what it cannot:

- **The KV term is identified only when `kv` varies apart from `b`.** A concurrency sweep at
  one prompt length gives `kv = b x const`, collinear with `b`: its effect lands on
  `step_per_seq_s`. TPOT points at concurrency 1 with long and short prompts break the tie.
  When `kv` is (nearly) a linear function of `b` over the points (its variance inflation
  factor on `[1, b]` above `MAX_VIF`), the KV term is *not identified*: it is kept at 0 and
  the two other parameters are fitted alone, and the fit says so. When it is identified
  but its estimate is within `SIGNIFICANCE` standard errors of 0, it is kept at 0 too (the
  two-parameter fit is then the better estimate of the others), and the fit says that.
- **Prefill** is identified when TTFT grows with the prompt by more than `SIGNIFICANCE`
  standard errors of the slope; otherwise `prefill_tps` is None with the reason (a prefill
  too fast to see at these prompt lengths: use longer prompts).
- The fit is of *means*: a server whose step time is not linear in `b` (a kernel that
  changes at some batch size) gets the least-squares line through it, and the residual
  (`rms_s`, `r2`) says how well a line fits.

Errors are standard errors of the least-squares estimates (the points' scatter, assumed
independent and of equal variance); `rel_err` is the standard error over the estimate's
magnitude. A degenerate input (one batch size, one prompt length, too few points,
non-finite values) raises `FitError` naming what to measure.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit
from scipy.stats import linregress

__all__ = [
    "MAX_VIF",
    "SIGNIFICANCE",
    "BatchingFit",
    "Estimate",
    "FitError",
    "TpotPoint",
    "TtftPoint",
    "fit_batching",
    "tpot_point",
]

MAX_VIF = 100.0
"""Above this variance inflation factor of `kv` on `[1, b]` (its R^2 there over 0.99), the
KV term is not told apart from the per-sequence one: its standard error would be ten times
what it is with independent columns, and the two estimates trade off against each other."""

SIGNIFICANCE = 2.0
"""An estimate within this many standard errors of 0 is not told apart from 0 (about the
95 % two-sided level)."""


class FitError(ValueError):
    """The points cannot determine the parameters; the message says what to measure."""


@dataclass(frozen=True, slots=True)
class TpotPoint:
    """One streamed answer: its mean time per output token after the first, at a batch of
    `batch` sequences holding about `kv_tokens` KV-cache tokens."""

    batch: float
    kv_tokens: float
    tpot_s: float


@dataclass(frozen=True, slots=True)
class TtftPoint:
    """One answer at concurrency 1: its prompt's tokens and its time to first token."""

    prompt_tokens: float
    ttft_s: float


def tpot_point(
    batch: float, prompt_tokens: float, output_tokens: float, tpot_s: float
) -> TpotPoint:
    """A TPOT point with the KV tokens a batch of `batch` such answers holds mid-answer."""
    return TpotPoint(batch, batch * (prompt_tokens + output_tokens / 2.0), tpot_s)


@dataclass(frozen=True, slots=True)
class Estimate:
    """A fitted value and its standard error (None: not estimated, e.g. held at 0)."""

    value: float
    stderr: float | None

    @property
    def rel_err(self) -> float | None:
        if self.stderr is None or self.value == 0:
            return None
        return self.stderr / abs(self.value)

    def to_json(self) -> dict[str, float | None]:
        return {"value": self.value, "stderr": self.stderr, "rel_err": self.rel_err}


@dataclass(frozen=True, slots=True)
class BatchingFit:
    """The fitted time parameters of `BatchingParams`, with their errors and residuals."""

    step_base_s: Estimate
    step_per_seq_s: Estimate
    step_per_kv_token_s: Estimate
    kv_identified: bool
    kv_note: str
    prefill_s_per_token: Estimate
    prefill_tps: Estimate | None
    prefill_note: str
    ttft_intercept_s: Estimate
    tpot_rms_s: float
    tpot_r2: float
    ttft_rms_s: float
    ttft_r2: float
    tpot_points: int
    ttft_points: int

    def params(self) -> dict[str, float | None]:
        """The values under `BatchingParams`' names (`prefill_tps` None: not identified)."""
        return {
            "step_base_s": self.step_base_s.value,
            "step_per_seq_s": self.step_per_seq_s.value,
            "step_per_kv_token_s": self.step_per_kv_token_s.value,
            "prefill_tps": self.prefill_tps.value if self.prefill_tps else None,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "params": self.params(),
            "step_base_s": self.step_base_s.to_json(),
            "step_per_seq_s": self.step_per_seq_s.to_json(),
            "step_per_kv_token_s": self.step_per_kv_token_s.to_json(),
            "kv_identified": self.kv_identified,
            "kv_note": self.kv_note,
            "prefill_s_per_token": self.prefill_s_per_token.to_json(),
            "prefill_tps": self.prefill_tps.to_json() if self.prefill_tps else None,
            "prefill_note": self.prefill_note,
            "ttft_intercept_s": self.ttft_intercept_s.to_json(),
            "residual": {
                "tpot_rms_s": self.tpot_rms_s,
                "tpot_r2": self.tpot_r2,
                "ttft_rms_s": self.ttft_rms_s,
                "ttft_r2": self.ttft_r2,
            },
            "points": {"tpot": self.tpot_points, "ttft": self.ttft_points},
        }


def _finite(name: str, values: np.ndarray[Any, Any]) -> None:
    if not np.all(np.isfinite(values)):
        raise FitError(f"{name}: every value must be a finite number")
    if np.any(values < 0):
        raise FitError(f"{name}: a negative value is not a measurement")


def _rms_r2(y: np.ndarray[Any, Any], fitted: np.ndarray[Any, Any]) -> tuple[float, float]:
    resid = y - fitted
    ss_res = float(resid @ resid)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return math.sqrt(ss_res / len(y)), r2


def _linear(x: np.ndarray[Any, Any], *coef: float) -> np.ndarray[Any, Any]:
    return np.asarray(np.asarray(coef) @ x)


def _ols(columns: np.ndarray[Any, Any], y: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    """Least squares of y on the rows of `columns` (one regressor a row), with the OLS
    covariance of the estimates."""
    start = np.linalg.lstsq(columns.T, y, rcond=None)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", OptimizeWarning)  # an unusable covariance: say so
        try:
            coef, cov = curve_fit(_linear, columns, y, p0=start)
        except (OptimizeWarning, RuntimeError) as exc:
            raise FitError(f"the least-squares fit has no usable covariance: {exc}") from None
    return coef, cov


def _vif(kv: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    """Variance inflation factor of `kv` on `[1, b]`: 1 / (1 - R^2)."""
    if float(np.ptp(kv)) <= 0:
        return math.inf
    design = np.column_stack([np.ones_like(b), b])
    coef = np.linalg.lstsq(design, kv, rcond=None)[0]
    ss_res = float(((kv - design @ coef) ** 2).sum())
    ss_tot = float(((kv - kv.mean()) ** 2).sum())
    return math.inf if ss_res <= 1e-12 * ss_tot else ss_tot / ss_res


def _fit_steps(
    points: Sequence[TpotPoint],
) -> tuple[Estimate, Estimate, Estimate, bool, str, float, float]:
    b = np.array([p.batch for p in points], dtype=float)
    kv = np.array([p.kv_tokens for p in points], dtype=float)
    y = np.array([p.tpot_s for p in points], dtype=float)
    for name, arr in (("batch", b), ("kv_tokens", kv), ("tpot_s", y)):
        _finite(f"TPOT points' {name}", arr)
    sizes = np.unique(b)
    if len(sizes) < 2:
        raise FitError(
            f"TPOT was measured at one batch size only ({len(sizes)} distinct): step_base_s and "
            "step_per_seq_s need at least two concurrencies"
        )
    if len(points) < 3:
        raise FitError(f"{len(points)} TPOT points: at least 3 are needed for an error estimate")
    ones = np.ones_like(b)
    vif = _vif(kv, b)
    kv_est = Estimate(0.0, None)
    identified = vif <= MAX_VIF and len(points) >= 4
    if vif <= MAX_VIF and not identified:
        note = f"not identified: {len(points)} points are too few for three parameters; kept at 0"
    elif not identified:
        note = (
            "not identified: the KV tokens held move with the batch size in these points "
            f"(variance inflation {vif:.3g} > {MAX_VIF:g}), so their cost is part of "
            "step_per_seq_s; kept at 0 (measure TPOT at several prompt lengths to identify it)"
        )
    else:
        coef, cov = _ols(np.vstack([ones, b, kv]), y)
        se = np.sqrt(np.diag(cov))
        kv_est = Estimate(float(coef[2]), float(se[2]))
        if abs(coef[2]) > SIGNIFICANCE * se[2]:
            base, per_seq = (Estimate(float(coef[k]), float(se[k])) for k in (0, 1))
            fitted = coef[0] + coef[1] * b + coef[2] * kv
            rms, r2 = _rms_r2(y, fitted)
            note = f"identified (variance inflation {vif:.3g})"
            return base, per_seq, kv_est, True, note, rms, r2
        note = (
            f"identified (variance inflation {vif:.3g}) but not told apart from 0 "
            f"({kv_est.value:.3g} +/- {se[2]:.2g} s per token): kept at 0"
        )
        kv_est = Estimate(0.0, float(se[2]))
    coef, cov = _ols(np.vstack([ones, b]), y)
    se = np.sqrt(np.diag(cov))
    base, per_seq = (Estimate(float(coef[k]), float(se[k])) for k in (0, 1))
    rms, r2 = _rms_r2(y, coef[0] + coef[1] * b)
    return base, per_seq, kv_est, identified, note, rms, r2


def _fit_prefill(
    points: Sequence[TtftPoint],
) -> tuple[Estimate, Estimate | None, str, Estimate, float, float]:
    x = np.array([p.prompt_tokens for p in points], dtype=float)
    y = np.array([p.ttft_s for p in points], dtype=float)
    _finite("TTFT points' prompt_tokens", x)
    _finite("TTFT points' ttft_s", y)
    if len(np.unique(x)) < 2:
        raise FitError(
            "TTFT was measured at one prompt length only: prefill_tps needs at least two"
        )
    if len(points) < 3:
        raise FitError(f"{len(points)} TTFT points: at least 3 are needed for an error estimate")
    r = linregress(x, y)
    slope = Estimate(float(r.slope), float(r.stderr))
    intercept = Estimate(float(r.intercept), float(r.intercept_stderr))
    rms, r2 = _rms_r2(y, r.intercept + r.slope * x)
    if r.slope <= SIGNIFICANCE * r.stderr:
        note = (
            f"not identified: TTFT does not grow with the prompt beyond its scatter "
            f"({r.slope:.3g} +/- {r.stderr:.2g} s per token): use longer prompts"
        )
        return slope, None, note, intercept, rms, r2
    tps = Estimate(1.0 / float(r.slope), float(r.stderr) / float(r.slope) ** 2)
    return slope, tps, "identified", intercept, rms, r2


def fit_batching(tpot: Sequence[TpotPoint], ttft: Sequence[TtftPoint]) -> BatchingFit:
    """Fit the step-time parameters to `tpot` and the prefill rate to `ttft` (module
    docstring); FitError when the points cannot determine them."""
    base, per_seq, per_kv, identified, kv_note, tpot_rms, tpot_r2 = _fit_steps(tpot)
    slope, tps, prefill_note, intercept, ttft_rms, ttft_r2 = _fit_prefill(ttft)
    return BatchingFit(
        step_base_s=base,
        step_per_seq_s=per_seq,
        step_per_kv_token_s=per_kv,
        kv_identified=identified,
        kv_note=kv_note,
        prefill_s_per_token=slope,
        prefill_tps=tps,
        prefill_note=prefill_note,
        ttft_intercept_s=intercept,
        tpot_rms_s=tpot_rms,
        tpot_r2=tpot_r2,
        ttft_rms_s=ttft_rms,
        ttft_r2=ttft_r2,
        tpot_points=len(tpot),
        ttft_points=len(ttft),
    )
