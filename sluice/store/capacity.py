"""Capacity tests and drills (O4, O5) as stored reports, replica pins, and the firings of
scheduled drills: what `sluice loadtest` and `sluice drill` keep, so a group's capacity has
a history per model version."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update

from sluice.store import schema
from sluice.store.base import StoreBase, dump, load

__all__ = ["CapacityRun", "CapacityStore", "DrillFire", "Pin"]

RUN_KINDS = ("loadtest", "drill")


@dataclass(frozen=True, slots=True)
class CapacityRun:
    """One load test or drill: who ran it on which version, its verdict and full report."""

    id: int
    kind: str
    group: str
    version: str
    mode: str
    verdict: str
    actor: str
    created_at: float
    report: dict[str, Any]

    def to_json(self, with_report: bool = True) -> dict[str, Any]:
        out = {
            "id": self.id,
            "kind": self.kind,
            "group": self.group,
            "version": self.version,
            "mode": self.mode,
            "verdict": self.verdict,
            "actor": self.actor,
            "created_at": self.created_at,
        }
        if with_report:
            out["report"] = self.report
        return out


@dataclass(frozen=True, slots=True)
class Pin:
    """A group held at `replicas` until `until` (unix seconds), whatever its autoscaler says."""

    group: str
    replicas: int
    actor: str
    reason: str
    set_at: float
    until: float

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "replicas": self.replicas,
            "actor": self.actor,
            "reason": self.reason,
            "set_at": self.set_at,
            "until": self.until,
        }


@dataclass(frozen=True, slots=True)
class DrillFire:
    """One firing of a scheduled drill (see `schema.drill_fires`)."""

    id: int
    schedule: str
    group: str
    trigger: str
    actor: str
    due_at: float
    started_at: float
    finished_at: float | None
    status: str
    token: str | None
    run_id: int | None
    detail: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "schedule": self.schedule,
            "group": self.group,
            "trigger": self.trigger,
            "actor": self.actor,
            "due_at": self.due_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "status": self.status,
            "token": self.token,
            "run_id": self.run_id,
            "detail": self.detail,
        }


class CapacityStore(StoreBase):
    def add_capacity_run(
        self,
        *,
        kind: str,
        group: str,
        version: str,
        mode: str,
        verdict: str,
        actor: str,
        now: float,
        report: dict[str, Any],
    ) -> int:
        if kind not in RUN_KINDS:
            raise ValueError(f"add_capacity_run(kind={kind!r}): one of {', '.join(RUN_KINDS)}")
        values = {
            "kind": kind,
            "group_name": group,
            "version": version,
            "mode": mode,
            "verdict": verdict,
            "actor": actor,
            "created_at": now,
            "report": dump(report),
        }
        return self._append(schema.capacity_runs, values)

    def list_capacity_runs(
        self, *, group: str | None = None, kind: str | None = None, limit: int = 20
    ) -> list[CapacityRun]:
        """Newest first."""
        rows = self._newest(schema.capacity_runs, limit, group_name=group, kind=kind)
        return [_run(row) for row in rows]

    def get_capacity_run(self, run_id: int) -> CapacityRun:
        return _run(self._by_id(schema.capacity_runs, run_id, f"no capacity run {run_id}"))

    def set_pin(self, pin: Pin) -> None:
        values = {
            "replicas": pin.replicas,
            "actor": pin.actor,
            "reason": pin.reason,
            "set_at": pin.set_at,
            "until": pin.until,
        }
        self._upsert(schema.replica_pins, {"group_name": pin.group}, values)

    def clear_pin(self, group: str) -> None:
        """Clearing an absent pin is a no-op."""
        t = schema.replica_pins
        with self._begin() as conn:
            conn.execute(delete(t).where(t.c.group_name == group))

    def pins(self) -> list[Pin]:
        t = schema.replica_pins
        with self._engine.connect() as conn:
            rows = conn.execute(select(t).order_by(t.c.group_name))
            return [
                Pin(r.group_name, r.replicas, r.actor, r.reason, r.set_at, r.until) for r in rows
            ]

    def add_drill_fire(
        self,
        *,
        schedule: str,
        group: str,
        trigger: str,
        actor: str,
        due_at: float,
        status: str,
        now: float,
        detail: dict[str, Any],
        token: str | None = None,
    ) -> int:
        """A firing as it starts ("running") or as it is decided not to run."""
        values = {
            "schedule": schedule,
            "group_name": group,
            "trigger": trigger,
            "actor": actor,
            "due_at": due_at,
            "started_at": now,
            "finished_at": None if status == "running" else now,
            "status": status,
            "token": token,
            "run_id": None,
            "detail": dump(detail),
        }
        return self._append(schema.drill_fires, values)

    def finish_drill_fire(
        self, fire_id: int, *, status: str, run_id: int | None, detail: dict[str, Any], now: float
    ) -> None:
        t = schema.drill_fires
        values = {"status": status, "run_id": run_id, "detail": dump(detail), "finished_at": now}
        self._write(lambda conn: conn.execute(update(t).where(t.c.id == fire_id).values(values)))

    def list_drill_fires(
        self,
        *,
        schedule: str | None = None,
        status: str | None = None,
        limit: int = 20,
        groups: Collection[str] | None = None,
    ) -> list[DrillFire]:
        """Newest first (`groups`: of one of these groups only)."""
        t = schema.drill_fires
        where = [] if groups is None else [t.c.group_name.in_(list(groups))]
        rows = self._newest(t, limit, *where, schedule=schedule, status=status)
        return [_fire(row) for row in rows]

    def get_drill_fire(self, fire_id: int) -> DrillFire:
        return _fire(self._by_id(schema.drill_fires, fire_id, f"no drill firing {fire_id}"))

    def last_cron_firings(self) -> dict[str, float]:
        """Schedule -> the latest cron firing handled (run, missed or skipped): where the
        next look for a due firing starts."""
        t = schema.drill_fires
        query = (
            select(t.c.schedule, func.max(t.c.due_at))
            .where(t.c.trigger == "cron")
            .group_by(t.c.schedule)
        )
        with self._engine.connect() as conn:
            return {row[0]: float(row[1]) for row in conn.execute(query)}


def _fire(row: Any) -> DrillFire:
    return DrillFire(
        id=row.id,
        schedule=row.schedule,
        group=row.group_name,
        trigger=row.trigger,
        actor=row.actor,
        due_at=row.due_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        status=row.status,
        token=row.token,
        run_id=row.run_id,
        detail=load(row.detail),
    )


def _run(row: Any) -> CapacityRun:
    return CapacityRun(
        id=row.id,
        kind=row.kind,
        group=row.group_name,
        version=row.version,
        mode=row.mode,
        verdict=row.verdict,
        actor=row.actor,
        created_at=row.created_at,
        report=load(row.report),
    )
