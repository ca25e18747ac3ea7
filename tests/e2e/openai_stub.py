"""A small OpenAI-compatible server that knows nothing of Sluice (standard library only).

It stands in for vLLM, SGLang or llama.cpp's server in the tests of the `command` and
`external` runtimes: `--host` and `--port` like theirs, `/v1/models`, `/health`,
`/v1/chat/completions` (with SSE streaming and `usage`). Like many real servers it dies at
once on SIGTERM, dropping whatever it was serving: only a drain that waited for its
in-flight requests loses none. Flags make it misbehave the ways a real one can.

    python tests/e2e/openai_stub.py --host 127.0.0.1 --port 8000 --model m --delay 0.2
"""

from __future__ import annotations

import argparse
import json
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
    return p.parse_args()


ARGS = parse()
GARBAGE = b"\x00\x01\xfe\xff\x1b[2J binary noise \xc3\x28\n"
STARTED = time.monotonic()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

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

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if not self._authorized():
            return
        if self.path != "/v1/chat/completions":
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        if body.get("model") != ARGS.model:
            self._json(404, {"error": {"message": f"model {body.get('model')!r} not served"}})
            return
        n = int(body.get("max_tokens") or 8)
        words = [f"w{i}" for i in range(n)]
        prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages", []))
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        time.sleep(ARGS.delay)
        base = {"id": f"cmpl-{ARGS.name}", "model": ARGS.model, "system_fingerprint": ARGS.name}
        if body.get("stream"):
            self._stream(
                base, words, usage, bool((body.get("stream_options") or {}).get("include_usage"))
            )
            return
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
                        "finish_reason": "length",
                    }
                ],
                "usage": usage,
            },
        )

    def _stream(
        self, base: dict[str, Any], words: list[str], usage: dict[str, int], with_usage: bool
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
            delta = {"role": "assistant", "content": w} if i == 0 else {"content": " " + w}
            last = i == len(words) - 1
            chunk(
                {
                    **base,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "choices": [
                        {"index": 0, "delta": delta, "finish_reason": "length" if last else None}
                    ],
                }
            )
            time.sleep(ARGS.token_delay)
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
