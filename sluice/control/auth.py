"""Who is calling the control API, and what they may do.

A token is `slc_` + 43 url-safe characters (256 random bits). The store keeps only its
sha256: a random 256-bit secret cannot be guessed or brute-forced from its digest, so a slow
or keyed hash (bcrypt, HMAC with a pepper) would add cost and a key to manage but no
protection. Lookup is by digest, so the time a lookup takes depends on the digest, never on
how many leading characters of a guess were right. Every request reads the token afresh
from the store: a revoke takes effect on the next call, in every process.

Roles nest: `viewer` reads; `operator` also scales, fails over, runs rollouts and
proposes; `admin` also applies specs, approves and manages tokens. An operator (or viewer)
token with `groups` acts only on those groups.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from sluice.core import Clock, Forbidden, Unauthorized
from sluice.store import Store, TokenRecord

__all__ = [
    "TOKEN_PREFIX",
    "Authenticator",
    "Principal",
    "Role",
    "new_token",
    "token_digest",
]

TOKEN_PREFIX = "slc_"
_TOKEN_SHAPE = re.compile(r"slc_[A-Za-z0-9_-]{43}")


class Role(StrEnum):
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self]


_RANKS = {Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


@dataclass(frozen=True, slots=True)
class Principal:
    """The holder of a valid token: the audit log's actor is `name`."""

    name: str
    role: Role
    groups: frozenset[str] | None = None

    def require(self, role: Role, what: str, *, groups: tuple[str, ...] = ()) -> None:
        """Forbidden unless this token has `role` (or above) and, if scoped, every group of
        `groups`. `what` names the action for the message."""
        if self.role.rank < role.rank:
            raise Forbidden(
                f"{what} needs the {role.value} role; token {self.name!r} is {self.role.value}",
                needs=role.value,
                role=self.role.value,
            )
        outside = sorted(set(groups) - self.groups) if self.groups is not None else []
        if outside:
            raise Forbidden(
                f"{what}: token {self.name!r} may act only on group(s) "
                f"{', '.join(sorted(self.groups or ()))}, not {', '.join(outside)}",
                groups=outside,
            )


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Authenticator:
    """Turns an `Authorization` header into a Principal, or a 401 that says what is wrong."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def authenticate(self, authorization: str | None) -> Principal:
        token = _bearer(authorization)
        record = await asyncio.to_thread(self._store.token_by_digest, token_digest(token))
        if record is None:
            raise Unauthorized("unknown token: it was never issued here (`sluice token list`)")
        _check_live(record, self._clock.now())
        groups = None if record.groups is None else frozenset(record.groups)
        return Principal(record.name, Role(record.role), groups)


def _bearer(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized(
            "no token: send `Authorization: Bearer <token>` (the CLI reads --token, "
            "$SLUICE_TOKEN, or $SLUICE_HOME/admin.token)"
        )
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("malformed Authorization header: expected `Bearer <token>`")
    if not _TOKEN_SHAPE.fullmatch(token):
        raise Unauthorized(f"malformed token: a Sluice token is {TOKEN_PREFIX} + 43 characters")
    return token


def _check_live(record: TokenRecord, now: float) -> None:
    if record.revoked_at is not None:
        raise Unauthorized(
            f"token {record.name!r} was revoked at {_when(record.revoked_at)} "
            f"by {record.revoked_by}",
            token=record.name,
        )
    if record.expires_at is not None and now >= record.expires_at:
        raise Unauthorized(
            f"token {record.name!r} expired at {_when(record.expires_at)}; ask an admin "
            "for a new one (`sluice token create`)",
            token=record.name,
        )


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
