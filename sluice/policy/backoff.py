"""Crash-loop backoff: a group whose instances keep failing waits longer before each
replacement (1 s, 2 s, 4 s ... capped), like Kubernetes' CrashLoopBackOff, so a broken
model does not turn into a storm of process launches. One READY instance resets it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sluice.core.frozen import fast_init
from sluice.core.instances import InstanceState, InstanceStatus

__all__ = ["CrashBackoff", "CrashLoops"]

_READY, _FAILED = InstanceState.READY, InstanceState.FAILED


@dataclass(frozen=True, slots=True)
class CrashBackoff:
    failures: int = 0
    """Consecutive failures since the group last had an instance become READY."""
    not_before: float = 0.0
    """No launch before this time (seconds, the caller's clock)."""

    def after_failure(self, now: float, base_s: float = 1.0, cap_s: float = 60.0) -> CrashBackoff:
        """The first failure is replaced at once; then delays double up to `cap_s`."""
        failures = self.failures + 1
        delay = 0.0 if failures == 1 else min(cap_s, base_s * 2 ** (failures - 2))
        return CrashBackoff(failures, now + delay)

    def launch_allowed(self, now: float) -> bool:
        return now >= self.not_before


@fast_init
@dataclass(frozen=True, slots=True)
class CrashLoops:
    """Each group's backoff, with the instances already counted (failed or ready) so each
    counts once."""

    backoff: Mapping[str, CrashBackoff] = field(default_factory=dict)
    counted: frozenset[str] = frozenset()

    def track(
        self, observed: Sequence[InstanceStatus], now: float
    ) -> tuple[CrashLoops, tuple[tuple[str, CrashBackoff], ...]]:
        """Count each failed instance once per group; a newly READY one resets its group.
        Returns the next value (this one when nothing changed: most ticks) and each group
        whose launches now wait (to be said)."""
        counted = self.counted
        fresh = [  # the id first: nearly every instance is counted already
            inst
            for inst in observed
            if inst.id not in counted and (inst.state is _READY or inst.state is _FAILED)
        ]
        if not fresh and len(counted) <= 2 * len(observed) + 64:
            return self, ()
        backoff = dict(self.backoff)
        waiting: list[tuple[str, CrashBackoff]] = []
        for inst in fresh:
            if inst.state is _READY:
                backoff.pop(inst.group, None)
            else:
                after = backoff.get(inst.group, CrashBackoff()).after_failure(now)
                backoff[inst.group] = after
                if after.not_before > now:
                    waiting.append((inst.group, after))
        grown = counted | {inst.id for inst in fresh}
        if len(grown) > 2 * len(observed) + 64:  # forget the ones gone, now and then
            grown = grown & {inst.id for inst in observed}
        return CrashLoops(backoff, grown), tuple(waiting)

    def launch_allowed(self, group: str, now: float) -> bool:
        return self.backoff.get(group, CrashBackoff()).launch_allowed(now)
