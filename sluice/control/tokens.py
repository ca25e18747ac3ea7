"""Issuing and revoking API tokens, audited; and the first admin token of a new state
directory, written where the CLI on the same machine finds it (like a kubeconfig)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from sluice.control.auth import Role, new_token, token_digest
from sluice.core import Clock, Conflict
from sluice.store import Store, TokenRecord

__all__ = ["ADMIN_TOKEN_FILE", "BOOTSTRAP_ADMIN", "TokenAdmin"]

ADMIN_TOKEN_FILE = "admin.token"
BOOTSTRAP_ADMIN = "admin"


class TokenAdmin:
    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self.clock = clock

    async def create(
        self,
        name: str,
        role: Role,
        groups: list[str] | None,
        expires_in_s: float | None,
        *,
        by: str,
    ) -> tuple[str, TokenRecord]:
        """A new token (returned once, never stored) and its record."""
        token = new_token()
        now = self.clock.now()
        record = await asyncio.to_thread(
            self._store.add_token,
            name=name,
            role=role.value,
            groups=groups,
            digest=token_digest(token),
            created_by=by,
            expires_at=None if expires_in_s is None else now + expires_in_s,
            now=now,
        )
        detail = {"role": role.value, "groups": groups, "expires_at": record.expires_at}
        await asyncio.to_thread(
            self._store.append_audit,
            actor=by,
            action="token-create",
            target=f"token/{name}",
            reason=f"{role.value} token",
            detail=detail,
            now=now,
        )
        return token, record

    async def list(self) -> list[TokenRecord]:
        return await asyncio.to_thread(self._store.list_tokens)

    async def revoke(self, name: str, *, by: str) -> TokenRecord:
        """Revoke `name`; refused for the last live admin token (nobody could manage
        tokens or apply a spec any more)."""
        now = self.clock.now()
        every = await asyncio.to_thread(self._store.list_tokens)
        target = next((t for t in every if t.name == name), None)
        live_admins = [t.name for t in every if t.role == Role.ADMIN.value and _live(t, now)]
        if target is not None and live_admins == [name]:
            raise Conflict(
                f"{name!r} is the last live admin token: create another admin token first "
                "(`sluice token create NAME --role admin`), then revoke this one",
                token=name,
            )
        record = await asyncio.to_thread(self._store.revoke_token, name, by=by, now=now)
        await asyncio.to_thread(
            self._store.append_audit,
            actor=by,
            action="token-revoke",
            target=f"token/{name}",
            reason="revoked",
            detail={},
            now=now,
        )
        return record

    async def bootstrap(self, home: Path) -> Path | None:
        """On a state directory with no token yet: create the `admin` token and write it to
        `home/admin.token` (0600). Returns the file, or None if tokens exist already."""
        if await asyncio.to_thread(self._store.list_tokens):
            return None
        token, _ = await self.create(BOOTSTRAP_ADMIN, Role.ADMIN, None, None, by="sluice up")
        path = home / ADMIN_TOKEN_FILE
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        return path


def _live(token: TokenRecord, now: float) -> bool:
    return token.revoked_at is None and (token.expires_at is None or token.expires_at > now)
