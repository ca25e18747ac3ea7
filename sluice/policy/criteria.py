"""Each canary criterion's evidence over one step's window (C3): a p-value from an exact or
conservative test (`sluice.policy.evidence`), whether the effect is large enough to act on,
the numbers to show, and the 2x2 tables later steps pool. `analysis.analyze` decides.

Errors are answers with status >= 500 or < 100 (0: the connection failed); 4xx are the
caller's doing. Latency, timing, length and style use successful answers (status < 400).
Effects smaller than half of the smallest regression worth catching are never acted on:
a significant but trivial difference (likely once a window holds thousands of answers) is
no reason to roll back.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sluice.policy.evidence import Table, ks_test, mh_difference, stratified_exact
from sluice.spec.rollouts import AnalysisSpec, CriterionName

if TYPE_CHECKING:
    from sluice.policy.analysis import RequestSample, ResourceUse

__all__ = [
    "MIN_JUDGE",
    "REFUSAL_PHRASES",
    "STYLE_FEATURES",
    "Judged",
    "judge_all",
    "style_features",
]

MIN_JUDGE = 10
"""Fewer answers than this on a side (its own kind: streamed, with text, ...) skip a look."""


@dataclass(frozen=True, slots=True)
class Judged:
    """One criterion at one look. `p`: its p-value (None: a measured ratio, no test);
    `act`: the effect is large enough to roll back for (for ratios: over the threshold);
    `skip`: why it was not judged (then nothing else counts)."""

    name: CriterionName
    text: str = ""
    p: float | None = None
    act: bool = False
    skip: str | None = None
    baseline: float | None = None
    canary: float | None = None
    statistic: float | None = None
    threshold: float | None = None
    tables: dict[str, Table] = field(default_factory=dict)


Strata = Sequence[Mapping[str, Table]]


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


STYLE_MEMO_TEXTS = 1 << 14
"""Texts whose features are memoised: a look's window on both sides (5,000 a side by
default, `control.samples.WINDOW_ROWS`) with room to spare. At up to `TEXT_CHARS` (512) a
text that is at most ~15 MB; 64 Ki texts held ~50 MB once rollouts had brought that many
new ones (the soak's RSS slope)."""


@functools.lru_cache(maxsize=STYLE_MEMO_TEXTS)
def style_features(text: str) -> tuple[float, float, float, float]:
    """Cheap, model-agnostic descriptors of how a generation reads, as STYLE_FEATURES:

    - words per sentence: a version that turns terse or rambling;
    - type/token ratio of the first 64 words (a fixed window, because the ratio falls with
      length, and length is judged on its own): repetition loops and degenerate text drop it;
    - markup density, markdown/code characters and list lines per character: a switch to or
      from heavy formatting that breaks callers who parse plain text;
    - refusal, 1.0 when a refusal phrase appears: a safety-tuned version refusing more.
    Output length, emptiness and truncation have their own criteria. Memoised per text
    (a pure function): a window is re-read at every look, and this is most of a look's cost."""
    lower = text.lower()
    words = _WORD.findall(lower)
    sentences = [s for s in _SENTENCE_END.split(text) if _WORD.search(s)]
    wps = len(words) / max(1, len(sentences))
    head = words[:_TTR_WORDS]
    ttr = len(set(head)) / len(head) if head else 0.0
    markup = len(_MARKUP.findall(text)) / max(1, len(text))
    refusal = 1.0 if any(p in lower for p in REFUSAL_PHRASES) else 0.0
    return wps, ttr, markup, refusal


# --- the criteria ----------------------------------------------------------------------------


def _strata(prior: Strata, key: str, current: Table) -> list[Table]:
    return [s[key] for s in prior if key in s] + [current]


def _too_few(name: CriterionName, t: Table, strata: list[Table], what: str) -> Judged | None:
    if t.n_base == 0 and t.n_canary == 0 and len(strata) == 1:
        return Judged(name, skip=f"not applicable: no {what} on either side")
    nb = sum(s.n_base for s in strata)
    nc = sum(s.n_canary for s in strata)
    if min(nb, nc) < MIN_JUDGE:
        return Judged(name, skip=f"too few {what} to judge: baseline {nb}, canary {nc}")
    return None


def _rate(
    name: CriterionName,
    key: str,
    current: Table,
    prior: Strata,
    smallest: float,
    what: str,
) -> Judged:
    """An exact stratified test that the canary's rate is higher (this step and the earlier
    ones, each its own stratum); acted on when the pooled (Mantel-Haenszel) rise is at least
    half of `smallest`."""
    strata = _strata(prior, key, current)
    thin = _too_few(name, current, strata, what)
    if thin is not None:
        return Judged(name, skip=thin.skip, tables={key: current})
    p = stratified_exact(strata)
    diff = mh_difference(strata)
    rb = current.hits_base / current.n_base if current.n_base else 0.0
    rc = current.hits_canary / current.n_canary if current.n_canary else 0.0
    pooled = f", pooled over {len(strata)} steps" if len(strata) > 1 else ""
    text = (
        f"canary {rc:.2%} vs baseline {rb:.2%} of {what} (rise {diff:+.2%}{pooled}; "
        f"smallest worth catching +{smallest:.2%}), p={p:.2g}"
    )
    return Judged(
        name,
        text,
        p=p,
        act=diff >= smallest / 2,
        baseline=rb,
        canary=rc,
        statistic=diff,
        threshold=smallest,
        tables={key: current},
    )


def _quantile(
    name: CriterionName,
    base: list[float],
    canary: list[float],
    prior: Strata,
    q: float,
    max_ratio: float,
    min_delta: float,
    what: str,
) -> Judged:
    """An exact exceedance test: the canary's share of answers above the pooled q-quantile
    against the baseline's (under no difference the split of those answers is
    hypergeometric, whatever the latency distribution), pooled over steps. Acted on when
    this window's q-quantile ratio is at least halfway to `max_ratio` and the quantile grew
    by more than `min_delta` seconds."""
    label = f"p{round(q * 100)}"
    xb, xc = np.asarray(base, dtype=float), np.asarray(canary, dtype=float)
    if xb.size and xc.size:
        thr = float(np.quantile(np.concatenate([xb, xc]), q))
        current = Table(
            int(np.count_nonzero(xb > thr)), xb.size, int(np.count_nonzero(xc > thr)), xc.size
        )
    else:
        current = Table(0, xb.size, 0, xc.size)
    strata = _strata(prior, name, current)
    thin = _too_few(name, current, strata, what)
    if thin is not None or not base or not canary:
        why = thin.skip if thin is not None else f"no {what} on one side this step"
        return Judged(name, skip=why, tables={name: current})
    qb, qc = float(np.quantile(xb, q)), float(np.quantile(xc, q))
    ratio = qc / qb if qb > 0 else (1.0 if qc <= 0 else math.inf)
    p = stratified_exact(strata)
    above = current.hits_canary / current.n_canary
    text = (
        f"{label} canary {qc * 1000:.1f} ms vs baseline {qb * 1000:.1f} ms (x{ratio:.2f}; "
        f"smallest worth catching x{max_ratio:g}); {above:.1%} of the canary's above the "
        f"pooled {label} (baseline {current.hits_base / current.n_base:.1%}), p={p:.2g}"
    )
    halfway = 1 + (max_ratio - 1) / 2
    return Judged(
        name,
        text,
        p=p,
        act=ratio >= halfway and qc - qb > min_delta,
        baseline=qb,
        canary=qc,
        statistic=ratio,
        threshold=max_ratio,
        tables={name: current},
    )


def _distribution(
    name: CriterionName, base: list[float], canary: list[float], max_d: float, what: str
) -> Judged:
    """Two-sample KS on this window; acted on when D is at least half of `max_d`."""
    if not base and not canary:
        return Judged(name, skip=f"not applicable: no {what} on either side")
    if min(len(base), len(canary)) < MIN_JUDGE:
        return Judged(
            name, skip=f"too few {what} to judge: baseline {len(base)}, canary {len(canary)}"
        )
    d, p = ks_test(base, canary)
    mb, mc = float(np.median(base)), float(np.median(canary))
    text = f"KS D={d:.3f} (smallest worth catching {max_d:g}), p={p:.2g}; medians {mb:g} vs {mc:g}"
    return Judged(
        name, text, p=p, act=d >= max_d / 2, baseline=mb, canary=mc, statistic=d, threshold=max_d
    )


def _style(base: list[str], canary: list[str], prior: Strata, spec: AnalysisSpec) -> Judged:
    """Three continuous features by KS on this window, the refusal share by the pooled
    exact test; one criterion with p = 4 x the smallest p among features whose effect is
    large enough (Bonferroni over the four; smallest over all when none is). The reason
    names the features, smallest p first."""
    name: CriterionName = "style_drift"
    if not base and not canary:
        return Judged(name, skip="not applicable: no output text (embeddings?)")
    fb = np.asarray([style_features(t) for t in base], dtype=float).reshape(-1, 4)
    fc = np.asarray([style_features(t) for t in canary], dtype=float).reshape(-1, 4)
    refusal = Table(int(fb[:, 3].sum()), len(base), int(fc[:, 3].sum()), len(canary))
    if min(len(base), len(canary)) < MIN_JUDGE:
        return Judged(
            name,
            skip=f"too few texts to judge: baseline {len(base)}, canary {len(canary)}",
            tables={"refusal": refusal},
        )
    rows: list[tuple[float, bool, float, float, float, float, str]] = []
    limit = spec.style_drift_max_ks
    for i, feat in enumerate(STYLE_FEATURES[:3]):
        d, p = ks_test(fb[:, i].tolist(), fc[:, i].tolist())
        mb, mc = float(np.mean(fb[:, i])), float(np.mean(fc[:, i]))
        text = f"{feat}: KS D={d:.3f} (smallest worth catching {limit:g}), p={p:.2g}, "
        text += f"means {mb:.3g} vs {mc:.3g}"
        rows.append((p, d >= limit / 2, mb, mc, d, limit, text))
    ref = _rate(name, "refusal", refusal, prior, spec.refusal_rate_max_increase, "texts")
    if ref.p is not None and ref.statistic is not None:
        text = "refusal: " + ref.text
        rb, rc = ref.baseline or 0.0, ref.canary or 0.0
        rows.append((ref.p, ref.act, rb, rc, ref.statistic, spec.refusal_rate_max_increase, text))
    rows.sort(key=lambda r: r[0])
    acting = [r for r in rows if r[1]]
    top = (acting or rows)[0]
    p = min(1.0, len(STYLE_FEATURES) * top[0])
    shown = "; ".join(r[6] for r in (acting or rows[:1]))
    return Judged(
        name,
        f"{shown} (p x {len(STYLE_FEATURES)} = {p:.2g})",
        p=p,
        act=bool(acting),
        baseline=top[2],
        canary=top[3],
        statistic=top[4],
        threshold=top[5],
        tables={"refusal": refusal},
    )


def _ratio(
    name: CriterionName, base: float, canary: float, max_ratio: float, min_delta: float, unit: str
) -> Judged:
    ratio = canary / base if base > 0 else (1.0 if canary <= 0 else math.inf)
    text = f"canary {canary:.4g} {unit} vs baseline {base:.4g} {unit} (x{ratio:.2f}, "
    text += f"allowed x{max_ratio:g}; measured, not tested)"
    act = ratio > max_ratio and canary - base > min_delta
    return Judged(
        name, text, act=act, baseline=base, canary=canary, statistic=ratio, threshold=max_ratio
    )


LOAD_MATCH = 1.5
"""CPU per request is compared only while the sides' per-instance loads are within this
factor of each other. An instance spends CPU every second whatever it serves (probes, the
sample and stats polls, its event loop, GC): charged per request, that idle CPU makes the
side with fewer requests per instance look costlier. At a 20% step with equal instance
counts, a good canary read 1.9x its baseline's CPU per request (seen in bench/soak.py)."""


def _load_mismatch(base: ResourceUse, canary: ResourceUse) -> str | None:
    """Why the sides' CPU per request cannot be compared (None: it can, or loads unknown)."""
    if base.instance_s <= 0 or canary.instance_s <= 0:
        return None
    load_b, load_c = base.requests / base.instance_s, canary.requests / canary.instance_s
    ratio = max(load_b, load_c) / max(min(load_b, load_c), 1e-9)
    if ratio <= LOAD_MATCH:
        return None
    return (
        f"per-instance load differs x{ratio:.1f} (baseline {load_b:.3g}, canary {load_c:.3g} "
        f"requests/s an instance; compared within x{LOAD_MATCH:g}): CPU an instance spends "
        "whatever it serves would count against the lighter side"
    )


def _resources(
    base: ResourceUse | None, canary: ResourceUse | None, spec: AnalysisSpec
) -> list[Judged]:
    if base is None or canary is None:
        return [
            Judged("cpu_per_request", skip="no resource data"),
            Judged("memory", skip="no resource data"),
        ]
    if min(base.requests, canary.requests) < MIN_JUDGE:
        cpu = Judged(
            "cpu_per_request",
            skip=f"too few requests counted: baseline {base.requests}, canary {canary.requests}",
        )
    elif (unequal := _load_mismatch(base, canary)) is not None:
        cpu = Judged("cpu_per_request", skip=unequal)
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
        mem = Judged("memory", skip="accelerator memory not measured")
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


@dataclass(slots=True)
class _Side:
    """One side's answers as the columns the criteria read, in one pass (a look reads up
    to (RATIO_CAP + 1) x the step's samples a side; one pass instead of one a criterion)."""

    answers: int = 0
    errors: int = 0
    latency: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    tokens: list[float] = field(default_factory=list)
    empty: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)


def _columns(samples: Sequence[RequestSample]) -> _Side:
    side = _Side(answers=len(samples))
    for s in samples:
        st = s.status
        if st >= 500 or st < 100:
            side.errors += 1
        if not 100 <= st < 400:
            continue
        side.latency.append(s.latency_s)
        if s.ttft_s is not None:
            side.ttft.append(s.ttft_s)
        if s.tpot_s is not None:
            side.tpot.append(s.tpot_s)
        text = s.text
        if s.output_tokens is not None:
            side.tokens.append(s.output_tokens)
            side.empty.append(s.output_tokens == 0)
        elif text is not None:
            side.empty.append(not text.strip())
        if s.finish_reason is not None:
            side.truncated.append(s.finish_reason == "length")
        if text is not None and text.strip():
            side.texts.append(text)
    return side


def _table(base: Sequence[bool], canary: Sequence[bool]) -> Table:
    return Table(sum(base), len(base), sum(canary), len(canary))


def judge_all(
    baseline: Sequence[RequestSample],
    canary: Sequence[RequestSample],
    base_use: ResourceUse | None,
    canary_use: ResourceUse | None,
    spec: AnalysisSpec,
    prior: Strata,
) -> list[Judged]:
    """Every criterion on this window, in CRITERIA order (disabled ones included: the
    caller marks them); `prior` holds the earlier steps' tables."""
    b, c = _columns(baseline), _columns(canary)
    out = [
        _rate(
            "error_rate",
            "error_rate",
            Table(b.errors, b.answers, c.errors, c.answers),
            prior,
            spec.error_rate_max_increase,
            "answers",
        )
    ]
    timing = "successful answers"
    out.append(
        _quantile(
            "latency_p50",
            b.latency,
            c.latency,
            prior,
            0.5,
            spec.latency_p50_max_ratio,
            spec.latency_min_delta_s,
            timing,
        )
    )
    out.append(
        _quantile(
            "latency_p95",
            b.latency,
            c.latency,
            prior,
            0.95,
            spec.latency_p95_max_ratio,
            spec.latency_min_delta_s,
            timing,
        )
    )
    out.append(
        _quantile(
            "ttft_p95",
            b.ttft,
            c.ttft,
            prior,
            0.95,
            spec.ttft_p95_max_ratio,
            spec.latency_min_delta_s,
            "streamed answers (TTFT)",
        )
    )
    out.append(
        _quantile(
            "tpot_p50",
            b.tpot,
            c.tpot,
            prior,
            0.5,
            spec.tpot_p50_max_ratio,
            spec.tpot_min_delta_s,
            "streamed answers (TPOT)",
        )
    )
    out.append(
        _distribution(
            "output_length", b.tokens, c.tokens, spec.output_length_max_ks, "output lengths"
        )
    )
    out.append(
        _rate(
            "empty_rate",
            "empty_rate",
            _table(b.empty, c.empty),
            prior,
            spec.empty_rate_max_increase,
            "answers with output",
        )
    )
    out.append(
        _rate(
            "truncated_rate",
            "truncated_rate",
            _table(b.truncated, c.truncated),
            prior,
            spec.truncated_rate_max_increase,
            "answers with a finish reason",
        )
    )
    out.extend(_resources(base_use, canary_use, spec))
    out.append(_style(b.texts, c.texts, prior, spec))
    return out
