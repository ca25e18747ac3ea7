"""Chronic under-use becomes a proposal (Q3, issue 37): is a group's guarantee larger than
its peaks ever need, week after week, and by how many units?

The units are the usage report's (`sluice.policy.usage`): returnable = guaranteed -
ceil(p99 of the hourly peaks of busy units) over the whole span. "Chronic" adds time: the
span is cut into whole weeks ending at `until`; a week counts as observed when at least
`MIN_COVERAGE` of it has history, and it is under-used when its mean busy units stay below
`UNDER_USE_SHARE` of the guarantee and its own p99 of hourly peaks leaves units idle. A group
is proposed only with `min_weeks` observed weeks or more, every one of them under-used, no
reclaim proposal of it pending, and none rejected within the span (its owner said no on
this evidence; new weeks must make the case again). Missing history is unknown, never zero:
too few weeks means no proposal, and the verdict says so.

Pure: hourly rollups, the guarantee and the span in; a verdict (and the proposal's reason
text, which carries the evidence and names the group, so a pending one is found again)
out. No clock: `since`/`until` and the times of earlier proposals are arguments.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from sluice.policy.history import HOUR_S, Rollup, merge
from sluice.policy.usage import MIN_COVERAGE, NEED_QUANTILE, UNDER_USE_SHARE, nearest_rank

__all__ = [
    "REASON_PREFIX",
    "WEEK_S",
    "ReclaimVerdict",
    "WeekUse",
    "judge_reclaim",
    "reclaim_group",
    "reclaim_reason",
    "weeks_of",
]

WEEK_S = 7 * 86_400.0
REASON_PREFIX = "quota reclaim"
"""Every reclaim proposal's reason starts `quota reclaim <group>:`; how a pending one is
recognised (whoever filed it: the scheduled check or `sluice report usage --propose`)."""
_REASON = re.compile(rf"^{REASON_PREFIX} ([A-Za-z0-9][A-Za-z0-9_.-]*):")


@dataclass(frozen=True, slots=True)
class WeekUse:
    """One whole week [start, start + 7 d) of a group's history."""

    start: float
    observed_hours: float
    coverage: float
    busy_mean: float | None
    hourly_peak_p99: float | None
    observed: bool
    under_used: bool


@dataclass(frozen=True, slots=True)
class ReclaimVerdict:
    """What the check says of one group: `propose` with `returnable` units (the guarantee
    becomes `new_guaranteed`), or `why` not. The evidence is kept either way."""

    group: str
    propose: bool
    why: str
    guaranteed: int
    returnable: int
    new_guaranteed: int
    weeks_observed: int
    weeks_under_used: int
    weeks_in_span: int
    min_weeks: int
    hourly_peak_p99: float | None
    busy_mean: float | None
    since: float
    until: float
    weeks: tuple[WeekUse, ...] = field(default=())
    pending: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["weeks"] = [asdict(w) for w in self.weeks]
        return out


def weeks_of(hours: Sequence[Rollup], since: float, until: float) -> list[WeekUse]:
    """The whole weeks of [since, until) that end at `until` (oldest first; a part week at
    the start is left out), each with its coverage, mean busy units and p99 of hourly peaks
    (`guaranteed` is judged by `judge_reclaim`; `under_used` here is False)."""
    n = int(max(0.0, until - since) // WEEK_S)
    out = []
    for k in range(n, 0, -1):
        start = until - k * WEEK_S
        inside = [r for r in hours if start <= r.start < start + WEEK_S]
        total = merge(inside, start=start) or Rollup(start=start)
        peaks = [p for r in inside if (p := r.peak("busy_units")) is not None]
        coverage = total.seconds / WEEK_S
        out.append(
            WeekUse(
                start=start,
                observed_hours=round(total.seconds / HOUR_S, 2),
                coverage=round(coverage, 4),
                busy_mean=total.mean("busy_units"),
                hourly_peak_p99=nearest_rank(peaks, NEED_QUANTILE),
                observed=coverage >= MIN_COVERAGE and bool(peaks),
                under_used=False,
            )
        )
    return out


def _need(p99: float) -> int:
    return math.ceil(p99 - 1e-9)


def _under(w: WeekUse, guaranteed: int) -> bool:
    return (
        w.observed
        and w.hourly_peak_p99 is not None
        and (w.busy_mean or 0.0) < UNDER_USE_SHARE * guaranteed
        and _need(w.hourly_peak_p99) < guaranteed
    )


def judge_reclaim(
    group: str,
    guaranteed: int,
    hours: Sequence[Rollup],
    since: float,
    until: float,
    *,
    min_weeks: int,
    pending: int | None = None,
    rejected: tuple[int, float] | None = None,
) -> ReclaimVerdict:
    """`group`'s verdict from its hourly rollups over [since, until). `pending`: the id of
    a reclaim proposal of it still waiting for review; `rejected`: (id, when) of its latest
    rejected one."""
    weeks = [
        WeekUse(**{**asdict(w), "under_used": _under(w, guaranteed)})
        for w in weeks_of(hours, since, until)
    ]
    inside = [r for r in hours if since <= r.start < until]
    peaks = [p for r in inside if (p := r.peak("busy_units")) is not None]
    p99 = nearest_rank(peaks, NEED_QUANTILE)
    total = merge(inside, start=since)
    busy_mean = total.mean("busy_units") if total is not None else None
    observed = [w for w in weeks if w.observed]
    under = [w for w in observed if w.under_used]
    returnable = 0 if p99 is None else max(0, guaranteed - _need(p99))
    why = ""
    if guaranteed <= 0:
        why = "no guarantee to return"
    elif len(observed) < min_weeks:
        why = (
            f"not enough history: {len(observed)} observed week(s) of {len(weeks)} whole "
            f"week(s) in the span (a week counts with >= {MIN_COVERAGE:.0%} of it stored); "
            f"{min_weeks} needed"
        )
    elif len(under) < len(observed):
        busy = [w for w in observed if not w.under_used]
        why = (
            f"not chronic: {len(busy)} of {len(observed)} observed week(s) used the guarantee "
            f"(the week of {_day(busy[0].start)}: p99 of hourly peaks "
            f"{busy[0].hourly_peak_p99 or 0:.2f} units, mean {busy[0].busy_mean or 0:.2f} of "
            f"{guaranteed})"
        )
    elif returnable <= 0:
        why = f"p99 of hourly peaks {p99 or 0:.2f} needs the whole guarantee of {guaranteed}"
    elif pending is not None:
        why = f"proposal #{pending} to return units of {group} is still pending review"
    elif rejected is not None and rejected[1] >= since:
        why = (
            f"proposal #{rejected[0]} to return units of {group} was rejected on "
            f"{_day(rejected[1])}, within this span: asked again once the span holds only "
            "weeks after it"
        )
    return ReclaimVerdict(
        group=group,
        propose=not why,
        why=why,
        guaranteed=guaranteed,
        returnable=returnable,
        new_guaranteed=guaranteed - returnable,
        weeks_observed=len(observed),
        weeks_under_used=len(under),
        weeks_in_span=len(weeks),
        min_weeks=min_weeks,
        hourly_peak_p99=None if p99 is None else round(p99, 4),
        busy_mean=None if busy_mean is None else round(busy_mean, 4),
        since=since,
        until=until,
        weeks=tuple(weeks),
        pending=pending,
    )


def reclaim_reason(v: ReclaimVerdict) -> str:
    """The proposal's reason: the group, the change and its evidence, in words."""
    weekly = ", ".join(
        f"{_day(w.start)} p99 {w.hourly_peak_p99 or 0:.2f}/mean {w.busy_mean or 0:.2f}"
        for w in v.weeks
        if w.observed
    )
    return (
        f"{REASON_PREFIX} {v.group}: guarantee {v.guaranteed} -> {v.new_guaranteed} "
        f"({v.returnable} unit(s) back to the shared pool). Evidence: {v.weeks_observed} "
        f"week(s) observed from {_day(v.since)} to {_day(v.until)}, all {v.weeks_under_used} "
        f"under-used; p99 of hourly peaks of busy units {v.hourly_peak_p99 or 0:.2f} "
        f"(mean {v.busy_mean or 0:.2f}); returnable = guaranteed {v.guaranteed} - "
        f"ceil({v.hourly_peak_p99 or 0:.2f}) = {v.returnable}. Per week (busy units): "
        f"{weekly}."
    )


def reclaim_group(reason: str) -> str | None:
    """The group a reclaim proposal's reason names (None: not a reclaim proposal)."""
    m = _REASON.match(reason)
    return m.group(1) if m else None


def _day(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d")
