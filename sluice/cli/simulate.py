"""`sluice simulate`: replay a request trace through a spec's group with the live policies on a
virtual clock, and report SLO attainment, latency, instance-seconds and cost."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from sluice.cli.common import out, run

__all__ = ["simulate"]


def simulate(
    spec: Annotated[Path, typer.Option("--spec", help="spec YAML")],
    trace: Annotated[
        Path,
        typer.Option(
            "--trace",
            help="CSV: t_s,input_tokens,output_tokens,model; or family:NAME[@SEED], a "
            "generated trace (sluice.sim.families: poisson-4, mmpp-onoff, flash-crowd, ...)",
        ),
    ],
    group: Annotated[str | None, typer.Option("--group", help="group to simulate")] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            help="sluice | hpa | kpa | fixed:N | oracle | causal (default: spec)",
        ),
    ] = None,
    slo_ms: Annotated[
        float | None, typer.Option("--slo-ms", help="fixed latency SLO instead of the spec's")
    ] = None,
    report: Annotated[
        Path | None, typer.Option("--report", help="write index.html + PNG plots here")
    ] = None,
    start: Annotated[float, typer.Option("--start", help="window start, trace seconds")] = 0.0,
    duration: Annotated[
        float | None, typer.Option("--duration", help="window length, trace seconds")
    ] = None,
    speedup: Annotated[float, typer.Option("--speedup", help="divide times by this")] = 1.0,
    rate_scale: Annotated[
        float, typer.Option("--rate-scale", help="thin (<1) or replicate (>1) requests")
    ] = 1.0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    crash_rate: Annotated[
        float, typer.Option("--crash-rate", help="instance crashes per instance-hour")
    ] = 0.0,
    slow_start_prob: Annotated[
        float, typer.Option("--slow-start-prob", help="share of launches that start slowly")
    ] = 0.0,
    slow_start_factor: Annotated[
        float, typer.Option("--slow-start-factor", help="x start-up time when slow")
    ] = 3.0,
    warm: Annotated[
        bool,
        typer.Option(
            "--warm-start",
            help="start with the oracle's t=0 instance count ready (default: the spec's count)",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document")] = False,
) -> None:
    """What would happen with this spec on that traffic? (trace-driven simulation)"""
    from sluice.core.errors import SpecError, SpecIssue
    from sluice.sim import SimOptions
    from sluice.sim.study import TraceShape, simulate_spec

    def do() -> dict[str, Any]:
        if speedup <= 0 or rate_scale <= 0:
            raise SpecError([SpecIssue("--speedup/--rate-scale", "must be > 0")])
        return simulate_spec(
            spec,
            trace,
            group=group,
            policy=policy,
            slo_ms=slo_ms,
            shape=TraceShape(start, duration, speedup, rate_scale),
            options=SimOptions(
                seed=seed,
                crash_rate_per_hour=crash_rate,
                slow_start_prob=slow_start_prob,
                slow_start_factor=slow_start_factor,
            ),
            report_dir=report,
            warm=warm,
        )

    def render(r: dict[str, Any]) -> None:
        out.print(
            f"{r['group']} / {r['policy']} ({r['start']} start, "
            f"{r['initial_instances']} ready at t=0): {r['requests']} requests, "
            f"SLO {r['slo_attainment']:.4f} (target {r['slo_target']}), "
            f"p50 {r['p50_ms'] or 0:.0f} ms, p99 {r['p99_ms'] or 0:.0f} ms, "
            f"{r['instance_seconds']:.0f} instance-s (cost {r['cost']:.3f}), "
            f"peak {r['peak_instances']}, {r['scale_events']} scale events, "
            f"{r['rejected']} rejected",
            soft_wrap=True,
        )
        if "causal_best" in r:
            b = r["causal_best"]
            out.print(
                f"best causal of the family: window {b['window_s']:g} s, rule {b['rule']}, "
                f"headroom {b['headroom']:g} ({r['causal_chosen_for']}; a hindsight pick "
                f"among {len(r['causal_candidates'])} candidates)",
                soft_wrap=True,
            )
        if "report" in r:
            out.print(f"report: {r['report']}")

    run(as_json, do, render)
