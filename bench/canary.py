"""Canary analysis that does not cry wolf: A/A and A/B rollouts of the real analysis and state
machine on a virtual clock.

    python bench/canary.py [--json] [--quick] [--runs N] [--seed S]
    python bench/canary.py --json --timed-only [--timed-runs N] [--timed-rates 5,20,50,200]

Each run is one rollout with the default `RolloutSpec` (steps 1..100%, 60 s holds, default
`AnalysisSpec`: 1% false rollbacks per rollout) of a baseline and a canary drawn from one
pool of requests: 0.5% errors, lognormal latency (TTFT + tokens x TPOT), lognormal output
length, 5% truncated, 0.5% empty, 1% refusals, the same texts. In A/A the canary draws
from that very pool; in A/B from the pool with one regression applied (`REGRESSIONS`).
Offered traffic (5-200 req/s; steady, bursty or diurnal) arrives each virtual second; the
canary gets the step's percent of it, each side's window is a reservoir as in
`control/samples.py` (`window_rows` of the plan's size), and the analysis runs, as the
controller runs it, whenever a second brings something that could change its verdict (a
canary answer, a baseline answer the fast path reads, a look falling due, the hold ending),
with the looks taken and the earlier steps' evidence threaded through the state machine.

Answers that take seconds (issue 32; `timed_rollout`, run first, `--timed-only` alone): a
pool whose answers take their latency to finish (TTFT ~0.4 s, heavy-tailed output lengths,
median ~3.5 s, the slowest over a minute), bursty traffic at 5, 20, 50 and 200 req/s, each
request routed under the split in force when it arrives (so every step change leaves long
answers of the old split in flight), each side read once a second at a lag; the window is
the controller's (by arrival, cut by `policy.windows.look_rows` at the horizon), or with
`--window finish` the one before issue 32 (answers finished since the step began). A/A per
rate (`--timed-runs`, 40) and the four TARGETS at 20 req/s (`--timed-ab-runs`, 20).

Reports, per configuration: A/A, the share of rollouts rolled back (false rollbacks) and
how long promotion took; A/B, the share of regressions caught, the share caught before the
canary passed `catch_by_percent` (8%), and the canary's percent, the time and the canary
answers when caught. `--json` prints one JSON line. See bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sluice.control.samples import LATENCY_HISTORY, window_rows  # noqa: E402
from sluice.policy import rollouts as machine  # noqa: E402
from sluice.policy.analysis import FAST_PREFIX, RequestSample, analyze  # noqa: E402
from sluice.policy.canary_plan import RATIO_CAP, RolloutPlan, plan_rollout  # noqa: E402
from sluice.policy.rollouts import RolloutPhase, RolloutState  # noqa: E402
from sluice.policy.windows import horizon_s, look_rows  # noqa: E402
from sluice.spec.rollouts import RolloutSpec  # noqa: E402

POOL = 20_000
"""Requests in a version's pool; both sides of an A/A run draw from the same one."""
PROSE = (
    "the order ships today and arrives on monday with tracking sent by mail so you can "
    "follow it each step of the way from our store to your door"
)
WORDS = tuple(PROSE.split())
REFUSAL = "I'm sorry, but I cannot help with that request."


# --- the versions ----------------------------------------------------------------------------


@dataclass
class Pool:
    """A version's requests as columns (so a regression is a vectorised edit) and as
    RequestSample objects (built once, reused by every run)."""

    status: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    tokens: np.ndarray
    truncated: np.ndarray
    text: list[str]
    samples: list[RequestSample] = field(default_factory=list)

    def build(self) -> Pool:
        out = []
        for i in range(len(self.status)):
            st = int(self.status[i])
            if st >= 500:
                out.append(RequestSample(st, 0.05))
                continue
            tokens = int(self.tokens[i])
            ttft, tpot = float(self.ttft[i]), float(self.tpot[i])
            out.append(
                RequestSample(
                    status=st,
                    latency_s=ttft + tokens * tpot,
                    ttft_s=ttft,
                    tpot_s=tpot,
                    output_tokens=tokens,
                    finish_reason="length" if self.truncated[i] else "stop",
                    text=self.text[i],
                )
            )
        self.samples = out
        return self

    def copy(self) -> Pool:
        return Pool(
            self.status.copy(),
            self.ttft.copy(),
            self.tpot.copy(),
            self.tokens.copy(),
            self.truncated.copy(),
            list(self.text),
        )


def texts(rng: np.random.Generator, n: int = 2000) -> list[str]:
    out = []
    for _ in range(n):
        sentences = []
        for _ in range(int(rng.integers(2, 5))):
            words = rng.choice(WORDS, int(rng.integers(6, 16)))
            sentences.append(" ".join(str(w) for w in words).capitalize() + ".")
        out.append(" ".join(sentences))
    return out


def baseline_pool(rng: np.random.Generator, n: int = POOL) -> Pool:
    """The A/A version: 0.5% errors, TTFT ~ 250 ms and TPOT ~ 20 ms (lognormal), output
    ~ 120 tokens (lognormal, sigma 0.6), 5% truncated, 0.5% empty, 1% refusals."""
    prose = texts(rng)
    text = [prose[int(i)] for i in rng.integers(0, len(prose), n)]
    for i in np.flatnonzero(rng.random(n) < 0.01):
        text[i] = REFUSAL
    tokens = np.maximum(1, np.round(rng.lognormal(math.log(120), 0.6, n))).astype(int)
    empty = rng.random(n) < 0.005
    tokens[empty] = 0
    for i in np.flatnonzero(empty):
        text[i] = ""
    return Pool(
        status=np.where(rng.random(n) < 0.005, 500, 200),
        ttft=rng.lognormal(math.log(0.25), 0.4, n),
        tpot=rng.lognormal(math.log(0.02), 0.25, n),
        tokens=tokens,
        truncated=rng.random(n) < 0.05,
        text=text,
    )


def _some(rng: np.random.Generator, pool: Pool, share: float, ok_only: bool = True) -> np.ndarray:
    """Indices of about `share` of the pool's (successful) requests."""
    hit = rng.random(len(pool.status)) < share
    if ok_only:
        hit &= pool.status < 500
    return np.flatnonzero(hit)


def _errors(rng: np.random.Generator, p: Pool) -> None:
    p.status[_some(rng, p, 0.02 / 0.995)] = 500  # +2 points: 0.5% -> 2.5%


def _scale_tail(p: Pool, factor: float, lo: float, hi: float) -> None:
    """Stretch the slow tail: requests above the lo-quantile of latency get slower, up to
    x factor at the hi-quantile and beyond; below lo nothing changes (p50 stays)."""
    latency = p.ttft + p.tokens * p.tpot
    u = np.argsort(np.argsort(latency)) / len(latency)
    f = 1 + (factor - 1) * np.clip((u - lo) / (hi - lo), 0, 1)
    p.ttft *= f
    p.tpot *= f


def _slower(p: Pool) -> None:
    p.ttft *= 1.2
    p.tpot *= 1.2


def _tpot(p: Pool) -> None:
    p.tpot *= 1.2


def _ttft_tail(p: Pool) -> None:
    u = np.argsort(np.argsort(p.ttft)) / len(p.ttft)
    p.ttft *= 1 + 0.5 * np.clip((u - 0.8) / 0.15, 0, 1)  # TTFT p95 +50%


def _length_shift(p: Pool) -> None:
    # lognormal sigma 0.6: x exp(2 sigma Phi^-1(0.65)) moves the CDF by 0.3 at its middle
    factor = math.exp(2 * 0.6 * 0.3853)
    p.tokens = np.where(p.tokens > 0, np.maximum(1, np.round(p.tokens * factor)), 0).astype(int)


def _empty(rng: np.random.Generator, p: Pool) -> None:
    idx = _some(rng, p, 0.02)
    p.tokens[idx] = 0
    for i in idx:
        p.text[i] = ""


def _truncated(rng: np.random.Generator, p: Pool) -> None:
    p.truncated[_some(rng, p, 0.04 / 0.95)] = True


def _refusals(rng: np.random.Generator, p: Pool) -> None:
    for i in _some(rng, p, 0.03):  # +3 points: 1% -> 4% of answers refuse
        p.text[i] = REFUSAL


REGRESSIONS: dict[str, tuple[str, Callable[[np.random.Generator, Pool], None]]] = {
    "errors": ("+2 points of 5xx (0.5% -> 2.5%)", _errors),
    "latency_p50": ("all latency x1.2 (p50 +20%)", lambda rng, p: _slower(p)),
    "latency_p95": (
        "slow tail +50% (p95 x1.5, p50 unchanged)",
        lambda rng, p: _scale_tail(p, 1.5, 0.8, 0.95),
    ),
    "ttft_p95": ("TTFT tail: p95 x1.5", lambda rng, p: _ttft_tail(p)),
    "tpot_p50": ("TPOT x1.2 (p50 +20%)", lambda rng, p: _tpot(p)),
    "output_length": ("output length shifted: KS D = 0.3", lambda rng, p: _length_shift(p)),
    "empty": ("+2 points of empty answers", _empty),
    "truncated": ("+4 points truncated (5% -> 9%)", _truncated),
    "style_refusals": ("+3 points of refusal phrases (1% -> 4%)", _refusals),
}
TARGETS = ("errors", "latency_p95", "output_length", "style_refusals")
"""The regressions the issue sets a target for: caught in >= 95% before 8% of traffic."""


# --- traffic ---------------------------------------------------------------------------------


def shape_rates(shape: str, rate: float, t0: int, n: int) -> np.ndarray:
    """Offered req/s for seconds t0 .. t0+n-1: steady; bursty (10 s at 1.8x, 10 s at 0.2x);
    diurnal (a 2-hour sine, 0.5x to 1.5x)."""
    t = np.arange(t0, t0 + n, dtype=float)
    if shape == "steady":
        return np.full(n, rate)
    if shape == "bursty":
        return np.where((t // 10) % 2 == 0, 1.8 * rate, 0.2 * rate)
    if shape == "diurnal":
        return rate * (1 + 0.5 * np.sin(2 * math.pi * t / 7200))
    raise ValueError(f"unknown traffic shape {shape!r}")


class Window:
    """One side's analysis window: algorithm R over pool indices, as GroupSamples.add."""

    def __init__(self, capacity: int, rng: np.random.Generator) -> None:
        self.capacity = capacity
        self.rows: list[RequestSample] = []
        self.seen = 0
        self._rng = rng

    def add(self, pool: Sequence[RequestSample], idx: np.ndarray) -> None:
        room = max(0, self.capacity - len(self.rows))
        head, tail = idx[:room], idx[room:]
        self.rows.extend(pool[int(i)] for i in head)
        self.seen += len(head)
        if len(tail):
            seen = self.seen + np.arange(1, len(tail) + 1)
            slots = (self._rng.random(len(tail)) * seen).astype(np.int64)
            for i, k in zip(tail, slots, strict=True):
                if k < self.capacity:
                    self.rows[int(k)] = pool[int(i)]
            self.seen += len(tail)

    def __len__(self) -> int:
        return len(self.rows)


# --- one rollout -----------------------------------------------------------------------------


@dataclass
class Outcome:
    phase: str
    seconds: float
    percent: float
    """the canary's step percent when the rollout ended (rolled back: where it was caught)"""
    canary_answers: int
    """canary answers over the whole rollout when it ended"""
    blamed: str
    fast: bool
    analyses: int


def rollout(
    spec: RolloutSpec,
    plan: RolloutPlan,
    base: Sequence[RequestSample],
    canary: Sequence[RequestSample],
    rate: float,
    shape: str,
    rng: np.random.Generator,
    max_s: float = 30 * 86400,
) -> Outcome:
    state = machine.start(spec, 0.0)
    t, analyses, canary_total, chunk = 0, 0, 0, 600
    canary_errors = 0  # in the canary window's fast-path prefix
    win_b = win_c = Window(1, rng)
    previous: list[RequestSample] = []
    window_at: float | None = None
    while not state.final and state.phase is not RolloutPhase.PAUSED and t < max_s:
        if state.step_started_at != window_at:  # a new step: new windows (samples.py reset)
            if window_at is not None:
                previous = win_b.rows
            window_at = state.step_started_at
            cap = window_rows(math.ceil((RATIO_CAP + 1) * plan.step(state.step).samples / 2))
            win_b, win_c = Window(cap, rng), Window(cap, rng)
            canary_errors = 0
        step = plan.step(state.step)
        reused = state.percent >= 100 and bool(previous)
        prior_errors = machine.evidence_before(state).fast.hits_canary
        share = state.percent / 100
        arrivals = rng.poisson(shape_rates(shape, rate, t + 1, chunk))
        to_canary = rng.binomial(arrivals, share)
        started = state.step_started_at or 0.0
        hold_edge = started + spec.hold_s
        pending_b: list[np.ndarray] = []
        moved = False
        for j in range(chunk):
            t += 1
            nc, nb = int(to_canary[j]), int(arrivals[j] - to_canary[j])
            if nb:
                pending_b.append(rng.integers(0, len(base), nb))
            if nc:
                room = FAST_PREFIX - len(win_c)
                idx = rng.integers(0, len(canary), nc)
                win_c.add(canary, idx)
                canary_total += nc
                canary_errors += sum(1 for i in idx[: max(0, room)] if canary[int(i)].error)
            n_b = len(previous) if reused else len(win_b) + sum(len(p) for p in pending_b)
            final_ready = t >= hold_edge
            record = state.steps[-1]
            due = step.due(min(n_b, len(win_c)), record.looks, final_ready)
            # a baseline answer can only change the fast path's verdict, and only while
            # the canary has errors in its part of it (else its evidence is below 1)
            reads_fast = nb and n_b - nb < FAST_PREFIX and (canary_errors or prior_errors)
            if not (nc or due or reads_fast or t == math.ceil(hold_edge)):
                continue
            for p in pending_b:
                win_b.add(base, p)
            pending_b = []
            analyses += 1
            before = state
            base_rows = previous if reused else win_b.rows
            state = _look(spec, plan, state, base_rows, win_c.rows, reused, final_ready, t)
            if (
                state.final
                or state.step_started_at != before.step_started_at
                or (state.phase is RolloutPhase.PAUSED)
            ):
                moved = True
                break
        if not moved:
            for p in pending_b:
                win_b.add(base, p)
    return _outcome(state, t, canary_total, analyses)


def _look(
    spec: RolloutSpec,
    plan: RolloutPlan,
    state: RolloutState,
    base: Sequence[RequestSample],
    canary: Sequence[RequestSample],
    reused: bool,
    final_ready: bool,
    t: float,
) -> RolloutState:
    """One analysis of the current step, as the controller runs it, fed to the state
    machine (the looks taken and the earlier steps' evidence threaded through it)."""
    analysis = analyze(
        base,
        canary,
        None,
        None,
        spec.analysis,
        plan.step(state.step),
        looks_done=state.steps[-1].looks,
        final_ready=final_ready,
        prior=machine.evidence_before(state, baseline_reused=reused),
        fast_alpha=plan.fast_alpha,
        baseline_reused=reused,
    )
    return machine.evaluate(spec, state, analysis, float(t))


def _outcome(state: RolloutState, t: int, canary_total: int, analyses: int) -> Outcome:
    blamed, fast, percent = "", False, state.percent
    if state.phase is RolloutPhase.ROLLED_BACK:
        last = state.steps[-1]
        percent = last.percent
        if last.analysis is not None:
            fast = last.analysis.fast
            blamed = ",".join(c.name for c in last.analysis.criteria if c.verdict == "fail")
    return Outcome(state.phase.value, float(t), percent, canary_total, blamed, fast, analyses)


# --- answers that take seconds --------------------------------------------------------------


TIMED_RATES = (5.0, 20.0, 50.0, 200.0)
TIMED_SHAPE = "bursty"
TIMED_READ_LAG_S = 1.0
"""Each side is read once a second, at a lag drawn from [0, this) (the poller's rounds)."""


def timed_pool(rng: np.random.Generator, n: int = POOL) -> Pool:
    """The baseline pool with a generative model's durations: TTFT ~ 0.4 s (lognormal,
    sigma 0.7), output ~ 150 tokens with a heavy tail (lognormal, sigma 1.0, at most
    4,096), TPOT ~ 20 ms: answers take seconds (median ~3.5 s), the slowest over a minute."""
    p = baseline_pool(rng, n)
    p.ttft = rng.lognormal(math.log(0.4), 0.7, n)
    tokens = np.minimum(4096, np.maximum(1, np.round(rng.lognormal(math.log(150), 1.0, n))))
    p.tokens = np.where(p.tokens > 0, tokens, 0).astype(int)
    return p


class Timed:
    """Requests on a virtual clock with their durations: arrival times (sorted), a uniform
    draw that picks the side under the split in force at arrival, a pool index, and, once
    the split is known, the side and the finish time."""

    def __init__(
        self,
        rng: np.random.Generator,
        rate: float,
        shape: str,
        pools: tuple[Sequence[RequestSample], Sequence[RequestSample]],
    ) -> None:
        self.rng, self.rate, self.shape = rng, rate, shape
        self.latency = tuple(np.array([s.latency_s for s in p]) for p in pools)
        self.arr = np.empty(0)
        self.u = np.empty(0)
        self.idx = np.empty(0, dtype=np.int64)
        self.canary = np.empty(0, dtype=bool)
        self.fin = np.empty(0)
        self.done = 0
        """requests routed so far (arrived by the last second processed)"""
        self.until = 0

    def _extend(self, seconds: int = 600) -> None:
        rates = shape_rates(self.shape, self.rate, self.until + 1, seconds)
        counts = self.rng.poisson(rates)
        starts = np.repeat(np.arange(self.until, self.until + seconds, dtype=float), counts)
        arr = starts + self.rng.random(len(starts))
        arr.sort()
        n = len(arr)
        self.arr = np.concatenate([self.arr, arr])
        self.u = np.concatenate([self.u, self.rng.random(n)])
        self.idx = np.concatenate([self.idx, self.rng.integers(0, len(self.latency[0]), n)])
        self.canary = np.concatenate([self.canary, np.zeros(n, dtype=bool)])
        self.fin = np.concatenate([self.fin, np.zeros(n)])
        self.until += seconds

    def route(self, t: float, share: float) -> None:
        """Requests arriving in (t - 1, t]: to the canary with probability `share`."""
        while self.until < t:
            self._extend()
        hi = int(np.searchsorted(self.arr, t, side="right"))
        sl = slice(self.done, hi)
        self.canary[sl] = self.u[sl] < share
        lat = np.where(
            self.canary[sl], self.latency[1][self.idx[sl]], self.latency[0][self.idx[sl]]
        )
        self.fin[sl] = self.arr[sl] + lat
        self.done = hi

    def seen(self, canary: bool, lo: int, read: float) -> np.ndarray:
        """Indices >= `lo` of one side's requests that had finished by `read`."""
        sl = slice(lo, self.done)
        return lo + np.flatnonzero((self.canary[sl] == canary) & (self.fin[sl] <= read))

    def history(self, through: float) -> np.ndarray:
        """Latencies of the last LATENCY_HISTORY answers finished by `through`."""
        lo = max(0, self.done - 4 * LATENCY_HISTORY)
        sl = slice(lo, self.done)
        lat = (self.fin[sl] - self.arr[sl])[self.fin[sl] <= through]
        return lat[-LATENCY_HISTORY:]


def timed_rollout(
    spec: RolloutSpec,
    plan: RolloutPlan,
    base: Sequence[RequestSample],
    canary: Sequence[RequestSample],
    rate: float,
    rng: np.random.Generator,
    window: str = "arrival",
    shape: str = TIMED_SHAPE,
    max_s: float = 30 * 86400,
) -> Outcome:
    """One rollout whose answers take their latency to finish, as the controller sees it:
    each second requests arrive and are routed under the split then in force, each side is
    read up to a lagged instant, and the window is the step's requests by arrival, cut by
    `look_rows` at a horizon from the latencies seen (`window="arrival"`, the controller's);
    or, as before issue 32, the answers that finished since the step began (`"finish"`).
    The state machine is fed when a look falls due, the hold ends, or every few seconds
    (the fast path; at low rates a look may so come a few seconds late, which changes no
    test's level). The window keeps a uniform sample of its step's answers (the reservoir's
    size), drawn afresh at each analysis."""
    state = machine.start(spec, 0.0)
    traffic = Timed(rng, rate, shape, (base, canary))
    t, analyses = 0, 0
    every = max(1, round(20 / rate))
    check_fast = max(10, every * round(50 / rate))
    max_latency = float(max(traffic.latency[0].max(), traffic.latency[1].max()))
    previous: list[RequestSample] = []
    window_at: float | None = None
    horizon = horizon_s(())
    pools = (base, canary)
    built: dict[int, RequestSample] = {}

    def rows_of(side: bool, picked: np.ndarray, cap: int) -> list[RequestSample]:
        if len(picked) > cap:
            picked = rng.choice(picked, cap, replace=False)
        picked = np.sort(picked)
        pool = pools[int(side)]
        out = []
        for i in picked.tolist():
            s = built.get(i)
            if s is None:
                s = built[i] = dataclasses.replace(
                    pool[int(traffic.idx[i])], arrived_at=float(traffic.arr[i])
                )
            out.append(s)
        return out

    while not state.final and state.phase is not RolloutPhase.PAUSED and t < max_s:
        t += 1
        traffic.route(float(t), state.percent / 100)
        step = plan.step(state.step)
        since = state.step_started_at or 0.0
        reused = state.percent >= 100 and bool(previous)
        cap = window_rows(math.ceil((RATIO_CAP + 1) * step.samples / 2))
        edge = t == math.ceil(since + spec.hold_s)
        if t % every and not edge:
            continue  # low rates: counted every few seconds, to bound the bench's time
        reads = {s: t - TIMED_READ_LAG_S * float(rng.random()) for s in (False, True)}
        through = reads[True] if reused else min(reads.values())
        if t % check_fast == 0 or window_at != since:
            horizon = horizon_s(traffic.history(through))
            window_at = since
        if window == "arrival":
            lo = int(np.searchsorted(traffic.arr, since, side="left"))
            seen = {s: traffic.seen(s, lo, reads[s]) for s in (False, True)}
            cut = through - horizon
            n = {
                s: int(np.count_nonzero((traffic.arr[v] <= cut) & (traffic.fin[v] <= through)))
                for s, v in seen.items()
            }
        else:
            lo = int(np.searchsorted(traffic.arr, since - max_latency, side="left"))
            seen = {s: traffic.seen(s, lo, reads[s]) for s in (False, True)}
            seen = {s: v[traffic.fin[v] >= since] for s, v in seen.items()}
            n = {s: len(v) for s, v in seen.items()}
        n_b = len(previous) if reused else min(n[False], cap)
        n_c = min(n[True], cap)
        final_ready = t >= since + spec.hold_s
        record = state.steps[-1]
        due = step.due(min(n_b, n_c), record.looks, final_ready)
        if not (due or edge or t % check_fast == 0):
            continue
        sides = {s: rows_of(s, v, cap) for s, v in seen.items()}
        if window == "arrival":
            sides = {s: look_rows(r, since, through, horizon) for s, r in sides.items()}
        analyses += 1
        before = state
        base_rows = previous if reused else sides[False]
        state = _look(spec, plan, state, base_rows, sides[True], reused, final_ready, t)
        if state.step_started_at != before.step_started_at and not state.final:
            previous = sides[False]  # the baseline's answers of the step before, as cut
    canary_total = int(np.count_nonzero(traffic.canary[: traffic.done]))
    return _outcome(state, t, canary_total, analyses)


def run_timed(
    kind: str, rate: float, runs: int, pools: dict[str, list[RequestSample]], seed: int, window: str
) -> dict[str, Any]:
    """`runs` rollouts of the default spec with answers that take seconds (`timed_pool`),
    bursty traffic, at `rate`: A/A (kind 'aa') or one of TARGETS."""
    spec = RolloutSpec(name="bench", baseline="base", canary="canary")
    plan = plan_rollout(spec)
    rng = np.random.default_rng([seed, zlib.crc32(f"timed {kind} {rate} {window}".encode())])
    outs = [
        timed_rollout(spec, plan, pools["timed aa"], pools[f"timed {kind}"], rate, rng, window)
        for _ in range(runs)
    ]
    back = [o for o in outs if o.phase == "rolled_back"]
    row: dict[str, Any] = {
        "kind": kind,
        "rate_rps": rate,
        "shape": TIMED_SHAPE,
        "window": window,
        "runs": runs,
        "analyses_per_run": round(sum(o.analyses for o in outs) / max(1, runs)),
    }
    if kind == "aa":
        done = [o.seconds for o in outs if o.phase == "promoted"]
        return row | {
            "false_rollbacks": len(back),
            "false_rollback_rate": len(back) / runs,
            "false_rollback_rate_upper95": _upper95(len(back), runs),
            "promoted": len(done),
            "hours_to_promote_median": None if not done else round(_q(done, 0.5) / 3600, 2),
            "false_rollback_blamed": dict(Counter(o.blamed for o in back)),
        }
    early = [o for o in back if o.percent <= spec.analysis.catch_by_percent]
    return row | {
        "regression": REGRESSIONS[kind][0],
        "caught": len(back) / runs,
        "caught_before_catch_by": len(early) / runs,
        "percent_at_catch_median": _q([o.percent for o in back], 0.5),
        "seconds_at_catch_median": _q([o.seconds for o in back], 0.5),
        "blamed": dict(Counter(o.blamed for o in back)),
    }


# --- the grid --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    kind: str  # "aa" or a REGRESSIONS key
    rate: float
    hold_s: float = 60.0
    shape: str = "steady"
    false_rollback_rate: float = 0.01


def grid(quick: bool) -> list[Config]:
    if quick:
        aa = [Config("aa", r) for r in (20, 200)]
        ab = [Config(k, 20) for k in TARGETS]
        return aa + ab
    aa = [Config("aa", r) for r in (5, 20, 50, 200)]
    aa += [Config("aa", 20, hold_s=h) for h in (15.0, 180.0)]
    aa += [Config("aa", 20, shape=s) for s in ("bursty", "diurnal")]
    # the same machinery at a 10x budget: is the promise kept, and how close to it?
    aa += [Config("aa", 20, false_rollback_rate=0.1)]
    ab = [Config(k, r) for k in REGRESSIONS for r in (5, 20, 200)]
    ab += [Config(k, 20, shape=s) for k in TARGETS for s in ("bursty", "diurnal")]
    ab += [Config(k, 20, hold_s=15.0) for k in TARGETS]
    return aa + ab


def _upper95(k: int, n: int) -> float:
    """One-sided 95% Clopper-Pearson upper bound of a rate seen k times in n runs."""
    return 1.0 if k >= n else float(stats.beta.ppf(0.95, k + 1, n - k))


def _q(xs: Sequence[float], q: float) -> float | None:
    return float(np.quantile(xs, q)) if xs else None


def run_config(
    cfg: Config, runs: int, pools: dict[str, list[RequestSample]], seed: int
) -> dict[str, Any]:
    spec = RolloutSpec.model_validate(
        {
            "name": "bench",
            "baseline": "base",
            "canary": "canary",
            "hold_s": cfg.hold_s,
            "analysis": {"false_rollback_rate": cfg.false_rollback_rate},
        }
    )
    plan = plan_rollout(spec)
    rng = np.random.default_rng([seed, zlib.crc32(repr(cfg).encode())])
    canary = pools["aa" if cfg.kind == "aa" else cfg.kind]
    outs = [rollout(spec, plan, pools["aa"], canary, cfg.rate, cfg.shape, rng) for _ in range(runs)]
    row: dict[str, Any] = {
        "kind": cfg.kind,
        "rate_rps": cfg.rate,
        "hold_s": cfg.hold_s,
        "shape": cfg.shape,
        "false_rollback_rate_promised": cfg.false_rollback_rate,
        "runs": runs,
        "analyses_per_run": round(sum(o.analyses for o in outs) / runs),
    }
    back = [o for o in outs if o.phase == "rolled_back"]
    if cfg.kind == "aa":
        done = [o.seconds for o in outs if o.phase == "promoted"]
        row |= {
            "false_rollbacks": len(back),
            "false_rollback_rate": len(back) / runs,
            "false_rollback_rate_upper95": _upper95(len(back), runs),
            "promoted": len(done),
            "hours_to_promote_median": None if not done else round(_q(done, 0.5) / 3600, 2),
            "false_rollback_blamed": dict(Counter(o.blamed for o in back)),
        }
        return row
    catch_by = spec.analysis.catch_by_percent
    early = [o for o in back if o.percent <= catch_by]
    row |= {
        "regression": REGRESSIONS[cfg.kind][0],
        "caught": len(back) / runs,
        "caught_before_catch_by": len(early) / runs,
        "catch_by_percent": catch_by,
        "fast_path": sum(o.fast for o in back),
        "percent_at_catch_median": _q([o.percent for o in back], 0.5),
        "percent_at_catch_max": max((o.percent for o in back), default=None),
        "seconds_at_catch_median": _q([o.seconds for o in back], 0.5),
        "seconds_at_catch_p90": _q([o.seconds for o in back], 0.9),
        "canary_answers_at_catch_median": _q([float(o.canary_answers) for o in back], 0.5),
        "blamed": dict(Counter(o.blamed for o in back)),
    }
    return row


def pools_for(seed: int) -> dict[str, list[RequestSample]]:
    """Each version's pool: instant answers under its name, answers that take seconds
    (`timed_pool`) under 'timed <name>' (the A/A one and the TARGETS)."""
    rng = np.random.default_rng(seed)
    base = baseline_pool(rng)
    out = {"aa": base.copy().build().samples}
    for name, (_, edit) in REGRESSIONS.items():
        p = base.copy()
        edit(rng, p)
        out[name] = p.build().samples
    slow = timed_pool(rng)
    out["timed aa"] = slow.copy().build().samples
    for name in TARGETS:
        p = slow.copy()
        REGRESSIONS[name][1](rng, p)
        out[f"timed {name}"] = p.build().samples
    return out


_POOLS: dict[str, list[RequestSample]] = {}


def _init(seed: int) -> None:
    _POOLS.update(pools_for(seed))


def _job(args: tuple[Config, int, int]) -> dict[str, Any]:
    cfg, runs, seed = args
    t0 = time.monotonic()
    row = run_config(cfg, runs, _POOLS, seed)
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


def _timed_job(args: tuple[str, float, int, int, str]) -> dict[str, Any]:
    kind, rate, runs, seed, window = args
    t0 = time.monotonic()
    row = run_timed(kind, rate, runs, _POOLS, seed, window)
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON line on stdout")
    ap.add_argument("--quick", action="store_true", help="a CI-sized smoke run (~1 min)")
    ap.add_argument("--runs", type=int, default=None, help="rollouts per A/A configuration")
    ap.add_argument("--ab-runs", type=int, default=None, help="rollouts per A/B configuration")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (configurations)")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument(
        "--timed-runs", type=int, default=None, help="A/A rollouts per rate, answers taking seconds"
    )
    ap.add_argument(
        "--timed-ab-runs", type=int, default=None, help="A/B rollouts per target, seconds, 20 req/s"
    )
    ap.add_argument(
        "--timed-rates",
        default=",".join(f"{r:g}" for r in TIMED_RATES),
        help="req/s of the runs with answers that take seconds (comma-separated)",
    )
    ap.add_argument(
        "--window",
        choices=("arrival", "finish"),
        default="arrival",
        help="the windows of those runs: by arrival with a horizon (the controller's), or "
        "by finish time (before issue 32), to compare",
    )
    ap.add_argument("--timed-only", action="store_true", help="only the runs that take seconds")
    args = ap.parse_args()
    aa_runs = args.runs or (10 if args.quick else 60)
    ab_runs = args.ab_runs or (10 if args.quick else 30)
    timed_runs = args.timed_runs or (4 if args.quick else 40)
    timed_ab_runs = (
        args.timed_ab_runs if args.timed_ab_runs is not None else (0 if args.quick else 20)
    )
    started = time.monotonic()
    spec = RolloutSpec(name="bench", baseline="base", canary="canary")
    plan = plan_rollout(spec)
    configs = [] if args.timed_only else grid(args.quick)
    timed_jobs = [
        ("aa", float(r), timed_runs, args.seed, args.window) for r in args.timed_rates.split(",")
    ]
    timed_jobs += [(k, 20.0, timed_ab_runs, args.seed, args.window) for k in TARGETS]
    timed_jobs = [j for j in timed_jobs if j[2] > 0]
    timed_jobs.sort(key=lambda j: -j[1] if j[0] == "aa" else 0.0)
    # the slowest first, so the workers finish together
    jobs = [(c, aa_runs if c.kind == "aa" else ab_runs, args.seed) for c in configs]
    jobs.sort(key=lambda j: (j[0].kind != "aa", j[0].rate))
    rows: list[dict[str, Any]] = []
    timed: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max(1, args.jobs), initializer=_init, initargs=(args.seed,)) as ex:
        for row in ex.map(_timed_job, timed_jobs):
            timed.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
        for row in ex.map(_job, jobs):
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    timed_aa = sorted((r for r in timed if r["kind"] == "aa"), key=lambda r: r["rate_rps"])
    timed_ab = [r for r in timed if r["kind"] != "aa"]
    order = {c: i for i, c in enumerate(configs)}
    rows.sort(
        key=lambda r: order[
            Config(
                r["kind"], r["rate_rps"], r["hold_s"], r["shape"], r["false_rollback_rate_promised"]
            )
        ]
    )
    aa = [r for r in rows if r["kind"] == "aa"]
    ab = [r for r in rows if r["kind"] != "aa"]
    aa_all = sum(r["false_rollbacks"] for r in aa if r["false_rollback_rate_promised"] == 0.01)
    aa_n = sum(r["runs"] for r in aa if r["false_rollback_rate_promised"] == 0.01)
    timed_all = sum(r["false_rollbacks"] for r in timed_aa)
    timed_n = sum(r["runs"] for r in timed_aa)
    targets: dict[str, Any] = {
        "timed_window": args.window,
        "timed_aa_false_rollbacks": f"{timed_all} of {timed_n}",
        "timed_aa_false_rollback_rate_upper95_pooled": (
            round(_upper95(timed_all, timed_n), 4) if timed_n else None
        ),
        "timed_aa_per_rate": {
            f"{r['rate_rps']:g}": [
                r["false_rollbacks"],
                r["runs"],
                round(r["false_rollback_rate_upper95"], 4),
            ]
            for r in timed_aa
        },
        "timed_ab_caught_before_8pct_min": min(
            (r["caught_before_catch_by"] for r in timed_ab), default=None
        ),
    }
    if not aa or not ab:
        targets |= {"aa_false_rollbacks_at_1pct": None}
    else:
        targets |= {
            "aa_false_rollbacks_at_1pct": f"{aa_all} of {aa_n}",
            "aa_false_rollback_rate_upper95_pooled": round(_upper95(aa_all, aa_n), 4),
            "aa_within_promise_everywhere": all(
                r["false_rollback_rate"] <= r["false_rollback_rate_promised"] for r in aa
            ),
            "ab_targets_caught_before_8pct_min": min(
                r["caught_before_catch_by"] for r in ab if r["kind"] in TARGETS
            ),
            "ab_targets_at_least_95pct_everywhere": all(
                r["caught_before_catch_by"] >= 0.95 for r in ab if r["kind"] in TARGETS
            ),
        }
    result = {
        "bench": "canary",
        "quick": args.quick,
        "seed": args.seed,
        "false_rollback_rate_promised": spec.analysis.false_rollback_rate,
        "samples_per_step": [s.samples for s in plan.steps],
        "samples_set_by": plan.driver,
        "canary_answers_by_catch_by": plan.catch_samples(),
        "catch_by_percent": spec.analysis.catch_by_percent,
        "targets": targets,
        "aa": aa,
        "ab": ab,
        "timed_aa": timed_aa,
        "timed_ab": timed_ab,
        "wall_s": round(time.monotonic() - started, 1),
    }
    if args.json:
        print(json.dumps(result))
        return
    _print_tables(result)


def _print_tables(r: dict[str, Any]) -> None:
    print(
        f"plan: {r['samples_per_step'][0]} answers a side per step (set by "
        f"{r['samples_set_by']}), {r['canary_answers_by_catch_by']} canary answers by "
        f"{r['catch_by_percent']:g}%; promised false rollbacks <= "
        f"{r['false_rollback_rate_promised']:.0%} per rollout"
    )
    print("\nA/A: rate  hold  shape   budget  runs  false rollbacks (95% upper)  promoted in")
    for a in r["aa"]:
        print(
            f"     {a['rate_rps']:>4g}  {a['hold_s']:>4g}  {a['shape']:<7} "
            f"{a['false_rollback_rate_promised']:>5.0%}  {a['runs']:>4}  "
            f"{a['false_rollbacks']:>3} ({a['false_rollback_rate']:.1%}, "
            f"{a['false_rollback_rate_upper95']:.1%})          "
            f"{a['hours_to_promote_median']} h"
        )
    print("\nA/B: kind            rate  shape   hold  caught  by 8%   at % (med/max)  at s (med)")
    for b in r["ab"]:
        print(
            f"     {b['kind']:<15} {b['rate_rps']:>4g}  {b['shape']:<7} {b['hold_s']:>4g}  "
            f"{b['caught']:>5.0%}  {b['caught_before_catch_by']:>5.0%}   "
            f"{b['percent_at_catch_median']}/{b['percent_at_catch_max']}        "
            f"{b['seconds_at_catch_median']}"
        )
    print("\nanswers taking seconds (bursty): rate  window   runs  false rollbacks (95% upper)")
    for a in r["timed_aa"]:
        print(
            f"     {a['rate_rps']:>4g}  {a['window']:<7}  {a['runs']:>4}  "
            f"{a['false_rollbacks']:>3} ({a['false_rollback_rate']:.1%}, "
            f"{a['false_rollback_rate_upper95']:.1%})  blamed {a['false_rollback_blamed']}"
        )
    for b in r["timed_ab"]:
        print(
            f"     A/B {b['kind']:<15} {b['rate_rps']:>4g}  caught {b['caught']:.0%}, "
            f"by 8% {b['caught_before_catch_by']:.0%}"
        )
    print(f"\ntargets: {r['targets']}; {r['wall_s']} s")


if __name__ == "__main__":
    main()
