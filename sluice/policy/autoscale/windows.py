"""Sliding-window statistics the autoscalers share: frozen values, each update returns the
next value (the one it was called on is left as it was), each amortised O(1) arithmetic per
sample plus one copy of the window's tuple.

Policies are called once per (simulated) second for hours of trace, so no window here is
re-scanned: sums are kept running, extremes use monotonic tuples, and the least-squares
trend keeps its five moment sums (re-summed now and then to shed float drift).

Each update copies its window: the sample windows (hundreds of samples) are packed in
`bytes` (native doubles, `pairs` reads them), so a copy is one memcpy. As tuples of
(t, value) tuples the copy touched every sample's object (a reference count up, and down
when the old tuple went): with 500 groups a tick that doubled the time of a decision.
A rolling extreme's tuple holds a few items; it grows by concatenation, `kept + (new,)`,
one copy (ruff's preferred `(*kept, new)` builds a list first: 1.5-2x slower).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from sluice.core.frozen import fast_init

N = TypeVar("N", int, float)

__all__ = ["RollingExtreme", "SlidingMean", "SlidingMeanPair", "Trend", "pairs"]

_RESUM_EVERY: Final = 4096
"""evictions between exact re-sums of running float sums (drift stays ~1e-12)"""


_PAIR: Final = struct.Struct("dd")
"""a (t, value) sample, packed as two native doubles"""
_PAIR_SIZE: Final = _PAIR.size


def pairs(packed: bytes) -> list[tuple[float, float]]:
    """The (t, value) samples of a packed window, oldest first."""
    return list(_PAIR.iter_unpack(packed))


def _dropped(samples: bytes, cutoff: float, total: float, evictions: int) -> tuple[int, float, int]:
    """How many bytes of packed (t, value) pairs lie at or before `cutoff`, with `total`
    less their values and `evictions` counting them (the order of the subtractions kept)."""
    unpack = _PAIR.unpack_from
    k, n = 0, len(samples)
    while k < n:
        at, v = unpack(samples, k)
        if at > cutoff:
            break
        total -= v
        evictions += 1
        k += _PAIR_SIZE
    return k, total, evictions


@fast_init
@dataclass(frozen=True, slots=True)
class SlidingMean:
    """Mean of the samples taken within the last `window_s` seconds (sample-weighted).

    `samples` are (t, value), oldest first, packed (`pairs` reads them); `total` their
    running sum; `evictions` counts the samples dropped since `total` was last re-summed."""

    window_s: float
    samples: bytes = b""
    total: float = 0.0
    evictions: int = 0

    @property
    def count(self) -> int:
        return len(self.samples) // _PAIR_SIZE

    def add(self, t: float, value: float) -> SlidingMean:
        """The window with `value` taken at `t` (and what `t` pushes out of it dropped)."""
        old = self.samples
        cutoff = t - self.window_s
        total, evictions = self.total + value, self.evictions
        # `_dropped`, inline (once a tick per group: the call was a tenth of this)
        unpack = _PAIR.unpack_from
        k, n = 0, len(old)
        while k < n:
            at, v = unpack(old, k)
            if at > cutoff:
                break
            total -= v
            evictions += 1
            k += _PAIR_SIZE
        if k == n and t <= cutoff:  # a window of 0 keeps nothing, the new sample included
            total -= value
            evictions += 1
            samples = b""
        else:
            samples = old[k:] + _PAIR.pack(t, value)
        if evictions >= _RESUM_EVERY:
            total = math.fsum(v for _, v in _PAIR.iter_unpack(samples))
            evictions = 0
        return SlidingMean(self.window_s, samples, total, evictions)

    def evict(self, now: float) -> SlidingMean:
        """The window as read at `now`: samples at or before `now - window_s` dropped
        (`self` when none is)."""
        samples = self.samples
        cutoff = now - self.window_s
        if not samples or _PAIR.unpack_from(samples, 0)[0] > cutoff:
            return self
        k, total, evictions = _dropped(samples, cutoff, self.total, self.evictions)
        kept = samples[k:]
        if evictions >= _RESUM_EVERY:
            total = math.fsum(v for _, v in _PAIR.iter_unpack(kept))
            evictions = 0
        return SlidingMean(self.window_s, kept, total, evictions)

    def mean(self, now: float) -> float | None:
        """Mean over (now - window_s, now]; None when the window holds no sample. The same
        number `self.evict(now)` would hold; `self` is not changed."""
        samples = self.samples
        if not samples:
            return None
        if _PAIR.unpack_from(samples, 0)[0] > now - self.window_s:  # nothing to drop
            mean = self.total / (len(samples) // _PAIR_SIZE)
            return mean if mean > 0.0 else 0.0  # max(0.0, mean) without the call
        m = self.evict(now)
        if not m.samples:
            return None
        return max(0.0, m.total / (len(m.samples) // _PAIR_SIZE))

    def oldest(self) -> float | None:
        """Time of the oldest sample kept, None when empty."""
        return _PAIR.unpack_from(self.samples, 0)[0] if self.samples else None

    def clear(self) -> SlidingMean:
        """The window with no sample (the eviction count carries on)."""
        return SlidingMean(self.window_s, b"", 0.0, self.evictions)


_TRIPLE: Final = struct.Struct("ddd")
"""a (t, a, b) sample of two series taken together, packed as three native doubles"""
_TRIPLE_SIZE: Final = _TRIPLE.size


@fast_init
@dataclass(frozen=True, slots=True)
class SlidingMeanPair:
    """Two `SlidingMean`s of series sampled at the same times over one window (in flight and
    queued; an expectation and its squared deviation): one value, one copy and one scan
    per sample instead of two. Each mean is the number its own `SlidingMean` would give
    (the same sums, in the same order, re-summed at the same evictions)."""

    window_s: float
    samples: bytes = b""
    """(t, a, b), oldest first, packed"""
    total_a: float = 0.0
    total_b: float = 0.0
    evictions: int = 0

    def add(self, t: float, a: float, b: float) -> SlidingMeanPair:
        """The window with (`a`, `b`) taken at `t` (and what `t` pushes out of it dropped)."""
        old = self.samples
        cutoff = t - self.window_s
        total_a, total_b, evictions = self.total_a + a, self.total_b + b, self.evictions
        # `_dropped`, inline (twice a tick per group: the call was a tenth of this)
        unpack = _TRIPLE.unpack_from
        k, n = 0, len(old)
        while k < n:
            at, da, db = unpack(old, k)
            if at > cutoff:
                break
            total_a -= da
            total_b -= db
            evictions += 1
            k += _TRIPLE_SIZE
        if k == n and t <= cutoff:  # a window of 0 keeps nothing, the new sample included
            total_a -= a
            total_b -= b
            evictions += 1
            samples = b""
        else:
            samples = old[k:] + _TRIPLE.pack(t, a, b)
        if evictions >= _RESUM_EVERY:
            total_a, total_b, evictions = _pair_sums(samples)
        return SlidingMeanPair(self.window_s, samples, total_a, total_b, evictions)

    def _dropped(
        self, samples: bytes, cutoff: float, total_a: float, total_b: float
    ) -> tuple[int, float, float, int]:
        unpack = _TRIPLE.unpack_from
        evictions = self.evictions
        k, n = 0, len(samples)
        while k < n:
            at, a, b = unpack(samples, k)
            if at > cutoff:
                break
            total_a -= a
            total_b -= b
            evictions += 1
            k += _TRIPLE_SIZE
        return k, total_a, total_b, evictions

    def evict(self, now: float) -> SlidingMeanPair:
        """The window as read at `now` (`self` when nothing falls out of it)."""
        samples = self.samples
        cutoff = now - self.window_s
        if not samples or _TRIPLE.unpack_from(samples, 0)[0] > cutoff:
            return self
        k, total_a, total_b, evictions = self._dropped(samples, cutoff, self.total_a, self.total_b)
        kept = samples[k:]
        if evictions >= _RESUM_EVERY:
            total_a, total_b, evictions = _pair_sums(kept)
        return SlidingMeanPair(self.window_s, kept, total_a, total_b, evictions)

    def means(self, now: float) -> tuple[float, float] | None:
        """Both means over (now - window_s, now]; None when the window holds no sample."""
        samples = self.samples
        if samples and _TRIPLE.unpack_from(samples, 0)[0] > now - self.window_s:
            m = self  # nothing to drop (`evict` would return `self`): most reads
        else:
            m = self.evict(now)
            samples = m.samples
        n = len(samples) // _TRIPLE_SIZE
        if not n:
            return None
        a, b = m.total_a / n, m.total_b / n
        return (a if a > 0.0 else 0.0), (b if b > 0.0 else 0.0)  # max(0.0, x), no calls


def _pair_sums(samples: bytes) -> tuple[float, float, int]:
    """Exact sums of a packed pair window's two series (float drift shed), evictions 0."""
    rows = list(_TRIPLE.iter_unpack(samples))
    return math.fsum(r[1] for r in rows), math.fsum(r[2] for r in rows), 0


@fast_init
@dataclass(frozen=True, slots=True)
class RollingExtreme(Generic[N]):
    """Rolling max (or min, `largest=False`) of values recorded within the last `window_s`
    seconds: `add` returns the next value, `extreme` reads it.

    A window of 0 keeps only the latest value. Monotonic tuple: amortised O(1) comparisons."""

    window_s: float
    largest: bool = True
    items: tuple[tuple[float, N], ...] = ()
    """(t, value), oldest first, each value beating every later one"""

    def add(self, t: float, value: N) -> RollingExtreme[N]:
        """Record `value` at `t`; the result's `extreme` is the extreme over (t - window_s, t]."""
        items = self.items
        k = len(items)
        if self.largest:  # drop the kept values `value` beats (ties too: the newer wins)
            while k and items[k - 1][1] <= value:
                k -= 1
        else:
            while k and items[k - 1][1] >= value:
                k -= 1
        cutoff = t - self.window_s
        j = 0
        while j < k and items[j][0] <= cutoff:
            j += 1
        return RollingExtreme(self.window_s, self.largest, items[j:k] + ((t, value),))  # noqa: RUF005

    @property
    def extreme(self) -> N:
        """The extreme over the window ending at the last `add` (raises when none was made)."""
        return self.items[0][1]

    def extreme_since(self, cutoff: float) -> N | None:
        """The extreme of the values recorded after `cutoff` (within the window); None when
        none was. A kept value beats every later one and a dropped one was beaten by a later
        one, so the first kept after `cutoff` is that extreme."""
        for t, value in self.items:
            if t > cutoff:
                return value
        return None

    def clear(self) -> RollingExtreme[N]:
        return RollingExtreme(self.window_s, self.largest)


_ZERO_SUMS = (0.0, 0.0, 0.0, 0.0, 0.0)  # not Final: mypyc leaves a Final tuple of floats unset


@fast_init
@dataclass(frozen=True, slots=True)
class Trend:
    """Least-squares line through (t, y) samples of the last `window_s` seconds.

    Gives the slope (y per second), its standard error and the fitted value at a time, so
    a caller can trust only slopes that stand clear of the noise (|slope| >= 2 x SE).
    Times are kept relative to the first sample (`origin`) so squares stay small.
    """

    window_s: float
    samples: bytes = b""
    """(t - origin, y), oldest first, packed (`pairs` reads them)"""
    origin: float | None = None
    sums: tuple[float, float, float, float, float] = _ZERO_SUMS
    """n, St, Sy, Stt, Sty (Syy kept apart)"""
    syy: float = 0.0
    evictions: int = 0

    def add(self, t: float, y: float) -> Trend:
        origin = t if self.origin is None else self.origin
        x = t - origin
        # the sums moved by the sample in and each sample out, in that order (as
        # `_resummed` adds them: a - x * y is a + -1.0 * x * y, bit for bit), no tuple
        # built a move: every group adds one and drops one every tick
        n, st, sy, stt, sty = self.sums
        n, st, sy, stt, sty, syy = (
            n + 1.0,
            st + x,
            sy + y,
            stt + x * x,
            sty + x * y,
            self.syy + y * y,
        )
        old = self.samples
        cutoff = x - self.window_s
        evictions = self.evictions
        unpack = _PAIR.unpack_from
        k, m = 0, len(old)
        while k < m:
            ox, oy = unpack(old, k)
            if ox > cutoff:
                break
            n, st, sy = n - 1.0, st - ox, sy - oy
            stt, sty, syy = stt - ox * ox, sty - ox * oy, syy - oy * oy
            evictions += 1
            k += _PAIR_SIZE
        if k == m and x <= cutoff:  # a window of 0 keeps nothing, the new sample included
            n, st, sy = n - 1.0, st - x, sy - y
            stt, sty, syy = stt - x * x, sty - x * y, syy - y * y
            evictions += 1
            samples = b""
        else:
            samples = old[k:] + _PAIR.pack(x, y)
        if evictions >= _RESUM_EVERY:
            return _resummed(self.window_s, samples, origin)
        return Trend(self.window_s, samples, origin, (n, st, sy, stt, sty), syy, evictions)

    def fit(self, now: float) -> tuple[float, float, float] | None:
        """(value at `now`, slope per second, slope standard error); None under 5 samples."""
        n, st, sy, stt, sty = self.sums
        if n < 5 or self.origin is None:
            return None
        sxx = stt - st * st / n
        if sxx <= 1e-9:
            return None
        sxy = sty - st * sy / n
        slope = sxy / sxx
        mean_t, mean_y = st / n, sy / n
        sse = max(0.0, (self.syy - sy * sy / n) - slope * sxy)
        se = math.sqrt(sse / (n - 2) / sxx)
        return mean_y + slope * ((now - self.origin) - mean_t), slope, se

    @property
    def count(self) -> int:
        return len(self.samples) // _PAIR_SIZE

    def clear(self) -> Trend:
        return _resummed(self.window_s, b"", None)


def _resummed(window_s: float, samples: bytes, origin: float | None) -> Trend:
    """A trend over `samples` with its sums taken afresh (the same additions, in order)."""
    n = st = sy = stt = sty = syy = 0.0
    sign = 1.0
    for x, y in _PAIR.iter_unpack(samples):
        n += sign
        st += sign * x
        sy += sign * y
        stt += sign * x * x
        sty += sign * x * y
        syy += sign * y * y
    return Trend(window_s, samples, origin, (n, st, sy, stt, sty), syy, 0)
