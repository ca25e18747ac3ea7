"""Prefix-cache-aware instance choice against power of two choices and header affinity, on
a trace of prompts cut into blocks (`sluice.sim.prefix` states the model).

    python bench/prefix.py [--trace FILE.jsonl] [--instances 8] [--cache-blocks 2000]
                           [--prefill-tps 10000] [--epsilon 1.0] [--json]

`--trace` takes any Mooncake-format JSONL (`timestamp` ms, `input_length`, `output_length`,
`hash_ids`); the default is ../shared/traces/mooncake_synthetic_trace.jsonl. Prints
each picker's prefix hit rate (cached prompt tokens / prompt tokens), mean and p99 time to
first token and the busiest instance's share, and two bounds on the hit rate: one infinite
cache, and one LRU cache as large as all instances' caches together. Targets for the prefix
picker: hit rate >= 80 % of the second bound, p99 TTFT no worse than power of two choices'.
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sluice.policy.prefix import DEFAULT_EPSILON  # noqa: E402
from sluice.sim.prefix import (  # noqa: E402
    PICKERS,
    CacheModel,
    bound_hit_rate,
    load_block_trace,
    simulate_picker,
)

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
HIT_TARGET = 0.8


def bench(args: argparse.Namespace) -> dict[str, Any]:
    trace = load_block_trace(Path(args.trace))
    model = CacheModel(
        instances=args.instances,
        cache_blocks=args.cache_blocks,
        block_tokens=args.block_tokens,
        prefill_tps=args.prefill_tps,
        tpot_s=args.tpot_ms / 1000.0,
    )
    rows = {
        p: simulate_picker(trace, p, model, seed=args.seed, epsilon=args.epsilon) for p in PICKERS
    }
    fleet = bound_hit_rate(trace, model.instances * model.cache_blocks, model.block_tokens)
    infinite = bound_hit_rate(trace, math.inf, model.block_tokens)
    new, p2c = rows["prefix"], rows["p2c"]
    hit_ratio = new.hit_rate / fleet if fleet > 0 else 1.0
    p99_ratio = new.ttft_p99_s / p2c.ttft_p99_s if p2c.ttft_p99_s > 0 else 1.0
    return {
        "trace": str(args.trace),
        "requests": len(trace),
        "instances": model.instances,
        "cache_blocks_per_instance": model.cache_blocks,
        "block_tokens": model.block_tokens,
        "prefill_tps": model.prefill_tps,
        "tpot_ms": args.tpot_ms,
        "epsilon": args.epsilon,
        "pickers": [
            {
                "picker": r.picker,
                "hit_rate": round(r.hit_rate, 4),
                "ttft_mean_s": round(r.ttft_mean_s, 3),
                "ttft_p99_s": round(r.ttft_p99_s, 3),
                "busiest_share": round(r.busiest_share, 4),
            }
            for r in rows.values()
        ],
        "bound_infinite_hit_rate": round(infinite, 4),
        "bound_fleet_lru_hit_rate": round(fleet, 4),
        "hit_rate_vs_fleet_bound": round(hit_ratio, 3),
        "p99_ttft_vs_p2c": round(p99_ratio, 3),
        "meets_target": hit_ratio >= HIT_TARGET and p99_ratio <= 1.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--cache-blocks", type=int, default=2000, help="per instance")
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--prefill-tps", type=float, default=10_000.0, help="per instance")
    ap.add_argument("--tpot-ms", type=float, default=30.0)
    ap.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        result = bench(args)
    except (OSError, ValueError) as exc:
        print(f"bench/prefix.py: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['requests']} requests, {result['instances']} instances x "
            f"{result['cache_blocks_per_instance']} blocks of {result['block_tokens']} tokens, "
            f"prefill {result['prefill_tps']:g} tokens/s each"
        )
        print(f"{'picker':<10} {'hit rate':>8} {'TTFT mean s':>11} {'p99 s':>7} {'busiest':>7}")
        for r in result["pickers"]:
            print(
                f"{r['picker']:<10} {r['hit_rate']:>8.3f} {r['ttft_mean_s']:>11.3f} "
                f"{r['ttft_p99_s']:>7.2f} {r['busiest_share']:>7.3f}"
            )
        print(
            f"bounds: infinite cache {result['bound_infinite_hit_rate']:.3f}, one LRU of the "
            f"fleet's size {result['bound_fleet_lru_hit_rate']:.3f}"
        )
        print(
            f"prefix: {result['hit_rate_vs_fleet_bound']:.2f} of the fleet bound (target >= "
            f"{HIT_TARGET:g}), p99 TTFT {result['p99_ttft_vs_p2c']:.2f}x p2c's (target <= 1): "
            f"{'met' if result['meets_target'] else 'NOT met'}"
        )
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
