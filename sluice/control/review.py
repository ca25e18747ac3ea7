"""Reviewed spec changes (R5): propose with a diff and an impact preview, approve by another
person (applied as a normal numbered revision), or reject; every step audited.

With `control.review.routes` on, `Controller.apply` refuses changes to the sections in
`GATED` (see `gated_changes`); they reach the fleet only through `ReviewBoard.approve`.
A proposal is made against one revision; once another revision is applied it is stale and
must be proposed again (no silent merge of two people's edits).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.core import Clock, Conflict, Forbidden
from sluice.policy import LoggedRequest, route_impact, route_rules
from sluice.spec import (
    GroupSpec,
    LoadedSpec,
    PlatformSpec,
    load_spec_text,
    redact_secrets,
    revision_diff,
)
from sluice.store import Proposal, Store

if TYPE_CHECKING:
    from sluice.control.controller import Controller

__all__ = ["GATED", "GATED_IN_GROUPS", "REPLAY_LINES", "ReviewBoard", "gated_changes"]

GATED = ("routes", "tenants", "rollouts", "budget")
"""Who reaches what, how traffic shifts and what it may cost: the top-level sections
`control.review.routes` guards (with each group's quota and budget, and the default routes
a group's models imply: see `gated_changes`)."""
GATED_IN_GROUPS = ("quota", "budget")
REPLAY_LINES = 2000
"""Access-log lines the preview replays: enough for every busy tenant/model pair to show,
small enough to read and replay in well under a second."""


def gated_changes(current: PlatformSpec | None, proposed: PlatformSpec) -> list[str]:
    """Sections of `proposed` that differ from `current` and need review. Review is in force
    if either side turns it on, so turning it off is itself a reviewed change. The first
    spec (no `current`) is a bootstrap, not a change."""
    if current is None:
        return []
    if not (current.control.review.routes or proposed.control.review.routes):
        return []
    changed = [s for s in GATED if _dump(current, s) != _dump(proposed, s)]
    for name in sorted({g.name for g in current.groups} | {g.name for g in proposed.groups}):
        before, after = current.group(name), proposed.group(name)
        for part in GATED_IN_GROUPS:
            if _group_part(before, part) != _group_part(after, part):
                changed.append(f"groups.{name}.{part}")
    if "routes" not in changed and route_rules(current) != route_rules(proposed):
        changed.append("routes (the defaults implied by groups' models)")
    if current.control.review != proposed.control.review:
        changed.append("control.review")
    return changed


def _group_part(group: GroupSpec | None, part: str) -> Any:
    """A group's `part`; for a group that is not there, the default (a new group with the
    default quota and no budget claims nothing, so adding it needs no review for that)."""
    if group is None:
        default = GroupSpec.model_fields[part].get_default(call_default_factory=True)
        return {part: None if default is None else default.model_dump(mode="json")}
    return group.model_dump(mode="json", include={part})


def changed_sections(current: PlatformSpec | None, proposed: PlatformSpec) -> list[str]:
    """Every top-level section that differs (for the preview's summary)."""
    if current is None:
        return sorted(PlatformSpec.model_fields)
    return [s for s in PlatformSpec.model_fields if _dump(current, s) != _dump(proposed, s)]


def _dump(spec: PlatformSpec, section: str) -> Any:
    return spec.model_dump(mode="json", include={section})


class ReviewBoard:
    """The proposal workflow over the store; approval goes through `Controller.apply`.

    `access_log`: the gateway's JSON-lines log whose last `replay_lines` lines the preview
    replays (None: no preview of traffic)."""

    def __init__(
        self,
        controller: Controller,
        store: Store,
        clock: Clock,
        access_log: Path | None,
        replay_lines: int = REPLAY_LINES,
    ) -> None:
        self._controller = controller
        self._store = store
        self._clock = clock
        self._access_log = access_log
        self._replay_lines = replay_lines
        self._lock = asyncio.Lock()  # one review at a time: approve/reject never interleave

    async def propose(self, loaded: LoadedSpec, author: str, reason: str) -> Proposal:
        """Record a pending proposal: YAML, diff against the current revision, preview."""
        latest = await asyncio.to_thread(self._store.latest_revision)
        text = redact_secrets(loaded.text, loaded.source)  # no plain key is ever stored
        if latest is not None and latest.yaml_text == text:
            raise Conflict(f"nothing to propose: revision {latest.number} is already this spec")
        base = latest.number if latest else 0
        current = load_spec_text(latest.yaml_text, f"revision {base}").spec if latest else None
        diff = revision_diff(latest.yaml_text if latest else None, text, base + 1)
        diff = diff.replace(f"+++ revision {base + 1}", "+++ proposed", 1)
        proposed = load_spec_text(text, loaded.source).spec  # as the store will hold it
        preview = await asyncio.to_thread(self._preview, current, proposed)
        proposal = await asyncio.to_thread(
            self._store.add_proposal,
            author=author,
            reason=reason,
            base_revision=base,
            yaml_text=text,
            diff=diff,
            preview=preview,
            now=self._clock.now(),
        )
        detail = {
            "base_revision": base,
            "sections": preview["sections"],
            "moved": preview["routes"]["moved"],
            "lines_changed": diff.count("\n"),
        }
        await self._controller.audit(author, "propose", f"proposal/{proposal.id}", reason, detail)
        return proposal

    async def proposals(self, include_closed: bool = False, limit: int = 50) -> list[Proposal]:
        state = None if include_closed else "pending"
        return await asyncio.to_thread(self._store.list_proposals, state=state, limit=limit)

    async def get(self, proposal_id: int) -> Proposal:
        return await asyncio.to_thread(self._store.get_proposal, proposal_id)

    async def approve(self, proposal_id: int, reviewer: str, reason: str) -> Proposal:
        """Apply a pending proposal as a new revision, if `reviewer` is not its author and
        it was made against the current revision."""
        async with self._lock:
            p = await self.get(proposal_id)
            if p.state != "pending":
                raise Conflict(f"proposal {p.id} is already {p.state} (by {p.reviewer})")
            if reviewer == p.author:
                raise Forbidden(
                    f"the author cannot approve their own change: proposal {p.id} is by "
                    f"{p.author}; ask someone else to `sluice approve {p.id}`",
                    proposal=p.id,
                )
            latest = await asyncio.to_thread(self._store.latest_revision)
            current = latest.number if latest else 0
            if current != p.base_revision:
                raise Conflict(
                    f"proposal {p.id} is stale: it was made against revision {p.base_revision}"
                    f", and revision {current} is current now; `sluice reject {p.id}` it and "
                    "propose the change again on top of the current spec",
                    proposal=p.id,
                    base_revision=p.base_revision,
                    current_revision=current,
                )
            loaded = load_spec_text(p.yaml_text, f"proposal {p.id}")
            why = f"proposal #{p.id} by {p.author}, approved by {reviewer}: {p.reason}"
            rev = await self._controller.apply(
                loaded, p.author, f"{why} (review: {reason})", reviewed=True
            )
            if rev is None:  # cannot happen: propose refuses a spec equal to its base
                raise Conflict(f"proposal {p.id} changes nothing against the current revision")
            done = await asyncio.to_thread(
                self._store.review_proposal,
                p.id,
                state="approved",
                reviewer=reviewer,
                reason=reason,
                now=self._clock.now(),
                revision=rev.number,
            )
            detail = {"author": p.author, "revision": rev.number, "base_revision": current}
            await self._controller.audit(reviewer, "approve", f"proposal/{p.id}", reason, detail)
            return done

    async def reject(self, proposal_id: int, actor: str, reason: str) -> Proposal:
        """Close a pending proposal unapplied; anyone may, the author too (withdrawal)."""
        async with self._lock:
            done = await asyncio.to_thread(
                self._store.review_proposal,
                proposal_id,
                state="rejected",
                reviewer=actor,
                reason=reason,
                now=self._clock.now(),
            )
            detail = {"author": done.author, "base_revision": done.base_revision}
            await self._controller.audit(actor, "reject", f"proposal/{proposal_id}", reason, detail)
            return done

    # --- the preview (runs in a worker thread: it reads the log) ---------------------------

    def _preview(self, current: PlatformSpec | None, proposed: PlatformSpec) -> dict[str, Any]:
        lines = _tail(self._access_log, self._replay_lines) if self._access_log else []
        requests, unreadable, first, last = _parse(lines)
        impact = route_impact(
            route_rules(current) if current else [], route_rules(proposed), requests
        )
        return {
            "sections": changed_sections(current, proposed),
            "needs_review": gated_changes(current, proposed),
            "log": {
                "path": str(self._access_log) if self._access_log else None,
                "lines": len(lines),
                "unreadable": unreadable,
                "from_ts": first,
                "to_ts": last,
            },
            "routes": impact.to_json(),
        }


def _tail(path: Path, n: int) -> list[str]:
    """The last `n` lines of `path` (none if it does not exist), reading only the end."""
    try:
        with path.open("rb") as f:
            end = f.seek(0, os.SEEK_END)
            pos, data = end, b""
            while pos > 0 and data.count(b"\n") <= n:
                step = min(1 << 16, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except FileNotFoundError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if pos > 0:
        lines = lines[1:]  # the first one is cut
    return [x for x in lines if x.strip()][-n:]


def _parse(lines: list[str]) -> tuple[list[LoggedRequest], int, float | None, float | None]:
    """(requests, lines that were not access-log JSON, first ts, last ts)."""
    out: list[LoggedRequest] = []
    bad = 0
    stamps: list[float] = []
    for line in lines:
        try:
            rec = json.loads(line)
            req = LoggedRequest(
                tenant=rec.get("tenant") or "",
                model=rec.get("model") or "",
                priority=rec.get("priority") or "normal",
                route=rec.get("route"),
            )
        except (ValueError, AttributeError):
            bad += 1
            continue
        out.append(req)
        if isinstance(rec.get("ts"), (int, float)):
            stamps.append(float(rec["ts"]))
    return out, bad, (min(stamps) if stamps else None), (max(stamps) if stamps else None)
