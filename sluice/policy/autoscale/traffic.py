"""What a group's recent samples say about its traffic: the windows and estimators the Sluice
policy sizes from (rates, service time and its variability, burstiness, the work that arrived
over each recent span), kept apart from the decisions so each can be read and tested alone.

Fed one `GroupLoad` per tick (`observe`, which returns the next windows: a frozen value);
every estimate is amortised O(1) or O(log n) per tick, plus one copy of each window's tuple
(bench/simulate.py runs hours of trace a second).
"""

from __future__ import annotations

import math
import struct
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from typing import Final

from sluice.core.frozen import fast_init
from sluice.policy.autoscale.base import GroupLoad
from sluice.policy.autoscale.windows import SlidingMean, SlidingMeanPair, Trend
from sluice.spec.autoscaling import AutoscalingSpec

__all__ = ["MIN_COMPLETIONS", "TrafficConfig", "TrafficWindows"]

MIN_COMPLETIONS: Final = 40
"""the service time needs completions: with fewer in its window it is unknown (the model's
needs stay silent, the observed demand speaks). A mean of 40 heavy-tailed service times is
within ~20 %; with 1-5 the first long request inflates it 2-3x"""
_CHANGE_SIGMAS: Final = 3.0
"""a short-window rate this many standard errors off the long one is a change, not noise"""
_SERVICE_MAX_S: Final = 3600.0
"""the service-time window never reaches further back than this"""
_EPS: Final = 1e-9
_T: Final = struct.Struct("d")
_N: Final = struct.Struct("q")
_SVC: Final = struct.Struct("ddqd")
"""a service sample: t, busy (or served) seconds, completions, served squares"""


@dataclass(frozen=True, slots=True)
class TrafficConfig:
    """The window lengths `TrafficWindows` reads from an `AutoscalingSpec`."""

    window_s: float
    """`targets.window_s`: rate, concurrency"""
    panic_s: float
    """`panic.window_s`: burst rate, short queue"""
    trend_s: float
    """`targets.trend_window_s`"""
    memory_s: float
    """`down.stabilization_s`: steady rate, dispersion"""
    service_completions: int
    rate_arrivals: int

    @classmethod
    def of(cls, spec: AutoscalingSpec) -> TrafficConfig:
        t = spec.targets
        return cls(
            t.window_s,
            spec.panic.window_s,
            t.trend_window_s,
            spec.down.stabilization_s,
            t.service_completions,
            t.rate_arrivals,
        )


@fast_init
@dataclass(frozen=True, slots=True)
class TrafficWindows:
    """Sliding windows over a group's samples, a frozen value: `observe` returns the next
    one. `config` sets their lengths (`TrafficConfig.of(spec)`): `targets.window_s` (rate,
    concurrency), `panic.window_s` (burst rate, short queue), `targets.trend_window_s`
    (trend), `down.stabilization_s` (the memory: steady rate, dispersion),
    `targets.service_completions` (service time). `TrafficWindows.start(spec)` is the value
    before the first sample."""

    config: TrafficConfig
    busy_w: SlidingMeanPair
    """requests in flight and queued, over `targets.window_s`"""
    queue_short: SlidingMean
    trend_w: Trend
    dispersion_w: SlidingMeanPair
    """arrivals expected per tick at the burst-window rate, and the squared deviations of
    the actual counts from it (over the memory): the local dispersion"""
    ts: bytes = b""
    """sample times, one a tick, as far back as the longest window read (rate, panic, burst
    horizon, memory), packed as native doubles (a copy is one memcpy: see windows.py); each
    window starts at `_start_index`"""
    ns: bytes = b""
    """cumulative arrivals at `ts`, packed as native int64 (parallel arrays, so each
    bisects a memoryview without a key)"""
    horizon_s: float = 0.0
    svc: bytes = b""
    """(t, busy (or served) seconds, completions, served squares (-1: unknown)), packed"""
    busy_s: float = 0.0
    """integral of in_flight over time (request-seconds)"""
    active_at: float | None = None
    """when anything last arrived, ran or waited (the 1 -> 0 rule's idle clock)"""

    @classmethod
    def start(cls, spec: AutoscalingSpec) -> TrafficWindows:
        """The windows of `spec`, empty."""
        c = TrafficConfig.of(spec)
        return cls(
            c,
            SlidingMeanPair(c.window_s),
            SlidingMean(c.panic_s),
            Trend(c.trend_s),
            SlidingMeanPair(c.memory_s),
        )

    def observe(self, load: GroupLoad, now: float, horizon_s: float) -> tuple[int, TrafficWindows]:
        """Feed one sample; `horizon_s` is the longest burst span kept. Returns (the arrivals
        since the previous sample, the windows with the sample in)."""
        c = self.config
        in_flight, queued, at, arrivals = load.in_flight, load.queued, load.at, load.arrivals
        busy_w = self.busy_w.add(now, float(in_flight), float(queued))
        queue_short = self.queue_short.add(now, float(queued))
        ts, ns = self.ts, self.ns
        trend, busy_s = self.trend_w, self.busy_s
        arrived, dt = 0, 0.0
        if ts:
            dt = at - _T.unpack_from(ts, len(ts) - _T.size)[0]
            arrived = arrivals - _N.unpack_from(ns, len(ns) - _N.size)[0]
            if arrived < 0:  # max(0, arrived) without the call
                arrived = 0
            if dt > 0:
                trend = trend.add(at, arrived / dt)
                busy_s += in_flight * dt
        svc = _observe_service(self.svc, load, busy_s, c.service_completions)
        longest = max(c.window_s, c.panic_s, horizon_s, c.memory_s)
        # append, then drop the oldest while the second oldest is at or before the start
        # of the longest window (two are always kept)
        cut = at - longest
        old = memoryview(ts).cast("d")
        j, kept = 0, len(old) + 1
        while kept - j > 2 and old[j + 1] <= cut:
            j += 1
        ts = ts[j * _T.size :] + _T.pack(at)
        ns = ns[j * _N.size :] + _N.pack(arrivals)
        dispersion_w = self.dispersion_w
        tv = memoryview(ts).cast("d")
        i = _start_index(tv, c.panic_s)
        t0 = tv[i]
        if dt > 0 and at > t0:
            e = (arrivals - _N.unpack_from(ns, i * _N.size)[0]) / (at - t0) * dt
            dispersion_w = dispersion_w.add(now, e, (arrived - e) ** 2)
        active_at = self.active_at
        if arrived > 0 or in_flight > 0 or queued > 0:
            active_at = now
        return arrived, TrafficWindows(
            c,
            busy_w,
            queue_short,
            trend,
            dispersion_w,
            ts,
            ns,
            horizon_s,
            svc,
            busy_s,
            active_at,
        )

    def settle(self, at: float) -> TrafficWindows:
        """The windows once the memory's (dispersion's) are read at `at`: what `at` pushes
        out of them dropped, as the next `observe` would (`self` when nothing is)."""
        w = self.dispersion_w.evict(at)
        return self if w is self.dispersion_w else replace(self, dispersion_w=w)

    # -- estimates -------------------------------------------------------------------------

    def busy(self, now: float) -> tuple[float, float]:
        """(mean requests in flight, mean queued) over `targets.window_s`; 0 when unknown."""
        means = self.busy_w.means(now)
        return (0.0, 0.0) if means is None else means

    def queue(self, now: float) -> float:
        """Mean queue over the panic window (a short memory: a burst's queue, not noise)."""
        return self.queue_short.mean(now) or 0.0

    def rate(self) -> tuple[float, float]:
        """(arrivals per second over `targets.window_s`, the span it covers in seconds)."""
        rate, span, _ = self.rates()
        return rate, span

    def burst_rate(self) -> float:
        """Arrivals per second over the panic window."""
        return self.rates()[2]

    def rates(self) -> tuple[float, float, float]:
        """`rate()` and `burst_rate()` from one look at the samples: (arrivals per second
        over `targets.window_s`, the span it covers, arrivals per second over the panic
        window)."""
        tv, nv = memoryview(self.ts).cast("d"), memoryview(self.ns).cast("q")
        t1, a1 = tv[-1], nv[-1]
        i = _start_index(tv, self.config.window_s)
        span = t1 - tv[i]
        rate = (a1 - nv[i]) / span if span > 0 else 0.0
        i = _start_index(tv, self.config.panic_s)
        t0 = tv[i]
        return rate, span, ((a1 - nv[i]) / (t1 - t0) if t1 > t0 else 0.0)

    def trend(self, at: float) -> tuple[float, float, float] | None:
        """The arrival rate's least-squares line: (value at `at`, slope, its standard error)."""
        return self.trend_w.fit(at)

    def service(self) -> tuple[float, float] | None:
        """(mean, squared CV) of the recent completions' service times: from their own
        service seconds where the sample carries them (`served_s`), else by Little's law
        (request-seconds in flight / completions, high while a rise's long requests are
        still running; CV^2 then taken as 1, exponential). None under `MIN_COMPLETIONS`."""
        svc = self.svc
        s0, s1 = _SVC.unpack_from(svc, 0), _SVC.unpack_from(svc, len(svc) - _SVC.size)
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
        tv, nv = memoryview(self.ts).cast("d"), memoryview(self.ns).cast("q")
        lo = _start_index(tv, self.config.memory_s)
        t1, n1 = tv[-1], nv[-1]
        want = n1 - self.config.rate_arrivals
        i = max(bisect_right(nv, want, lo=lo) - 1, lo)
        t0, n0 = tv[i], nv[i]
        window = self.config.window_s
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
        steady rate's business. Never below 1 (smoother than Poisson is not counted on).
        A read, `self` is not changed (`settle(at)` is the windows it leaves behind)."""
        means = self.dispersion_w.means(at)
        if means is None or means[0] <= 0:
            return 1.0
        expected, deviation = means
        return max(1.0, deviation / expected)

    def work_by_span(self, service_s: float, tick_s: float) -> list[tuple[float, float]]:
        """(T, request-seconds that arrived in the last T) for T = tick, 2 tick, 4 tick, ...
        up to the burst horizon."""
        ts, ns = memoryview(self.ts).cast("d"), memoryview(self.ns).cast("q")
        lo = _start_index(ts, self.horizon_s)
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


def _start_index(ts: memoryview[float], span_s: float) -> int:
    """Where a window of `span_s` seconds ending at the newest sample starts: the newest
    sample at or before its start (so the window is spanned whole), else the oldest; never
    the newest itself while there are two."""
    i = bisect_right(ts, ts[-1] - span_s) - 1
    last = len(ts) - 2  # min(max(i, 0), max(last, 0)) without two calls: a hot path
    if i > last:
        i = last
    return i if i > 0 else 0


def _observe_service(svc: bytes, load: GroupLoad, busy_s: float, keep: int) -> bytes:
    """`svc` with `load`'s service sample appended, over the last `keep` completions: a
    window that adapts to the rate (seconds at a busy hour, hours overnight), at most an
    hour (two samples are always kept)."""
    if load.served_s is None:
        entry = _SVC.pack(load.at, busy_s, load.completions, -1.0)
    else:
        sq = load.served_sq_s if load.served_sq_s is not None else -1.0
        entry = _SVC.pack(load.at, load.served_s, load.completions, sq)
    oldest = load.at - _SERVICE_MAX_S
    size = _SVC.size
    j, kept = 0, len(svc) // size + 1
    while kept - j > 2:
        at, _, completions, _ = _SVC.unpack_from(svc, (j + 1) * size)
        if not (load.completions - completions >= keep or at <= oldest):
            break
        j += 1
    return svc[j * size :] + entry
