"""`sluice drill GROUP` (O5): rehearse a peak and see whether autoscaling reacts.

A drill is planned once (`plan_drill`: the base rate, the peak, the arrival schedule, what
the peak needs at the measured capacity, the criteria stated up front) and then run either
live, through the real gateway while the control API is read each second (`live_drill`), or
on the simulator with the group's measured start-up and service times (`simulated_drill`).
Both end in the same judge (`sluice.policy.drills.judge_drill`), whose three sections are
seed 004's lines of troubleshooting: did the metric trigger, did the instances come up, did
traffic reach them.

A live drill ends by handing the group back (`POST /v1/groups/G/hand-back`): its autoscaler
starts afresh from the count the drill found, so the peak nobody sent does not hold
instances through the cooldown; the report's `handed_back` says what was done, or plainly
that it was not, and why. A drill sets no pin and no override, so it lifts none.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from rich.console import Console

from sluice.core import SluiceError, SpecError, SpecIssue
from sluice.policy.arrivals import RateShape, peak_shape, poisson_times
from sluice.policy.capacity import HEADROOM
from sluice.policy.drills import (
    DrillCriteria,
    DrillPlan,
    DrillSample,
    InstanceUp,
    ScaleEvent,
    judge_drill,
)
from sluice.policy.generator import BEHIND_LAG_S, ScheduleBounds
from sluice.spec import GroupSpec, PlatformSpec
from sluice.spec.drills import drill_refusal
from sluice.tools.loadgen import Arrival, LoadLimits, LoadRun, LoadTarget, run_load
from sluice.tools.loadtest import Control, Profile

__all__ = [
    "MAX_GENERATOR_RPS",
    "SCHEMA",
    "DrillOptions",
    "DrillSetup",
    "hand_back",
    "live_drill",
    "parse_peak",
    "plan_drill",
    "simulated_drill",
]

SCHEMA = "sluice.drill/1"
MAX_GENERATOR_RPS = 2000.0
"""One asyncio process with httpx sends about this many requests a second on one core
(bench/loadgen.py): a peak above it would be a peak of the generator's own delay."""
LIMIT_GUARDS = ("max", "quota", "budget")


@dataclass(frozen=True, slots=True)
class DrillOptions:
    peak: str = "5x"
    """`5x` the base rate, or an absolute rate such as `40rps`"""
    base_rps: float | None = None
    """None: the group's mean rate over the last 10 minutes"""
    shape: Literal["step", "ramp", "trace"] = "step"
    warm_s: float = 10.0
    ramp_s: float = 60.0
    hold_s: float = 300.0
    cool_s: float = 30.0
    trace: Path | None = None
    start_instances: int | None = None
    """simulated only: the fleet the drill starts from (None: the count in force now)"""
    seed: int = 0
    max_in_flight: int = 1024
    timeout_s: float = 60.0
    criteria: DrillCriteria = field(default_factory=DrillCriteria)
    max_lag_s: float = BEHIND_LAG_S
    """the generator's p99 schedule lag past which the drill is inconclusive"""


@dataclass(frozen=True, slots=True)
class DrillSetup:
    """Everything both runs share: the same arrivals, the same plan, the same criteria."""

    group: dict[str, Any]
    version: str
    plan: DrillPlan
    times: npt.NDArray[np.float64]
    criteria: DrillCriteria
    startup_s: float | None
    service_s: float | None
    slo_ms: float
    options: DrillOptions

    def report(self, mode: str) -> dict[str, Any]:
        o = self.options
        return {
            "schema": SCHEMA,
            "group": self.group["name"],
            "version": self.version,
            "mode": mode,
            "plan": {
                **asdict(self.plan),
                "shape": o.shape,
                "peak": o.peak,
                "ramp_s": o.ramp_s,
                "hold_s": o.hold_s,
                "requests": len(self.times),
            },
            "criteria": asdict(self.criteria),
            "measured": {"startup_s": self.startup_s, "service_s": self.service_s},
            "slo_ms": self.slo_ms,
        }


def parse_peak(text: str, base_rps: float | None) -> float:
    """`5x` (times the base rate) or `40rps` / `40` (requests a second)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(x|rps)?\s*", text.lower())
    if m is None or float(m.group(1)) <= 0:
        raise SpecError([SpecIssue("--peak", f"{text!r}: expected e.g. 5x or 40rps")])
    value = float(m.group(1))
    if m.group(2) != "x":
        return value
    if base_rps is None:
        raise SpecError([SpecIssue("--peak", f"{text} needs a base rate: pass --base RPS")])
    return value * base_rps


def plan_drill(
    control: Control | None, info: dict[str, Any], g: GroupSpec, opts: DrillOptions
) -> DrillSetup:
    """The drill's plan of group `g` from the live fleet (`control`) or from a spec alone
    (None)."""
    name = info["name"]
    refused = drill_refusal(g)
    if refused is not None:
        raise SpecError([SpecIssue(f"groups.{name}.{refused[0]}", refused[1])])
    # drill_refusal saw to these
    assert g.autoscaling is not None and g.slo is not None and g.slo.latency_ms is not None
    slo_ms = g.slo.latency_ms
    startup_s, service_s = _measured(control, name) if control is not None else (None, None)
    base = opts.base_rps if opts.base_rps is not None else _recent_rate(control, name)
    peak = parse_peak(opts.peak, base)
    if peak > MAX_GENERATOR_RPS:
        raise SpecError(
            [
                SpecIssue(
                    "--peak",
                    f"{peak:.0f} rps is more than one generator sends on time "
                    f"({MAX_GENERATOR_RPS:.0f} rps); drill a smaller group or a lower peak",
                )
            ]
        )
    times, shape = _schedule(opts, base or 0.0, peak)
    current = int(info["desired"]) if opts.start_instances is None else opts.start_instances
    per_instance = _rate_per_instance(control, info, service_s, g)
    needed = math.ceil(peak / per_instance) if per_instance else None
    if opts.shape == "trace":
        start, end = 0.0, shape.duration_s
    else:
        start = opts.warm_s
        end = start + (0.0 if opts.shape == "step" else opts.ramp_s) + opts.hold_s
    plan = DrillPlan(
        peak_start_s=start,
        peak_end_s=end,
        base_rps=base or 0.0,
        peak_rps=peak,
        max_instances=g.autoscaling.max,
        start_instances=current,
        needed_instances=needed,
    )
    criteria = opts.criteria
    if criteria.max_time_to_ready_s is None:
        startup = startup_s if startup_s is not None else g.declared_startup_s()
        criteria = replace(
            criteria, max_time_to_ready_s=criteria.max_time_to_scale_s + 2.0 * startup
        )
    return DrillSetup(
        info, info["version"], plan, times, criteria, startup_s, service_s, slo_ms, opts
    )


def live_drill(
    control: Control,
    target: LoadTarget,
    setup: DrillSetup,
    profile: Profile,
    console: Console | None = None,
) -> dict[str, Any]:
    """Send the drill through the gateway, read the control API each second, judge."""
    group = setup.group["name"]
    o = setup.options
    arrivals = [Arrival(float(t), *profile.body(k)) for k, t in enumerate(setup.times)]
    limits = LoadLimits(
        max_requests=len(arrivals) + 1,
        max_duration_s=float(setup.times[-1]) + 1.0 if len(arrivals) else 1.0,
        max_in_flight=o.max_in_flight,
        timeout_s=o.timeout_s,
    )

    async def both() -> tuple[LoadRun, list[tuple[float, dict[str, Any]]]]:
        readings: list[tuple[float, dict[str, Any]]] = []
        stop = asyncio.Event()
        reader = asyncio.create_task(_read_each_second(control, group, readings, stop))
        try:
            run = await run_load(target, arrivals, limits, console, f"drill {group}")
        finally:
            stop.set()
            await reader
        return run, readings

    try:
        run, readings = asyncio.run(both())
        explain = control.get(f"/v1/groups/{group}/explain", limit=500)
    finally:  # a drill stopped half-way hands the group back too
        handed = hand_back(control, group, setup.plan.start_instances)
    t0 = run.started_at
    decisions = [d for d in explain["decisions"] if d["at"] >= t0 - 1.0]
    events = [
        ScaleEvent(
            t_s=d["at"] - t0,
            before=int(d["current"]),
            after=int(d["desired"]),
            reason=str(d["reason"]),
            clipped_by=tuple(d["detail"].get("clipped_by", ())),
        )
        for d in reversed(decisions)
        if d.get("mode", "active") == "active" and d["desired"] != d["current"]
    ]
    instances = [
        InstanceUp(
            instance=i["instance"],
            launched_s=i["launched_at"] - t0,
            ready_s=i["outcome_at"] - t0 if i["outcome"] == "came up" else None,
            served=i["requests_served"],
        )
        for d in reversed(decisions)
        for i in d.get("launched", ())
    ]
    samples = _samples(run, readings, setup.slo_ms)
    report = setup.report("live")
    report["load"] = run.summary(bounds=ScheduleBounds(max_p99_lag_s=o.max_lag_s))
    report["handed_back"] = handed
    return _judged(report, setup, samples, events, instances, report["load"])


def hand_back(control: Control, group: str, count: int) -> dict[str, Any]:
    """Hand `group` back after its drill: its autoscaler starts afresh from `count` (the
    drill's starting count). The answer says what was done; `done` False says plainly what
    was left and why (the drill's report and output show it)."""
    reason = f"sluice drill ended: back to its autoscaler from {count}, the count it started at"
    try:
        answer = control.post(
            f"/v1/groups/{group}/hand-back", {"replicas": count, "reason": reason}
        )
    except SluiceError as exc:
        return {
            "done": False,
            "to": count,
            "why": (
                f"{group} was NOT handed back: {exc.message}; its autoscaler still holds the "
                "drill's peak until its cooldown ends (`sluice explain "
                f"{group}` shows its count)"
            ),
        }
    pin = answer.get("pin")
    note = f"autoscaler restarted at {answer['to']} (was {answer['from']})"
    if pin:
        note += (
            f"; a pin set by {pin.get('actor')} holds it at {pin.get('replicas')} (not the "
            "drill's: left in place)"
        )
    return {"done": True, "from": answer["from"], "to": answer["to"], "pin": pin, "why": note}


def simulated_drill(spec: PlatformSpec, setup: DrillSetup) -> dict[str, Any]:
    """The same drill on the simulator (`sluice.sim.drills`)."""
    from sluice.sim.drills import simulate_drill

    g = spec.group(setup.group["name"])
    assert g is not None
    sim = simulate_drill(
        spec,
        g,
        setup.times,
        start_instances=setup.plan.start_instances,
        slo_ms=setup.slo_ms,
        startup_s=setup.startup_s,
        service_s=setup.service_s,
        seed=setup.options.seed,
    )
    report = setup.report("simulated")
    report["model"] = sim.model
    return _judged(report, setup, sim.samples, sim.scale_events, sim.instances, None)


def _judged(
    report: dict[str, Any],
    setup: DrillSetup,
    samples: list[DrillSample],
    events: list[ScaleEvent],
    instances: list[InstanceUp],
    load: dict[str, Any] | None,
) -> dict[str, Any]:
    limits = {g: any(g in e.clipped_by for e in events) for g in LIMIT_GUARDS}
    judgement = judge_drill(setup.plan, samples, events, instances, setup.criteria, limits)
    out = judgement.to_json()
    if load is not None and load["behind"]:
        out["verdict"] = "inconclusive"
        out["reasons"] = [
            f"the generator fell behind its schedule ({load['behind_reason']}): the peak "
            "offered was not the peak planned, so this drill says nothing; rerun on a less "
            "busy machine or with a lower --peak",
            *out["reasons"],
        ]
    report["judgement"] = out
    report["timeline"] = [asdict(s) for s in samples]
    report["scale_events"] = [asdict(e) for e in events]
    report["instances"] = [asdict(i) for i in instances]
    return report


async def _read_each_second(
    control: Control,
    group: str,
    readings: list[tuple[float, dict[str, Any]]],
    stop: asyncio.Event,
) -> None:
    """The fleet as the control API shows it, once a second: desired, ready, queued."""
    while not stop.is_set():
        at = time.time()
        try:
            plane, groups = await asyncio.gather(
                asyncio.to_thread(control.get, "/v1/dataplane"),
                asyncio.to_thread(control.get, "/v1/groups"),
            )
        except Exception as exc:  # a missed reading is a gap in the timeline, not the end
            readings.append((at, {"error": str(exc)[:200]}))
        else:
            mine: dict[str, Any] = next((g for g in groups if g["name"] == group), {})
            routed = plane.get("groups", {}).get(group, {})
            queued = routed.get("queued", {})
            readings.append(
                (
                    at,
                    {
                        "desired": mine.get("desired", 0),
                        "ready": mine.get("ready", 0),
                        "queued": sum(queued.values()) if isinstance(queued, dict) else queued,
                    },
                )
            )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, at + 1.0 - time.time())):
                await stop.wait()


def _samples(
    run: LoadRun, readings: list[tuple[float, dict[str, Any]]], slo_ms: float
) -> list[DrillSample]:
    """One sample a second: the generator's counts in that second beside the last reading
    of the fleet taken in it."""
    t0 = run.started_at
    bins = run.timeline(1.0)
    slo_s = slo_ms / 1000.0
    within = [0] * len(bins)
    for o in run.outcomes:
        if o.status is not None and 200 <= o.status < 300 and o.done_s is not None:
            k = int(o.done_s)
            if k < len(within) and o.sent_s is not None and o.done_s - o.at_s <= slo_s:
                within[k] += 1
    last: dict[str, Any] = {"desired": 0, "ready": 0, "queued": 0}
    by_second: dict[int, dict[str, Any]] = {}
    for at, reading in readings:
        if "error" not in reading:
            by_second[int(at - t0)] = reading
    out = []
    for k, b in enumerate(bins):
        last = by_second.get(k, last)
        out.append(
            DrillSample(
                t_s=float(b["t_s"]),
                offered_rps=float(b["scheduled"]),
                desired=int(last["desired"]),
                ready=int(last["ready"]),
                queued=float(last["queued"]),
                completed=int(b["ok"]),
                in_slo=within[k],
                shed=int(b["shed"]),
                errors=int(b["errors"]) - int(b["shed"]),
            )
        )
    return out


def _schedule(
    opts: DrillOptions, base: float, peak: float
) -> tuple[npt.NDArray[np.float64], RateShape]:
    if opts.shape == "trace":
        if opts.trace is None:
            raise SpecError([SpecIssue("--trace", "--shape trace needs --trace FILE.csv")])
        from sluice.sim.trace import load_trace

        trace = load_trace(opts.trace).transform(duration=opts.hold_s)
        rate = len(trace) / max(trace.span_s, 1.0)
        times = trace.transform(rate_scale=peak / rate, seed=opts.seed).t if rate else trace.t
        return times, RateShape(((0.0, peak), (max(trace.span_s, 1.0), peak)))
    shape = peak_shape(
        base,
        peak,
        shape=opts.shape,
        warm_s=opts.warm_s,
        ramp_s=opts.ramp_s,
        hold_s=opts.hold_s,
        cool_s=opts.cool_s,
    )
    return poisson_times(shape, seed=opts.seed), shape


def _recent_rate(control: Control | None, group: str) -> float | None:
    """The group's mean request rate over the last 10 minutes of history (None: none)."""
    if control is None:
        return None
    now = time.time()
    doc = control.get("/v1/history", group=[group], since=now - 600.0, until=now)
    points = [p for p in doc["groups"].get(group, ()) if p.get("requests")]
    if not points:
        return None
    return float(sum(p["requests"] for p in points)) / (60.0 * len(points))


def _measured(control: Control, group: str) -> tuple[float | None, float | None]:
    """The live group's start-up (the autoscaler's measure) and mean service time (the last
    half hour of history, weighted by completions)."""
    state = control.get(f"/v1/groups/{group}/explain", limit=1)
    startup = state.get("startup_s")
    now = time.time()
    doc = control.get("/v1/history", group=[group], since=now - 1800.0, until=now)
    points = [p for p in doc["groups"].get(group, ()) if p.get("service_ms") and p["completed"]]
    done = sum(p["completed"] for p in points)
    service = (
        sum(p["service_ms"] * p["completed"] for p in points) / done / 1000.0 if done else None
    )
    return (float(startup) if startup is not None else None), service


def _rate_per_instance(
    control: Control | None, info: dict[str, Any], service_s: float | None, g: Any
) -> float | None:
    """What one instance is planned to carry: the newest load test's recommendation (or its
    knee at the same headroom: a report recorded through the API may carry only the knee
    and the targets), else its slots over the measured (or declared) service time."""
    if control is not None:
        runs = control.get(
            f"/v1/groups/{info['name']}/capacity", kind="loadtest", limit=1, reports="true"
        )
        report = (runs[0].get("report") or {}) if runs else {}
        rate = (report.get("recommendation") or {}).get("rate_per_instance")
        knee = (report.get("knee") or {}).get("rate_rps")
        if isinstance(rate, int | float) and rate > 0:
            return float(rate)
        if isinstance(knee, int | float) and knee > 0:
            return HEADROOM * float(knee)
    service = service_s if service_s is not None else _declared_service(g)
    return HEADROOM * info["max_concurrency"] / service if service else None


def _declared_service(g: Any) -> float | None:
    """A typical request's service time as the group's first `sim` model declares it."""
    from sluice.sim.model import nominal_seconds

    sims = [m.sim for m in g.models.values() if m.runtime == "sim" and m.sim]
    return nominal_seconds(sims[0].service_time, sims[0].output_tokens) if sims else None
