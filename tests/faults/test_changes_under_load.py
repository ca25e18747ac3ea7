"""Planned changes under a steady load through the gateway: none may lose a request.

- scale-down 3 -> 1 (drained: out of routing first, in-flight requests finish);
- a rolling update (version change: new ready before old drains);
- a canary rollback (a canary failing a fifth of its answers): only the canary's own
  injected 500s before the rollback fail, counted apart as expected;
- failover to a backup group and restore.

Operator actions go through the control API with the admin token (what the CLI sends), the
spec change through `sluice apply`.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.e2e.conftest import Sluice, running
from tests.faults.conftest import (
    Api,
    Load,
    group_spec,
    lines,
    platform_spec,
    ready_counts,
    report,
    wait_until,
)

RATE = 30.0
ROUTE = "  - {tag: chat-main, match: {models: [m-chat]}, to: chat}\n"


def test_scale_down_3_to_1_under_load_loses_nothing(tmp_path: Path) -> None:
    spec = platform_spec(group_spec("chat", replicas=3), ROUTE)
    with (
        running(tmp_path, spec, "3 ready", lambda s: ready_counts(s) == {"chat": 3}) as s,
        Api(s) as api,
    ):
        load = Load(s.endpoint, rate=RATE).start(max_s=60)
        try:
            time.sleep(2.0)
            asked = time.monotonic()
            api.post("/v1/groups/chat/scale", {"replicas": 1, "reason": "faults: scale down"})
            done = wait_until("1 instance left", lambda: len(api.instances("chat")) == 1, 40)
            time.sleep(2.0)
        finally:
            outcomes = load.stop()
        failed = [o for o in outcomes if not o.ok]
        report("scale-down-3-to-1", len(outcomes), len(failed), 0, done - asked)
        assert not failed, list(lines(outcomes))
        assert len({o.instance for o in outcomes}) == 3
        last = outcomes[-int(RATE) :]
        assert len({o.instance for o in last}) == 1  # all on the one that stayed
        kinds = [e["kind"] for e in api.events("chat")]
        assert kinds.count("drain") == 2 and "drain-timeout" not in kinds, kinds


def test_rolling_update_under_load_loses_nothing(tmp_path: Path) -> None:
    spec = platform_spec(group_spec("chat", replicas=3), ROUTE)
    with (
        running(tmp_path, spec, "3 ready", lambda s: ready_counts(s) == {"chat": 3}) as s,
        Api(s) as api,
    ):
        old = {i["id"] for i in api.instances("chat")}
        s.spec.write_text(platform_spec(group_spec("chat", replicas=3, version="v2"), ROUTE))
        load = Load(s.endpoint, rate=RATE).start(max_s=80)
        try:
            time.sleep(2.0)
            asked = time.monotonic()
            applied = s.cli("apply", "-f", str(s.spec), "--reason", "faults: ship v2")
            assert applied["changed"], applied

            def rolled() -> bool:
                now = api.instances("chat")
                return (
                    len(now) == 3
                    and all(i["state"] == "ready" for i in now)
                    and old.isdisjoint(i["id"] for i in now)
                )

            done = wait_until("v2 rolled out", rolled, 60)
            time.sleep(2.0)
        finally:
            outcomes = load.stop()
        failed = [o for o in outcomes if not o.ok]
        report("rolling-update", len(outcomes), len(failed), 0, done - asked)
        assert not failed, list(lines(outcomes))
        new = {i["id"] for i in api.instances("chat")}
        assert {o.instance for o in outcomes[-int(RATE) :]} <= new
        assert {o.instance for o in outcomes[: int(RATE)]} <= old


CANARY_SIM = (
    "{startup_s: 0.2, service_time: {kind: fixed, seconds: 0.02}, memory_gb: 1, error_rate: 0.2}"
)
ROLLOUT = """  - name: risk-v2
    baseline: risk
    canary: risk-v2
    steps: [20, 50, 100]
    hold_s: 2
    analysis: {min_samples: 30}
"""


def test_canary_rollback_loses_only_the_canarys_own_errors(tmp_path: Path) -> None:
    spec = platform_spec(
        group_spec("risk", model="m-risk", replicas=2)
        + group_spec("risk-v2", model="m-risk", sim=CANARY_SIM),
        "  - {tag: risk-main, match: {models: [m-risk]}, to: risk}\n",
        ROLLOUT,
    )

    def ready(s: Sluice) -> bool:
        return ready_counts(s) == {"risk": 2, "risk-v2": 1}

    with running(tmp_path, spec, "risk and risk-v2 ready", ready) as s, Api(s) as api:
        wall = time.time() - time.monotonic()  # the rollout's times are wall-clock
        load = Load(s.endpoint, model="m-risk", rate=40.0).start(max_s=70)
        try:
            time.sleep(1.0)
            api.post("/v1/rollouts/risk-v2/start", {"reason": "faults: try v2"})

            def phase() -> str:
                (r,) = [r for r in api.get("/v1/rollouts") if r["name"] == "risk-v2"]
                return str(r["phase"])

            wait_until("rolled back", lambda: phase() == "rolled_back", 50, poll_s=0.2)
            time.sleep(3.0)  # the load goes on after the rollback
        finally:
            outcomes = load.stop()
        state = api.get("/v1/rollouts/risk-v2")["state"]
        rolled_back = state["transitions"][-1]["at"] - wall
        failed = [o for o in outcomes if not o.ok]
        injected = [
            o
            for o in failed
            if o.status == 500 and o.group == "risk-v2" and "simulated failure" in o.error
        ]
        unexpected = [o for o in failed if o not in injected]
        to_canary = [o for o in outcomes if o.group == "risk-v2"]
        first_error = min((o.sent for o in injected), default=rolled_back)
        report(
            "canary-rollback",
            len(outcomes),
            len(failed),
            len(injected),
            rolled_back - first_error,
            to_canary=len(to_canary),
            unexpected=len(unexpected),
        )
        assert not unexpected, list(lines(unexpected))
        assert injected and to_canary  # the canary did get traffic and did fail some
        # every canary answer (so every injected error) was sent before the rollback + 1 s
        assert max(o.sent for o in to_canary) <= rolled_back + 1.0
        assert [o for o in outcomes if o.due > rolled_back + 1.0]  # the load went on
        assert any(e["kind"] == "rollback" for e in api.events("risk-v2"))


def test_failover_and_restore_under_load_lose_nothing(tmp_path: Path) -> None:
    spec = platform_spec(group_spec("chat", replicas=2) + group_spec("chat-backup"), ROUTE)

    def ready(s: Sluice) -> bool:
        return ready_counts(s) == {"chat": 2, "chat-backup": 1}

    with running(tmp_path, spec, "chat and chat-backup ready", ready) as s, Api(s) as api:
        load = Load(s.endpoint, rate=RATE).start(max_s=40)
        try:
            time.sleep(2.0)
            over = time.monotonic()
            api.post("/v1/groups/chat/failover", {"to": "chat-backup", "reason": "faults"})
            time.sleep(4.0)
            back = time.monotonic()
            api.post("/v1/groups/chat/restore", {"reason": "faults: over"})
            time.sleep(4.0)
        finally:
            outcomes = load.stop()
        failed = [o for o in outcomes if not o.ok]
        # switch time: from each call until every later request lands where it should
        moved = max(
            (o.sent for o in outcomes if over <= o.sent < back and o.group != "chat-backup"),
            default=over,
        )
        returned = max(
            (o.sent for o in outcomes if o.sent >= back and o.group != "chat"), default=back
        )
        report(
            "failover-restore",
            len(outcomes),
            len(failed),
            0,
            max(moved - over, returned - back),
        )
        assert not failed, list(lines(outcomes))
        assert moved - over < 1.0 and returned - back < 1.0, (moved - over, returned - back)
        assert {o.group for o in outcomes if o.sent < over} == {"chat"}
