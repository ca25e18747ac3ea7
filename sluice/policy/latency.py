"""Latency outliers: an instance whose typical latency is `ratio` x its peers' (issue 13, S3).

A slow instance that still answers 200s is invisible to the consecutive-failure detector, and
power of two choices only dampens it: an instance 10x slower holds its requests 10x longer,
loses most draws, and still gets ~8% of the traffic, which is then most of the group's p99.

Model. Every answered request updates, for its instance, exponentially weighted averages
with `alpha = 2 / (min_requests + 1)` (they span `min_requests` requests; the first ones are
plain running means, so nothing starts biased) of:
  - `ln(latency)`: the typical latency is the geometric mean, which one 100x straggler moves
    by `alpha * ln 100`, not 100x;
  - whether the request took more than `ratio` x the group's typical latency (0 or 1);
and, over 4x as many requests, the squared deviation of `ln(latency)` (the spread: a
property of the request mix, not of the moment).

Why comparing with peers holds for any mix: the balancer picks an instance without looking
at the request, so every instance of a group sees the same random mix of short and long
requests, and while nothing is wrong they all draw their latencies from one distribution.
So each verdict is a test against that null, with the peers' own numbers (medians of them):

  slow  iff  it and a peer have >= min_requests answered, and
    d = mean - peers' mean >= ln(ratio)                         its typical latency is k x
    d >= Z * sqrt(peers' spread * (w + peers' w))               and that is not luck,
    f - peers' f >= Z * sqrt(p (1 - p) (w + peers' w))          nor a burst of long ones,
    for PERSIST answered requests of it in a row (one if the evidence is overwhelming)

`w` is the variance factor of a weighted mean (the sum of its squared weights: 1/n for a plain
mean, 1/min_requests once an EWMA); `f` the share of its requests over `ratio` x typical,
`p` the peers' (at least 1/min_requests). The mean test is the efficient one for smooth mixes
(a fixed-size workload has no spread: a 10x instance is caught in ~7 of its requests); the
share test is the robust one, each request counting 0 or 1 however long it took: without it
a mix of 90% 10 ms and 10% 5 s requests ejects on four long ones in a row. A heavy-tailed
mix needs more requests to convict than a smooth one, and an A/A group does not eject:
tests/unit/test_latency_outliers.py checks both; `python bench/latency_outliers.py` prints
false verdicts and requests to catch 5x / 10x per mix (bench/README.md has a run).

Latencies below `FLOOR_S` count as `FLOOR_S`: sub-millisecond differences are scheduler
noise on the gateway's host, not a slow instance. Pure: latencies come in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Container
from math import log
from typing import Final

__all__ = ["FLOOR_S", "LAG_RATIO", "PERSIST", "RAMP_MIN_REQUESTS", "LatencyOutliers", "Z"]

Z: Final = 4.0
"""Standard errors each excess must clear under the null (A/A): a one-sided normal tail of
3e-5 per check; a verdict also needs both tests and PERSIST checks in a row."""
PERSIST: Final = 5
FLOOR_S: Final = 0.001
NULL_SPAN: Final = 10.0
"""The null's numbers (spread, share of long requests) are properties of the request mix, not
of the moment: each instance averages them over this many times as many requests as its mean,
so that their own noise decides nothing (the variance of the last 20 requests is off by a
third as often as not, and 0 for a while in a mix with a rare long class). They come from
the peers only: the instance under test would inflate both."""
LAG_RATIO: Final = 1.5
"""A ramping instance this much slower than its peers (and significantly so) stops gaining
share: "in line with its group's" (S3) is stricter than "bad enough to eject"."""
RAMP_MIN_REQUESTS: Final = 5
"""A ramping instance gets few requests, so its lag is judged after this many (the variance
factor of a mean of 5 is 1/5: only a large, consistent lag clears `Z`)."""
_LOG_FLOOR: Final = math.log(FLOOR_S)
_N, _MEAN, _W, _OVER, _STRIKES, _SPREAD, _SHARE = range(7)


class LatencyOutliers:
    """Per-instance latency estimates of one group and the verdict "slower than its peers".

    Mutable, one per group, fed by the data plane with every answered request (status < 500).
    `observe` is the hot path: one dict lookup, a log and a few float updates; the peer
    comparison (a few medians) runs only for an instance whose mean is already past a bound
    every slow verdict needs (the fastest mean plus the smallest margin), refreshed with the
    group's typical latency every `_REFRESH` requests of an instance.
    """

    _REFRESH = 32.0
    """Requests of an instance between refreshes: the group refreshes about once in 32
    requests (a few us for a few instances, so ~0.1 us a request), and a stale bound or
    threshold moves slowly anyway (they follow means that span 20 requests)."""

    def __init__(self, ratio: float, min_requests: int) -> None:
        """`ratio` (> 1): how many times its peers' typical latency makes an instance slow;
        `min_requests` (>= 2): answered requests of it, and of a peer, before it is judged."""
        self.ratio = ratio
        self.min_requests = min_requests
        self._log_ratio = math.log(ratio)
        self._alpha = 2.0 / (min_requests + 1)
        self._alpha_null = self._alpha / NULL_SPAN
        self._settled = 1.0 / self._alpha_null
        """Requests of an instance after which all its averages are EWMAs (its `w` is then
        1/min_requests to within 0.5%, and no longer updated)."""
        self._stats: dict[str, list[float]] = {}
        """instance -> [n, mean ln latency, w, share of requests over `_over`, strikes,
        spread (variance of ln latency), share over `_over` (both over NULL_SPAN x longer)]"""
        self._bound = -math.inf
        """No instance whose mean is below this is slow (a lower bound, maybe stale)."""
        self._over = math.inf
        """ln of `ratio` x the group's typical latency: a request over it is a long one."""

    def observe(self, instance_id: str, latency_s: float) -> str | None:
        """Count one answered request of `instance_id` that took `latency_s` seconds; returns
        why it is slow (the ejection's reason) or None."""
        s = self._stats.get(instance_id)
        if s is None:
            s = self._stats[instance_id] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        n = s[0] + 1.0  # indices as literals on this path: see _N ... _SHARE
        s[0] = n
        x = log(latency_s) if latency_s > FLOOR_S else _LOG_FLOOR
        if n > self._settled:  # the common case
            a = self._alpha
            d = x - s[1]
            s[1] += a * d
            over = x > self._over
            s[3] += a * (over - s[3])
            a = self._alpha_null
            s[5] += a * (d * d - s[5])
            s[6] += a * (over - s[6])
        else:
            self._start(s, n, x)
        if n % self._REFRESH == 0.0:
            self._refresh()
        if s[1] < self._bound or n < self.min_requests:
            if s[4]:
                s[4] = 0.0
            return None
        return self._check(instance_id, s)

    def _start(self, s: list[float], n: float, x: float) -> None:
        """The first requests: each average is a plain running mean until its EWMA weight is
        the larger; the spread averages squared deviations from the mean of the requests
        before (a little high at first: the safe side)."""
        over = 1.0 if x > self._over else 0.0
        if n == 1.0:  # no deviation to count yet
            s[_MEAN], s[_W], s[_OVER], s[_SHARE] = x, 1.0, over, over
            return
        a = max(self._alpha, 1.0 / n)
        d = x - s[_MEAN]
        s[_MEAN] += a * d
        s[_W] = (1.0 - a) * (1.0 - a) * s[_W] + a * a
        s[_OVER] += a * (over - s[_OVER])
        a = max(self._alpha_null, 1.0 / n)
        s[_SPREAD] += a * (d * d - s[_SPREAD])
        s[_SHARE] += a * (over - s[_SHARE])
        if n == self.min_requests:  # newly judged: it may be the fastest, lowering the bound
            self._refresh()

    def _check(self, instance_id: str, s: list[float]) -> str | None:
        """The full verdict, for an instance already past the cheap bound."""
        strength = self._excess(instance_id, s, self._log_ratio, share_test=True)
        if strength < 1.0:
            s[_STRIKES] = 0.0
            return None
        s[_STRIKES] = PERSIST if strength >= 2.0 else s[_STRIKES] + 1.0
        if s[_STRIKES] < PERSIST:
            return None
        return self._reason(instance_id, s)

    def slower(self, instance_id: str, ratio: float = LAG_RATIO) -> bool:
        """Whether `instance_id`'s typical latency is significantly at least `ratio` x its
        peers', judged after only `RAMP_MIN_REQUESTS` of its requests (for slow start: no
        share test or persistence, as holding a ramp back is cheap to undo). Not on the hot
        path."""
        s = self._stats.get(instance_id)
        if s is None or s[_N] < RAMP_MIN_REQUESTS:
            return False
        return self._excess(instance_id, s, math.log(ratio), share_test=False) >= 1.0

    def _peers(self, instance_id: str) -> list[list[float]]:
        return [
            p for i, p in self._stats.items() if i != instance_id and p[_N] >= self.min_requests
        ]

    def _excess(
        self, instance_id: str, s: list[float], log_ratio: float, *, share_test: bool
    ) -> float:
        """0.0 unless `instance_id` passes every test of the verdict; then how sure: the
        least of its excesses over the tests' Z bounds (>= 1.0; infinite with no spread)."""
        peers = self._peers(instance_id)
        if not peers:
            return 0.0
        d = s[_MEAN] - _upper_median([p[_MEAN] for p in peers])
        if d < log_ratio:
            return 0.0
        w = s[_W] + _upper_median([p[_W] for p in peers])
        se = math.sqrt(_upper_median([p[_SPREAD] for p in peers]) * w)
        if d < Z * se:
            return 0.0
        strength = d / (Z * se) if se > 0.0 else math.inf
        if share_test:
            p0 = _upper_median([p[_SHARE] for p in peers])
            null = max(p0, 1.0 / self.min_requests)
            excess = (s[_OVER] - p0) / (Z * math.sqrt(null * (1.0 - null) * w))
            strength = min(strength, excess) if excess >= 1.0 else 0.0
        return strength

    def _reason(self, instance_id: str, s: list[float]) -> str:
        ref = _upper_median([p[_MEAN] for p in self._peers(instance_id)])
        return (
            f"latency {1000 * math.exp(s[_MEAN]):.0f} ms vs peers {1000 * math.exp(ref):.0f} ms"
            f" ({math.exp(s[_MEAN] - ref):.1f}x) over its last ~{self.min_requests} requests"
            f" ({int(s[_N])} seen)"
        )

    def _refresh(self) -> None:
        """The group's typical latency (the lower median of judged means: of two, the
        faster), what counts as a long request, and the bound: the fastest judged mean plus
        the smallest margin any verdict needs (ln ratio, or Z standard errors with the least
        spread and w >= 1/min_requests)."""
        means: list[float] = []
        low_spread = math.inf
        for s in self._stats.values():
            if s[_N] >= self.min_requests:
                means.append(s[_MEAN])
                if s[_SPREAD] < low_spread:
                    low_spread = s[_SPREAD]
        if not means:  # nobody judged yet: check whoever gets there first
            self._bound, self._over = -math.inf, math.inf
            return
        means.sort()
        self._over = means[(len(means) - 1) // 2] + self._log_ratio
        floor_se = Z * math.sqrt(low_spread * 2.0 / self.min_requests)
        self._bound = means[0] + max(self._log_ratio, floor_se)

    def estimate(self, instance_id: str) -> tuple[int, float] | None:
        """(answered requests counted, typical latency in seconds: the geometric mean)."""
        s = self._stats.get(instance_id)
        return None if s is None else (int(s[_N]), math.exp(s[_MEAN]))

    def reset(self, instance_id: str) -> None:
        """Start `instance_id` over (it was ejected: what it does when back is what counts)."""
        self._stats.pop(instance_id, None)
        self._refresh()

    def forget(self, keep: Container[str]) -> None:
        """Drop estimates of instances no longer in the group."""
        for iid in [i for i in self._stats if i not in keep]:
            del self._stats[iid]
        self._refresh()


def _upper_median(values: list[float]) -> float:
    """The median, the higher middle one for an even count: of two peers the slower, so one
    unusually fast peer does not make the others look slow (and the null is never the
    lower of two)."""
    values.sort()
    return values[len(values) // 2]
