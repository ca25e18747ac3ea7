"""Shared vocabulary with no I/O: errors, clocks, instance states."""

from sluice.core.clock import Clock, ManualClock, SystemClock
from sluice.core.errors import (
    Conflict,
    Forbidden,
    NotFound,
    SluiceError,
    SpecError,
    SpecIssue,
    StoreUnavailable,
    Unauthorized,
    Unavailable,
    UpstreamError,
)
from sluice.core.instances import ALIVE_STATES, InstanceState, InstanceStatus
from sluice.core.verdicts import EXIT_FAILED, EXIT_INCONCLUSIVE, Verdict, verdict_exit

__all__ = [
    "ALIVE_STATES",
    "EXIT_FAILED",
    "EXIT_INCONCLUSIVE",
    "Clock",
    "Conflict",
    "Forbidden",
    "InstanceState",
    "InstanceStatus",
    "ManualClock",
    "NotFound",
    "SluiceError",
    "SpecError",
    "SpecIssue",
    "StoreUnavailable",
    "SystemClock",
    "Unauthorized",
    "Unavailable",
    "UpstreamError",
    "Verdict",
    "verdict_exit",
]
