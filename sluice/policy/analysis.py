"""Canary-vs-baseline statistics over one window (C3): pure code, numpy only, no scipy.

Every criterion answers `pass`, `fail`, `wait` or `skip`:

| verdict | when                                                                         |
|---------|------------------------------------------------------------------------------|
| wait    | fewer than `min_samples` on either side, or a difference above its threshold |
|         | that is not yet statistically significant (more data will decide)            |
| fail    | difference above its threshold AND significant at `alpha` (rates, KS tests,  |
|         | quantile confidence bounds); resource ratios above threshold                 |
| skip    | disabled, or not applicable (no streaming timings, no text: embeddings)       |
| pass    | otherwise                                                                    |

The overall verdict is `fail` if any criterion fails, else `wait` if any waits, else `pass`.
Errors are answers with status >= 500 or < 100 (0: the connection failed); 4xx are the
caller's doing. Latency, timing, length and style use successful answers (status < 400).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from sluice.policy.significance import (
    ks_two_sample,
    normal_upper_quantile,
    quantile_bounds,
    two_proportion_p,
)
from sluice.spec.rollout import CRITERIA, AnalysisSpec, CriterionName

__all__ = [
    "REFUSAL_PHRASES",
    "Analysis",
    "Criterion",
    "RequestSample",
    "ResourceUse",
    "Verdict",
    "analyze",
    "style_features",
]

Verdict = Literal["pass", "fail", "wait", "skip"]


@dataclass(frozen=True, slots=True)
class RequestSample:
    """One answered request as the instance saw it. Times in seconds; `ttft_s` and `tpot_s`
    only for streamed generations; `text`: a prefix of the output (for style drift)."""

    status: int
    latency_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    text: str | None = None

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> RequestSample:
        """From a worker's `/sluice/samples` row; other keys (seq, at, model) are ignored."""

        def opt(key: str, kind: type[float] | type[int] | type[str]) -> Any:
            value = row.get(key)
            return None if value is None else kind(value)

        return cls(
            status=int(row["status"]),
            latency_s=float(row["latency_s"]),
            ttft_s=opt("ttft_s", float),
            tpot_s=opt("tpot_s", float),
            output_tokens=opt("output_tokens", int),
            finish_reason=opt("finish_reason", str),
            text=opt("text", str),
        )

    @property
    def ok(self) -> bool:
        return 100 <= self.status < 400

    @property
    def error(self) -> bool:
        return self.status >= 500 or self.status < 100


@dataclass(frozen=True, slots=True)
class ResourceUse:
    """One side's resource use over the window: `cpu_s` CPU seconds spent serving `requests`
    requests; `memory_gb` peak accelerator memory of one instance (None: not measured)."""

    requests: int
    cpu_s: float
    memory_gb: float | None = None


@dataclass(frozen=True, slots=True)
class Criterion:
    """One gate's numbers: `baseline`/`canary` are the compared values (a rate, a quantile
    in seconds, ...), `statistic` what is held against `threshold` (difference, ratio, KS D)."""

    name: CriterionName
    verdict: Verdict
    reason: str
    baseline: float | None = None
    canary: float | None = None
    statistic: float | None = None
    threshold: float | None = None
    p_value: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "reason": self.reason,
            "baseline": _finite(self.baseline),
            "canary": _finite(self.canary),
            "statistic": _finite(self.statistic),
            "threshold": _finite(self.threshold),
            "p_value": _finite(self.p_value),
        }


@dataclass(frozen=True, slots=True)
class Analysis:
    """All criteria for one window, and the overall verdict (never `skip`)."""

    verdict: Literal["pass", "fail", "wait"]
    reason: str
    criteria: tuple[Criterion, ...]
    baseline_samples: int
    canary_samples: int

    def criterion(self, name: str) -> Criterion | None:
        return next((c for c in self.criteria if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "baseline_samples": self.baseline_samples,
            "canary_samples": self.canary_samples,
            "criteria": [c.to_json() for c in self.criteria],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Analysis:
        return cls(
            verdict=data["verdict"],
            reason=str(data["reason"]),
            baseline_samples=int(data["baseline_samples"]),
            canary_samples=int(data["canary_samples"]),
            criteria=tuple(Criterion(**c) for c in data["criteria"]),
        )


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


# --- style drift -----------------------------------------------------------------------------

REFUSAL_PHRASES: tuple[str, ...] = (
    "i can't",
    "i cannot",
    "i can not",
    "i'm sorry",
    "i am sorry",
    "i apologize",
    "i'm unable",
    "i am unable",
    "as an ai",
    "i won't be able",
)
_WORD = re.compile(r"\w+(?:'\w+)?")
_SENTENCE_END = re.compile(r"[.!?\u3002\uff01\uff1f]+(?:\s|$)|\n+")
_MARKUP = re.compile(r"[#*_`|>~\[\]]|^\s*(?:[-+]|\d+\.)\s", re.MULTILINE)
_TTR_WORDS = 64
STYLE_FEATURES = ("words_per_sentence", "type_token_ratio", "markup_density", "refusal")


def style_features(text: str) -> tuple[float, float, float, float]:
    """Cheap, model-agnostic descriptors of how a generation reads, as STYLE_FEATURES:

    - words per sentence: a version that turns terse or rambling;
    - type/token ratio of the first 64 words (a fixed window, because the ratio falls with
      length, and length is judged on its own): repetition loops and degenerate text drop it;
    - markup density, markdown/code characters and list lines per character: a switch to or
      from heavy formatting that breaks callers who parse plain text;
    - refusal, 1.0 when a refusal phrase appears: a safety-tuned version refusing more.
    Output length, emptiness and truncation have their own criteria."""
    lower = text.lower()
    words = _WORD.findall(lower)
    sentences = [s for s in _SENTENCE_END.split(text) if _WORD.search(s)]
    wps = len(words) / max(1, len(sentences))
    head = words[:_TTR_WORDS]
    ttr = len(set(head)) / len(head) if head else 0.0
    markup = len(_MARKUP.findall(text)) / max(1, len(text))
    refusal = 1.0 if any(p in lower for p in REFUSAL_PHRASES) else 0.0
    return wps, ttr, markup, refusal


# --- criteria --------------------------------------------------------------------------------


def _thin(name: CriterionName, n_base: int, n_canary: int, need: int, what: str) -> Criterion:
    return Criterion(
        name,
        "wait",
        f"too few {what}: baseline {n_base}, canary {n_canary}, need {need} each",
    )


def _rate(
    name: CriterionName,
    hits_base: int,
    n_base: int,
    hits_canary: int,
    n_canary: int,
    max_increase: float,
    spec: AnalysisSpec,
    what: str,
) -> Criterion:
    if n_base == 0 and n_canary == 0:
        return Criterion(name, "skip", f"not applicable: no {what} on either side")
    if min(n_base, n_canary) < spec.min_samples:
        return _thin(name, n_base, n_canary, spec.min_samples, what)
    rb, rc = hits_base / n_base, hits_canary / n_canary
    diff = rc - rb
    p = two_proportion_p(hits_base, n_base, hits_canary, n_canary)
    nums = dict(baseline=rb, canary=rc, statistic=diff, threshold=max_increase, p_value=p)
    text = f"canary {rc:.2%} vs baseline {rb:.2%} (+{diff:.2%}, allowed +{max_increase:.2%}"
    if diff <= max_increase:
        return Criterion(name, "pass", text + ")", **nums)
    if p < spec.alpha:
        return Criterion(name, "fail", text + f", p={p:.2g} < {spec.alpha:g})", **nums)
    return Criterion(name, "wait", text + f"; not yet significant, p={p:.2g})", **nums)


def _quantile_ratio(
    name: CriterionName,
    base: list[float],
    canary: list[float],
    q: float,
    max_ratio: float,
    min_delta: float,
    spec: AnalysisSpec,
    what: str,
) -> Criterion:
    """Fails when the canary's q-quantile exceeds `max_ratio` x the baseline's (and by more
    than `min_delta` s) even comparing the canary's lower confidence bound with the
    baseline's upper one; a point estimate over the line that the bounds do not confirm
    waits. Without the bounds, one slow request among 100 could swing a p95 by 30%."""
    if not base and not canary:
        return Criterion(name, "skip", f"not applicable: no {what} on either side")
    if min(len(base), len(canary)) < spec.min_samples:
        return _thin(name, len(base), len(canary), spec.min_samples, what)
    xb, xc = np.asarray(base, dtype=float), np.asarray(canary, dtype=float)
    qb, qc = float(np.quantile(xb, q)), float(np.quantile(xc, q))
    ratio = qc / qb if qb > 0 else (1.0 if qc <= 0 else math.inf)
    nums = dict(baseline=qb, canary=qc, statistic=ratio, threshold=max_ratio)
    label = f"p{round(q * 100)}"
    text = f"{label} canary {qc * 1000:.1f} ms vs baseline {qb * 1000:.1f} ms (x{ratio:.2f}, "
    text += f"allowed x{max_ratio:g}"
    if ratio <= max_ratio or qc - qb <= min_delta:
        return Criterion(name, "pass", text + ")", **nums)
    z = normal_upper_quantile(spec.alpha)
    _, hi_b = quantile_bounds(xb, q, z)
    lo_c, _ = quantile_bounds(xc, q, z)
    if lo_c > hi_b * max_ratio and lo_c - hi_b > min_delta:
        return Criterion(name, "fail", text + "; confirmed by the confidence bounds)", **nums)
    return Criterion(name, "wait", text + "; not yet confirmed by the confidence bounds)", **nums)


def _ratio(
    name: CriterionName,
    base: float,
    canary: float,
    max_ratio: float,
    min_delta: float,
    unit: str,
) -> Criterion:
    ratio = canary / base if base > 0 else (1.0 if canary <= 0 else math.inf)
    nums = dict(baseline=base, canary=canary, statistic=ratio, threshold=max_ratio)
    text = f"canary {canary:.4g} {unit} vs baseline {base:.4g} {unit} (x{ratio:.2f}, "
    text += f"allowed x{max_ratio:g})"
    failed = ratio > max_ratio and canary - base > min_delta
    return Criterion(name, "fail" if failed else "pass", text, **nums)


def _ks(
    name: CriterionName,
    base: list[float],
    canary: list[float],
    max_d: float,
    alpha: float,
    spec: AnalysisSpec,
    what: str,
) -> Criterion:
    if not base and not canary:
        return Criterion(name, "skip", f"not applicable: no {what} on either side")
    if min(len(base), len(canary)) < spec.min_samples:
        return _thin(name, len(base), len(canary), spec.min_samples, what)
    d, p = ks_two_sample(base, canary)
    nums = dict(
        baseline=float(np.median(base)),
        canary=float(np.median(canary)),
        statistic=d,
        threshold=max_d,
        p_value=p,
    )
    text = f"KS D={d:.3f} (allowed {max_d:g}), p={p:.2g}; medians {nums['baseline']:g} vs "
    text += f"{nums['canary']:g}"
    if d <= max_d:
        return Criterion(name, "pass", text, **nums)
    if p < alpha:
        return Criterion(name, "fail", text + f" < {alpha:g}", **nums)
    return Criterion(name, "wait", text + "; not yet significant", **nums)


def _style(base: list[str], canary: list[str], spec: AnalysisSpec) -> Criterion:
    """Largest KS statistic over STYLE_FEATURES; each feature is tested at alpha / 4
    (Bonferroni), so four looks do not quadruple the false alarms. The reason names every
    feature over the line, largest first; the numbers are those of the largest."""
    name: CriterionName = "style_drift"
    if not base and not canary:
        return Criterion(name, "skip", "not applicable: no output text (embeddings?)")
    if min(len(base), len(canary)) < spec.min_samples:
        return _thin(name, len(base), len(canary), spec.min_samples, "texts")
    fb = np.asarray([style_features(t) for t in base], dtype=float)
    fc = np.asarray([style_features(t) for t in canary], dtype=float)
    alpha = spec.alpha / len(STYLE_FEATURES)
    limit = spec.style_drift_max_ks
    rows = []
    for i, feat in enumerate(STYLE_FEATURES):
        d, p = ks_two_sample(fb[:, i].tolist(), fc[:, i].tolist())
        mb, mc = float(np.mean(fb[:, i])), float(np.mean(fc[:, i]))
        text = f"{feat}: KS D={d:.3f} (allowed {limit:g}), p={p:.2g}, means {mb:.3g} vs {mc:.3g}"
        rows.append((d, p, mb, mc, text))
    rows.sort(key=lambda r: -r[0])
    failing = [r for r in rows if r[0] > limit and r[1] < alpha]
    over = [r for r in rows if r[0] > limit]
    verdict: Verdict = "fail" if failing else "wait" if over else "pass"
    top = (failing or over or rows)[0]
    d, p, mb, mc, _ = top
    nums = dict(baseline=mb, canary=mc, statistic=d, threshold=limit, p_value=p)
    if failing:
        return Criterion(
            name, verdict, "; ".join(r[4] for r in failing) + f" (< {alpha:.2g})", **nums
        )
    if over:
        return Criterion(
            name, verdict, "; ".join(r[4] for r in over) + "; not yet significant", **nums
        )
    return Criterion(name, verdict, top[4], **nums)


def _resources(
    base: ResourceUse | None, canary: ResourceUse | None, spec: AnalysisSpec
) -> list[Criterion]:
    if base is None or canary is None:
        return [
            Criterion("cpu_per_request", "skip", "no resource data"),
            Criterion("memory", "skip", "no resource data"),
        ]
    if min(base.requests, canary.requests) < spec.min_samples:
        cpu = _thin("cpu_per_request", base.requests, canary.requests, spec.min_samples, "requests")
    else:
        cpu = _ratio(
            "cpu_per_request",
            base.cpu_s / base.requests,
            canary.cpu_s / canary.requests,
            spec.cpu_per_request_max_ratio,
            spec.cpu_min_delta_s,
            "CPU s/request",
        )
    if base.memory_gb is None or canary.memory_gb is None:
        mem = Criterion("memory", "skip", "accelerator memory not measured")
    else:
        mem = _ratio(
            "memory",
            base.memory_gb,
            canary.memory_gb,
            spec.memory_max_ratio,
            spec.memory_min_delta_gb,
            "GiB",
        )
    return [cpu, mem]


def _values(
    samples: Sequence[RequestSample], get: Callable[[RequestSample], float | None]
) -> list[float]:
    return [v for s in samples if s.ok and (v := get(s)) is not None]


def _empty(s: RequestSample) -> bool | None:
    if s.output_tokens is not None:
        return s.output_tokens == 0
    if s.text is not None:
        return not s.text.strip()
    return None


def analyze(
    baseline: Sequence[RequestSample],
    canary: Sequence[RequestSample],
    base_use: ResourceUse | None,
    canary_use: ResourceUse | None,
    spec: AnalysisSpec,
) -> Analysis:
    """Compare the canary with the baseline over the same window (both sides' samples from
    the same span of time). Thin data on either side (< `spec.min_samples` requests) waits on
    every enabled criterion: no skip is decided, and nothing passes, on too little data."""
    n_b, n_c = len(baseline), len(canary)
    crits: list[Criterion] = []
    if min(n_b, n_c) < spec.min_samples:
        crits = [_thin(name, n_b, n_c, spec.min_samples, "requests") for name in CRITERIA]
    else:
        ok_b = [s for s in baseline if s.ok]
        ok_c = [s for s in canary if s.ok]
        crits.append(
            _rate(
                "error_rate",
                sum(s.error for s in baseline),
                n_b,
                sum(s.error for s in canary),
                n_c,
                spec.error_rate_max_increase,
                spec,
                "requests",
            )
        )
        lat_b, lat_c = (
            _values(baseline, lambda s: s.latency_s),
            _values(canary, lambda s: s.latency_s),
        )
        crits.append(
            _quantile_ratio(
                "latency_p50",
                lat_b,
                lat_c,
                0.5,
                spec.latency_p50_max_ratio,
                spec.latency_min_delta_s,
                spec,
                "successful requests",
            )
        )
        crits.append(
            _quantile_ratio(
                "latency_p95",
                lat_b,
                lat_c,
                0.95,
                spec.latency_p95_max_ratio,
                spec.latency_min_delta_s,
                spec,
                "successful requests",
            )
        )
        crits.append(
            _quantile_ratio(
                "ttft_p95",
                _values(baseline, lambda s: s.ttft_s),
                _values(canary, lambda s: s.ttft_s),
                0.95,
                spec.ttft_p95_max_ratio,
                spec.latency_min_delta_s,
                spec,
                "streamed answers (TTFT)",
            )
        )
        crits.append(
            _quantile_ratio(
                "tpot_p50",
                _values(baseline, lambda s: s.tpot_s),
                _values(canary, lambda s: s.tpot_s),
                0.5,
                spec.tpot_p50_max_ratio,
                spec.tpot_min_delta_s,
                spec,
                "streamed answers (TPOT)",
            )
        )
        len_b = _values(baseline, lambda s: s.output_tokens)
        len_c = _values(canary, lambda s: s.output_tokens)
        crits.append(
            _ks(
                "output_length",
                len_b,
                len_c,
                spec.output_length_max_ks,
                spec.alpha,
                spec,
                "output lengths",
            )
        )
        emp_b = [e for s in ok_b if (e := _empty(s)) is not None]
        emp_c = [e for s in ok_c if (e := _empty(s)) is not None]
        crits.append(
            _rate(
                "empty_rate",
                sum(emp_b),
                len(emp_b),
                sum(emp_c),
                len(emp_c),
                spec.empty_rate_max_increase,
                spec,
                "answers with output",
            )
        )
        fin_b = [s.finish_reason == "length" for s in ok_b if s.finish_reason is not None]
        fin_c = [s.finish_reason == "length" for s in ok_c if s.finish_reason is not None]
        crits.append(
            _rate(
                "truncated_rate",
                sum(fin_b),
                len(fin_b),
                sum(fin_c),
                len(fin_c),
                spec.truncated_rate_max_increase,
                spec,
                "answers with a finish reason",
            )
        )
        crits.extend(_resources(base_use, canary_use, spec))
        txt_b = [s.text for s in ok_b if s.text is not None and s.text.strip()]
        txt_c = [s.text for s in ok_c if s.text is not None and s.text.strip()]
        crits.append(_style(txt_b, txt_c, spec))
    disabled = set(spec.disable)
    crits = [
        Criterion(c.name, "skip", "disabled in the rollout spec") if c.name in disabled else c
        for c in crits
    ]
    return _overall(crits, n_b, n_c)


def _overall(crits: list[Criterion], n_b: int, n_c: int) -> Analysis:
    fails = [c for c in crits if c.verdict == "fail"]
    waits = [c for c in crits if c.verdict == "wait"]
    if fails:
        verdict: Literal["pass", "fail", "wait"] = "fail"
        reason = "; ".join(f"{c.name} failed: {c.reason}" for c in fails)
    elif waits:
        verdict = "wait"
        reason = "; ".join(f"{c.name}: {c.reason}" for c in waits[:3])
        if len(waits) > 3:
            reason += f"; and {len(waits) - 3} more waiting"
    else:
        verdict = "pass"
        passed = sum(c.verdict == "pass" for c in crits)
        reason = f"{passed} criteria passed, {len(crits) - passed} skipped"
    return Analysis(verdict, reason, tuple(crits), n_b, n_c)
