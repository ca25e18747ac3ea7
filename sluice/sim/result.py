"""One group's outcome of a simulation (`SimResult`): each request's completion, the
timeline of ticks, the decision log, instance-seconds; `summary()` is the JSON document
`sluice simulate` prints (and each group's row of a fleet's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.sim.codes import FAILED
from sluice.sim.workload import Workload

__all__ = [
    "ACCELERATOR_PRICE_PER_HOUR",
    "HOST_MEMORY_PRICE_PER_GB_HOUR",
    "SimResult",
    "sleeping_cost_ratio",
]

ACCELERATOR_PRICE_PER_HOUR = 98.32 / 8
"""One H100 for an hour, on demand: AWS's p5.48xlarge (8 H100 80 GB) list price, $98.32 an
hour in us-east-1 (2024-25), so $12.29 per GPU-hour. An assumption, stated: a cheaper GPU
cloud (about $2.5 per H100-hour) makes an asleep instance's share of it ~5x larger."""
HOST_MEMORY_PRICE_PER_GB_HOUR = 0.0045
"""One GB of host memory for an hour, on demand: Google Compute Engine's memory price
(N1/N2 custom memory, us-central1, about $0.0042-0.0045 per GB-hour). An assumption,
stated: clouds that sell memory only inside an instance price it in the same range."""


def sleeping_cost_ratio(host_memory_gb: float, accelerators: int = 1) -> float:
    """What an asleep instance-second costs, as a share of an awake one's: the host memory
    its offloaded weights hold (vLLM level-1 sleep) at `HOST_MEMORY_PRICE_PER_GB_HOUR`, over
    its accelerators at `ACCELERATOR_PRICE_PER_HOUR` (40 GB on one H100: 0.0146). The
    accelerator itself is not charged: its memory is free for other work while it sleeps
    (sluice's quota may lend a sleeper's units, `sluice.policy.standby`); where nothing
    else can use it, count asleep time at full price (`instance_seconds`). A pool that
    prices host memory (`host_memory_price_per_gb_hour`) is priced at its own prices
    instead (`sluice.sim.fleet_inputs.sleep_params`)."""
    return (
        host_memory_gb
        * HOST_MEMORY_PRICE_PER_GB_HOUR
        / (max(1, accelerators) * ACCELERATOR_PRICE_PER_HOUR)
    )


@dataclass
class SimResult:
    """Outcome of one group's run; `summary()` is the JSON document `sluice simulate`
    prints."""

    policy: str
    workload: Workload
    done: npt.NDArray[np.float64]
    """completion time per request; -2 rejected (shed/expired), -3 failed (crash/kill)"""
    timeline: npt.NDArray[np.float64]
    """one row per tick: TIMELINE_COLUMNS"""
    decisions: list[dict[str, Any]]
    instance_seconds: float
    scale_events: int
    peak_instances: int
    shed: int
    expired: int
    end_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    initial_instances: int = 0
    """instances ready at t = 0, before the first decision (`SimOptions.initial` or its
    default)"""
    ttft_s: npt.NDArray[np.float64] | None = None
    """batching instances only: per request, arrival to first output token (the gateway's
    wait included, as the gateway measures a streamed answer's); NaN where not completed"""
    tpot_s: npt.NDArray[np.float64] | None = None
    """batching instances only: per request, mean time per output token after the first;
    NaN for a one-token answer or one not completed"""
    sleeping_standby: int = 0
    """the group's `autoscaling.sleeping_standby`: its summary reports the asleep time"""
    sleeping_seconds: float = 0.0
    """of `instance_seconds`, the time instances were asleep (sleeping standby: from the
    sleep's end to the wake's start; falling asleep and waking count as awake)"""
    sleeping_ratio: float = 1.0
    """what an asleep instance-second costs as a share of an awake one's
    (`sleeping_cost_ratio`)"""

    TIMELINE_COLUMNS = (
        "t",
        "arrivals",
        "current",
        "ready",
        "desired",
        "queued",
        "in_flight",
        "draining",
        "alive",
        "server_waiting",
        "kv_cache_usage",
    )
    """`server_waiting`: requests waiting inside the instances (0 for slots);
    `kv_cache_usage`: the ready instances' mean KV-cache use, 0..1 (NaN for slots or an
    unbounded cache, or with none ready)"""

    def column(self, name: str) -> npt.NDArray[np.float64]:
        return self.timeline[:, self.TIMELINE_COLUMNS.index(name)]

    def latencies(self) -> npt.NDArray[np.float64]:
        """Latency (s) of each completed request, in trace order."""
        ok = self.done >= 0
        return self.done[ok] - self.workload.trace.t[ok]

    def in_slo_mask(self) -> npt.NDArray[np.bool_]:
        """Per request: completed within every bound of the group's SLO. The latency bound
        (`Workload.limit`: `latency_ms`, `slowdown`; none: no bound) always; on batching
        instances also `ttft_ms` (TTFT, the gateway's wait included) and `tpot_ms` (TPOT; a
        one-token answer has none, so that bound does not apply to it). Slot instances have
        no TTFT (`InstanceModel.from_spec` refuses a TTFT/TPOT-only SLO for them)."""
        w = self.workload
        mask = (self.done >= 0) & (self.done - w.trace.t <= w.limit + 1e-9)
        slo = w.model.slo
        if self.ttft_s is not None and slo.ttft_ms is not None:
            with np.errstate(invalid="ignore"):
                mask &= self.ttft_s <= slo.ttft_ms / 1000.0 + 1e-9
        if self.tpot_s is not None and slo.tpot_ms is not None:
            with np.errstate(invalid="ignore"):
                mask &= np.isnan(self.tpot_s) | (self.tpot_s <= slo.tpot_ms / 1000.0 + 1e-9)
        return mask

    def summary(self) -> dict[str, Any]:
        w = self.workload
        n = len(w.trace)
        ok_mask = self.done >= 0
        lat = self.done - w.trace.t
        in_slo = int(np.count_nonzero(self.in_slo_mask()))
        done_lat = lat[ok_mask]
        waits = done_lat - w.service[ok_mask]
        q = self.column("queued") if len(self.timeline) else np.zeros(1)
        price = w.model.price_per_hour
        return {
            "policy": self.policy,
            "trace": w.trace.name,
            "requests": n,
            "completed": int(ok_mask.sum()),
            "rejected": self.shed + self.expired,
            "failed": int(np.count_nonzero(self.done == FAILED)),
            "slo_attainment": in_slo / n if n else 1.0,
            "slo_target": w.model.slo.target,
            "p50_ms": _pct_ms(done_lat, 50),
            "p90_ms": _pct_ms(done_lat, 90),
            "p99_ms": _pct_ms(done_lat, 99),
            "mean_wait_ms": float(waits.mean() * 1000) if waits.size else 0.0,
            "mean_queue": float(q.mean()),
            "instance_seconds": self.instance_seconds,
            "cost": self.priced_seconds / 3600.0 * price,
            "work_floor_instance_seconds": w.work_floor_instance_seconds,
            "scale_events": self.scale_events,
            "peak_instances": self.peak_instances,
            "duration_s": self.end_s,
            "initial_instances": self.initial_instances,
            **self.extra,
            **self.token_times(),
            **self.sleeping(),
        }

    @property
    def priced_seconds(self) -> float:
        """Instance-seconds as priced: awake ones in full, asleep ones at `sleeping_ratio`."""
        return self.instance_seconds - self.sleeping_seconds * (1.0 - self.sleeping_ratio)

    def sleeping(self) -> dict[str, Any]:
        """A group with sleeping standby: the asleep share of `instance_seconds`, the ratio it
        is priced at, and the instance-seconds as priced (what `cost` is); {} for others."""
        if not self.sleeping_standby:
            return {}
        return {
            "sleeping_instance_seconds": self.sleeping_seconds,
            "sleeping_cost_ratio": self.sleeping_ratio,
            "priced_instance_seconds": self.priced_seconds,
        }

    def token_times(self) -> dict[str, Any]:
        """What callers of a batching group feel: TTFT and TPOT percentiles (ms) over the
        completed requests, and the KV-cache use over the ticks; {} for slots."""
        if self.ttft_s is None or self.tpot_s is None:
            return {}
        ok = self.done >= 0
        ttft = self.ttft_s[ok]
        tpot = self.tpot_s[ok]
        tpot = tpot[~np.isnan(tpot)]
        out: dict[str, Any] = {}
        for q in (50, 95, 99):
            out[f"ttft_p{q}_ms"] = _pct_ms(ttft, q)
        for q in (50, 95, 99):
            out[f"tpot_p{q}_ms"] = _pct_ms(tpot, q)
        kv = self.column("kv_cache_usage") if len(self.timeline) else np.zeros(0)
        kv = kv[~np.isnan(kv)]
        out["kv_cache_usage_mean"] = float(kv.mean()) if kv.size else None
        out["kv_cache_usage_max"] = float(kv.max()) if kv.size else None
        return out


def _pct_ms(values: npt.NDArray[np.float64], q: float) -> float | None:
    return float(np.percentile(values, q) * 1000.0) if values.size else None
