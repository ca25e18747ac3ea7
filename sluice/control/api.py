"""The control API (operators, CLI, console): groups, instances, scale, apply, audit, events.

Not on the request path, so FastAPI is fine here. Errors are the platform's error tree
rendered as `{"error": {...}}` with the error's HTTP status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from sluice.control.controller import Controller
from sluice.control.explain import explain_decisions
from sluice.control.review import ReviewBoard
from sluice.control.supervisor import InstanceSupervisor
from sluice.core import InstanceState, NotFound, SluiceError
from sluice.policy import route_rules
from sluice.spec import load_spec_text
from sluice.store import Store

__all__ = ["build_control_api"]


class ScaleRequest(BaseModel):
    replicas: int = Field(ge=0, le=1000)
    reason: str = Field(min_length=1, description="why; recorded in the audit log")
    actor: str = Field(min_length=1)


class FailoverRequest(BaseModel):
    to: str | None = Field(default=None, description="backup group; default: spec `backup`")
    reason: str = Field(min_length=1)
    actor: str = Field(min_length=1)


class RestoreRequest(BaseModel):
    reason: str = Field(min_length=1)
    actor: str = Field(min_length=1)


class RolloutRequest(BaseModel):
    reason: str = Field(min_length=1, description="why; recorded in the audit log")
    actor: str = Field(min_length=1)


class ApplyRequest(BaseModel):
    yaml: str
    source: str = "<api>"
    reason: str = Field(min_length=1)
    author: str = Field(min_length=1)


class ProposeRequest(BaseModel):
    yaml: str
    source: str = "<api>"
    reason: str = Field(min_length=1, description="why; recorded with the proposal")
    author: str = Field(min_length=1)


class ReviewRequest(BaseModel):
    reason: str = Field(min_length=1, description="why; recorded in the audit log")
    actor: str = Field(min_length=1)


def build_control_api(
    controller: Controller,
    supervisor: InstanceSupervisor,
    store: Store,
    data_plane: Callable[[], dict[str, Any]] | None = None,
    review: ReviewBoard | None = None,
) -> FastAPI:
    """`data_plane`, if given, reports the gateway's live state (queues, ejections);
    `review`, the proposal workflow (R5)."""
    app = FastAPI(title="Sluice control API", version="1")

    @app.exception_handler(SluiceError)
    async def _sluice_error(_: Request, exc: SluiceError) -> JSONResponse:
        return JSONResponse(exc.to_json(), status_code=exc.http_status)

    def require_group(group: str | None) -> None:
        """An unknown group name is a 404 everywhere, never an empty answer."""
        if group is not None and controller.spec.group(group) is None:
            known = ", ".join(g.name for g in controller.spec.groups)
            raise NotFound(f"no group named {group!r} (groups: {known})", group=group)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"status": "ok", "revision": controller.revision}

    @app.get("/v1/groups")
    async def groups() -> list[dict[str, Any]]:
        statuses = supervisor.statuses()
        out = []
        for g in controller.spec.groups:
            mine = [s for s in statuses if s.group == g.name]
            out.append(
                {
                    "name": g.name,
                    "owner": g.owner,
                    "business": g.business,
                    "alert_channel": g.alert_channel,
                    "models": {
                        k: {"runtime": m.runtime, "version": m.version} for k, m in g.models.items()
                    },
                    "resources": g.resources.model_dump(),
                    "max_concurrency": g.max_concurrency,
                    "desired": controller.desired_replicas(g.name),
                    "ready": sum(1 for s in mine if s.state is InstanceState.READY),
                    "instances": len(mine),
                    "template": g.template(),
                }
            )
        return out

    @app.get("/v1/instances")
    async def instances(group: str | None = None) -> list[dict[str, Any]]:
        require_group(group)
        return [
            {
                "id": s.id,
                "group": s.group,
                "state": s.state.value,
                "template": s.template,
                "url": s.url,
                "pid": s.pid,
                "created_at": s.created_at,
                "ready_at": s.ready_at,
                "reason": s.reason,
            }
            for s in sorted(supervisor.statuses(), key=lambda s: (s.group, s.created_at))
            if group is None or s.group == group
        ]

    @app.post("/v1/groups/{group}/scale")
    async def scale(group: str, body: ScaleRequest) -> dict[str, Any]:
        before = await controller.scale(group, body.replicas, body.actor, body.reason)
        return {"group": group, "from": before, "to": body.replicas}

    @app.post("/v1/groups/{group}/failover")
    async def failover(group: str, body: FailoverRequest) -> dict[str, Any]:
        to = await controller.failover(group, body.to, body.actor, body.reason)
        return {"group": group, "to": to}

    @app.post("/v1/groups/{group}/restore")
    async def restore(group: str, body: RestoreRequest) -> dict[str, Any]:
        backup = await controller.restore(group, body.actor, body.reason)
        return {"group": group, "from": backup, "changed": backup is not None}

    @app.get("/v1/routes")
    async def routes() -> dict[str, Any]:
        rules = [
            {
                "tag": r.tag,
                "to": [{"group": g, "weight": w} for g, w in r.targets],
                "tenants": sorted(r.tenants),
                "models": sorted(r.models),
                "priorities": sorted(r.priorities),
                "headers": dict(r.headers),
                "header_prefixes": dict(r.header_prefixes),
                "fallback": list(r.fallback),
                "mirror": {"group": r.mirror[0], "percent": r.mirror[1]} if r.mirror else None,
            }
            for r in route_rules(controller.spec)
        ]
        return {"rules": rules, "failovers": controller.failovers}

    @app.get("/v1/groups/{group}/explain")
    async def explain(group: str, limit: int = 10) -> dict[str, Any]:
        """S11: the latest scaling decisions with their signals, launches and traffic."""
        state = controller.explain_state(group)
        decisions = await asyncio.to_thread(store.list_decisions, group=group, limit=limit)
        oldest = decisions[-1].at if decisions else 0.0
        found = await asyncio.to_thread(store.list_events, group=group, limit=2000)
        served = (data_plane() if data_plane is not None else {}).get("served", {})
        recent = [e for e in found if e.at >= oldest]
        return {"group": group, **state, "decisions": explain_decisions(decisions, recent, served)}

    @app.post("/v1/rollouts/{name}/{action}")
    async def rollout_action(name: str, action: str, body: RolloutRequest) -> dict[str, Any]:
        """start | pause | resume | promote | abort, audited."""
        return await controller.rollout(name, action, body.actor, body.reason)

    @app.get("/v1/rollouts")
    async def rollouts() -> list[dict[str, Any]]:
        """Every rollout in the spec with its latest run (phase, step, percent)."""
        out = []
        for rs in controller.spec.rollouts:
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

    @app.get("/v1/rollouts/{name}")
    async def rollout_report(name: str, run: int | None = None) -> dict[str, Any]:
        """The archived run (newest, or `run`), with the live state of a running one: its
        timeline, every step's analysis numbers, the compare report, the conclusion."""
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

    def board() -> ReviewBoard:
        if review is None:
            raise NotFound("this control API has no review workflow configured")
        return review

    @app.post("/v1/proposals")
    async def propose(body: ProposeRequest) -> dict[str, Any]:
        """R5: record a spec change for review, with its diff and impact preview."""
        loaded = load_spec_text(body.yaml, body.source)
        return (await board().propose(loaded, body.author, body.reason)).to_json()

    @app.get("/v1/proposals")
    async def proposals(all: bool = False, limit: int = 50) -> list[dict[str, Any]]:
        """Pending proposals (every one with `all`), newest first."""
        return [p.to_json() for p in await board().proposals(all, limit)]

    @app.get("/v1/proposals/{proposal_id}")
    async def proposal(proposal_id: int) -> dict[str, Any]:
        return (await board().get(proposal_id)).to_json()

    @app.post("/v1/proposals/{proposal_id}/approve")
    async def approve(proposal_id: int, body: ReviewRequest) -> dict[str, Any]:
        """Apply it as a new revision; 409 for its author or if it is stale."""
        return (await board().approve(proposal_id, body.actor, body.reason)).to_json()

    @app.post("/v1/proposals/{proposal_id}/reject")
    async def reject(proposal_id: int, body: ReviewRequest) -> dict[str, Any]:
        return (await board().reject(proposal_id, body.actor, body.reason)).to_json()

    @app.get("/v1/quota")
    async def quota(
        window_s: Annotated[float, Query(gt=0, description="under-use window")] = 3600.0,
        below: Annotated[float, Query(gt=0, le=1, description="share of guarantee")] = 0.5,
    ) -> dict[str, Any]:
        """Pools, each group's quota and use, the loan ledger, spend, under-used groups."""
        return await controller.quota_report(window_s, below)

    @app.get("/v1/dataplane")
    async def dataplane() -> dict[str, Any]:
        return data_plane() if data_plane is not None else {}

    @app.post("/v1/revisions")
    async def apply(body: ApplyRequest) -> dict[str, Any]:
        loaded = load_spec_text(body.yaml, body.source)
        rev = await controller.apply(loaded, body.author, body.reason)
        if rev is None:
            return {"revision": controller.revision, "changed": False}
        return {"revision": rev.number, "changed": True, "diff": rev.diff}

    @app.get("/v1/revisions")
    async def revisions(limit: int = 20) -> list[dict[str, Any]]:
        revs = await asyncio.to_thread(store.list_revisions, limit)
        return [r.to_json() for r in revs]

    @app.get("/v1/audit")
    async def audit(target: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        entries = await asyncio.to_thread(store.list_audit, target=target, limit=limit)
        return [e.to_json() for e in entries]

    @app.get("/v1/events")
    async def events(group: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        found = await asyncio.to_thread(store.list_events, group=group, limit=limit)
        if not found:  # a group removed from the spec keeps its history
            require_group(group)
        return [e.to_json() for e in found]

    return app
