"""The durable memory of a fleet: spec revisions, audit log, events, instances, overrides.

SQLAlchemy Core over one SQLite file under the Sluice home needs no server, and the same
portable SQL runs on PostgreSQL. Every call is one short transaction, so a `Store` is safe to
share between `asyncio.to_thread` workers and between processes using the same database.
Time is always passed in; the store never reads a clock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Table,
    create_engine,
    delete,
    event,
    func,
    select,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from sluice.core import Conflict, InstanceState, NotFound
from sluice.store import schema
from sluice.store.records import (
    AuditEntry,
    Event,
    InstanceRecord,
    Loan,
    Proposal,
    Revision,
    RolloutRecord,
    ScalingDecision,
)

__all__ = ["Store"]

T = TypeVar("T")

_MIGRATIONS = Path(__file__).with_name("migrations")
_SQLITE_PRAGMAS = ("PRAGMA busy_timeout=5000", "PRAGMA journal_mode=WAL", "PRAGMA foreign_keys=ON")
# Execution option marking the writer engine; on SQLite its transactions begin IMMEDIATE.
_WRITER = "sluice_writer"


class Store:
    """Synchronous access to the state database; open with `Store.open` or `Store.for_home`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = engine.execution_options(**{_WRITER: True})

    @classmethod
    def open(cls, url: str) -> Store:
        """Connect to `url` and bring its schema to the latest migration."""
        sa_url = make_url(url)
        is_sqlite = sa_url.get_backend_name() == "sqlite"
        if is_sqlite and sa_url.database in (None, "", ":memory:"):
            raise ValueError(
                f"Store.open({url!r}): in-memory SQLite is private to one connection; "
                "use a file, e.g. Store.for_home(tmp_path)"
            )
        engine = create_engine(sa_url)
        if is_sqlite:
            _install_sqlite_hooks(engine)
        store = cls(engine)
        try:
            store._upgrade()
        except BaseException:
            engine.dispose()
            raise
        return store

    @classmethod
    def for_home(cls, home: Path) -> Store:
        """The store kept at `{home}/state.db`, creating `home` if needed."""
        home.mkdir(parents=True, exist_ok=True)
        return cls.open(f"sqlite:///{home / 'state.db'}")

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _upgrade(self) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", str(_MIGRATIONS).replace("%", "%%"))
        # Under the writer's lock, two processes opening a fresh file migrate one at a time.
        with self._writer.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in one write transaction, retrying once if a concurrent insert won a key."""
        try:
            with self._writer.begin() as conn:
                return work(conn)
        except IntegrityError:
            with self._writer.begin() as conn:
                return work(conn)

    def _upsert(self, table: Table, key: dict[str, Any], values: dict[str, Any]) -> None:
        """UPDATE-then-INSERT is portable; a racing insert of the same key retries via _write."""
        ((column, value),) = key.items()

        def work(conn: Connection) -> None:
            match = table.c[column] == value
            if not conn.execute(update(table).where(match).values(values)).rowcount:
                conn.execute(table.insert().values(**values, **key))

        self._write(work)

    def _append(self, table: Table, values: dict[str, Any]) -> int:
        """Insert one row into an append-only table; return the id the database assigned."""
        with self._writer.begin() as conn:
            key = conn.execute(table.insert().values(values)).inserted_primary_key
        assert key is not None  # single-row INSERT without RETURNING always reports it
        new_id: int = key[0]
        return new_id

    # -- spec revisions ------------------------------------------------------------------

    def add_revision(
        self, *, yaml_text: str, author: str, reason: str, diff: str, now: float
    ) -> Revision:
        """Record a new spec revision, numbered one past the latest (the first is 1)."""
        t = schema.revisions

        def insert_next(conn: Connection) -> Revision:
            latest = conn.execute(select(func.max(t.c.number))).scalar_one()
            rev = Revision(
                number=(latest or 0) + 1,
                created_at=now,
                author=author,
                reason=reason,
                yaml_text=yaml_text,
                diff=diff,
            )
            conn.execute(t.insert().values(rev.to_json()))
            return rev

        return self._write(insert_next)

    def latest_revision(self) -> Revision | None:
        revs = self.list_revisions(limit=1)
        return revs[0] if revs else None

    def get_revision(self, number: int) -> Revision:
        t = schema.revisions
        with self._engine.connect() as conn:
            row = conn.execute(select(t).where(t.c.number == number)).one_or_none()
        if row is None:
            raise NotFound(f"spec revision {number} does not exist", revision=number)
        return Revision(**row._asdict())

    def list_revisions(self, limit: int = 50) -> list[Revision]:
        """Newest first."""
        t = schema.revisions
        query = select(t).order_by(t.c.number.desc()).limit(_check_limit(limit))
        with self._engine.connect() as conn:
            return [Revision(**row._asdict()) for row in conn.execute(query)]

    # -- audit log (append-only: there is deliberately no update or delete) ---------------

    def append_audit(
        self,
        *,
        actor: str,
        action: str,
        target: str,
        reason: str,
        detail: dict[str, Any],
        now: float,
    ) -> AuditEntry:
        text = _dump(detail)
        values = {"at": now, "actor": actor, "action": action, "target": target, "reason": reason}
        new_id = self._append(schema.audit_log, {**values, "detail": text})
        # Returned as it will read back: the JSON round trip turns tuples into lists and so on.
        return AuditEntry(
            id=new_id,
            at=now,
            actor=actor,
            action=action,
            target=target,
            reason=reason,
            detail=_load(text),
        )

    def list_audit(self, *, target: str | None = None, limit: int = 100) -> list[AuditEntry]:
        """Newest first, optionally only the entries about `target`."""
        t = schema.audit_log
        query = select(t).order_by(t.c.id.desc()).limit(_check_limit(limit))
        if target is not None:
            query = query.where(t.c.target == target)
        with self._engine.connect() as conn:
            return [_audit(row) for row in conn.execute(query)]

    # -- controller events ----------------------------------------------------------------

    def append_event(
        self,
        *,
        group: str,
        instance: str | None,
        kind: str,
        message: str,
        detail: dict[str, Any],
        now: float,
    ) -> Event:
        text = _dump(detail)
        values = {"at": now, "group_name": group, "instance": instance, "kind": kind}
        new_id = self._append(schema.events, {**values, "message": message, "detail": text})
        return Event(
            id=new_id,
            at=now,
            group=group,
            instance=instance,
            kind=kind,
            message=message,
            detail=_load(text),
        )

    def list_events(
        self, *, group: str | None = None, limit: int = 100, since_id: int = 0
    ) -> list[Event]:
        """Newest first: the latest `limit` events with id above `since_id`."""
        t = schema.events
        query = (
            select(t).where(t.c.id > since_id).order_by(t.c.id.desc()).limit(_check_limit(limit))
        )
        if group is not None:
            query = query.where(t.c.group_name == group)
        with self._engine.connect() as conn:
            return [_event(row) for row in conn.execute(query)]

    # -- controller state ---------------------------------------------------------------------

    def put_state(self, key: str, value: dict[str, Any], now: float) -> None:
        self._upsert(
            schema.controller_state, {"key": key}, {"value": _dump(value), "updated_at": now}
        )

    def get_state(self, key: str) -> dict[str, Any] | None:
        t = schema.controller_state
        with self._engine.connect() as conn:
            text = conn.execute(select(t.c.value).where(t.c.key == key)).scalar_one_or_none()
        return None if text is None else _load(text)

    # -- the rollout archive ------------------------------------------------------------------

    def add_rollout(
        self,
        *,
        name: str,
        baseline: str,
        canary: str,
        phase: str,
        started_by: str,
        spec: dict[str, Any],
        state: dict[str, Any],
        now: float,
    ) -> int:
        values = {
            "name": name,
            "baseline": baseline,
            "canary": canary,
            "phase": phase,
            "started_at": now,
            "updated_at": now,
            "ended_at": None,
            "started_by": started_by,
            "spec": _dump(spec),
            "state": _dump(state),
            "compare": None,
            "conclusion": "",
        }
        return self._append(schema.rollouts, values)

    def update_rollout(
        self,
        rollout_id: int,
        *,
        phase: str,
        state: dict[str, Any],
        now: float,
        ended: bool = False,
        conclusion: str | None = None,
        compare: dict[str, Any] | None = None,
    ) -> None:
        t = schema.rollouts
        values: dict[str, Any] = {"phase": phase, "state": _dump(state), "updated_at": now}
        if ended:
            values["ended_at"] = now
        if conclusion is not None:
            values["conclusion"] = conclusion
        if compare is not None:
            values["compare"] = _dump(compare)
        with self._writer.begin() as conn:
            done = conn.execute(update(t).where(t.c.id == rollout_id).values(**values))
            if done.rowcount == 0:
                raise NotFound(f"rollout run {rollout_id} does not exist", rollout=rollout_id)

    def list_rollouts(
        self, *, name: str | None = None, active_only: bool = False, limit: int = 50
    ) -> list[RolloutRecord]:
        """Newest first."""
        t = schema.rollouts
        query = select(t).order_by(t.c.id.desc()).limit(_check_limit(limit))
        if name is not None:
            query = query.where(t.c.name == name)
        if active_only:
            query = query.where(t.c.ended_at.is_(None))
        with self._engine.connect() as conn:
            return [_rollout(row._mapping) for row in conn.execute(query)]

    # -- the autoscaler's journal -------------------------------------------------------------

    def append_decision(
        self,
        *,
        group: str,
        policy: str,
        current: int,
        desired: int,
        winner: str | None,
        reason: str,
        detail: dict[str, Any],
        now: float,
    ) -> ScalingDecision:
        text = _dump(detail)
        values = {
            "at": now,
            "group_name": group,
            "policy": policy,
            "current": current,
            "desired": desired,
            "winner": winner,
            "reason": reason,
            "detail": text,
        }
        new_id = self._append(schema.scaling_decisions, values)
        return _decision(new_id, values)

    def list_decisions(self, *, group: str, limit: int = 20) -> list[ScalingDecision]:
        """Newest first."""
        t = schema.scaling_decisions
        query = (
            select(t)
            .where(t.c.group_name == group)
            .order_by(t.c.id.desc())
            .limit(_check_limit(limit))
        )
        with self._engine.connect() as conn:
            return [_decision(row.id, dict(row._mapping)) for row in conn.execute(query)]

    # -- the borrow ledger (Q4) -------------------------------------------------------------

    def open_loan(
        self,
        *,
        lender: str | None,
        borrower: str,
        pool: str,
        units: int,
        reason: str,
        now: float,
    ) -> int:
        """Record that `borrower` now holds `units` lent by `lender` (None: the pool's
        unassigned units); return the loan id."""
        if units < 1:
            raise ValueError(f"open_loan(units={units}): must be >= 1")
        values = {
            "lender": lender,
            "borrower": borrower,
            "pool": pool,
            "units": units,
            "started_at": now,
            "reclaim_requested_at": None,
            "ended_at": None,
            "reason": reason,
            "end_reason": "",
            "reclaim_latency_s": None,
        }
        return self._append(schema.quota_loans, values)

    def request_reclaim(self, loan_id: int, now: float) -> None:
        """The lender asked for the units back; the first request of an open loan counts."""
        t = schema.quota_loans
        with self._writer.begin() as conn:
            row = conn.execute(select(t.c.id).where(t.c.id == loan_id)).one_or_none()
            if row is None:
                raise NotFound(f"loan {loan_id} does not exist", loan=loan_id)
            conn.execute(
                update(t)
                .where(t.c.id == loan_id, t.c.ended_at.is_(None))
                .where(t.c.reclaim_requested_at.is_(None))
                .values(reclaim_requested_at=now)
            )

    def close_loan(self, loan_id: int, now: float, end_reason: str) -> Loan:
        """The units went back; after a reclaim request the latency (now - request) is kept.
        Closing a closed loan changes nothing and returns it as it was."""
        t = schema.quota_loans

        def work(conn: Connection) -> Loan:
            row = conn.execute(select(t).where(t.c.id == loan_id)).one_or_none()
            if row is None:
                raise NotFound(f"loan {loan_id} does not exist", loan=loan_id)
            m = dict(row._mapping)
            if m["ended_at"] is None:
                asked = m["reclaim_requested_at"]
                m["ended_at"] = now
                m["end_reason"] = end_reason
                m["reclaim_latency_s"] = None if asked is None else max(0.0, now - asked)
                keys = ("ended_at", "end_reason", "reclaim_latency_s")
                conn.execute(update(t).where(t.c.id == loan_id).values({k: m[k] for k in keys}))
            return Loan(**m)

        with self._writer.begin() as conn:
            return work(conn)

    def list_loans(
        self, *, open_only: bool = False, group: str | None = None, limit: int = 100
    ) -> list[Loan]:
        """Newest first; `group` matches the lender or the borrower."""
        t = schema.quota_loans
        query = select(t).order_by(t.c.id.desc()).limit(_check_limit(limit))
        if open_only:
            query = query.where(t.c.ended_at.is_(None))
        if group is not None:
            query = query.where((t.c.lender == group) | (t.c.borrower == group))
        with self._engine.connect() as conn:
            return [Loan(**row._mapping) for row in conn.execute(query)]

    # -- instance registry -----------------------------------------------------------------

    def upsert_instance(self, rec: InstanceRecord) -> None:
        """Insert `rec`, or overwrite every field of the stored instance with the same id."""
        values = rec.to_json()
        values["group_name"] = values.pop("group")
        del values["id"]
        self._upsert(schema.instances, {"id": rec.id}, values)

    def list_instances(self, *, include_stopped: bool = False) -> list[InstanceRecord]:
        """Ordered by group then id; STOPPED instances only if asked (FAILED ones always)."""
        t = schema.instances
        query = select(t).order_by(t.c.group_name, t.c.id)
        if not include_stopped:
            query = query.where(t.c.state != InstanceState.STOPPED.value)
        with self._engine.connect() as conn:
            return [_instance(row) for row in conn.execute(query)]

    def delete_instance(self, instance_id: str) -> None:
        """Forget an instance; forgetting an unknown id is a no-op."""
        with self._writer.begin() as conn:
            conn.execute(delete(schema.instances).where(schema.instances.c.id == instance_id))

    # -- manual replica overrides (`sluice scale GROUP N`) -----------------------------------

    def set_replicas_override(
        self, *, group: str, replicas: int, actor: str, reason: str, now: float
    ) -> None:
        if replicas < 0:
            raise ValueError(f"set_replicas_override(replicas={replicas}): must be >= 0")
        values = {"replicas": replicas, "actor": actor, "reason": reason, "set_at": now}
        self._upsert(schema.replica_overrides, {"group_name": group}, values)

    def clear_replicas_override(self, group: str) -> None:
        """Hand `group` back to its spec and autoscaler; clearing an absent override is a no-op."""
        t = schema.replica_overrides
        with self._writer.begin() as conn:
            conn.execute(delete(t).where(t.c.group_name == group))

    def replicas_overrides(self) -> dict[str, int]:
        t = schema.replica_overrides
        with self._engine.connect() as conn:
            rows = conn.execute(select(t.c.group_name, t.c.replicas).order_by(t.c.group_name))
            return {group: replicas for group, replicas in rows}

    # -- failovers (`sluice route failover GROUP --to BACKUP`) ------------------------------

    def set_failover(self, *, group: str, backup: str, actor: str, reason: str, now: float) -> None:
        values = {"backup": backup, "actor": actor, "reason": reason, "set_at": now}
        self._upsert(schema.failovers, {"group_name": group}, values)

    def clear_failover(self, group: str) -> None:
        t = schema.failovers
        with self._writer.begin() as conn:
            conn.execute(delete(t).where(t.c.group_name == group))

    def failovers(self) -> dict[str, str]:
        """{group: backup} for every failover in force."""
        t = schema.failovers
        with self._engine.connect() as conn:
            rows = conn.execute(select(t.c.group_name, t.c.backup).order_by(t.c.group_name))
            return {group: backup for group, backup in rows}

    # -- proposals (R5: reviewed spec changes) -----------------------------------------------

    def add_proposal(
        self,
        *,
        author: str,
        reason: str,
        base_revision: int,
        yaml_text: str,
        diff: str,
        preview: dict[str, Any],
        now: float,
    ) -> Proposal:
        """Record a pending proposal; its id is its number."""
        values = {
            "created_at": now,
            "author": author,
            "reason": reason,
            "base_revision": base_revision,
            "yaml_text": yaml_text,
            "diff": diff,
            "preview": _dump(preview),
            "state": "pending",
        }
        new_id = self._append(schema.proposals, values)
        return _proposal({**values, "id": new_id})

    def get_proposal(self, proposal_id: int) -> Proposal:
        t = schema.proposals
        with self._engine.connect() as conn:
            row = conn.execute(select(t).where(t.c.id == proposal_id)).one_or_none()
        if row is None:
            raise NotFound(f"proposal {proposal_id} does not exist", proposal=proposal_id)
        return _proposal(row._mapping)

    def list_proposals(self, *, state: str | None = "pending", limit: int = 50) -> list[Proposal]:
        """Newest first; `state` None lists every state."""
        t = schema.proposals
        query = select(t).order_by(t.c.id.desc()).limit(_check_limit(limit))
        if state is not None:
            query = query.where(t.c.state == state)
        with self._engine.connect() as conn:
            return [_proposal(row._mapping) for row in conn.execute(query)]

    def review_proposal(
        self,
        proposal_id: int,
        *,
        state: str,
        reviewer: str,
        reason: str,
        now: float,
        revision: int | None = None,
    ) -> Proposal:
        """Close a pending proposal as approved or rejected; a closed one is a Conflict (only
        one review wins, even between processes)."""
        if state not in ("approved", "rejected"):
            raise ValueError(f"review_proposal(state={state!r}): approved or rejected")
        t = schema.proposals
        values = {
            "state": state,
            "reviewer": reviewer,
            "reviewed_at": now,
            "review_reason": reason,
            "revision": revision,
        }
        with self._writer.begin() as conn:
            done = conn.execute(
                update(t).where(t.c.id == proposal_id, t.c.state == "pending").values(values)
            )
            row = conn.execute(select(t).where(t.c.id == proposal_id)).one_or_none()
        if row is None:
            raise NotFound(f"proposal {proposal_id} does not exist", proposal=proposal_id)
        found = _proposal(row._mapping)
        if done.rowcount == 0:
            raise Conflict(
                f"proposal {proposal_id} is already {found.state} (by {found.reviewer})",
                proposal=proposal_id,
                state=found.state,
            )
        return found


def _install_sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Stop pysqlite issuing its own BEGIN (it skips SELECT and DDL); `_on_begin` does it.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            for pragma in _SQLITE_PRAGMAS:
                cursor.execute(pragma)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front, so max+1 numbering and migrations cannot race
        # and a read-then-write transaction never fails on a stale snapshot.
        writer = conn.get_execution_options().get(_WRITER, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN")


def _check_limit(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"limit={limit}: must be >= 1")
    return limit


def _dump(detail: dict[str, Any]) -> str:
    return json.dumps(detail, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _load(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _audit(row: Row[Any]) -> AuditEntry:
    m = row._mapping
    return AuditEntry(
        id=m["id"],
        at=m["at"],
        actor=m["actor"],
        action=m["action"],
        target=m["target"],
        reason=m["reason"],
        detail=_load(m["detail"]),
    )


def _event(row: Row[Any]) -> Event:
    m = row._mapping
    return Event(
        id=m["id"],
        at=m["at"],
        group=m["group_name"],
        instance=m["instance"],
        kind=m["kind"],
        message=m["message"],
        detail=_load(m["detail"]),
    )


def _instance(row: Row[Any]) -> InstanceRecord:
    m = row._mapping
    return InstanceRecord(
        id=m["id"],
        group=m["group_name"],
        template=m["template"],
        state=m["state"],
        pid=m["pid"],
        host=m["host"],
        port=m["port"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        reason=m["reason"],
    )


def _decision(row_id: int, m: dict[str, Any]) -> ScalingDecision:
    return ScalingDecision(
        id=row_id,
        at=m["at"],
        group=m["group_name"],
        policy=m["policy"],
        current=m["current"],
        desired=m["desired"],
        winner=m["winner"],
        reason=m["reason"],
        detail=_load(m["detail"]),
    )


def _rollout(m: Any) -> RolloutRecord:
    return RolloutRecord(
        id=m["id"],
        name=m["name"],
        baseline=m["baseline"],
        canary=m["canary"],
        phase=m["phase"],
        started_at=m["started_at"],
        updated_at=m["updated_at"],
        ended_at=m["ended_at"],
        started_by=m["started_by"],
        spec=_load(m["spec"]),
        state=_load(m["state"]),
        compare=None if m["compare"] is None else _load(m["compare"]),
        conclusion=m["conclusion"],
    )


def _proposal(m: Any) -> Proposal:
    return Proposal(
        id=m["id"],
        created_at=m["created_at"],
        author=m["author"],
        reason=m["reason"],
        base_revision=m["base_revision"],
        yaml_text=m["yaml_text"],
        diff=m["diff"],
        preview=_load(m["preview"]),
        state=m["state"],
        reviewer=m.get("reviewer"),
        reviewed_at=m.get("reviewed_at"),
        review_reason=m.get("review_reason"),
        revision=m.get("revision"),
    )
