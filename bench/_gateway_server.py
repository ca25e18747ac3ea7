"""Run the Sluice gateway alone, on uvloop, with the bench's generated snapshot.

    python bench/_gateway_server.py --backend-port P --access-log FILE [--groups 100 ...]

Builds the spec and snapshot exactly as `gateway.py` does (see `_spec.py`), listens on
127.0.0.1, prints `PORT <n>` on stdout, and serves until SIGTERM/SIGINT, then drains.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
from typing import TextIO

import uvloop
from _spec import make_snapshot, make_spec

from sluice.gateway.server import Gateway


async def serve(args: argparse.Namespace, log: TextIO | None) -> None:
    spec = make_spec(
        groups=args.groups,
        routes=args.routes,
        tenants=args.tenants,
        models=args.models,
        replicas=args.replicas,
    )
    snapshot = make_snapshot(spec, args.backend_port)
    gateway = Gateway("127.0.0.1", args.port, rng=random.Random(1), access_log=log)
    gateway.update(snapshot)
    await gateway.start(reuse_port=args.reuse_port)
    print(f"PORT {gateway.port}", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await gateway.stop(timeout=2.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend-port", type=int, required=True)
    ap.add_argument("--access-log", required=True, help="file; empty: no access log")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument(
        "--reuse-port", action="store_true", help="SO_REUSEPORT: share --port with other workers"
    )
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--routes", type=int, default=1000)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--replicas", type=int, default=2)
    args = ap.parse_args()
    # Opened outside the loop: the access log's delayed flush may still fire as it closes.
    with contextlib.ExitStack() as stack:
        log = None
        if args.access_log:
            log = stack.enter_context(open(args.access_log, "w", buffering=1 << 16))
        uvloop.run(serve(args, log))


if __name__ == "__main__":
    main()
