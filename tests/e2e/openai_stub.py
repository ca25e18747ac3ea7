"""A small OpenAI-compatible server that knows nothing of Sluice (standard library only).

It stands in for vLLM, SGLang or llama.cpp's server in the tests of the `command` and
`external` runtimes: `--host` and `--port` like theirs, `/v1/models`, `/health`,
`/v1/chat/completions` (with SSE streaming and `usage`), and `/metrics` under vLLM's names
(`vllm:num_requests_running` is what it serves now; `vllm:num_requests_waiting` is set by
`--waiting` or `POST /stub/waiting {"waiting": N}`, to stand for a queue inside the server;
a TTFT histogram), and vLLM's sleep mode (`POST /sleep?level=N`, `POST /wake_up` taking
`--wake-s`, `GET /is_sleeping`; completions refused with 503 while asleep). Like many real
servers it dies at once on SIGTERM, dropping whatever it was serving: only a drain that
waited for its in-flight requests loses none. Flags make it
misbehave the ways a real one can (`--metrics garbage|huge|hang` for its metrics page,
`--error-rate` for a share of completions answered 500).

It can also time its answers as a continuously batching server does (the model of
`sluice.sim.batching`, what `sluice loadtest --fit` measures): with `--prefill-tps` the
first token comes after `prompt_tokens / prefill_tps` (prompt tokens: the prompt's words, the
count its `usage.prompt_tokens` reports) plus one decode step, and every next one after one
more step, a step taking `--step-base-s + --step-per-seq-s x (streams running now)`, the
running count read at each token. Steps are kept on a schedule (each token's time is the
previous one's *scheduled* time plus a step), so a late wake-up of the thread does not add
up over an answer. `--delay` and `--token-delay` still add their own time.

    python tests/e2e/openai_stub.py --host 127.0.0.1 --port 8000 --model m --delay 0.2
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="stub", help="the name /v1/models lists")
    p.add_argument("--name", default="stub", help="answers carry it as system_fingerprint")
    p.add_argument("--delay", type=float, default=0.0, help="seconds per completion")
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds between SSE chunks")
    p.add_argument("--load-s", type=float, default=0.0, help="/v1/models is 503 this long")
    p.add_argument("--bind-after", type=float, default=0.0, help="listen only after this")
    p.add_argument("--never-ready", action="store_true", help="/v1/models is always 503")
    p.add_argument("--garbage", action="store_true", help="print and answer binary garbage")
    p.add_argument("--require-key", default="", help="answer 401 without this bearer key")
    p.add_argument("--waiting", type=int, default=0, help="vllm:num_requests_waiting to report")
    p.add_argument(
        "--wake-s", type=float, default=1.0, help="how long POST /wake_up takes (sleep mode)"
    )
    p.add_argument(
        "--step-base-s", type=float, default=0.0, help="a decode step's fixed time (batching)"
    )
    p.add_argument(
        "--step-per-seq-s",
        type=float,
        default=0.0,
        help="a decode step's time per stream running now (batching)",
    )
    p.add_argument(
        "--prefill-tps",
        type=float,
        default=0.0,
        help="prompt tokens (its words, as usage.prompt_tokens says) prefilled a second; 0: none",
    )
    p.add_argument(
        "--stop-after",
        type=int,
        default=0,
        help="answers end ('stop') after this many tokens; 0: they run to max_tokens ('length')",
    )
    p.add_argument(
        "--error-rate", type=float, default=0.0, help="share of completions answered 500"
    )
    p.add_argument(
        "--metrics",
        choices=["vllm", "garbage", "huge", "hang"],
        default="vllm",
        help="/metrics: vLLM's names, binary garbage, 64 MiB of them, or never an answer",
    )
    return p.parse_args()


ARGS = parse()
SLEEP: dict[str, Any] = {"asleep": False, "level": 0, "sleeps": 0, "wakes": 0, "refused": 0}
"""Sleep mode's state (`_sleep_mode`), and the completions refused while asleep."""
GARBAGE = b"\x00\x01\xfe\xff\x1b[2J binary noise \xc3\x28\n"
STARTED = time.monotonic()
TTFT_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))


class Counters:
    """What /metrics reports: requests being served, the waiting count the test sets, and
    the time to first token of every answer (cumulative buckets, as Prometheus has them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.waiting = ARGS.waiting
        self.ttft = [0] * len(TTFT_BOUNDS)
        self.ttft_sum = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prefixes: set[str] = set()

    def prompt(self, messages: list[Any]) -> None:
        """vLLM's prefix-cache counters, roughly: every prompt word is looked up, and a
        conversation's words count as found when its first message was seen before."""
        words = [str(m.get("content", "")).split() for m in messages if isinstance(m, dict)]
        with self.lock:
            self.prefix_queries += sum(len(w) for w in words)
            first = " ".join(words[0]) if words else ""
            if first in self.prefixes:
                self.prefix_hits += len(words[0])
            self.prefixes.add(first)

    def first_token(self, seconds: float) -> None:
        with self.lock:
            self.ttft_sum += seconds
            for i, bound in enumerate(TTFT_BOUNDS):
                if seconds <= bound:
                    self.ttft[i] += 1

    def exposition(self) -> bytes:
        labels = f'model_name="{ARGS.model}"'
        with self.lock:
            rows = [
                "# HELP vllm:num_requests_running Number of requests in model execution batches.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{labels}}} {float(self.running)}",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{labels}}} {float(self.waiting)}",
                "# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.",
                "# TYPE vllm:gpu_cache_usage_perc gauge",
                f"vllm:gpu_cache_usage_perc{{{labels}}} {min(1.0, self.running / 16)}",
                "# HELP vllm:prefix_cache_queries Prefix cache queries, in tokens.",
                "# TYPE vllm:prefix_cache_queries counter",
                f"vllm:prefix_cache_queries_total{{{labels}}} {float(self.prefix_queries)}",
                "# HELP vllm:prefix_cache_hits Prefix cache hits, in tokens.",
                "# TYPE vllm:prefix_cache_hits counter",
                f"vllm:prefix_cache_hits_total{{{labels}}} {float(self.prefix_hits)}",
                "# HELP vllm:time_to_first_token_seconds Histogram of time to first token.",
                "# TYPE vllm:time_to_first_token_seconds histogram",
            ]
            for bound, count in zip(TTFT_BOUNDS, self.ttft, strict=True):
                le = "+Inf" if bound == float("inf") else str(bound)
                rows.append(
                    f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{le}"}} {float(count)}'
                )
            rows.append(f"vllm:time_to_first_token_seconds_count{{{labels}}} {self.ttft[-1]}")
            rows.append(f"vllm:time_to_first_token_seconds_sum{{{labels}}} {self.ttft_sum}")
        return ("\n".join(rows) + "\n").encode()


COUNTERS = Counters()
BATCHING = ARGS.prefill_tps > 0 or ARGS.step_base_s > 0 or ARGS.step_per_seq_s > 0


class Steps:
    """One answer's token clock under `--prefill-tps`, `--step-base-s`, `--step-per-seq-s`:
    the first `next()` waits out the prefill and one step, every later one one step, each
    step as long as the streams running at that token make it. Without those flags every
    wait is nothing."""

    def __init__(self, prompt_tokens: int) -> None:
        self.at = time.monotonic()
        self.prefill_s = prompt_tokens / ARGS.prefill_tps if ARGS.prefill_tps > 0 else 0.0

    def next(self) -> None:
        if not BATCHING:
            return
        with COUNTERS.lock:
            running = COUNTERS.running
        self.at += self.prefill_s + ARGS.step_base_s + ARGS.step_per_seq_s * running
        self.prefill_s = 0.0
        time.sleep(max(0.0, self.at - time.monotonic()))

    def pause(self, seconds: float) -> None:
        """`--token-delay` after a chunk, on the same schedule."""
        if not BATCHING:
            time.sleep(seconds)
            return
        self.at += seconds
        time.sleep(max(0.0, self.at - time.monotonic()))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # like uvicorn (vLLM, SGLang): small SSE writes go at once

    def log_message(self, format: str, *args: Any) -> None:
        sys.stdout.write(f"{self.address_string()} {format % args}\n")
        sys.stdout.flush()

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: Any) -> None:
        self._send(status, json.dumps(payload).encode())

    def _authorized(self) -> bool:
        if not ARGS.require_key:
            return True
        if self.headers.get("authorization") == f"Bearer {ARGS.require_key}":
            return True
        self._json(401, {"error": {"message": "bad key", "type": "auth"}})
        return False

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path == "/health":
            self._json(200, {"ok": True})
        elif self.path == "/is_sleeping":
            self._json(200, {"is_sleeping": SLEEP["asleep"], **SLEEP})
        elif self.path == "/metrics":
            self._metrics()
        elif self.path == "/v1/models":
            if ARGS.garbage:
                sys.stdout.buffer.write(GARBAGE)
                sys.stdout.flush()
                self._send(200, b"\x00\xff\xfe garbage \x1b[31m", "application/octet-stream")
            elif ARGS.never_ready or time.monotonic() - STARTED < ARGS.load_s:
                self._json(503, {"error": {"message": "loading"}})
            else:
                self._json(200, {"object": "list", "data": [{"id": ARGS.model, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def _metrics(self) -> None:
        if ARGS.metrics == "vllm":
            self._send(200, COUNTERS.exposition(), "text/plain; version=0.0.4")
        elif ARGS.metrics == "garbage":
            self._send(200, b"<html>\x00\xff\xfe not metrics \x1b[31m</html>", "text/plain")
        elif ARGS.metrics == "huge":  # streamed, no length: only a reader's own cap stops it
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            line = b'vllm:num_requests_waiting{model_name="m"} 1.0\n' * 20_000
            for _ in range(64 * 2**20 // len(line)):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.write(b"0\r\n\r\n")
        else:  # hang: headers never come
            time.sleep(3600)

    def _sleep_mode(self, path: str) -> None:
        """vLLM's sleep mode: POST /sleep?level=N frees the accelerator's memory (instant
        here), POST /wake_up loads the weights again (`--wake-s`); both idempotent."""
        if path.startswith("/sleep"):
            level = int(path.partition("level=")[2] or 1)
            SLEEP.update(asleep=True, level=level, sleeps=SLEEP["sleeps"] + 1)
        else:
            if SLEEP["asleep"]:
                time.sleep(ARGS.wake_s)
            SLEEP.update(asleep=False, level=0, wakes=SLEEP["wakes"] + 1)
        print(f"sleep mode: {path} -> asleep={SLEEP['asleep']}", flush=True)
        self._json(200, {})

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self._authorized():
            return
        if self.path.split("?")[0] in ("/sleep", "/wake_up"):
            self._sleep_mode(self.path)
            return
        if self.path == "/stub/waiting":
            with COUNTERS.lock:
                COUNTERS.waiting = int(body["waiting"])
            self._json(200, {"waiting": COUNTERS.waiting})
            return
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if SLEEP["asleep"]:
            SLEEP["refused"] += 1
            self._json(503, {"error": {"message": "the engine is sleeping (POST /wake_up)"}})
            return
        if body.get("model") != ARGS.model:
            self._json(404, {"error": {"message": f"model {body.get('model')!r} not served"}})
            return
        if ARGS.error_rate and random.random() < ARGS.error_rate:
            self._json(500, {"error": {"message": "injected failure (--error-rate)"}})
            return
        n = int(body.get("max_tokens") or 8)
        finish = "length"
        if 0 < ARGS.stop_after < n:
            n, finish = ARGS.stop_after, "stop"
        words = [f"w{i}" for i in range(n)]
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        COUNTERS.prompt(body.get("messages", []))
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        with COUNTERS.lock:
            COUNTERS.running += 1
        try:
            self._complete(body, words, usage, finish)
        finally:
            with COUNTERS.lock:
                COUNTERS.running -= 1

    def _complete(
        self, body: dict[str, Any], words: list[str], usage: dict[str, int], finish: str
    ) -> None:
        started = time.monotonic()
        time.sleep(ARGS.delay)
        steps = Steps(usage["prompt_tokens"])
        steps.next()  # prefill, then the step that yields the first token
        COUNTERS.first_token(time.monotonic() - started)
        base = {"id": f"cmpl-{ARGS.name}", "model": ARGS.model, "system_fingerprint": ARGS.name}
        if body.get("stream"):
            with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(base, words, usage, with_usage, finish, steps)
            return
        for _ in words[1:]:
            steps.next()
        self._json(
            200,
            {
                **base,
                "object": "chat.completion",
                "created": int(time.time()),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": " ".join(words)},
                        "finish_reason": finish,
                    }
                ],
                "usage": usage,
            },
        )

    def _stream(
        self,
        base: dict[str, Any],
        words: list[str],
        usage: dict[str, int],
        with_usage: bool,
        finish: str,
        steps: Steps,
    ) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

        def chunk(payload: Any) -> None:
            data = (
                b"data: "
                + (payload if isinstance(payload, bytes) else json.dumps(payload).encode())
                + b"\n\n"
            )
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        created = int(time.time())
        for i, w in enumerate(words):
            if i > 0:
                steps.next()
            delta = {"role": "assistant", "content": w} if i == 0 else {"content": " " + w}
            last = i == len(words) - 1
            chunk(
                {
                    **base,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "choices": [
                        {"index": 0, "delta": delta, "finish_reason": finish if last else None}
                    ],
                }
            )
            steps.pause(ARGS.token_delay)
        if with_usage:
            chunk(
                {
                    **base,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "choices": [],
                    "usage": usage,
                }
            )
        chunk(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main() -> None:
    if ARGS.garbage:
        sys.stdout.buffer.write(GARBAGE)
        sys.stdout.flush()
    print(f"stub {ARGS.name}: loading", flush=True)
    time.sleep(ARGS.bind_after)
    server = ThreadingHTTPServer((ARGS.host, ARGS.port), Handler)
    server.daemon_threads = True
    server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    print(f"stub {ARGS.name}: listening on {ARGS.host}:{ARGS.port}", flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
