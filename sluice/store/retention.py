"""Retention: rows older than their kept age go, in one short transaction per table. The
audit log is append-only for every caller but this one, which only ever drops its oldest
rows (RetentionSpec keeps it longest).

Rows something still reads stay, whatever their age: a running or the latest drill firing
of each schedule and trigger (where the next cron look starts), the latest capacity run of
each group, kind and model version and a group's latest load tests (the stale-target check
compares a new one with them), a pending proposal, a running rollout and the latest run
of each rollout (a promoted one keeps routing by it), and any token that is live."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Table,
    and_,
    case,
    delete,
    func,
    or_,
    select,
)

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

    def prune_drill_fires(self, before: float) -> int:
        """Delete drill firings that finished before `before`, but never one running nor
        the latest of each schedule and trigger (the last cron firing is where the
        scheduler's next look starts after a restart)."""
        t = schema.drill_fires
        latest = select(func.max(t.c.id)).group_by(t.c.schedule, t.c.trigger)
        done = and_(t.c.finished_at.is_not(None), t.c.finished_at < before)
        return self._write(lambda conn: _deleted(conn, t, done, t.c.id.not_in(latest)))

    def prune_capacity_runs(self, before: float, *, keep_loadtests: int) -> int:
        """Delete load test and drill reports recorded before `before`, except the latest
        of each group, kind and model version, and each group's `keep_loadtests` latest
        load tests (those a new load test is compared with)."""
        t = schema.capacity_runs
        latest = select(func.max(t.c.id)).group_by(t.c.group_name, t.c.kind, t.c.version)
        rank = func.row_number().over(partition_by=t.c.group_name, order_by=t.c.id.desc())
        ranked = select(t.c.id, rank.label("rank")).where(t.c.kind == "loadtest").subquery()
        recent = select(ranked.c.id).where(ranked.c.rank <= keep_loadtests)
        old = [t.c.created_at < before, t.c.id.not_in(latest), t.c.id.not_in(recent)]
        return self._write(lambda conn: _deleted(conn, t, *old))

    def prune_proposals(self, before: float) -> int:
        """Delete proposals reviewed (approved or rejected) before `before`; a pending one
        stays however old it is. A revision keeps its own author, reason and diff."""
        t = schema.proposals
        decided = and_(t.c.state != "pending", t.c.reviewed_at < before)
        return self._write(lambda conn: _deleted(conn, t, decided))

    def prune_rollouts(self, before: float) -> int:
        """Delete rollout runs that ended before `before`, except each rollout's latest run
        (a promoted rollout keeps sending the baseline's traffic to the canary by it, and
        `sluice rollout status` shows it); a running one stays."""
        t = schema.rollouts
        latest = select(func.max(t.c.id)).group_by(t.c.name)
        ended = and_(t.c.ended_at.is_not(None), t.c.ended_at < before)
        return self._write(lambda conn: _deleted(conn, t, ended, t.c.id.not_in(latest)))

    def prune_tokens(self, ended_before: float) -> int:
        """Delete the tokens a finished drill firing names (its run is archived: the token
        has no use left), and tokens revoked or expired before `ended_before`, except:

        - a person's first token: two-person review reads when a person was enrolled, and
          by whom (`sluice.control.review`);
        - any token still live when the oldest pending proposal was made (the cut-off
          moves back to it): review reads the tokens minted since a proposal.

        A live token is never deleted but as a finished drill's. Callers keep tokens as
        long as the audit log, whose rows name them (RetentionSpec.tokens_days)."""
        t, p, f = schema.tokens, schema.proposals, schema.drill_fires

        def run(conn: Connection) -> int:
            pending = conn.execute(
                select(func.min(p.c.created_at)).where(p.c.state == "pending")
            ).scalar()
            cut = ended_before if pending is None else min(ended_before, float(pending))
            person = case((t.c.person == "", func.lower(t.c.name)), else_=t.c.person)
            firsts = select(func.min(t.c.id)).group_by(person)
            ended = or_(t.c.revoked_at < cut, t.c.expires_at < cut)
            drills = select(f.c.token).where(f.c.finished_at.is_not(None), f.c.token.is_not(None))
            gone = or_(and_(ended, t.c.id.not_in(firsts)), t.c.name.in_(drills))
            return _deleted(conn, t, gone)

        return self._write(run)


def _deleted(conn: Connection, table: Table, *where: ColumnElement[bool]) -> int:
    return int(conn.execute(delete(table).where(*where)).rowcount)


def _older(conn: Connection, column: Column[float], before: float) -> int:
    return int(conn.execute(delete(column.table).where(column < before)).rowcount)
