"""Scheduled floors (S8): the minimum instance count a cron plan keeps in force at `now`.

An entry `{cron, min, duration_s, timezone}` holds at least `min` instances from each cron
firing for `duration_s`. Groups list entries inline or name reusable templates of
`PlatformSpec.schedule_templates`. Lookups are cached per entry (the last firing and the
next one), so calling `floor_at` every simulated second costs a few comparisons; croniter
runs only when a firing boundary is crossed or time jumps backwards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from croniter import croniter

from sluice.spec.autoscaling import ScheduleEntry

__all__ = ["ScheduleFloors", "resolve_schedules"]


def resolve_schedules(
    items: Sequence[ScheduleEntry | str], templates: Mapping[str, Sequence[ScheduleEntry]]
) -> list[tuple[str, ScheduleEntry]]:
    """Expand a group's `schedules` (entries or template names) into labelled entries.

    Labels name the source for the Decision's winner: 'schedule:<template>' or
    'schedule:<cron>' for an inline entry. Raises ValueError for an unknown template name.
    """
    out: list[tuple[str, ScheduleEntry]] = []
    for item in items:
        if isinstance(item, str):
            if item not in templates:
                known = ", ".join(sorted(templates)) or "none defined"
                raise ValueError(f"no schedule template {item!r}; schedule_templates: {known}")
            out.extend((f"schedule:{item}", entry) for entry in templates[item])
        else:
            out.append((f"schedule:{item.cron}", item))
    return out


@dataclass(slots=True)
class _Window:
    """One entry's cached firings: `prev` <= t < `next` for the last time asked."""

    label: str
    entry: ScheduleEntry
    zone: ZoneInfo
    prev: float = float("nan")
    next: float = float("nan")

    def active(self, now: float) -> bool:
        if not (self.prev <= now < self.next):  # NaN compares False: first call refreshes
            self._refresh(now)
        return now < self.prev + self.entry.duration_s

    def _refresh(self, now: float) -> None:
        start = datetime.fromtimestamp(now, self.zone)
        prev = float(croniter(self.entry.cron, start).get_prev(float))
        it = croniter(self.entry.cron, datetime.fromtimestamp(prev, self.zone))
        nxt = float(it.get_next(float))
        if nxt <= now:  # `now` sits exactly on a firing: croniter's get_prev skips it
            prev, nxt = nxt, float(it.get_next(float))
        self.prev, self.next = prev, nxt


class ScheduleFloors:
    """The highest scheduled floor in force at `now` (epoch seconds) and who set it."""

    def __init__(self, entries: Sequence[tuple[str, ScheduleEntry]] = ()) -> None:
        self._windows = [
            _Window(label, entry, ZoneInfo(entry.timezone)) for label, entry in entries
        ]

    def __bool__(self) -> bool:
        return bool(self._windows)

    def floor_at(self, now: float) -> tuple[int, str | None]:
        """(floor, label) of the highest active entry; (0, None) when none is active."""
        best, label = 0, None
        for w in self._windows:
            if w.entry.min > best and w.active(now):
                best, label = w.entry.min, w.label
        return best, label
