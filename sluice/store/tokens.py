"""API tokens in the store: created with their digest, looked up by digest, revoked (kept,
so the audit log's actors stay resolvable, until retention drops them with the audit rows
that name them: `RetentionStore.prune_tokens`), deleted only when a scheduled drill's run is
over; and the console sessions made from them, also kept as digests."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, Row, delete, select, update
from sqlalchemy.exc import IntegrityError

from sluice.core import Conflict, NotFound
from sluice.store import schema
from sluice.store.base import StoreBase
from sluice.store.records import SessionRecord, TokenRecord

__all__ = ["TokenStore"]


class TokenStore(StoreBase):
    def add_token(
        self,
        *,
        name: str,
        role: str,
        groups: list[str] | None,
        digest: str,
        created_by: str,
        expires_at: float | None,
        now: float,
        person: str | None = None,
    ) -> TokenRecord:
        """A new token's record; `person` (lower-case) holds it, by default a person named
        like the token. Who may mint a token for whom is `sluice.control.tokens`' rule."""
        values = {
            "name": name,
            "person": name.lower() if person is None else person,
            "role": role,
            "groups": None if groups is None else json.dumps(sorted(groups)),
            "digest": digest,
            "created_at": now,
            "created_by": created_by,
            "expires_at": expires_at,
            "revoked_at": None,
            "revoked_by": None,
        }
        try:
            self._append(schema.tokens, values)
        except IntegrityError:
            raise Conflict(
                f"a token named {name!r} exists already (names stay taken after a revoke, so "
                "the audit log keeps meaning one holder): pick another name",
                token=name,
            ) from None
        return self.get_token(name)

    def get_token(self, name: str) -> TokenRecord:
        t = schema.tokens
        with self._engine.connect() as conn:
            row = conn.execute(select(t).where(t.c.name == name)).one_or_none()
        if row is None:
            raise NotFound(f"no token named {name!r}", token=name)
        return _token(row)

    def token_by_digest(self, digest: str) -> TokenRecord | None:
        t = schema.tokens
        with self._engine.connect() as conn:
            row = conn.execute(select(t).where(t.c.digest == digest)).one_or_none()
        return None if row is None else _token(row)

    def list_tokens(self) -> list[TokenRecord]:
        t = schema.tokens
        with self._engine.connect() as conn:
            return [_token(r) for r in conn.execute(select(t).order_by(t.c.id))]

    def revoke_token(self, name: str, *, by: str, now: float) -> TokenRecord:
        t = schema.tokens
        current = self.get_token(name)
        if current.revoked_at is not None:
            return current
        self._write(
            lambda conn: conn.execute(
                update(t).where(t.c.name == name).values(revoked_at=now, revoked_by=by)
            )
        )
        return self.get_token(name)

    def delete_token(self, name: str) -> TokenRecord | None:
        """Delete token `name` (a scheduled drill's, its run archived): unusable at once, as
        a revoked one, and gone from `sluice token list`. Its record, or None if there was
        none."""
        t = schema.tokens

        def run(conn: Connection) -> TokenRecord | None:
            row = conn.execute(select(t).where(t.c.name == name)).one_or_none()
            if row is not None:
                conn.execute(delete(t).where(t.c.id == row.id))
            return None if row is None else _token(row)

        return self._write(run)

    def add_session(self, *, digest: str, token_name: str, now: float, expires_at: float) -> None:
        values = {"digest": digest, "token_name": token_name, "created_at": now}
        self._append(schema.console_sessions, {**values, "expires_at": expires_at})

    def session_by_digest(self, digest: str) -> tuple[SessionRecord, TokenRecord | None] | None:
        """A session and the token it was made from (None if that token is gone), in one
        read: the console asks this on every page and every call it makes."""
        s, t = schema.console_sessions, schema.tokens
        query = (
            select(
                t,
                s.c.token_name.label("session_token"),
                s.c.created_at.label("session_created_at"),
                s.c.expires_at.label("session_expires_at"),
                s.c.ended_at.label("session_ended_at"),
            )
            .select_from(s.outerjoin(t, t.c.name == s.c.token_name))
            .where(s.c.digest == digest)
        )
        with self._engine.connect() as conn:
            row = conn.execute(query).one_or_none()
        if row is None:
            return None
        session = SessionRecord(
            row.session_token, row.session_created_at, row.session_expires_at, row.session_ended_at
        )
        return session, None if row.id is None else _token(row)

    def end_session(self, digest: str, *, now: float) -> None:
        s = schema.console_sessions
        self._write(
            lambda conn: conn.execute(
                update(s).where(s.c.digest == digest, s.c.ended_at.is_(None)).values(ended_at=now)
            )
        )

    def prune_sessions(self, *, before: float) -> int:
        """Drop sessions that ended or expired before `before`: they can never be used."""
        s = schema.console_sessions
        over = (s.c.expires_at < before) | (s.c.ended_at < before)
        return self._write(lambda conn: int(conn.execute(delete(s).where(over)).rowcount))


def _token(row: Row[Any]) -> TokenRecord:
    groups = None if row.groups is None else tuple(json.loads(row.groups))
    return TokenRecord(
        id=row.id,
        name=row.name,
        person=row.person or row.name.lower(),
        role=row.role,
        groups=groups,
        created_at=row.created_at,
        created_by=row.created_by,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        revoked_by=row.revoked_by,
    )
