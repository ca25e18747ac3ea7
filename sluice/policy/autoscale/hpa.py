"""A faithful emulation of the Kubernetes HorizontalPodAutoscaler (autoscaling/v2) with
`behavior`, so users can compare Sluice against it and migrate from it.

Reimplemented (not copied) from upstream kubernetes/kubernetes:
- `pkg/controller/podautoscaler/horizontal.go`: `reconcileAutoscaler` (min/max pre-checks),
  `normalizeDesiredReplicasWithBehaviors`, `stabilizeRecommendationWithBehaviors` (scale-up
  window: lowest recommendation; scale-down window: highest), `convertDesiredReplicasWith
  BehaviorRate`, `calculateScaleUpLimitWithScalingRules`,
  `calculateScaleDownLimitWithBehaviors` and `getReplicasChangePerPeriod` (limits from the
  scale events of each policy's period, selectPolicy Max | Min | Disabled);
- `pkg/controller/podautoscaler/replica_calculator.go`: `calcPlainMetricReplicas` (a Pods
  metric with an AverageValue target): tolerance, unready pods counted as 0 on scale-up,
  the direction re-check after that correction;
- the sync loop period `--horizontal-pod-autoscaler-sync-period` (15 s).

Mapping onto a Sluice group: the Pods metric is in-flight requests per ready instance
(what each instance would export), target `target_per_instance x slots`. Starting
instances (`current - ready`) are the upstream "unready/pending pods"; there are no
"missing" pods, the gateway sees every ready instance. With no ready instance the Pods
metric is unavailable and upstream does not scale; at 0 replicas (only with min 0, the
HPAScaleToZero gate) upstream needs an Object/External metric, which we model as
AverageValue on the gateway's total demand (in_flight + queued): ceil(total / target).
One deviation: at 0 replicas with min > 0 upstream disables the HPA (a user scaled it to
0 on purpose); here 0 means "not started yet", so we go to min.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.policy.autoscale.base import Decision, GroupLoad
from sluice.spec.autoscaling import HpaBehaviorRule, HpaSpec

__all__ = ["HpaMemory", "HpaPolicy"]


Events = tuple[tuple[float, int], ...]
"""(t, replicas changed), oldest first"""


@dataclass(frozen=True, slots=True)
class HpaMemory:
    """What `HpaPolicy` remembers between ticks (a frozen value; `step` returns the next)."""

    last_sync: float | None = None
    """when the last reconcile ran"""
    last: Decision | None = None
    """its decision, held until the next sync"""
    recommendations: tuple[tuple[float, int], ...] = ()
    """(t, recommendation) of recent reconciles (upstream's list, outdated slots reused)"""
    up_events: Events = ()
    down_events: Events = ()


_START = HpaMemory()


class HpaPolicy:
    """Kubernetes HPA v2: configuration only (its memory is an `HpaMemory` value, see
    `ScalingPolicy`). Reads `current`, `ready`, `in_flight`, `queued` (only at 0 replicas),
    `slots_per_instance`, `fresh`/`at`. `now` in seconds."""

    name = "hpa"

    def __init__(
        self,
        spec: HpaSpec | None = None,
        min_replicas: int = 1,
        max_replicas: int = 10,
        metrics_max_age_s: float = 60.0,
    ) -> None:
        if not 0 <= min_replicas <= max_replicas:
            raise ValueError(f"hpa needs 0 <= min ({min_replicas}) <= max ({max_replicas})")
        self.spec = spec if spec is not None else HpaSpec()
        self.min = min_replicas
        self.max = max_replicas
        self.metrics_max_age_s = metrics_max_age_s
        longest = [
            p.period_s for r in (self.spec.scale_up, self.spec.scale_down) for p in r.policies
        ]
        self._event_horizon = max(longest, default=0.0)

    def initial(self) -> HpaMemory:
        """Nothing reconciled yet."""
        return _START

    def step(self, memory: HpaMemory, load: GroupLoad, now: float) -> tuple[Decision, HpaMemory]:
        """Desired replicas, recomputed every `sync_period_s` and held in between, and the
        next memory (`memory` is not changed)."""
        m = memory
        if (
            m.last is not None
            and m.last_sync is not None
            and now - m.last_sync < self.spec.sync_period_s
        ):
            return m.last, m
        decision, recommendations, ups, downs = self._sync(load, now, m)
        return decision, HpaMemory(now, decision, recommendations, ups, downs)

    # -- one reconcile ---------------------------------------------------------------------

    def _sync(
        self, load: GroupLoad, now: float, m: HpaMemory
    ) -> tuple[Decision, tuple[tuple[float, int], ...], Events, Events]:
        """One reconcile: (decision, recommendations, up events, down events)."""
        current = load.current
        ups, downs = m.up_events, m.down_events
        if current > self.max:
            d = self._rescale(current, self.max, "above maxReplicas", "max")
            return d, m.recommendations, *self._record_event(now, d.desired - current, ups, downs)
        if current < self.min:
            d = self._rescale(current, self.min, "below minReplicas", "min")
            return d, m.recommendations, *self._record_event(now, d.desired - current, ups, downs)
        stale = not load.fresh or now - load.at > self.metrics_max_age_s
        metric = None if stale else self._metric_replicas(load)
        if metric is None:
            why = "metrics missing" if stale else "no ready instance reports the metric"
            d = Decision(desired=current, reason=f"{why}: hold {current} (ScalingActive=False)")
            return d, m.recommendations, ups, downs
        proposed, usage, target = metric
        stabilized, recommendations = self._stabilize(now, current, proposed, m.recommendations)
        desired, limit = self._rate_limit(now, current, stabilized, ups, downs)
        signals = {"in_flight_per_ready": usage, "target": target, "proposed": float(proposed)}
        clipped: list[str] = []
        if stabilized != proposed:
            clipped.append("stabilization")
        if desired != stabilized and limit:
            clipped.append(limit)
        reason = (
            f"in-flight {usage:.2f}/ready instance vs target {target:.2f} -> {proposed}"
            + (f"; stabilized to {stabilized}" if stabilized != proposed else "")
            + (f"; {limit} -> {desired}" if desired != stabilized else "")
        )
        if desired != current:
            ups, downs = self._record_event(now, desired - current, ups, downs)
        d = Decision(
            desired=desired,
            reason=reason,
            signals=signals,
            proposals={"metric": proposed},
            winner="metric",
            clipped_by=tuple(clipped),
            unclipped=proposed if proposed != desired else None,
        )
        return d, recommendations, ups, downs

    def _rescale(self, current: int, desired: int, why: str, guard: str) -> Decision:
        return Decision(
            desired=desired,
            reason=f"{current} {why} -> {desired}",
            winner=guard,
            clipped_by=(guard,),
        )

    def _metric_replicas(self, load: GroupLoad) -> tuple[int, float, float] | None:
        """calcPlainMetricReplicas for one Pods metric; None when unavailable."""
        current = load.current
        target = self.spec.target_per_instance * load.slots_per_instance
        tol = self.spec.tolerance
        if current == 0:  # HPAScaleToZero with an External AverageValue metric
            total = float(load.in_flight + load.queued)
            return math.ceil(total / target), total, target
        ready = min(load.ready, current)
        if ready <= 0:
            return None
        usage = load.in_flight / ready
        ratio = usage / target
        unready = current - ready
        if not (unready > 0 and ratio > 1.0):
            if abs(1.0 - ratio) <= tol:
                return current, usage, target
            return math.ceil(ratio * ready), usage, target
        # scale-up with unready pods: they count as using 0, then re-check the direction
        new_ratio = load.in_flight / current / target
        if abs(1.0 - new_ratio) <= tol or new_ratio < 1.0:
            return current, usage, target
        proposed = math.ceil(new_ratio * current)
        return (current if proposed < current else proposed), usage, target

    def _stabilize(
        self,
        now: float,
        current: int,
        proposed: int,
        recommendations: tuple[tuple[float, int], ...],
    ) -> tuple[int, tuple[tuple[float, int], ...]]:
        """Highest recommendation in the scale-down window, lowest in the scale-up one, and
        the recommendations with `proposed` in."""
        up_cut = now - self.spec.scale_up.stabilization_s
        down_cut = now - self.spec.scale_down.stabilization_s
        up_rec = down_rec = proposed
        old = -1
        for i, (t, rec) in enumerate(recommendations):
            if t > up_cut:
                up_rec = min(up_rec, rec)
            if t > down_cut:
                down_rec = max(down_rec, rec)
            if t < up_cut and t < down_cut:
                old = i
        result = min(max(current, up_rec), down_rec)
        if old >= 0:  # upstream reuses one outdated slot instead of growing the list
            recommendations = (
                *recommendations[:old],
                (now, proposed),
                *recommendations[old + 1 :],
            )
        else:
            recommendations = (*recommendations, (now, proposed))
        return result, recommendations

    def _rate_limit(
        self, now: float, current: int, desired: int, ups: Events, downs: Events
    ) -> tuple[int, str]:
        """Clamp to [minReplicas, maxReplicas] and the behavior policies' limits."""
        if desired > current:
            limit = _policy_limit(now, current, ups, downs, self.spec.scale_up, up=True)
            limit = max(limit, current)
            allowed, why = (limit, "scale-up limit") if self.max > limit else (self.max, "max")
            return (allowed, why) if desired > allowed else (desired, "")
        if desired < current:
            limit = _policy_limit(now, current, ups, downs, self.spec.scale_down, up=False)
            limit = min(limit, current)
            allowed, why = (limit, "scale-down limit") if self.min < limit else (self.min, "min")
            return (allowed, why) if desired < allowed else (desired, "")
        return desired, ""

    def _record_event(
        self, now: float, change: int, ups: Events, downs: Events
    ) -> tuple[Events, Events]:
        """(ups, downs) with a change of `change` replicas at `now`, events older than the
        longest policy period dropped."""
        if change == 0:
            return ups, downs
        if change > 0:
            ups = (*ups, (now, abs(change)))
        else:
            downs = (*downs, (now, abs(change)))
        cutoff = now - self._event_horizon
        return _after(ups, cutoff), _after(downs, cutoff)


def _after(events: Events, cutoff: float) -> Events:
    """`events` less the leading ones at or before `cutoff`."""
    k, n = 0, len(events)
    while k < n and events[k][0] <= cutoff:
        k += 1
    return events[k:] if k else events


def _changed_in_period(now: float, period_s: float, events: Events) -> int:
    """getReplicasChangePerPeriod: replicas changed by events newer than now - period."""
    cutoff = now - period_s
    return sum(n for t, n in events if t > cutoff)


def _policy_limit(
    now: float,
    current: int,
    ups: Events,
    downs: Events,
    rule: HpaBehaviorRule,
    *,
    up: bool,
) -> int:
    """calculateScaleUpLimitWithScalingRules / calculateScaleDownLimitWithBehaviors: each
    policy bounds the count from the one at the start of its period (the current count minus
    the changes made since); `selectPolicy: Max` picks the largest change (the highest count
    up, the lowest down), `Min` the smallest. Percent rounds up when growing and truncates
    when shrinking, as upstream."""
    if rule.select_policy == "Disabled":
        return current
    pick = max if up == (rule.select_policy == "Max") else min
    result: int | None = None
    for p in rule.policies:
        start = (
            current
            - _changed_in_period(now, p.period_s, ups)
            + _changed_in_period(now, p.period_s, downs)
        )
        if up:
            proposed = (
                start + p.value if p.type == "Pods" else math.ceil(start * (1 + p.value / 100))
            )
        else:
            proposed = start - p.value if p.type == "Pods" else int(start * (1 - p.value / 100))
        result = proposed if result is None else pick(result, proposed)
    return current if result is None else result
