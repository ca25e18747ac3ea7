"""The control API (operators, CLI, console): groups, instances, scale, apply, audit, events.

Not on the request path, so FastAPI is fine here. Errors are the platform's error tree
rendered as `{"error": {...}}` with the error's HTTP status. A store that cannot be reached
or written (PostgreSQL away, SQLite locked, read-only or full) is a 503 `store_unavailable`
naming the store (never its password) with a `Retry-After`, not a 500: the gateways keep
serving their last routes meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import Field
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.control.auth import (
    CSRF_HEADER,
    SESSION_COOKIE,
    Authenticator,
    Principal,
    Role,
    csrf_matches,
)
from sluice.control.bodies import TextBody
from sluice.control.console import is_console_path, mount_console
from sluice.control.controller import Controller
from sluice.control.explain import advisory_view, explain_decisions
from sluice.control.guard import SPEC_BODY, ControlGuard, guarded
from sluice.control.observer import stored_history
from sluice.control.refusals import RefusalAudit
from sluice.control.review import ReviewBoard
from sluice.control.spec_work import offload
from sluice.control.supervisor import InstanceSupervisor
from sluice.control.tokens import TokenAdmin
from sluice.core import Forbidden, InstanceState, NotFound, SluiceError, SpecError, SpecIssue
from sluice.core.urls import redact_channel
from sluice.policy import route_rules
from sluice.spec import parse_spec
from sluice.spec.names import Name
from sluice.store import Proposal, Store, store_unavailable

__all__ = ["build_control_api"]


RowId = Annotated[int, Path(ge=1, le=2**63 - 1)]
"""A store row id (SQLite INTEGER): larger ones cannot exist, and SQLite refuses to bind them."""
GroupName = Name


class ScaleRequest(TextBody):
    replicas: int = Field(ge=0, le=1000)
    reason: str = Field(min_length=1, description="why; recorded in the audit log")


class FailoverRequest(TextBody):
    to: str | None = Field(default=None, description="backup group; default: spec `backup`")
    reason: str = Field(min_length=1)


class RestoreRequest(TextBody):
    reason: str = Field(min_length=1)


class RolloutRequest(TextBody):
    reason: str = Field(min_length=1, description="why; recorded in the audit log")


class ApplyRequest(TextBody):
    nul_read_by_its_parser = frozenset({"yaml"})
    yaml: str
    source: str = "<api>"
    reason: str = Field(min_length=1)


class ProposeRequest(TextBody):
    nul_read_by_its_parser = frozenset({"yaml"})
    yaml: str
    source: str = "<api>"
    reason: str = Field(min_length=1, description="why; recorded with the proposal")


class ReviewRequest(TextBody):
    reason: str = Field(min_length=1, description="why; recorded in the audit log")


class TokenRequest(TextBody):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
    role: Role
    groups: list[GroupName] | None = Field(
        default=None, min_length=1, description="scope: only these groups"
    )
    expires_in_s: float | None = Field(default=None, gt=0, le=10 * 365 * 86400)
    owner: str | None = Field(
        default=None,
        min_length=1,
        max_length=254,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$",
        description="the person it belongs to (e-mail or name); default: the minter's "
        "person (see sluice.control.tokens for who may mint for whom)",
    )


async def _principal(request: Request) -> Principal:
    """The caller, authenticated by the middleware before anything else of the request is
    read (so no body is parsed and no handler runs for a caller without a valid token)."""
    principal: Principal = request.state.principal
    return principal


Me = Annotated[Principal, Depends(_principal)]
Limit = Annotated[int, Query(ge=1, le=100_000, description="at most this many, newest first")]


def build_control_api(
    controller: Controller,
    supervisor: InstanceSupervisor,
    store: Store,
    tokens: TokenAdmin,
    allowed_hosts: Collection[str],
    data_plane: Callable[[], dict[str, Any]] | None = None,
    review: ReviewBoard | None = None,
    metrics: Callable[[], tuple[bytes, str]] | None = None,
    housekeeping: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    more_routes: Callable[[APIRouter], None] | None = None,
) -> FastAPI:
    """Every route but `/healthz` needs a token (`tokens`); a request whose `Host` is not
    one of `allowed_hosts` (DNS rebinding) is refused before routing. `data_plane`, if
    given, reports the gateway's live state; `review`, the proposal workflow (R5);
    `metrics`, the gateway's Prometheus text (served here, behind a viewer token);
    `housekeeping`, one retention pass (`sluice gc`); `more_routes` adds routes behind
    the same authentication (the alerts': `sluice.control.alerts_api`)."""
    app = FastAPI(
        title="Sluice control API", version="1", docs_url=None, redoc_url=None, openapi_url=None
    )
    authenticator = Authenticator(store, tokens.clock)
    api = APIRouter(dependencies=[Depends(_principal)])

    async def caller(request: Request) -> Principal:
        principal = await _caller(request, authenticator)
        _gateway_only_syncs(principal, request.url.path)
        return principal

    refusals = RefusalAudit(lambda *row: controller.audit(*row), tokens.clock)
    app.add_middleware(
        ControlGuard,
        hosts=allowed_hosts,
        caller=caller,
        exempt=lambda path: path == "/healthz" or is_console_path(path),  # the console logs in
        routes=lambda: api.routes,  # every guarded route is on `api`
        on_refused=refusals.record,
    )

    @app.exception_handler(SluiceError)
    async def _sluice_error(request: Request, exc: SluiceError) -> JSONResponse:
        """A 403 inside a route (another team's group, another gateway's id) goes on record
        too, unless the route audited it already (`detail.audited`, an approval refused)."""
        principal = getattr(request.state, "principal", None)
        if exc.http_status == 403 and principal is not None and not exc.detail.get("audited"):
            what = f"{request.method} {request.url.path}"
            await refusals.record(principal, what, 403, exc.message)
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}
        code = codes.get(exc.status_code, "http_error")
        body = {"error": {"code": code, "message": str(exc.detail)}}
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)

    async def _store_error(_: Request, exc: Exception) -> JSONResponse:
        """The store cannot be reached or written: 503 naming it, and (a write refused) the
        controller's status turns degraded until a write goes through again. Any other
        database error is a bug: raised on, a 500 with its traceback in the log."""
        outage = store_unavailable(exc, store.location)
        if outage is None:
            raise exc
        controller.store_refused(exc)
        return _error_response(outage)

    for kind in (DBAPIError, PoolTimeout, sqlite3.OperationalError):
        app.add_exception_handler(kind, _store_error)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        issues = [
            {"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in exc.errors()
        ]
        text = "; ".join(f"{i['field']}: {i['message']}" for i in issues)
        body = {"error": {"code": "invalid_request", "message": text, "issues": issues}}
        return JSONResponse(body, status_code=422)

    def require_group(group: str | None) -> None:
        """An unknown group name is a 404 everywhere, never an empty answer."""
        if group is not None and controller.spec.group(group) is None:
            known = ", ".join(g.name for g in controller.spec.groups)
            raise NotFound(f"no group named {group!r} (groups: {known})", group=group)

    async def visible_audit_targets(me: Principal) -> list[str]:
        """The audit targets a token scoped to groups may read: its groups, the rollouts
        of its groups (baseline or canary) and its own person's proposals."""
        mine = sorted(me.groups or ())
        targets = [f"group/{g}" for g in mine]
        targets += [
            f"rollout/{rs.name}"
            for rs in controller.spec.rollouts
            if me.sees(rs.baseline) or me.sees(rs.canary)
        ]
        if review is not None:
            found = await review.proposals(True, 100_000)
            targets += [f"proposal/{p.id}" for p in found if own_proposal(me, p)]
        return targets

    def scoped_data_plane(me: Principal, found: dict[str, Any]) -> dict[str, Any]:
        """The data plane's state with only `me`'s groups and their instances (an instance
        no longer supervised is nobody's)."""
        mine = {s.id for s in supervisor.statuses() if me.sees(s.group)}
        out = dict(found)
        if isinstance(found.get("groups"), dict):
            out["groups"] = {g: v for g, v in found["groups"].items() if me.sees(g)}
        for key in ("served", "in_flight"):
            if isinstance(found.get(key), dict):
                out[key] = {i: n for i, n in found[key].items() if i in mine}
        if isinstance(found.get("routes"), dict):
            routes = {
                tag: {g: n for g, n in by_group.items() if me.sees(g)}
                for tag, by_group in found["routes"].items()
                if isinstance(by_group, dict)
            }
            out["routes"] = {tag: by_group for tag, by_group in routes.items() if by_group}
        return out

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """Unauthenticated: ok or degraded, nothing more (why is in `/v1/status`)."""
        return {
            "status": "degraded" if controller.degraded else "ok",
            "revision": controller.revision,
        }

    @api.get("/v1/status")
    async def status(me: Me) -> dict[str, Any]:
        """ok or degraded and why (the store refuses writes, ticks fail), the controller's
        tick counters and last error, the store's state, the sample poller's (a token scoped
        to groups sees only its groups' instances)."""
        statuses = supervisor.statuses()
        out = {**controller.status(), "instances": len(statuses)}
        if me.scoped:
            mine = {s.id for s in statuses if me.sees(s.group)}
            out["instances"] = len(mine)
            servers = dict(out.get("servers") or {})
            if isinstance(servers.get("instances"), dict):
                servers["instances"] = {
                    k: v for k, v in servers["instances"].items() if me.sees(v.get("group", ""))
                }
                out["servers"] = servers
            samples = dict(out.get("samples") or {})
            if isinstance(samples.get("failing"), dict):
                samples["failing"] = {k: v for k, v in samples["failing"].items() if k in mine}
                out["samples"] = samples
        return out

    @api.get("/v1/groups")
    async def groups(me: Me) -> list[dict[str, Any]]:
        """Every group (a token scoped to groups: its own)."""
        statuses = supervisor.statuses()
        out = []
        for g in controller.spec.groups:
            if not me.sees(g.name):
                continue
            mine = [s for s in statuses if s.group == g.name]
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
                "devices": s.labels.get("devices", ""),
                "tier": controller.tier(s.id),
            }
            for s in sorted(supervisor.statuses(), key=lambda s: (s.group, s.created_at))
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
            require_group(g)
        if group is None and me.groups is not None:
            group = sorted(me.groups)
        end = until if until is not None else tokens.clock.now()
        start = since if since is not None else end - 3600.0
        if end <= start:
            raise SpecError([SpecIssue("until", f"{end:g} must be after since ({start:g})")])
        if (end - start) / step_s > 20_000:
            points = f"{(end - start) / step_s:.0f} points; at most 20000: use a larger step"
            raise SpecError([SpecIssue("step_s", points)])
        spec = controller.spec
        return await asyncio.to_thread(stored_history, store, spec, group, start, end, step_s)

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

    def board() -> ReviewBoard:
        if review is None:
            raise NotFound("this control API has no review workflow configured")
        return review

    @contextlib.asynccontextmanager
    async def audited_refusal(me: Principal, action: str) -> AsyncIterator[None]:
        """A spec refused at `apply` or `propose` (a weak key, a bad line, one over the
        cap) is audited as `<action>-refused` with what was wrong, then answered 422: the
        attempt is on record, and nothing of it was applied. The issues never quote a
        secret (see `sluice.spec.keys.SECRET_FIELDS`)."""
        try:
            yield
        except SpecError as exc:
            issues = [str(i) for i in exc.issues]
            more = f" (and {len(issues) - 3} more)" if len(issues) > 3 else ""
            why = "; ".join(issues[:3])[:1000] + more
            detail = {"person": me.person, "issues": len(issues)}
            await controller.audit(me.name, f"{action}-refused", "spec", why, detail)
            raise

    @api.post("/v1/proposals")
    @guarded(Role.OPERATOR, SPEC_BODY)
    async def propose(body: ProposeRequest, me: Me) -> dict[str, Any]:
        """R5: record a spec change for review, with its diff and impact preview."""
        me.require(Role.OPERATOR, "proposing a spec change")
        async with audited_refusal(me, "propose"):
            loaded = await offload(parse_spec, body.yaml, body.source)
            proposal = await board().propose(loaded, me.name, body.reason, person=me.person)
        return proposal.to_json()

    @api.get("/v1/proposals")
    async def proposals(me: Me, all: bool = False, limit: Limit = 50) -> list[dict[str, Any]]:
        """Pending proposals (every one with `all`), newest first. A proposal is a whole
        platform's spec: a token scoped to groups sees only its own person's."""
        if not me.scoped:
            return [p.to_json() for p in await board().proposals(all, limit)]
        found = await board().proposals(all, 100_000)
        return [p.to_json() for p in found if own_proposal(me, p)][:limit]

    @api.get("/v1/proposals/{proposal_id}")
    async def proposal(proposal_id: RowId, me: Me) -> dict[str, Any]:
        p = await board().get(proposal_id)
        if me.scoped and not own_proposal(me, p):
            raise Forbidden(
                f"reading proposal {proposal_id}: a proposal is a whole platform's spec, other "
                f"teams' included; token {me.name!r} is scoped to group(s) "
                f"{', '.join(sorted(me.groups or ()))} and reads only its own person's proposals",
                proposal=proposal_id,
            )
        return p.to_json()

    @api.post("/v1/proposals/{proposal_id}/approve")
    @guarded(Role.ADMIN)
    async def approve(proposal_id: RowId, body: ReviewRequest, me: Me) -> dict[str, Any]:
        """Apply it as a new revision; 403 for its author's person, 409 if it is stale."""
        me.require(Role.ADMIN, "approving a proposal")
        done = await board().approve(proposal_id, me.name, body.reason, person=me.person)
        return done.to_json()

    @api.post("/v1/proposals/{proposal_id}/reject")
    @guarded(Role.OPERATOR)
    async def reject(proposal_id: RowId, body: ReviewRequest, me: Me) -> dict[str, Any]:
        """An admin rejects; the author's person may withdraw their own."""
        p = await board().get(proposal_id)
        if me.name != p.author and me.person != p.author_person:
            me.require(Role.ADMIN, "rejecting another person's proposal")
        return (await board().reject(proposal_id, me.name, body.reason, person=me.person)).to_json()

    @api.get("/v1/quota")
    async def quota(
        window_s: Annotated[float, Query(gt=0, description="under-use window")] = 3600.0,
        below: Annotated[float, Query(gt=0, le=1, description="share of guarantee")] = 0.5,
        *,
        me: Me,
    ) -> dict[str, Any]:
        """Pools, each group's quota and use, the loan ledger, spend, under-used groups (a
        token scoped to groups: its groups' lines, loans and spend; pool totals stay)."""
        report = await controller.quota_report(window_s, below)
        if me.scoped:
            report["groups"] = [g for g in report["groups"] if me.sees(g["name"])]
            report["loans"] = [
                loan
                for loan in report["loans"]
                if me.sees(loan["borrower"]) or (loan["lender"] and me.sees(loan["lender"]))
            ]
            report["underused"] = [u for u in report["underused"] if me.sees(u["group"])]
        return report

    @api.get("/v1/dataplane")
    async def dataplane(me: Me) -> dict[str, Any]:
        """The gateways' live state (a token scoped to groups: its groups' and instances')."""
        found = data_plane() if data_plane is not None else {}
        return scoped_data_plane(me, found) if me.scoped else found

    @api.post("/v1/revisions")
    @guarded(Role.ADMIN, SPEC_BODY)
    async def apply(body: ApplyRequest, me: Me) -> dict[str, Any]:
        me.require(Role.ADMIN, "applying a spec")
        async with audited_refusal(me, "apply"):
            loaded = await offload(parse_spec, body.yaml, body.source)
            rev = await controller.apply(loaded, me.name, body.reason)
        if rev is None:
            return {"revision": controller.revision, "changed": False}
        return {"revision": rev.number, "changed": True, "diff": rev.diff}

    @api.get("/v1/revisions")
    async def revisions(me: Me, limit: Limit = 20) -> list[dict[str, Any]]:
        """The spec's revisions, newest first. Refused to a token scoped to groups: a
        revision is the whole platform's spec, other teams' groups, tenants and routes
        included."""
        if me.scoped:
            raise Forbidden(
                f"reading revisions: token {me.name!r} is scoped to group(s) "
                f"{', '.join(sorted(me.groups or ()))}, and a revision is the whole platform's "
                "spec (other teams' groups, tenants and routes included); read your groups "
                "with GET /v1/groups (`sluice get groups`)",
                groups=sorted(me.groups or ()),
            )
        revs = await asyncio.to_thread(store.list_revisions, limit)
        return [r.to_json() for r in revs]

    @api.get("/v1/audit")
    async def audit(
        target: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: Limit = 100,
        *,
        me: Me,
    ) -> list[dict[str, Any]]:
        """Newest first; `since`/`until` are Unix times; `person` is who held the acting
        token. A token scoped to groups reads the
        entries about its groups (`group/G`), their rollouts and its own proposals; never a
        revision's, a token's or a console session's."""
        targets = None
        if me.scoped:
            targets = await visible_audit_targets(me)
            if target is not None and target not in targets:
                kind, _, name = target.partition("/")
                if kind == "group":
                    me.require_sees(name, "reading the audit log")
                raise Forbidden(
                    f"reading the audit log of {target}: token {me.name!r} may read only "
                    f"entries about group(s) {', '.join(sorted(me.groups or ()))}",
                    target=target,
                )
        entries = await asyncio.to_thread(
            store.list_audit,
            targets=targets,
            target=target,
            actor=actor,
            action=action,
            since=since,
            until=until,
            limit=limit,
        )
        # Every row says who: the person its row recorded, else the one holding its token
        # (tokens are never renamed nor reused); None for an actor that is no token.
        holders = {t.name: t.person for t in await asyncio.to_thread(store.list_tokens)}
        return [
            {**e.to_json(), "person": e.detail.get("person") or holders.get(e.actor)}
            for e in entries
        ]

    @api.get("/v1/events")
    async def events(me: Me, group: str | None = None, limit: Limit = 100) -> list[dict[str, Any]]:
        """Newest first (a token scoped to groups: its groups' only)."""
        me.require_sees(group, "reading events")
        scope = sorted(me.groups) if me.groups is not None and group is None else None
        found = await asyncio.to_thread(store.list_events, group=group, groups=scope, limit=limit)
        if not found:  # a group removed from the spec keeps its history
            require_group(group)
        return [e.to_json() for e in found]

    @api.get("/metrics")
    async def gateway_metrics(me: Me) -> Response:
        """The gateway's Prometheus metrics and the model servers' scraped signals
        (`sluice_server_*` by group and instance); a scraper sends an unscoped viewer token
        (the text has every group: a token scoped to groups is refused)."""
        if me.scoped:
            raise Forbidden(
                f"reading /metrics: the Prometheus text has every group's series, and token "
                f"{me.name!r} is scoped to group(s) {', '.join(sorted(me.groups or ()))}; a "
                "scraper uses an unscoped viewer token (`sluice token create NAME --role "
                "viewer`); read your groups with GET /v1/groups/GROUP/explain or /v1/history",
                groups=sorted(me.groups or ()),
            )
        if metrics is None:
            raise NotFound("this control API serves no gateway metrics")
        body, content_type = metrics()
        return Response(body + controller.server_metrics(), media_type=content_type)

    @api.post("/v1/tokens")
    @guarded(Role.ADMIN)
    async def create_token(body: TokenRequest, me: Me) -> dict[str, Any]:
        """The token itself is in this answer only; the store keeps its digest."""
        me.require(Role.ADMIN, "creating a token")
        for name in body.groups or ():
            require_group(name)
        token, record = await tokens.mint(
            body.name, body.role, body.groups, body.expires_in_s, body.owner, by=me
        )
        return {**record.to_json(), "token": token}

    @api.get("/v1/tokens")
    @guarded(Role.ADMIN)
    async def list_tokens(me: Me) -> list[dict[str, Any]]:
        me.require(Role.ADMIN, "listing tokens")
        return [t.to_json() for t in await tokens.list()]

    @api.post("/v1/tokens/{name}/revoke")
    @guarded(Role.ADMIN)
    async def revoke_token(name: str, me: Me) -> dict[str, Any]:
        me.require(Role.ADMIN, "revoking a token")
        return (await tokens.revoke(name, by=me.name)).to_json()

    @api.get("/v1/whoami")
    @guarded(Role.GATEWAY)
    async def whoami(me: Me) -> dict[str, Any]:
        groups = None if me.groups is None else sorted(me.groups)
        return {"name": me.name, "person": me.person, "role": me.role.value, "groups": groups}

    @api.post("/v1/gc")
    @guarded(Role.ADMIN)
    async def gc(me: Me) -> dict[str, Any]:
        """Apply the spec's retention now (it also runs every `retention.interval_s`)."""
        me.require(Role.ADMIN, "running retention")
        if housekeeping is None:
            raise NotFound("this control API runs no housekeeping")
        done = await housekeeping()
        counts = {"rotated": len(done["rotated"]), "removed": len(done["removed"])}
        await controller.audit(
            me.name, "gc", "retention", "sluice gc", {**counts, **done["pruned"]}
        )
        return done

    @api.get("/v1/openapi.json")
    async def openapi() -> dict[str, Any]:
        """This API's OpenAPI schema (for clients and contract tests), behind a token."""
        return app.openapi()

    if more_routes is not None:
        more_routes(api)
    app.include_router(api)
    mount_console(app, authenticator, tokens.clock)
    return app


def _error_response(exc: SluiceError) -> JSONResponse:
    """`exc` as its JSON body and status, with its `Retry-After` if it has one."""
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
    return JSONResponse(exc.to_json(), status_code=exc.http_status, headers=headers)


def own_proposal(me: Principal, p: Proposal) -> bool:
    """Whether `p` was proposed by `me`'s token or person."""
    return p.author == me.name or (bool(p.author_person) and p.author_person == me.person)


async def _caller(request: Request, authenticator: Authenticator) -> Principal:
    """A bearer token, or else the console's session cookie; a change made with the cookie
    must carry the session's CSRF token in `X-CSRF-Token` (a form on another site cannot
    set a header, nor read the token)."""
    authorization = request.headers.get("authorization")
    session = request.cookies.get(SESSION_COOKIE)
    if authorization is not None or session is None:
        return await authenticator.authenticate(authorization)
    principal = await authenticator.from_session(session)
    if request.method not in ("GET", "HEAD") and not csrf_matches(
        session, request.headers.get(CSRF_HEADER)
    ):
        raise Forbidden(f"a change made with the console's session needs its {CSRF_HEADER}")
    return principal


def _gateway_only_syncs(me: Principal, path: str) -> None:
    """A gateway token may sync its gateway (`sluice.control.gateways`) and learn its own
    name (`GET /v1/whoami`: `sluice gateway` names itself after its token), and read
    nothing else: refused here, before any route, since most reads need only a valid token."""
    if me.role is Role.GATEWAY and not (path.startswith("/v1/gateways/") or path == "/v1/whoami"):
        raise Forbidden(
            f"token {me.name!r} is a gateway token: it may only sync a gateway "
            "(POST /v1/gateways/ID/sync) and ask its own name (GET /v1/whoami)",
            needs=Role.VIEWER.value,
            role=me.role.value,
        )
