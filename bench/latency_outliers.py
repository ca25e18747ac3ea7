"""Latency outlier detection (`sluice.policy.latency`): false verdicts in A/A groups, requests
to catch a 5x and a 10x slow instance, and the cost of one observation, per request mix.

    python bench/latency_outliers.py [--json] [--requests 3000] [--seeds 8]

In-process and seeded (no servers): each run spreads answered requests at random over a
group of 2, 3 or 6 instances, as the balancer does (it never looks at the request), with the
default knobs (ratio 3, min_requests 20). A/A: every instance draws from the mix; the count
is of verdicts over all runs. Slow: after 100 requests per instance, instance 0 becomes
`factor` x slower; the number is its requests until the verdict (median and max over the
runs; "never" if none came in 400 per instance). `observe_ns`: one `observe` call in a settled
group of 5, CPU time, best of 15 (the gateway adds ~0.1 us around it), next to a no-op
method call measured the same way, for scale on a busy machine.
`--json` prints one JSON line on stdout. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sluice.policy.latency import LatencyOutliers

Mix = Callable[[random.Random], float]


def _tokens(rng: random.Random) -> float:
    """Chat: 80 ms to the first token, 20 ms a token, lengths lognormal around 150."""
    return 0.08 + 0.02 * min(4096, max(1, round(150 * math.exp(rng.gauss(0.0, 1.2)))))


MIXES: dict[str, Mix] = {
    "fixed 50 ms": lambda rng: 0.05,
    "lognormal sigma 0.5": lambda rng: 0.05 * math.exp(rng.gauss(0.0, 0.5)),
    "lognormal sigma 1.5": lambda rng: 0.05 * math.exp(rng.gauss(0.0, 1.5)),
    "lognormal sigma 2.5": lambda rng: 0.05 * math.exp(rng.gauss(0.0, 2.5)),
    "chat tokens": _tokens,
    "pareto alpha 1.1": lambda rng: 0.01 * rng.paretovariate(1.1),
    "bimodal 90% 10 ms / 10% 5 s": lambda rng: 5.0 if rng.random() < 0.1 else 0.01,
}
SIZES = (2, 3, 6)


def false_verdicts(mix: Mix, instances: int, requests: int, seed: int) -> int:
    rng = random.Random(seed)
    det = LatencyOutliers(3.0, 20)
    found = 0
    for _ in range(requests * instances):
        iid = f"i{rng.randrange(instances)}"
        if det.observe(iid, mix(rng)) is not None:
            found += 1
            det.reset(iid)
    return found


def requests_to_catch(mix: Mix, instances: int, factor: float, seed: int) -> int | None:
    rng = random.Random(seed)
    det = LatencyOutliers(3.0, 20)
    for _ in range(100 * instances):
        det.observe(f"i{rng.randrange(instances)}", mix(rng))
    mine = 0
    for _ in range(400 * instances):
        k = rng.randrange(instances)
        mine += k == 0
        if det.observe(f"i{k}", mix(rng) * (factor if k == 0 else 1.0)) is not None:
            return mine if k == 0 else None
    return None


def observe_ns() -> tuple[float, float]:
    det = LatencyOutliers(3.0, 20)
    rng = random.Random(1)
    ids = [f"i{k % 5}" for k in range(10_000)]
    lats = [0.05 * math.exp(rng.gauss(0.0, 0.3)) for _ in ids]
    for iid, lat in zip(ids, lats, strict=True):
        det.observe(iid, lat)

    class Noop:
        def observe(self, iid: str, lat: float) -> None:
            return None

    def timed(observe: Callable[[str, float], object]) -> float:
        best = math.inf
        for _ in range(15):
            start = time.process_time()
            for iid, lat in zip(ids, lats, strict=True):
                observe(iid, lat)
            best = min(best, time.process_time() - start)
        return best / len(ids) * 1e9

    return timed(det.observe), timed(Noop().observe)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--requests", type=int, default=3000, help="per instance, A/A runs")
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    rows = []
    for name, mix in MIXES.items():
        runs = [(n, s) for n in SIZES for s in range(args.seeds)]
        row: dict[str, object] = {
            "mix": name,
            "aa_requests": sum(args.requests * n for n, _ in runs),
            "aa_false_verdicts": sum(false_verdicts(mix, n, args.requests, s) for n, s in runs),
        }
        for factor in (5.0, 10.0):
            caught = [requests_to_catch(mix, n, factor, s) for n, s in runs]
            got = sorted(c for c in caught if c is not None)
            key = f"{factor:.0f}x"
            row[f"{key}_median"] = got[len(got) // 2] if got else "never"
            row[f"{key}_max"] = got[-1] if len(got) == len(caught) else "never"
        rows.append(row)
        print(f"[bench] {name}: {row}", file=sys.stderr, flush=True)
    ns, noop_ns = observe_ns()
    out = {"mixes": rows, "observe_ns": round(ns), "noop_call_ns": round(noop_ns)}
    if args.json:
        print(json.dumps(out))
        return
    print("| mix | A/A requests | false verdicts | 5x: median / max | 10x: median / max |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['mix']} | {r['aa_requests']:,} | {r['aa_false_verdicts']} "
            f"| {r['5x_median']} / {r['5x_max']} | {r['10x_median']} / {r['10x_max']} |"
        )
    print(f"observe: {ns:.0f} ns a call (a no-op method call: {noop_ns:.0f} ns)")


if __name__ == "__main__":
    main()
