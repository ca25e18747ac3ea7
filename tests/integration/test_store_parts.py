"""The rest of the store, each test on SQLite and on PostgreSQL (conftest.py's `store`):
tokens and console sessions, metrics history, the alert outbox, capacity runs, pins, drill
firings, retention; and what only a server brings: a lost race retried in a new
transaction, 64-bit ids, and a database that cannot be reached, named without its password.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, insert

from sluice.cli.common import state_store
from sluice.config import Settings
from sluice.core import Conflict, NotFound, SluiceError, Unavailable
from sluice.store import Pin, RollupRow, Store, schema
from tests.databases import Database, postgres_server


def test_tokens_are_unique_by_name_and_revoked_not_deleted(store: Store) -> None:
    kw: dict[str, Any] = {"role": "operator", "created_by": "admin", "expires_at": None, "now": 1}
    ana = store.add_token(name="ana", groups=["chat", "embed"], digest="d1", **kw)
    assert (ana.name, ana.groups, ana.revoked_at) == ("ana", ("chat", "embed"), None)
    with pytest.raises(Conflict, match="exists already"):
        store.add_token(name="ana", groups=None, digest="d2", **kw)
    # The refused insert rolled back cleanly: the store goes on writing.
    bo = store.add_token(name="bo", groups=None, digest="d2", **kw)
    assert store.token_by_digest("d2") == bo
    assert store.token_by_digest("nope") is None
    revoked = store.revoke_token("ana", by="admin", now=5.0)
    assert (revoked.revoked_at, revoked.revoked_by) == (5.0, "admin")
    assert store.revoke_token("ana", by="other", now=9.0) == revoked
    assert [t.name for t in store.list_tokens()] == ["ana", "bo"]
    with pytest.raises(NotFound):
        store.get_token("carol")


def test_console_sessions_follow_their_token_and_are_pruned(store: Store) -> None:
    store.add_token(
        name="ana",
        role="viewer",
        groups=None,
        digest="t1",
        created_by="admin",
        expires_at=None,
        now=1.0,
    )
    store.add_session(digest="s1", token_name="ana", now=10.0, expires_at=100.0)
    store.add_session(digest="s2", token_name="gone", now=10.0, expires_at=20.0)
    found = store.session_by_digest("s1")
    assert found is not None
    session, token = found
    assert (session.token_name, session.expires_at, session.ended_at) == ("ana", 100.0, None)
    assert token is not None and token.name == "ana"
    orphan = store.session_by_digest("s2")
    assert orphan is not None and orphan[1] is None
    assert store.session_by_digest("s3") is None
    store.end_session("s1", now=30.0)
    store.end_session("s1", now=40.0)  # the first end counts
    ended = store.session_by_digest("s1")
    assert ended is not None and ended[0].ended_at == 30.0
    assert store.prune_sessions(before=25.0) == 1  # s2 expired at 20
    assert store.prune_sessions(before=35.0) == 1  # s1 ended at 30
    assert store.session_by_digest("s1") is None


def test_rollups_replace_by_key_read_in_order_and_prune(store: Store) -> None:
    assert store.latest_rollup(60) is None
    rows = [RollupRow(g, 60, 120.0 + 60 * i, {"n": i}) for i in range(3) for g in ("b", "a")]
    store.write_rollups(rows)
    store.write_rollups([RollupRow("a", 60, 180.0, {"n": 99}), RollupRow("a", 3600, 0.0, {})])
    store.write_rollups([])
    got = store.read_rollups(60, 120.0, 240.0)
    assert [(r.group, r.start, r.data["n"]) for r in got] == [
        ("a", 120.0, 0),
        ("b", 120.0, 0),
        ("a", 180.0, 99),
        ("b", 180.0, 1),
    ]
    assert [r.start for r in store.read_rollups(60, 0.0, 1e9, groups=["b"])] == [120, 180, 240]
    assert store.latest_rollup(60) == 240.0
    assert store.latest_rollup(3600) == 0.0
    assert store.prune_rollups(60, before=180.0) == 2
    assert len(store.read_rollups(60, 0.0, 1e9)) == 4


def test_alert_outbox_retries_delivers_dead_letters_and_prunes(store: Store) -> None:
    first = store.add_delivery(group="chat", rule="p99", state="firing", payload={"a": 1}, now=1.0)
    second = store.add_delivery(group="embed", rule="err", state="firing", payload={}, now=2.0)
    assert [d.id for d in store.due_deliveries(now=1.5)] == [first]
    store.record_attempt(first, now=3.0, delivered=False, error="x" * 5000, retry_at=10.0)
    store.record_attempt(second, now=3.0, delivered=True)
    assert store.due_deliveries(now=5.0) == []
    [retry] = store.due_deliveries(now=10.0)
    assert (retry.attempts, len(retry.last_error)) == (1, 2000)
    store.record_attempt(first, now=11.0, delivered=False, error="down", retry_at=None)
    [dead] = store.list_deliveries(undelivered=True)
    assert (dead.id, dead.dead_at, dead.attempts, dead.payload) == (first, 11.0, 2, {"a": 1})
    assert [d.id for d in store.list_deliveries(group="embed")] == [second]
    assert store.prune_deliveries(before=1.5) == 1
    assert [d.id for d in store.list_deliveries()] == [second]


def test_capacity_runs_pins_and_drill_firings(store: Store) -> None:
    kw: dict[str, Any] = {"group": "chat", "mode": "live", "actor": "ana", "report": {"k": 1}}
    one = store.add_capacity_run(kind="loadtest", version="v1", verdict="measured", now=1, **kw)
    two = store.add_capacity_run(kind="drill", version="v2", verdict="pass", now=2, **kw)
    assert [r.id for r in store.list_capacity_runs()] == [two, one]
    assert [r.id for r in store.list_capacity_runs(kind="loadtest", group="chat")] == [one]
    assert store.get_capacity_run(two).report == {"k": 1}
    with pytest.raises(ValueError, match="kind"):
        store.add_capacity_run(kind="soak", version="v1", verdict="x", now=3, **kw)

    store.set_pin(Pin("chat", 1, "ana", "loadtest", 10.0, 70.0))
    store.set_pin(Pin("chat", 2, "bo", "again", 20.0, 80.0))
    assert store.pins() == [Pin("chat", 2, "bo", "again", 20.0, 80.0)]
    store.clear_pin("chat")
    store.clear_pin("chat")
    assert store.pins() == []

    fire: dict[str, Any] = {"group": "chat", "actor": "scheduler", "detail": {}}
    running = store.add_drill_fire(
        schedule="nightly", trigger="cron", due_at=100.0, status="running", now=101.0, **fire
    )
    store.add_drill_fire(
        schedule="nightly", trigger="cron", due_at=200.0, status="missed", now=900.0, **fire
    )
    store.add_drill_fire(
        schedule="weekly", trigger="manual", due_at=500.0, status="skipped", now=500.0, **fire
    )
    store.finish_drill_fire(running, status="passed", run_id=two, detail={"ok": 1}, now=150.0)
    done = store.get_drill_fire(running)
    assert (done.status, done.run_id, done.finished_at, done.detail) == (
        "passed",
        two,
        150.0,
        {"ok": 1},
    )
    assert [f.status for f in store.list_drill_fires(schedule="nightly")] == ["missed", "passed"]
    assert store.list_drill_fires(status="running") == []
    assert store.last_cron_firings() == {"nightly": 200.0}


def test_prune_drops_only_what_is_older_than_its_cutoff(store: Store) -> None:
    for at in (1.0, 5.0):
        store.append_event(group="g", instance=None, kind="k", message="", detail={}, now=at)
        store.append_audit(actor="a", action="b", target="t", reason="", detail={}, now=at)
        store.append_decision(
            group="g",
            policy="sluice",
            current=1,
            desired=1,
            winner=None,
            reason="",
            detail={},
            now=at,
        )
    old = store.open_loan(lender="a", borrower="b", pool="p", units=1, reason="", now=1.0)
    store.open_loan(lender="a", borrower="b", pool="p", units=1, reason="", now=1.0)
    store.close_loan(old, now=2.0, end_reason="done")
    pruned = store.prune(
        events_before=3.0, decisions_before=0.0, loans_ended_before=3.0, audit_before=9.0
    )
    assert (pruned.events, pruned.decisions, pruned.loans, pruned.audit) == (1, 0, 1, 2)
    assert [e.at for e in store.list_events()] == [5.0]
    assert len(store.list_loans(open_only=True)) == 1


# -- what a server brings ---------------------------------------------------------------


def test_a_write_that_lost_a_race_is_retried_in_a_new_transaction(store: Store) -> None:
    """On PostgreSQL a failed statement aborts its transaction: the retry must not reuse it."""
    store.add_revision(yaml_text="", author="a", reason="", diff="", now=0.0)
    rev = {"created_at": 0.0, "author": "a", "reason": "", "yaml_text": "", "diff": ""}
    tries: list[int] = []

    def work(conn: Connection) -> int:
        tries.append(1)
        if len(tries) == 1:  # as if another writer had taken number 1 first
            conn.execute(insert(schema.revisions).values(number=1, **rev))
        conn.execute(insert(schema.revisions).values(number=2, **rev))
        return len(tries)

    assert store._write(work) == 2
    assert [r.number for r in store.list_revisions()] == [2, 1]


def test_row_ids_are_64_bit(store: Store) -> None:
    big = 2**40
    store._write(
        lambda conn: conn.execute(
            insert(schema.events).values(
                id=big, at=1.0, group_name="g", kind="k", message="", detail="{}"
            )
        )
    )
    assert [e.id for e in store.list_events(since_id=big - 1)] == [big]
    assert store.list_events(since_id=2**62) == []
    with pytest.raises(NotFound):
        store.get_capacity_run(2**62)
    with pytest.raises(NotFound):
        store.get_proposal(2**35)


def test_state_store_opens_the_settings_database(database: Database, tmp_path: Path) -> None:
    home = tmp_path / "home"
    with state_store(Settings(home=home, database_url=database.url)) as store:
        store.put_state("k", {"v": 1}, now=1.0)
        assert "***" in store.location or database.backend == "sqlite"
    with Store.open(database.url) as again:
        assert again.get_state("k") == {"v": 1}
    with state_store(Settings(home=home)) as default:
        assert default.location == f"sqlite:///{home / 'state.db'}"
        assert default.get_state("k") is None


def test_an_unreachable_database_is_unavailable_and_names_no_password() -> None:
    server = postgres_server()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    wrong = [
        server.set(password="not-the-password-x1"),
        server.set(port=closed_port, password="not-the-password-x1"),
        server.set(database="no_such_database", password=server.password),
    ]
    for url in wrong:
        with pytest.raises(Unavailable) as err:
            Store.open(url.render_as_string(hide_password=False))
        assert "127.0.0.1" in err.value.message
        assert "$SLUICE_DATABASE_URL" in err.value.message
        assert str(server.password) not in err.value.message
        assert "not-the-password-x1" not in err.value.message
        assert err.value.detail == {"host": "127.0.0.1"}


def test_a_bad_database_url_is_refused_without_repeating_a_password() -> None:
    for url in ("::not a url s3cret", "mysql://u:s3cret@127.0.0.1/db", "oracle://u:s3cret@h/x"):
        with pytest.raises(SluiceError) as err:
            Store.open(url)
        assert "s3cret" not in err.value.message
        assert "$SLUICE_DATABASE_URL" in err.value.message
