"""The live side of quota (Q1-Q6): keep what follows from each tick's quota round (the
borrow ledger in step with its loans, metered spend and accelerator-hours, usage for the
under-use report).

The round itself is part of the tick's pure decision (`sluice.policy.tick.decide`, which
calls `sluice.policy.quota.allocate`); this module owns what a live run must keep between
ticks: the allocator's state (persisted, so grace periods and loan attribution survive a
restart), month-to-date spend and accelerator-hours (persisted), the last refusal per group
(so an unchanged refusal is not re-emitted every second) and a bounded usage history.

A group with `quota.mode: advisory` is only advised (`sluice.policy.quota.advisory`): the
allocator's decision for it is kept (`advice`, with its own persisted memory) and journaled
as a `quota-advice` event whenever it changes, and its grant is bounded by free units only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from sluice.control.events import EventLog
from sluice.policy.quota import (
    AdvisedAllocation,
    Allocation,
    GroupClaim,
    QuotaState,
    UsageSample,
    ledger_changes,
    reclaim_loan_ids,
    underused_groups,
)
from sluice.policy.quota.metering import TOTAL, Meter
from sluice.policy.tick import TickDecision
from sluice.spec import PlatformSpec
from sluice.store import Loan
from sluice.store.ports import LoanRecords, StateRecords

__all__ = ["LiveQuota"]


class _QuotaStore(LoanRecords, StateRecords, Protocol):
    """The records this module reads and writes."""


STATE_KEY = "quota"
PERSIST_EVERY_S = 10.0
USAGE_EVERY_S = 10.0
USAGE_KEEP_S = 24 * 3600.0
"""Usage history for the under-use report: one sample per group every 10 s, for a day."""


class LiveQuota:
    def __init__(self, store: _QuotaStore, events: EventLog) -> None:
        self._store = store
        self._events = events
        self._state = QuotaState()
        self._meter = Meter()
        """Month-to-date spend and accelerator-hours per group, and the rates held now."""
        self._persisted_at = 0.0
        self._refused: dict[str, str] = {}
        self._usage: dict[str, deque[UsageSample]] = {}
        self._usage_at = 0.0
        self._held: dict[str, int] = {}
        """Units each group holds now (running and draining instances)."""
        self.last: Allocation | None = None
        self._advice_state = QuotaState()
        self._advised: dict[str, str] = {}
        """The last quota advice journaled per advisory group (said once per change)."""
        self.advice: AdvisedAllocation | None = None

    async def load(self) -> None:
        saved = await asyncio.to_thread(self._store.get_state, STATE_KEY)
        if saved:
            self._state = QuotaState.from_json(saved.get("allocator", {}))
            self._advice_state = QuotaState.from_json(saved.get("advice", {}))
            self._meter = Meter.from_json(saved)

    @property
    def memory(self) -> tuple[QuotaState, QuotaState]:
        """The allocator's memory and the advice's, for the next round (`TickInput`)."""
        return self._state, self._advice_state

    @property
    def metered(self) -> Meter:
        """Month-to-date spend and accelerator-hours as of the last round (read only)."""
        return self._meter

    def meter(self, now: float) -> Meter:
        """Month-to-date spend and accelerator-hours at `now` (what the budgets count)."""
        self._meter = self._meter.advanced(now)
        return self._meter

    async def record(
        self, spec: PlatformSpec, tick: TickDecision, meter: Meter, now: float
    ) -> Allocation:
        """Keep what follows from the tick's quota round: the allocator's memory, the loan
        ledger, reclaim and refusal events (each said once), the advice journal, usage;
        `meter`: the kernel's, holding the round."""
        advised = tick.allocation
        alloc = advised.enforced
        self._held = dict(tick.held)
        loans_changed = alloc.loans != self._state.loans or alloc.reclaims
        self._state = alloc.state
        self._advice_state = advised.advice.state
        self._meter = meter
        if loans_changed:
            await asyncio.to_thread(self._sync_ledger, alloc, now)
        for r in alloc.reclaims:
            await self._events.emit(r.borrower, None, "reclaim", r.reason, instances=r.instance_ids)
        fresh = {
            g: why for g, why in alloc.refusals.items() if self._refused.get(g) != why
        }  # said once
        self._refused = dict(alloc.refusals)
        for group, why in fresh.items():
            await self._events.emit(group, None, "quota", why)
        await self._journal_advice(advised, tick.claims)
        self._sample_usage(spec, tick.claims, now)
        if now - self._persisted_at >= PERSIST_EVERY_S:
            await self._persist(now)
        self.last, self.advice = alloc, advised
        return alloc

    def advice_for(self, group: str) -> dict[str, Any] | None:
        """An advisory group's last round: what quota would grant and do vs what it got."""
        return None if self.advice is None else _advice_of(self.advice, group)

    async def _journal_advice(
        self, advised: AdvisedAllocation, claims: Sequence[GroupClaim]
    ) -> None:
        """A `quota-advice` event per advisory group whenever its advice changes."""
        wanted = {c.name: c.wanted for c in claims}
        for group in sorted(advised.advisory):
            advice = _advice_of(advised, group)
            if advice is None:
                continue
            told, got = advice["advised"], advice["granted"]
            text = (
                f"advised {told} vs actual {got} of {wanted[group]} wanted (not enforced): "
                f"{advice['reason']}"
            )
            for r in advice["reclaims"]:
                text += f"; would reclaim {', '.join(r['instances'])}: {r['reason']}"
            if self._advised.get(group) == text:
                continue
            self._advised[group] = text
            await self._events.emit(group, None, "quota-advice", text, **advice)
        for group in set(self._advised) - advised.advisory:
            del self._advised[group]

    async def _persist(self, now: float) -> None:
        self._persisted_at = now
        state = {
            "allocator": self._state.to_json(),
            "advice": self._advice_state.to_json(),
            **self._meter.to_json(),
        }
        await asyncio.to_thread(self._store.put_state, STATE_KEY, state, now)

    async def close(self, now: float) -> None:
        self.meter(now)
        await self._persist(now)

    def _sync_ledger(self, alloc: Allocation, now: float) -> None:
        """Open and close ledger rows so they match this round's loans; mark reclaims."""
        open_rows = self._store.list_loans(open_only=True, limit=10_000)
        changes = ledger_changes(open_rows, alloc.loans)
        for loan_id in changes.close:
            self._store.close_loan(loan_id, now, "returned")
        for loan in changes.open:
            self._store.open_loan(
                lender=loan.lender,
                borrower=loan.borrower,
                pool=loan.pool,
                units=loan.units,
                reason=alloc.grants[loan.borrower].reason,
                now=now,
            )
        if alloc.reclaims:
            still_open = self._store.list_loans(open_only=True, limit=10_000)
            for r in alloc.reclaims:
                for loan_id in reclaim_loan_ids(still_open, r.borrower, r.lender, r.units):
                    self._store.request_reclaim(loan_id, now)

    def _sample_usage(self, spec: PlatformSpec, claims: Sequence[GroupClaim], now: float) -> None:
        if now - self._usage_at < USAGE_EVERY_S:
            return
        self._usage_at = now
        for c in claims:
            history = self._usage.setdefault(c.name, deque())
            history.append(UsageSample(now, len(c.running) * c.units_per_instance))
            while history and history[0].at < now - USAGE_KEEP_S:
                history.popleft()
        for name in set(self._usage) - {g.name for g in spec.groups}:
            del self._usage[name]

    def report(
        self, spec: PlatformSpec, loans: Sequence[Loan], now: float, window_s: float, below: float
    ) -> dict[str, Any]:
        """What `sluice quota` shows: pools, each group's quota and use, loans, spend, and the
        groups whose use stayed below `below` x guarantee over `window_s`."""
        alloc = self.last
        groups = []
        for g in spec.groups:
            grant = alloc.grants.get(g.name) if alloc else None
            groups.append(
                {
                    "name": g.name,
                    "pool": g.resources.pool,
                    "quota": g.quota.model_dump(),
                    "budget": g.budget.model_dump() if g.budget else None,
                    "granted_instances": grant.instances if grant else None,
                    "own_units": grant.own_units if grant else None,
                    "borrowed_units": grant.borrowed_units if grant else None,
                    "held_units": self._held.get(g.name, 0),
                    "spend_per_hour": grant.spend_per_hour if grant else 0.0,
                    "spent_this_month": round(self._meter.spent_by(g.name), 6),
                    "accelerator_hours_this_month": round(self._meter.hours_by(g.name), 6),
                    "why": grant.reason if grant else "",
                    "refused": self._refused.get(g.name),
                    "mode": g.quota.mode,
                    "advice": self.advice_for(g.name),
                }
            )
        guarantees = {g.name: g.quota.guaranteed for g in spec.groups}
        under = underused_groups(
            self._usage, guarantees, now=now, window_s=window_s, threshold=below
        )
        return {
            "pools": [
                {
                    "name": p.name,
                    "purpose": p.purpose,
                    "accelerator": p.accelerator,
                    "count": p.count,
                    "price_per_hour": p.price_per_hour,
                    "guaranteed": sum(
                        g.quota.guaranteed for g in spec.groups if g.resources.pool == p.name
                    ),
                    "in_use": sum(
                        self._held.get(g.name, 0) for g in spec.groups if g.resources.pool == p.name
                    ),
                }
                for p in spec.pools
            ],
            "groups": groups,
            "loans": [
                {**loan.to_json(), "unit_hours": round(loan.unit_hours(now), 6)} for loan in loans
            ],
            "spend_per_hour": alloc.spend_per_hour if alloc else 0.0,
            "spent_this_month": round(self._meter.spent_by(TOTAL), 6),
            "accelerator_hours_this_month": round(self._meter.hours_by(TOTAL), 6),
            "budget": spec.budget.model_dump() if spec.budget else None,
            "underused": [
                {
                    "group": u.group,
                    "guaranteed": u.guaranteed,
                    "average_units": u.average_units,
                    "peak_units": u.peak_units,
                    "returnable_units": u.returnable_units,
                    "reason": u.reason,
                }
                for u in under
            ],
        }


def _advice_of(advised: AdvisedAllocation, group: str) -> dict[str, Any] | None:
    """What quota would grant `group` and do for or against it, vs what it was granted."""
    if group not in advised.advisory:
        return None
    told, got = advised.advice.grants[group], advised.enforced.grants[group]
    reclaims = [
        {
            "borrower": r.borrower,
            "lender": r.lender,
            "instances": list(r.instance_ids),
            "reason": r.reason,
        }
        for r in advised.advice.reclaims
        if group in (r.borrower, r.lender)
    ]
    return {
        "advised": told.instances,
        "granted": got.instances,
        "reason": told.reason,
        "refused": advised.advice.refusals.get(group),
        "borrowed_units": told.borrowed_units,
        "reclaims": reclaims,
    }
