"""Crash-loop backoff, live: each group's failed instances counted once, a ready one
resetting the count; a crash-looping group's launches wait (`sluice.policy.backoff`)."""

from __future__ import annotations

from collections.abc import Sequence

from sluice.control.events import EventLog
from sluice.core import InstanceState, InstanceStatus
from sluice.policy import CrashBackoff

__all__ = ["CrashLoops"]


class CrashLoops:
    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._backoff: dict[str, CrashBackoff] = {}
        self._seen: set[str] = set()
        """Instances already counted as failed or ready."""

    def launch_allowed(self, group: str, now: float) -> bool:
        return self._backoff.get(group, CrashBackoff()).launch_allowed(now)

    async def track(self, observed: Sequence[InstanceStatus], now: float) -> None:
        """Count each failed instance once per group; a newly READY one resets the group."""
        for inst in observed:
            if inst.id in self._seen:
                continue
            if inst.state is InstanceState.READY:
                self._seen.add(inst.id)
                self._backoff.pop(inst.group, None)
            elif inst.state is InstanceState.FAILED:
                self._seen.add(inst.id)
                backoff = self._backoff.get(inst.group, CrashBackoff()).after_failure(now)
                self._backoff[inst.group] = backoff
                if backoff.not_before > now:
                    await self._events.emit(
                        inst.group,
                        None,
                        "backoff",
                        f"{backoff.failures} failures in a row; next launch in "
                        f"{backoff.not_before - now:.0f}s",
                    )
        self._seen &= {i.id for i in observed}
