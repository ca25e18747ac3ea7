"""Each group's recent request rate, from the gateway's cumulative arrival counters: what
`sluice rollout plan|start` turns into "the rollout will take about ... at this traffic"."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from sluice.policy.autoscale.base import TrafficSample

__all__ = ["ArrivalRates"]

WINDOW_S = 60.0
"""The rate is taken over about the last minute: long enough to smooth a burst, short
enough to follow the traffic of the hour."""


class ArrivalRates:
    """Keep (time, arrivals) per group for WINDOW_S; `rate(group)` is req/s over it."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_s = window_s
        self._seen: dict[str, deque[tuple[float, int]]] = {}

    def observe(self, traffic: Mapping[str, TrafficSample]) -> None:
        for group, sample in traffic.items():
            points = self._seen.setdefault(group, deque())
            if points and sample.arrivals < points[-1][1]:
                points.clear()  # the gateway restarted: its counters began again
            points.append((sample.at, sample.arrivals))
            while len(points) > 2 and points[1][0] <= sample.at - self._window_s:
                points.popleft()

    def rate(self, group: str) -> float | None:
        """Requests a second over the window; None before two readings a second apart."""
        points = self._seen.get(group)
        if not points or points[-1][0] - points[0][0] < 1.0:
            return None
        (t0, a0), (t1, a1) = points[0], points[-1]
        return (a1 - a0) / (t1 - t0)
