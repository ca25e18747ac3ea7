"""`sluice loadtest GROUP` (O4): how much one instance sustains under a latency target, and
the autoscaling targets that follow from it.

The group is pinned to one instance (`POST /v1/groups/G/pin`, a pin that ends by itself, so
a killed test cannot leave the group held), a short probe measures the service time, and
then open-loop load at a constant rate is offered in steps: up by a factor until a step
breaks the SLO, then bisection between the last rate that held and the first that did not
(`sluice.policy.capacity.RateSearch`); while nothing holds, it steps down. The knee is
the highest rate that held (`no_knee` says why there is none); the
recommendation runs each instance a headroom below it. A run whose own generator fell
behind its schedule (`sluice.policy.generator`) below any rate the group failed at is
`inconclusive`: it keeps no knee, so it recommends and proposes nothing, and the control
plane has no knee of it to compare the next one with. The report is stored under the
group's model version, and set beside the newest one of another version.

`--fit` measures the batching model's time parameters under the same pin, before any knee
search (`sluice.tools.batchfit`), and keeps them as the report's `fit` (None in a report
without it, and absent from reports stored before it existed); `--fit` alone searches no
knee.

Everything here speaks HTTP: to the gateway (the load, with the `x-sluice-group` header of an
operator tenant) and to the control API (`Control`: pin, record, read).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from rich.console import Console

from sluice.core import Conflict, SpecError, SpecIssue
from sluice.policy.arrivals import constant, poisson_times
from sluice.policy.capacity import (
    HEADROOM,
    RateSearch,
    StepMeasure,
    compare_capacity,
    recommend,
)
from sluice.policy.generator import BEHIND_LAG_S, ScheduleBounds
from sluice.tools.batchfit import FitOptions, fit_budget_s, measure_fit
from sluice.tools.loadgen import (
    Arrival,
    LoadLimits,
    LoadRun,
    LoadTarget,
    load_bodies,
    run_load,
    synthesized_body,
)

__all__ = [
    "SCHEMA",
    "Control",
    "FitOptions",
    "LoadtestOptions",
    "Profile",
    "loadtest",
    "read_profile",
    "run_verdict",
]

SCHEMA = "sluice.loadtest/1"
PROBE_REQUESTS = 8
"""Sequential requests that warm the pinned instance and measure its service time."""


class Control(Protocol):
    """The control API as the CLI's client offers it (sync; called from worker threads)."""

    def get(self, path: str, **params: Any) -> Any: ...

    def post(self, path: str, body: dict[str, Any]) -> Any: ...


@dataclass(frozen=True, slots=True)
class Profile:
    """What each request carries: sample bodies (cycled), trace token counts (a chat body of
    that size each), or one small chat request."""

    source: str
    bodies: tuple[tuple[str, dict[str, Any]], ...]

    def body(self, k: int) -> tuple[str, dict[str, Any]]:
        return self.bodies[k % len(self.bodies)]


@dataclass(frozen=True, slots=True)
class LoadtestOptions:
    slo_ms: float
    quantile: Literal["p50", "p95", "p99"] = "p95"
    step_s: float = 10.0
    start_rps: float | None = None
    """None: a quarter of what the probe says one instance can do"""
    max_rps: float | None = None
    """None: four times what the probe says"""
    max_steps: int = 12
    resolution: float = 0.05
    headroom: float = HEADROOM
    max_in_flight: int = 512
    timeout_s: float = 60.0
    seed: int = 0
    max_lag_s: float = BEHIND_LAG_S
    """the p99 schedule lag past which a step's generator counts as behind (inconclusive)"""


def read_profile(path: Path | None, model: str, stream: bool = False) -> Profile:
    """`--profile`: a JSONL of request bodies, or a trace CSV (its token counts); neither:
    a one-token chat request."""
    if path is None:
        return Profile("default", (synthesized_body(model, 8, 1, stream),))
    if path.suffix.lower() == ".csv":
        from sluice.sim.trace import load_trace

        trace = load_trace(path)
        if not len(trace):
            raise SpecError([SpecIssue("--profile", "the trace has no rows", str(path))])
        n = min(len(trace), 2000)
        bodies = tuple(
            synthesized_body(model, int(i), max(1, int(o)), stream)
            for i, o in zip(trace.input_tokens[:n], trace.output_tokens[:n], strict=True)
        )
        return Profile(f"trace {path}", bodies)
    samples = load_bodies(path)
    bodies = tuple(
        (p, {**b, "model": b.get("model", model), **({"stream": True} if stream else {})})
        for p, b in samples
    )
    return Profile(f"samples {path}", bodies)


def loadtest(
    control: Control,
    target: LoadTarget,
    info: dict[str, Any],
    profile: Profile,
    opts: LoadtestOptions | None,
    console: Console | None = None,
    say: Callable[[str], None] = lambda _: None,
    fit: FitOptions | None = None,
) -> dict[str, Any]:
    """Run the whole capacity test (module docstring) and return its report (`SCHEMA`).
    `info`: the group as `GET /v1/groups` shows it. With `fit`, the batching model's
    parameters are measured first (`sluice.tools.batchfit`), under the same pin, and kept as
    the report's `fit`; with `opts` None, that is all it does (no knee is searched)."""
    group = info["name"]
    if target.group is None:
        raise SpecError([SpecIssue("--group", "the load test needs the group to send to")])
    if opts is None and fit is None:
        raise SpecError([SpecIssue("--slo-ms", "give --slo-ms (the knee), --fit, or both")])
    budget_s = 300.0
    if opts is not None:
        budget_s += opts.max_steps * (opts.step_s + opts.timeout_s)
    if fit is not None:
        budget_s += fit_budget_s(fit, info["max_concurrency"])
    what = f"capacity of one instance at {opts.slo_ms:g} ms" if opts else "batching model fit"
    control.post(
        f"/v1/groups/{group}/pin",
        {"replicas": 1, "for_s": budget_s, "reason": f"sluice loadtest: {what}"},
    )
    steps: list[dict[str, Any]] = []
    search: RateSearch | None = None
    fitted: dict[str, Any] | None = None
    service_s: float | None = None
    try:
        _wait_for_one(control, group)
        say(f"{group} pinned to one instance")
        if fit is not None:
            model = next(iter(info["models"]))
            fitted = measure_fit(target, model, info["max_concurrency"], fit, say)
            fitted["startup_s"] = _startup_s(control, group)
        if opts is not None:
            service_s = _probe(target, profile, opts)
            search = _search(opts, info, service_s)
            while (rate := search.next_rate()) is not None:
                measure = _step(target, profile, opts, rate, len(steps), console)
                verdict = search.record(measure)
                steps.append({**measure.to_json(), "verdict": verdict.to_json()})
                say(f"{rate:8.2f} rps: {'holds' if verdict.holds else 'fails'} ({verdict.why})")
    finally:
        control.post(f"/v1/groups/{group}/unpin", {"reason": "sluice loadtest finished"})
    inconclusive = search.inconclusive() if search is not None else None
    knee = search.knee() if search is not None and inconclusive is None else None
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "group": group,
        "version": info["version"],
        "slo_ms": opts.slo_ms if opts else None,
        "quantile": opts.quantile if opts else None,
        "profile": profile.source if opts else None,
        "step_s": opts.step_s if opts else None,
        "max_concurrency": info["max_concurrency"],
        "probe_service_ms": round(service_s * 1000.0, 3) if service_s is not None else None,
        "steps": steps,
        "knee": knee.to_json() if knee else None,
        "no_knee": None if knee else inconclusive or _why_no_knee(steps, opts is None),
        "inconclusive": inconclusive,
        "recommendation": None,
        "compared_with": None,
        "fit": fitted,
    }
    if knee is not None and opts is not None:
        rec = recommend(
            knee,
            max_concurrency=info["max_concurrency"],
            slo_ms=opts.slo_ms,
            headroom=opts.headroom,
        )
        report["recommendation"] = {**rec.to_json(), "targets": rec.spec_targets()}
    older = _previous_version(control, group, report["version"])
    if older is not None and knee is not None:
        report["compared_with"] = compare_capacity(older, report)
    return report


def _search(opts: LoadtestOptions, info: dict[str, Any], service_s: float) -> RateSearch:
    per_instance = info["max_concurrency"] / service_s
    start = opts.start_rps or max(0.5, 0.25 * per_instance)
    return RateSearch(
        start,
        max_rps=opts.max_rps or 4.0 * per_instance,
        resolution=opts.resolution,
        max_steps=opts.max_steps,
        slo_ms=opts.slo_ms,
        quantile=opts.quantile,
    )


def _startup_s(control: Control, group: str) -> float | None:
    """The median launch-to-ready time of the group's ready instances (what a simulation
    of the fitted server starts new ones in); None when none says."""
    took = [
        i["ready_at"] - i["created_at"]
        for i in control.get("/v1/instances", group=group)
        if i.get("ready_at") is not None and i.get("created_at") is not None
    ]
    return round(float(statistics.median(took)), 3) if took else None


def _why_no_knee(steps: list[dict[str, Any]], fit_only: bool = False) -> str:
    """Why no step held: the verdict of the lowest rate tried (the one that came closest)."""
    if fit_only:
        return "a fit only (--fit without --slo-ms): no knee was searched"
    if not steps:
        return "no step was run"
    lowest = min(steps, key=lambda s: s["offered_rps"])
    return f"no rate held, down to {lowest['offered_rps']:.3g} rps: {lowest['verdict']['why']}"


def run_verdict(report: dict[str, Any]) -> Literal["pass", "fail", "inconclusive"]:
    """What the run says, for its exit code: inconclusive when its generator fell behind
    below any failure of the group's (`RateSearch.inconclusive`); fail when an SLO was given
    and no rate held it, or a fit was asked for and could not be made; else pass."""
    if report.get("inconclusive"):
        return "inconclusive"
    if report.get("slo_ms") is not None and not report.get("knee"):
        return "fail"
    fit = report.get("fit")
    if fit is not None and fit.get("error"):
        return "fail"
    return "pass"


def stored_verdict(report: dict[str, Any]) -> str:
    """What the store keeps as the run's verdict: measured (a knee), fitted (a fit only, and
    it held), or inconclusive."""
    if report.get("knee"):
        return "measured"
    fit = report.get("fit")
    if fit and not fit.get("error") and not report.get("steps"):
        return "fitted"
    return "inconclusive"


def _wait_for_one(control: Control, group: str, timeout_s: float = 180.0) -> None:
    """Until the gateway routes to exactly one ready instance of the group."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        routed = control.get("/v1/dataplane").get("groups", {}).get(group, {})
        if routed.get("instances") == 1:
            return
        time.sleep(0.5)
    raise Conflict(f"{group} did not come to one routed instance within {timeout_s:.0f} s")


def _probe(target: LoadTarget, profile: Profile, opts: LoadtestOptions) -> float:
    """One request at a time: the instance's service time with no queue (seconds)."""
    outcomes = []
    for k in range(PROBE_REQUESTS):
        path, body = profile.body(k)
        run = asyncio.run(
            run_load(target, [Arrival(0.0, path, body)], LoadLimits(timeout_s=opts.timeout_s))
        )
        outcomes.extend(run.outcomes)
    ok = [o.done_s - o.sent_s for o in outcomes if _ok(o.status) and o.done_s and o.sent_s]
    if len(ok) < PROBE_REQUESTS // 2:
        errors = sorted({o.error or str(o.status) for o in outcomes if not _ok(o.status)})
        raise Conflict(f"the group does not answer the probe: {'; '.join(errors)[:400]}")
    ok.sort()
    return max(ok[len(ok) // 2], 1e-3)  # the median: one slow first answer is warm-up


def _ok(status: int | None) -> bool:
    return status is not None and 200 <= status < 300


def _step(
    target: LoadTarget,
    profile: Profile,
    opts: LoadtestOptions,
    rate: float,
    index: int,
    console: Console | None,
) -> StepMeasure:
    """Offer `rate` for `step_s`; the first second is left out of the measure (the queue of
    an open loop starts empty, so it is not yet the step's steady state)."""
    times = poisson_times(constant(rate, opts.step_s), seed=opts.seed + index)
    arrivals = [Arrival(float(t), *profile.body(k)) for k, t in enumerate(times)]
    if rate * opts.timeout_s > 10 * opts.max_in_flight:
        raise SpecError(
            [
                SpecIssue(
                    "--max-in-flight",
                    f"{rate:.1f} rps with a {opts.timeout_s:g} s timeout can need "
                    f"{math.ceil(rate * opts.timeout_s)} requests in flight; raise it or lower "
                    "--max-rps",
                )
            ]
        )
    limits = LoadLimits(
        max_requests=len(arrivals) + 1,
        max_duration_s=opts.step_s + 1.0,
        max_in_flight=opts.max_in_flight,
        timeout_s=opts.timeout_s,
    )
    run = asyncio.run(run_load(target, arrivals, limits, console, f"{rate:.1f} rps"))
    bounds = ScheduleBounds(max_p99_lag_s=opts.max_lag_s)
    since_s = min(1.0, opts.step_s / 4)
    return measure_step(run, rate, since_s=since_s, until_s=opts.step_s, bounds=bounds)


def measure_step(
    run: LoadRun,
    rate: float,
    since_s: float,
    until_s: float,
    bounds: ScheduleBounds | None = None,
) -> StepMeasure:
    """The step's measure over [since_s, until_s) of its schedule. Throughput is what
    finished in that window against what arrived in it: an instance past its capacity
    finishes fewer than arrive long before its latency shows it in a short step (the queue
    grows by the excess each second), and the ratio is free of the Poisson noise of the
    count. It is reported at the offered `rate` (`achieved = rate x finished / arrived`).
    `bounds`: what keeping the schedule means (`sluice.policy.generator`; None: defaults)."""
    s = run.summary(since_s=since_s, until_s=until_s, bounds=bounds)
    finished = sum(
        1 for o in run.outcomes if o.ok and o.done_s is not None and since_s <= o.done_s < until_s
    )
    lat = s["latency_ms"]
    return StepMeasure(
        offered_rps=rate,
        achieved_rps=rate * finished / s["requests"] if s["requests"] else 0.0,
        requests=int(s["requests"]),
        errors=int(s["errors"]),
        shed=int(s["shed"]),
        unsent=int(s["unsent"]),
        p50_ms=lat["p50"],
        p95_ms=lat["p95"],
        p99_ms=lat["p99"],
        mean_latency_ms=lat["mean"],
        mean_in_flight=float(s["mean_in_flight"]),
        behind=bool(s["behind"]),
    )


def _previous_version(control: Control, group: str, version: str) -> dict[str, Any] | None:
    """The newest stored load test of the group on another version, as its report."""
    runs: Sequence[dict[str, Any]] = control.get(
        f"/v1/groups/{group}/capacity", kind="loadtest", limit=50, reports="true"
    )
    for r in runs:
        if r["version"] != version and r["report"].get("knee"):
            return dict(r["report"])
    return None
