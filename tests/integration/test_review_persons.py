"""Two people, not two tokens (issue 31), on a real store (SQLite and PostgreSQL): every
token belongs to a person; a person mints tokens only for themself; approval needs
another person, refused (and audited) for a second token of the author's person and for a
person the proposer enrolled after proposing; the migration makes every older token its
own person."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text

import sluice.store
from sluice.control import Controller, EventLog, ReviewBoard, TokenAdmin
from sluice.control.auth import Authenticator, Principal, Role
from sluice.control.tokens import INSTALLATION
from sluice.core import Forbidden, ManualClock
from sluice.spec import Sealer, load_spec_text
from sluice.store import Store
from tests.databases import Database

SPEC = """
control: {{review: {{routes: true}}}}
pools:
  - {{name: local, count: 8, memory_gb: 16}}
groups:
  - name: chat
    owner: o@example.com
    business: search
    alert_channel: "#ops"
    models:
      m: {{runtime: sim}}
    resources: {{pool: local, memory_gb: 1}}
    replicas: 1
routes:
  - {{tag: {tag}, match: {{models: [m]}}, to: chat}}
"""

SEALER = Sealer(bytes(range(64)))
"""a fixed secrets key: a test's controllers on one store read each other's revisions"""


class Supervisor:
    """No instances: review only records revisions, nothing is launched here."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()

    def statuses(self) -> list[Any]:
        return []


class Platform:
    """A controller with review on, its review board and token admin, and who is who."""

    def __init__(self, store: Store, clock: ManualClock) -> None:
        self.store = store
        self.clock = clock
        self.tokens = TokenAdmin(store, clock)
        self.auth = Authenticator(store, clock)
        sup = Supervisor()
        self.ctl = Controller(
            store, sup, EventLog(store, clock), clock, lambda _: None, sealer=SEALER
        )  # type: ignore[arg-type]
        self.board = ReviewBoard(self.ctl, store, clock, access_log=None)
        self.secrets: dict[str, str] = {}

    async def who(self, token_name: str) -> Principal:
        return await self.auth.authenticate(f"Bearer {self.secrets[token_name]}")

    async def mint(self, by: str, name: str, owner: str | None = None) -> Principal:
        """`by` mints an admin token `name` (through the API's path, `TokenAdmin.mint`)."""
        token, _ = await self.tokens.mint(
            name, Role.ADMIN, None, None, owner, by=await self.who(by)
        )
        self.secrets[name] = token
        return await self.who(name)

    async def propose(self, by: str, tag: str) -> int:
        me = await self.who(by)
        loaded = load_spec_text(SPEC.format(tag=tag), "proposed.yaml")
        return (await self.board.propose(loaded, me.name, "a new tag", person=me.person)).id

    async def approve(self, by: str, proposal: int) -> Any:
        me = await self.who(by)
        return await self.board.approve(proposal, me.name, "checked", person=me.person)


@contextlib.asynccontextmanager
async def platform(store: Store, home: Path) -> AsyncIterator[Platform]:
    """Started as `sluice up` starts: a first spec, then the installation's admin token."""
    p = Platform(store, ManualClock(1_800_000_000.0))
    await p.ctl.apply(load_spec_text(SPEC.format(tag="main"), "base.yaml"), "tester", "base")
    path = await p.tokens.bootstrap(home)
    assert path is not None
    p.secrets["admin"] = path.read_text().strip()
    try:
        yield p
    finally:
        await p.ctl.close()


def test_a_person_mints_tokens_only_for_themself(store: Store, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with platform(store, tmp_path) as p:
            admin = await p.who("admin")
            assert admin.person == INSTALLATION
            # The installation enrolls: a person named like the token, or the owner given.
            alice = await p.mint("admin", "alice")
            assert alice.person == "alice"
            bob = await p.mint("admin", "bob-laptop", owner="Bob@Example.com")
            assert bob.person == "bob@example.com"  # persons are lower-case
            # Anyone else mints for themself only: by default, or naming themself.
            assert (await p.mint("alice", "alice-2")).person == "alice"
            assert (await p.mint("alice", "alice-3", owner="ALICE")).person == "alice"
            with pytest.raises(Forbidden, match="a token can only be minted for yourself") as e:
                await p.mint("alice", "sock", owner="sock@example.com")
            assert e.value.http_status == 403
            assert "token 'alice' belongs to person 'alice'" in str(e.value)
            assert "sock" not in {t.name for t in store.list_tokens()}
            # A second installation token (to rotate admin.token) enrolls too.
            assert (await p.mint("admin", "admin-2", owner="admin")).person == INSTALLATION
            assert (await p.mint("admin-2", "carol")).person == "carol"

            rows = {e.target: e for e in store.list_audit(action="token-create")}
            assert rows["token/alice-2"].actor == "alice"
            assert rows["token/alice-2"].detail["person"] == "alice"
            assert rows["token/alice-2"].detail["owner"] == "alice"
            assert rows["token/bob-laptop"].detail["person"] == INSTALLATION
            assert rows["token/bob-laptop"].detail["owner"] == "bob@example.com"
            listed = {t.name: t.to_json()["person"] for t in store.list_tokens()}
            assert listed["alice-3"] == "alice" and listed["admin"] == INSTALLATION

    asyncio.run(scenario())


def test_approval_needs_another_person_not_another_token(store: Store, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with platform(store, tmp_path) as p:
            await p.mint("admin", "alice", owner="alice@x")
            await p.mint("admin", "bob")
            p.clock.advance(10)
            proposal = await p.propose("alice", "vip")
            assert (await p.board.get(proposal)).author_person == "alice@x"
            p.clock.advance(10)
            await p.mint("alice", "sock")  # a second token: still alice@x
            revision = p.ctl.revision

            with pytest.raises(Forbidden) as refused:
                await p.approve("sock", proposal)
            assert refused.value.http_status == 403
            assert str(refused.value) == (
                f"proposal {proposal} was proposed by token alice (person alice@x); token "
                "sock belongs to the same person: ask another person to "
                f"`sluice approve {proposal}`"
            )
            assert (await p.board.get(proposal)).state == "pending"
            assert p.ctl.revision == revision  # nothing applied
            (attempt,) = store.list_audit(action="approve-refused")
            assert (attempt.actor, attempt.target) == ("sock", f"proposal/{proposal}")
            assert attempt.detail == {
                "person": "alice@x",
                "author": "alice",
                "author_person": "alice@x",
            }
            assert "belongs to the same person" in attempt.reason

            done = await p.approve("bob", proposal)
            assert (done.state, done.reviewer, done.reviewer_person) == ("approved", "bob", "bob")
            assert (done.author, done.author_person) == ("alice", "alice@x")
            assert p.ctl.revision == revision + 1
            (approved,) = store.list_audit(action="approve")
            assert approved.detail["person"] == "bob"
            assert approved.detail["author_person"] == "alice@x"
            (proposed,) = store.list_audit(action="propose")
            assert (proposed.actor, proposed.detail["person"]) == ("alice", "alice@x")

    asyncio.run(scenario())


def test_the_installation_cannot_enroll_a_sock_after_proposing(
    store: Store, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with platform(store, tmp_path) as p:
            await p.mint("admin", "bob")  # a person from before the proposal
            p.clock.advance(10)
            proposal = await p.propose("admin", "vip")
            p.clock.advance(10)
            await p.mint("admin", "sock")  # a new person, enrolled after proposing
            await p.mint("sock", "sock-2")  # and that person's own second token
            for name in ("sock", "sock-2"):
                with pytest.raises(Forbidden, match="enrolled by the proposer after proposing"):
                    await p.approve(name, proposal)
            refused = store.list_audit(action="approve-refused")
            assert [(e.actor, e.detail["person"]) for e in refused] == [
                ("sock-2", "sock"),
                ("sock", "sock"),
            ]
            assert (
                "enrolled after the proposal by token admin of the same person admin"
                in refused[0].reason
            )
            done = await p.approve("bob", proposal)
            assert (done.state, done.reviewer_person, done.author_person) == (
                "approved",
                "bob",
                INSTALLATION,
            )

    asyncio.run(scenario())


def test_the_author_may_withdraw_with_any_of_their_tokens(store: Store, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with platform(store, tmp_path) as p:
            await p.mint("admin", "alice")
            proposal = await p.propose("alice", "vip")
            await p.mint("alice", "alice-2")
            me = await p.who("alice-2")
            done = await p.board.reject(proposal, me.name, "withdrawn", person=me.person)
            assert (done.state, done.reviewer, done.reviewer_person) == (
                "rejected",
                "alice-2",
                "alice",
            )
            (row,) = store.list_audit(action="reject")
            assert (row.detail["person"], row.detail["author_person"]) == ("alice", "alice")

    asyncio.run(scenario())


def test_the_migration_makes_every_older_token_its_own_person(database: Database) -> None:
    """A store at revision 0015 with a token and a proposal: after the upgrade the token is
    a person named like it (lower-case), and so are the proposal's author and reviewer."""
    cfg = Config()
    migrations = Path(sluice.store.__file__).parent / "migrations"
    cfg.set_main_option("script_location", str(migrations).replace("%", "%%"))
    engine = create_engine(database.url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0015")
            conn.execute(
                text(
                    "INSERT INTO tokens (name, role, digest, created_at, created_by) "
                    "VALUES ('Ops-Team', 'admin', 'd1', 1.0, 'admin')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO proposals (created_at, author, reason, base_revision, "
                    "yaml_text, diff, preview, state, reviewer) VALUES "
                    "(2.0, 'Ops-Team', 'r', 1, 'y', 'd', '{}', 'rejected', 'bob')"
                )
            )
    finally:
        engine.dispose()
    with database.open() as store:
        (token,) = store.list_tokens()
        assert (token.name, token.person) == ("Ops-Team", "ops-team")
        (p,) = store.list_proposals(state=None)
        assert (p.author_person, p.reviewer_person) == ("ops-team", "bob")
