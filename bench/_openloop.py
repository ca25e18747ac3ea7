"""Open-loop HTTP/1.1 load at a fixed rate, timed from each request's scheduled send time.

    python bench/_openloop.py --port P --rate 500 --duration 10 --body-file F [--header H]...

Request i is due at start + i / rate whatever happened to the ones before it (no coordinated
omission): if every connection is busy it waits in a queue, and that wait counts as latency.
Requests go over a fixed set of keep-alive connections opened up front. The first `--warmup`
seconds are sent but not measured. Prints one JSON line: percentiles in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections import deque

import httptools
import uvloop
from _timer import PreciseTimer


class Conn(asyncio.Protocol):
    def __init__(self, gen: Generator) -> None:
        self.gen = gen
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.current = -1  # index of the request in flight, -1 when idle

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.current >= 0:
            self.gen.finished(self, self.current, 0)
        self.gen.lost(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_complete(self) -> None:
        i, self.current = self.current, -1
        self.gen.finished(self, i, self.parser.get_status_code())

    def send(self, i: int, wire: bytes) -> None:
        self.current = i
        assert self.transport is not None
        self.transport.write(wire)


class Generator:
    def __init__(self, args: argparse.Namespace, wire: bytes) -> None:
        self.args = args
        self.wire = wire
        self.loop = asyncio.get_running_loop()
        self.rate = args.rate
        self.skip = int(args.warmup * args.rate)  # requests sent but not measured
        self.total = self.skip + int(args.duration * args.rate)
        self.free: list[Conn] = []
        self.pending: deque[int] = deque()
        self.next_i = 0
        self.start = 0.0
        self.latencies: list[float] = []
        self.send_lag: list[float] = []
        self.statuses: dict[int, int] = {}
        self.errors = 0
        self.done_count = 0
        self.done = asyncio.Event()

    def due(self, i: int) -> float:
        return self.start + i / self.rate

    async def run(self) -> dict[str, object]:
        for _ in range(self.args.connections):
            _, conn = await self.loop.create_connection(
                lambda: Conn(self), "127.0.0.1", self.args.port
            )
            self.free.append(conn)
        # Every send is scheduled up front, on a timer finer than the loop's 1 ms ticks.
        timer = PreciseTimer(self.loop)
        self.start = time.perf_counter() + 0.05
        for i in range(self.total):
            timer.call_at(self.due(i), self.dispatch, i)
        deadline = self.args.warmup + self.args.duration + self.args.grace
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.done.wait(), deadline)
        elapsed = time.perf_counter() - self.start
        timer.stop()
        for conn in self.free:
            if conn.transport is not None:
                conn.transport.close()
        return self.report(elapsed)

    def dispatch(self, i: int) -> None:
        self.next_i = i + 1
        if self.free:
            self.send(self.free.pop(), i)
        else:
            self.pending.append(i)

    def send(self, conn: Conn, i: int) -> None:
        if i >= self.skip:
            self.send_lag.append(time.perf_counter() - self.due(i))
        conn.send(i, self.wire)

    def finished(self, conn: Conn, i: int, status: int) -> None:
        now = time.perf_counter()
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == 0:
            self.errors += 1
        elif i >= self.skip:
            self.latencies.append(now - self.due(i))
        self.done_count += 1
        if self.done_count >= self.total:
            self.done.set()
        if conn.transport is None:
            return
        if self.pending:
            self.send(conn, self.pending.popleft())
        else:
            self.free.append(conn)

    def lost(self, conn: Conn) -> None:
        if conn in self.free:
            self.free.remove(conn)

    def report(self, elapsed: float) -> dict[str, object]:
        lat = sorted(self.latencies)

        def pct(q: float) -> float | None:
            if not lat:
                return None
            return round(lat[max(0, math.ceil(q * len(lat)) - 1)] * 1000.0, 3)

        lag = sorted(self.send_lag)
        return {
            "rate": self.rate,
            "sent": self.next_i,
            "measured": len(lat),
            "unanswered": self.total - self.done_count,
            "errors": self.errors,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "p50_ms": pct(0.50),
            "p90_ms": pct(0.90),
            "p99_ms": pct(0.99),
            "p999_ms": pct(0.999),
            "max_ms": round(lat[-1] * 1000.0, 3) if lat else None,
            "mean_ms": round(sum(lat) / len(lat) * 1000.0, 3) if lat else None,
            "send_lag_p50_ms": round(lag[len(lag) // 2] * 1000.0, 3) if lag else None,
            "achieved_rps": round(self.done_count / elapsed, 1) if elapsed > 0 else None,
        }


async def main(args: argparse.Namespace) -> None:
    with open(args.body_file, "rb") as f:
        body = f.read()
    head = [f"POST {args.path} HTTP/1.1", f"host: 127.0.0.1:{args.port}"]
    head += args.header
    head += ["content-type: application/json", f"content-length: {len(body)}"]
    wire = ("\r\n".join(head) + "\r\n\r\n").encode() + body
    result = await Generator(args, wire).run()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--path", default="/v1/chat/completions")
    ap.add_argument("--rate", type=float, default=500.0, help="requests per second")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    ap.add_argument("--grace", type=float, default=5.0, help="wait for stragglers")
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--body-file", required=True)
    ap.add_argument("--header", action="append", default=[], help="'Name: value'")
    uvloop.run(main(ap.parse_args()))
    sys.exit(0)
