"""Issuing and revoking API tokens, audited; and the first admin token of a new state
directory, written where the CLI on the same machine finds it (like a kubeconfig).

Persons. Every token belongs to a person (an e-mail or a name, kept lower-case: persons
compare case-insensitively). Two-person review compares persons, so the rule of who may
mint a token for whom is what makes it hold:

| minting token's person     | `owner` not given             | `owner` given                |
|----------------------------|-------------------------------|------------------------------|
| `admin` (the installation) | a person named like the token | any person, new or known     |
| anyone else                | the minter's own person       | only the minter's own person |

Anything else is a 403: a token can only be minted for yourself. So no person but the
installation can make a second identity: every token they mint is theirs, and approving
their own proposal with it is refused (`sluice.control.review`).

The installation is the person of the `admin` token that `sluice up` writes to
`$SLUICE_HOME/admin.token` on a fresh state directory (`INSTALLATION`). It enrolls people,
as an identity provider would: `sluice token create alice@example.com --role admin` (a
person named like the token) or `--owner`; `--owner admin` makes another installation
token (to rotate `admin.token`). Its holder owns the state directory (and, on SQLite, the
store itself), so no rule inside the platform could stop them from inventing a person;
review still refuses the opportunistic path: a person whom the proposer's person enrolled
after the proposal cannot approve it ("propose, enroll a sock, approve"). What remains, a
fake person enrolled ahead of time, is in the audit: each `token-create` row names the
minting token's person (`person`) and the new token's (`owner`).

Tokens the platform mints for itself (a scheduled drill's) belong to a person named like
the token: nobody's second identity. They are named `drill.<schedule>.<time>.<hex>`, a
prefix nobody else may mint (`DRILL_PREFIX`), and deleted, not kept revoked, once their
drill's run is archived: a minute's cron would otherwise keep 525,600 revoked tokens a year.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Protocol

from sluice.control.auth import Principal, Role, new_token, token_digest
from sluice.core import Clock, Conflict, Forbidden, NotFound
from sluice.store import TokenRecord
from sluice.store.ports import AuditRecords, TokenRecords

__all__ = [
    "ADMIN_TOKEN_FILE",
    "BOOTSTRAP_ADMIN",
    "DRILL_PREFIX",
    "INSTALLATION",
    "TokenAdmin",
    "owner_for",
]


class _TokenStore(TokenRecords, AuditRecords, Protocol):
    """The records this module reads and writes."""


ADMIN_TOKEN_FILE = "admin.token"
BOOTSTRAP_ADMIN = "admin"
INSTALLATION = BOOTSTRAP_ADMIN
"""The person of the bootstrap admin token: the installation, which enrolls people."""
DRILL_PREFIX = "drill."
"""Names of the tokens scheduled drills get (`sluice.control.drills`): the platform's alone,
so the name of a deleted one is never anybody else's."""


def owner_for(minter: Principal, name: str, owner: str | None) -> str:
    """The person a token named `name` minted by `minter` belongs to, given the requested
    `owner` (None: the default), by the table in the module docstring; Forbidden when
    `minter` may not mint for `owner`."""
    if minter.person == INSTALLATION:
        return (owner or name).strip().lower()
    if owner is None or owner.strip().lower() == minter.person:
        return minter.person
    raise Forbidden(
        f"a token can only be minted for yourself: token {minter.name!r} belongs to person "
        f"{minter.person!r}, not {owner!r}. A new person gets their first token from the "
        f"installation's admin token ($SLUICE_HOME/{ADMIN_TOKEN_FILE})",
        owner=owner,
        person=minter.person,
    )


class TokenAdmin:
    def __init__(self, store: _TokenStore, clock: Clock) -> None:
        self._store = store
        self.clock = clock

    async def mint(
        self,
        name: str,
        role: Role,
        groups: list[str] | None,
        expires_in_s: float | None,
        owner: str | None,
        *,
        by: Principal,
    ) -> tuple[str, TokenRecord]:
        """A token minted by the caller `by` for `owner` (see `owner_for`): the control
        API's `POST /v1/tokens`."""
        person = owner_for(by, name, owner)
        if name.startswith(DRILL_PREFIX):
            raise Conflict(
                f"token names starting with {DRILL_PREFIX!r} are the scheduled drills' "
                f"(deleted when their run ends): pick another name than {name!r}",
                token=name,
            )
        return await self.create(
            name, role, groups, expires_in_s, by=by.name, person=person, by_person=by.person
        )

    async def create(
        self,
        name: str,
        role: Role,
        groups: list[str] | None,
        expires_in_s: float | None,
        *,
        by: str,
        person: str | None = None,
        by_person: str | None = None,
        reason: str | None = None,
    ) -> tuple[str, TokenRecord]:
        """A new token (returned once, never stored) and its record. `person` holds it
        (default: a person named like the token); `by` is the minting token or the part of
        the platform minting it, and `by_person` its person (None: looked up by `by`);
        `reason`, the audit row's why (default: what was minted for whom). No rule is
        checked here: the API mints through `mint`, `sluice token create --store` (direct
        store access: whoever holds the store is the installation) through this."""
        by_person = by_person if by_person is not None else await self._person_of(by)
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
            person=None if person is None else person.strip().lower(),
        )
        detail = {
            "role": role.value,
            "groups": groups,
            "expires_at": record.expires_at,
            "owner": record.person,
            "person": by_person,
        }
        await asyncio.to_thread(
            self._store.append_audit,
            actor=by,
            action="token-create",
            target=f"token/{name}",
            reason=reason or f"{role.value} token for person {record.person}",
            detail=detail,
            now=now,
        )
        return token, record

    async def list(self) -> list[TokenRecord]:
        return await asyncio.to_thread(self._store.list_tokens)

    async def revoke(self, name: str, *, by: str, by_person: str | None = None) -> TokenRecord:
        """Revoke `name`; refused for the last live admin token (nobody could manage
        tokens or apply a spec any more). `by_person`: as for `create`."""
        by_person = by_person if by_person is not None else await self._person_of(by)
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
            detail={"owner": record.person, "person": by_person},
            now=now,
        )
        return record

    async def delete(self, name: str, *, by: str, reason: str) -> TokenRecord | None:
        """Delete token `name` (a scheduled drill's, its run archived), audited; None if
        there was no such token."""
        record = await asyncio.to_thread(self._store.delete_token, name)
        if record is not None:
            await asyncio.to_thread(
                self._store.append_audit,
                actor=by,
                action="token-delete",
                target=f"token/{name}",
                reason=reason,
                detail={"owner": record.person, "person": None},
                now=self.clock.now(),
            )
        return record

    async def _person_of(self, actor: str) -> str | None:
        """The person holding the token named `actor`; None for an actor that is no token
        (`sluice up`, a drill schedule)."""
        try:
            return (await asyncio.to_thread(self._store.get_token, actor)).person
        except NotFound:
            return None

    async def bootstrap(self, home: Path) -> Path | None:
        """On a state directory with no token yet: create the `admin` token (person
        `INSTALLATION`) and write it to `home/admin.token` (0600). Returns the file, or
        None if tokens exist already."""
        if await asyncio.to_thread(self._store.list_tokens):
            return None
        token, _ = await self.create(
            BOOTSTRAP_ADMIN, Role.ADMIN, None, None, by="sluice up", person=INSTALLATION
        )
        path = home / ADMIN_TOKEN_FILE
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        return path


def _live(token: TokenRecord, now: float) -> bool:
    return token.revoked_at is None and (token.expires_at is None or token.expires_at > now)
