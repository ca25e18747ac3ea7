"""Tokens on a real store (SQLite and PostgreSQL): issue, authenticate, scope, expire, revoke."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sluice.control.auth import (
    Authenticator,
    Principal,
    Role,
    csrf_matches,
    csrf_token,
    new_token,
    token_digest,
)
from sluice.control.tokens import TokenAdmin
from sluice.core import Conflict, Forbidden, ManualClock, Unauthorized
from sluice.store import Store
from tests.databases import Database

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_token_is_shown_once_and_stored_only_as_its_digest(
    store: Store, database: Database
) -> None:
    clock = ManualClock(1000.0)
    tokens = TokenAdmin(store, clock)
    token, record = run(tokens.create("ops", Role.OPERATOR, ["chat"], None, by="admin"))
    assert token.startswith("slc_") and len(token) == 47
    assert record.to_json()["groups"] == ["chat"] and "token" not in record.to_json()
    raw = database.raw()
    assert token.encode() not in raw and token_digest(token).encode() in raw
    me = run(Authenticator(store, clock).authenticate(f"Bearer {token}"))
    assert me == Principal("ops", Role.OPERATOR, frozenset({"chat"}))
    [entry] = store.list_audit(action="token-create")
    assert (entry.actor, entry.target) == ("admin", "token/ops")


def test_names_stay_taken_after_a_revoke(store: Store) -> None:
    tokens = TokenAdmin(store, ManualClock(0.0))
    run(tokens.create("ops", Role.VIEWER, None, None, by="admin"))
    run(tokens.revoke("ops", by="admin"))
    with pytest.raises(Conflict, match="exists already"):
        run(tokens.create("ops", Role.VIEWER, None, None, by="admin"))


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "no token"),
        ("", "no token"),
        ("Basic abc", "malformed Authorization header"),
        ("Bearer", "malformed Authorization header"),
        ("Bearer sk-demo", "malformed token"),
        ("Bearer " + "slc_" + "x" * 42, "malformed token"),
        ("Bearer " + new_token(), "unknown token"),
    ],
    ids=["none", "empty", "basic", "bearer-alone", "not-ours", "malformed", "unknown"],  # one
)  # name in every xdist worker: the unknown token is random
def test_bad_credentials_are_401_saying_what_is_wrong(
    store: Store, header: str | None, message: str
) -> None:
    with pytest.raises(Unauthorized, match=message):
        run(Authenticator(store, ManualClock(0.0)).authenticate(header))


def test_expired_and_revoked_tokens_stop_at_once(store: Store) -> None:
    clock = ManualClock(0.0)
    tokens = TokenAdmin(store, clock)
    auth = Authenticator(store, clock)
    short, _ = run(tokens.create("short", Role.VIEWER, None, 60.0, by="admin"))
    gone, _ = run(tokens.create("gone", Role.ADMIN, None, None, by="admin"))
    assert run(auth.authenticate(f"Bearer {short}")).name == "short"
    clock.advance(60.0)
    with pytest.raises(Unauthorized, match="'short' expired"):
        run(auth.authenticate(f"Bearer {short}"))
    assert run(auth.authenticate(f"bearer {gone}")).role is Role.ADMIN
    with pytest.raises(Conflict, match="'gone' is the last live admin token"):
        run(tokens.revoke("gone", by="gone"))  # nobody could manage tokens any more
    run(tokens.create("next", Role.ADMIN, None, None, by="gone"))
    run(tokens.revoke("gone", by="admin"))
    with pytest.raises(Unauthorized, match=r"'gone' was revoked .* by admin"):
        run(auth.authenticate(f"Bearer {gone}"))


def test_roles_nest_and_groups_scope() -> None:
    viewer = Principal("v", Role.VIEWER)
    ops = Principal("o", Role.OPERATOR, frozenset({"chat"}))
    admin = Principal("a", Role.ADMIN)
    viewer.require(Role.VIEWER, "reading")
    with pytest.raises(Forbidden, match="scaling chat needs the operator role; token 'v' is"):
        viewer.require(Role.OPERATOR, "scaling chat", groups=("chat",))
    ops.require(Role.OPERATOR, "scaling chat", groups=("chat",))
    with pytest.raises(Forbidden, match=r"may act only on group.s. chat, not embed"):
        ops.require(Role.OPERATOR, "failover", groups=("chat", "embed"))
    with pytest.raises(Forbidden, match="needs the admin role"):
        ops.require(Role.ADMIN, "applying a spec")
    admin.require(Role.ADMIN, "applying a spec", groups=("anything",))


def test_the_first_start_writes_a_private_admin_token_once(store: Store, tmp_path: Path) -> None:
    tokens = TokenAdmin(store, ManualClock(0.0))
    path = run(tokens.bootstrap(tmp_path))
    assert path is not None and path.stat().st_mode & 0o777 == 0o600
    token = path.read_text().strip()
    me = run(Authenticator(store, ManualClock(0.0)).authenticate(f"Bearer {token}"))
    assert me == Principal("admin", Role.ADMIN)
    assert run(tokens.bootstrap(tmp_path)) is None  # tokens exist: nothing new
    assert path.read_text().strip() == token


def test_a_console_session_follows_its_token_and_ends_at_logout(
    store: Store, database: Database
) -> None:
    clock = ManualClock(0.0)
    tokens = TokenAdmin(store, clock)
    auth = Authenticator(store, clock)
    token, _ = run(tokens.create("ops", Role.OPERATOR, ["chat"], 3 * 3600.0, by="admin"))
    session, me = run(auth.log_in(token))
    assert me == Principal("ops", Role.OPERATOR, frozenset({"chat"}))
    assert run(auth.from_session(session)) == me
    raw = database.raw()
    assert session.encode() not in raw  # only its digest is kept
    assert csrf_matches(session, csrf_token(session))
    assert not csrf_matches(session, None) and not csrf_matches(session, "0" * 64)
    assert not csrf_matches(new_token()[4:], csrf_token(session))  # another session's
    # The session ends with its token's expiry (3 h), before its own 12 h.
    clock.advance(3 * 3600.0)
    with pytest.raises(Unauthorized, match="session ended"):
        run(auth.from_session(session))
    # A logout ends it on the server (a copied cookie is useless afterwards).
    other, _ = run(tokens.create("other", Role.ADMIN, None, None, by="admin"))
    session, me = run(auth.log_in(other))
    run(auth.log_out(session, me))
    with pytest.raises(Unauthorized, match="session ended"):
        run(auth.from_session(session))
    assert [e.action for e in store.list_audit(actor="other")] == ["logout", "login"]


def test_revoking_the_token_ends_its_console_sessions(store: Store) -> None:
    clock = ManualClock(0.0)
    tokens = TokenAdmin(store, clock)
    auth = Authenticator(store, clock)
    run(tokens.create("keeper", Role.ADMIN, None, None, by="admin"))
    token, _ = run(tokens.create("ops", Role.VIEWER, None, None, by="admin"))
    session, _ = run(auth.log_in(token))
    run(tokens.revoke("ops", by="admin"))
    with pytest.raises(Unauthorized, match="'ops' was revoked"):
        run(auth.from_session(session))
    for bad in (None, "", "short", "x" * 43):
        with pytest.raises(Unauthorized):
            run(auth.from_session(bad))


def test_a_gateway_token_ranks_below_a_viewer_and_cannot_log_in(store: Store) -> None:
    clock = ManualClock(0.0)
    tokens = TokenAdmin(store, clock)
    auth = Authenticator(store, clock)
    token, _ = run(tokens.create("gw-1", Role.GATEWAY, None, None, by="admin"))
    me = run(auth.authenticate(f"Bearer {token}"))
    with pytest.raises(Forbidden, match="needs the viewer role"):
        me.require(Role.VIEWER, "reading the groups")
    with pytest.raises(Forbidden, match="gateway token: it cannot log in"):
        run(auth.log_in(token))
