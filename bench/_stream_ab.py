"""Streamed chat load, side by side: straight to a group's instances vs through the gateway.

    python bench/_stream_ab.py --gateway URL --direct URL [--direct URL ...] --model M \
        [--key K] [--rounds 3] [--requests 64] [--concurrency 8] [--tokens 128] [--json]

Rounds alternate direct, gateway, direct, ... so both paths see the same drift (thermal,
caches). Direct requests go round-robin over the `--direct` URLs (the same servers the
gateway balances over, so the comparison is the gateway's cost, not one GPU against two).
Each round sends `--requests` streamed requests, at most `--concurrency` at once, each
asking `--tokens` tokens (vLLM's `ignore_eos`, so every answer has that length). Per
request: TTFT (send to first content chunk); per round: completion tokens (from `usage`) /
the round's wall time. Prints a table and the gateway/direct ratios (`--json`: one JSON
line). All on 127.0.0.1; bounded by rounds x requests and a 300 s timeout per request.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import time
from typing import Any

import httpx


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--gateway", required=True)
    p.add_argument("--direct", action="append", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--key", default="sk-bench-c00397de4384b5bb")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    for url in [args.gateway, *args.direct]:
        if not url.startswith(("http://127.0.0.1:", "http://localhost:")):
            p.error(f"{url}: this benchmark sends load to 127.0.0.1 only")
    if not (0 < args.requests <= 10_000 and 0 < args.concurrency <= 256 and args.rounds > 0):
        p.error("bounded load: 1..10000 requests, 1..256 at once, >= 1 round")
    return args


async def one(client: httpx.AsyncClient, url: str, args: argparse.Namespace) -> tuple[float, int]:
    """(TTFT s, completion tokens) of one streamed request; raises if it did not finish."""
    body = {
        "model": args.model,
        "messages": [{"role": "user", "content": "Write a long story about a river."}],
        "max_tokens": args.tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {args.key}"}
    sent = time.perf_counter()
    ttft, tokens, done = 0.0, 0, False
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if not ttft and any((c.get("delta") or {}).get("content") for c in chunk["choices"]):
                ttft = time.perf_counter() - sent
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
    if not done or not ttft:
        raise RuntimeError(f"{url}: the stream ended without [DONE] or without any content")
    return ttft, tokens


async def round_of(urls: list[str], args: argparse.Namespace) -> tuple[list[float], float]:
    """One round: (every request's TTFT, completion tokens per second over the round)."""
    limits = httpx.Limits(max_connections=args.concurrency * len(urls))
    async with httpx.AsyncClient(timeout=300, trust_env=False, limits=limits) as client:
        gate = asyncio.Semaphore(args.concurrency)
        targets = itertools.cycle(urls)

        async def go(url: str) -> tuple[float, int]:
            async with gate:
                return await one(client, url, args)

        started = time.perf_counter()
        results = await asyncio.gather(*(go(next(targets)) for _ in range(args.requests)))
        took = time.perf_counter() - started
    return [t for t, _ in results], sum(n for _, n in results) / took


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main() -> None:
    args = parse()
    paths = {"direct": list(args.direct), "gateway": [args.gateway]}
    warm = argparse.Namespace(**{**vars(args), "requests": 4, "concurrency": 2, "tokens": 8})
    for urls in paths.values():  # connections, CUDA graphs, first-request set-up
        await round_of(urls, warm)
    ttfts: dict[str, list[float]] = {p: [] for p in paths}
    rates: dict[str, list[float]] = {p: [] for p in paths}
    for i in range(args.rounds):
        for name, urls in paths.items():
            got, rate = await round_of(urls, args)
            ttfts[name] += got
            rates[name].append(rate)
            print(f"round {i + 1}/{args.rounds} {name}: {rate:.0f} tok/s", file=sys.stderr)
    rows: dict[str, dict[str, Any]] = {
        p: {
            "requests": len(ttfts[p]),
            "tokens_per_s": round(statistics.median(rates[p]), 1),
            "ttft_p50_ms": round(1000 * quantile(ttfts[p], 0.50), 2),
            "ttft_p99_ms": round(1000 * quantile(ttfts[p], 0.99), 2),
        }
        for p in paths
    }
    ratio = {
        k: round(rows["gateway"][k] / rows["direct"][k], 3)
        for k in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms")
    }
    out = {
        **{f"{p}_{k}": v for p, row in rows.items() for k, v in row.items()},
        **{f"ratio_{k}": v for k, v in ratio.items()},
        "concurrency": args.concurrency,
        "tokens": args.tokens,
        "instances": len(args.direct),
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"{'path':<10}{'requests':>10}{'tokens/s':>12}{'TTFT p50 ms':>14}{'TTFT p99 ms':>14}")
    for p, row in rows.items():
        print(
            f"{p:<10}{row['requests']:>10}{row['tokens_per_s']:>12.1f}"
            f"{row['ttft_p50_ms']:>14.2f}{row['ttft_p99_ms']:>14.2f}"
        )
    print(
        f"{'gateway/direct':<20}{ratio['tokens_per_s']:>12.3f}"
        f"{ratio['ttft_p50_ms']:>14.3f}{ratio['ttft_p99_ms']:>14.3f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
