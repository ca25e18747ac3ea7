"""Scheduled floors (S8): the minimum instance count a cron plan keeps in force at `now`.

An entry `{cron, min, duration_s, timezone}` holds at least `min` instances from each cron
firing for `duration_s`. Groups list entries inline or name reusable templates of
`PlatformSpec.schedule_templates`. Lookups are cached per entry (the last firing and the
next one, a value the caller keeps), so calling `floor_in` every simulated second costs a
few comparisons; croniter runs only when a firing boundary is crossed or time jumps
backwards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from croniter import croniter

from sluice.spec.autoscaling import ScheduleEntry

__all__ = ["Firings", "ScheduleFloors", "resolve_schedules"]


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


Firings = tuple[tuple[float, float] | None, ...]
"""per entry of a `ScheduleFloors`, its cached (last firing, next firing) around the last
time asked, None before the first ask"""


@dataclass(frozen=True, slots=True)
class _Window:
    """One entry and its time zone."""

    label: str
    entry: ScheduleEntry
    zone: ZoneInfo

    def firings(self, now: float) -> tuple[float, float]:
        """(prev, next): the firings with prev <= now < next."""
        start = datetime.fromtimestamp(now, self.zone)
        prev = float(croniter(self.entry.cron, start).get_prev(float))
        it = croniter(self.entry.cron, datetime.fromtimestamp(prev, self.zone))
        nxt = float(it.get_next(float))
        if nxt <= now:  # `now` sits exactly on a firing: croniter's get_prev skips it
            prev, nxt = nxt, float(it.get_next(float))
        return prev, nxt


class ScheduleFloors:
    """The highest scheduled floor in force at `now` (epoch seconds) and who set it.

    Configuration only: the firings it looked up are a `Firings` value the caller keeps
    (`initial()`, then what `floor_in` returns), so a lookup every simulated second costs
    a few comparisons."""

    def __init__(self, entries: Sequence[tuple[str, ScheduleEntry]] = ()) -> None:
        self._windows = tuple(
            _Window(label, entry, ZoneInfo(entry.timezone)) for label, entry in entries
        )

    def __bool__(self) -> bool:
        return bool(self._windows)

    def initial(self) -> Firings:
        """No firing looked up yet."""
        return (None,) * len(self._windows)

    def floor_in(self, now: float, cache: Firings) -> tuple[int, str | None, Firings]:
        """(floor, label, cache): the highest active entry at `now` ((0, None) when none is
        active), with `cache` (from `initial()` or the last call) updated where croniter had
        to be asked (a firing boundary crossed, or time went back)."""
        best, label = 0, None
        for i, w in enumerate(self._windows):
            if w.entry.min > best:
                fired = cache[i]
                if fired is None or not (fired[0] <= now < fired[1]):
                    fired = w.firings(now)
                    cache = (*cache[:i], fired, *cache[i + 1 :])
                if now < fired[0] + w.entry.duration_s:
                    best, label = w.entry.min, w.label
        return best, label, cache

    def floor_at(self, now: float) -> tuple[int, str | None]:
        """(floor, label) of the highest active entry; (0, None) when none is active."""
        best, label, _ = self.floor_in(now, self.initial())
        return best, label
