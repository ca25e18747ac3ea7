"""The groups' routes on the control API: what each group is (its spec, its instances), the
operator's levers on it (scale, failover and restore, and the route rules they bend) and
why it is at its count (S11 explain, O3 history). A token scoped to groups reads and acts
on its own groups only."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import Field

from sluice.control.api_deps import Limit, Me, require_group
from sluice.control.auth import Role
from sluice.control.bodies import TextBody
from sluice.control.controller import Controller
from sluice.control.explain import advisory_view, explain_decisions
from sluice.control.guard import guarded
from sluice.control.observer import stored_history
from sluice.core import InstanceState, InstanceStatus, SpecError, SpecIssue
from sluice.core.urls import redact_channel
from sluice.policy import route_rules
from sluice.store import Store

__all__ = ["FailoverRequest", "RestoreRequest", "ScaleRequest", "group_routes"]


class ScaleRequest(TextBody):
    replicas: int = Field(ge=0, le=1000)
    reason: str = Field(min_length=1, description="why; recorded in the audit log")


class FailoverRequest(TextBody):
    to: str | None = Field(default=None, description="backup group; default: spec `backup`")
    reason: str = Field(min_length=1)


class RestoreRequest(TextBody):
    reason: str = Field(min_length=1)


def group_routes(
    api: APIRouter,
    controller: Controller,
    statuses: Callable[[], Sequence[InstanceStatus]],
    store: Store,
    data_plane: Callable[[], dict[str, Any]] | None,
    now: Callable[[], float],
) -> None:
    """Add the group, instance, scale, failover, route-rule, explain and history routes to
    `api`. `statuses`: the supervised instances; `data_plane`: the gateways' live state
    (explain shows what each instance served); `now`: history's default window ends now."""

    @api.get("/v1/groups")
    async def groups(me: Me) -> list[dict[str, Any]]:
        """Every group (a token scoped to groups: its own)."""
        found = statuses()
        out = []
        for g in controller.spec.groups:
            if not me.sees(g.name):
                continue
            mine = [s for s in found if s.group == g.name]
            out.append(
                {
                    "name": g.name,
                    "owner": g.owner,
                    "business": g.business,
                    "alert_channel": redact_channel(g.alert_channel),
                    "models": {
                        k: {"runtime": m.runtime, "version": m.version} for k, m in g.models.items()
                    },
                    "resources": g.resources.model_dump(),
                    "version": g.version_label(),
                    "max_concurrency": g.max_concurrency,
                    "replicas": g.replicas,
                    "autoscaling": g.autoscaling.model_dump() if g.autoscaling else None,
                    "backup": g.backup,
                    "desired": controller.desired_replicas(g.name),
                    "ready": sum(1 for s in mine if s.state is InstanceState.READY),
                    "instances": len(mine),
                    "template": g.template(),
                }
            )
        return out

    @api.get("/v1/groups/{group}/spec")
    async def group_spec(group: str) -> dict[str, Any]:
        """The group's part of the live spec: what a token scoped to the group may read of
        it (a drill plans from it); the whole spec is `/v1/revisions`, for unscoped tokens.
        A webhook channel shows only where it points, as everywhere, and a command server's
        `env` only its names (its values are sealed at rest: they may be credentials)."""
        g = controller.group(group)
        doc = g.model_dump(mode="json")
        doc["alert_channel"] = redact_channel(g.alert_channel)
        for model in doc["models"].values():
            if model.get("command"):
                model["command"]["env"] = dict.fromkeys(model["command"]["env"], "…")
        return doc

    @api.get("/v1/instances")
    async def instances(me: Me, group: str | None = None) -> list[dict[str, Any]]:
        me.require_sees(group, "reading instances")
        if group is not None:
            require_group(controller.spec, group)
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
                "devices": s.labels.get("devices", ""),
                "tier": controller.tier(s.id),
                "asleep": controller.asleep(s.id),
                "units_lent": controller.units_lent(s.id),
                "accelerator": controller.accelerators.instance_json(s.id),
            }
            for s in sorted(statuses(), key=lambda s: (s.group, s.created_at))
            if (group is None or s.group == group) and me.sees(s.group)
        ]

    @api.post("/v1/groups/{group}/scale")
    @guarded(Role.OPERATOR)
    async def scale(group: str, body: ScaleRequest, me: Me) -> dict[str, Any]:
        me.require(Role.OPERATOR, f"scaling {group}", groups=(group,))
        before = await controller.scale(group, body.replicas, me.name, body.reason)
        return {"group": group, "from": before, "to": body.replicas}

    @api.post("/v1/groups/{group}/failover")
    @guarded(Role.OPERATOR)
    async def failover(group: str, body: FailoverRequest, me: Me) -> dict[str, Any]:
        source = controller.spec.group(group)
        to = body.to if body.to is not None else (source.backup if source else None)
        me.require(
            Role.OPERATOR, f"failing {group} over", groups=(group,) if to is None else (group, to)
        )
        to = await controller.failover(group, body.to, me.name, body.reason)
        return {"group": group, "to": to}

    @api.post("/v1/groups/{group}/restore")
    @guarded(Role.OPERATOR)
    async def restore(group: str, body: RestoreRequest, me: Me) -> dict[str, Any]:
        me.require(Role.OPERATOR, f"restoring {group}", groups=(group,))
        backup = await controller.restore(group, me.name, body.reason)
        return {"group": group, "from": backup, "changed": backup is not None}

    @api.get("/v1/routes")
    async def routes(me: Me) -> dict[str, Any]:
        """The routing rules and live failovers (a token scoped to groups: the rules that
        send to, fall back to or mirror one of its groups, and its groups' failovers)."""
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
            if any(
                me.sees(g)
                for g in (
                    *(g for g, _ in r.targets),
                    *r.fallback,
                    *((r.mirror[0],) if r.mirror else ()),
                )
            )
        ]
        failovers = {g: to for g, to in controller.failovers.items() if me.sees(g)}
        return {"rules": rules, "failovers": failovers}

    @api.get("/v1/groups/{group}/explain")
    async def explain(group: str, limit: Limit = 10) -> dict[str, Any]:
        """S11: the latest scaling decisions with their signals, launches and traffic."""
        state = controller.explain_state(group)
        decisions = await asyncio.to_thread(store.list_decisions, group=group, limit=limit)
        oldest = decisions[-1].at if decisions else 0.0
        found = await asyncio.to_thread(store.list_events, group=group, limit=2000)
        served = (data_plane() if data_plane is not None else {}).get("served", {})
        recent = [e for e in found if e.at >= oldest]
        view = advisory_view(state, decisions, found, limit)
        followups = [e.to_json() for e in found if e.kind == "followup"][:limit]
        return {
            "group": group,
            **view,
            "followups": followups,
            "decisions": explain_decisions(decisions, recent, served),
        }

    @api.get("/v1/history")
    async def history(
        me: Me,
        group: Annotated[list[str] | None, Query()] = None,
        since: Annotated[float | None, Query(ge=0)] = None,
        until: Annotated[float | None, Query(ge=0)] = None,
        step_s: Annotated[int, Query(ge=60, le=366 * 86_400)] = 60,
    ) -> dict[str, Any]:
        """O3: each group's series, `step_s` apart (default: the last hour, by minute);
        quantiles are merged from the stored histograms. A token scoped to groups reads
        only its groups' (all of them when it names none)."""
        for g in group or ():
            me.require_sees(g, "reading history")
            require_group(controller.spec, g)
        if group is None and me.groups is not None:
            group = sorted(me.groups)
        end = until if until is not None else now()
        start = since if since is not None else end - 3600.0
        if end <= start:
            raise SpecError([SpecIssue("until", f"{end:g} must be after since ({start:g})")])
        if (end - start) / step_s > 20_000:
            points = f"{(end - start) / step_s:.0f} points; at most 20000: use a larger step"
            raise SpecError([SpecIssue("step_s", points)])
        spec = controller.spec
        return await asyncio.to_thread(stored_history, store, spec, group, start, end, step_s)
