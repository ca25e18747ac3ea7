"""Replica pins on a real store (SQLite, then PostgreSQL): a pin beats the count, survives a
restart of the control plane (a new `Pins` on the same store), and ends by itself, audited."""

from __future__ import annotations

import asyncio

from sluice.control.events import EventLog
from sluice.control.pins import Pins
from sluice.core import ManualClock
from sluice.store import Pin
from tests.databases import Database


def test_a_pin_holds_survives_a_restart_and_runs_out(database: Database) -> None:
    store = database.open()
    clock = ManualClock(1000.0)
    audited: list[tuple[str, str, str]] = []
    woken: list[bool] = []

    async def audit(actor: str, action: str, target: str, reason: str, detail: object) -> None:
        audited.append((actor, action, target))

    async def scenario() -> None:
        pins = Pins(store, EventLog(store, clock), audit, lambda: woken.append(True))
        held = await pins.hold("chat", 1, 60.0, "tess", "load test", 1000.0)
        assert held == Pin("chat", 1, "tess", "load test", 1000.0, 1060.0)
        assert pins.counts(1010.0) == {"chat": 1}
        again = Pins(store, EventLog(store, clock), audit, lambda: woken.append(True))  # restarted
        await again.load()
        assert again.counts(1059.0) == {"chat": 1}
        assert again.counts(1060.0) == {}  # the end is exclusive: it ran out
        await again.expire(1061.0, {"chat"})
        assert again.get("chat") is None and store.pins() == []

    try:
        asyncio.run(scenario())
    finally:
        store.close()
    assert audited == [("tess", "pin", "group/chat"), ("sluice", "unpin", "group/chat")]
    assert len(woken) == 2  # the pin and its end each wake the controller
