"""Clairvoyant references for a policy's cost: the oracle plan, the best fixed fleet, and the
strict work floor.

What each number bounds (instance-seconds, on one trace and instance model):

- **work floor** = sum(service time) / slots per instance. A strict lower bound for ANY
  policy, clairvoyant or not: every request holds one slot for its service time, and a slot
  exists only while its instance runs. It ignores start-up, `min`, and the fact that
  capacity comes in whole instances, so it is usually far below anything reachable.
- **best fixed N**: the smallest constant fleet that reaches the SLO target (found by
  bisection, each N simulated). An upper bound on what a good policy should pay; what an
  operator without an autoscaler would buy.
- **oracle**: plans the instance count per second knowing every future arrival, launching
  `startup_s` ahead so capacity is ready in time, and keeps the cheapest plan that reaches
  the SLO target among a searched family (per-window mean or peak of the offered
  concurrency over windows of 1 s - 2 min, a headroom factor found by bisection; each
  candidate run through the same simulator as every policy, `sluice.sim.single.run`), with
  the best fixed N as one candidate. So it is never dearer than the best fixed fleet. It
  is a *reference*, not a proven optimum: a plan outside the family could be cheaper. It
  does bound what a causal policy with the same start-up delay can reach within that
  family of plans.

- **warm start** (`sluice.sim.warm`): the count the oracle's run holds at t = 0, ready for
  every policy at t = 0 (`SimOptions.initial`), so that no policy pays a cold start the
  oracle never pays. Without it a live policy starts at its spec's count and the oracle, as
  it always did, at its own t = 0 need. `oracle(work, SimOptions(initial=k))` runs every
  candidate from k ready.

Batching instances (`InstanceModel.batching`): a request's service time is its latency
alone on an idle instance. The work floor stays a strict bound (a request never runs faster
than alone: a larger batch, other sequences' KV, prefill pauses and preemption only slow
it; and an instance holds at most max_concurrency); the oracle's profile is sized on it
and its headroom search absorbs the batch's slowdown, each candidate being run with
batching instances like every policy.

A per-second "capacity needed" profile (ceil(offered concurrency / slots)) is NOT a lower
bound once queueing within the SLO is allowed: a request may wait up to its slack, so a burst
can be served by fewer instances over a longer time. That is why the oracle's headroom may
go below 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.policy.autoscale import Decision, FixedPolicy, GroupLoad, NoMemory
from sluice.sim.result import SimResult
from sluice.sim.single import SimOptions, run
from sluice.sim.workload import Workload

__all__ = ["OracleResult", "PlanPolicy", "best_fixed", "oracle", "work_floor"]

_GRID_S = 0.1
_FAMILIES: tuple[tuple[str, float], ...] = (
    ("peak", 1.0),
    ("peak", 2.0),
    ("peak", 3.0),
    ("peak", 5.0),
    ("peak", 10.0),
    ("mean", 2.0),
    ("mean", 5.0),
    ("mean", 10.0),
    ("mean", 30.0),
    ("mean", 120.0),
)


class PlanPolicy:
    """Follows a precomputed per-second plan; asks at `t` for the most the plan needs over
    [t, t + lead_s], so instances launched now are ready when they are needed. A
    `ScalingPolicy` that remembers nothing (`NoMemory`): the plan is its configuration, and
    the count depends on the time alone."""

    name = "oracle"

    def __init__(self, plan: npt.NDArray[np.int64], lead_s: float, epoch: float) -> None:
        lead = max(0, math.ceil(lead_s)) + 1
        padded = np.concatenate([plan, np.full(lead, plan[-1] if plan.size else 0)])
        windows = np.lib.stride_tricks.sliding_window_view(padded, lead + 1)
        self.ahead: list[int] = windows.max(axis=1)[: plan.size].tolist() or [0]
        self.epoch = epoch

    @property
    def start(self) -> int:
        """The count it asks for at t = 0: the instances a run of it begins with ready."""
        return self.ahead[0]

    def initial(self) -> NoMemory:
        return NoMemory()

    def step(self, memory: NoMemory, load: GroupLoad, now: float) -> tuple[Decision, NoMemory]:
        """The planned count at trace second `now - epoch` (seconds)."""
        s = min(max(int(now - self.epoch), 0), len(self.ahead) - 1)
        decision = Decision(desired=self.ahead[s], reason="clairvoyant plan", winner="oracle")
        return decision, memory


def work_floor(work: Workload) -> float:
    """Instance-seconds no policy can go below (see the module docstring)."""
    return work.work_floor_instance_seconds


@dataclass(frozen=True)
class OracleResult:
    result: SimResult
    plan: str
    """which candidate won, e.g. 'mean/60s x0.85' or 'fixed:9'"""
    evaluated: int
    best_fixed_n: int | None
    best_fixed: SimResult | None

    @property
    def initial(self) -> int:
        """Instances ready at t = 0 in the winning run."""
        return self.result.initial_instances


def _meets(res: SimResult) -> bool:
    s = res.summary()
    return bool(s["slo_attainment"] >= s["slo_target"])


def best_fixed(work: Workload, opts: SimOptions | None = None) -> tuple[int | None, SimResult]:
    """Smallest fixed N in [min, max] that reaches the SLO target (bisection). Returns
    (None, run at max) when even max does not. Each fleet starts with N ready, unless
    `opts.initial` says otherwise (a warm start: that many ready, then N asked for)."""
    m = work.model
    o = opts or SimOptions()
    span = max(work.trace.span_s, 1.0)
    lo = max(m.min_instances, 1, math.ceil(work.work_floor_instance_seconds / span))
    lo = min(lo, m.max_instances)
    cache: dict[int, SimResult] = {}

    def at(n: int) -> SimResult:
        if n not in cache:
            cache[n] = run(work, FixedPolicy(n), o)
        return cache[n]

    if _meets(at(lo)):
        return lo, at(lo)
    hi = lo
    while not _meets(at(hi)):
        if hi >= m.max_instances:
            return None, at(hi)
        lo, hi = hi, min(m.max_instances, hi * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _meets(at(mid)):
            hi = mid
        else:
            lo = mid
    return hi, at(hi)


def oracle(work: Workload, opts: SimOptions | None = None, steps: int = 9) -> OracleResult:
    """The cheapest plan found that reaches the SLO target, knowing the future. Each candidate
    starts with its own t = 0 need ready (a plan: what it asks for at t = 0; a fixed fleet: N),
    unless `opts.initial` is set: then every candidate starts from that many ready (see
    `sluice.sim.warm`)."""
    o = opts or SimOptions()
    m = work.model
    n_fixed, fixed_res = best_fixed(work, o)
    best: tuple[float, SimResult, str] | None = None
    if n_fixed is not None:
        best = (fixed_res.instance_seconds, fixed_res, f"fixed:{n_fixed}")
        if n_fixed <= m.min_instances:  # nothing can be cheaper than always `min`
            return OracleResult(fixed_res, best[2], 1, n_fixed, fixed_res)
    occ = _occupancy(work)
    evaluated = 0
    for stat, window in _FAMILIES:
        profile = _window_stat(occ, stat, window)
        lo, hi = 0.2, 3.0
        for _ in range(steps):
            h = (lo + hi) / 2
            plan = np.clip(
                np.ceil(h * profile / m.slots - 1e-9), m.min_instances, m.max_instances
            ).astype(np.int64)
            policy = PlanPolicy(plan, m.startup_s, o.epoch)
            res = run(work, policy, _with_initial(o, policy.start))
            evaluated += 1
            if _meets(res):
                hi = h
                if best is None or res.instance_seconds < best[0]:
                    best = (res.instance_seconds, res, f"{stat}/{window:g}s x{h:.3f}")
            else:
                lo = h
    if best is None:
        return OracleResult(
            fixed_res, "none reaches the target (max shown)", evaluated, None, fixed_res
        )
    return OracleResult(best[1], best[2], evaluated, n_fixed, fixed_res)


def _with_initial(o: SimOptions, initial: int) -> SimOptions:
    """`o` as given when it sets `initial` (a warm start), else with `initial`."""
    if o.initial is not None:
        return o
    return SimOptions(
        seed=o.seed,
        crash_rate_per_hour=o.crash_rate_per_hour,
        slow_start_prob=o.slow_start_prob,
        slow_start_factor=o.slow_start_factor,
        initial=initial,
        epoch=o.epoch,
        decision_log=o.decision_log,
    )


def _occupancy(work: Workload) -> npt.NDArray[np.float64]:
    """Offered concurrency (requests in service if every one started at once) on a 0.1 s
    grid, from t = 0 to the last completion."""
    t = work.trace.t
    end = t + work.service
    size = math.ceil((float(end.max()) if end.size else 1.0) / _GRID_S) + 2
    diff = np.zeros(size + 1)
    np.add.at(diff, (t / _GRID_S).astype(np.int64), 1.0)
    np.add.at(diff, (end / _GRID_S).astype(np.int64), -1.0)
    return np.cumsum(diff)[:size]


def _window_stat(occ: npt.NDArray[np.float64], stat: str, window_s: float) -> Any:
    """Per-second profile: each second gets the mean or peak occupancy of its window."""
    per = round(window_s / _GRID_S)
    blocks = math.ceil(occ.size / per)
    padded = np.zeros(blocks * per)
    padded[: occ.size] = occ
    shaped = padded.reshape(blocks, per)
    vals = shaped.mean(axis=1) if stat == "mean" else shaped.max(axis=1)
    seconds = math.ceil(occ.size * _GRID_S)
    return np.repeat(vals, round(window_s))[: max(seconds, 1)]
