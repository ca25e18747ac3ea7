"""A trace priced for one group's instance model (`Workload`, `prepare`: service times and
SLO bounds per request, numpy, once per trace), and the virtual clock's `EPOCH`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sluice.sim.model import InstanceModel
from sluice.sim.trace import Trace

__all__ = ["EPOCH", "Workload", "prepare"]

EPOCH = 1_767_225_600.0
"""Trace second 0 on the policy's clock: 2026-01-01 00:00 UTC (cron schedules read it)."""


@dataclass(frozen=True)
class Workload:
    """A trace priced for one instance model: the per-request arrays the hot loop reads."""

    model: InstanceModel
    trace: Trace
    service: npt.NDArray[np.float64]
    limit: npt.NDArray[np.float64]
    """per-request latency bound (s)"""

    @property
    def work_floor_instance_seconds(self) -> float:
        """sum(service time) / slots per instance: no policy can serve the trace with fewer
        instance-seconds of ready instances (each slot runs one request at a time)."""
        return float(self.service.sum()) / self.model.slots


def prepare(model: InstanceModel, trace: Trace, seed: int | None = None) -> Workload:
    """Service times and SLO bounds for every request (numpy, once per trace)."""
    s = seed if seed is not None else model.seed
    service = model.service_times(
        trace.models, trace.model, trace.input_tokens, trace.output_tokens, s
    )
    return Workload(model, trace, service, model.slo_limits(service))
