"""What recording canary samples costs the gateway per request (micro-benchmark, no sockets).

Runs the response half of a real `Exchange` (head, `--chunks` body pieces, end: `_finish`,
admission, metrics) against a stub client, for a group that is not sampled and for one that
is (`GatewayState.sample_groups`), and prints microseconds per request, best of `--repeat`
runs. To see what the sampling code costs groups that are not sampled, run it on a tree
without it too (`--tree`: `sample_groups` missing, so only the first line is printed) and
compare, e.g. with `git archive <commit> sluice | tar -x -C /tmp/base`:

    python bench/gateway_samples.py --requests 100000 --chunks 8
    python bench/gateway_samples.py --requests 100000 --chunks 8 --tree /tmp/base
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.gateway.state import GatewayState

ROOT = Path(__file__).resolve().parent.parent

HEADERS = [b"content-type: text/event-stream\r\n"]
CHUNK = b"data: " + b"x" * 120 + b"\n\n"


class _Client:
    closing = False
    write_paused = False

    def write(self, data: bytes) -> None:
        pass

    def exchange_done(self, ex: Any) -> None:
        pass

    def abort(self) -> None:
        pass


def _state() -> GatewayState:
    from sluice.gateway.state import GatewayState
    from sluice.gateway.upstream import UpstreamPool
    from sluice.policy.routing import Endpoint, RouteRule, RouteTable, RoutingSnapshot

    state = GatewayState(rng=random.Random(1), pool=UpstreamPool(), access_log=None)
    state.set_snapshot(
        RoutingSnapshot(
            version=1,
            routes=RouteTable([RouteRule("r1", (("g1", 1),))]),
            tenants_by_key={},
            endpoints={"g1": (Endpoint("i1", "127.0.0.1", 9, 1_000_000),)},
            group_models={"g1": frozenset({"m1"})},
        )
    )
    return state


def run(state: GatewayState, n: int, chunks: int) -> float:
    """Seconds per request of n exchanges' response halves."""
    from sluice.gateway.exchange import Exchange

    g = state.groups["g1"]
    client = _Client()
    endpoint = g.endpoints[0]
    outstanding = state.outstanding
    started = time.perf_counter()
    for _ in range(n):
        ex = Exchange(
            client,  # type: ignore[arg-type]
            state,
            b"POST",
            b"/v1/chat/completions",
            [],
            b"rid",
            b"{}",
            None,
            None,
            True,
            True,
            time.perf_counter(),
        )
        ex.group = ex.route = "g1"
        g.admission.try_acquire()
        ex.grp = g
        ex.endpoint = endpoint
        ex.instance = ex.slot = "i1"
        outstanding["i1"] = outstanding.get("i1", 0) + 1
        ex.upstream_head(200, HEADERS, False)
        for _ in range(chunks):
            ex.upstream_body(CHUNK)
            ex.upstream_flush()
        ex.upstream_done()
    return (time.perf_counter() - started) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--chunks", type=int, default=8, help="body pieces per answer")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose sluice to time")
    a = p.parse_args()
    sys.path.insert(0, str(a.tree))
    plain = _state()
    sampled = _state()
    has_sampling = hasattr(sampled, "sample_groups")
    if has_sampling:
        sampled.sample_groups(["g1"])
    for name, state in (("not sampled", plain), ("sampled", sampled)):
        if name == "sampled" and not has_sampling:
            break
        best = min(run(state, a.requests, a.chunks) for _ in range(a.repeat))
        print(f"{name:12s} {best * 1e6:7.3f} us/request ({a.chunks} chunks)")


if __name__ == "__main__":
    main()
