"""Clocks: the only way live code learns the time; policies receive `now` as an argument."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds; wall-clock for SystemClock (stored in the DB), virtual for ManualClock."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to: for unit tests and the simulator."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"advance(seconds={seconds}): must be >= 0")
        self._t += seconds
