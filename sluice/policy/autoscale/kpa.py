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
from collections import deque

from sluice.policy.autoscale.base import Decision, GroupLoad
from sluice.policy.autoscale.windows import RollingExtreme
from sluice.spec.autoscaling import KpaSpec

__all__ = ["KpaPolicy"]


class _Buckets:
    """Per-second buckets of a metric over `window_s` (Knative's TimedFloat64Buckets)."""

    __slots__ = ("_buckets", "_first", "_last", "_sum", "window")

    def __init__(self, window_s: float) -> None:
        self.window = max(1, math.ceil(window_s))
        self._buckets: deque[list[float]] = deque()  # [second, sum, count]
        self._sum = 0.0
        self._first: int | None = None
        self._last: int | None = None

    def record(self, sec: int, value: float) -> None:
        if self._last is not None and sec - self._last >= self.window:
            self._buckets.clear()
            self._sum = 0.0
            self._first = None
        if self._first is None:
            self._first = sec
        if self._buckets and self._buckets[-1][0] == sec:
            b = self._buckets[-1]
            self._sum -= b[1] / b[2]
            b[1] += value
            b[2] += 1
            self._sum += b[1] / b[2]
        else:
            self._buckets.append([float(sec), value, 1.0])
            self._sum += value
        self._last = sec if self._last is None else max(self._last, sec)

    def average(self, sec: int) -> float | None:
        """Window average at second `sec`; None when the window holds no data."""
        if self._last is None or self._first is None or sec - self._last >= self.window:
            return None
        while self._buckets and self._buckets[0][0] <= sec - self.window:
            b = self._buckets.popleft()
            self._sum -= b[1] / b[2]
        lag = max(0, sec - self._last)
        n = min(self._last - self._first + 1, self.window - lag)
        return max(0.0, self._sum / n) if n > 0 else None


class KpaPolicy:
    """Knative KPA. Reads `ready`, `current`, `in_flight`, `queued`, `slots_per_instance`,
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
        self._stable = _Buckets(s.stable_window_s)
        self._panic = _Buckets(s.stable_window_s * s.panic_window_percent / 100)
        self._delay = (
            RollingExtreme(s.scale_down_delay_s, largest=True) if s.scale_down_delay_s > 0 else None
        )
        self._panic_time: float | None = None
        self._max_panic_pods = 0
        self._last_tick: float | None = None
        self._last: Decision | None = None
        self._zero_since: float | None = None

    def decide(self, load: GroupLoad, now: float) -> Decision:
        """Record this second's concurrency; run Scale every `tick_s` (2 s)."""
        fresh = load.fresh and now - load.at <= self.metrics_max_age_s
        total = float(load.in_flight + load.queued)
        if fresh:
            sec = math.floor(load.at)
            self._stable.record(sec, total)
            self._panic.record(sec, total)
        poke = load.current == 0 and fresh and total > 0
        due = self._last_tick is None or now - self._last_tick >= self.spec.tick_s
        if self._last is not None and not due and not poke:
            return self._last
        self._last_tick = now
        self._last = self._scale(load, now)
        return self._last

    def _scale(self, load: GroupLoad, now: float) -> Decision:
        s = self.spec
        ready = max(1.0, float(load.ready))
        sec = math.floor(now)
        stable = self._stable.average(sec)
        panic = self._panic.average(sec)
        if stable is None or panic is None:
            keep = self._last.desired if self._last is not None else self._bounds(load.current)
            return Decision(desired=keep, reason=f"metrics missing (no data): keep {keep}")
        target = s.target_utilization * load.slots_per_instance
        max_up = math.ceil(s.max_scale_up_rate * ready)
        max_down = math.floor(ready / s.max_scale_down_rate)
        dspc = math.ceil(stable / target)
        dppc = math.ceil(panic / target)
        stable_pods = int(min(max(dspc, max_down), max_up))
        panic_pods = int(min(max(dppc, max_down), max_up))
        over = dppc / ready >= s.panic_threshold_percent / 100
        if over:
            self._panic_time = now
        elif self._panic_time is not None and self._panic_time + s.stable_window_s < now:
            self._panic_time = None
            self._max_panic_pods = 0
        desired, winner = stable_pods, "stable"
        notes: list[str] = []
        if self._panic_time is not None:
            if panic_pods > desired:
                desired, winner = panic_pods, "panic"
            if desired > self._max_panic_pods:
                self._max_panic_pods = desired
            elif desired < self._max_panic_pods:
                notes.append(f"panic: skip decrease to {desired}")
            desired = self._max_panic_pods
        if self._delay is not None:
            delayed = self._delay.add(now, desired)
            if delayed != desired:
                notes.append(f"scale-down-delay holds {delayed}")
            desired = delayed
        unbounded = desired
        desired = self._to_zero(desired, load, now, notes)
        signals = {
            "stable_concurrency": stable,
            "panic_concurrency": panic,
            "target": target,
            "panicking": 1.0 if self._panic_time is not None else 0.0,
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
        return Decision(
            desired=desired,
            reason=reason,
            signals=signals,
            proposals={"stable": dspc, "panic": dppc},
            winner=winner,
            clipped_by=clipped,
            unclipped=dspc if dspc != desired else None,
        )

    def _bounds(self, n: int) -> int:
        n = max(self.min, n)
        return min(self.max, n) if self.max else n

    def _to_zero(self, desired: int, load: GroupLoad, now: float, notes: list[str]) -> int:
        """Zero only after the zero recommendation outlived the grace period (scaler.go)."""
        if desired > 0 or self.min > 0:
            self._zero_since = None
            return self._bounds(desired)
        if load.current == 0:
            return 0
        if self._zero_since is None:
            self._zero_since = now
        if now - self._zero_since < self.spec.scale_to_zero_grace_s:
            notes.append("scale-to-zero grace keeps 1")
            return self._bounds(1)
        return 0
