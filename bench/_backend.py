"""A tiny HTTP/1.1 keep-alive backend that answers every request after a fixed delay.

    python bench/_backend.py --delay-ms 20 [--port 0] [--sse N]

Prints `PORT <n>` on stdout once listening. Answers any method and path with a small
OpenAI-style chat completion; the request body is read and dropped. Used for the latency
bench (an instance that takes 20 ms); the throughput bench uses nginx as the fast backend.
`--sse N`: a streamed completion instead, as vLLM writes one: N chunks of one token each,
one chunked-encoding piece per event, then (when the body asks `include_usage`) the usage
chunk, then `data: [DONE]` (the streamed variant of the throughput bench, `--delay-ms 0`).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import httptools
import uvloop
from _timer import PreciseTimer

BODY = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,'
    b'"model":"bench","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":"Hello from the bench backend."},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}'
)
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
CLOSE_RESPONSE = RESPONSE.replace(b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1)
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
_TOKEN = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}'
    b"\n\n"
)
_USAGE = (
    b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"bench","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":%d,'
    b'"total_tokens":%d}}\n\n'
)


def _piece(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def sse_response(events: int, usage: bool) -> bytes:
    """A streamed answer of `events` one-token chunks (with its usage chunk if `usage`)."""
    pieces = [SSE_HEAD] + [_piece(_TOKEN)] * events
    if usage:
        pieces.append(_piece(_USAGE % (events, events + 9)))
    return b"".join(pieces) + _piece(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class Backend(asyncio.Protocol):
    def __init__(self, delay_s: float, timer: PreciseTimer, sse: int = 0) -> None:
        self.delay_s = delay_s
        self.timer = timer
        self.sse = (sse_response(sse, False), sse_response(sse, True)) if sse else None
        self.asks_usage = False
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.asks_usage = self.asks_usage or b"include_usage" in body

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive()
        if self.delay_s > 0:
            self.timer.call_later(self.delay_s, self._answer, keep_alive)
        else:
            self._answer(keep_alive)

    def _answer(self, keep_alive: bool) -> None:
        # Responses leave in request order: every request waits the same fixed delay.
        if self.transport is None:
            return
        if self.sse is not None:  # (`connection: close` or not, the end closes it below)
            self.transport.write(self.sse[self.asks_usage])
            self.asks_usage = False
        else:
            self.transport.write(RESPONSE if keep_alive else CLOSE_RESPONSE)
        if not keep_alive:
            self.transport.close()


async def main(port: int, delay_s: float, sse: int) -> None:
    loop = asyncio.get_running_loop()
    timer = PreciseTimer(loop)  # uvloop's own timers would blur the delay by up to 1 ms
    server = await loop.create_server(
        lambda: Backend(delay_s, timer, sse), "127.0.0.1", port, backlog=1024, reuse_address=True
    )
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    timer.stop()
    server.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--sse", type=int, default=0, help="stream this many chunks per answer")
    args = ap.parse_args()
    uvloop.run(main(args.port, args.delay_ms / 1000.0, args.sse))
    sys.exit(0)
