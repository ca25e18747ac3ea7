"""Autoscaling targets that a new capacity test made stale (issue 36): a load test whose knee
moved by `KNEE_MARGIN` or more from the group's last one raises a `capacity_changed` alert to
the group's channel and files a proposal with the new test's targets, through the normal
review (a person approves it, as any spec change)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from sluice.control.alerts import Alerting
from sluice.control.review import ReviewBoard
from sluice.control.spec_work import offload
from sluice.core import Conflict, SpecError
from sluice.policy.capacity import KNEE_MARGIN, knee_moved
from sluice.spec import GroupSpec, parse_spec
from sluice.spec.edit import spec_with_targets
from sluice.store import CapacityRun, Revision

__all__ = ["StaleTargets"]

log = logging.getLogger("sluice.capacity")

LOOK_BACK = 20
"""Earlier load tests of the group looked through for the last one with a knee."""


class _Records(Protocol):
    def list_capacity_runs(
        self, *, group: str | None = None, kind: str | None = None, limit: int = 20
    ) -> list[CapacityRun]: ...

    def latest_revision(self) -> Revision | None: ...


class StaleTargets:
    """Checks each recorded load test against the group's last one with a knee."""

    def __init__(
        self, store: _Records, alerting: Alerting, review: ReviewBoard | None = None
    ) -> None:
        self._store = store
        self._alerting = alerting
        self._review = review

    async def check(
        self, g: GroupSpec, run: CapacityRun, actor: str, now: float
    ) -> dict[str, Any] | None:
        """What `run` (just recorded) says of `g`'s targets: None when its knee is within
        the margin of the last one (or either has none); else the comparison, the alert
        raised and the proposal filed (None when there is nothing to propose: no targets
        in the report, no autoscaling block, or no review board)."""
        earlier = await asyncio.to_thread(
            self._store.list_capacity_runs, group=g.name, kind="loadtest", limit=LOOK_BACK
        )
        previous = next(
            (r for r in earlier if r.id != run.id and isinstance(r.report.get("knee"), dict)),
            None,
        )
        if previous is None:
            return None
        moved = knee_moved({**previous.report, "version": previous.version},
                           {**run.report, "version": run.version})  # fmt: skip
        if moved is None:
            return None
        old, new = previous.report["knee"]["rate_rps"], run.report["knee"]["rate_rps"]
        proposal = await self._propose(g, run, actor, old, new)
        text = (
            f"[warning] capacity_changed on {g.name} (owner {g.owner}): load test "
            f"#{run.id} ({run.version}) puts the knee at {new:.1f} req/s, "
            f"{moved['rate_change']:+.0%} from #{previous.id}'s {old:.1f} "
            f"({previous.version}); targets set for the old knee are stale"
            + (f"; proposal #{proposal} updates them" if proposal else "")
        )
        detail = {"run": run.id, "previous": previous.id, "proposal": proposal, **moved}
        await self._alerting.notice(g, "capacity_changed", "warning", text, detail, now)
        return {"margin": KNEE_MARGIN, "proposal": proposal, **moved}

    async def _propose(
        self, g: GroupSpec, run: CapacityRun, actor: str, old: float, new: float
    ) -> int | None:
        recommendation = run.report.get("recommendation")
        targets = recommendation.get("targets") if isinstance(recommendation, dict) else None
        if self._review is None or not targets or g.autoscaling is None:
            return None
        latest = await asyncio.to_thread(self._store.latest_revision)
        if latest is None:
            return None
        reason = (
            f"load test #{run.id} moved {g.name}'s knee from {old:.1f} to {new:.1f} req/s: "
            "its autoscaling targets follow"
        )
        try:
            text = spec_with_targets(latest.yaml_text, g.name, targets)
            loaded = await offload(parse_spec, text, f"capacity test #{run.id}")
            proposal = await self._review.propose(loaded, actor, reason)
        except (Conflict, SpecError, ValueError) as exc:  # already these targets, or no fit
            log.info("no proposal from load test #%s: %s", run.id, exc)
            return None
        return proposal.id
