"""Simulator speed: requests replayed per wall-clock second on one core.

    python bench/simulate.py [--json] [--requests 1000000] [--policy sluice] [--repeats 3]
                             [--fleet-seconds 300]

Replays the Azure code trace, rate-scaled (each request replicated, copies jittered within
1 s) to at least `--requests` requests, through the reference instance model
(examples/reference-sim.yaml) with the given policy, and times `sluice.sim.run` alone (the
group alone on its pool, a fleet of one: the kernel's `step` every virtual second;
`sim_requests_per_s`, best of `--repeats`) and trace preparation + run
(`end_to_end_requests_per_s`); `sim_step_s` is the time spent in `step` on that run.

Beside it, the fleet simulation (`sluice.sim.run_fleet`, the same loop): the ten groups of
examples/fleet10.yaml on one pool of 100 units, each with `--fleet-seconds` of a generated
family (`FLEET_TRACES`: poisson, diurnal, flash-crowd, on/off, ramp), nine with traffic and
one lender without; `fleet_requests_per_s` (best of `--repeats`), the time spent in `step`
(`fleet_decide_s`) and the rate without it (`fleet_requests_per_s_besides_decide`), and
the fleet's rate over the one-group rate.

`--batching` adds the same one-group run with batching instances (issue 36: the model's
`sim.batching` set to `sluice.sim.batching.LLAMA3_8B_H100`, max_concurrency 256, the
same trace): `batching_requests_per_s` (best of `--repeats`) and what callers felt.
`--json` prints one JSON line on stdout. See bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sluice.sim.fleet  # noqa: E402
from sluice.policy.kernel import Memory, World, step  # noqa: E402
from sluice.policy.tick import TickDecision  # noqa: E402
from sluice.sim import InstanceModel, load_trace, make_policy, pick_group, prepare, run  # noqa: E402
from sluice.sim.batching import LLAMA3_8B_H100  # noqa: E402
from sluice.sim.families import generate  # noqa: E402
from sluice.sim.fleet import run_fleet  # noqa: E402
from sluice.spec import load_spec_file, load_spec_text  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_code.norm.csv"
FLEET_SPEC = ROOT / "examples" / "fleet10.yaml"
FLEET_TRACES = {
    "search": ("poisson-16", 6.0, 1),
    "chat": ("diurnal", 25.0, 2),
    "ads": ("flash-crowd", 15.0, 3),
    "recs": ("mmpp-onoff", 5.0, 4),
    "batch": ("ramp", 6.0, 5),
    "embed": ("poisson-4", 15.0, 6),
    "translate": ("poisson-4-heavy", 15.0, 7),
    "summarize": ("flash-crowd", 8.0, 8),
    "code": ("mmpp-onoff", 4.0, 9),
}
"""group -> (family, rate scale, seed); `eval` has no traffic (it lends its guarantee)"""


class _StepTimer:
    """`sluice.sim.fleet.step` timed while in a `with` block (the tick's share of a run)."""

    def __init__(self) -> None:
        self.spent = 0.0

    def __call__(self, memory: Memory, world: World, now: float) -> tuple[TickDecision, Memory]:
        t = time.perf_counter()
        out = step(memory, world, now)
        self.spent += time.perf_counter() - t
        return out

    def __enter__(self) -> _StepTimer:
        self.spent = 0.0
        sluice.sim.fleet.step = self  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        sluice.sim.fleet.step = step


def bench(args: argparse.Namespace) -> dict[str, Any]:
    spec = load_spec_file(ROOT / "examples" / "reference-sim.yaml").spec
    model = InstanceModel.from_spec(spec, pick_group(spec, None))
    base = load_trace(args.trace)
    scale = max(1.0, math.ceil(args.requests / len(base)))
    t0 = time.perf_counter()
    trace = base.transform(rate_scale=scale, seed=1)
    work = prepare(model, trace)
    prep_s = time.perf_counter() - t0
    best = math.inf
    summary: dict[str, Any] = {}
    for _ in range(args.repeats):
        policy = make_policy(model, args.policy)
        t1 = time.perf_counter()
        result = run(work, policy)
        best = min(best, time.perf_counter() - t1)
        summary = result.summary()
    with _StepTimer() as timer:  # once more, for the time in `step` alone
        run(work, make_policy(model, args.policy))
    n = len(trace)
    return {
        "sim_requests_per_s": round(n / best),
        "sim_step_s": round(timer.spent, 3),
        "end_to_end_requests_per_s": round(n / (best + prep_s)),
        "requests": n,
        "run_s": round(best, 3),
        "prepare_s": round(prep_s, 3),
        "trace": f"{base.name} x{scale:g} (rate-scaled)",
        "simulated_s": summary.get("duration_s"),
        "policy": args.policy,
        "slo_attainment": summary.get("slo_attainment"),
        "peak_instances": summary.get("peak_instances"),
        "target_requests_per_s": 100_000,
    }


def batching_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The one-group run with batching instances (LLAMA3_8B_H100, 256 per instance)."""
    data = yaml.safe_load((ROOT / "examples" / "reference-sim.yaml").read_text())
    group = data["groups"][0]
    group["max_concurrency"] = 256
    for m in group["models"].values():
        m["sim"]["batching"] = dataclasses.asdict(LLAMA3_8B_H100)
    spec = load_spec_text(yaml.safe_dump(data)).spec
    model = InstanceModel.from_spec(spec, pick_group(spec, None))
    base = load_trace(args.trace)
    scale = max(1.0, math.ceil(args.requests / len(base)))
    work = prepare(model, base.transform(rate_scale=scale, seed=1))
    best, summary = math.inf, {}
    for _ in range(args.repeats):
        policy = make_policy(model, args.policy)
        t1 = time.perf_counter()
        result = run(work, policy)
        best = min(best, time.perf_counter() - t1)
        summary = result.summary()
    n = len(work.trace)
    return {
        "batching_requests_per_s": round(n / best),
        "batching_requests": n,
        "batching_run_s": round(best, 3),
        "batching_instances": model.describe()["instances"],
        "batching_peak_instances": summary.get("peak_instances"),
        **{
            f"batching_{k}": round(summary[k], 1)
            for k in ("ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms")
            if summary.get(k) is not None
        },
        "batching_preemptions": summary.get("preemptions"),
    }


def fleet_bench(args: argparse.Namespace) -> dict[str, Any]:
    spec = load_spec_file(FLEET_SPEC).spec
    works = {}
    for name, (family, scale, seed) in FLEET_TRACES.items():
        g = spec.group(name)
        assert g is not None
        trace = generate(family, seed, duration_s=args.fleet_seconds, rate_scale=scale)
        works[name] = prepare(InstanceModel.from_spec(spec, g), trace)
    n = sum(len(w.trace) for w in works.values())
    best, best_decide, summary = math.inf, 0.0, {}
    for _ in range(args.repeats):
        with _StepTimer() as timer:
            t0 = time.perf_counter()
            result = run_fleet(spec, works)
            took = time.perf_counter() - t0
        if took < best:
            best, best_decide, summary = took, timer.spent, result.summary()
    tot = summary["totals"]
    return {
        "fleet_requests_per_s": round(n / best),
        "fleet_requests": n,
        "fleet_groups": len(spec.groups),
        "fleet_run_s": round(best, 3),
        "fleet_decide_s": round(best_decide, 3),
        "fleet_requests_per_s_besides_decide": round(n / max(best - best_decide, 1e-9)),
        "fleet_ticks": summary["ticks"],
        "fleet_simulated_s": summary["duration_s"],
        "fleet_slo_attainment": round(tot["slo_attainment"], 4),
        "fleet_reclaims": tot["reclaims"],
        "fleet_borrowed_unit_hours": round(tot["borrowed_unit_hours"], 3),
        "fleet_peak_instances": sum(g["peak_instances"] for g in summary["groups"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--policy", default="sluice")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--fleet-seconds", type=float, default=300.0, help="traffic per group")
    ap.add_argument("--batching", action="store_true", help="also time batching instances")
    args = ap.parse_args()
    res = bench(args)
    res.update(fleet_bench(args))
    res["fleet_vs_one_group_rate"] = round(
        res["fleet_requests_per_s"] / res["sim_requests_per_s"], 3
    )
    if args.batching:
        res.update(batching_bench(args))
    if args.json:
        print(json.dumps(res), flush=True)
    else:
        for k, v in res.items():
            print(f"{k:28} {v}")


if __name__ == "__main__":
    main()
