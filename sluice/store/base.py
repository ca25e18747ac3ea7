"""What every part of the `Store` shares: the engines and the three ways it writes (one
transaction each, fenced by the leader's lease epoch once a `Fence` is installed:
`sluice.store.fencing`), and the JSON encoding of detail columns."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Engine, Row, Table, select, update
from sqlalchemy.exc import IntegrityError

from sluice.core import NotFound
from sluice.store import schema
from sluice.store.fencing import Fence

__all__ = ["WRITER", "StoreBase", "check_limit", "dump", "load"]

T = TypeVar("T")

WRITER = "sluice_writer"
"""Execution option marking the writer engine; on SQLite its transactions begin IMMEDIATE,
on PostgreSQL they take the store's advisory lock first."""


_EPOCH = "sluice_epoch"
"""`Connection.info` key: the lease epoch the current write transaction was checked under
(None: unfenced). Set at every begin, so a pooled connection never carries a stale one."""


class StoreBase:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = engine.execution_options(**{WRITER: True})
        self._fence: Fence | None = None

    def fence(self, fence: Fence | None) -> None:
        """Check every later write of this `Store` against `fence` (None: stop checking).
        One per process: the controller's leadership installs it as it takes the lease,
        before its first write as the leader."""
        self._fence = fence

    @property
    def write_fence(self) -> Fence | None:
        """The fence the writes are checked against, if any (a routing publication and a
        launch, which are not store writes, `require` it too)."""
        return self._fence

    @contextlib.contextmanager
    def _begin(self, *, fenced: bool = True) -> Iterator[Connection]:
        """One write transaction; with a fence installed (and `fenced`), it first checks,
        under the write lock, that the lease is still the fence's, and raises `Fenced`
        (rolling the transaction back, so nothing of it is stored) if not."""
        with self._writer.begin() as conn:
            fence = self._fence if fenced else None
            conn.info[_EPOCH] = None
            if fence is not None:
                t = schema.leases
                # FOR SHARE on PostgreSQL (SQLite has no row locks: its write lock, held
                # since BEGIN IMMEDIATE, already keeps a takeover out until the commit)
                row = conn.execute(
                    select(t.c.holder, t.c.epoch)
                    .where(t.c.name == fence.lease)
                    .with_for_update(read=True)
                ).first()
                fence.check(*(row if row is not None else (None, None)))
                conn.info[_EPOCH] = fence.epoch
            yield conn

    @staticmethod
    def _stamped(conn: Connection, table: Table, values: dict[str, Any]) -> dict[str, Any]:
        """`values` with the epoch the transaction is fenced under, for a table that keeps
        which leadership wrote each row (`epoch` column: audit, events, revisions,
        instances, overrides, failovers; NULL: written unfenced, by a CLI or a test)."""
        if "epoch" not in table.c:
            return values
        return {**values, "epoch": conn.info.get(_EPOCH)}

    def _write(self, work: Callable[[Connection], T], *, fenced: bool = True) -> T:
        """Run `work` in one write transaction, retrying once if a concurrent insert won a key
        (in a new transaction: on PostgreSQL a failed statement aborts its own)."""
        try:
            with self._begin(fenced=fenced) as conn:
                return work(conn)
        except IntegrityError:
            with self._begin(fenced=fenced) as conn:
                return work(conn)

    def _upsert(self, table: Table, key: dict[str, Any], values: dict[str, Any]) -> None:
        """UPDATE-then-INSERT is portable; a racing insert of the same key retries via _write."""
        ((column, value),) = key.items()

        def work(conn: Connection) -> None:
            match = table.c[column] == value
            row = self._stamped(conn, table, values)
            if not conn.execute(update(table).where(match).values(row)).rowcount:
                conn.execute(table.insert().values(**row, **key))

        self._write(work)

    def _append(self, table: Table, values: dict[str, Any]) -> int:
        """Insert one row into an append-only table; return the id the database assigned."""
        with self._begin() as conn:
            row = self._stamped(conn, table, values)
            key = conn.execute(table.insert().values(row)).inserted_primary_key
        assert key is not None  # single-row INSERT without RETURNING always reports it
        new_id: int = key[0]
        return new_id

    def _newest(
        self, table: Table, limit: int, *where: ColumnElement[bool], **equal: Any
    ) -> list[Row[Any]]:
        """The latest `limit` rows (highest id first) meeting every condition in `where` and
        with each column in `equal` equal to its value; a value of None filters nothing."""
        conditions = [*where, *(table.c[k] == v for k, v in equal.items() if v is not None)]
        query = select(table).where(*conditions).order_by(table.c.id.desc())
        with self._engine.connect() as conn:
            return list(conn.execute(query.limit(check_limit(limit))))

    def _by_id(self, table: Table, row_id: int, missing: str) -> Row[Any]:
        """The row of `row_id`, or NotFound saying `missing`."""
        with self._engine.connect() as conn:
            row = conn.execute(select(table).where(table.c.id == row_id)).first()
        if row is None:
            raise NotFound(missing)
        return row


def check_limit(limit: int) -> int:
    if limit < 1:
        raise ValueError(f"limit={limit}: must be >= 1")
    return limit


def dump(detail: dict[str, Any]) -> str:
    return json.dumps(detail, sort_keys=True, separators=(",", ":"), allow_nan=False)


def load(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(text)
    return loaded
