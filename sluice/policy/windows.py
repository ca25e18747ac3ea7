"""Which answers of a step's window a canary look compares: those that ARRIVED under the
step's split, old enough that both sides have finished them. Pure; times come in.

**Why by arrival.** A step's window used to hold the answers that *finished* after the step
began. Answers finishing in its first seconds include long ones that started under the
step before, whose split was different: they land mostly on the side whose share just
shrank, so early looks compared two samples that are not exchangeable (issue 32: a good
canary rolled back on `output_length` at 200 req/s). A request's side is drawn at arrival,
independently of what it asks, so requests that arrived under one split are exchangeable
between the two sides; one that arrived before the step began belongs to neither side.

**Why a horizon.** Short answers finish first: at a look, the requests that arrived in the
last seconds are there only if they were short. The two sides are read at slightly
different times (`through`: the instant up to which each side's answers are known), and a
side read later would hold more of the long ones. So a look keeps a request only if

- it arrived at or after the step began (`since`),
- it arrived at or before `through - horizon`, with `through` the earlier of the two
  sides' read times, and
- it finished by that common `through`.

The last two rules are the same for both sides and depend only on when a request arrived
and how long it took, never on its side: in an A/A comparison the two kept samples are
exchangeable whatever the horizon. The horizon keeps them nearly *complete*, which matters
when the canary really is slower (a censored slow tail would hide it, and lengths travel
with latency): it is `HORIZON_FACTOR` times the `HORIZON_QUANTILE` of the latencies seen
(the largest one seen while fewer than `1 / (1 - HORIZON_QUANTILE)` are known), bounded to
[`HORIZON_MIN_S`, `HORIZON_MAX_S`], so well under 0.1% of the requests old enough to keep
are still running. The price: a look sees the traffic of `horizon` seconds ago, so a step
takes about that much longer than its samples alone would.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from sluice.policy.analysis import RequestSample

__all__ = [
    "HORIZON_FACTOR",
    "HORIZON_MAX_S",
    "HORIZON_MIN_S",
    "HORIZON_QUANTILE",
    "horizon_s",
    "look_rows",
]

HORIZON_QUANTILE = 0.999
"""The latency quantile the horizon covers."""
HORIZON_FACTOR = 1.5
"""Margin over that quantile (the slow tail seen so far may be short of the true one)."""
HORIZON_MIN_S = 0.5
"""Never less: covers clock skew between the instances and the controller."""
HORIZON_MAX_S = 120.0
"""Never more: a hung answer must not hold a step's looks back for ever; answers longer
than this are rare enough to be dropped from both sides alike."""


def horizon_s(latencies: Iterable[float]) -> float:
    """How long after its arrival a request is counted at a look (seconds): see the module
    docstring. `latencies`: answers' latencies seen lately, both sides and earlier steps."""
    seen = sorted(x for x in latencies if math.isfinite(x) and x >= 0)
    if not seen:
        return HORIZON_MIN_S
    need = round(1 / (1 - HORIZON_QUANTILE))
    if len(seen) < need:
        tail = seen[-1]
    else:
        tail = seen[min(len(seen) - 1, math.ceil(HORIZON_QUANTILE * len(seen)) - 1)]
    return min(HORIZON_MAX_S, max(HORIZON_MIN_S, HORIZON_FACTOR * tail))


def look_rows(
    samples: Sequence[RequestSample], since: float, through: float | None, horizon: float
) -> list[RequestSample]:
    """The answers of a window a look compares, oldest arrival first (so the fast path's
    prefix grows as one sequence): arrived in [`since`, `through - horizon`] and finished by
    `through` (epoch seconds; None: nothing is known yet, so nothing is kept). A row without
    an arrival time (none of Sluice's sources sends one) is kept as it is."""
    if through is None:
        return []
    cutoff = through - horizon
    kept: list[tuple[float, int, RequestSample]] = []
    for i, s in enumerate(samples):
        a = s.arrived_at
        if a is None:
            kept.append((math.inf, i, s))
        elif since <= a <= cutoff and a + s.latency_s <= through:
            kept.append((a, i, s))
    kept.sort(key=lambda t: (t[0], t[1]))
    return [s for _, _, s in kept]
