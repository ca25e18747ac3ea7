"""When a scheduled drill (`drills:` in the spec) is due: Kubernetes CronJob semantics.

At each look the drill fires for the latest cron firing after the last one it handled, at
most once however many passed (a controller down for a day runs one drill when it is back,
not 24). A firing found later than `starting_deadline_s` after its time is *missed*: it is
recorded and not run, since a peak rehearsed hours late lands on traffic nobody planned
for. The concurrency policy is CronJob's `Forbid` and lives with the caller: a drill still
running, or any drill on the same group, makes a due firing *skipped* (two peaks on one
group would judge each other's scale-ups).

Pure: times are Unix seconds handed in; cron fields are read in the entry's time zone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from croniter import croniter

__all__ = ["MAX_COUNTED", "DueFiring", "due_firing", "latest_firing", "next_firing"]

MAX_COUNTED = 100
"""Passed-over firings are counted up to this (CronJob's own limit on what it looks at)."""


@dataclass(frozen=True, slots=True)
class DueFiring:
    at: float
    """the firing's scheduled time"""
    late_s: float
    """how long after `at` it was found"""
    missed: bool
    """found past the starting deadline: record it, do not run it"""
    passed_over: int
    """earlier firings since the last one handled, never run (at most `MAX_COUNTED`)"""


def next_firing(cron: str, timezone: str, after: float) -> float:
    """The first firing strictly after `after`."""
    zone = ZoneInfo(timezone)
    return float(croniter(cron, datetime.fromtimestamp(after, zone)).get_next(float))


def latest_firing(cron: str, timezone: str, now: float) -> float:
    """The last firing at or before `now`."""
    zone = ZoneInfo(timezone)
    prev = float(croniter(cron, datetime.fromtimestamp(now, zone)).get_prev(float))
    following = next_firing(cron, timezone, prev)
    return following if following <= now else prev  # croniter's get_prev skips `now` itself


def due_firing(
    cron: str, timezone: str, *, since: float, now: float, starting_deadline_s: float
) -> DueFiring | None:
    """The firing to handle at `now`, given that every firing up to `since` was handled
    (`since`: the last handled firing's time, or when the schedule was first seen)."""
    at = latest_firing(cron, timezone, now)
    if at <= since:
        return None
    passed, t = 0, next_firing(cron, timezone, since)
    while t < at and passed < MAX_COUNTED:
        passed += 1
        t = next_firing(cron, timezone, t)
    late = now - at
    return DueFiring(at=at, late_s=late, missed=late > starting_deadline_s, passed_over=passed)
