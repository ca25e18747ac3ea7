"""Metrics history rows (per-group minute and hour rollups, kept as JSON documents) and the
alert outbox. The rollups' meaning is `sluice.policy.history`'s; here they are only rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, delete, func, or_, select, tuple_, update

from sluice.store import schema
from sluice.store.base import StoreBase, check_limit, dump, load

__all__ = ["AlertDelivery", "HistoryStore", "RollupRow"]


@dataclass(frozen=True, slots=True)
class RollupRow:
    group: str
    step_s: int
    start: float
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AlertDelivery:
    id: int
    created_at: float
    group: str
    rule: str
    state: str
    payload: dict[str, Any]
    attempts: int
    next_at: float | None
    delivered_at: float | None
    dead_at: float | None
    last_error: str

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created_at": self.created_at,
            "group": self.group,
            "rule": self.rule,
            "state": self.state,
            "attempts": self.attempts,
            "next_at": self.next_at,
            "delivered_at": self.delivered_at,
            "dead_at": self.dead_at,
            "last_error": self.last_error,
            "payload": self.payload,
        }


class HistoryStore(StoreBase):
    def write_rollups(self, rows: Sequence[RollupRow]) -> None:
        """Insert rollups, replacing any row with the same (group, step, start): the writer
        that re-merges an hour, or closes a minute after a restart, wins."""
        if not rows:
            return
        t = schema.metric_rollups

        def work(conn: Connection) -> None:
            keys = [(r.group, r.step_s, r.start) for r in rows]
            conn.execute(delete(t).where(tuple_(t.c.group_name, t.c.step_s, t.c.start).in_(keys)))
            conn.execute(
                t.insert(),
                [
                    {
                        "group_name": r.group,
                        "step_s": r.step_s,
                        "start": r.start,
                        "data": dump(r.data),
                    }
                    for r in rows
                ],
            )

        self._write(work)

    def read_rollups(
        self, step_s: int, since: float, until: float, groups: Sequence[str] | None = None
    ) -> list[RollupRow]:
        """Rows of `step_s` with `since <= start < until` (of `groups`, else every group),
        oldest first."""
        t = schema.metric_rollups
        q = select(t).where(t.c.step_s == step_s, t.c.start >= since, t.c.start < until)
        if groups is not None:
            q = q.where(t.c.group_name.in_(list(groups)))
        with self._engine.connect() as conn:
            found = conn.execute(q.order_by(t.c.start, t.c.group_name)).all()
        return [RollupRow(r.group_name, r.step_s, r.start, load(r.data)) for r in found]

    def latest_rollup(self, step_s: int) -> float | None:
        """The start of the newest row of `step_s` (None: none)."""
        t = schema.metric_rollups
        with self._engine.connect() as conn:
            value = conn.execute(select(func.max(t.c.start)).where(t.c.step_s == step_s)).scalar()
        return None if value is None else float(value)

    def prune_rollups(self, step_s: int, before: float) -> int:
        t = schema.metric_rollups

        def work(conn: Connection) -> int:
            return int(
                conn.execute(delete(t).where(t.c.step_s == step_s, t.c.start < before)).rowcount
            )

        return self._write(work)

    # --- the alert outbox ----------------------------------------------------------------

    def add_delivery(
        self, *, group: str, rule: str, state: str, payload: dict[str, Any], now: float
    ) -> int:
        return self._append(
            schema.alert_deliveries,
            {
                "created_at": now,
                "group_name": group,
                "rule": rule,
                "state": state,
                "payload": dump(payload),
                "attempts": 0,
                "next_at": now,
                "last_error": "",
            },
        )

    def due_deliveries(self, now: float, limit: int = 100) -> list[AlertDelivery]:
        """Messages whose next attempt is due, oldest first."""
        t = schema.alert_deliveries
        q = select(t).where(t.c.next_at.is_not(None), t.c.next_at <= now)
        with self._engine.connect() as conn:
            found = conn.execute(q.order_by(t.c.id).limit(check_limit(limit))).all()
        return [_delivery(r) for r in found]

    def list_deliveries(
        self, group: str | None = None, undelivered: bool = False, limit: int = 100
    ) -> list[AlertDelivery]:
        """Newest first; `undelivered`: only those waiting or dead-lettered."""
        t = schema.alert_deliveries
        waiting = [t.c.delivered_at.is_(None)] if undelivered else []
        return [_delivery(r) for r in self._newest(t, limit, *waiting, group_name=group)]

    def record_attempt(
        self,
        delivery_id: int,
        *,
        now: float,
        delivered: bool,
        error: str = "",
        retry_at: float | None = None,
    ) -> None:
        """One attempt's outcome: delivered, or failed with a retry at `retry_at` (None: no
        attempt left, the message is dead-lettered)."""
        t = schema.alert_deliveries
        values: dict[str, Any] = {"attempts": t.c.attempts + 1, "last_error": error[:2000]}
        if delivered:
            values |= {"delivered_at": now, "next_at": None}
        elif retry_at is None:
            values |= {"dead_at": now, "next_at": None}
        else:
            values |= {"next_at": retry_at}
        self._write(
            lambda conn: conn.execute(update(t).where(t.c.id == delivery_id).values(values))
        )

    def prune_deliveries(self, before: float) -> int:
        """Drop finished messages (delivered or dead) created before `before`."""
        t = schema.alert_deliveries
        finished = or_(t.c.delivered_at.is_not(None), t.c.dead_at.is_not(None))

        def work(conn: Connection) -> int:
            return int(
                conn.execute(delete(t).where(and_(finished, t.c.created_at < before))).rowcount
            )

        return self._write(work)


def _delivery(r: Any) -> AlertDelivery:
    return AlertDelivery(
        id=r.id,
        created_at=r.created_at,
        group=r.group_name,
        rule=r.rule,
        state=r.state,
        payload=load(r.payload),
        attempts=r.attempts,
        next_at=r.next_at,
        delivered_at=r.delivered_at,
        dead_at=r.dead_at,
        last_error=r.last_error,
    )
