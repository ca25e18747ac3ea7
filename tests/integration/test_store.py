"""The store against real databases, each test on a SQLite file and on a fresh PostgreSQL
database (the `database` and `store` fixtures of conftest.py): behaviour, persistence,
concurrency, migration parity."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, delete, inspect, text

import sluice.store
from sluice.core import Conflict, InstanceState, NotFound
from sluice.store import AuditEntry, Event, InstanceRecord, Revision, Store, schema
from sluice.store.schema import metadata
from tests.databases import Database

HEAD = ScriptDirectory(str(Path(sluice.store.__file__).parent / "migrations")).get_current_head()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A state directory, for what only the SQLite file under one does."""
    return tmp_path / "home"


def _rev(store: Store, n: int) -> Revision:
    return store.add_revision(
        yaml_text=f"groups: {n}\n", author="ana", reason=f"r{n}", diff=f"+{n}", now=100.0 + n
    )


def _inst(id: str, state: InstanceState = InstanceState.READY, **kw: object) -> InstanceRecord:
    fields: dict[str, object] = {
        "id": id,
        "group": "chat",
        "template": "t1",
        "state": state,
        "pid": 1234,
        "host": "127.0.0.1",
        "port": 9000,
        "created_at": 10.0,
        "updated_at": 11.0,
        "reason": "",
    }
    fields.update(kw)
    return InstanceRecord(**fields)  # type: ignore[arg-type]


# -- opening and migrations ----------------------------------------------------------------


def test_for_home_creates_home_and_migrates(home: Path) -> None:
    with Store.for_home(home):
        pass
    db = home / "state.db"
    assert db.is_file()
    with sqlite3.connect(db) as raw:
        (version,) = raw.execute("SELECT version_num FROM alembic_version").fetchone()
        (mode,) = raw.execute("PRAGMA journal_mode").fetchone()
    raw.close()
    assert version == HEAD
    assert mode == "wal"


def test_every_connection_gets_the_sqlite_pragmas(home: Path) -> None:
    with Store.for_home(home) as store, store._engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_reopening_is_a_noop_upgrade(database: Database) -> None:
    database.open().close()
    database.open().close()
    engine = create_engine(database.url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).all() == [(HEAD,)]
    engine.dispose()


def test_migrations_match_schema_exactly(database: Database) -> None:
    database.open().close()
    engine = create_engine(database.url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        tables = set(inspect(conn).get_table_names())
    engine.dispose()
    assert tables == set(metadata.tables) | {"alembic_version"}


def test_in_memory_sqlite_is_refused() -> None:
    with pytest.raises(ValueError, match="in-memory"):
        Store.open("sqlite://")


# -- spec revisions ----------------------------------------------------------------------


def test_revisions_are_numbered_from_one_and_listed_newest_first(store: Store) -> None:
    assert store.latest_revision() is None
    assert store.list_revisions() == []
    revs = [_rev(store, n) for n in range(1, 5)]
    assert [r.number for r in revs] == [1, 2, 3, 4]
    assert store.latest_revision() == revs[-1]
    assert store.list_revisions() == revs[::-1]
    assert store.list_revisions(limit=2) == [revs[3], revs[2]]
    assert store.get_revision(2) == revs[1]
    assert revs[1].to_json() == {
        "number": 2,
        "created_at": 102.0,
        "author": "ana",
        "reason": "r2",
        "yaml_text": "groups: 2\n",
        "diff": "+2",
    }


def test_unknown_revision_is_not_found(store: Store) -> None:
    _rev(store, 1)
    with pytest.raises(NotFound) as err:
        store.get_revision(7)
    assert err.value.detail == {"revision": 7}


def test_limits_must_be_positive(store: Store) -> None:
    for call in (store.list_revisions, lambda limit: store.list_audit(limit=limit)):
        with pytest.raises(ValueError, match="limit"):
            call(0)


# PostgreSQL's text holds no NUL character (SQLite's does); nothing Sluice stores has one.
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=200)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.lists(st.tuples(TEXT.map(lambda t: t[:20]), TEXT), max_size=12))
def test_any_sequence_of_revisions_is_numbered_consecutively_from_one(
    store: Store, calls: list[tuple[str, str]]
) -> None:
    # One database for every example, emptied first (a fresh one each would be slow).
    store._write(lambda conn: conn.execute(delete(schema.revisions)))
    revs = [
        store.add_revision(yaml_text=y, author=a, reason="", diff="", now=float(i))
        for i, (a, y) in enumerate(calls)
    ]
    assert [r.number for r in revs] == list(range(1, len(calls) + 1))
    assert store.list_revisions(limit=100) == revs[::-1]
    assert store.latest_revision() == (revs[-1] if revs else None)


# -- audit log ---------------------------------------------------------------------------


def test_audit_is_append_only_and_filtered_by_target(store: Store) -> None:
    a = store.append_audit(
        actor="ana", action="apply", target="spec", reason="v2", detail={"rev": 2}, now=1.0
    )
    b = store.append_audit(
        actor="bo", action="scale", target="group/chat", reason="load", detail={}, now=2.0
    )
    c = store.append_audit(
        actor="ana",
        action="scale",
        target="group/chat",
        reason="",
        detail={"to": 3, "why": ["spike", "ünïcode"]},
        now=3.0,
    )
    assert a.id < b.id < c.id
    assert store.list_audit() == [c, b, a]
    assert store.list_audit(target="group/chat") == [c, b]
    assert store.list_audit(target="group/chat", limit=1) == [c]
    assert store.list_audit(target="nothing") == []
    assert c.to_json()["detail"] == {"to": 3, "why": ["spike", "ünïcode"]}
    public = {name for name in dir(Store) if not name.startswith("_")}
    assert {n for n in public if "audit" in n} == {"append_audit", "list_audit"}


def test_detail_round_trips_as_json_and_rejects_the_rest(store: Store) -> None:
    entry = store.append_audit(
        actor="a", action="x", target="t", reason="", detail={"pair": (1, 2)}, now=0.0
    )
    assert entry.detail == {"pair": [1, 2]}
    assert store.list_audit() == [entry]
    assert isinstance(entry, AuditEntry)
    with pytest.raises(TypeError):
        store.append_audit(actor="a", action="x", target="t", reason="", detail={"s": {1}}, now=0)
    with pytest.raises(ValueError):
        store.append_audit(
            actor="a", action="x", target="t", reason="", detail={"n": float("nan")}, now=0
        )
    assert len(store.list_audit()) == 1


# -- events ------------------------------------------------------------------------------


def test_events_filter_by_group_and_since_id(store: Store) -> None:
    def ev(group: str, instance: str | None, n: int) -> Event:
        return store.append_event(
            group=group, instance=instance, kind="launch", message=f"m{n}", detail={"n": n}, now=n
        )

    e1, e2, e3, e4 = (
        ev("chat", "i-1", 1),
        ev("embed", None, 2),
        ev("chat", None, 3),
        ev("chat", "i-2", 4),
    )
    assert store.list_events() == [e4, e3, e2, e1]
    assert store.list_events(group="chat") == [e4, e3, e1]
    assert store.list_events(since_id=e2.id) == [e4, e3]
    assert store.list_events(group="chat", since_id=e1.id, limit=1) == [e4]
    assert store.list_events(group="none") == []
    assert e2.instance is None
    assert e4.to_json() == {
        "id": e4.id,
        "at": 4.0,
        "group": "chat",
        "instance": "i-2",
        "kind": "launch",
        "message": "m4",
        "detail": {"n": 4},
    }


# -- instances ---------------------------------------------------------------------------


def test_instance_upsert_list_delete(store: Store) -> None:
    assert store.list_instances() == []
    b = _inst("b", InstanceState.STARTING, group="embed")
    a = _inst("a", InstanceState.PENDING, pid=None, host=None, port=None)
    store.upsert_instance(b)
    store.upsert_instance(a)
    assert store.list_instances() == [a, b]

    a_ready = _inst("a", InstanceState.READY, updated_at=20.0, reason="warm")
    store.upsert_instance(a_ready)
    assert store.list_instances() == [a_ready, b]

    b_stopped = _inst("b", InstanceState.STOPPED, group="embed", reason="scaled in")
    store.upsert_instance(b_stopped)
    failed = _inst("c", InstanceState.FAILED)
    store.upsert_instance(failed)
    assert store.list_instances() == [a_ready, failed]
    assert store.list_instances(include_stopped=True) == [a_ready, failed, b_stopped]

    store.delete_instance("a")
    store.delete_instance("never-existed")
    assert store.list_instances(include_stopped=True) == [failed, b_stopped]


def test_instance_state_is_a_plain_valid_state_string() -> None:
    rec = _inst("a", InstanceState.WARMING)
    assert type(rec.state) is str
    assert rec.to_json()["state"] == "warming"
    with pytest.raises(ValueError):
        _inst("a", "sleeping")  # type: ignore[arg-type]


# -- replica overrides -------------------------------------------------------------------


def test_replica_overrides_set_replace_clear(store: Store) -> None:
    assert store.replicas_overrides() == {}
    store.set_replicas_override(group="chat", replicas=3, actor="ana", reason="x", now=1.0)
    store.set_replicas_override(group="embed", replicas=0, actor="ana", reason="x", now=1.0)
    store.set_replicas_override(group="chat", replicas=5, actor="bo", reason="y", now=2.0)
    assert store.replicas_overrides() == {"chat": 5, "embed": 0}
    store.clear_replicas_override("chat")
    store.clear_replicas_override("never-set")
    assert store.replicas_overrides() == {"embed": 0}
    with pytest.raises(ValueError, match="replicas"):
        store.set_replicas_override(group="chat", replicas=-1, actor="a", reason="", now=3.0)


def test_failovers_set_replace_clear_and_persist(database: Database) -> None:
    with database.open() as s:
        assert s.failovers() == {}
        s.set_failover(group="chat", backup="chat-b", actor="ana", reason="outage", now=1.0)
        s.set_failover(group="chat", backup="chat-c", actor="ana", reason="b is down", now=2.0)
        s.set_failover(group="embed", backup="embed-b", actor="bo", reason="x", now=3.0)
        s.clear_failover("embed")
        s.clear_failover("never-set")
    with database.open() as s:
        assert s.failovers() == {"chat": "chat-c"}


# -- persistence and sharing ---------------------------------------------------------------


def test_reopen_persists_everything(database: Database) -> None:
    with database.open() as s:
        rev = _rev(s, 1)
        audit = s.append_audit(actor="a", action="b", target="c", reason="d", detail={}, now=1)
        event = s.append_event(group="g", instance=None, kind="k", message="m", detail={}, now=2)
        inst = _inst("i-1")
        s.upsert_instance(inst)
        s.set_replicas_override(group="g", replicas=2, actor="a", reason="", now=3)
    with database.open() as s:
        assert s.list_revisions() == [rev]
        assert s.list_audit() == [audit]
        assert s.list_events() == [event]
        assert s.list_instances() == [inst]
        assert s.replicas_overrides() == {"g": 2}
        assert _rev(s, 2).number == 2


def test_two_stores_on_one_database_see_each_others_writes(database: Database) -> None:
    with database.open() as one, database.open() as two:
        r1 = _rev(one, 1)
        assert two.latest_revision() == r1
        r2 = _rev(two, 2)
        assert r2.number == 2
        assert one.list_revisions() == [r2, r1]
        two.set_replicas_override(group="chat", replicas=1, actor="a", reason="", now=0)
        assert one.replicas_overrides() == {"chat": 1}
        one.upsert_instance(_inst("i-1"))
        assert two.list_instances() == [_inst("i-1")]


def test_concurrent_writers_get_unique_consecutive_numbers(database: Database) -> None:
    per_thread = 15
    with database.open() as one, database.open() as two:
        numbers: list[int] = []
        lock = threading.Lock()

        def write(store: Store) -> None:
            for n in range(per_thread):
                number = _rev(store, n).number
                with lock:
                    numbers.append(number)

        threads = [threading.Thread(target=write, args=(s,)) for s in (one, two, one, two)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(numbers) == list(range(1, 4 * per_thread + 1))
        assert [r.number for r in two.list_revisions(limit=100)] == sorted(numbers, reverse=True)


def test_scaling_decisions_are_journaled_newest_first(database: Database) -> None:
    with database.open() as store:
        for i, desired in enumerate((2, 4, 3)):
            store.append_decision(
                group="chat",
                policy="sluice",
                current=desired - 1,
                desired=desired,
                winner="concurrency",
                reason=f"step {i}",
                detail={"signals": {"concurrency": 1.5 * i}, "clipped_by": ["step"]},
                now=100.0 + i,
            )
        store.append_decision(
            group="other",
            policy="hpa",
            current=1,
            desired=1,
            winner=None,
            reason="hold",
            detail={},
            now=200.0,
        )
        got = store.list_decisions(group="chat", limit=2)
    assert [d.desired for d in got] == [3, 4]
    assert got[0].detail == {"signals": {"concurrency": 3.0}, "clipped_by": ["step"]}
    assert got[0].reason == "step 2" and got[0].policy == "sluice"


# -- the borrow ledger (quota loans, Q4) ----------------------------------------------------


def test_loans_open_reclaim_close_with_latency(store: Store) -> None:
    a = store.open_loan(lender="a", borrower="b", pool="gpu", units=3, reason="burst", now=10.0)
    shared = store.open_loan(
        lender=None, borrower="b", pool="gpu", units=1, reason="unassigned", now=11.0
    )
    [first, second] = store.list_loans(open_only=True)
    assert (first.id, second.id) == (shared, a)
    assert first.lender is None and first.open and second.units == 3
    store.request_reclaim(a, now=20.0)
    store.request_reclaim(a, now=25.0)  # only the first request counts
    closed = store.close_loan(a, now=32.5, end_reason="reclaimed by a")
    assert closed.reclaim_requested_at == 20.0
    assert closed.reclaim_latency_s == pytest.approx(12.5)
    assert closed.ended_at == 32.5 and not closed.open
    assert closed.unit_hours(now=1e9) == pytest.approx(3 * 22.5 / 3600)
    again = store.close_loan(a, now=99.0, end_reason="twice")
    assert again == closed
    plain = store.close_loan(shared, now=40.0, end_reason="scaled down")
    assert plain.reclaim_latency_s is None and plain.end_reason == "scaled down"
    assert store.list_loans(open_only=True) == []
    assert [x.id for x in store.list_loans()] == [shared, a]


def test_loans_filter_by_group_as_lender_or_borrower(store: Store) -> None:
    ab = store.open_loan(lender="a", borrower="b", pool="p", units=1, reason="", now=1.0)
    cb = store.open_loan(lender="c", borrower="b", pool="p", units=2, reason="", now=2.0)
    bd = store.open_loan(lender="b", borrower="d", pool="p", units=1, reason="", now=3.0)
    assert [x.id for x in store.list_loans(group="a")] == [ab]
    assert [x.id for x in store.list_loans(group="b")] == [bd, cb, ab]
    assert [x.id for x in store.list_loans(group="b", limit=1)] == [bd]
    assert store.list_loans(group="zzz") == []


def test_loan_errors(store: Store) -> None:
    with pytest.raises(ValueError, match="units=0"):
        store.open_loan(lender="a", borrower="b", pool="p", units=0, reason="", now=1.0)
    with pytest.raises(NotFound):
        store.request_reclaim(404, now=1.0)
    with pytest.raises(NotFound):
        store.close_loan(404, now=1.0, end_reason="")


def test_loans_persist_and_feed_ledger_changes(database: Database) -> None:
    from sluice.policy.quota import Loan as PolicyLoan
    from sluice.policy.quota import ledger_changes

    with database.open() as store:
        lid = store.open_loan(lender="a", borrower="b", pool="p", units=3, reason="", now=1.0)
    with database.open() as store:
        rows = store.list_loans(open_only=True)
        assert [r.id for r in rows] == [lid]
        changes = ledger_changes(rows, [PolicyLoan("a", "b", "p", 1)])
    assert changes.close == (lid,)
    assert changes.open == (PolicyLoan("a", "b", "p", 1),)


def test_controller_state_round_trips_and_overwrites(database: Database) -> None:
    with database.open() as store:
        assert store.get_state("quota") is None
        store.put_state("quota", {"spent": {"a": 1.5}}, now=1.0)
        store.put_state("quota", {"spent": {"a": 2.5}}, now=2.0)
    with database.open() as store:  # survives a restart
        assert store.get_state("quota") == {"spent": {"a": 2.5}}


def test_rollout_runs_are_archived_and_updated(database: Database) -> None:
    with database.open() as store:
        rid = store.add_rollout(
            name="chat-v2",
            baseline="chat",
            canary="chat-v2",
            phase="stepping",
            started_by="alice",
            spec={"steps": [1, 100]},
            state={"step": 0},
            now=10.0,
        )
        assert [r.name for r in store.list_rollouts(active_only=True)] == ["chat-v2"]
        store.update_rollout(
            rid,
            phase="rolled_back",
            state={"step": 1},
            now=20.0,
            ended=True,
            conclusion="rolled back: error rate",
            compare={"exact_match_rate": 0.5},
        )
        assert store.list_rollouts(active_only=True) == []
        (run,) = store.list_rollouts(name="chat-v2")
    assert (run.phase, run.ended_at, run.conclusion) == (
        "rolled_back",
        20.0,
        "rolled back: error rate",
    )
    assert run.state == {"step": 1} and run.compare == {"exact_match_rate": 0.5}
    with database.open() as store, pytest.raises(NotFound):
        store.update_rollout(99, phase="x", state={}, now=1.0)


def test_proposals_are_reviewed_once_and_persist(database: Database) -> None:
    with database.open() as store:
        kw = {"base_revision": 3, "yaml_text": "pools: []\n", "diff": "-a\n+b\n", "now": 10.0}
        p1 = store.add_proposal(author="alice", reason="vip", preview={"moved": 5}, **kw)
        p2 = store.add_proposal(author="carol", reason="typo", preview={}, **kw)
        assert (p1.id, p1.state, p1.preview, p1.reviewer) == (1, "pending", {"moved": 5}, None)
        assert [p.id for p in store.list_proposals()] == [2, 1]
        done = store.review_proposal(
            1, state="approved", reviewer="bob", reason="ok", now=20.0, revision=4
        )
        assert (done.state, done.reviewer, done.reviewed_at, done.revision) == (
            "approved",
            "bob",
            20.0,
            4,
        )
        with pytest.raises(Conflict, match="already approved"):
            store.review_proposal(1, state="rejected", reviewer="carol", reason="no", now=21.0)
        store.review_proposal(p2.id, state="rejected", reviewer="carol", reason="wd", now=22.0)
        with pytest.raises(NotFound):
            store.review_proposal(9, state="rejected", reviewer="x", reason="y", now=1.0)
        with pytest.raises(ValueError):
            store.review_proposal(1, state="pending", reviewer="x", reason="y", now=1.0)
        assert store.list_proposals() == []
    with database.open() as store:
        assert [p.state for p in store.list_proposals(state=None)] == ["rejected", "approved"]
        assert store.get_proposal(1).review_reason == "ok"
        with pytest.raises(NotFound):
            store.get_proposal(7)
