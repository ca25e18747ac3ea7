"""The codes the simulator (`sluice.sim.fleet`) records in, for a whole spec and for a fleet
of one alike: each request's outcome, each simulated instance's state, the p95 window the
autoscaler is fed, and a decision's entry in the decision log."""

from __future__ import annotations

from typing import Any

from sluice.policy.autoscale import Decision, GroupLoad

__all__ = [
    "ACTIVE",
    "DEAD",
    "DRAINING",
    "FAILED",
    "P95_WINDOW_TICKS",
    "PENDING",
    "REJECTED",
    "STARTING",
    "STOPPED",
    "decision_entry",
]

STARTING, ACTIVE, DRAINING, STOPPED, DEAD = 0, 1, 2, 3, 4
"""a simulated instance's state (DEAD: crashed or killed at its drain deadline)"""
PENDING, REJECTED, FAILED = -1.0, -2.0, -3.0
"""a request's completion time, or why it has none: not finished, turned away (shed or
expired in the queue), failed (its instance died)"""
P95_WINDOW_TICKS = 5
"""p95 latency is taken over the completions of the last 5 decision ticks"""


def decision_entry(now: float, load: GroupLoad, d: Decision, before: int | None) -> dict[str, Any]:
    """One line of a simulation's decision log (the report's table, `--json`)."""
    return {
        "t": round(now, 3),
        "from": before,
        "to": d.desired,
        "changed": d.desired != before,
        "reason": d.reason,
        "winner": d.winner,
        "clipped_by": list(d.clipped_by),
        "ready": load.ready,
        "in_flight": load.in_flight,
        "queued": load.queued,
        "signals": {k: round(float(v), 3) for k, v in d.signals.items()},
    }
