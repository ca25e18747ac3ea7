"""Autoscaling policies side by side on every shared trace and every generated trace family,
started warm and cold, against the clairvoyant oracle, the best fixed fleet and the best
causal reference (issue 16).

    python bench/autoscale.py [--json] [--traces DIR] [--spec examples/reference-sim.yaml]
                              [--families all|none|NAME,...] [--seeds 1] [--quick]
                              [--leave-one-out] [--speedup-variants 60]
                              [--model slots|batching]

Traces: every `*.norm.csv` in `--traces` (default ../shared/traces from the repo root), plus
a time-compressed row (`NAME @xK`, times divided by K) for each whose mean rate is under
1 req/s, plus every family of `sluice.sim.families` (seed 0, or seeds 0..N-1). Each is
replayed through the instance model of `--spec` (one group; the reference model by default)
under one configuration for all of them: the Sluice policy with the spec's defaults, HPA
and KPA with their upstream defaults, HPA and KPA *tuned* (the cheapest target on a grid
that reaches the SLO target, warm only; when none does, the cheapest at least as good as
Sluice, else the best attainment: `chosen_for`), the best fixed N, the oracle
(`sluice.sim.oracle`) and the best causal reference (`sluice.sim.causal`: counts per window
from past windows only; a hindsight pick within its family, warm only).

Warm: every policy starts with the oracle's t = 0 count ready (`sluice.sim.warm`). Cold:
the group starts at its spec's count. The targets are judged warm:
- SLO attainment >= the spec's target on every shared trace (not the compressed variants);
- cost <= 1.3x the oracle on the Mooncake trace and on every stationary family;
- cost <= 0.9x the best fixed fleet on the Azure code trace.

`--leave-one-out` (bench/_autoscale_loo.py) picks the defaults from a small grid of the
policy's free knobs on all traces but one, scores that pick on the one left out, for every
trace, and reports how far the held-out scores are from the shipped defaults'.
`--quick` skips the tuned rows and the causal reference. `--json` prints one JSON line.
`--model batching` (bench/_autoscale_batching.py, issue 36) replays the same workloads, warm,
on batching instances (`examples/reference-sim-batching.yaml` unless `--spec` is given),
with the fast tier on Azure code and flash-crowd, and prints one document with
`targets_met` and its `rows`. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._autoscale_batching import bench_batching, default_spec, print_rows  # noqa: E402
from bench._autoscale_loo import Case, leave_one_out  # noqa: E402
from sluice.policy.autoscale import ScalingPolicy, build_policy  # noqa: E402
from sluice.sim import (  # noqa: E402
    FAMILIES,
    InstanceModel,
    SimOptions,
    SimResult,
    Trace,
    causal,
    generate,
    load_trace,
    make_policy,
    pick_group,
    prepare,
    run,
    warm_start,
)
from sluice.spec import load_spec_file  # noqa: E402

POLICIES = ("sluice", "hpa", "kpa")
TUNE_GRID = (0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3, 0.275, 0.25, 0.225, 0.2, 0.175, 0.15, 0.1, 0.05)
"""target values tried for the tuned HPA / KPA rows (share of max_concurrency per instance)"""
TUNED_KNOB = {"hpa": "target_per_instance", "kpa": "target_utilization"}
ORACLE_COST_TARGET = 1.3
FIXED_COST_TARGET = 0.9
AZURE = "AzureLLMInferenceTrace_code.norm.csv"
REFERENCE = ROOT / "examples" / "reference-sim.yaml"
MOONCAKE = "mooncake_synthetic_trace.norm.csv"


def row(res: SimResult) -> dict[str, Any]:
    s = res.summary()
    return {
        "slo_attainment": round(s["slo_attainment"], 5),
        "instance_seconds": round(s["instance_seconds"], 1),
        "cost": round(s["cost"], 4),
        "p99_ms": None if s["p99_ms"] is None else round(s["p99_ms"], 1),
        "peak_instances": s["peak_instances"],
        "scale_events": s["scale_events"],
        "rejected": s["rejected"],
    }


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def _tuned_policy(model: InstanceModel, name: str, value: float) -> ScalingPolicy[Any]:
    """The group's HPA / KPA with its target knob set to `value` (everything else as spec'd)."""
    auto = model.group.autoscaling
    assert auto is not None
    sub = getattr(auto, name).model_copy(update={TUNED_KNOB[name]: value})
    group = model.group.model_copy(update={"autoscaling": auto.model_copy(update={name: sub})})
    return build_policy(group, {}, name)


def tune(
    work: Any, model: InstanceModel, name: str, opts: SimOptions, sluice_slo: float
) -> dict[str, Any]:
    """The cheapest grid value of the policy's target that reaches the SLO target; when none
    does, the cheapest at least as good as Sluice; when none does that either, the best
    attainment (cheapest among equals)."""
    tried = [(v, run(work, _tuned_policy(model, name, v), opts)) for v in TUNE_GRID]
    scored = [(v, r, r.summary()["slo_attainment"]) for v, r in tried]
    for bar, why in ((model.slo.target, "slo_target"), (sluice_slo, "sluice_attainment")):
        ok = [(r.instance_seconds, v, r) for v, r, a in scored if a >= bar]
        if ok:
            _, v, r = min(ok, key=lambda x: x[0])
            return {TUNED_KNOB[name]: v, "chosen_for": why, **row(r)}
    _, _, v, r = max(((a, -r.instance_seconds, v, r) for v, r, a in scored), key=lambda x: x[:2])
    return {TUNED_KNOB[name]: v, "chosen_for": "best_attainment", **row(r)}


def study(
    name: str, model: InstanceModel, trace: Trace, kind: str, stationary: bool | None, quick: bool
) -> tuple[dict[str, Any], Case]:
    """The trace's rows, and the warm case leave-one-out replays."""
    t0 = time.perf_counter()
    work = prepare(model, trace)
    ws = warm_start(work)
    o = ws.oracle
    out: dict[str, Any] = {
        "kind": kind,
        "stationary": stationary,
        "requests": len(trace),
        "span_s": round(trace.span_s, 1),
        "mean_rate_per_s": round(len(trace) / max(trace.span_s, 1e-9), 4),
        "warm_count": ws.count,
        "oracle": {"plan": o.plan, **row(o.result)},
        "best_fixed": None if o.best_fixed is None else {"n": o.best_fixed_n, **row(o.best_fixed)},
    }
    for start, opts in (("warm", ws.options), ("cold", SimOptions())):
        rows = {p: row(run(work, make_policy(model, p), opts)) for p in POLICIES}
        if start == "warm" and not quick:
            for p in ("hpa", "kpa"):
                rows[f"{p}_tuned"] = tune(work, model, p, opts, rows["sluice"]["slo_attainment"])
            c = causal(work, opts)
            rows["causal"] = {
                "candidate": c.best.label,
                "chosen_for": c.chosen_for,
                **row(c.result),
            }
        out[start] = rows
        out[f"{start}_ratios"] = _ratios(rows, out)
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    cap: tuple[str, float, float] | None = None
    if name == MOONCAKE or stationary:
        cap = ("cost_vs_oracle_le_1.3", o.result.instance_seconds, ORACLE_COST_TARGET)
    elif name == AZURE and o.best_fixed is not None:
        cap = ("cost_vs_best_fixed_le_0.9", o.best_fixed.instance_seconds, FIXED_COST_TARGET)
    case = Case(name, work, ws.options, o.result.instance_seconds, kind == "shared", cap)
    warm = out["warm"]["sluice"]
    out["targets_met"] = case.targets(
        warm["slo_attainment"], warm["instance_seconds"], model.slo.target
    )
    return out, case


def _ratios(rows: dict[str, Any], ref: dict[str, Any]) -> dict[str, float | None]:
    cost = rows["sluice"]["instance_seconds"]
    out = {"sluice_cost_vs_oracle": ratio(cost, ref["oracle"]["instance_seconds"])}
    if ref["best_fixed"] is not None:
        out["sluice_cost_vs_best_fixed"] = ratio(cost, ref["best_fixed"]["instance_seconds"])
    for other in ("hpa", "kpa", "hpa_tuned", "kpa_tuned", "causal"):
        if other in rows:
            out[f"sluice_cost_vs_{other}"] = ratio(cost, rows[other]["instance_seconds"])
    return out


def workloads(args: argparse.Namespace) -> list[tuple[str, Trace, str, bool | None]]:
    """(name, trace, kind, stationary) for every trace the bench replays."""
    out: list[tuple[str, Trace, str, bool | None]] = []
    for f in sorted(Path(args.traces).glob("*.norm.csv")):
        tr = load_trace(f)
        out.append((f.name, tr, "shared", None))
        if len(tr) / max(tr.span_s, 1e-9) < 1.0:
            for k in args.speedup_variants:
                out.append((f"{f.name} @x{k:g}", tr.transform(speedup=k), "compressed", None))
    names = list(FAMILIES) if args.families == "all" else []
    if args.families not in ("all", "none"):
        names = [n.strip() for n in args.families.split(",") if n.strip()]
    for n in names:
        fam = FAMILIES[n]
        for seed in range(args.seeds):
            out.append((f"family:{n}@{seed}", generate(n, seed), "family", fam.stationary))
    return out


def bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.spec is None:
        args.spec = default_spec(ROOT) if args.model == "batching" else REFERENCE
    spec = load_spec_file(args.spec).spec
    model = InstanceModel.from_spec(spec, pick_group(spec, args.group))
    todo = workloads(args)
    if not todo:
        raise SystemExit(f"no traces: no *.norm.csv in {args.traces} and no families")
    if args.model == "batching":
        if model.batching is None:
            raise SystemExit(f"--model batching: {args.spec} has no sim.batching block")
        return {"spec": str(args.spec), **bench_batching(model, todo, args.quick)}
    traces: dict[str, Any] = {}
    cases: list[Case] = []
    for name, tr, kind, stationary in todo:
        print(f"{name}: {len(tr)} requests", file=sys.stderr, flush=True)
        t, case = study(name, model, tr, kind, stationary, args.quick)
        traces[name] = t
        cases.append(case)
    out: dict[str, Any] = {
        "instance_model": model.describe(),
        "spec": str(args.spec),
        "traces": traces,
        "targets_failed": sorted(
            f"{name}: {k}"
            for name, t in traces.items()
            for k, ok in t["targets_met"].items()
            if not ok
        ),
    }
    if args.leave_one_out:
        print("leave-one-out", file=sys.stderr, flush=True)
        out["leave_one_out"] = leave_one_out(model, cases)
    return out


def print_table(res: dict[str, Any]) -> None:
    cols = ("sluice", "hpa", "kpa", "hpa_tuned", "kpa_tuned", "causal")
    head = " ".join(f"{c:>15}" for c in (*cols, "best_fixed", "oracle"))
    print(f"{'trace':34} {'start':5} {head}  {'/oracle':>7} {'/fixed':>6}")
    for name, t in res["traces"].items():
        for start in ("warm", "cold"):
            rows = t[start]
            cells = [
                f"{rows[c]['slo_attainment']:.4f}/{rows[c]['instance_seconds']:>7.0f}"
                if c in rows
                else f"{'':>15}"
                for c in cols
            ]
            for ref in ("best_fixed", "oracle"):
                r = t[ref]
                cells.append(
                    f"{r['slo_attainment']:.4f}/{r['instance_seconds']:>7.0f}" if r else f"{'':>15}"
                )
            ra = t[f"{start}_ratios"]
            print(
                f"{name[:34]:34} {start:5} {' '.join(f'{c:>15}' for c in cells)}  "
                f"{ra['sluice_cost_vs_oracle'] or 0:7.2f} "
                f"{ra.get('sluice_cost_vs_best_fixed') or 0:6.2f}"
            )
    if res["targets_failed"]:
        print("targets not met:", *res["targets_failed"], sep="\n  ")
    loo = res.get("leave_one_out")
    if loo:
        print(f"leave-one-out: {loo['summary']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument(
        "--spec",
        type=Path,
        default=None,
        help="default: examples/reference-sim.yaml (slots), reference-sim-batching.yaml",
    )
    ap.add_argument(
        "--model",
        choices=("slots", "batching"),
        default="slots",
        help="the instance model: the slot reference, or batching servers (issue 36)",
    )
    ap.add_argument("--group", default=None)
    ap.add_argument("--families", default="all", help="all, none, or NAME,NAME,...")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per family (0..N-1)")
    ap.add_argument("--speedup-variants", type=float, nargs="*", default=[60.0])
    ap.add_argument("--quick", action="store_true", help="no tuned rows, no causal reference")
    ap.add_argument("--leave-one-out", action="store_true")
    args = ap.parse_args()
    res = bench(args)
    if args.json:
        print(json.dumps(res), flush=True)
    elif args.model == "batching":
        print_rows(res)
    else:
        print_table(res)


if __name__ == "__main__":
    main()
