"""One what-if study: a spec, a trace (windowed and scaled), a policy -> the summary document
(and optionally the HTML report). `sluice simulate` and the benchmarks call this.

`warm=True` begins the run (any policy, the oracle and the causal reference too) with
the oracle's instance count at t = 0 ready (`sluice.sim.warm.warm_start`); without it a
live policy starts at its spec's count and the oracle at its own t = 0 need, as before."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.core.errors import SpecError, SpecIssue
from sluice.sim.causal import HINDSIGHT_NOTE, causal
from sluice.sim.engine import SimOptions, SimResult, make_policy, prepare, run
from sluice.sim.families import load_trace_or_family
from sluice.sim.model import InstanceModel, pick_group
from sluice.sim.oracle import oracle
from sluice.sim.report import write_report
from sluice.sim.warm import warm_start
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
    warm: bool = False,
) -> dict[str, Any]:
    """Run one simulation and return its summary (the `--json` document). `policy` is a live
    policy name (see `make_policy`), 'oracle' or 'causal' (`sluice.sim.causal`); `warm`
    starts it with the oracle's t = 0 count ready (`start: warm`, `initial_instances`)."""
    loaded = load_spec_file(spec_path)
    g = pick_group(loaded.spec, group, str(spec_path))
    model = InstanceModel.from_spec(loaded.spec, g, slo_ms)
    sh = shape or TraceShape()
    o = options or SimOptions()
    trace = load_trace_or_family(trace_path).transform(
        start=sh.start,
        duration=sh.duration,
        speedup=sh.speedup,
        rate_scale=sh.rate_scale,
        seed=o.seed,
    )
    work = prepare(model, trace)
    extra: dict[str, Any] = {}
    result: SimResult
    scaler = None
    if policy not in ("oracle", "causal"):
        try:
            scaler = make_policy(model, policy, loaded.spec.schedule_templates)
        except ValueError as exc:
            raise SpecError([SpecIssue("--policy", f"{exc}; or 'oracle', 'causal'")]) from None
    ws = warm_start(work, o) if warm else None
    run_opts = ws.options if ws is not None else o
    if scaler is not None:
        result = run(work, scaler, run_opts)
    elif policy == "oracle":
        # the warm start is defined on this search: its run begins with that count ready
        o_res = ws.oracle if ws is not None else oracle(work, o)
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
        c_res = causal(work, run_opts)
        result = c_res.result
        extra = {
            "causal_best": c_res.best.describe(),
            "causal_chosen_for": c_res.chosen_for,
            "causal_candidates": [c.describe() for c in c_res.candidates],
            "causal_note": HINDSIGHT_NOTE,
        }
    summary = result.summary()
    summary.update(extra)
    summary["start"] = "warm" if warm else "cold"
    if ws is not None:
        summary["warm_start_oracle_plan"] = ws.oracle.plan
    summary["policy"] = policy or (g.autoscaling.policy if g.autoscaling else "fixed")
    summary["group"] = g.name
    summary["instance_model"] = model.describe()
    if report_dir is not None:
        summary["report"] = str(write_report(result, report_dir, summary))
    return summary
