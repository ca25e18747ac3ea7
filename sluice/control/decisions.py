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

from sluice.control.events import EventLog
from sluice.policy.server_metrics import ServerLoad
from sluice.policy.tick import Scaled
from sluice.store.ports import DecisionRecords

__all__ = ["JOURNAL_HEARTBEAT_S", "Advice", "DecisionJournal"]

JOURNAL_HEARTBEAT_S = 60.0
"""A decision that changes nothing is journaled only when its reason changed, or this often."""


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


def journal_detail(s: Scaled, server: ServerLoad | None) -> dict[str, object]:
    """The journal's detail of a decision (what `sluice explain` shows)."""
    d, load = s.decision, s.load
    return {
        "signals": dict(d.signals),
        "proposals": dict(d.proposals),
        "clipped_by": list(s.guards),
        "unclipped": d.unclipped,
        "load": {
            "ready": load.ready,
            "in_flight": load.in_flight,
            "queued": load.queued,
            "server_waiting": load.server_waiting,
            "latency_p95_s": load.latency_p95_s,
            "startup_s": round(load.startup_s, 3),
            "fresh": load.fresh,
        },
        "server": None
        if server is None
        else {"instances": server.instances, "running": server.running, "waiting": server.waiting},
        "mode": "advisory" if s.advisory else "active",
    }


class DecisionJournal:
    """Settles each group's decision and stores the ones worth keeping."""

    def __init__(self, store: DecisionRecords, events: EventLog) -> None:
        self._store = store
        self._events = events
        self._journaled: dict[str, tuple[object, float]] = {}
        self.advice: dict[str, Advice] = {}
        """The latest advice per advisory group (explain and metrics read it)."""

    async def record(self, s: Scaled, server: ServerLoad | None, now: float) -> None:
        """Journal one settled decision (`sluice.policy.tick.Scaled`): an active one with
        what quota allowed of it, and its move as an event; an advisory one as advice."""
        if s.advisory:
            await self._advise(s, server, now)
            return
        g, before = s.group, s.actual
        self.advice.pop(g.name, None)
        moved = s.count != before
        await self._journal(s, server, before, now, moved=moved)
        if moved:
            await self._events.emit(g.name, None, "autoscale", f"{before} -> {s.count}: {s.reason}")

    async def _advise(self, s: Scaled, server: ServerLoad | None, now: float) -> None:
        g, actual = s.group, s.actual
        last = self.advice.get(g.name)
        moved = last is None or (last.advised, last.actual) != (s.count, actual)
        self.advice[g.name] = Advice(
            now, s.policy, s.count, actual, s.reason, s.decision.winner, s.guards
        )
        await self._journal(s, server, actual, now, moved=moved)
        if moved:
            await self._events.emit(
                g.name,
                None,
                "advice",
                f"advised {actual} -> {s.count}, actual stays {actual} (advisory): {s.reason}",
                advised=s.count,
                actual=actual,
            )

    def keep_only(self, groups: set[str]) -> None:
        """Forget the advice of groups no longer advisory."""
        for name in set(self.advice) - groups:
            del self.advice[name]

    async def _journal(
        self, s: Scaled, server: ServerLoad | None, before: int, now: float, *, moved: bool
    ) -> None:
        """Store a decision that moves (the count; for advice: the advised or actual count),
        whose reason changed, or once a minute."""
        d = s.decision
        key = (s.advisory, d.winner, s.guards, s.count, before if s.advisory else None)
        last = self._journaled.get(s.group.name)
        fresh = last is not None and now - last[1] < JOURNAL_HEARTBEAT_S
        if not moved and fresh and last is not None and last[0] == key:
            return
        self._journaled[s.group.name] = (key, now)
        detail = journal_detail(s, server)
        if s.advisory:
            detail["actual"] = before
        await asyncio.to_thread(
            self._store.append_decision,
            group=s.group.name,
            policy=s.policy,
            current=before,
            desired=s.count,
            winner=d.winner,
            reason=s.reason,
            detail=detail,
            now=now,
        )
