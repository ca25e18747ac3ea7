"""Fault: an instance that hangs at start-up. Group `stuck` loads its model for 60 s (sim
`startup_s`) but allows 2 s (`health.startup_timeout_s`): each launch is timed out, failed
(the event says why), its process stopped, and another launch follows (after the crash-loop
backoff: at once, then 1 s, 2 s, ...). Meanwhile group `chat` serves a steady 30 req/s
without a failure: one group's broken start-up is no one else's problem.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.e2e.conftest import running
from tests.faults.conftest import (
    Api,
    Load,
    group_spec,
    lines,
    platform_spec,
    ready_counts,
    report,
    wait_until,
    worker_pids,
)

STUCK_SIM = "{startup_s: 60, service_time: {kind: fixed, seconds: 0.02}, memory_gb: 1}"
SPEC = platform_spec(
    group_spec("chat", replicas=2)
    + group_spec("stuck", model="m-stuck", sim=STUCK_SIM, startup_timeout_s=2.0),
    "  - {tag: chat-main, match: {models: [m-chat]}, to: chat}\n"
    "  - {tag: stuck-main, match: {models: [m-stuck]}, to: stuck}\n",
)
RATE = 30.0
FAILURES = 3


def test_an_instance_hung_at_startup_is_timed_out_and_replaced(tmp_path: Path) -> None:
    with (
        running(tmp_path, SPEC, "chat ready", lambda s: ready_counts(s).get("chat") == 2) as s,
        Api(s) as api,
    ):
        load = Load(s.endpoint, rate=RATE).start(max_s=60)
        try:

            def stuck_events() -> list[dict[str, Any]]:
                return sorted(api.events("stuck"), key=lambda e: e["id"])

            def enough() -> bool:
                ev = stuck_events()
                fails = [e for e in ev if e["kind"] == "failed"]
                return len(fails) >= FAILURES and ev[-1]["kind"] == "launch"

            wait_until(f"{FAILURES} timed-out launches and another launch", enough, 45, 0.25)
            events = stuck_events()
            time.sleep(1.0)
        finally:
            outcomes = load.stop()
        failed = [o for o in outcomes if not o.ok]
        fails = [e for e in events if e["kind"] == "failed"]
        launches = [e for e in events if e["kind"] == "launch"]
        # detection: launch to its failure; replacement: failure to the next launch
        detect = [
            f["at"] - next(x["at"] for x in launches if x["instance"] == f["instance"])
            for f in fails
        ]
        relaunch = [min(x["at"] for x in launches if x["at"] > f["at"]) - f["at"] for f in fails]
        report(
            "startup-hang",
            len(outcomes),
            len(failed),
            0,
            relaunch[0],
            timed_out=len(fails),
            detect_s=round(max(detect), 2),
            relaunch_s=[round(r, 2) for r in relaunch],
        )
        assert not failed, list(lines(outcomes))
        for f in fails:
            assert "not ready 2s after launch" in f["message"], f
        # the 2 s start-up timeout runs on the monotonic clock; the events carry wall-clock
        # stamps taken just after the launch and the timeout, so one can read a hair short
        # (CI saw 1.9996 s)
        assert all(2.0 - 0.05 <= d < 10.0 for d in detect), detect
        assert relaunch[0] < 3.0, relaunch  # the first failure is replaced at once
        assert any(e["kind"] == "backoff" for e in events), events
        # every timed-out instance's process is gone; the stuck group has 1 instance, starting
        failed_ids = {f["instance"] for f in fails}
        wait_until(
            "timed-out workers gone", lambda: not failed_ids & set(worker_pids(tmp_path)), 15
        )
        stuck = api.instances("stuck")
        assert len(stuck) == 1 and stuck[0]["state"] in ("pending", "starting"), stuck
        assert {o.group for o in outcomes} == {"chat"}
        status = api.status()
        assert status["status"] == "ok", status  # a group that cannot start is not a fault of
        # the controller: it keeps ticking
