"""Canary-vs-baseline analysis (C3) of one step's window: the fast path for gross failures
on every call, the criteria at the step's planned looks. Pure. The design and the error rate
a rollout promises are in `sluice.policy.canary_plan`; the tests in `sluice.policy.evidence`;
each criterion's evidence in `sluice.policy.criteria`.

| verdict | when                                                                           |
|---------|--------------------------------------------------------------------------------|
| fail    | fast path: the canary fails at least `gross_error_rate` of its answers where    |
|         | the baseline fails under a quarter of that (both by sequential evidence); or, at |
|         | a look, a criterion rejected by Holm at the look's alpha with an effect of at   |
|         | least half its smallest regression worth catching, or a resource ratio over    |
|         | its limit                                                                      |
| pass    | the step's last look (enough answers, the hold over) failed nothing            |
| wait    | otherwise: no look due yet, or an earlier look failed nothing                  |

A criterion is `fail` or `pass` when judged at a look, `wait` between looks, `skip` when
disabled, not applicable (no text: embeddings), with too few answers of its kind, or not
observed by the samples' source (`unobserved`: the gateway records what it sees of the
answers of servers that keep no samples, `GATEWAY_UNSEEN`; a missing field never counts as
zero).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sluice.policy.canary_plan import FAST_SHARE, StepPlan, single_look
from sluice.policy.criteria import (
    REFUSAL_PHRASES,
    STYLE_FEATURES,
    Judged,
    judge_all,
    style_features,
)
from sluice.policy.evidence import Table, holm, sprt_log_ratio
from sluice.spec.rollouts import CRITERIA, AnalysisSpec, CriterionName

__all__ = [
    "FAST_PREFIX",
    "GATEWAY_UNSEEN",
    "NO_PRIOR",
    "REFUSAL_PHRASES",
    "STYLE_FEATURES",
    "Analysis",
    "Criterion",
    "Prior",
    "RequestSample",
    "ResourceUse",
    "Table",
    "Verdict",
    "analyze",
    "style_features",
    "unobserved",
]

Verdict = Literal["pass", "fail", "wait", "skip"]

FAST_PREFIX = 1000
"""The fast path reads each step's first answers of each side, this many at most: while the
window holds fewer than its capacity (5,000 at least) they are exactly the first to arrive,
so the counts grow as one sequence, which its sequential test needs."""


GATEWAY_UNSEEN: Mapping[CriterionName, str] = {
    "cpu_per_request": "the server reports no CPU time per request (not Sluice's worker)",
    "memory": "the server reports no memory (not Sluice's worker)",
}
"""What the gateway's rows lack. They carry status, latency, time to the first body byte of a
streamed answer (as TTFT), and what the answer says of itself (`sluice.policy.answers`: output
tokens from `usage` or a stream's chunks, finish reason, time per output token, and the start
of the text on a sample of rows), so every other criterion is judged; one the answers do not
feed (a server that gives no usage) reads "too few ... to judge"."""


TIMING: tuple[CriterionName, ...] = ("latency_p50", "latency_p95", "ttft_p95", "tpot_p50")
REUSED_BASELINE_TIMING = (
    "not comparable at this step: the baseline's answers are the step before's, and timing "
    "drifts with the hour, the machine's other load and each instance's share of the traffic "
    "(judged at the steps where both sides answered side by side)"
)
"""Why the 100% step judges no timing. With no baseline traffic left, its answers are compared
with the baseline's of an earlier window, and a latency test between two windows measures
whatever changed between them as readily as the version (Kayenta's advice: never compare a
canary with a baseline that is not running alongside it). Errors, lengths, truncation and
style are the version's own and stay judged."""


def unobserved(base_from_gateway: bool, canary_from_gateway: bool) -> dict[str, str]:
    """The criteria the two sides' sample sources cannot judge, and why: none when both
    are Sluice's workers; `GATEWAY_UNSEEN` when either side's rows are the gateway's
    (prefixed `not observed (...)`); TTFT too when only one is, since the gateway's time to
    first byte is not a worker's time to first token."""
    if not (base_from_gateway or canary_from_gateway):
        return {}
    side = (
        "both sides"
        if base_from_gateway and canary_from_gateway
        else ("the baseline" if base_from_gateway else "the canary")
    )
    out: dict[str, str] = {
        n: f"not observed ({side} sampled by the gateway): {why}"
        for n, why in GATEWAY_UNSEEN.items()
    }
    if base_from_gateway != canary_from_gateway:
        out["ttft_p95"] = (
            f"not comparable ({side} sampled by the gateway): its time to the first byte "
            "is not a worker's time to the first token"
        )
    return out


@dataclass(frozen=True, slots=True)
class RequestSample:
    """One answered request as the instance saw it. Times in seconds; `ttft_s` and `tpot_s`
    only for streamed generations; `text`: a prefix of the output (for style drift);
    `arrived_at`: when the request arrived (epoch s; None: unknown), which says under which
    split it was routed (`sluice.policy.windows`)."""

    status: int
    latency_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None
    text: str | None = None
    arrived_at: float | None = None

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> RequestSample:
        """From a worker's `/sluice/samples` row (or the gateway's): `arrived_at` if the row
        has it, else its finish time `at` less its latency; other keys (seq, model) are
        ignored."""

        def opt(key: str, kind: type[float] | type[int] | type[str]) -> Any:
            value = row.get(key)
            return None if value is None else kind(value)

        latency = float(row["latency_s"])
        arrived = opt("arrived_at", float)
        if arrived is None and row.get("at") is not None:
            arrived = float(row["at"]) - latency
        return cls(
            status=int(row["status"]),
            latency_s=latency,
            arrived_at=arrived,
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
    """One side's resource use over the window: `cpu_s` CPU seconds its instances spent while
    serving `requests` requests over `instance_s` instance-seconds; `memory_gb` peak
    accelerator memory of one instance (None: not measured)."""

    requests: int
    cpu_s: float
    memory_gb: float | None = None
    instance_s: float = 0.0
    """Instance-seconds the counters cover (0: unknown), for per-instance load."""


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
    alpha: float | None = None
    """the level its p-value was held against (Holm's, at this look)"""

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
            "alpha": _finite(self.alpha),
        }


@dataclass(frozen=True, slots=True)
class Analysis:
    """All criteria for one window, and the overall verdict (never `skip`). `look`: the
    planned look this call took (1-based; 0: none was due, criteria were not judged) of
    `looks`; `alpha`: what that look spent; `fast`: the verdict is the fast path's;
    `tables`: this window's 2x2 tables, which later steps pool (`Prior`); `after`: the
    looks already taken when it ran (`looks_done`): the state machine accepts its look only
    if that is still the count, so a look is never spent twice."""

    verdict: Literal["pass", "fail", "wait"]
    reason: str
    criteria: tuple[Criterion, ...]
    baseline_samples: int
    canary_samples: int
    look: int = 0
    looks: int = 1
    next_look: int | None = None
    alpha: float = 0.0
    fast: bool = False
    tables: dict[str, Table] = field(default_factory=dict)
    after: int = 0

    def criterion(self, name: str) -> Criterion | None:
        return next((c for c in self.criteria if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "baseline_samples": self.baseline_samples,
            "canary_samples": self.canary_samples,
            "look": self.look,
            "looks": self.looks,
            "next_look": self.next_look,
            "alpha": self.alpha,
            "fast": self.fast,
            "tables": {k: t.to_json() for k, t in self.tables.items()},
            "after": self.after,
            "criteria": [c.to_json() for c in self.criteria],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Analysis:
        """Also reads archives from before planned looks (no look fields: one look)."""
        nxt = data.get("next_look")
        return cls(
            verdict=data["verdict"],
            reason=str(data["reason"]),
            baseline_samples=int(data["baseline_samples"]),
            canary_samples=int(data["canary_samples"]),
            criteria=tuple(Criterion(**c) for c in data["criteria"]),
            look=int(data.get("look", 1)),
            looks=int(data.get("looks", 1)),
            next_look=None if nxt is None else int(nxt),
            alpha=float(data.get("alpha", 0.0)),
            fast=bool(data.get("fast", False)),
            tables={k: Table.from_json(v) for k, v in data.get("tables", {}).items()},
            after=int(data.get("after", max(0, int(data.get("look", 1)) - 1))),
        )


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


@dataclass(frozen=True, slots=True)
class Prior:
    """What the rollout's earlier steps saw: each step's 2x2 tables (strata, pooled by the
    rate and quantile criteria) and the fast path's error counts so far (`Table`: errors and
    answers of each side)."""

    strata: tuple[Mapping[str, Table], ...] = ()
    fast: Table = field(default_factory=lambda: Table(0, 0, 0, 0))


NO_PRIOR = Prior()


def _errors(samples: Sequence[RequestSample]) -> tuple[int, int]:
    head = samples[:FAST_PREFIX]
    return len([1 for s in head if s.status >= 500 or s.status < 100]), len(head)


def _fast(total: Table, spec: AnalysisSpec, alpha: float) -> Criterion | None:
    """The gross-failure check: two Wald sequential tests, both past log(1/alpha): the
    canary's error rate is G rather than at most G/4, and the baseline's G/20 rather than at
    least G/4 (G = `gross_error_rate`). Whatever rate both versions share, one of the two
    nulls holds, so a good canary trips both with probability at most alpha however often
    this is read. A canary with no successful answer at all trips it within ~20 answers."""
    g = spec.gross_error_rate
    llr_c = sprt_log_ratio(total.hits_canary, total.n_canary, g / 4, g)
    llr_b = sprt_log_ratio(total.hits_base, total.n_base, g / 4, g / 20)
    bar = math.log(1 / alpha)
    if llr_c < bar or llr_b < bar:
        return None
    rc = total.hits_canary / total.n_canary
    rb = total.hits_base / total.n_base
    reason = (
        f"gross failure, rolled back between looks: the canary failed {total.hits_canary} of "
        f"{total.n_canary} answers ({rc:.1%}; gross at {g:.0%}), the baseline "
        f"{total.hits_base} of {total.n_base} ({rb:.1%}); sequential evidence e^{llr_c:.1f} "
        f"and e^{llr_b:.1f}, both past 1/{alpha:.2g}"
    )
    return Criterion(
        "error_rate",
        "fail",
        reason,
        baseline=rb,
        canary=rc,
        statistic=rc,
        threshold=g,
        p_value=math.exp(-llr_c),
        alpha=alpha,
    )


def _decide(
    judged: list[Judged], alpha: float, disabled: set[str], unseen: Mapping[str, str]
) -> list[Criterion]:
    """Holm over the tested criteria at the look's `alpha`; a rejection fails only with an
    effect large enough to act on. Resource ratios fail on their own. Criteria `unseen`
    (by the samples' source) are skipped with its reason, tested or not."""
    tested: dict[str, float] = {
        j.name: j.p
        for j in judged
        if j.p is not None and j.skip is None and j.name not in disabled and j.name not in unseen
    }
    levels = holm(tested, alpha)
    out = []
    for j in judged:
        nums: dict[str, Any] = dict(
            baseline=j.baseline, canary=j.canary, statistic=j.statistic, threshold=j.threshold
        )
        if j.name in disabled:
            out.append(Criterion(j.name, "skip", "disabled in the rollout spec"))
        elif j.name in unseen:
            out.append(Criterion(j.name, "skip", unseen[j.name]))
        elif j.skip is not None:
            out.append(Criterion(j.name, "skip", j.skip))
        elif j.p is None:
            out.append(Criterion(j.name, "fail" if j.act else "pass", j.text, **nums))
        else:
            level = levels[j.name]
            rejected = j.p <= level
            if rejected and j.act:
                verdict: Verdict = "fail"
                why = f" <= {level:.2g} (Holm, look alpha {alpha:.2g})"
            elif rejected:
                verdict = "pass"
                why = "; significant, but under half the smallest regression worth catching"
            else:
                verdict = "pass"
                why = f"; would need p <= {level:.2g}" if level > 0 else ""
            out.append(Criterion(j.name, verdict, j.text + why, p_value=j.p, alpha=level, **nums))
    return out


def analyze(
    baseline: Sequence[RequestSample],
    canary: Sequence[RequestSample],
    base_use: ResourceUse | None,
    canary_use: ResourceUse | None,
    spec: AnalysisSpec,
    step: StepPlan | None = None,
    *,
    looks_done: int = 0,
    final_ready: bool = True,
    prior: Prior = NO_PRIOR,
    fast_alpha: float | None = None,
    baseline_reused: bool = False,
    unobserved: Mapping[str, str] | None = None,
) -> Analysis:
    """Analyse one step's window (both sides' answers since the step began).

    `step`: the step's plan (`RolloutPlan.step`; default: one look at `min_samples` or 100
    spending the evidence budget, for one-off comparisons); `looks_done`: looks this stay
    has taken (the state machine counts them, so each is taken once); `final_ready`: the
    hold is over, so the last look may be taken; `prior`: earlier steps' evidence;
    `fast_alpha`: the fast path's level (default its share of `false_rollback_rate`);
    `baseline_reused`: the baseline's answers are an earlier step's (the 100% step), so
    they add nothing new to the fast path's counts and its timing is not judged
    (`REUSED_BASELINE_TIMING`); `unobserved`: criteria the samples'
    source cannot see (name -> why; see `unobserved()`), skipped with that reason."""
    step = step if step is not None else single_look(spec)
    if fast_alpha is None:
        fast_alpha = spec.false_rollback_rate * FAST_SHARE
    disabled: set[str] = set(spec.disable)
    hidden = [n for n in CRITERIA if n in (unobserved or {}) and n not in disabled]
    unseen: dict[str, str] = dict(unobserved or {})
    if baseline_reused:
        unseen.update({n: REUSED_BASELINE_TIMING for n in TIMING if n not in unseen})
    n_b, n_c = len(baseline), len(canary)
    eb, nb = (0, 0) if baseline_reused else _errors(baseline)
    ec, nc = _errors(canary)
    fast_now = Table(eb, nb, ec, nc)
    tables: dict[str, Table] = {"fast": fast_now}
    gross = None
    if "error_rate" not in disabled:
        f = prior.fast
        total = Table(f.hits_base + eb, f.n_base + nb, f.hits_canary + ec, f.n_canary + nc)
        gross = _fast(total, spec, fast_alpha)
    look = step.due(min(n_b, n_c), looks_done, final_ready)
    if look:
        alpha = step.spent(looks_done, look)
        judged = judge_all(baseline, canary, base_use, canary_use, spec, prior.strata)
        for j in judged:
            tables.update(j.tables)
        crits = _decide(judged, alpha, disabled, unseen)
    else:
        alpha = 0.0
        nxt = step.next_look(looks_done)
        why = f"judged at the next look ({nxt} answers a side)" if nxt else "all looks taken"
        crits = [
            Criterion(n, "skip", "disabled in the rollout spec")
            if n in disabled
            else Criterion(n, "skip", unseen[n])
            if n in unseen
            else Criterion(n, "wait", why)
            for n in CRITERIA
        ]
    if gross is not None:
        crits = [gross if c.name == "error_rate" else c for c in crits]
    done = look or looks_done
    out = _overall(crits, n_b, n_c, step, look, done, alpha, gross is not None, tables, hidden)
    return replace(out, after=looks_done)


def _overall(
    crits: list[Criterion],
    n_b: int,
    n_c: int,
    step: StepPlan,
    look: int,
    done: int,
    alpha: float,
    fast: bool,
    tables: dict[str, Table],
    unseen: Sequence[str] = (),
) -> Analysis:
    k = len(step.looks)
    nxt = step.next_look(done)
    fails = [c for c in crits if c.verdict == "fail"]
    passed = sum(c.verdict == "pass" for c in crits)
    skipped = sum(c.verdict == "skip" for c in crits)
    verdict: Literal["pass", "fail", "wait"]
    if fails:
        verdict = "fail"
        reason = "; ".join(f"{c.name} failed: {c.reason}" for c in fails)
    elif look == k:
        verdict = "pass"
        reason = f"look {k}/{k} at {min(n_b, n_c)} answers a side: {passed} criteria passed"
        reason += f", {skipped} skipped"
        if unseen:  # the source could not see them: say which (each says why)
            reason += f" ({len(unseen)} not observed by the samples' source: {', '.join(unseen)})"
    elif look:
        verdict = "wait"
        reason = f"look {look}/{k} failed nothing ({passed} criteria passed); next look at "
        reason += f"{nxt} answers a side"
    elif nxt is not None and min(n_b, n_c) < nxt:
        verdict = "wait"
        reason = f"too few answers for look {done + 1}/{k}: baseline {n_b}, canary {n_c}, "
        reason += f"need {nxt} each"
    else:
        verdict = "wait"
        reason = "enough answers for the last look, which waits for the hold"
    return Analysis(verdict, reason, tuple(crits), n_b, n_c, look, k, nxt, alpha, fast, tables)
