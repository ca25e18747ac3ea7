"""Token streaming of a `transformers` group: straight to the instance vs through the gateway.

    python bench/transformers_stream.py [--json] [--rounds 5] [--requests 10] [--tokens 200]

Builds the tiny random GPT-2 of tests/tiny_lm.py (offline), starts `sluice up` on a one-group
spec in a temp state directory, and once the instance is ready sends streamed chat requests
(the official openai client, `max_tokens` tokens each, one at a time) in interleaved rounds:
direct, gateway, direct, gateway, ... Per request: TTFT (send to first content chunk) and
decode rate (tokens after the first / time from first to last chunk). Then the same with
`--concurrency` requests at once, for the aggregate rate. Medians over all requests; ratios
are gateway / direct. Everything is on 127.0.0.1 and stopped on the way out.

`--json` prints one JSON line on stdout; progress goes to stderr. The tiny model makes ~1 ms
tokens, so this measures the serving path (worker, gateway, SSE) far more than the model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tiny_lm import build_tiny_lm  # noqa: E402

MODEL = "tiny-lm"
KEY = "sk-bench-c00397de4384b5bb"
SPEC = """
gateway: {{host: 127.0.0.1, port: 0}}
pools:
  - {{name: local, count: 1, memory_gb: 16}}
groups:
  - name: lm
    owner: bench@example.com
    business: bench
    alert_channel: "#bench"
    models:
      {model}:
        runtime: transformers
        transformers: {{model_path: "{path}", max_new_tokens: 1000}}
    resources: {{pool: local, accelerators: 1, memory_gb: 1}}
    max_concurrency: {concurrency}
    replicas: 1
    slow_start_s: 0
    health: {{startup_timeout_s: 180}}
tenants:
  - {{name: bench, api_keys: [{key}]}}
routes:
  - {{tag: lm, match: {{models: [{model}]}}, to: lm}}
"""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def platform(home: Path, spec: str) -> Iterator[tuple[str, str]]:
    """`sluice up` on `spec`: yields (gateway endpoint, instance URL) once it is ready."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "platform.yaml").write_text(spec)
    env = {**os.environ, "SLUICE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "sluice", "up", "-f", str(home / "platform.yaml"), "--port", "0"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        endpoint = ""
        for line in proc.stdout:
            if line.startswith("endpoint: "):
                endpoint = line.split(" ", 1)[1].strip()
                break
        if not endpoint:
            sys.exit("bench: sluice up did not start")
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            out = subprocess.run(
                [sys.executable, "-m", "sluice", "get", "instances", "--json"],
                capture_output=True, text=True, env=env, check=False,
            )  # fmt: skip
            ready = [i for i in json.loads(out.stdout or "[]") if i["state"] == "ready"]
            if ready:
                yield endpoint, ready[0]["url"]
                return
            time.sleep(0.5)
        sys.exit("bench: the instance never became ready")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        stop_workers(home)


def stop_workers(home: Path) -> None:
    """Kill, by pid, any worker of this state directory still running (each runs in its own
    session, so stopping `sluice up`'s group does not reach one it failed to stop)."""
    from sluice.runtime.local import pid_runs_instance

    ids = [p.stem for p in (home / "instances").glob("*.log")]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and any(pid_runs_instance(int(proc.name), i) for i in ids):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(proc.name), signal.SIGKILL)


def one_stream(client: Any, tokens: int, seed: int) -> tuple[float, float, int]:
    """(TTFT s, decode tokens/s, completion tokens) of one streamed chat request."""
    sent = time.perf_counter()
    first = last = 0.0
    usage = 0
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=tokens,
        seed=seed,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    if usage != tokens:
        sys.exit(f"bench: asked for {tokens} tokens, usage says {usage}")
    return first - sent, (usage - 1) / (last - first), usage


def clients(endpoint: str, instance: str) -> dict[str, Any]:
    import openai

    def make(url: str) -> Any:
        return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)

    return {"direct": make(instance), "gateway": make(endpoint)}


def measure(args: argparse.Namespace, endpoint: str, instance: str) -> dict[str, Any]:
    paths = clients(endpoint, instance)
    for client in paths.values():  # warm both paths (connections, first-request set-up)
        one_stream(client, 8, 0)
    ttft: dict[str, list[float]] = {p: [] for p in paths}
    rate: dict[str, list[float]] = {p: [] for p in paths}
    aggregate: dict[str, list[float]] = {p: [] for p in paths}
    seed = 1
    for r in range(args.rounds):
        for name, client in paths.items():
            for _ in range(args.requests):
                t, tps, _ = one_stream(client, args.tokens, seed)
                seed += 1
                ttft[name].append(t)
                rate[name].append(tps)
            with ThreadPoolExecutor(args.concurrency) as pool:
                started = time.perf_counter()
                seeds = range(seed, seed + args.concurrency)
                done = list(pool.map(lambda s, c=client: one_stream(c, args.tokens, s), seeds))
                wall = time.perf_counter() - started
                seed += args.concurrency
            aggregate[name].append(sum(n for _, _, n in done) / wall)
        log(f"round {r + 1}/{args.rounds} done")

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def p99(values: list[float]) -> float:
        return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))]

    out: dict[str, Any] = {"bench": "transformers_stream", "tokens": args.tokens}
    for name in paths:
        out[f"ttft_ms_p50_{name}"] = round(med(ttft[name]) * 1000, 2)
        out[f"ttft_ms_p99_{name}"] = round(p99(ttft[name]) * 1000, 2)
        out[f"decode_tok_s_{name}"] = round(med(rate[name]), 1)
        out[f"aggregate_tok_s_c{args.concurrency}_{name}"] = round(med(aggregate[name]), 1)
    out["ttft_ratio_gateway_vs_direct"] = round(
        out["ttft_ms_p50_gateway"] / out["ttft_ms_p50_direct"], 3
    )
    out["decode_ratio_gateway_vs_direct"] = round(
        out["decode_tok_s_gateway"] / out["decode_tok_s_direct"], 3
    )
    out["aggregate_ratio_gateway_vs_direct"] = round(
        out[f"aggregate_tok_s_c{args.concurrency}_gateway"]
        / out[f"aggregate_tok_s_c{args.concurrency}_direct"],
        3,
    )
    out["cpus"] = os.cpu_count()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON line on stdout")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=10, help="sequential, per round & path")
    parser.add_argument("--tokens", type=int, default=200, help="max_tokens of each request")
    parser.add_argument("--concurrency", type=int, default=2, help="the instance's slots too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sluice-bench-lm-") as tmp:
        root = Path(tmp)
        log("building the tiny model")
        lm = build_tiny_lm(root / "model")
        spec = SPEC.format(model=MODEL, path=lm.main, key=KEY, concurrency=args.concurrency)
        log("starting sluice up")
        with platform(root / "home", spec) as (endpoint, instance):
            log(f"ready: gateway {endpoint}, instance {instance}")
            result = measure(args, endpoint, instance)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:40} {value}")


if __name__ == "__main__":
    main()
