"""The durable memory of a fleet: spec revisions, audit log, events, instances, overrides
(and, via `JournalStore`, the decision journals; via `TokenStore`, the API tokens).

SQLAlchemy Core over one SQLite file under the Sluice home needs no server, and the same
portable SQL runs on PostgreSQL (psycopg 3) when a database URL is given. Every call is one
short transaction, so a `Store` is safe to share between `asyncio.to_thread` workers and
between processes using the same database. Writers take one lock per database (SQLite's
write lock; on PostgreSQL a transaction-level advisory lock), so numbering by max+1 and
migrations cannot race. Time is always passed in; the store never reads a clock.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    Connection,
    Engine,
    Row,
    create_engine,
    delete,
    event,
    func,
    select,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from sluice.core import InstanceState, NotFound, SluiceError, Unavailable
from sluice.store import schema
from sluice.store.base import WRITER, check_limit, dump, load
from sluice.store.capacity import CapacityStore
from sluice.store.history import HistoryStore
from sluice.store.journals import JournalStore
from sluice.store.leases import LeaseStore
from sluice.store.records import (
    AuditEntry,
    Event,
    InstanceRecord,
    Revision,
)
from sluice.store.retention import RetentionStore
from sluice.store.tokens import TokenStore

__all__ = ["Store", "database_url", "redacted"]


_MIGRATIONS = Path(__file__).with_name("migrations")
_SQLITE_PRAGMAS = ("PRAGMA busy_timeout=5000", "PRAGMA journal_mode=WAL", "PRAGMA foreign_keys=ON")
_POSTGRES_DRIVER = "postgresql+psycopg"
_POSTGRES_POOL: dict[str, Any] = {
    "pool_size": 5,
    "max_overflow": 10,
    "pool_timeout": 30,
    "pool_pre_ping": True,  # a server restart or an idle-timeout cut is noticed, not raised
    "pool_recycle": 1800,
}
_POSTGRES_SESSION = ("SET lock_timeout = 5000",)
"""A writer waits at most 5 s for the write lock, as SQLite's busy_timeout does."""
_WRITE_LOCK = 0x511CE
"""The advisory lock key every PostgreSQL write transaction takes (locks are per database)."""
_FIX_URL = (
    "fix $SLUICE_DATABASE_URL (postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB), or unset it "
    "to keep the state in the SQLite file of the state directory"
)
_CONNECT_TIMEOUT_S = 10
"""How long a first connection may take unless the URL says (`?connect_timeout=`)."""


class Store(JournalStore, TokenStore, RetentionStore, HistoryStore, CapacityStore, LeaseStore):
    """Synchronous access to the state database; open with `Store.open` or `Store.for_home`."""

    @classmethod
    def open(cls, url: str) -> Store:
        """Connect to `url` (SQLite or PostgreSQL) and bring its schema to the latest
        migration. A server that cannot be reached or refuses the login is `Unavailable`,
        named without its password."""
        sa_url = database_url(url)
        is_sqlite = sa_url.get_backend_name() == "sqlite"
        if is_sqlite and sa_url.database in (None, "", ":memory:"):
            raise ValueError(
                f"Store.open({url!r}): in-memory SQLite is private to one connection; "
                "use a file, e.g. Store.for_home(tmp_path)"
            )
        if is_sqlite:
            engine = create_engine(sa_url)
            _install_sqlite_hooks(engine)
        else:
            connect_args = {"connect_timeout": _CONNECT_TIMEOUT_S}
            if "connect_timeout" in sa_url.query:
                connect_args = {}
            engine = create_engine(sa_url, connect_args=connect_args, **_POSTGRES_POOL)
            _install_postgres_hooks(engine)
        store = cls(engine)
        try:
            if not is_sqlite:
                _check_reachable(engine, sa_url)
            store._upgrade()
        except BaseException:
            engine.dispose()
            raise
        return store

    @classmethod
    def for_home(cls, home: Path, url: str | None = None) -> Store:
        """The store at `url` when one is given (`Settings.database_url`), else the SQLite
        file `{home}/state.db`, creating `home` if needed."""
        if url is not None:
            return cls.open(url)
        home.mkdir(parents=True, exist_ok=True)
        return cls.open(f"sqlite:///{home / 'state.db'}")

    @property
    def location(self) -> str:
        """Where the state lives, fit to print or log: the URL without its password."""
        return redacted(self._engine.url)

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
            conn.execute(t.insert().values(self._stamped(conn, t, rev.to_json())))
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
        return _revision(row)

    def list_revisions(self, limit: int = 50) -> list[Revision]:
        """Newest first."""
        t = schema.revisions
        query = select(t).order_by(t.c.number.desc()).limit(check_limit(limit))
        with self._engine.connect() as conn:
            return [_revision(row) for row in conn.execute(query)]

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
        text = dump(detail)
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
            detail=load(text),
        )

    def list_audit(
        self,
        *,
        target: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
        targets: Collection[str] | None = None,
    ) -> list[AuditEntry]:
        """Newest first; each filter given narrows it (`since` <= at < `until`; `targets`:
        the target is one of these)."""
        t = schema.audit_log
        span = [
            *([] if since is None else [t.c.at >= since]),
            *([] if until is None else [t.c.at < until]),
            *([] if targets is None else [t.c.target.in_(list(targets))]),
        ]
        rows = self._newest(t, limit, *span, target=target, actor=actor, action=action)
        return [_audit(row) for row in rows]

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
        text = dump(detail)
        values = {"at": now, "group_name": group, "instance": instance, "kind": kind}
        new_id = self._append(schema.events, {**values, "message": message, "detail": text})
        return Event(
            id=new_id,
            at=now,
            group=group,
            instance=instance,
            kind=kind,
            message=message,
            detail=load(text),
        )

    def list_events(
        self,
        *,
        group: str | None = None,
        limit: int = 100,
        since_id: int = 0,
        kinds: Sequence[str] | None = None,
        groups: Collection[str] | None = None,
    ) -> list[Event]:
        """Newest first: the latest `limit` events with id above `since_id` (of `kinds`; of
        one of `groups`)."""
        t = schema.events
        where = [
            t.c.id > since_id,
            *([] if kinds is None else [t.c.kind.in_(list(kinds))]),
            *([] if groups is None else [t.c.group_name.in_(list(groups))]),
        ]
        return [_event(row) for row in self._newest(t, limit, *where, group_name=group)]

    # -- controller state ---------------------------------------------------------------------

    def put_state(self, key: str, value: dict[str, Any], now: float) -> None:
        self._upsert(
            schema.controller_state, {"key": key}, {"value": dump(value), "updated_at": now}
        )

    def get_state(self, key: str) -> dict[str, Any] | None:
        t = schema.controller_state
        with self._engine.connect() as conn:
            text = conn.execute(select(t.c.value).where(t.c.key == key)).scalar_one_or_none()
        return None if text is None else load(text)

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
        with self._begin() as conn:
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
        with self._begin() as conn:
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
        with self._begin() as conn:
            conn.execute(delete(t).where(t.c.group_name == group))

    def failovers(self) -> dict[str, str]:
        """{group: backup} for every failover in force."""
        t = schema.failovers
        with self._engine.connect() as conn:
            rows = conn.execute(select(t.c.group_name, t.c.backup).order_by(t.c.group_name))
            return {group: backup for group, backup in rows}


def database_url(url: str) -> URL:
    """`url` parsed and checked: SQLite, or PostgreSQL through psycopg 3 (a bare
    `postgresql://` or `postgres://` means that driver). Errors never repeat the URL, which
    may hold a password."""
    try:
        sa_url = make_url(url)
    except ArgumentError:
        raise SluiceError(
            "the state database URL is not a URL (it is not repeated here: it may hold a "
            f"password); {_FIX_URL}"
        ) from None
    if sa_url.drivername in ("postgresql", "postgres"):
        sa_url = sa_url.set(drivername=_POSTGRES_DRIVER)
    if sa_url.drivername not in ("sqlite", "sqlite+pysqlite", _POSTGRES_DRIVER):
        raise SluiceError(
            f"the state database URL {redacted(sa_url)} names the driver "
            f"{sa_url.drivername!r}: the store runs on SQLite or on PostgreSQL through "
            f"psycopg 3; {_FIX_URL}"
        )
    return sa_url


def redacted(url: URL | str) -> str:
    """`url` fit to print or log: the password, if any, as ***."""
    return (make_url(url) if isinstance(url, str) else url).render_as_string(hide_password=True)


def _check_reachable(engine: Engine, url: URL) -> None:
    """A first connection, so that a server that is down, a wrong host or port, a refused
    login or a missing database reads as such, not as a traceback from a migration."""
    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        reason = " ".join(str(exc.orig).split())
        if url.password:
            reason = reason.replace(url.password, "***")
        raise Unavailable(
            f"cannot connect to the state database {redacted(url)}: {reason}; start the "
            f"server, or {_FIX_URL}",
            host=url.host,
        ) from None


def _install_postgres_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cursor:
            for statement in _POSTGRES_SESSION:
                cursor.execute(statement)
        dbapi_conn.commit()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # The writers' one lock, held to the end of the transaction: what BEGIN IMMEDIATE
        # is on SQLite. Readers take none (PostgreSQL's snapshots need no lock).
        if conn.get_execution_options().get(WRITER, False):
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_WRITE_LOCK})")


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
        writer = conn.get_execution_options().get(WRITER, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writer else "BEGIN")


def _revision(row: Row[Any]) -> Revision:
    m = row._mapping
    return Revision(
        number=m["number"],
        created_at=m["created_at"],
        author=m["author"],
        reason=m["reason"],
        yaml_text=m["yaml_text"],
        diff=m["diff"],
    )


def _audit(row: Row[Any]) -> AuditEntry:
    m = row._mapping
    return AuditEntry(
        id=m["id"],
        at=m["at"],
        actor=m["actor"],
        action=m["action"],
        target=m["target"],
        reason=m["reason"],
        detail=load(m["detail"]),
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
        detail=load(m["detail"]),
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
        devices=m["devices"],
    )
