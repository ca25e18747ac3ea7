"""Who is calling the control API, and what they may do.

A token is `slc_` + 43 url-safe characters (256 random bits). The store keeps only its
sha256: a random 256-bit secret cannot be guessed or brute-forced from its digest, so a slow
or keyed hash (bcrypt, HMAC with a pepper) would add cost and a key to manage but no
protection. Lookup is by digest, so the time a lookup takes depends on the digest, never on
how many leading characters of a guess were right. Every request reads the token afresh
from the store: a revoke takes effect on the next call, in every process.

The console logs in with a token and then holds a session cookie: a random 256-bit value of
which the store, again, keeps only the sha256. A session acts as its token (same name, role
and scope) and ends when the token is revoked or expires, at logout, or after
`SESSION_TTL_S`. A change made with the cookie must also carry the session's CSRF token
(`csrf_token`), which a page of another site cannot read.

Roles nest: `viewer` reads; `operator` also scales, fails over, runs rollouts and
proposes; `admin` also applies specs, approves and manages tokens. An operator (or viewer)
token with `groups` acts only on those groups.

Every token belongs to a person (`Principal.person`); who may mint a token for whom is
`sluice.control.tokens`' rule. Two-person review compares persons, not token names.

A check that cannot reach the store (PostgreSQL away, SQLite locked or read-only) is a
`StoreUnavailable` (503, naming the store), never a 401: the token may well be good.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol, TypeVar

from sluice.core import Clock, Forbidden, Unauthorized
from sluice.store import TokenRecord, store_unavailable
from sluice.store.ports import AuditRecords, SessionRecords

__all__ = [
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "SESSION_TTL_S",
    "TOKEN_PREFIX",
    "Authenticator",
    "Principal",
    "Role",
    "csrf_matches",
    "csrf_token",
    "new_token",
    "token_digest",
]


class _AuthStore(SessionRecords, AuditRecords, Protocol):
    """The records this module reads and writes."""


TOKEN_PREFIX = "slc_"
_TOKEN_SHAPE = re.compile(r"slc_[A-Za-z0-9_-]{43}")
SESSION_COOKIE = "sluice_session"
_SESSION_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")
SESSION_TTL_S = 12 * 3600.0
"""A console session lasts a working day at most (less if its token expires first)."""
CSRF_HEADER = "x-csrf-token"

T = TypeVar("T")


class Role(StrEnum):
    GATEWAY = "gateway"
    """a `sluice gateway` process: it may sync with the controller and nothing else (below
    viewer, so every other route refuses it)"""
    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self]


_RANKS = {Role.GATEWAY: -1, Role.VIEWER: 0, Role.OPERATOR: 1, Role.ADMIN: 2}


@dataclass(frozen=True, slots=True)
class Principal:
    """The holder of a valid token: the audit log's actor is `name`, the token; `person`
    is who holds it (default: a person named like the token, as for a token issued before
    persons existed)."""

    name: str
    role: Role
    groups: frozenset[str] | None = None
    person: str = ""

    def __post_init__(self) -> None:
        if not self.person:
            object.__setattr__(self, "person", self.name.lower())

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

    @property
    def scoped(self) -> bool:
        """True for a token scoped to groups (it reads only those)."""
        return self.groups is not None

    def sees(self, group: str) -> bool:
        """Whether this token may read `group` and what belongs to it (unscoped: every group)."""
        return self.groups is None or group in self.groups

    def require_sees(self, group: str | None, what: str) -> None:
        """Forbidden if `group` (a query parameter; None: not given) is outside this token's
        scope. `what` names the read for the message."""
        if group is not None and not self.sees(group):
            raise Forbidden(
                f"{what}: token {self.name!r} may read only group(s) "
                f"{', '.join(sorted(self.groups or ()))}, not {group}",
                groups=[group],
            )


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def csrf_token(session: str) -> str:
    """The CSRF token of a session, derived from its cookie (so nothing more is stored):
    only a page that can read our own pages knows it."""
    return hashlib.sha256(b"sluice-csrf\0" + session.encode()).hexdigest()


def csrf_matches(session: str, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(sent.encode(), csrf_token(session).encode())


class Authenticator:
    """Turns an `Authorization` header, or a console session cookie, into a Principal, or
    a 401 that says what is wrong; opens and ends console sessions."""

    def __init__(self, store: _AuthStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock

    async def authenticate(self, authorization: str | None) -> Principal:
        return _principal(await self._live_token(authorization))

    async def _live_token(self, authorization: str | None) -> TokenRecord:
        token = _bearer(authorization)
        record = await self._stored(self._store.token_by_digest, token_digest(token))
        if record is None:
            raise Unauthorized("unknown token: it was never issued here (`sluice token list`)")
        _check_live(record, self._clock.now())
        return record

    async def log_in(self, token: str) -> tuple[str, Principal]:
        """A new console session for a valid token: (cookie value, who it is). Audited."""
        record = await self._live_token(f"Bearer {token.strip()}")
        if record.role == Role.GATEWAY.value:
            raise Forbidden(f"token {record.name!r} is a gateway token: it cannot log in")
        now = self._clock.now()
        ends = now + SESSION_TTL_S
        if record.expires_at is not None:
            ends = min(ends, record.expires_at)
        session = secrets.token_urlsafe(32)
        await self._stored(
            self._store.add_session,
            digest=token_digest(session),
            token_name=record.name,
            now=now,
            expires_at=ends,
        )
        await self._audit(record.name, record.person, "login", "console session")
        return session, _principal(record)

    async def from_session(self, session: str | None) -> Principal:
        """The holder of a live console session (its token still live too), or a 401."""
        if not session or not _SESSION_SHAPE.fullmatch(session):
            raise Unauthorized("not logged in: log in to the console with a token")
        found = await self._stored(self._store.session_by_digest, token_digest(session))
        now = self._clock.now()
        if found is None or found[0].ended_at is not None or now >= found[0].expires_at:
            raise Unauthorized("the console session ended: log in again")
        record = found[1]
        if record is None:
            raise Unauthorized("the session's token no longer exists: log in again")
        _check_live(record, now)
        return _principal(record)

    async def log_out(self, session: str, principal: Principal) -> None:
        digest = token_digest(session)
        await self._stored(self._store.end_session, digest, now=self._clock.now())
        await self._audit(principal.name, principal.person, "logout", "console session")

    async def _audit(self, actor: str, person: str, action: str, reason: str) -> None:
        await self._stored(
            self._store.append_audit,
            actor=actor,
            action=action,
            target="console",
            reason=reason,
            detail={"person": person},
            now=self._clock.now(),
        )

    async def _stored(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`call` on a worker thread; a store that cannot be reached or written raises
        `StoreUnavailable` (503) instead of the driver's error."""
        try:
            return await asyncio.to_thread(call, *args, **kwargs)
        except Exception as exc:
            outage = store_unavailable(exc, self._store.location)
            if outage is None:
                raise
            raise outage from exc


def _principal(record: TokenRecord) -> Principal:
    groups = None if record.groups is None else frozenset(record.groups)
    return Principal(record.name, Role(record.role), groups, record.person)


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
