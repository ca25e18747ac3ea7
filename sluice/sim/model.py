"""The simulated instance model of one group, read from its spec: slots, launch -> ready time,
per-request service times (the `sim` runtime's formulas), the SLO, queue limits and price.

Service times follow `sluice.worker.runtimes.sim.service_seconds` (fixed, lognormal, or
`a + b*input_tokens + c*output_tokens`), computed for a whole trace at once with numpy, and
then clipped to [`SERVICE_MIN_S`, `SERVICE_MAX_S`] = [0.01, 30] s: a simulator bound (the spec
has no field for it yet), so that a token-count outlier cannot hold a slot for minutes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from sluice.core.errors import SpecError, SpecIssue
from sluice.spec.autoscaling import SloSpec
from sluice.spec.models import GroupSpec, PlatformSpec
from sluice.spec.runtimes import (
    FixedServiceTime,
    LinearServiceTime,
    LognormalServiceTime,
    ServiceTime,
    SimParams,
)

__all__ = ["SERVICE_MAX_S", "SERVICE_MIN_S", "InstanceModel", "nominal_seconds", "pick_group"]

SERVICE_MIN_S = 0.01
SERVICE_MAX_S = 30.0


@dataclass(frozen=True)
class InstanceModel:
    """Everything the simulator needs to know about one group's simulated instances."""

    group: GroupSpec
    slots: int
    """max_concurrency: independent slots per instance (no slowdown when busy)"""
    startup_s: float
    """launch -> ready: the models' start-up plus warm-up passes"""
    service: dict[str, ServiceTime]
    """model id -> service-time model; a trace model not served falls back to `default_model`"""
    default_model: str
    slo: SloSpec
    price_per_hour: float
    """per instance (pool price x accelerators)"""
    min_instances: int
    max_instances: int
    interval_s: float
    """decision tick"""
    seed: int
    platform: PlatformSpec | None = field(default=None, repr=False, compare=False)
    """the spec the model was read from: a one-group run puts the group alone on its pool,
    under the spec's budget and schedule templates (`sluice.sim.single.alone`)"""

    @classmethod
    def from_spec(
        cls, spec: PlatformSpec, group: GroupSpec, slo_ms: float | None = None
    ) -> InstanceModel:
        service: dict[str, ServiceTime] = {}
        startup = 0.0
        seed = 0
        for mid, m in group.models.items():
            params = m.sim or SimParams()
            if m.runtime != "sim":
                raise SpecError(
                    [
                        SpecIssue(
                            f"groups.{group.name}.models.{mid}.runtime",
                            f"runtime {m.runtime!r} cannot be simulated; use runtime: sim with a "
                            "service_time model",
                        )
                    ]
                )
            service[mid] = params.service_time
            nominal = nominal_seconds(params.service_time, params.output_tokens)
            startup += params.startup_s + group.warmup.requests * nominal
            seed = params.seed
        if slo_ms is not None:
            slo = SloSpec(latency_ms=slo_ms, target=group.slo.target if group.slo else 0.99)
        elif group.slo is not None:
            slo = group.slo
        else:
            raise SpecError(
                [
                    SpecIssue(
                        f"groups.{group.name}.slo",
                        "the group has no slo; add e.g. `slo: {latency_ms: 2000}` or "
                        "`slo: {slowdown: 2, slack_s: 1}`, or pass --slo-ms",
                    )
                ]
            )
        pool = spec.pool(group.resources.pool)
        price = (pool.price_per_hour if pool else 0.0) * group.resources.accelerators
        auto = group.autoscaling
        return cls(
            group=group,
            slots=group.max_concurrency,
            startup_s=startup,
            service=service,
            default_model=next(iter(group.models)),
            slo=slo,
            price_per_hour=price,
            min_instances=auto.min if auto else group.replicas,
            max_instances=auto.max if auto else group.replicas,
            interval_s=auto.interval_s if auto else 1.0,
            seed=seed,
            platform=spec,
        )

    def service_times(
        self,
        models: tuple[str, ...],
        model_idx: npt.NDArray[np.int32],
        input_tokens: npt.NDArray[np.int64],
        output_tokens: npt.NDArray[np.int64],
        seed: int,
    ) -> npt.NDArray[np.float64]:
        """Seconds each request holds a slot, clipped to [SERVICE_MIN_S, SERVICE_MAX_S]."""
        out = np.empty(model_idx.shape[0], dtype=np.float64)
        rng = np.random.default_rng(seed)
        for i, name in enumerate(models):
            st = self.service.get(name) or self.service[self.default_model]
            sel = model_idx == i
            n = int(sel.sum())
            if n == 0:
                continue
            match st:
                case FixedServiceTime(seconds=s):
                    out[sel] = s
                case LognormalServiceTime(median_s=med, sigma=sigma):
                    out[sel] = rng.lognormal(math.log(med), sigma, n)
                case LinearServiceTime(a=a, b=b, c=c):
                    out[sel] = a + b * input_tokens[sel] + c * output_tokens[sel]
        return np.clip(out, SERVICE_MIN_S, SERVICE_MAX_S)

    def slo_limits(self, service: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Per-request latency bound in seconds: the fixed bound and/or the slowdown bound
        (`slowdown` x service + `slack_s`); with both, the tighter one."""
        limit = np.full(service.shape[0], np.inf)
        if self.slo.latency_ms is not None:
            limit = np.minimum(limit, self.slo.latency_ms / 1000.0)
        if self.slo.slowdown is not None:
            limit = np.minimum(limit, self.slo.slowdown * service + self.slo.slack_s)
        return limit

    def describe(self) -> dict[str, object]:
        """The instance model in words and numbers (printed with every benchmark row)."""
        slo = self.slo
        parts = []
        if slo.latency_ms is not None:
            parts.append(f"latency <= {slo.latency_ms:g} ms")
        if slo.slowdown is not None:
            parts.append(f"latency <= {slo.slowdown:g} x service + {slo.slack_s:g} s")
        return {
            "group": self.group.name,
            "slots_per_instance": self.slots,
            "startup_s": self.startup_s,
            "service_time": {k: v.model_dump(mode="json") for k, v in self.service.items()},
            "service_clip_s": [SERVICE_MIN_S, SERVICE_MAX_S],
            "slo": " and ".join(parts),
            "slo_target": slo.target,
            "min": self.min_instances,
            "max": self.max_instances,
            "price_per_instance_hour": self.price_per_hour,
            "queue": self.group.queue.model_dump(mode="json"),
        }


def nominal_seconds(st: ServiceTime, output_tokens: int) -> float:
    """A typical request's service time under `st` (the median; `output_tokens` long)."""
    match st:
        case FixedServiceTime(seconds=s):
            return s
        case LognormalServiceTime(median_s=med):
            return med
        case LinearServiceTime(a=a, b=b, c=c):
            return a + b + c * output_tokens


def pick_group(spec: PlatformSpec, name: str | None, source: str = "<spec>") -> GroupSpec:
    """The group to simulate: `name`, else the first group with autoscaling, else the first."""
    if name is not None:
        g = spec.group(name)
        if g is None:
            names = ", ".join(x.name for x in spec.groups) or "none"
            raise SpecError(
                [SpecIssue("groups", f"no group named {name!r}; groups: {names}", source)]
            )
        return g
    if not spec.groups:
        raise SpecError([SpecIssue("groups", "the spec has no groups to simulate", source)])
    return next((g for g in spec.groups if g.autoscaling is not None), spec.groups[0])
