"""A group of generative instances with KV caches, on a trace of prompts cut into blocks: how
much prefill each instance choice saves, and what it does to the time to first token.

The model, stated so a reader can judge the numbers:
- Each instance keeps an LRU cache of `cache_blocks` prompt blocks (a block is
  `block_tokens` tokens, 512 in the Mooncake release). A request hits the longest run of its
  leading blocks the chosen instance holds; its cached tokens skip prefill. Once dispatched,
  all its blocks are the instance's most recently used.
- Prefill is one FIFO per instance at `prefill_tps` tokens/s (chunked prefill at saturation:
  prompts queue for the compute). Time to first token = wait in that FIFO + the uncached
  tokens' prefill + `overhead_s`.
- A request is outstanding on its instance from dispatch to its last token: prefill, then
  `output_tokens x tpot_s` of decoding, which overlaps other requests (a batching server).
  Outstanding requests are the load the pickers see, as the gateway counts them.

Pickers: `p2c` (the gateway's default, `pick_endpoint`), `affinity` (rendezvous on the first
block: what a client tagging each conversation with an affinity header gets, no load guard),
`prefix` (`sluice.policy.prefix.pick_prefix`, its index as large as an instance's cache).
Bounds on the hit rate: one infinite cache, and one LRU cache as large as the whole fleet's.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from random import Random
from typing import Any

import numpy as np

from sluice.policy.balance import pick_affinity, pick_endpoint
from sluice.policy.prefix import DEFAULT_EPSILON, PrefixIndex, pick_prefix
from sluice.policy.routing import Endpoint

__all__ = [
    "PICKERS",
    "CacheModel",
    "PickerResult",
    "PromptRequest",
    "bound_hit_rate",
    "compare_pickers",
    "load_block_trace",
    "render_comparison",
    "simulate_picker",
]

PICKERS = ("p2c", "affinity", "prefix")


@dataclass(frozen=True, slots=True)
class PromptRequest:
    """One request of a block trace: arrival (s from the first), tokens, block hashes."""

    at: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CacheModel:
    """The instances' caches and speeds (module docstring)."""

    instances: int = 8
    cache_blocks: int = 2000
    block_tokens: int = 512
    prefill_tps: float = 10_000.0
    tpot_s: float = 0.03
    overhead_s: float = 0.02
    max_concurrency: int = 64


@dataclass(frozen=True, slots=True)
class PickerResult:
    picker: str
    requests: int
    hit_rate: float
    """cached prompt tokens / prompt tokens"""
    ttft_mean_s: float
    ttft_p99_s: float
    busiest_share: float
    """the share of requests the busiest instance took (1 / instances is even)"""


def load_block_trace(path: Path) -> list[PromptRequest]:
    """A Mooncake-format JSONL trace: one object per line with `timestamp` (ms),
    `input_length`, `output_length` and `hash_ids`. Raises ValueError naming the line."""
    out: list[PromptRequest] = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append(
                    PromptRequest(
                        float(row["timestamp"]) / 1000.0,
                        int(row["input_length"]),
                        int(row["output_length"]),
                        tuple(int(h) for h in row["hash_ids"]),
                    )
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{n}: not a Mooncake trace line (timestamp in ms, input_length, "
                    f"output_length, hash_ids): {exc}"
                ) from exc
    if not out:
        raise ValueError(f"{path}: no requests")
    t0 = min(r.at for r in out)
    return sorted(
        (PromptRequest(r.at - t0, r.input_tokens, r.output_tokens, r.blocks) for r in out),
        key=lambda r: r.at,
    )


def _cached_tokens(req: PromptRequest, leading: int, block_tokens: int) -> int:
    return min(req.input_tokens, leading * block_tokens)


def bound_hit_rate(trace: Sequence[PromptRequest], blocks: float, block_tokens: int) -> float:
    """The hit rate of one LRU cache of `blocks` blocks (math.inf: never evicts) that sees
    every request: what no choice of instance can beat with that much cache in all."""
    cache = PrefixIndex(blocks)
    cached = total = 0
    for req in trace:
        cached += _cached_tokens(req, cache.matched(req.blocks, ("all",))["all"], block_tokens)
        total += req.input_tokens
        cache.sent("all", req.blocks)
    return cached / total if total else 0.0


def simulate_picker(
    trace: Sequence[PromptRequest],
    picker: str,
    model: CacheModel,
    seed: int = 1,
    epsilon: float = DEFAULT_EPSILON,
) -> PickerResult:
    """Run `trace` through `model.instances` instances choosing by `picker` (`PICKERS`)."""
    if picker not in PICKERS:
        raise ValueError(f"unknown picker {picker!r}: one of {', '.join(PICKERS)}")
    endpoints = [
        Endpoint(f"i{k}", "127.0.0.1", 0, model.max_concurrency) for k in range(model.instances)
    ]
    ids = [ep.instance_id for ep in endpoints]
    caches = PrefixIndex(model.cache_blocks)
    """what each instance's KV cache holds (the picker's `index` is the gateway's record)"""
    index = PrefixIndex(model.cache_blocks) if picker == "prefix" else None
    prefill_free = dict.fromkeys(ids, 0.0)
    ends: dict[str, list[float]] = {i: [] for i in ids}
    taken = dict.fromkeys(ids, 0)
    rng = Random(seed)
    ttfts: list[float] = []
    cached_total = tokens_total = 0
    for req in trace:
        now = req.at
        outstanding = {}
        for i, heap in ends.items():
            while heap and heap[0] <= now:
                heapq.heappop(heap)
            outstanding[i] = len(heap)
        if picker == "p2c":
            ep = pick_endpoint(endpoints, outstanding, rng, now)
        elif picker == "affinity":
            ep = pick_affinity(endpoints, str(req.blocks[0]) if req.blocks else "")
        else:
            chosen = pick_prefix(endpoints, req.blocks, outstanding, index, epsilon)
            ep = chosen.endpoint if chosen is not None else None
        assert ep is not None
        iid = ep.instance_id
        leading = caches.matched(req.blocks, (iid,))[iid]
        cached = _cached_tokens(req, leading, model.block_tokens)
        caches.sent(iid, req.blocks)
        if index is not None:
            index.sent(iid, req.blocks)
        start = max(now, prefill_free[iid])
        done = start + (req.input_tokens - cached) / model.prefill_tps
        prefill_free[iid] = done
        ttfts.append(done - now + model.overhead_s)
        heapq.heappush(ends[iid], done + req.output_tokens * model.tpot_s)
        taken[iid] += 1
        cached_total += cached
        tokens_total += req.input_tokens
    t = np.asarray(ttfts)
    return PickerResult(
        picker=picker,
        requests=len(trace),
        hit_rate=cached_total / tokens_total if tokens_total else 0.0,
        ttft_mean_s=float(t.mean()) if len(t) else math.nan,
        ttft_p99_s=float(np.percentile(t, 99)) if len(t) else math.nan,
        busiest_share=max(taken.values()) / len(trace) if trace else 0.0,
    )


def compare_pickers(
    trace: Sequence[PromptRequest], model: CacheModel, epsilon: float, seed: int = 1
) -> dict[str, Any]:
    """Every picker on `trace`, the two bounds, and the prefix picker against them: what
    `bench/prefix.py` and `sluice simulate --trace FILE.jsonl` print."""
    rows = {p: simulate_picker(trace, p, model, seed=seed, epsilon=epsilon) for p in PICKERS}
    fleet = bound_hit_rate(trace, model.instances * model.cache_blocks, model.block_tokens)
    infinite = bound_hit_rate(trace, math.inf, model.block_tokens)
    new, p2c = rows["prefix"], rows["p2c"]
    return {
        "requests": len(trace),
        "instances": model.instances,
        "cache_blocks_per_instance": model.cache_blocks,
        "block_tokens": model.block_tokens,
        "prefill_tps": model.prefill_tps,
        "tpot_ms": model.tpot_s * 1000.0,
        "epsilon": epsilon,
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
        "hit_rate_vs_fleet_bound": round(new.hit_rate / fleet, 3) if fleet > 0 else 1.0,
        "p99_ttft_vs_p2c": round(new.ttft_p99_s / p2c.ttft_p99_s, 3) if p2c.ttft_p99_s > 0 else 1.0,
    }


def render_comparison(r: Mapping[str, Any]) -> list[str]:
    """`compare_pickers`'s result as lines of a table."""
    lines = [
        f"{r['requests']} requests, {r['instances']} instances x "
        f"{r['cache_blocks_per_instance']} blocks of {r['block_tokens']} tokens, "
        f"prefill {r['prefill_tps']:g} tokens/s each, epsilon {r['epsilon']:g}",
        f"{'picker':<10} {'hit rate':>8} {'TTFT mean s':>11} {'p99 s':>7} {'busiest':>7}",
    ]
    for row in r["pickers"]:
        lines.append(
            f"{row['picker']:<10} {row['hit_rate']:>8.3f} {row['ttft_mean_s']:>11.3f} "
            f"{row['ttft_p99_s']:>7.2f} {row['busiest_share']:>7.3f}"
        )
    lines.append(
        f"bounds: infinite cache {r['bound_infinite_hit_rate']:.3f}, one LRU of the "
        f"fleet's size {r['bound_fleet_lru_hit_rate']:.3f}"
    )
    lines.append(
        f"prefix: {r['hit_rate_vs_fleet_bound']:.2f} of the fleet bound's hit rate, "
        f"p99 TTFT {r['p99_ttft_vs_p2c']:.2f}x p2c's"
    )
    return lines
