"""Chronic under-use (Q3): groups whose guarantee mostly sits idle, and what could go back.

Use is a step function: each sample `(at, units)` holds until the next one. Over the window
`[now - window_s, now]` a group's average is the time-weighted mean of that function, and its
peak the largest value it took. A group is listed when its average stayed below
`threshold` x guaranteed; `returnable_units` = guaranteed - peak, the units it could give back
to the shared pool without any start in the window having been refused. A group whose samples
cover less than `min_coverage` of the window is not judged (missing data is not zero).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Underuse", "UsageSample", "underused_groups"]


@dataclass(frozen=True, slots=True)
class UsageSample:
    """Units a group held (running + draining) from `at` (seconds) on."""

    at: float
    units: float


@dataclass(frozen=True, slots=True)
class Underuse:
    group: str
    guaranteed: int
    average_units: float
    peak_units: float
    returnable_units: int
    reason: str


def underused_groups(
    samples: Mapping[str, Sequence[UsageSample]],
    guarantees: Mapping[str, int],
    *,
    now: float,
    window_s: float,
    threshold: float = 0.5,
    min_coverage: float = 0.8,
) -> list[Underuse]:
    """Groups (with a guarantee > 0) whose average use over the window was below
    `threshold` (a fraction, 0.5 = 50%) of their guarantee, most returnable units first.

    pre: window_s > 0; 0 < threshold <= 1; 0 <= min_coverage <= 1; samples of a group in any
    order (they are sorted here)."""
    if window_s <= 0:
        raise ValueError(f"window_s={window_s}: must be > 0")
    start = now - window_s
    out: list[Underuse] = []
    for group, guaranteed in guarantees.items():
        if guaranteed <= 0:
            continue
        series = sorted(samples.get(group, ()), key=lambda s: s.at)
        stats = _average(series, start, now)
        if stats is None or stats[2] < min_coverage * window_s:
            continue
        average, peak, _covered = stats
        if average >= threshold * guaranteed:
            continue
        returnable = max(0, guaranteed - math.ceil(peak))
        out.append(
            Underuse(
                group=group,
                guaranteed=guaranteed,
                average_units=average,
                peak_units=peak,
                returnable_units=returnable,
                reason=(
                    f"used {average:.2f} of {guaranteed} guaranteed units on average "
                    f"({100 * average / guaranteed:.0f}% < {100 * threshold:.0f}%) over "
                    f"{window_s:g} s, peak {peak:g}: {returnable} unit(s) could return to "
                    "the shared pool"
                ),
            )
        )
    out.sort(key=lambda u: (-u.returnable_units, u.group))
    return out


def _average(
    series: Sequence[UsageSample], start: float, end: float
) -> tuple[float, float, float] | None:
    """(time-weighted mean, peak, seconds covered) of the step function on [start, end]."""
    area = covered = peak = 0.0
    for i, s in enumerate(series):
        nxt = series[i + 1].at if i + 1 < len(series) else end
        lo, hi = max(s.at, start), min(nxt, end)
        if start <= s.at <= end or hi > lo:
            peak = max(peak, s.units)
        if hi > lo:
            area += s.units * (hi - lo)
            covered += hi - lo
    if covered <= 0:
        return None
    return area / covered, peak, covered
