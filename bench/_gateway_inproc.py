"""The gateway's whole request path in one process, no sockets: Python CPU per request.

    python bench/_gateway_inproc.py                      # this checkout
    python bench/_gateway_inproc.py --tree /tmp/gw-old   # another checkout's `sluice`
    python bench/_gateway_inproc.py --profile            # cProfile: calls per request, top
    python bench/_gateway_inproc.py --fake-clock         # deterministic, for callgrind

Drives a real `ClientProtocol` (httptools request parser, `Exchange`, tenant and route choice,
admission, instance pick, the request to the instance) and a real `UpstreamConnection`
(httptools response parser, the answer relayed, `_finish`: token accounting, metrics, access
log) over fake transports, with the snapshot `bench/gateway.py` serves (`_spec.py`: 100
groups, 1,000 rules, the request matching rule #1000), the same request body as wrk sends
and the fast backend's answer (a chat completion with `usage`, nginx's headers). The access
log goes to /dev/null, flushed every 2,048 requests (the gateway flushes every 0.1 s).

Prints `time.process_time()` microseconds per request, best of `--repeat` runs of
`--requests`: CPU time, so other load on the machine moves it far less than wall time
(it still shares caches and frequency). It is the Python part of what `bench/gateway.py`
measures under wrk (no system calls here), for A/B of changes to the request path.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

BODY = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,'
    b'"model":"bench","choices":[{"index":0,"message":{"role":"assistant",'
    b'"content":"Hello from the bench backend."},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}'
)
"""`_backend.BODY`, which the fast nginx backend returns too"""
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Sat, 05 Dec 2026 10:00:00 GMT\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n%s"
) % (len(BODY), BODY)


class _ClientTransport:
    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.keep = True
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if self.keep:
            self.out.append(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        raise AssertionError("the client connection was closed")

    abort = close


class _UpstreamTransport(_ClientTransport):
    pass


def _request(body: bytes, api_key: str) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
        b"Content-Length: %d\r\nAuthorization: Bearer %s\r\n"
        b"Content-Type: application/json\r\n\r\n%s"
    ) % (len(body), api_key.encode(), body)


async def setup() -> tuple[Callable[[int], float], Callable[[], None]]:
    """Build the gateway and its fake connections, check one request; returns `run(n)`
    (process seconds per request of `n` more) and `close()`. Call it in a running loop
    (the request path reads it); other scripts may, to A/B variants in one process."""
    from _spec import make_snapshot, make_spec, pick_target

    from sluice.gateway.client import ClientProtocol
    from sluice.gateway.server import Gateway
    from sluice.gateway.upstream import UpstreamConnection

    spec = make_spec()
    snapshot = make_snapshot(spec, 9)
    target = pick_target(spec, snapshot)
    body = json.dumps(
        {
            "model": target.model,
            "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
            "max_tokens": 16,
        },
        separators=(",", ":"),
    ).encode()
    request = _request(body, target.api_key)
    log = open(os.devnull, "w", buffering=1 << 16)  # noqa: SIM115 (closed at the end)
    gateway = Gateway("127.0.0.1", 0, rng=random.Random(1), access_log=log)
    gateway.update(snapshot)
    state = gateway._state
    pool = gateway._pool
    host = pool.host("127.0.0.1", 9)
    conn = UpstreamConnection(pool, host)
    up = _UpstreamTransport()
    conn.connection_made(up)  # type: ignore[arg-type]
    host.idle[conn] = None
    client = ClientProtocol(state, gateway._conns, lambda: None)
    down = _ClientTransport()
    client.connection_made(down)  # type: ignore[arg-type]
    access_log = state.access_log
    flush = getattr(access_log, "flush", None)

    # One request, checked: what reached the instance, and what the client got.
    client.data_received(request)
    wire = b"".join(up.out)
    assert wire.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and wire.endswith(body)
    assert b"authorization" not in wire.lower(), wire
    conn.data_received(RESPONSE)
    answer = b"".join(down.out)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(BODY), answer
    assert b"x-sluice-route: " + target.tag.encode() in answer, answer
    tokens = getattr(state.metrics.groups[target.group], "tokens", {})  # (none before issue 35)
    assert not hasattr(state.metrics.groups[target.group], "tokens") or tokens, "usage not counted"
    up.keep = down.keep = False

    def run(n: int) -> float:
        feed_client = client.data_received
        feed_instance = conn.data_received
        started = time.process_time()
        for i in range(n):
            feed_client(request)
            feed_instance(RESPONSE)
            if not i & 2047 and flush is not None:
                flush()
        return (time.process_time() - started) / n

    def close() -> None:
        if flush is not None:
            flush()
        log.close()

    run(2000)  # warm the memos
    return run, close


def fake_clocks(step: float = 0.5e-6) -> None:
    """Make the clocks the request path reads deterministic: each read of
    `time.perf_counter`, `time.monotonic` or `time.time` advances all of them by `step`
    seconds. For counting instructions (`valgrind --tool=callgrind`, with PYTHONHASHSEED
    set): the memos keyed by time (the access log's millisecond) then hit alike in every
    run, however slowly the run goes. Call it before `setup()` imports the gateway."""
    reads = itertools.count(1)

    def now() -> float:
        return 1_000.0 + next(reads) * step

    def wall() -> float:
        return 1_800_000_000.0 + next(reads) * step

    time.perf_counter = time.monotonic = now
    time.time = wall


async def _bench(args: argparse.Namespace) -> None:
    run, close = await setup()
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        run(args.requests)
        prof.disable()
        stats = pstats.Stats(prof)
        calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
        print(f"{calls / args.requests:.1f} Python calls per request (cProfile)")
        stats.sort_stats("tottime").print_stats(args.top)
    else:
        times = [run(args.requests) for _ in range(args.repeat)]
        best = min(times)
        print(
            f"{best * 1e6:.2f} us/request (best of {args.repeat} x {args.requests}; "
            f"all: {' '.join(f'{t * 1e6:.2f}' for t in sorted(times))})"
        )
        if args.json:
            print(json.dumps({"us_per_request": round(best * 1e6, 3), "tree": str(args.tree)}))
    close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=50_000)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose sluice to time")
    p.add_argument("--profile", action="store_true", help="cProfile one run instead")
    p.add_argument("--top", type=int, default=25, help="functions shown with --profile")
    p.add_argument("--json", action="store_true", help="also one JSON line")
    p.add_argument(
        "--fake-clock",
        action="store_true",
        help="deterministic clocks, for instruction counts (see fake_clocks)",
    )
    args = p.parse_args()
    if args.fake_clock:
        fake_clocks()
    sys.path.insert(0, str(args.tree))
    sys.path.insert(1, str(ROOT / "bench"))
    import uvloop

    uvloop.run(_bench(args))


if __name__ == "__main__":
    main()
