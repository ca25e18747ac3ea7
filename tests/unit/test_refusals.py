"""Refused requests go on record, bounded (issue 31): one audit row per token, status and
request a minute, the refusals in between counted on the next row; a store that fails to
take the row changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from sluice.control.auth import Principal, Role
from sluice.control.refusals import PERIOD_S, RefusalAudit
from sluice.core import ManualClock

MALLORY = Principal(name="mallory-ops", role=Role.VIEWER, groups=frozenset({"a"}), person="mallory")


def test_a_refusal_loop_leaves_one_row_a_minute_with_the_rest_counted() -> None:
    rows: list[tuple[Any, ...]] = []

    async def append(*row: Any) -> None:
        rows.append(row)

    clock = ManualClock(1_000.0)
    audit = RefusalAudit(append, clock)

    async def loop() -> None:
        for _ in range(50):
            await audit.record(MALLORY, "POST /v1/groups/b/scale", 403, "scoped to a")
            clock.advance(1.0)
        await audit.record(MALLORY, "POST /v1/apply", 413, "over the cap")  # another request
        clock.advance(PERIOD_S)
        await audit.record(MALLORY, "POST /v1/groups/b/scale", 403, "scoped to a")

    asyncio.run(loop())
    scale = [r for r in rows if r[2] == "POST /v1/groups/b/scale"]
    assert len(scale) == 2 and len(rows) == 3
    actor, action, _, why, detail = scale[0]
    assert (actor, action, why) == ("mallory-ops", "request-refused", "scoped to a")
    assert detail == {
        "person": "mallory",
        "status": 403,
        "request": "POST /v1/groups/b/scale",
        "suppressed": 0,
    }
    assert scale[1][4]["suppressed"] == 49  # the loop's other tries, counted not written


def test_a_store_that_cannot_take_the_row_changes_nothing() -> None:
    async def broken(*_: Any) -> None:
        raise OSError("disk full")

    asyncio.run(RefusalAudit(broken, ManualClock(0.0)).record(MALLORY, "GET /v1/x", 403, "no"))
