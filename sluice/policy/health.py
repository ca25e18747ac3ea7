"""Health verdicts from probe results: consecutive failures past a threshold fail an instance.

Like a Kubernetes liveness probe: one success resets the count (S10).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProbeRecord", "record_probe"]


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    consecutive_failures: int = 0
    last_error: str = ""


def record_probe(
    prev: ProbeRecord, ok: bool, error: str, failure_threshold: int
) -> tuple[ProbeRecord, bool]:
    """Returns the new record and whether the instance is now unhealthy (>= threshold)."""
    if ok:
        return ProbeRecord(), False
    rec = ProbeRecord(prev.consecutive_failures + 1, error)
    return rec, rec.consecutive_failures >= failure_threshold
