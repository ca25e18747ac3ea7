"""Chronic under-use becomes a proposal (Q3, issue 37): the shell around
`sluice.policy.reclaim`. A check reads the groups' hourly history and the reclaim proposals
already filed, asks the policy which groups to propose, and files one proposal per group
(its `quota.guaranteed` lowered by the returnable units, the evidence in its reason)
through the review board, as any spec change. It runs on a schedule (`reclaim` in the spec:
weekly by default, the first check right after the first start; the time of the last is
kept in the audit log, so a restart does not run it again) and on demand, by `sluice report
usage --propose` (`POST /v1/reports/usage/propose`: the caller authors the proposals, and
the schedule stays as it was).

One pending reclaim proposal per group: a group with one waiting is skipped; one made
against an older revision (it can no longer be approved) is superseded: the check files a
fresh one against the current revision and rejects the stale one, naming its successor.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from fastapi import APIRouter
from pydantic import ConfigDict, Field

from sluice.control.api_deps import Me
from sluice.control.auth import Role
from sluice.control.bodies import TextBody
from sluice.control.guard import guarded
from sluice.control.observer import stored_rollups
from sluice.control.review import ReviewBoard
from sluice.control.spec_work import offload
from sluice.core import Clock, Conflict, SpecError, SpecIssue
from sluice.policy.history import HOUR_S, Rollup
from sluice.policy.reclaim import ReclaimVerdict, judge_reclaim, reclaim_group, reclaim_reason
from sluice.spec import PlatformSpec, parse_spec
from sluice.spec.edit import spec_with_guarantee
from sluice.store import AuditEntry, Fenced, Proposal, Revision
from sluice.store.ports import RollupRecords

__all__ = [
    "ACTION",
    "SCHEDULE_ACTOR",
    "Reclaimer",
    "earlier_reclaims",
    "reclaim_routes",
    "verdicts",
]

log = logging.getLogger("sluice.reclaim")

SCHEDULE_ACTOR = "schedule/reclaim"
"""The author of the scheduled check's proposals (a person of its own: any admin approves)."""
ACTION = "reclaim-check"
"""The audit action of every check (its `at` is when the next scheduled one is due from)."""
TICK_S = 10.0
"""How often the schedule looks whether a check is due (cheap: a time comparison)."""
PROPOSALS_READ = 1000
_DAY = 86_400.0

Audit = Callable[[str, str, str, str, dict[str, Any]], Awaitable[None]]


class _Records(RollupRecords, Protocol):
    def latest_revision(self) -> Revision | None: ...
    def list_proposals(
        self, *, state: str | None = "pending", limit: int = 50
    ) -> list[Proposal]: ...
    def list_audit(
        self, *, actor: str | None = None, action: str | None = None, limit: int = 100
    ) -> list[AuditEntry]: ...


class Reclaimer:
    def __init__(self, store: _Records, review: ReviewBoard, audit: Audit, clock: Clock) -> None:
        self._store = store
        self._review = review
        self._audit = audit
        self._clock = clock
        self._lock = asyncio.Lock()  # one check at a time: no two proposals for a group
        self._last: float | None = None

    async def load(self) -> None:
        """When the last scheduled check ran (None: never), from the audit log."""
        rows = await asyncio.to_thread(
            self._store.list_audit, action=ACTION, actor=SCHEDULE_ACTOR, limit=1
        )
        self._last = rows[0].at if rows else None

    async def run(self, spec: Callable[[], PlatformSpec]) -> None:
        """Forever: a check whenever `reclaim.every_days` passed since the last (at once
        when none ran yet); off while `reclaim.enabled` is false. A failed check is logged
        and tried again next tick."""
        while True:
            platform = spec()
            now = self._clock.now()
            r = platform.reclaim
            if r.enabled and (self._last is None or now - self._last >= r.every_days * _DAY):
                try:
                    await self.check(platform, now - r.lookback_days * _DAY, now, SCHEDULE_ACTOR)
                except Fenced as exc:  # deposed: the new leader checks from now on
                    log.warning("reclaim check refused: %s", exc)
                except Exception:
                    log.exception("reclaim check failed; next try in %gs", TICK_S)
            await asyncio.sleep(TICK_S)

    async def check(
        self,
        spec: PlatformSpec,
        since: float,
        until: float,
        actor: str,
        person: str | None = None,
    ) -> dict[str, Any]:
        """Judge every group of `spec` over [since, until) and file the proposals due;
        returns each group's verdict (with `proposal`: the id filed, if any)."""
        async with self._lock:
            now = self._clock.now()
            names = [g.name for g in spec.groups]
            hours = await asyncio.to_thread(
                stored_rollups, self._store, names, since, until, HOUR_S
            )
            filed = await asyncio.to_thread(
                self._store.list_proposals, state=None, limit=PROPOSALS_READ
            )
            latest = await asyncio.to_thread(self._store.latest_revision)
            current = latest.number if latest else 0
            _, stale, _ = earlier_reclaims(filed, current)
            out = []
            for v in verdicts(spec, hours, filed, current, since, until):
                row: dict[str, Any] = {**v.to_json(), "proposal": None}
                if v.propose and latest is not None:
                    row.update(await self._file(v, latest, actor, person, stale.get(v.group)))
                out.append(row)
            doc = {"since": since, "until": until, "checked_at": now, "groups": out}
            proposed = {r["group"]: r["proposal"] for r in out if r["proposal"]}
            skipped = {r["group"]: r["why"] for r in out if not r["proposal"]}
            summary = (
                "proposed " + ", ".join(f"{g} (#{p})" for g, p in proposed.items())
                if proposed
                else "nothing to propose"
            )
            detail = {"since": since, "until": until, "proposed": proposed, "skipped": skipped}
            await self._audit(actor, ACTION, "quota", summary, detail)
            if actor == SCHEDULE_ACTOR:  # a check on demand leaves the schedule as it is
                self._last = now
            return doc

    async def _file(
        self,
        v: ReclaimVerdict,
        latest: Revision,
        actor: str,
        person: str | None,
        stale: list[int] | None,
    ) -> dict[str, Any]:
        reason = reclaim_reason(v)
        try:
            text = spec_with_guarantee(latest.yaml_text, v.group, v.new_guaranteed)
            loaded = await offload(parse_spec, text, f"quota reclaim of {v.group}")
            p = await self._review.propose(loaded, actor, reason, person=person)
        except (Conflict, SpecError, ValueError) as exc:
            log.info("no reclaim proposal for %s: %s", v.group, exc)
            return {"propose": False, "why": f"the proposal was refused: {exc}"}
        superseded = []
        for old in stale or []:
            why = f"superseded by proposal #{p.id}, made against revision {latest.number}"
            try:
                await self._review.reject(old, actor, why, person=person)
                superseded.append(old)
            except Conflict:  # reviewed meanwhile
                pass
        return {"proposal": p.id, "reason": reason, "superseded": superseded}


def verdicts(
    spec: PlatformSpec,
    hours: Mapping[str, Sequence[Rollup]],
    filed: list[Proposal],
    current: int,
    since: float,
    until: float,
) -> list[ReclaimVerdict]:
    """Every group's verdict over [since, until): its hourly rollups, and the reclaim
    proposals `filed` (newest first) with `current` the latest revision's number."""
    pending, _, rejected = earlier_reclaims(filed, current)
    return [
        judge_reclaim(
            g.name,
            g.quota.guaranteed,
            hours.get(g.name, ()),
            since,
            until,
            min_weeks=spec.reclaim.min_weeks,
            pending=pending.get(g.name),
            rejected=rejected.get(g.name),
        )
        for g in spec.groups
    ]


def earlier_reclaims(
    filed: list[Proposal], current: int
) -> tuple[dict[str, int], dict[str, list[int]], dict[str, tuple[int, float]]]:
    """Reclaim proposals already filed, per group: the pending one made against the current
    revision, the pending ones made against an older revision (stale), and the latest
    rejected one (id, when) that was not rejected as superseded."""
    pending: dict[str, int] = {}
    stale: dict[str, list[int]] = {}
    rejected: dict[str, tuple[int, float]] = {}
    for p in filed:  # newest first
        group = reclaim_group(p.reason)
        if group is None:
            continue
        if p.state == "pending":
            if p.base_revision == current:
                pending.setdefault(group, p.id)
            else:
                stale.setdefault(group, []).append(p.id)
        elif p.state == "rejected" and not (p.review_reason or "").startswith("superseded by"):
            rejected.setdefault(group, (p.id, p.reviewed_at or p.created_at))
    return pending, stale, rejected


MAX_SPAN_DAYS = 366
"""The most history one check on demand reads (the spec's `lookback_days` allows as much):
a check reads it hour by hour."""
_LATEST_S = 2**33
"""No time is later than this (year 2242): epoch seconds, not milliseconds."""


class ProposeRequest(TextBody):
    model_config = ConfigDict(str_max_length=4096)
    since: float | None = Field(
        default=None,
        ge=0,
        le=_LATEST_S,
        allow_inf_nan=False,
        description="from, epoch seconds (default: reclaim.lookback_days before until)",
    )
    until: float | None = Field(
        default=None, ge=0, le=_LATEST_S, allow_inf_nan=False, description="to (default: now)"
    )


def reclaim_routes(
    api: APIRouter, reclaimer: Reclaimer, spec: Callable[[], PlatformSpec], now: Callable[[], float]
) -> None:
    """`POST /v1/reports/usage/propose`: one check now, the caller as the proposals' author."""

    @api.post("/v1/reports/usage/propose")
    @guarded(Role.OPERATOR)
    async def propose(body: ProposeRequest, me: Me) -> dict[str, Any]:
        """File a proposal lowering the guarantee of each chronically under-used group by
        its returnable units (none for a group with one pending); every verdict, with why."""
        me.require(Role.OPERATOR, "proposing quota reclaims")
        platform = spec()
        until = body.until if body.until is not None else now()
        back = platform.reclaim.lookback_days * _DAY
        since = body.since if body.since is not None else until - back
        if since >= until:
            raise SpecError([SpecIssue("since", f"{since:g} is not before until ({until:g})")])
        if until - since > MAX_SPAN_DAYS * _DAY:
            raise SpecError(
                [
                    SpecIssue(
                        "since", f"a check reads at most {MAX_SPAN_DAYS} days; give a later since"
                    )
                ]
            )
        return await reclaimer.check(platform, since, until, me.name, me.person)
