"""The store's journals of decisions made over time: the autoscaler's decisions (S11), the
borrow ledger (Q4), the rollout archive (C6) and reviewed spec proposals (R5)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Connection, select, update

from sluice.core import Conflict, NotFound
from sluice.store import schema
from sluice.store.base import StoreBase, check_limit, dump, load
from sluice.store.records import Loan, Proposal, RolloutRecord, ScalingDecision

__all__ = ["JournalStore"]


class JournalStore(StoreBase):
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
            "spec": dump(spec),
            "state": dump(state),
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
        values: dict[str, Any] = {"phase": phase, "state": dump(state), "updated_at": now}
        if ended:
            values["ended_at"] = now
        if conclusion is not None:
            values["conclusion"] = conclusion
        if compare is not None:
            values["compare"] = dump(compare)
        with self._begin() as conn:
            done = conn.execute(update(t).where(t.c.id == rollout_id).values(**values))
            if done.rowcount == 0:
                raise NotFound(f"rollout run {rollout_id} does not exist", rollout=rollout_id)

    def list_rollouts(
        self, *, name: str | None = None, active_only: bool = False, limit: int = 50
    ) -> list[RolloutRecord]:
        """Newest first."""
        t = schema.rollouts
        active = [t.c.ended_at.is_(None)] if active_only else []
        return [_rollout(row._mapping) for row in self._newest(t, limit, *active, name=name)]

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
        text = dump(detail)
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
            .limit(check_limit(limit))
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
        with self._begin() as conn:
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

        with self._begin() as conn:
            return work(conn)

    def list_loans(
        self, *, open_only: bool = False, group: str | None = None, limit: int = 100
    ) -> list[Loan]:
        """Newest first; `group` matches the lender or the borrower."""
        t = schema.quota_loans
        where: list[ColumnElement[bool]] = [t.c.ended_at.is_(None)] if open_only else []
        if group is not None:
            where.append((t.c.lender == group) | (t.c.borrower == group))
        return [Loan(**row._mapping) for row in self._newest(t, limit, *where)]

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
        author_person: str | None = None,
    ) -> Proposal:
        """Record a pending proposal; its id is its number. `author_person`: the person
        holding the `author` token (default: a person named like it)."""
        values = {
            "created_at": now,
            "author": author,
            "author_person": author.lower() if author_person is None else author_person,
            "reason": reason,
            "base_revision": base_revision,
            "yaml_text": yaml_text,
            "diff": diff,
            "preview": dump(preview),
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
        rows = self._newest(schema.proposals, limit, state=state)
        return [_proposal(row._mapping) for row in rows]

    def review_proposal(
        self,
        proposal_id: int,
        *,
        state: str,
        reviewer: str,
        reason: str,
        now: float,
        revision: int | None = None,
        reviewer_person: str | None = None,
    ) -> Proposal:
        """Close a pending proposal as approved or rejected; a closed one is a Conflict (only
        one review wins, even between processes). `reviewer_person`: the person holding the
        `reviewer` token (default: a person named like it)."""
        if state not in ("approved", "rejected"):
            raise ValueError(f"review_proposal(state={state!r}): approved or rejected")
        t = schema.proposals
        values = {
            "state": state,
            "reviewer": reviewer,
            "reviewer_person": reviewer.lower() if reviewer_person is None else reviewer_person,
            "reviewed_at": now,
            "review_reason": reason,
            "revision": revision,
        }
        with self._begin() as conn:
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
        detail=load(m["detail"]),
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
        spec=load(m["spec"]),
        state=load(m["state"]),
        compare=None if m["compare"] is None else load(m["compare"]),
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
        preview=load(m["preview"]),
        state=m["state"],
        reviewer=m.get("reviewer"),
        reviewed_at=m.get("reviewed_at"),
        review_reason=m.get("review_reason"),
        revision=m.get("revision"),
        author_person=m.get("author_person") or m["author"].lower(),
        reviewer_person=m.get("reviewer_person"),
    )
