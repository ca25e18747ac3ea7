"""Fault: `kill -9` of a random instance of a group of 3, every 4 s for 20 s, under a steady
30 req/s through the gateway.

A request the killed instance had not answered yet got no byte of its answer, so the gateway
retries it on another instance (`exchange.py`: `upstream_failed` with nothing received), and a
request that finds the dead instance's port closed is retried too. So at most the requests in
flight at each kill may fail (bounded by the client's in-flight count at that instant, and
by `max_concurrency`), and in practice none should. Recovery: from a kill until the group has
3 ready instances again (the controller sees the exit within 0.2 s and launches a replacement).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from pathlib import Path

from tests.e2e.conftest import running
from tests.faults.conftest import (
    Api,
    Load,
    group_spec,
    in_flight,
    lines,
    platform_spec,
    report,
    wait_until,
    worker_pids,
)

REPLICAS = 3
MAX_CONCURRENCY = 8
KILLS = 5
EVERY_S = 4.0
RATE = 30.0

SPEC = platform_spec(
    group_spec("chat", replicas=REPLICAS, max_concurrency=MAX_CONCURRENCY),
    "  - {tag: chat-main, match: {models: [m-chat]}, to: chat}\n",
)


def test_kill_9_of_random_instances_loses_at_most_the_in_flight_ones(tmp_path: Path) -> None:
    with (
        running(
            tmp_path, SPEC, "3 ready", lambda s: len(s.ready("chat")) == REPLICAS, timeout=120
        ) as s,
        contextlib.closing(Api(s)) as api,
    ):
        rng = random.Random()
        load = Load(s.endpoint, rate=RATE).start(max_s=KILLS * EVERY_S + 40)
        kills: list[tuple[float, str]] = []
        recoveries: list[float] = []
        try:
            time.sleep(2.0)
            for _ in range(KILLS):
                ready = api.ready("chat")
                victim = rng.choice(ready)
                os.kill(victim["pid"], signal.SIGKILL)
                at = time.monotonic()
                kills.append((at, victim["id"]))
                back = wait_until(
                    "the group back to 3 ready",
                    lambda v=victim["id"]: (
                        len(r := api.ready("chat")) == REPLICAS and all(i["id"] != v for i in r)
                    ),
                    timeout=45,
                )
                recoveries.append(back - at)
                time.sleep(max(0.0, at + EVERY_S - time.monotonic()))
            time.sleep(2.0)  # the load goes on after the last replacement
        finally:
            outcomes = load.stop()
        failed = [o for o in outcomes if not o.ok]
        bound = sum(min(MAX_CONCURRENCY, in_flight(outcomes, at)) for at, _ in kills)
        report(
            "kill-9-instances",
            len(outcomes),
            len(failed),
            0,
            max(recoveries),
            bound=bound,
            kills=len(kills),
            mean_recovery_s=round(sum(recoveries) / len(recoveries), 2),
        )
        assert len(outcomes) >= RATE * (KILLS * EVERY_S)
        assert len(failed) <= bound, list(lines(outcomes))
        # a failure may only be a request that was in flight when an instance died
        for o in failed:
            assert any(o.sent <= at < o.done for at, _ in kills), list(lines(outcomes))
        events = api.events("chat")
        for _, iid in kills:
            died = [e for e in events if e["instance"] == iid and e["kind"] == "failed"]
            assert died and "exited with code -9" in died[0]["message"], events
        # no worker of a killed instance is left, and exactly the 3 live ones run
        live = worker_pids(tmp_path)
        assert sorted(live) == sorted(i["id"] for i in api.ready("chat")), live
        assert all(len(p) == 1 for p in live.values()), live
