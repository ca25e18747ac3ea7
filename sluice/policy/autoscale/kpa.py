"""A faithful emulation of Knative Serving's KPA (Knative Pod Autoscaler) for comparison
and migration.

Reimplemented (not copied) from upstream knative/serving:
- `pkg/autoscaler/scaling/autoscaler.go` `(*autoscaler).Scale`: ready pods counted as >= 1,
  `dspc = ceil(stable / target)`, `dppc = ceil(panic / target)`, both clamped to
  `[floor(ready / max-scale-down-rate), ceil(max-scale-up-rate x ready)]`; panic starts when
  `dppc / ready >= panic-threshold`, is extended while over it and ends a full stable
  window after the last crossing; in panic the count is `max(stable, panic)` and never
  decreases (`maxPanicPods`); `scale-down-delay` keeps the max of recent desired counts;
- `pkg/autoscaler/aggregation/bucketing.go` `TimedFloat64Buckets.WindowAverage`: 1 s
  buckets; the average divides by the buckets since the first write (partial windows) and
  leaves out trailing buckets with no data; a window with no data at all is "no data", and
  Scale then returns an invalid result (the count is kept);
- `pkg/reconciler/autoscaling/kpa/scaler.go`: min/max-scale bounds and scale to zero only
  after the zero recommendation outlived `scale-to-zero-grace-period`.

Mapping onto a Sluice group: the metric is total concurrency `in_flight + queued` (the
queue-proxies count running requests, the activator the buffered ones), sampled once per
call into the current 1 s bucket; `target = target_utilization x slots`. `Scale` runs every
`tick_s` (2 s); at zero replicas the first request pokes it at once, as the activator does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sluice.policy.autoscale.base import Decision, GroupLoad
from sluice.policy.autoscale.windows import RollingExtreme
from sluice.spec.autoscaling import KpaSpec

__all__ = ["KpaMemory", "KpaPolicy"]


@dataclass(frozen=True, slots=True)
class _Buckets:
    """Per-second buckets of a metric over `window` seconds (Knative's TimedFloat64Buckets),
    a frozen value: `record` and `average` return the next one."""

    window: int
    buckets: tuple[tuple[float, float, float], ...] = ()
    """(second, sum, count), oldest first"""
    total: float = 0.0
    """running sum of the buckets' means"""
    first: int | None = None
    last: int | None = None

    @classmethod
    def of(cls, window_s: float) -> _Buckets:
        return cls(max(1, math.ceil(window_s)))

    def record(self, sec: int, value: float) -> _Buckets:
        buckets, total, first, last = self.buckets, self.total, self.first, self.last
        if last is not None and sec - last >= self.window:
            buckets = ()
            total = 0.0
            first = None
        if first is None:
            first = sec
        if buckets and buckets[-1][0] == sec:
            at, b_sum, b_count = buckets[-1]
            total -= b_sum / b_count
            b_sum += value
            b_count += 1
            total += b_sum / b_count
            buckets = (*buckets[:-1], (at, b_sum, b_count))
        else:
            buckets = (*buckets, (float(sec), value, 1.0))
            total += value
        last = sec if last is None else max(last, sec)
        return _Buckets(self.window, buckets, total, first, last)

    def average(self, sec: int) -> tuple[float | None, _Buckets]:
        """(window average at second `sec`, None when the window holds no data; the buckets
        with those before the window dropped)."""
        last, first = self.last, self.first
        if last is None or first is None or sec - last >= self.window:
            return None, self
        buckets, total = self.buckets, self.total
        k, n_buckets = 0, len(buckets)
        while k < n_buckets and buckets[k][0] <= sec - self.window:
            b = buckets[k]
            total -= b[1] / b[2]
            k += 1
        kept = self if k == 0 else _Buckets(self.window, buckets[k:], total, first, last)
        lag = max(0, sec - last)
        n = min(last - first + 1, self.window - lag)
        return (max(0.0, total / n) if n > 0 else None), kept


@dataclass(frozen=True, slots=True)
class KpaMemory:
    """What `KpaPolicy` remembers between ticks (a frozen value; `step` returns the next)."""

    stable: _Buckets
    panic: _Buckets
    delay: RollingExtreme[int] | None
    """the scale-down delay's rolling max; None without one"""
    panic_time: float | None = None
    max_panic_pods: int = 0
    last_tick: float | None = None
    last: Decision | None = None
    """the last Scale's decision, held between ticks"""
    zero_since: float | None = None


class KpaPolicy:
    """Knative KPA: configuration only (its memory is a `KpaMemory` value, see
    `ScalingPolicy`). Reads `ready`, `current`, `in_flight`, `queued`, `slots_per_instance`,
    `fresh`/`at`. `min_scale`/`max_scale` as the revision annotations (max 0 = unbounded)."""

    name = "kpa"

    def __init__(
        self,
        spec: KpaSpec | None = None,
        min_scale: int = 0,
        max_scale: int = 0,
        metrics_max_age_s: float = 10.0,
    ) -> None:
        if min_scale < 0 or (max_scale and min_scale > max_scale):
            raise ValueError(f"kpa needs 0 <= min-scale ({min_scale}) <= max-scale ({max_scale})")
        self.spec = spec if spec is not None else KpaSpec()
        self.min = min_scale
        self.max = max_scale
        self.metrics_max_age_s = metrics_max_age_s
        s = self.spec
        self._initial = KpaMemory(
            _Buckets.of(s.stable_window_s),
            _Buckets.of(s.stable_window_s * s.panic_window_percent / 100),
            RollingExtreme(s.scale_down_delay_s, largest=True)
            if s.scale_down_delay_s > 0
            else None,
        )

    def initial(self) -> KpaMemory:
        """No data, no Scale yet."""
        return self._initial

    def step(self, memory: KpaMemory, load: GroupLoad, now: float) -> tuple[Decision, KpaMemory]:
        """Record this second's concurrency; run Scale every `tick_s` (2 s). Returns the
        decision and the next memory (`memory` is not changed)."""
        m = memory
        fresh = load.fresh and now - load.at <= self.metrics_max_age_s
        total = float(load.in_flight + load.queued)
        if fresh:
            sec = math.floor(load.at)
            m = replace(m, stable=m.stable.record(sec, total), panic=m.panic.record(sec, total))
        poke = load.current == 0 and fresh and total > 0
        due = m.last_tick is None or now - m.last_tick >= self.spec.tick_s
        if m.last is not None and not due and not poke:
            return m.last, m
        return self._scale(load, now, m)

    def _scale(self, load: GroupLoad, now: float, m: KpaMemory) -> tuple[Decision, KpaMemory]:
        s = self.spec
        ready = max(1.0, float(load.ready))
        sec = math.floor(now)
        stable, stable_b = m.stable.average(sec)
        panic, panic_b = m.panic.average(sec)
        if stable is None or panic is None:
            keep = m.last.desired if m.last is not None else self._bounds(load.current)
            d = Decision(desired=keep, reason=f"metrics missing (no data): keep {keep}")
            return d, replace(m, stable=stable_b, panic=panic_b, last_tick=now, last=d)
        target = s.target_utilization * load.slots_per_instance
        max_up = math.ceil(s.max_scale_up_rate * ready)
        max_down = math.floor(ready / s.max_scale_down_rate)
        dspc = math.ceil(stable / target)
        dppc = math.ceil(panic / target)
        stable_pods = int(min(max(dspc, max_down), max_up))
        panic_pods = int(min(max(dppc, max_down), max_up))
        over = dppc / ready >= s.panic_threshold_percent / 100
        panic_time, max_panic_pods = m.panic_time, m.max_panic_pods
        if over:
            panic_time = now
        elif panic_time is not None and panic_time + s.stable_window_s < now:
            panic_time = None
            max_panic_pods = 0
        desired, winner = stable_pods, "stable"
        notes: list[str] = []
        if panic_time is not None:
            if panic_pods > desired:
                desired, winner = panic_pods, "panic"
            if desired > max_panic_pods:
                max_panic_pods = desired
            elif desired < max_panic_pods:
                notes.append(f"panic: skip decrease to {desired}")
            desired = max_panic_pods
        delay = m.delay
        if delay is not None:
            delay = delay.add(now, desired)
            delayed = delay.extreme
            if delayed != desired:
                notes.append(f"scale-down-delay holds {delayed}")
            desired = delayed
        unbounded = desired
        desired, zero_since = self._to_zero(desired, load, now, notes, m.zero_since)
        signals = {
            "stable_concurrency": stable,
            "panic_concurrency": panic,
            "target": target,
            "panicking": 1.0 if panic_time is not None else 0.0,
        }
        reason = (
            f"{winner} concurrency {stable if winner == 'stable' else panic:.2f} over target "
            f"{target:.2f}/pod -> {stable_pods if winner == 'stable' else panic_pods}"
        )
        if notes:
            reason += "; " + "; ".join(notes)
        clipped = tuple(n.split(":")[0].split(" ")[0] for n in notes)
        if desired != unbounded:
            clipped += ("bounds",)
        d = Decision(
            desired=desired,
            reason=reason,
            signals=signals,
            proposals={"stable": dspc, "panic": dppc},
            winner=winner,
            clipped_by=clipped,
            unclipped=dspc if dspc != desired else None,
        )
        return d, KpaMemory(
            stable_b, panic_b, delay, panic_time, max_panic_pods, now, d, zero_since
        )

    def _bounds(self, n: int) -> int:
        n = max(self.min, n)
        return min(self.max, n) if self.max else n

    def _to_zero(
        self, desired: int, load: GroupLoad, now: float, notes: list[str], zero_since: float | None
    ) -> tuple[int, float | None]:
        """Zero only after the zero recommendation outlived the grace period (scaler.go).
        Returns (count, zero_since: when the zero recommendation began)."""
        if desired > 0 or self.min > 0:
            return self._bounds(desired), None
        if load.current == 0:
            return 0, zero_since
        if zero_since is None:
            zero_since = now
        if now - zero_since < self.spec.scale_to_zero_grace_s:
            notes.append("scale-to-zero grace keeps 1")
            return self._bounds(1), zero_since
        return 0, zero_since
