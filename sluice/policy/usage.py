"""Usage over a span (O3, Q3): which group is busy when, how much of its guarantee it needs,
what it borrowed, lent and spent, from its hourly rollups. `sluice report usage` prints it.

Pure: rollups and the spec in, plain data (JSON-ready) out; `since`/`until` come in as
arguments, never from a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sluice.policy.history import HOUR_S, Rollup, merge, series
from sluice.spec import GroupSpec, PlatformSpec

__all__ = [
    "MIN_COVERAGE",
    "NEED_QUANTILE",
    "TOP_HOURS",
    "UNDER_USE_SHARE",
    "WEEKDAYS",
    "group_usage",
    "hour_name",
    "nearest_rank",
    "usage_report",
]

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
TOP_HOURS = 5
MIN_COVERAGE = 0.8
"""A group observed for less of the span than this is not judged (no under-use verdict, no
returnable units): missing history is unknown, never zero."""
UNDER_USE_SHARE = 0.5
"""Under-using: mean busy units below this share of the guarantee over the span (and some
units returnable: a spiky group that needs its whole guarantee at its peak is not listed)."""
NEED_QUANTILE = 0.99
"""The group's need: this quantile of its hourly peaks of busy units (a few odd hours do not
pin a guarantee; a weekly peak does)."""

NEED_RULE = (
    "returnable = max(0, guaranteed - ceil(p99 of the hourly peaks of busy units)); busy "
    "units = the units the requests in flight keep busy (in_flight / max_concurrency x "
    "accelerators per instance), so idle instances a group keeps under its guarantee do not "
    f"count as need. Judged only with >= {MIN_COVERAGE:.0%} of the span observed; "
    f"under-using: mean busy units < {UNDER_USE_SHARE:.0%} of the guarantee and some units "
    "returnable (a group whose peaks still need its whole guarantee lends its idle hours "
    "instead, Q4)."
)


def hour_name(weekday: int, hour: int) -> str:
    """`Tue 14:00 UTC`: one cell of the hour-of-week grid (weekday 0 is Monday)."""
    return f"{WEEKDAYS[weekday]} {hour:02d}:00 UTC"


def _cell(start: float) -> tuple[int, int]:
    t = datetime.fromtimestamp(start, tz=UTC)
    return t.weekday(), t.hour


def _hours_in_month(at: float) -> float:
    t = datetime.fromtimestamp(at, tz=UTC)
    first = datetime(t.year, t.month, 1, tzinfo=UTC)
    nxt = datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=UTC)
    return (nxt - first).total_seconds() / 3600.0


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The `q` quantile by nearest rank (a value that was seen, not an interpolation)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _r(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)


def _heatmap(hours: Sequence[Rollup]) -> list[list[float | None]]:
    """7 x 24 (Monday first, UTC): mean requests/s over the observed time of each cell; None
    where the cell was never observed."""
    requests = [[0] * 24 for _ in range(7)]
    seconds = [[0.0] * 24 for _ in range(7)]
    for r in hours:
        d, h = _cell(r.start)
        requests[d][h] += r.requests
        seconds[d][h] += r.seconds
    return [
        [requests[d][h] / seconds[d][h] if seconds[d][h] > 0 else None for h in range(24)]
        for d in range(7)
    ]


def group_usage(
    name: str, g: GroupSpec | None, hours: Sequence[Rollup], since: float, until: float
) -> dict[str, Any]:
    """One group's usage from its hourly rollups (oldest first) over [since, until)."""
    span_h = max(0.0, until - since) / HOUR_S
    total = merge(hours, start=since) or Rollup(start=since)
    observed_h = total.seconds / HOUR_S
    coverage = observed_h / span_h if span_h > 0 else 0.0
    values = series(total)
    heat = _heatmap(hours)
    ranked = sorted(
        ((v, d, h) for d, row in enumerate(heat) for h, v in enumerate(row) if v),
        key=lambda x: (-x[0], x[1], x[2]),
    )
    busiest = [
        {"hour": hour_name(d, h), "weekday": d, "hour_utc": h, "requests_per_s": _r(v)}
        for v, d, h in ranked[:TOP_HOURS]
    ]
    guaranteed = g.quota.guaranteed if g is not None else None
    peaks = [p for r in hours if (p := r.peak("busy_units")) is not None]
    need_peak = nearest_rank(peaks, NEED_QUANTILE)
    busy_mean = total.mean("busy_units")
    judged = coverage >= MIN_COVERAGE and guaranteed is not None and need_peak is not None
    returnable: int | None = None
    under_using: bool | None = None
    why = ""
    if not judged:
        why = (
            "not in the spec"
            if guaranteed is None
            else f"observed {coverage:.0%} of the span (< {MIN_COVERAGE:.0%})"
        )
    else:
        assert guaranteed is not None and need_peak is not None
        need = math.ceil(need_peak - 1e-9)
        returnable = max(0, guaranteed - need)
        low = guaranteed > 0 and (busy_mean or 0.0) < UNDER_USE_SHARE * guaranteed
        under_using = low and returnable > 0
    spend = total.spend
    per_hour = spend / observed_h if observed_h > 0 else None
    month_h = _hours_in_month(until)
    projected = per_hour * month_h if per_hour is not None else None
    per_month = g.budget.per_month if g is not None and g.budget is not None else None
    return {
        "group": name,
        "in_spec": g is not None,
        "owner": g.owner if g else None,
        "business": g.business if g else None,
        "observed_hours": _r(observed_h, 2),
        "coverage": _r(coverage),
        "requests": total.requests,
        "requests_per_s": _r(values["requests_per_s"]),
        "error_rate": _r(values["error_rate"]),
        "p95_ms": _r(values["p95_ms"], 1),
        "heatmap": [[_r(v) for v in row] for row in heat],
        "busiest_hours": busiest,
        "guaranteed_units": guaranteed,
        "held_units": {"mean": _r(total.mean("held_units")), "peak": total.peak("held_units")},
        "busy_units": {
            "mean": _r(busy_mean),
            "peak": _r(total.peak("busy_units")),
            "hourly_peak_p99": _r(need_peak),
        },
        "judged": judged,
        "not_judged_why": why,
        "returnable_units": returnable,
        "under_using": under_using,
        "borrowed_unit_hours": _r((total.mean("borrowed_units") or 0.0) * observed_h, 2),
        "lent_unit_hours": _r((total.mean("lent_units") or 0.0) * observed_h, 2),
        "spend": _r(spend, 4),
        "spend_per_hour": _r(per_hour, 4),
        "budget_per_month": per_month,
        "projected_month_spend": _r(projected, 2),
        "projected_budget_share": _r(projected / per_month)
        if projected is not None and per_month
        else None,
        "timeline": {
            "start": [r.start for r in hours],
            "requests_per_s": [_r(r.requests / r.seconds) if r.seconds else None for r in hours],
            "held_units": [_r(r.mean("held_units")) for r in hours],
            "busy_units": [_r(r.mean("busy_units")) for r in hours],
            "busy_units_peak": [_r(r.peak("busy_units")) for r in hours],
            "spend": [_r(r.spend, 6) for r in hours],
        },
    }


def usage_report(
    spec: PlatformSpec | None,
    hours_by_group: Mapping[str, Sequence[Rollup]],
    since: float,
    until: float,
) -> dict[str, Any]:
    """Every group's usage (the spec's groups first, in its order, then groups that have
    history but left the spec), with the under-using ones and their returnable units."""
    names = [g.name for g in spec.groups] if spec else []
    names += sorted(n for n in hours_by_group if n not in names)
    groups = [
        group_usage(n, spec.group(n) if spec else None, hours_by_group.get(n, ()), since, until)
        for n in names
    ]
    under = [g for g in groups if g["under_using"]]
    return {
        "since": since,
        "until": until,
        "span_hours": round(max(0.0, until - since) / HOUR_S, 2),
        "rule": NEED_RULE,
        "groups": groups,
        "under_using": [
            {"group": g["group"], "returnable_units": g["returnable_units"]} for g in under
        ],
        "returnable_units": sum(g["returnable_units"] or 0 for g in groups),
        "not_judged": [g["group"] for g in groups if not g["judged"]],
        "spend": round(sum(g["spend"] or 0.0 for g in groups), 4),
    }
