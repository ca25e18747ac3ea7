"""Retention: rows older than their kept age go, in one short transaction per table. The
audit log is append-only for every caller but this one, which only ever drops its oldest
rows (RetentionSpec keeps it longest)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Column, Connection, delete

from sluice.store import schema
from sluice.store.base import StoreBase

__all__ = ["Pruned", "RetentionStore"]


@dataclass(frozen=True, slots=True)
class Pruned:
    events: int
    decisions: int
    loans: int
    audit: int


class RetentionStore(StoreBase):
    def prune(
        self,
        *,
        events_before: float,
        decisions_before: float,
        loans_ended_before: float,
        audit_before: float,
    ) -> Pruned:
        """Delete events, scaling decisions and ended loans older than their cut-offs, and
        audit entries older than `audit_before`; returns how many of each went."""

        def run(conn: Connection) -> Pruned:
            loans = schema.quota_loans
            return Pruned(
                events=_older(conn, schema.events.c.at, events_before),
                decisions=_older(conn, schema.scaling_decisions.c.at, decisions_before),
                loans=conn.execute(
                    delete(loans).where(
                        loans.c.ended_at.is_not(None), loans.c.ended_at < loans_ended_before
                    )
                ).rowcount,
                audit=_older(conn, schema.audit_log.c.at, audit_before),
            )

        return self._write(run)


def _older(conn: Connection, column: Column[float], before: float) -> int:
    return int(conn.execute(delete(column.table).where(column < before)).rowcount)
