"""Simulator speed: requests replayed per wall-clock second on one core.

    python bench/simulate.py [--json] [--requests 1000000] [--policy sluice] [--repeats 3]

Replays the Azure code trace, rate-scaled (each request replicated, copies jittered within
1 s) to at least `--requests` requests, through the reference instance model
(examples/reference-sim.yaml) with the given policy, and times `sluice.sim.run` alone
(`sim_requests_per_s`, best of `--repeats`) and trace preparation + run
(`end_to_end_requests_per_s`). `--json` prints one JSON line on stdout. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sluice.sim import InstanceModel, load_trace, make_policy, pick_group, prepare, run  # noqa: E402
from sluice.spec import load_spec_file  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_code.norm.csv"


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
    n = len(trace)
    return {
        "sim_requests_per_s": round(n / best),
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--policy", default="sluice")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    args = ap.parse_args()
    res = bench(args)
    if args.json:
        print(json.dumps(res), flush=True)
    else:
        for k, v in res.items():
            print(f"{k:28} {v}")


if __name__ == "__main__":
    main()
