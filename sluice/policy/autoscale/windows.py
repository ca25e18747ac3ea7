"""Sliding-window statistics the autoscalers share, each amortised O(1) per sample.

Policies are called once per (simulated) second for hours of trace, so no window here is
re-scanned: sums are kept running, extremes use monotonic deques, and the least-squares
trend keeps its five moment sums (re-summed now and then to shed float drift).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Generic, TypeVar

N = TypeVar("N", int, float)

__all__ = ["RollingExtreme", "SlidingMean", "Trend"]

_RESUM_EVERY = 4096
"""evictions between exact re-sums of running float sums (drift stays ~1e-12)"""


class SlidingMean:
    """Mean of the samples taken within the last `window_s` seconds (sample-weighted)."""

    __slots__ = ("_evictions", "_samples", "_sum", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self._evictions = 0

    def add(self, t: float, value: float) -> None:
        self._samples.append((t, value))
        self._sum += value
        self._evict(t)

    def _evict(self, now: float) -> None:
        cutoff = now - self.window_s
        samples = self._samples
        while samples and samples[0][0] <= cutoff:
            self._sum -= samples.popleft()[1]
            self._evictions += 1
        if self._evictions >= _RESUM_EVERY:
            self._sum = math.fsum(v for _, v in samples)
            self._evictions = 0

    def mean(self, now: float) -> float | None:
        """Mean over (now - window_s, now]; None when the window holds no sample."""
        self._evict(now)
        if not self._samples:
            return None
        return max(0.0, self._sum / len(self._samples))

    def oldest(self) -> float | None:
        """Time of the oldest sample kept, None when empty."""
        return self._samples[0][0] if self._samples else None

    def clear(self) -> None:
        self._samples.clear()
        self._sum = 0.0


class RollingExtreme(Generic[N]):
    """Rolling max (or min) of values recorded within the last `window_s` seconds.

    A window of 0 keeps only the latest value. Monotonic deque: amortised O(1).
    """

    __slots__ = ("_items", "_sign", "window_s")

    def __init__(self, window_s: float, *, largest: bool = True) -> None:
        self.window_s = window_s
        self._sign = 1 if largest else -1
        self._items: deque[tuple[float, N]] = deque()

    def add(self, t: float, value: N) -> N:
        """Record `value` at `t`; return the extreme over (t - window_s, t]."""
        key = self._sign * value
        items = self._items
        while items and self._sign * items[-1][1] <= key:
            items.pop()
        items.append((t, value))
        cutoff = t - self.window_s
        while items[0][0] <= cutoff and len(items) > 1:
            items.popleft()
        return items[0][1]

    def clear(self) -> None:
        self._items.clear()


class Trend:
    """Least-squares line through (t, y) samples of the last `window_s` seconds.

    Gives the slope (y per second), its standard error and the fitted value at a time, so
    a caller can trust only slopes that stand clear of the noise (|slope| >= 2 x SE).
    Times are kept relative to the first sample so squares stay small.
    """

    __slots__ = ("_evictions", "_origin", "_samples", "_sums", "_syy", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()
        self._origin: float | None = None
        self._sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # n, St, Sy, Stt, Sty (Syy kept apart)
        self._evictions = 0
        self._syy = 0.0

    def add(self, t: float, y: float) -> None:
        if self._origin is None:
            self._origin = t
        x = t - self._origin
        self._samples.append((x, y))
        self._bump(x, y, 1.0)
        cutoff = x - self.window_s
        while self._samples and self._samples[0][0] <= cutoff:
            ox, oy = self._samples.popleft()
            self._bump(ox, oy, -1.0)
            self._evictions += 1
        if self._evictions >= _RESUM_EVERY:
            self._resum()

    def _bump(self, x: float, y: float, sign: float) -> None:
        s = self._sums
        s[0] += sign
        s[1] += sign * x
        s[2] += sign * y
        s[3] += sign * x * x
        s[4] += sign * x * y
        self._syy += sign * y * y

    def _resum(self) -> None:
        self._sums = [0.0, 0.0, 0.0, 0.0, 0.0]
        self._syy = 0.0
        for x, y in self._samples:
            self._bump(x, y, 1.0)
        self._evictions = 0

    def fit(self, now: float) -> tuple[float, float, float] | None:
        """(value at `now`, slope per second, slope standard error); None under 5 samples."""
        n, st, sy, stt, sty = self._sums
        if n < 5 or self._origin is None:
            return None
        sxx = stt - st * st / n
        if sxx <= 1e-9:
            return None
        sxy = sty - st * sy / n
        slope = sxy / sxx
        mean_t, mean_y = st / n, sy / n
        sse = max(0.0, (self._syy - sy * sy / n) - slope * sxy)
        se = math.sqrt(sse / (n - 2) / sxx)
        return mean_y + slope * ((now - self._origin) - mean_t), slope, se

    def clear(self) -> None:
        self._samples.clear()
        self._origin = None
        self._resum()
