"""The autoscaler's decisions, settled and journaled (S11): an active one becomes the
group's count as far as quota and a rollout floor allow; an advisory one
(`autoscaling.mode: advisory`, issue 16) goes through the very same clipping and journal,
marked `mode: advisory` with the count actually in force, and changes nothing.

An advisory policy is fed the count in force (`replicas`, or a `sluice scale` override) as
its `current`, as an active one is fed the count it set: its advice is a move from the real
fleet. Its own memory (cooldown after a scale-up, HPA's rate-limit periods, rolling maxima)
counts the moves it advised as made, so within one such period the advice is what the
policy would do next after its own earlier advice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from sluice.control.autoscaling import GroupStep
from sluice.control.events import EventLog
from sluice.policy.quota import Allocation
from sluice.spec import GroupSpec
from sluice.store import Store

__all__ = ["JOURNAL_HEARTBEAT_S", "Advice", "DecisionJournal", "is_advisory", "standby"]

JOURNAL_HEARTBEAT_S = 60.0
"""A decision that changes nothing is journaled only when its reason changed, or this often."""


def is_advisory(g: GroupSpec) -> bool:
    """The group's autoscaler only advises: its count is `replicas` or an override."""
    return g.autoscaling is not None and g.autoscaling.mode == "advisory"


def standby(g: GroupSpec) -> int:
    """Warm standby instances kept out of rotation (an active autoscaler's only)."""
    if g.autoscaling is None or is_advisory(g):
        return 0
    return g.autoscaling.warm_standby


@dataclass(frozen=True, slots=True)
class Advice:
    """An advisory group's latest decision: `advised` instances (after the quota it would
    have met and a rollout floor, as if acted on) vs the `actual` count in force."""

    at: float
    policy: str
    advised: int
    actual: int
    reason: str
    winner: str | None
    clipped_by: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "policy": self.policy,
            "desired": self.advised,
            "actual": self.actual,
            "reason": self.reason,
            "winner": self.winner,
            "clipped_by": list(self.clipped_by),
        }


def clipped(
    step: GroupStep, granted: int, floor: int, allocation: Allocation
) -> tuple[int, tuple[str, ...], str]:
    """What quota (`granted` instances, standby included) and a rollout's baseline floor
    leave of the decision: (count, guards that clipped it, reason). S11: a quota or budget
    refusal shows as the guard that clipped it; C2: a baseline keeps its count."""
    g, decision = step.group, step.decision
    want = max(decision.desired, floor)
    desired = min(want, max(0, granted - standby(g)))
    guards, reason = decision.clipped_by, decision.reason
    if want > decision.desired:
        guards += ("rollout",)
        reason += f"; kept at {floor}: baseline of a running rollout"
    refusal = allocation.refusals.get(g.name)
    if desired < want and refusal:
        guards += ("budget" if refusal.startswith("budget") else "quota",)
        reason += f"; {refusal}"
    return desired, guards, reason


class DecisionJournal:
    """Settles each group's decision and stores the ones worth keeping."""

    def __init__(self, store: Store, events: EventLog) -> None:
        self._store = store
        self._events = events
        self._journaled: dict[str, tuple[object, float]] = {}
        self.advice: dict[str, Advice] = {}
        """The latest advice per advisory group (explain and metrics read it)."""

    async def settle(
        self, step: GroupStep, granted: int, floor: int, allocation: Allocation, now: float
    ) -> int:
        """An active decision: journal it with what quota allowed of it; returns the
        group's new count."""
        g, before = step.group, step.load.current
        desired, guards, reason = clipped(step, granted, floor, allocation)
        self.advice.pop(g.name, None)
        await self._journal(step, before, desired, guards, reason, now, moved=desired != before)
        if desired != before:
            await self._events.emit(g.name, None, "autoscale", f"{before} -> {desired}: {reason}")
        return desired

    async def advise(
        self, step: GroupStep, granted: int, floor: int, allocation: Allocation, now: float
    ) -> Advice:
        """An advisory decision: clipped as it would be if acted on (`granted`: the quota's
        answer to it, `sluice.control.quota.LiveQuota.preview`), journaled, not applied."""
        g, actual = step.group, step.load.current
        advised, guards, reason = clipped(step, granted, floor, allocation)
        last = self.advice.get(g.name)
        moved = last is None or (last.advised, last.actual) != (advised, actual)
        advice = Advice(now, step.policy, advised, actual, reason, step.decision.winner, guards)
        self.advice[g.name] = advice
        await self._journal(step, actual, advised, guards, reason, now, moved=moved, advisory=True)
        if moved:
            await self._events.emit(
                g.name,
                None,
                "advice",
                f"advised {actual} -> {advised}, actual stays {actual} (advisory): {reason}",
                advised=advised,
                actual=actual,
            )
        return advice

    def keep_only(self, groups: set[str]) -> None:
        """Forget the advice of groups no longer advisory."""
        for name in set(self.advice) - groups:
            del self.advice[name]

    async def _journal(
        self,
        step: GroupStep,
        before: int,
        desired: int,
        guards: tuple[str, ...],
        reason: str,
        now: float,
        *,
        moved: bool,
        advisory: bool = False,
    ) -> None:
        """Store a decision that moves (the count; for advice: the advised or actual count),
        whose reason changed, or once a minute."""
        d = step.decision
        key = (advisory, d.winner, guards, desired, before if advisory else None)
        last = self._journaled.get(step.group.name)
        fresh = last is not None and now - last[1] < JOURNAL_HEARTBEAT_S
        if not moved and fresh and last is not None and last[0] == key:
            return
        self._journaled[step.group.name] = (key, now)
        detail = step.detail(guards)
        detail["mode"] = "advisory" if advisory else "active"
        if advisory:
            detail["actual"] = before
        await asyncio.to_thread(
            self._store.append_decision,
            group=step.group.name,
            policy=step.policy,
            current=before,
            desired=desired,
            winner=d.winner,
            reason=reason,
            detail=detail,
            now=now,
        )
