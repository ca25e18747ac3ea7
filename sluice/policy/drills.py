"""Judging a peak drill (O5): did autoscaling react to a peak, in time, enough?

The live drill (real gateway) and the simulated one (the simulator) both yield per-second
`DrillSample`s, the autoscaler's `ScaleEvent`s and each new instance's `InstanceUp`; this
module turns them into a pass/fail `DrillReport` against `DrillCriteria` stated up front.
Every failure says what broke with its numbers and the likely cause, and the report
answers the troubleshooting questions in order: did the metric trigger, did the instances
come up, did traffic reach them. A drill whose peak never needed more instances is a fail
(it tested nothing), never a silent pass.

When a scheduled drill is due (`due_firing`, the last section) follows Kubernetes
CronJob semantics. At each look the drill fires for the latest cron firing after the last
one it handled, at most once however many passed (a controller down for a day runs one
drill when it is back, not 24). A firing found later than `starting_deadline_s` after its
time is *missed*: it is recorded and not run, since a peak rehearsed hours late lands on
traffic nobody planned for. The concurrency policy is CronJob's `Forbid` and lives with the
caller: a drill still running, or any drill on the same group, makes a due firing
*skipped* (two peaks on one group would judge each other's scale-ups).

Pure: the readings come in with their times (seconds since the drill's start); firing
times are Unix seconds handed in, cron fields read in the entry's time zone.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

__all__ = [
    "MAX_COUNTED",
    "RECOVERY_GRACE_S",
    "THROUGHPUT_ROSE",
    "DrillCriteria",
    "DrillPlan",
    "DrillReport",
    "DrillSample",
    "DueFiring",
    "Finding",
    "InstanceUp",
    "ScaleEvent",
    "due_firing",
    "judge_drill",
    "latest_firing",
    "next_firing",
    "time_to_ready_tolerance",
    "time_to_scale_tolerance",
]

THROUGHPUT_ROSE = 1.10
"""Without per-instance counts, traffic reached the new instances if the completed rate
after the first one was ready beat the best rate before it by this factor."""
SMOOTH = 5
"""Samples (about seconds) in the moving average of the completed rate."""


@dataclass(frozen=True, slots=True)
class DrillSample:
    """One reading, about once a second; counts are over the interval ending at `t_s`."""

    t_s: float
    offered_rps: float
    desired: int
    ready: int
    queued: float
    completed: int
    in_slo: int
    shed: int
    errors: int


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    """An autoscaler decision that changed the count; `clipped_by` names the limits that
    bound it ("max", "quota", "budget", ...)."""

    t_s: float
    before: int
    after: int
    reason: str
    clipped_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class InstanceUp:
    """`ready_s` None: never came up during the drill; `served` None: unknown."""

    instance: str
    launched_s: float
    ready_s: float | None
    served: int | None


@dataclass(frozen=True, slots=True)
class DrillCriteria:
    """Stated up front and printed in the report. Times are from the peak's start."""

    max_time_to_scale_s: float = 30.0
    max_time_to_ready_s: float | None = None
    """None: not judged (the CLI fills it: the group's startup x 2 + time to scale)"""
    max_time_to_recover_s: float = 120.0
    min_slo_attainment: float = 0.9
    """in_slo / completed over the peak"""
    max_shed_rate: float = 0.05
    """shed / offered over the drill"""
    queue_target: float = 1.0
    """queued requests per ready instance that count as recovered"""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class DrillPlan:
    """`needed_instances`: ceil(peak_rps / measured rate per instance); None: unknown."""

    peak_start_s: float
    peak_end_s: float
    base_rps: float
    peak_rps: float
    max_instances: int
    start_instances: int
    needed_instances: int | None

    def __post_init__(self) -> None:
        if not self.peak_end_s > self.peak_start_s:
            raise ValueError(
                f"peak_end_s ({self.peak_end_s}) must be after peak_start_s ({self.peak_start_s})"
            )
        if self.max_instances < 1 or self.start_instances < 0:
            raise ValueError("max_instances must be >= 1 and start_instances >= 0")


@dataclass(frozen=True, slots=True)
class Finding:
    answer: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class DrillReport:
    verdict: str
    """pass | fail"""
    reasons: list[str]
    criteria: DrillCriteria
    first_scale_up_s: float | None
    instances_ready_s: list[float]
    queue_recovered_s: float | None
    slo_attainment: float | None
    shed: int
    shed_rate: float
    hit_max: bool
    hit_quota: bool
    hit_budget: bool
    peak_desired: int
    peak_ready: int
    did_the_metric_trigger: Finding
    did_the_instances_come_up: Finding
    did_traffic_reach_them: Finding

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = _rounded(asdict(self))
        out["milestones"] = {k: out.pop(k) for k in MILESTONES}
        return out


MILESTONES = ("first_scale_up_s", "instances_ready_s", "queue_recovered_s")
"""Times from the peak's start, grouped under "milestones" in the report's JSON."""


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def judge_drill(
    plan: DrillPlan,
    samples: Sequence[DrillSample],
    scale_events: Sequence[ScaleEvent],
    instances: Sequence[InstanceUp],
    criteria: DrillCriteria,
    limits_hit: Mapping[str, bool] | None = None,
) -> DrillReport:
    """The drill's verdict: "pass" iff no criterion failed. `limits_hit`: limits the caller
    saw bind outside the scale events (e.g. {"quota": True} from the control plane)."""
    if not samples:
        raise ValueError("samples: a drill needs at least one reading")
    seen = sorted(samples, key=lambda s: s.t_s)
    limits = dict(limits_hit or {})
    start = plan.peak_start_s
    reasons: list[str] = []

    too_small = plan.needed_instances is not None and plan.needed_instances <= plan.start_instances
    if too_small:
        reasons.append(
            f"the peak ({plan.peak_rps:.3g} rps) needs {plan.needed_instances} instance(s), "
            f"which the {plan.start_instances} starting instance(s) already cover: it was too "
            "small to exercise the autoscaler (raise --peak)"
        )

    # did the metric trigger?
    ups = sorted(
        (e for e in scale_events if e.after > e.before and e.t_s >= start), key=lambda e: e.t_s
    )
    first_up = ups[0].t_s - start if ups else None
    clipped = {name for e in scale_events for name in e.clipped_by}
    peak_desired = max(s.desired for s in seen)
    peak_ready = max(s.ready for s in seen)
    if first_up is None:
        trigger = Finding(
            False,
            f"no scale-up decision after the peak started; desired peaked at {peak_desired}",
        )
        cause = (
            "as expected of a peak the starting instances cover"
            if too_small
            else "check autoscaling.targets (utilization, queue_per_instance, latency_p95_ms) "
            "and that targets.window_s is shorter than the peak"
        )
        reasons.append(
            "the metric did not trigger: no scale-up decision after the peak started "
            f"(desired peaked at {peak_desired}); {cause}"
        )
    else:
        e = ups[0]
        trigger = Finding(
            True,
            f"first scale-up {first_up:.1f} s after the peak started ({e.before} -> {e.after}: "
            f"{e.reason}); desired peaked at {peak_desired}",
        )
        if first_up > criteria.max_time_to_scale_s:
            reasons.append(
                f"first scale-up {first_up:.1f} s after the peak started, over the "
                f"{criteria.max_time_to_scale_s:.0f} s limit: the signal is slow to move "
                "(shorten targets.window_s or the decision tick)"
            )

    # did the instances come up?
    new = [i for i in instances if i.launched_s >= start]
    up = sorted(i.ready_s - start for i in new if i.ready_s is not None)
    pending = [i.instance for i in new if i.ready_s is None]
    hit_max = (
        "max" in clipped
        or limits.get("max", False)
        or (
            peak_desired >= plan.max_instances
            and plan.needed_instances is not None
            and plan.needed_instances > plan.max_instances
        )
    )
    hit_quota = "quota" in clipped or limits.get("quota", False)
    hit_budget = "budget" in clipped or limits.get("budget", False)
    bound = [
        n for n, hit in (("max", hit_max), ("quota", hit_quota), ("budget", hit_budget)) if hit
    ]
    come_up = Finding(
        bool(up),
        f"{len(up)} of {len(new)} launched instance(s) became ready"
        + (f", the first {up[0]:.1f} s after the peak started" if up else "")
        + (f"; never ready: {', '.join(pending)}" if pending else "")
        + f"; ready peaked at {peak_ready} (desired {peak_desired}, max {plan.max_instances})"
        + (f"; bound by {', '.join(bound)}" if bound else ""),
    )
    if first_up is not None and not up:
        why = "bound by " + ", ".join(bound) if bound else "check the launches' logs"
        reasons.append(
            f"the autoscaler asked for more but no new instance became ready ({len(new)} "
            f"launched, {len(pending)} never ready): {why}"
        )
    elif up and criteria.max_time_to_ready_s is not None and up[0] > criteria.max_time_to_ready_s:
        reasons.append(
            f"the first new instance was ready {up[0]:.1f} s after the peak started, over the "
            f"{criteria.max_time_to_ready_s:.0f} s limit: instances start slowly (check the "
            "image pull and model load, or keep a warm spare with autoscaling.min)"
        )
    if hit_max and (plan.needed_instances is None or plan.needed_instances > plan.max_instances):
        wanted = plan.needed_instances if plan.needed_instances is not None else "more"
        reasons.append(
            f"the autoscaler wanted {wanted} but max is {plan.max_instances}: the group hit "
            "its max (raise autoscaling.max or its quota)"
        )
    if hit_quota:
        reasons.append("a quota bound the scale-up: the group hit its quota (raise it)")
    if hit_budget:
        reasons.append("the budget bound the scale-up: the group hit its budget (raise it)")

    # did traffic reach them?
    reach = _reach(seen, new, up, start)
    if not reach.answer and up and any(i.served is not None for i in new):
        reasons.append(
            f"traffic did not reach the new instances ({reach.detail}): check the gateway's "
            "routing to them (health checks, the routing snapshot)"
        )

    # the outcome: queue, SLO, shedding
    recovered = _recovered(seen, start, criteria.queue_target)
    if recovered is None:
        reasons.append(
            f"the queue never got back under {criteria.queue_target:g} per ready instance "
            "and stayed there: the instances added were too few or came too late"
        )
    elif recovered > criteria.max_time_to_recover_s:
        reasons.append(
            f"the queue recovered {recovered:.1f} s after the peak started, over the "
            f"{criteria.max_time_to_recover_s:.0f} s limit"
        )
    if recovered is not None and start + recovered > plan.peak_end_s:
        reasons.append(
            "the queue drained only after the peak ended: the new instances never caught up "
            "(lengthen the hold, or see time to ready)"
        )
    peak = [s for s in seen if start <= s.t_s < plan.peak_end_s]
    done = sum(s.completed for s in peak)
    attainment = sum(s.in_slo for s in peak) / done if done else None
    if attainment is None:
        reasons.append("no request completed during the peak: nothing to judge the SLO by")
    elif attainment < criteria.min_slo_attainment:
        reasons.append(
            f"{attainment:.1%} of the peak's answers were within the SLO, under "
            f"{criteria.min_slo_attainment:.0%}"
        )
    shed = sum(s.shed for s in seen)
    offered = sum(s.offered_rps * dt for s, dt in zip(seen, _intervals(seen), strict=True))
    shed_rate = shed / offered if offered > 0 else 0.0
    if shed_rate > criteria.max_shed_rate:
        reasons.append(
            f"{shed_rate:.1%} of the offered requests were shed ({shed}), over "
            f"{criteria.max_shed_rate:.0%}"
        )

    return DrillReport(
        verdict="fail" if reasons else "pass",
        reasons=reasons,
        criteria=criteria,
        first_scale_up_s=first_up,
        instances_ready_s=up,
        queue_recovered_s=recovered,
        slo_attainment=attainment,
        shed=shed,
        shed_rate=shed_rate,
        hit_max=hit_max,
        hit_quota=hit_quota,
        hit_budget=hit_budget,
        peak_desired=peak_desired,
        peak_ready=peak_ready,
        did_the_metric_trigger=trigger,
        did_the_instances_come_up=come_up,
        did_traffic_reach_them=reach,
    )


def _intervals(seen: Sequence[DrillSample]) -> list[float]:
    """Each sample's interval: the gap since the one before (the first takes the next gap,
    a lone sample 1 s)."""
    gaps = [b.t_s - a.t_s for a, b in itertools.pairwise(seen)]
    return [gaps[0] if gaps else 1.0, *gaps]


RECOVERY_GRACE_S = 5.0
"""A queue back over target for less than this (from its first reading over to its last) is
a burst the instances absorb, not a relapse: Poisson arrivals at two-thirds of capacity
queue a few requests for a second or two now and then (a 5-minute simulated 20 rps peak of
examples/capacity.yaml's `elastic` on 3 instances has 1-2 s bursts of 5-9 queued about
once a minute), and without a grace the last such burst, not the scale-up, would set the
time to recover (292 s there, against 4 s)."""


def _recovered(seen: Sequence[DrillSample], start: float, target: float) -> float | None:
    """From the peak's start, when the queue got under `target` per ready instance for
    good: after the peak's own first excursion over it (however short), no excursion
    lasted `RECOVERY_GRACE_S` (None: it was over at the last reading for that long, or
    never back under)."""
    since: float | None = None
    over_from: float | None = None
    first_over = True  # until the peak's first excursion has ended
    for s in seen:
        if s.t_s < start:
            continue
        if s.queued <= target * max(s.ready, 1):
            if over_from is not None:
                first_over, over_from = False, None
            since = s.t_s if since is None else since
            continue
        over_from = s.t_s if over_from is None else over_from
        if first_over or s.t_s - over_from >= RECOVERY_GRACE_S:
            since = None
    return None if since is None else since - start


def _reach(
    seen: Sequence[DrillSample], new: Sequence[InstanceUp], up: Sequence[float], start: float
) -> Finding:
    if not up:
        return Finding(False, "no new instance was ready to take traffic")
    known = [i for i in new if i.ready_s is not None and i.served is not None]
    if known:
        served = ", ".join(f"{i.instance} {i.served}" for i in known)
        return Finding(any((i.served or 0) > 0 for i in known), f"requests served: {served}")
    rates = [s.completed / dt for s, dt in zip(seen, _intervals(seen), strict=True)]
    smooth = [
        sum(rates[max(0, k - SMOOTH + 1) : k + 1]) / (k + 1 - max(0, k - SMOOTH + 1))
        for k in range(len(rates))
    ]
    first_ready = start + up[0]
    before = [v for s, v in zip(seen, smooth, strict=True) if s.t_s < first_ready]
    after = [v for s, v in zip(seen, smooth, strict=True) if s.t_s >= first_ready]
    if not before or not after:
        return Finding(False, "too few readings around the first ready instance to tell")
    b, a = max(before), max(after)
    return Finding(
        a > THROUGHPUT_ROSE * b,
        f"completed rate peaked at {b:.3g} rps before the first new instance was ready and "
        f"{a:.3g} rps after (per-instance counts unknown)",
    )


def time_to_scale_tolerance(tick_s: float, sample_s: float = 1.0) -> float:
    """How far a live and a simulated drill of the same group may differ on time to scale
    (first scale-up from the peak's start): 2 x tick_s + 2 x sample_s. Both see the same
    arrival schedule, but the live decision tick's phase against the peak start is
    arbitrary (up to one tick), and the live arrivals' noise moves the instant the averaged
    signal crosses its threshold, which can cost one more tick; the gateway's counters
    reach the autoscaler about one sample late, and each side reads the decision at
    `sample_s` granularity (one more sample)."""
    if not (math.isfinite(tick_s) and tick_s > 0):
        raise ValueError(f"tick_s must be > 0, got {tick_s}")
    if not (math.isfinite(sample_s) and sample_s >= 0):
        raise ValueError(f"sample_s must be >= 0, got {sample_s}")
    return 2 * tick_s + 2 * sample_s


def time_to_ready_tolerance(tick_s: float, startup_s: float, sample_s: float = 1.0) -> float:
    """The same for time to the first new instance ready: time to scale's tolerance plus a
    quarter of `startup_s`, the jitter of a real start-up (image cache, model load) that a
    simulator's fixed start-up does not have."""
    if not (math.isfinite(startup_s) and startup_s >= 0):
        raise ValueError(f"startup_s must be >= 0, got {startup_s}")
    return time_to_scale_tolerance(tick_s, sample_s) + 0.25 * startup_s


# -- when a scheduled drill is due (CronJob semantics, module docstring) -----------------

MAX_COUNTED = 100
"""Passed-over firings are counted up to this (CronJob's own limit on what it looks at)."""


@dataclass(frozen=True, slots=True)
class DueFiring:
    at: float
    """the firing's scheduled time"""
    late_s: float
    """how long after `at` it was found"""
    missed: bool
    """found past the starting deadline: record it, do not run it"""
    passed_over: int
    """earlier firings since the last one handled, never run (at most `MAX_COUNTED`)"""


def next_firing(cron: str, timezone: str, after: float) -> float:
    """The first firing strictly after `after`."""
    zone = ZoneInfo(timezone)
    return float(croniter(cron, datetime.fromtimestamp(after, zone)).get_next(float))


def latest_firing(cron: str, timezone: str, now: float) -> float:
    """The last firing at or before `now`."""
    zone = ZoneInfo(timezone)
    prev = float(croniter(cron, datetime.fromtimestamp(now, zone)).get_prev(float))
    following = next_firing(cron, timezone, prev)
    return following if following <= now else prev  # croniter's get_prev skips `now` itself


def due_firing(
    cron: str, timezone: str, *, since: float, now: float, starting_deadline_s: float
) -> DueFiring | None:
    """The firing to handle at `now`, given that every firing up to `since` was handled
    (`since`: the last handled firing's time, or when the schedule was first seen)."""
    at = latest_firing(cron, timezone, now)
    if at <= since:
        return None
    passed, t = 0, next_firing(cron, timezone, since)
    while t < at and passed < MAX_COUNTED:
        passed += 1
        t = next_firing(cron, timezone, t)
    late = now - at
    return DueFiring(at=at, late_s=late, missed=late > starting_deadline_s, passed_over=passed)
