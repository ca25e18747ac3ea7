"""The records' routes on the control API: the audit log (who did what, as which person),
the events, and the retention pass that prunes them (`sluice gc`). A token scoped to groups
reads the entries about its groups, their rollouts and its own person's proposals."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter

from sluice.control.api_deps import Limit, Me, own_proposal, require_group
from sluice.control.auth import Principal, Role
from sluice.control.controller import Controller
from sluice.control.guard import guarded
from sluice.control.review import ReviewBoard
from sluice.core import Forbidden, NotFound
from sluice.store import Store

__all__ = ["record_routes"]


def record_routes(
    api: APIRouter,
    controller: Controller,
    store: Store,
    review: ReviewBoard | None,
    housekeeping: Callable[[], Awaitable[dict[str, Any]]] | None,
) -> None:
    """Add `GET /v1/audit`, `GET /v1/events` and `POST /v1/gc` to `api`. `review`: whose
    proposals a scoped token may read the audit of; `housekeeping`: one retention pass
    (without it, `/v1/gc` is a 404)."""

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
        if not found and group is not None:  # a group removed from the spec keeps its history
            require_group(controller.spec, group)
        return [e.to_json() for e in found]

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
