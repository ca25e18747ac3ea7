"""The identity routes on the control API: an admin mints, lists and revokes tokens
(`control.tokens` decides who may mint for whom), and any token asks who it is
(`GET /v1/whoami`, the one read a gateway token may make besides its sync)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from pydantic import Field

from sluice.control.api_deps import Me, require_group
from sluice.control.auth import Role
from sluice.control.bodies import TextBody
from sluice.control.guard import guarded
from sluice.control.tokens import TokenAdmin
from sluice.spec import PlatformSpec
from sluice.spec.names import Name

__all__ = ["TokenRequest", "token_routes"]

GroupName = Name


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


def token_routes(api: APIRouter, tokens: TokenAdmin, spec: Callable[[], PlatformSpec]) -> None:
    """Add the `/v1/tokens` routes and `GET /v1/whoami` to `api`; `spec`: the live spec,
    whose groups a token's scope must name."""

    @api.post("/v1/tokens")
    @guarded(Role.ADMIN)
    async def create_token(body: TokenRequest, me: Me) -> dict[str, Any]:
        """The token itself is in this answer only; the store keeps its digest."""
        me.require(Role.ADMIN, "creating a token")
        for name in body.groups or ():
            require_group(spec(), name)
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
