"""What every part of the `Store` shares: the engines and the three ways it writes (one
transaction each), and the JSON encoding of detail columns."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Connection, Engine, Row, Table, select, update
from sqlalchemy.exc import IntegrityError

from sluice.core import NotFound

__all__ = ["WRITER", "StoreBase", "check_limit", "dump", "load"]

T = TypeVar("T")

WRITER = "sluice_writer"
"""Execution option marking the writer engine; on SQLite its transactions begin IMMEDIATE,
on PostgreSQL they take the store's advisory lock first."""


class StoreBase:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._writer = engine.execution_options(**{WRITER: True})

    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in one write transaction, retrying once if a concurrent insert won a key
        (in a new transaction: on PostgreSQL a failed statement aborts its own)."""
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
