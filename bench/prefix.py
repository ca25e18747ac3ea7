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
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sluice.policy.prefix import DEFAULT_EPSILON  # noqa: E402
from sluice.sim.prefix import (  # noqa: E402
    CacheModel,
    compare_pickers,
    load_block_trace,
    render_comparison,
)

DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
HIT_TARGET = 0.8


def bench(args: argparse.Namespace) -> dict[str, Any]:
    model = CacheModel(
        instances=args.instances,
        cache_blocks=args.cache_blocks,
        block_tokens=args.block_tokens,
        prefill_tps=args.prefill_tps,
        tpot_s=args.tpot_ms / 1000.0,
    )
    result = compare_pickers(load_block_trace(Path(args.trace)), model, args.epsilon, args.seed)
    result["trace"] = str(args.trace)
    result["meets_target"] = (
        result["hit_rate_vs_fleet_bound"] >= HIT_TARGET and result["p99_ttft_vs_p2c"] <= 1.0
    )
    return result


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
        print("\n".join(render_comparison(result)))
        print(
            f"targets: >= {HIT_TARGET:g} of the fleet bound, p99 TTFT <= p2c's: "
            f"{'met' if result['meets_target'] else 'NOT met'}"
        )
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
