"""What every room of the control API shares: the caller (`Me`), the common parameters
(`Limit`, `RowId`), and the two checks several rooms make (a group that exists, a person's
own proposal). In one place so that a route means the same thing by them in every room."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request

from sluice.control.auth import Principal
from sluice.core import NotFound
from sluice.spec import PlatformSpec
from sluice.store import Proposal

__all__ = ["Limit", "Me", "RowId", "authenticated", "own_proposal", "require_group"]


RowId = Annotated[int, Path(ge=1, le=2**63 - 1)]
"""A store row id (SQLite INTEGER): larger ones cannot exist, and SQLite refuses to bind them."""


async def authenticated(request: Request) -> Principal:
    """The caller, authenticated by the middleware before anything else of the request is
    read (so no body is parsed and no handler runs for a caller without a valid token)."""
    principal: Principal = request.state.principal
    return principal


Me = Annotated[Principal, Depends(authenticated)]
Limit = Annotated[int, Query(ge=1, le=100_000, description="at most this many, newest first")]


def require_group(spec: PlatformSpec, group: str) -> None:
    """An unknown group name is a 404 everywhere, never an empty answer."""
    if spec.group(group) is None:
        known = ", ".join(g.name for g in spec.groups)
        raise NotFound(f"no group named {group!r} (groups: {known})", group=group)


def own_proposal(me: Principal, p: Proposal) -> bool:
    """Whether `p` was proposed by `me`'s token or person."""
    return p.author == me.name or (bool(p.author_person) and p.author_person == me.person)
