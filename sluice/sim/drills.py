"""A peak drill on the simulator (O5's dry run): the drill's arrival schedule through the
simulator as a fleet of one (`sluice.sim.single`), with the group's live autoscaler and its
measured start-up and service times, read back as the same samples, scale events and
instances a live drill records (`sluice.policy.drills`), so one judge reads both and the two
can be set side by side."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.policy.drills import DrillSample, InstanceUp, ScaleEvent
from sluice.policy.tick import TICK_S
from sluice.sim.model import InstanceModel, describe_instances
from sluice.sim.single import SimOptions, make_policy, run
from sluice.sim.trace import trace_from_rows
from sluice.sim.workload import prepare
from sluice.spec import GroupSpec, PlatformSpec
from sluice.spec.runtimes import FixedServiceTime, ServiceTime

__all__ = ["SimulatedDrill", "simulate_drill"]


@dataclass(frozen=True, slots=True)
class SimulatedDrill:
    samples: list[DrillSample]
    scale_events: list[ScaleEvent]
    instances: list[InstanceUp]
    model: dict[str, Any]
    """what the simulated instances were: start-up, service time, slots, and their sources"""


def simulate_drill(
    spec: PlatformSpec,
    group: GroupSpec,
    times: npt.NDArray[np.float64],
    *,
    start_instances: int,
    slo_ms: float,
    startup_s: float | None = None,
    service_s: float | None = None,
    seed: int = 0,
) -> SimulatedDrill:
    """Replay arrivals at `times` (seconds from the drill's start) against `group`.
    `startup_s` and `service_s` are the live group's measured values (None: the spec's sim
    parameters); with a measured service time every request takes that long."""
    model = InstanceModel.from_spec(spec, group, slo_ms=slo_ms)
    sources = {"startup": "spec", "service": "spec"}
    if startup_s is not None:
        model = dataclasses.replace(model, startup_s=startup_s)
        sources["startup"] = "measured"
    if service_s is not None:  # what was measured wins, over a batching model too
        fixed = FixedServiceTime(kind="fixed", seconds=service_s)
        service: dict[str, ServiceTime] = {m: fixed for m in model.service}
        model = dataclasses.replace(model, service=service, batching=None)
        sources["service"] = "measured"
    out = 1
    if model.batching is not None:  # a batching server's answers: the sim's usual length
        sim = group.models[model.default_model].sim
        out = sim.output_tokens if sim is not None else 16
    trace = trace_from_rows(((float(t), 8, out, model.default_model) for t in times), "drill")
    work = prepare(model, trace, seed)
    result = run(work, make_policy(model, None), SimOptions(seed=seed, initial=start_instances))
    tl = result.timeline
    t = result.column("t")
    done, arrived = result.done, trace.t
    ok = done >= 0
    in_slo = result.in_slo_mask()
    edges = np.append(t, t[-1] + TICK_S) if len(t) else np.zeros(1)  # a row per tick
    completed = np.histogram(done[ok], edges)[0]
    within = np.histogram(done[in_slo], edges)[0]
    shed = np.histogram(arrived[done == -2.0], edges)[0]
    failed = np.histogram(arrived[done == -3.0], edges)[0]
    offered = np.histogram(arrived, edges)[0]
    span = np.diff(edges)
    col = {name: result.column(name) for name in ("desired", "ready", "queued")}
    samples = [
        DrillSample(
            t_s=float(t[k]),
            offered_rps=float(offered[k] / span[k]),
            desired=int(col["desired"][k]),
            ready=int(col["ready"][k]),
            queued=float(col["queued"][k]),
            completed=int(completed[k]),
            in_slo=int(within[k]),
            shed=int(shed[k]),
            errors=int(failed[k]),
        )
        for k in range(len(tl))
    ]
    events = [
        ScaleEvent(
            t_s=float(d["t"]),
            before=int(d["from"]),
            after=int(d["to"]),
            reason=str(d["reason"]),
            clipped_by=tuple(d["clipped_by"]),
        )
        for d in result.decisions
        if d["changed"] and d["from"] is not None
    ]
    return SimulatedDrill(
        samples,
        events,
        _instances_up(events, col["ready"], t),
        {
            "startup_s": round(model.startup_s, 3),
            "service_s": service_s,
            "slots": model.slots,
            "instances": describe_instances(model.batching, model.slots)["kind"],
            "interval_s": model.interval_s,
            "sources": sources,
        },
    )


def _instances_up(
    events: list[ScaleEvent], ready: npt.NDArray[np.float64], t: npt.NDArray[np.float64]
) -> list[InstanceUp]:
    """Each instance a scale-up launched, ready at the first tick after the launch where the
    ready count reached it (named here by launch order: the k-th is `sim-k`)."""
    out: list[InstanceUp] = []
    for e in events:
        for n in range(e.before + 1, e.after + 1):
            reached = t[(ready >= n) & (t >= e.t_s)]
            at = float(reached[0]) if len(reached) else None
            out.append(InstanceUp(f"sim-{len(out) + 1}", e.t_s, at, None))
    return out
