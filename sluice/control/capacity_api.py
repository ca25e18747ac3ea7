"""The capacity routes on the control API (O4, O5): pins that hold a group at a count while
`sluice loadtest` measures it, the stored reports of load tests and drills, per group and
model version, and the scheduled drills. The tests themselves run in the CLI
(`sluice.tools`), outside the control plane: it records what they found, with the caller
as the actor, and starts scheduled drills as CLI processes (`control.drills`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import ConfigDict, Field

from sluice.control.api_deps import Limit, Me, RowId
from sluice.control.auth import Role
from sluice.control.bodies import TextBody, model_body
from sluice.control.capacity_watch import StaleTargets
from sluice.control.controller import Controller
from sluice.control.drills import DrillScheduler, drill_named
from sluice.control.guard import guarded
from sluice.control.pins import MAX_PIN_S
from sluice.core import Forbidden, NotFound
from sluice.store import Store

__all__ = ["MAX_REPORT_BYTES", "capacity_routes"]

MAX_REPORT_BYTES = 4 << 20
"""A drill's report is about a kilobyte a minute of timeline; 4 MiB is hours of it."""


class PinRequest(TextBody):
    model_config = ConfigDict(str_max_length=4096)
    replicas: int = Field(ge=0, le=1000)
    for_s: float = Field(gt=0, le=MAX_PIN_S, description="the pin ends by itself after this")
    reason: str = Field(min_length=1)


class UnpinRequest(TextBody):
    model_config = ConfigDict(str_max_length=4096)
    reason: str = Field(min_length=1)


class HandBackRequest(TextBody):
    model_config = ConfigDict(str_max_length=4096)
    replicas: int = Field(ge=0, le=1000, description="the count the test found the group at")
    reason: str = Field(min_length=1)


class RunReport(TextBody):
    model_config = ConfigDict(str_max_length=1 << 20)
    kind: Literal["loadtest", "drill"]
    mode: Literal["live", "simulated"]
    verdict: str = Field(min_length=1, max_length=32)
    report: dict[str, Any]


def capacity_routes(
    api: APIRouter,
    controller: Controller,
    store: Store,
    now: Callable[[], float],
    drills: DrillScheduler | None = None,
    stale: StaleTargets | None = None,
) -> None:
    """Add the pin, capacity-report and scheduled-drill routes to `api` (before the app
    includes it); without `drills` the schedules are listed but never run; `stale` checks
    each recorded load test against the group's last one (its answer's `stale`)."""

    @api.post("/v1/groups/{group}/pin")
    @guarded(Role.OPERATOR)
    async def pin(group: str, body: PinRequest, me: Me) -> dict[str, Any]:
        """Hold the group at `replicas` for `for_s` seconds, whatever its autoscaler says."""
        me.require(Role.OPERATOR, f"pinning {group}", groups=(group,))
        held = await controller.pin(group, body.replicas, body.for_s, me.name, body.reason)
        return held.to_json()

    @api.post("/v1/groups/{group}/unpin")
    @guarded(Role.OPERATOR)
    async def unpin(group: str, body: UnpinRequest, me: Me) -> dict[str, Any]:
        me.require(Role.OPERATOR, f"unpinning {group}", groups=(group,))
        controller.group(group)
        lifted = await controller.pins.lift(group, me.name, body.reason)
        return {"group": group, "lifted": lifted.to_json() if lifted else None}

    @api.post("/v1/groups/{group}/hand-back")
    @guarded(Role.OPERATOR)
    async def hand_back(group: str, body: HandBackRequest, me: Me) -> dict[str, Any]:
        """After a drill: the group's autoscaler starts afresh from `replicas` (the count
        the drill found it at), so the drill's peak no longer holds instances."""
        me.require(Role.OPERATOR, f"handing {group} back", groups=(group,))
        return await controller.hand_back(group, body.replicas, me.name, body.reason)

    @api.post("/v1/groups/{group}/capacity")
    @guarded(Role.OPERATOR, MAX_REPORT_BYTES)
    async def record(group: str, request: Request, me: Me) -> dict[str, Any]:
        """Keep a load test's or drill's report under the group's current model version."""
        me.require(Role.OPERATOR, f"recording a capacity run of {group}", groups=(group,))
        g = controller.group(group)
        body = await model_body(request, RunReport, MAX_REPORT_BYTES, "a capacity report")
        run_id = await asyncio.to_thread(
            store.add_capacity_run,
            kind=body.kind,
            group=group,
            version=g.version_label(),
            mode=body.mode,
            verdict=body.verdict,
            actor=me.name,
            now=now(),
            report=body.report,
        )
        stored = await asyncio.to_thread(store.get_capacity_run, run_id)
        if body.kind == "loadtest":  # it may hold a fit the group is sized on
            controller.fits.recorded()
        out = stored.to_json(False)
        if stale is not None and body.kind == "loadtest" and body.mode == "live":
            out["stale"] = await stale.check(g, stored, me.name, now())
        return out

    @api.get("/v1/groups/{group}/capacity")
    async def runs(
        group: str,
        kind: Annotated[Literal["loadtest", "drill"] | None, Query()] = None,
        limit: Limit = 20,
        reports: bool = False,
    ) -> list[dict[str, Any]]:
        """The group's load tests and drills, newest first (`reports`: with each report)."""
        controller.group(group)
        found = await asyncio.to_thread(
            store.list_capacity_runs, group=group, kind=kind, limit=limit
        )
        return [r.to_json(reports) for r in found]

    @api.get("/v1/capacity/{run_id}")
    async def run(run_id: RowId, me: Me) -> dict[str, Any]:
        """One load test's or drill's report (a token scoped to groups: of its groups)."""
        found = await asyncio.to_thread(store.get_capacity_run, run_id)
        if not me.sees(found.group):
            raise Forbidden(
                f"reading capacity run {run_id}: token {me.name!r} may read only group(s) "
                f"{', '.join(sorted(me.groups or ()))}, and this run is of another group",
                run=run_id,
            )
        return found.to_json()

    @api.get("/v1/drills")
    async def schedules(me: Me) -> list[dict[str, Any]]:
        """The spec's scheduled drills: next firing, the one running, the last one's end (a
        token scoped to groups: its groups' drills)."""
        spec = controller.spec
        found = drills.schedules(spec, now()) if drills is not None else []
        found = [entry for entry in found if me.sees(entry["group"])]
        for entry in found:
            last = await asyncio.to_thread(store.list_drill_fires, schedule=entry["name"], limit=1)
            entry["last"] = last[0].to_json() if last else None
        return found

    @api.get("/v1/drills/fires")
    async def fires(me: Me, schedule: str | None = None, limit: Limit = 20) -> list[dict[str, Any]]:
        """Drill firings, newest first (a token scoped to groups: its groups')."""
        scope = None if me.groups is None else sorted(me.groups)
        found = await asyncio.to_thread(
            store.list_drill_fires, schedule=schedule, limit=limit, groups=scope
        )
        return [f.to_json() for f in found]

    @api.post("/v1/drills/{name}/run")
    @guarded(Role.OPERATOR)
    async def run_now(name: str, me: Me) -> dict[str, Any]:
        """Fire a scheduled drill now (as `kubectl create job --from=cronjob/...`)."""
        spec = controller.spec
        d = drill_named(spec, name)
        if drills is None:
            raise NotFound("this control API runs no drill schedules", drill=name)
        me.require(Role.OPERATOR, f"running drill {name} on {d.group}", groups=(d.group,))
        return await drills.fire(spec, name, "manual", me.name, now())
