"""The spec-change routes on the control API: an admin applies a spec as a new revision, or
an operator proposes one for review (R5) and an admin approves or rejects it. Both paths
parse a spec off the event loop and put a refused one on record (`audited_refusal`); a
revision is the whole platform's spec, so tokens scoped to groups read none of them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from pydantic import Field

from sluice.control.api_deps import Limit, Me, RowId, own_proposal
from sluice.control.auth import Principal, Role
from sluice.control.bodies import TextBody
from sluice.control.controller import Controller
from sluice.control.guard import SPEC_BODY, guarded
from sluice.control.review import ReviewBoard
from sluice.control.spec_work import offload
from sluice.core import Forbidden, NotFound, SpecError
from sluice.spec import parse_spec
from sluice.store import Store

__all__ = ["ApplyRequest", "ProposeRequest", "ReviewRequest", "revision_routes"]


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


def revision_routes(
    api: APIRouter, controller: Controller, store: Store, review: ReviewBoard | None
) -> None:
    """Add the proposal routes and `POST`/`GET /v1/revisions` to `api`. Without `review`
    (no review workflow configured) every proposal route is a 404."""

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
