"""Start-up grace for availability alerts: a group whose first instances are still starting
(its first start, or a start from zero after a deliberate scale to zero) has no ready
instance because none has had time to be ready yet, not because it lost them. While that
start-up may still finish in time its `no_ready_instance` reading does not count, as a
Prometheus rule's `for:` keeps a condition from firing while it is expected.

Pure: each reading and `now` come in as arguments; the observer keeps the states between
readings (`sluice.control.observer`).

Transitions, one reading at a time (`wanted`: instances the controller keeps now):

| before               | reading                                   | after                  |
|----------------------|-------------------------------------------|------------------------|
| any (or unknown)     | wanted = 0                                | at_rest                |
| at_rest or unknown   | wanted > 0, one ready                     | watched                |
| at_rest or unknown   | wanted > 0, none ready                    | starting (until now+A) |
| starting             | one ready                                 | watched                |
| starting             | an instance launched since it began failed| watched                |
| starting             | now >= until                              | watched                |
| watched              | wanted > 0                                | watched                |

A (`allowance_s`) is how long the group's spec lets one instance take from launch to
ready: `health.startup_timeout_s` plus the warm-up's `timeout_s` when it warms up. Only
`starting` holds alerts off; a group that served once and then lost every ready instance
(`watched`) alerts as before, and so does a start-up that failed or ran past A.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = ["StartupReading", "StartupState", "follow_startups", "starting_groups"]

StartupPhase = Literal["at_rest", "starting", "watched"]


@dataclass(frozen=True, slots=True)
class StartupReading:
    """One group at one reading. `wanted`, `ready`: instance counts; `newest_failed_at`:
    launch time (seconds, the clock `now` comes from) of the newest failed instance, None
    if none failed; `allowance_s`: seconds a start-up may take (see the module)."""

    wanted: int
    ready: int
    allowance_s: float
    newest_failed_at: float | None = None


@dataclass(frozen=True, slots=True)
class StartupState:
    """Where a group's start-up stands. `since`: when this phase began (seconds);
    `until`: for `starting`, when its grace ends."""

    phase: StartupPhase
    since: float
    until: float | None = None
    reason: str = ""
    """why the group left `starting` (ready, failed, took longer than allowed)"""


def follow_startups(
    prev: Mapping[str, StartupState], readings: Mapping[str, StartupReading], now: float
) -> dict[str, StartupState]:
    """Each read group's next state at `now` (seconds), per the module's table. A group not
    in `readings` is dropped (it left the spec: a later return is a first start again)."""
    out: dict[str, StartupState] = {}
    for name, r in readings.items():
        out[name] = _next(prev.get(name), r, now)
    return out


def _next(old: StartupState | None, r: StartupReading, now: float) -> StartupState:
    if r.wanted <= 0:
        return old if old is not None and old.phase == "at_rest" else StartupState("at_rest", now)
    if old is None or old.phase == "at_rest":
        if r.ready > 0:
            return StartupState("watched", now, reason="ready")
        return StartupState("starting", now, until=now + max(0.0, r.allowance_s))
    if old.phase == "watched":
        return old
    if r.ready > 0:
        return StartupState("watched", now, reason="ready")
    if r.newest_failed_at is not None and r.newest_failed_at >= old.since:
        return StartupState("watched", now, reason="an instance failed while starting")
    if old.until is not None and now >= old.until:
        return StartupState(
            "watched",
            now,
            reason=f"no instance ready {now - old.since:.0f}s after the start "
            f"(allowed {old.until - old.since:.0f}s)",
        )
    return old


def starting_groups(states: Mapping[str, StartupState]) -> frozenset[str]:
    """The groups whose availability readings are held off now."""
    return frozenset(name for name, s in states.items() if s.phase == "starting")
