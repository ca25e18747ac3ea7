"""One what-if study: a spec, a trace (windowed and scaled), a policy -> the summary document
(and optionally the HTML report). `sluice simulate` and the benchmarks call this."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.core.errors import SpecError, SpecIssue
from sluice.sim.engine import SimOptions, SimResult, make_policy, prepare, run
from sluice.sim.model import InstanceModel, pick_group
from sluice.sim.oracle import oracle
from sluice.sim.report import write_report
from sluice.sim.trace import load_trace
from sluice.spec.loader import load_spec_file

__all__ = ["TraceShape", "simulate_spec"]


@dataclass(frozen=True)
class TraceShape:
    """Windowing and scaling applied to the trace before the run (see `Trace.transform`)."""

    start: float = 0.0
    duration: float | None = None
    speedup: float = 1.0
    rate_scale: float = 1.0


def simulate_spec(
    spec_path: str | Path,
    trace_path: str | Path,
    *,
    group: str | None = None,
    policy: str | None = None,
    slo_ms: float | None = None,
    shape: TraceShape | None = None,
    options: SimOptions | None = None,
    report_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Run one simulation and return its summary (the `--json` document)."""
    loaded = load_spec_file(spec_path)
    g = pick_group(loaded.spec, group, str(spec_path))
    model = InstanceModel.from_spec(loaded.spec, g, slo_ms)
    sh = shape or TraceShape()
    o = options or SimOptions()
    trace = load_trace(trace_path).transform(
        start=sh.start,
        duration=sh.duration,
        speedup=sh.speedup,
        rate_scale=sh.rate_scale,
        seed=o.seed,
    )
    work = prepare(model, trace)
    extra: dict[str, Any] = {}
    result: SimResult
    if policy == "oracle":
        o_res = oracle(work, o)
        result = o_res.result
        extra = {
            "oracle_plan": o_res.plan,
            "oracle_candidates": o_res.evaluated,
            "best_fixed_n": o_res.best_fixed_n,
            "best_fixed_instance_seconds": (
                o_res.best_fixed.instance_seconds if o_res.best_fixed else None
            ),
        }
    else:
        try:
            scaler = make_policy(model, policy, loaded.spec.schedule_templates)
        except ValueError as exc:
            raise SpecError([SpecIssue("--policy", f"{exc}; or 'oracle'")]) from None
        result = run(work, scaler, o)
    summary = result.summary()
    summary.update(extra)
    summary["policy"] = policy or (g.autoscaling.policy if g.autoscaling else "fixed")
    summary["group"] = g.name
    summary["instance_model"] = model.describe()
    if report_dir is not None:
        summary["report"] = str(write_report(result, report_dir, summary))
    return summary
