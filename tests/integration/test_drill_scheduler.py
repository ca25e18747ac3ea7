"""The drill scheduler on a real store (SQLite, then PostgreSQL) and a manual clock, without
running a drill: a firing found past its deadline is recorded as missed (not run late), a
restart resumes from the last firing handled, a firing a stop left running is closed with
its token deleted, and a day of a minute's drills leaves no token behind."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sluice.control.auth import Authenticator, Principal, Role
from sluice.control.drills import DrillScheduler
from sluice.control.events import EventLog
from sluice.control.tokens import TokenAdmin
from sluice.core import Conflict, ManualClock, NotFound
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


def test_a_firing_a_stop_left_running_is_closed_and_its_token_deleted(database: Database) -> None:
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
        with pytest.raises(NotFound):
            store.get_token("drill.nightly.x")
        assert ("sluice up", "token-delete") in [(a.actor, a.action) for a in store.list_audit()]

    try:
        asyncio.run(scenario())
    finally:
        store.close()


MINUTE_SPEC = """
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
tenants:
  - {name: ops, api_keys: [KEY]}
drills:
  - {name: minutely, group: g, cron: "* * * * *", api_key_env: DRILL_KEY}
"""
MINUTES = 24 * 60
KEY = "sk-minute-drill-7QpX2vR9tLw4ZkN8"


class InstantDrills(DrillScheduler):
    """The scheduler with each drill's process replaced by an instant pass: the firing,
    its token and its closing are the real ones. Checks the token works while it runs."""

    auth: Authenticator
    live_tokens: int = 0

    async def _spawn(self, d: Any, token: str, key: str) -> tuple[str, int | None, dict[str, Any]]:
        me = await self.auth.authenticate(f"Bearer {token}")  # as the drill's calls are
        assert me.name.startswith("drill.minutely.") and me.groups == {"g"} and key == KEY
        self.live_tokens += 1
        return "passed", None, {"verdict": "pass", "reasons": []}


def test_a_day_of_minute_drills_leaves_no_drill_token(database: Database) -> None:
    """A `* * * * *` drill fires 1,440 times a day, each with a token of its own: every
    token is deleted as its firing closes, so `sluice token list` (the store's list_tokens)
    holds none of them after the day, and none piles up during it."""
    store = database.open()
    spec: PlatformSpec = load_spec_text(MINUTE_SPEC.replace("KEY]", f"{KEY}]")).spec
    start = at("2026-12-01T00:00:00")
    clock = ManualClock(start - 30)
    audited: list[tuple[str, str]] = []

    async def scenario() -> InstantDrills:
        async def audit(actor: str, action: str, target: str, reason: str, detail: object) -> None:
            audited.append((actor, action))

        s = InstantDrills(
            store,
            TokenAdmin(store, clock),
            EventLog(store, clock),
            audit,
            clock,
            home=Path("."),
            control_url="http://127.0.0.1:9",
            endpoint="http://127.0.0.1:9",
            environ={"DRILL_KEY": KEY},
        )
        s.auth = Authenticator(store, clock)
        await s.load()
        for minute in range(MINUTES):
            clock.advance(start + minute * 60 + 1 - clock.now())
            await s.tick(spec, clock.now())
            while any(x["running_fire"] for x in s.schedules(spec, clock.now())):
                await asyncio.sleep(0.001)  # the firing's own task closes it
            if minute % 360 == 0:  # none piles up during the day either
                assert [t.name for t in store.list_tokens() if t.name.startswith("drill.")] == []
        return s

    try:
        s = asyncio.run(scenario())
        fires = store.list_drill_fires(schedule="minutely", limit=2000)
        assert len(fires) == MINUTES and {f.status for f in fires} == {"passed"}
        assert s.live_tokens == MINUTES  # each drill ran with its own live token
        assert all(f.token and f.token.startswith("drill.minutely.") for f in fires)
        assert [t.name for t in store.list_tokens() if t.name.startswith("drill.")] == []
        assert store.list_tokens() == []  # nothing else was minted either
        actions = [a.action for a in store.list_audit(limit=10_000)]
        assert actions.count("token-create") == actions.count("token-delete") == MINUTES
    finally:
        store.close()


def test_nobody_else_may_mint_a_drill_token_name(database: Database) -> None:
    """A deleted drill token's name can never become somebody else's: `drill.` names are
    the scheduler's alone (its audit rows and firings keep naming one holder)."""
    store = database.open()
    tokens = TokenAdmin(store, ManualClock(1.0))
    admin = Principal("admin", Role.ADMIN, person="admin")
    try:
        with pytest.raises(Conflict, match="scheduled drills'"):
            asyncio.run(tokens.mint("drill.minutely.x", Role.OPERATOR, None, None, None, by=admin))
        asyncio.run(tokens.mint("drillbit", Role.OPERATOR, None, None, None, by=admin))
        assert [t.name for t in store.list_tokens()] == ["drillbit"]
    finally:
        store.close()
