"""Fault: `kill -9` of every instance of a group of 2 at once, under a steady 30 req/s.

Until the controller sees the exits and publishes a table without them, the gateway still
lists both instances; their ports refuse connections, so the gateway marks them unreachable
and the group has nowhere to place a request. Such requests, and the ones that arrive while
the group has no instance at all, wait in the group's queue (up to its `max_wait_s`) and are
placed when the replacements are ready, as for a scale-from-zero. So only requests in flight
on the instances when they died may fail: sent before both processes were gone (SIGKILL
takes some milliseconds to end one; until then a connection is still accepted, then reset)
and not answered before the signals. Recovery: from the kill until the group has 2
ready instances again; the longest wait in the queue is reported too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import Counter
from pathlib import Path

from tests.e2e.conftest import running
from tests.faults.conftest import (
    Api,
    Load,
    group_spec,
    lines,
    platform_spec,
    report,
    wait_until,
)

REPLICAS = 2
MAX_CONCURRENCY = 8
RATE = 30.0


def alive(pid: int) -> bool:
    """Not yet gone (a zombie is gone: its sockets are closed)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


SPEC = platform_spec(
    group_spec("chat", replicas=REPLICAS, max_concurrency=MAX_CONCURRENCY),
    "  - {tag: chat-main, match: {models: [m-chat]}, to: chat}\n",
)


def test_kill_9_of_every_instance_loses_only_the_in_flight_ones(tmp_path: Path) -> None:
    with (
        running(
            tmp_path, SPEC, "2 ready", lambda s: len(s.ready("chat")) == REPLICAS, timeout=120
        ) as s,
        contextlib.closing(Api(s)) as api,
    ):
        load = Load(s.endpoint, rate=RATE).start(max_s=60)
        try:
            time.sleep(2.0)
            victims = api.ready("chat")
            at = time.monotonic()
            for victim in victims:
                os.kill(victim["pid"], signal.SIGKILL)
            dead = wait_until(
                "both workers dead", lambda: not any(alive(v["pid"]) for v in victims), 5, 0.001
            )
            gone = {v["id"] for v in victims}
            back = wait_until(
                "the group back to 2 ready",
                lambda: (
                    len(r := api.ready("chat")) == REPLICAS and all(i["id"] not in gone for i in r)
                ),
                timeout=45,
            )
            time.sleep(3.0)  # the load goes on after the replacements
        finally:
            outcomes = load.stop()
        failed = [o for o in outcomes if not o.ok]
        # in flight at the kill: sent before the processes were gone, not answered before
        # the signals (SIGKILL takes a few ms to end a process on a busy machine)
        dying = [o for o in outcomes if o.sent <= dead and o.done > at]
        bound = min(REPLICAS * MAX_CONCURRENCY, len(dying))
        held = [o for o in outcomes if dead < o.sent < back]  # sent while the group had none
        longest = max((o.done - o.sent for o in held), default=0.0)
        report(
            "kill-9-all-instances",
            len(outcomes),
            len(failed),
            0,
            back - at,
            bound=bound,
            dying_ms=round((dead - at) * 1000, 1),
            held=len(held),
            longest_hold_s=round(longest, 2),
            statuses=",".join(
                f"{k}x{n}" for k, n in sorted(Counter(o.status for o in failed).items())
            )
            or "-",
        )
        assert len(outcomes) >= RATE * 5
        assert len(failed) <= bound, list(lines(outcomes))
        # a failure may only be a request that was in flight when the instances died
        assert all(o in dying for o in failed), list(lines(outcomes))
        # the requests sent while the group had no instance were held, then served
        assert len(held) >= RATE * (back - dead) / 2 and all(o.ok for o in held)
