"""The rollouts' routes on the control API: act on a rollout (start, pause, resume, promote,
abort), list them, read one's plan and its archived runs. The rollout itself runs in the
controller (`control.rollouts`); a token scoped to groups reaches the rollouts whose
baseline or canary is one of its groups."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import Field

from sluice.control.api_deps import Me
from sluice.control.auth import Principal, Role
from sluice.control.bodies import TextBody
from sluice.control.controller import Controller
from sluice.control.guard import guarded
from sluice.core import Forbidden, NotFound
from sluice.store import Store

__all__ = ["RolloutRequest", "rollout_routes"]


class RolloutRequest(TextBody):
    reason: str = Field(min_length=1, description="why; recorded in the audit log")


def rollout_routes(api: APIRouter, controller: Controller, store: Store) -> None:
    """Add `POST /v1/rollouts/{name}/{action}` and the rollouts' reads to `api`; `store`
    keeps every run's record (`list_rollouts`)."""

    @api.post("/v1/rollouts/{name}/{action}")
    @guarded(Role.OPERATOR)
    async def rollout_action(
        name: str, action: str, body: RolloutRequest, me: Me
    ) -> dict[str, Any]:
        """start | pause | resume | promote | abort, audited."""
        rs = next((r for r in controller.spec.rollouts if r.name == name), None)
        groups = (rs.baseline, rs.canary) if rs is not None else ()
        me.require(Role.OPERATOR, f"rollout {action} of {name}", groups=groups)
        return await controller.rollout(name, action, me.name, body.reason)

    def require_rollout_seen(me: Principal, name: str) -> None:
        """Forbidden unless `me` sees the rollout's baseline or canary (a rollout not in
        the spec: only an unscoped token reads what is left of it)."""
        if not me.scoped:
            return
        rs = next((r for r in controller.spec.rollouts if r.name == name), None)
        if rs is None or not (me.sees(rs.baseline) or me.sees(rs.canary)):
            raise Forbidden(
                f"reading rollout {name}: token {me.name!r} may read only group(s) "
                f"{', '.join(sorted(me.groups or ()))}, and this rollout is of none of them",
                rollout=name,
            )

    @api.get("/v1/rollouts")
    async def rollouts(me: Me) -> list[dict[str, Any]]:
        """Every rollout in the spec with its latest run (phase, step, percent); a token
        scoped to groups: those whose baseline or canary is one of them."""
        out = []
        for rs in controller.spec.rollouts:
            if not (me.sees(rs.baseline) or me.sees(rs.canary)):
                continue
            runs = await asyncio.to_thread(store.list_rollouts, name=rs.name, limit=1)
            live = controller.rollout_live(rs.name)
            state = live if live is not None else (runs[0].state if runs else None)
            out.append(
                {
                    "name": rs.name,
                    "baseline": rs.baseline,
                    "canary": rs.canary,
                    "run": runs[0].id if runs else None,
                    "phase": state["phase"] if state else "not started",
                    "percent": state["percent"] if state else 0.0,
                    "conclusion": runs[0].conclusion if runs else "",
                }
            )
        return out

    @api.get("/v1/rollouts/{name}/plan")
    async def rollout_plan(name: str, me: Me) -> dict[str, Any]:
        """The rollout's design (false-rollback budget, looks, answers each step needs and
        which criterion sets them) and, at the baseline's traffic of the last minute, how
        long each step and the whole rollout will take."""
        require_rollout_seen(me, name)
        return controller.rollout_plan(name)

    @api.get("/v1/rollouts/{name}")
    async def rollout_report(name: str, me: Me, run: int | None = None) -> dict[str, Any]:
        """The archived run (newest, or `run`), with the live state of a running one: its
        timeline, every step's analysis numbers, the compare report, the conclusion."""
        require_rollout_seen(me, name)
        runs = await asyncio.to_thread(store.list_rollouts, name=name, limit=200)
        chosen = next((r for r in runs if run is None or r.id == run), None)
        if chosen is None:
            raise NotFound(f"rollout {name!r} has no run" + (f" {run}" if run else ""))
        report = chosen.to_json()
        live = controller.rollout_live(name)
        if live is not None and run in (None, chosen.id):
            report["state"] = live
        report["runs"] = [{"id": r.id, "phase": r.phase, "started_at": r.started_at} for r in runs]
        return report
