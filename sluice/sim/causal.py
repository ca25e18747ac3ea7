"""A causal reference (issue 16): what a strategy that sees only the past could reach, so a
policy's cost can be read against what is possible, not only against the clairvoyant oracle.

Where capacity asked for at a burst's first second arrives `startup_s` later, no causal
policy can follow the oracle's plan. This module runs a simple causal family through the
same simulator instead (`sluice.sim.single.run`, the kernel's `step` every tick):

- Time is cut into windows of `W` seconds; window k is [kW, (k+1)W).
- Each window's **need** is the smallest fixed fleet (ready from the window's start) that
  meets the SLO target on that window's requests alone: `best_fixed` (bisection) on a
  workload of just those requests (`Trace.transform(start, duration)`, their service times
  and SLO bounds as priced for the whole trace). An empty window needs `min`.
- The count for window k is chosen from the needs of windows before k only, by a look-back
  rule: `prev` (the last window's need), `max3` (the most of the last three; `max10` on
  request), times a headroom h: N_k = ceil(h x rule). Window 0 has no past: it keeps the
  starting fleet (`SimOptions.initial`, e.g. the warm start, else the spec's count, what a
  live autoscaler starts with: `start_count`).
- The count is asked for at window k's first tick (`WindowPlanPolicy`): instances launched
  then are ready `startup_s` later; nothing is launched before the window starts.

For a given (W, rule, h), N_k depends only on requests that arrived before kW. One small
leak is documented rather than hidden: a window's need replays its requests to completion,
so a request that arrived just before the window's end contributes its whole service time,
which a live system learns (from its output tokens) only when it finishes, at most 30 s
plus its wait later.

Tuning and the pick are hindsight, like the tuned HPA / KPA rows and the oracle's own
headroom: each (W, rule) climbs the headroom grid `HEADROOMS` to the first value that
reaches the target (refined by bisection), and the result is the cheapest candidate that
reaches it. That is one W, one rule and one scalar chosen after seeing the whole run, so it
is reported as "best causal of the family", not as a bound: a causal strategy outside the
family could do better, and one that must commit to W and h in advance could do worse.
Every candidate is listed, with its untuned (h = 1) run.

Cost: each W's needs take a few short bisections per window; the candidates share runs
(identical plans run once), are climbed the most promising first, and a climb stops once it
costs as much as a candidate that already reached the target (it cannot win, as a larger
headroom asks for at least as many instances in every window). On the reference model the
Azure code trace (8.8k requests, 57 min) takes about 3 s, Mooncake (4k, 17 min) about 1 s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from sluice.policy.autoscale import Decision, GroupLoad, NoMemory
from sluice.sim.oracle import best_fixed
from sluice.sim.result import SimResult
from sluice.sim.single import SimOptions, run, start_count
from sluice.sim.workload import Workload

__all__ = [
    "DEFAULT_RULES",
    "HEADROOMS",
    "HINDSIGHT_NOTE",
    "RULES",
    "WINDOWS_S",
    "CausalCandidate",
    "CausalResult",
    "WindowPlanPolicy",
    "causal",
    "causal_plan",
    "start_count",
    "window_needs",
]

WINDOWS_S: tuple[float, ...] = (10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
"""window lengths tried by default (seconds)"""
RULES: dict[str, int] = {"prev": 1, "max3": 3, "max10": 10}
"""look-back rule -> how many past windows' needs it takes the most of"""
DEFAULT_RULES: tuple[str, ...] = ("prev", "max3")
HEADROOMS: tuple[float, ...] = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
"""headroom grid a candidate climbs until it reaches the SLO target (1 = the rule itself);
the step that first reaches it is then refined by bisection"""
_REFINE = 3
HINDSIGHT_NOTE = (
    "each candidate's window counts see only past windows; its headroom and the choice of "
    "the cheapest (window, rule, headroom) that reaches the target are made after the run, "
    "a hindsight choice: best causal of the family, not a bound"
)


class WindowPlanPolicy:
    """Asks at every tick of window k = floor(t / window_s) for `plan[k]` (the last entry
    after the plan ends). No look-ahead: a window's instances are asked for at its first
    tick and are ready `startup_s` later. A `ScalingPolicy` that remembers nothing
    (`NoMemory`): the plan is its configuration."""

    name = "causal"

    def __init__(self, plan: Sequence[int], window_s: float, epoch: float) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be > 0")
        self.plan: list[int] = [int(n) for n in plan] or [0]
        self.window_s = window_s
        self.epoch = epoch

    def initial(self) -> NoMemory:
        return NoMemory()

    def step(self, memory: NoMemory, load: GroupLoad, now: float) -> tuple[Decision, NoMemory]:
        k = min(max(int((now - self.epoch) // self.window_s), 0), len(self.plan) - 1)
        decision = Decision(
            desired=self.plan[k],
            reason=f"window {k} ({self.window_s:g} s): count from past windows",
            winner="causal",
        )
        return decision, memory


@dataclass(frozen=True)
class CausalCandidate:
    """One member of the family, run through the simulator."""

    window_s: float
    rule: str
    headroom: float
    """N_k = ceil(headroom x the rule's count); 1.0 = the rule as it stands"""
    plan: tuple[int, ...]
    """N_k: the count asked for from the start of window k"""
    slo_attainment: float
    instance_seconds: float
    reaches_target: bool
    result: SimResult = field(repr=False, compare=False)
    tuning: str = "as_is"
    """'as_is' (the grid's first headroom reaches the target), 'tuned' (a larger one does),
    'unreached' (none on the grid does: the best attainment shown), 'pruned' (stopped
    once it cost as much as a cheaper candidate that reached the target)"""
    untuned: dict[str, Any] | None = field(default=None, compare=False)
    """the same window and rule at the grid's first headroom (`describe(plan=False)`)"""

    @property
    def label(self) -> str:
        return f"window {self.window_s:g}s / {self.rule} x{self.headroom:g}"

    def describe(self, plan: bool = True) -> dict[str, Any]:
        """The JSON row of this candidate."""
        row: dict[str, Any] = {
            "window_s": self.window_s,
            "rule": self.rule,
            "headroom": self.headroom,
            "slo_attainment": self.slo_attainment,
            "instance_seconds": self.instance_seconds,
            "reaches_target": self.reaches_target,
        }
        if plan:
            row["tuning"] = self.tuning
            row["plan"] = list(self.plan)
            if self.untuned is not None and self.untuned["headroom"] != self.headroom:
                row["untuned"] = self.untuned
        return row


@dataclass(frozen=True)
class CausalResult:
    best: CausalCandidate
    """the cheapest candidate that reaches the target; when none does, the best attainment
    (the cheapest among equals): `chosen_for` says which"""
    chosen_for: str
    """'slo_target' or 'best_attainment'"""
    candidates: tuple[CausalCandidate, ...]
    start: int
    """instances ready at t = 0 (window 0's count)"""
    needs: dict[float, tuple[int, ...]]
    """per window length: each window's need, the input of the look-back rules"""

    @property
    def result(self) -> SimResult:
        return self.best.result


def window_needs(work: Workload, window_s: float, opts: SimOptions | None = None) -> list[int]:
    """Each window's need: the smallest fixed fleet, ready from the window's start, that
    meets the SLO target on that window's requests alone (`max` when none does; `min` for
    an empty window). Windows cover [0, last arrival]."""
    if window_s <= 0:
        raise ValueError("window_s must be > 0")
    m = work.model
    o = replace(opts or SimOptions(), initial=None)  # a fixed fleet of N starts with N
    t = work.trace.t
    count = int(work.trace.span_s // window_s) + 1 if len(work.trace) else 0
    needs: list[int] = []
    for k in range(count):
        start = k * window_s
        keep = (t >= start) & (t < start + window_s)  # Trace.transform's window
        if not keep.any():
            needs.append(m.min_instances)
            continue
        sub = Workload(
            m,
            work.trace.transform(start=start, duration=window_s),
            work.service[keep],
            work.limit[keep],
        )
        n, _ = best_fixed(sub, o)
        needs.append(m.max_instances if n is None else n)
    return needs


def causal_plan(
    needs: Sequence[int],
    lookback: int,
    start: int,
    lo: int = 0,
    hi: int | None = None,
    headroom: float = 1.0,
) -> list[int]:
    """N_0 = `start`; N_k = ceil(headroom x the most of needs[k - lookback : k]), within
    [lo, hi]: window k's count reads windows before k only."""
    if lookback < 1 or headroom <= 0:
        raise ValueError("lookback must be >= 1 and headroom > 0")
    plan = [start] if needs else []
    for k in range(1, len(needs)):
        n = math.ceil(headroom * max(needs[max(0, k - lookback) : k]) - 1e-9)
        plan.append(min(max(n, lo), hi) if hi is not None else max(n, lo))
    return plan


def causal(
    work: Workload,
    opts: SimOptions | None = None,
    windows: Sequence[float] = WINDOWS_S,
    rules: Sequence[str] = DEFAULT_RULES,
    headrooms: Sequence[float] = HEADROOMS,
) -> CausalResult:
    """Every (window, rule) candidate of the family through the simulator, from the same start
    (`start_count`), each at the first headroom of the grid that reaches the target, and
    the best of them (see the module docstring)."""
    o = opts or SimOptions()
    m = work.model
    if any(r not in RULES for r in rules) or not rules or not windows:
        raise ValueError(f"rules must be among {', '.join(RULES)}; windows non-empty")
    if not headrooms or list(headrooms) != sorted(headrooms) or headrooms[0] <= 0:
        raise ValueError("headrooms must be ascending and > 0")
    start = start_count(m, o)
    run_opts = replace(o, initial=start)
    target = m.slo.target
    needs_by: dict[float, tuple[int, ...]] = {}
    runs: dict[tuple[float, tuple[int, ...]], SimResult] = {}  # rules often agree on a plan

    def at(w: float, rule: str, h: float) -> CausalCandidate:
        plan = causal_plan(
            needs_by[w], RULES[rule], start, m.min_instances, m.max_instances, headroom=h
        )
        key = (w, tuple(plan))
        if key not in runs:
            runs[key] = run(work, WindowPlanPolicy(plan, w, o.epoch), run_opts)
        res = runs[key]
        att = float(res.summary()["slo_attainment"])
        return CausalCandidate(
            w, rule, h, tuple(plan), att, res.instance_seconds, att >= target, res
        )

    pairs = [(float(w), rule) for w in windows for rule in rules]
    for w, _ in pairs:
        if w not in needs_by:
            needs_by[w] = tuple(window_needs(work, w, o))
    # every candidate as it stands first, then the headroom climbs, the most promising first,
    # so that a cheap run that reaches the target prunes the dear climbs early
    first = {p: at(*p, headrooms[0]) for p in pairs}
    order = sorted(
        pairs,
        key=lambda p: (-first[p].slo_attainment, first[p].instance_seconds),
    )
    done: dict[tuple[float, str], CausalCandidate] = {}
    bar = math.inf  # the cheapest run that reached the target so far
    for p in order:
        c = _climb(partial(at, *p), first[p], headrooms, bar)
        done[p] = c
        if c.reaches_target:
            bar = min(bar, c.instance_seconds)
    found = [done[p] for p in pairs]
    ok = [c for c in found if c.reaches_target]
    if ok:
        best, why = min(ok, key=lambda c: c.instance_seconds), "slo_target"
    else:
        best = max(found, key=lambda c: (c.slo_attainment, -c.instance_seconds))
        why = "best_attainment"
    return CausalResult(best, why, tuple(found), start, needs_by)


def _climb(
    at: Callable[[float], CausalCandidate],
    first: CausalCandidate,
    headrooms: Sequence[float],
    bar: float,
    refine: int = _REFINE,
) -> CausalCandidate:
    """Walk up the headroom grid from `first` (the run at its first value). The first value
    that reaches the target brackets the cheapest that does with the value below it (a
    larger headroom asks for at least as many instances in every window); `refine`
    bisection steps narrow it. Stops early once a run costs `bar` or more (an earlier
    candidate reached the target for that much: this one cannot win). Without a reaching
    run: the best attainment seen (the cheaper among equals)."""
    best = first
    how = "unreached"
    below: float | None = None
    for h in headrooms:
        c = first if h == first.headroom else at(h)
        if c.reaches_target:
            best, how = c, "as_is" if c is first else "tuned"
            if below is not None:
                lo, hi = below, h
                for _ in range(refine):
                    mid = (lo + hi) / 2
                    m = at(mid)
                    if m.reaches_target:
                        hi = mid
                        best = min(best, m, key=lambda x: x.instance_seconds)
                    else:
                        lo = mid
            break
        if (c.slo_attainment, -c.instance_seconds) > (best.slo_attainment, -best.instance_seconds):
            best = c
        if c.instance_seconds >= bar:
            how = "pruned"
            break
        below = h
    return replace(best, tuning=how, untuned=first.describe(plan=False))
