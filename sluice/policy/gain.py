""" "Did it help?" (S12): a scaling change or failover judged by what followed it.

Before a change, the group's last window is kept; `settle_s` later, the window after it is
compared: latency, errors, queue and throughput. Only like with like: when the demand moved
by more than DEMAND_MOVED between the windows, a change is judged only where the after
window is better despite more demand (a scale-up that kept latency down or served a larger
share of a rising load, or that bought nothing while it rose); otherwise it is `unknown`.
More throughput counts as help only when latency did not grow with it: at an open-loop
client's steady demand, more finishing while each waits longer is a backlog draining.
A scale-up that bought nothing (the group was busy, throughput did not grow, throughput per
instance fell, and latency did not improve) means the requests wait on something the
instances share outside the group (a common backend, the host, a rate limit upstream): more
instances will not help. The verdict names it, and `NoGainHold` stops the autoscaler
adding for that reason until the demand it saw changes (`hold_released`), rather than
climbing to `max`.

Pure: the windows are `sluice.policy.history.series` values, time comes in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Change", "Followup", "NoGainHold", "hold_released", "judge"]

Values = Mapping[str, float | None]

BUSY_SHARE = 0.8
"""Slots in use (of all ready instances' slots) from which a group counts as busy."""
GROWTH = 1.10
"""Throughput must grow by more than this factor for a scale-up to have bought any."""
LATENCY_BETTER = 0.90
"""p95 must fall below this share of before for latency to have improved."""
DEMAND_MOVED = 0.30
"""A hold ends when the arrival rate moves this far (either way) from what it was."""


@dataclass(frozen=True, slots=True)
class Change:
    """A scaling change (`scale`: from -> to instances) or a failover/restore of `group`."""

    group: str
    kind: str
    at: float
    before_count: int
    after_count: int
    note: str
    """what else to say of it: a failover's backup as '-> NAME'"""
    before: Values
    slots_per_instance: int = 1


@dataclass(frozen=True, slots=True)
class Followup:
    verdict: str
    """helped | no_gain | worse | no_change | unknown"""
    text: str
    bottleneck: str | None
    before: Values
    after: Values

    def to_json(self) -> dict[str, Any]:
        keep = (
            "requests_per_s",
            "completed_per_s",
            "p50_ms",
            "p95_ms",
            "error_rate",
            "queue_wait_p95_ms",
            "queue_length",
            "in_flight",
            "ready_instances",
            "service_ms",
        )
        return {
            "verdict": self.verdict,
            "text": self.text,
            "bottleneck": self.bottleneck,
            "before": {k: _round(self.before.get(k)) for k in keep},
            "after": {k: _round(self.after.get(k)) for k in keep},
        }


@dataclass(frozen=True, slots=True)
class NoGainHold:
    """Scale-up stops at `count` for `group` while the demand stays near `rate`."""

    group: str
    count: int
    rate: float
    since: float
    until: float | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "count": self.count,
            "rate": round(self.rate, 3),
            "since": self.since,
            "until": self.until,
            "reason": self.reason,
        }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _num(v: Values, key: str) -> float | None:
    x = v.get(key)
    return None if x is None else float(x)


def judge(change: Change, after: Values, host_load: float | None = None) -> Followup:
    """The verdict on `change` given the window after it settled. `host_load`: the host's
    run-queue per core when the group's instances run on this machine (None: unknown),
    which names the host as the shared bottleneck when it is saturated."""
    before = change.before
    # throughput is what finished (arrivals are the demand: an open-loop client keeps them)
    rps_b, rps_a = _num(before, "completed_per_s"), _num(after, "completed_per_s")
    p95_b, p95_a = _num(before, "p95_ms"), _num(after, "p95_ms")
    err_b, err_a = _num(before, "error_rate") or 0.0, _num(after, "error_rate") or 0.0
    if rps_b is None or rps_a is None or p95_b is None or p95_a is None:
        return Followup("unknown", "too few requests before or after to judge", None, before, after)
    moved = f"{change.before_count} -> {change.after_count}"
    facts = (
        f"p95 {p95_b:.0f} -> {p95_a:.0f} ms, throughput {rps_b:.2f} -> {rps_a:.2f} req/s, "
        f"errors {err_b:.1%} -> {err_a:.1%}"
    )
    latency_better = p95_a < LATENCY_BETTER * p95_b
    worse = p95_a > p95_b / LATENCY_BETTER or err_a > err_b + 0.01
    demand = _demand_moved(before, after)
    scale_up = change.kind == "scale" and change.after_count > change.before_count
    if demand is not None and (not scale_up or demand.startswith("fell")):
        return _not_comparable(change, moved, demand, facts, after)
    if not scale_up:
        verdict = "helped" if latency_better or err_a < err_b - 0.01 else "no_change"
        if worse:
            verdict = "worse"
        return Followup(verdict, f"{change.kind} {moved}: {facts}", None, before, after)
    ready_b = _num(before, "ready_instances") or float(change.before_count)
    ready_a = _num(after, "ready_instances") or float(change.after_count)
    in_flight_b = _num(before, "in_flight") or 0.0
    queued_b = (_num(before, "queue_length") or 0.0) + (_num(before, "shed_rate") or 0.0)
    busy = queued_b > 0.5 or in_flight_b >= BUSY_SHARE * ready_b * change.slots_per_instance
    per_b = rps_b / ready_b if ready_b > 0 else 0.0
    per_a = rps_a / ready_a if ready_a > 0 else 0.0
    if busy and rps_a <= GROWTH * rps_b and per_a < per_b / GROWTH and not latency_better:
        where = _bottleneck(before, after, host_load)
        text = (
            f"scale {moved} did not help: {facts}; throughput per instance fell "
            f"{per_b:.2f} -> {per_a:.2f} req/s. The requests wait on {where}, "
            "so more instances will not help: scale-up stops until the demand changes"
        )
        return Followup("no_gain", text, where, before, after)
    if demand is None:
        served_more = rps_a > GROWTH * rps_b
    else:  # it rose: faster, or a larger share of it served, is the change's doing
        dem_b, dem_a = _num(before, "requests_per_s") or 0.0, _num(after, "requests_per_s") or 0.0
        served_more = rps_a / dem_a > GROWTH * rps_b / dem_b if dem_a and dem_b else False
    if latency_better or (served_more and not worse):
        return Followup("helped", f"scale {moved} helped: {facts}", None, before, after)
    if served_more:  # more finished, but each waited longer: a backlog was still draining
        text = (
            f"scale {moved}: not judged, more finished but latency grew, so a backlog from "
            f"before it was still draining or the demand outgrew it ({facts})"
        )
        return Followup("unknown", text, None, before, after)
    if demand is not None:
        return _not_comparable(change, moved, demand, facts, after)
    verdict = "worse" if worse else "no_change"
    note = "" if busy else " (the group was not busy before: it was not short of instances)"
    return Followup(verdict, f"scale {moved}: {facts}{note}", None, before, after)


def _demand_moved(before: Values, after: Values) -> str | None:
    """'rose A -> B req/s' or 'fell ...' when the arrival rate moved by more than
    DEMAND_MOVED between the windows (None: it held). Then what followed a change is the
    demand's doing as much as the change's: the windows are not comparable."""
    dem_b, dem_a = _num(before, "requests_per_s"), _num(after, "requests_per_s")
    if not dem_b or dem_a is None or abs(dem_a - dem_b) <= DEMAND_MOVED * dem_b:
        return None
    return f"{'rose' if dem_a > dem_b else 'fell'} {dem_b:.2f} -> {dem_a:.2f} req/s"


def _not_comparable(change: Change, moved: str, demand: str, facts: str, after: Values) -> Followup:
    text = (
        f"{change.kind} {moved}: not judged, the demand {demand} between the windows, so "
        f"what followed is not the change's doing alone ({facts})"
    )
    return Followup("unknown", text, None, change.before, after)


def _bottleneck(before: Values, after: Values, host_load: float | None) -> str:
    svc_b, svc_a = _num(before, "service_ms"), _num(after, "service_ms")
    grew = (
        f" (time at an instance per request {svc_b:.0f} -> {svc_a:.0f} ms)"
        if svc_b is not None and svc_a is not None
        else ""
    )
    if host_load is not None and host_load >= 0.9:
        return f"the host's CPUs, which every instance shares (load {host_load:.2f}/core){grew}"
    return (
        "something the instances share outside the group: a common backend or "
        f"dependency, or a rate limit upstream{grew}"
    )


def hold_released(hold: NoGainHold, rate: float | None, now: float) -> str | None:
    """Why `hold` no longer applies (None: it still does): its time is up, or the demand
    moved by more than DEMAND_MOVED from what it was when no gain was seen."""
    if hold.until is not None and now >= hold.until:
        return "hold time over: scale-up may probe again"
    if rate is not None and hold.rate > 0 and abs(rate - hold.rate) > DEMAND_MOVED * hold.rate:
        return f"demand moved {hold.rate:.2f} -> {rate:.2f} req/s"
    return None
