"""Did a load generator keep its schedule? A load test or drill measures the target only while
its own generator sends what it was asked to, when it was asked to; one that fell behind
(a loaded machine, too little in-flight room) offered a lower and burstier load than planned,
so its result is *inconclusive*, never a pass or a fail of the target.

Pure: the arrivals' scheduled and actual send offsets come in (seconds from the run's
start), the judgement goes out. `sluice.tools.loadstats` feeds it each run or step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["BEHIND_LAG_S", "MIN_SEND_SHARE", "ScheduleBounds", "ScheduleKeeping", "judge_schedule"]

BEHIND_LAG_S = 0.050
"""A p99 schedule lag above this marks the generator *behind*: its sends no longer follow
the schedule it was given, so the offered rate is lower (and burstier) than asked. 50 ms is
well above asyncio's timer and scheduling jitter on a loaded host (a few ms) and well below
the latencies a capacity test judges (hundreds of ms), so crossing it means the generator,
not the target, is shaping the load."""

MIN_SEND_SHARE = 0.90
"""The least share of the window's scheduled arrivals that must be *sent within the window*:
a generator whose lag stays under `BEHIND_LAG_S` loses at most the arrivals of the window's
last 50 ms to the next one (5 % of a 1 s window, less of a longer one), so below 90 % it
sent at a lower rate than asked. Under the default lag bound this mostly repeats the lag
check; under a loose one (`--max-lag-ms 1000`) it is what catches a generator that drifts a
little later each send, within the bound, while sending less than asked."""

MIN_RATE_ARRIVALS = 20
"""The send-rate check needs this many scheduled arrivals: in a smaller window one late
send is already 5 %."""


@dataclass(frozen=True, slots=True)
class ScheduleBounds:
    """What counts as keeping the schedule. `max_p99_lag_s`: seconds a send may come after
    its scheduled time, at the 99th percentile; `min_send_share`: sends made in the window
    over arrivals scheduled in it."""

    max_p99_lag_s: float = BEHIND_LAG_S
    min_send_share: float = MIN_SEND_SHARE

    def __post_init__(self) -> None:
        if not (np.isfinite(self.max_p99_lag_s) and self.max_p99_lag_s >= 0):
            raise ValueError(f"max_p99_lag_s must be >= 0 seconds, got {self.max_p99_lag_s}")
        if not 0 <= self.min_send_share <= 1:
            raise ValueError(f"min_send_share must be in [0, 1], got {self.min_send_share}")


@dataclass(frozen=True, slots=True)
class ScheduleKeeping:
    """The judgement: `kept` False when any bound was crossed, each crossing in `reasons`
    (words with numbers). Lags in ms (None: nothing was sent); `send_share` None where the
    window held fewer than `MIN_RATE_ARRIVALS` arrivals."""

    kept: bool
    reasons: tuple[str, ...]
    unsent: int
    lag_p50_ms: float | None
    lag_p99_ms: float | None
    lag_max_ms: float | None
    send_share: float | None

    @property
    def reason(self) -> str | None:
        """The reasons joined, or None when the schedule was kept."""
        return "; ".join(self.reasons) or None


def judge_schedule(
    scheduled_s: Sequence[float],
    sent_s: Sequence[float | None],
    *,
    window: tuple[float, float] | None = None,
    sends_in_window: int | None = None,
    bounds: ScheduleBounds | None = None,
) -> ScheduleKeeping:
    """Whether the generator kept to its schedule for the arrivals `scheduled_s` (offsets, s),
    sent at `sent_s` (None: never sent: the generator dropped it, e.g. at its in-flight cap).

    Behind when any arrival went unsent, when the p99 of (sent - scheduled) exceeds
    `bounds.max_p99_lag_s`, or, given the `window` [start, end) the arrivals were chosen by
    and `sends_in_window` (sends made in it, whichever arrival they were for), when fewer
    than `bounds.min_send_share` of the scheduled arrivals were sent in it: a generator that
    falls further behind each second sends at a lower rate than asked even while the
    sends it makes look only a little late. `bounds` None: the defaults."""
    bounds = bounds if bounds is not None else ScheduleBounds()
    if len(scheduled_s) != len(sent_s):
        raise ValueError(f"{len(scheduled_s)} scheduled offsets but {len(sent_s)} send offsets")
    lags = np.array(
        [s - a for a, s in zip(scheduled_s, sent_s, strict=True) if s is not None], dtype=float
    )
    unsent = len(scheduled_s) - lags.size
    p50 = float(np.percentile(lags, 50) * 1000) if lags.size else None
    p99 = float(np.percentile(lags, 99) * 1000) if lags.size else None
    worst = float(lags.max() * 1000) if lags.size else None
    reasons: list[str] = []
    if unsent:
        reasons.append(f"{unsent} of {len(scheduled_s)} arrivals unsent (in-flight cap reached)")
    bound_ms = bounds.max_p99_lag_s * 1000
    if p99 is not None and p99 > bound_ms:
        reasons.append(f"p99 schedule lag {p99:.0f} ms > {bound_ms:.0f} ms")
    share: float | None = None
    if window is not None and sends_in_window is not None:
        if window[1] <= window[0]:
            raise ValueError(f"window must end after it starts, got {window}")
        if len(scheduled_s) >= MIN_RATE_ARRIVALS:
            share = sends_in_window / len(scheduled_s)
            if share < bounds.min_send_share:
                span = window[1] - window[0]
                reasons.append(
                    f"sent {sends_in_window / span:.3g} rps of the {len(scheduled_s) / span:.3g} "
                    f"asked ({share:.0%} < {bounds.min_send_share:.0%})"
                )
    return ScheduleKeeping(not reasons, tuple(reasons), unsent, p50, p99, worst, share)
