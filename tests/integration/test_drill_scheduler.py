"""The drill scheduler on a real store (SQLite, then PostgreSQL) and a manual clock, without
running a drill: a firing found past its deadline is recorded as missed (not run late), a
restart resumes from the last firing handled, and a firing a stop left running is closed
with its token revoked."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from sluice.control.auth import Role
from sluice.control.drills import DrillScheduler
from sluice.control.events import EventLog
from sluice.control.tokens import TokenAdmin
from sluice.core import ManualClock
from sluice.spec import PlatformSpec, load_spec_text
from sluice.store import Store
from tests.databases import Database

SPEC = """
pools: [{name: local, count: 2, memory_gb: 8}]
groups:
  - name: g
    owner: o@example.com
    business: b
    alert_channel: "#c"
    models: {m-g: {runtime: sim}}
    resources: {pool: local, memory_gb: 1}
    slo: {latency_ms: 500}
    autoscaling: {max: 2}
drills:
  - {name: nightly, group: g, cron: "0 3 * * *", api_key_env: DRILL_KEY,
     starting_deadline_s: 300}
"""


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def scheduler(store: Store, clock: ManualClock, audited: list[tuple[str, str]]) -> DrillScheduler:
    async def audit(actor: str, action: str, target: str, reason: str, detail: object) -> None:
        audited.append((actor, action))

    return DrillScheduler(
        store,
        TokenAdmin(store, clock),
        EventLog(store, clock),
        audit,
        clock,
        home=Path("."),
        control_url="http://127.0.0.1:9",
        endpoint="http://127.0.0.1:9",
        environ={},
    )


def test_a_late_firing_is_missed_and_a_restart_resumes_after_it(database: Database) -> None:
    store = database.open()
    spec: PlatformSpec = load_spec_text(SPEC).spec
    clock = ManualClock(at("2026-12-01T12:00:00"))
    audited: list[tuple[str, str]] = []

    async def scenario() -> None:
        s = scheduler(store, clock, audited)
        await s.load()
        await s.tick(spec, at("2026-12-01T23:00:00"))
        assert store.list_drill_fires() == []  # seen at noon: the next firing is 03:00
        clock.advance(at("2026-12-02T05:00:00") - clock.now())  # down at 03:00
        await s.tick(spec, clock.now())
        [fire] = store.list_drill_fires()
        assert (fire.status, fire.trigger, fire.due_at) == (
            "missed",
            "cron",
            at("2026-12-02T03:00"),
        )
        assert "starting_deadline_s" in fire.detail["reason"] and fire.token is None
        await s.tick(spec, clock.now() + 30)
        assert len(store.list_drill_fires()) == 1  # handled once

        restarted = scheduler(store, clock, audited)
        await restarted.load()
        await restarted.tick(spec, clock.now() + 60)
        assert len(store.list_drill_fires()) == 1  # resumes after the firing it handled

    try:
        asyncio.run(scenario())
    finally:
        store.close()


def test_a_firing_a_stop_left_running_is_closed_and_its_token_revoked(database: Database) -> None:
    store = database.open()
    clock = ManualClock(at("2026-12-02T03:00:01"))
    audited: list[tuple[str, str]] = []

    async def scenario() -> None:
        tokens = TokenAdmin(store, clock)
        await tokens.create("drill.nightly.x", Role.OPERATOR, ["g"], 600.0, by="schedule/nightly")
        fire_id = store.add_drill_fire(
            schedule="nightly",
            group="g",
            trigger="cron",
            actor="schedule/nightly",
            due_at=at("2026-12-02T03:00"),
            status="running",
            now=clock.now(),
            detail={},
            token="drill.nightly.x",
        )
        s = scheduler(store, clock, audited)
        await s.load()
        fire = store.get_drill_fire(fire_id)
        assert fire.status == "error" and "stopped while the drill ran" in fire.detail["error"]
        assert fire.finished_at is not None
        assert store.get_token("drill.nightly.x").revoked_at is not None

    try:
        asyncio.run(scenario())
    finally:
        store.close()
