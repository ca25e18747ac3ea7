"""The fleet-wide readings on the control API: the controller's status, the quota report,
the gateways' live state and their Prometheus metrics. Each one spans every group, so each
says here what a token scoped to groups sees of it (its groups' lines, or a refusal)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from sluice.control.api_deps import Me
from sluice.control.auth import Principal
from sluice.control.controller import Controller
from sluice.core import Forbidden, InstanceStatus, NotFound

__all__ = ["status_routes"]


def status_routes(
    api: APIRouter,
    controller: Controller,
    statuses: Callable[[], Sequence[InstanceStatus]],
    data_plane: Callable[[], dict[str, Any]] | None,
    metrics: Callable[[], tuple[bytes, str]] | None,
) -> None:
    """Add `GET /v1/status`, `/v1/quota`, `/v1/dataplane` and `/metrics` to `api`.
    `statuses`: the supervised instances; `data_plane`, `metrics`: as `build_control_api`."""

    @api.get("/v1/status")
    async def status(me: Me) -> dict[str, Any]:
        """ok or degraded and why (the store refuses writes, ticks fail), the controller's
        tick counters and last error, the store's state, the sample poller's (a token scoped
        to groups sees only its groups' instances)."""
        found = statuses()
        out = {**controller.status(), "instances": len(found)}
        if me.scoped:
            mine = {s.id for s in found if me.sees(s.group)}
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
        return _scoped_data_plane(me, found, statuses()) if me.scoped else found

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


def _scoped_data_plane(
    me: Principal, found: dict[str, Any], statuses: Sequence[InstanceStatus]
) -> dict[str, Any]:
    """The data plane's state with only `me`'s groups and their instances (an instance
    no longer supervised, not in `statuses`, is nobody's)."""
    mine = {s.id for s in statuses if me.sees(s.group)}
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
