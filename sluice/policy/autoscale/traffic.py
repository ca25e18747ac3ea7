"""What a group's recent samples say about its traffic: the windows and estimators the Sluice
policy sizes from (rates, service time and its variability, burstiness, the work that arrived
over each recent span), kept apart from the decisions so each can be read and tested alone.

Fed one `GroupLoad` per tick (`observe`); every estimate is amortised O(1) or O(log n) per
tick (bench/simulate.py runs hours of trace a second).
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections import deque

from sluice.policy.autoscale.base import GroupLoad
from sluice.policy.autoscale.windows import SlidingMean, Trend
from sluice.spec.autoscaling import AutoscalingSpec

__all__ = ["MIN_COMPLETIONS", "TrafficWindows"]

MIN_COMPLETIONS = 40
"""the service time needs completions: with fewer in its window it is unknown (the model's
needs stay silent, the observed demand speaks). A mean of 40 heavy-tailed service times is
within ~20 %; with 1-5 the first long request inflates it 2-3x"""
_CHANGE_SIGMAS = 3.0
"""a short-window rate this many standard errors off the long one is a change, not noise"""
_SERVICE_MAX_S = 3600.0
"""the service-time window never reaches further back than this"""
_EPS = 1e-9


class TrafficWindows:
    """Sliding windows over a group's samples. `spec` sets their lengths:
    `targets.window_s` (rate, concurrency), `panic.window_s` (burst rate, short queue),
    `targets.trend_window_s` (trend), `down.stabilization_s` (the memory: steady rate,
    dispersion), `targets.service_completions` (service time)."""

    def __init__(self, spec: AutoscalingSpec) -> None:
        self.spec = spec
        t = spec.targets
        memory_s = spec.down.stabilization_s
        self._in_flight = SlidingMean(t.window_s)
        self._queue = SlidingMean(spec.panic.window_s)
        self._queue_w = SlidingMean(t.window_s)
        self._trend = Trend(t.trend_window_s)
        # t, cumulative arrivals: one sample a tick, as far back as the longest window read
        # (rate, panic, burst horizon, memory); each window starts at `_start_index`. Two
        # parallel deques so each bisects without a key function (5 bisects a tick)
        self._t: deque[float] = deque()
        self._n: deque[int] = deque()
        self._horizon_s = 0.0
        # t, busy (or served) seconds, completions, served squares (-1: unknown)
        self._svc: deque[tuple[float, float, int, float]] = deque()
        self._busy_s = 0.0  # integral of in_flight over time (request-seconds)
        # arrivals expected per tick at the burst-window rate, and the squared deviations of
        # the actual counts from it: the local dispersion index
        self._expected = SlidingMean(memory_s)
        self._deviation_sq = SlidingMean(memory_s)
        self.active_at: float | None = None
        """when anything last arrived, ran or waited (the 1 -> 0 rule's idle clock)"""

    def observe(self, load: GroupLoad, now: float, horizon_s: float) -> int:
        """Feed one sample; `horizon_s` is the longest burst span kept. Returns the arrivals
        since the previous sample."""
        spec = self.spec
        self._in_flight.add(now, float(load.in_flight))
        self._queue.add(now, float(load.queued))
        self._queue_w.add(now, float(load.queued))
        at = load.at
        ts, ns = self._t, self._n
        arrived, dt = 0, 0.0
        if ts:
            dt = at - ts[-1]
            arrived = max(0, load.arrivals - ns[-1])
            if dt > 0:
                self._trend.add(at, arrived / dt)
                self._busy_s += load.in_flight * dt
        self._observe_service(load)
        ts.append(at)
        ns.append(load.arrivals)
        self._horizon_s = horizon_s
        longest = max(
            spec.targets.window_s, spec.panic.window_s, horizon_s, spec.down.stabilization_s
        )
        while len(ts) > 2 and ts[1] <= at - longest:
            ts.popleft()
            ns.popleft()
        t0, a0 = self._sample(self._start_index(spec.panic.window_s))
        if dt > 0 and at > t0:
            expected = (load.arrivals - a0) / (at - t0) * dt
            self._expected.add(now, expected)
            self._deviation_sq.add(now, (arrived - expected) ** 2)
        if arrived > 0 or load.in_flight > 0 or load.queued > 0:
            self.active_at = now
        return arrived

    def _observe_service(self, load: GroupLoad) -> None:
        svc = self._svc
        if load.served_s is None:
            svc.append((load.at, self._busy_s, load.completions, -1.0))
        else:
            sq = load.served_sq_s if load.served_sq_s is not None else -1.0
            svc.append((load.at, load.served_s, load.completions, sq))
        # over the last `service_completions` completions: a window that adapts to the rate
        # (seconds at a busy hour, hours overnight), at most an hour
        keep = self.spec.targets.service_completions
        while len(svc) > 2 and (
            load.completions - svc[1][2] >= keep or svc[1][0] <= load.at - _SERVICE_MAX_S
        ):
            svc.popleft()

    def _start_index(self, span_s: float) -> int:
        """Where a window of `span_s` seconds ending at the newest sample starts: the newest
        sample at or before its start (so the window is spanned whole), else the oldest;
        never the newest itself while there are two."""
        ts = self._t
        i = bisect_right(ts, ts[-1] - span_s) - 1
        return min(max(i, 0), max(len(ts) - 2, 0))

    def _sample(self, i: int) -> tuple[float, int]:
        """(t, cumulative arrivals) of the `i`-th kept sample."""
        return self._t[i], self._n[i]

    # -- estimates -------------------------------------------------------------------------

    def in_flight(self, now: float) -> float:
        return self._in_flight.mean(now) or 0.0

    def queue(self, now: float) -> float:
        """Mean queue over the panic window (a short memory: a burst's queue, not noise)."""
        return self._queue.mean(now) or 0.0

    def queue_window(self, now: float) -> float:
        return self._queue_w.mean(now) or 0.0

    def rate(self) -> tuple[float, float]:
        """(arrivals per second over `targets.window_s`, the span it covers in seconds)."""
        (t0, a0), (t1, a1) = (
            self._sample(self._start_index(self.spec.targets.window_s)),
            self._sample(-1),
        )
        span = t1 - t0
        return ((a1 - a0) / span if span > 0 else 0.0), span

    def burst_rate(self) -> float:
        """Arrivals per second over the panic window."""
        (t0, a0), (t1, a1) = (
            self._sample(self._start_index(self.spec.panic.window_s)),
            self._sample(-1),
        )
        return (a1 - a0) / (t1 - t0) if t1 > t0 else 0.0

    def trend(self, at: float) -> tuple[float, float, float] | None:
        """The arrival rate's least-squares line: (value at `at`, slope, its standard error)."""
        return self._trend.fit(at)

    def service(self) -> tuple[float, float] | None:
        """(mean, squared CV) of the recent completions' service times: from their own
        service seconds where the sample carries them (`served_s`), else by Little's law
        (request-seconds in flight / completions, high while a rise's long requests are
        still running; CV^2 then taken as 1, exponential). None under `MIN_COMPLETIONS`."""
        s0, s1 = self._svc[0], self._svc[-1]
        finished, busy = s1[2] - s0[2], s1[1] - s0[1]
        if finished < MIN_COMPLETIONS or busy <= 0:
            return None
        mean = busy / finished
        cv2 = 1.0
        if s0[3] >= 0 and s1[3] >= 0:
            second = (s1[3] - s0[3]) / finished
            cv2 = max(0.0, second / (mean * mean) - 1.0)
        return mean, cv2

    def steady_rate(self, rate: float, dispersion: float) -> float:
        """The arrival rate the steady need is sized for. The short-window `rate` is noisy
        at low rates (30 s at 0.3/s holds 9 arrivals, +-33 %, and the rolling max keeps every
        high reading), so this is the rate over the last `targets.rate_arrivals` arrivals
        (within the memory) unless `rate` differs from it by more than `_CHANGE_SIGMAS`
        standard errors (Poisson, times `dispersion`, the index `dispersion()` gives): a real
        change counts within one window, noise does not move the count."""
        lo = self._start_index(self.spec.down.stabilization_s)
        t1, n1 = self._sample(-1)
        want = n1 - self.spec.targets.rate_arrivals
        i = max(bisect_right(self._n, want, lo=lo) - 1, lo)
        t0, n0 = self._sample(i)
        window = self.spec.targets.window_s
        if t1 - t0 <= window:
            return rate
        steady = (n1 - n0) / (t1 - t0)
        noise = math.sqrt(dispersion * max(steady, rate) / window)
        return rate if abs(rate - steady) > _CHANGE_SIGMAS * noise else steady

    def dispersion(self, at: float) -> float:
        """Local index of dispersion over the memory: the mean squared deviation of each
        tick's arrivals from what the panic-window rate expected, over that expectation.
        1 for Poisson arrivals at any slowly changing rate, far above for arrivals that come
        in clumps of seconds; a rate that changes between windows (on/off, diurnal) is the
        steady rate's business. Never below 1 (smoother than Poisson is not counted on)."""
        expected, deviation = self._expected.mean(at), self._deviation_sq.mean(at)
        if expected is None or deviation is None or expected <= 0:
            return 1.0
        return max(1.0, deviation / expected)

    def work_by_span(self, service_s: float, tick_s: float) -> list[tuple[float, float]]:
        """(T, request-seconds that arrived in the last T) for T = tick, 2 tick, 4 tick, ...
        up to the burst horizon."""
        ts, ns = self._t, self._n
        lo = self._start_index(self._horizon_s)
        last_at, last_n = ts[-1], ns[-1]
        out: list[tuple[float, float]] = []
        i = len(ts) - 1
        span = tick_s
        reach = last_at - ts[lo]
        while span <= reach + _EPS:
            # the oldest sample within `span`: a bisect, as the windows start
            i = bisect_left(ts, last_at - span - _EPS, lo, i)
            t_i, n_i = ts[i], ns[i]
            if last_at - t_i > _EPS:
                out.append((last_at - t_i, (last_n - n_i) * service_s))
            span *= 2.0
        return out
