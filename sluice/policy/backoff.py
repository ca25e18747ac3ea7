"""Crash-loop backoff: a group whose instances keep failing waits longer before each
replacement (1 s, 2 s, 4 s ... capped), like Kubernetes' CrashLoopBackOff, so a broken
model does not turn into a storm of process launches. One READY instance resets it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CrashBackoff"]


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
