"""Reviewed spec changes (R5): propose with a diff and an impact preview, approve by another
person (applied as a normal numbered revision), or reject; every step audited.

Another person, not another token: a proposal records its author's person, and approval
is refused (403, audited as `approve-refused`, nothing applied) to any token of that person,
and to a person whom the proposer's person enrolled after proposing (see
`sluice.control.tokens` for who may mint a token for whom). Audit rows written here carry
the acting token's person in `detail.person` (and the author's in `detail.author_person`).

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

from sluice.control.spec_work import offload
from sluice.core import Clock, Conflict, Forbidden, NotFound
from sluice.policy import LoggedRequest, route_impact, route_rules
from sluice.spec import GroupSpec, LoadedSpec, PlatformSpec, draft_revision, open_revision
from sluice.store import Proposal, TokenRecord
from sluice.store.ports import ProposalRecords

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
        store: ProposalRecords,
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

    async def propose(
        self, loaded: LoadedSpec, author: str, reason: str, *, person: str | None = None
    ) -> Proposal:
        """Record a pending proposal: YAML, diff against the current revision, preview.
        `author` is the token, `person` who holds it (None: looked up by the token)."""
        person = person if person is not None else await self._person_of(author)
        latest = await asyncio.to_thread(self._store.latest_revision)
        base = latest.number if latest else 0
        previous = latest.yaml_text if latest else None
        # no plain key is ever stored; parsed, checked and diffed off the event loop
        draft = await offload(
            draft_revision,
            loaded.text,
            loaded.source,
            previous,
            base + 1,
            self._controller.sealer,
            parse_previous=True,
        )
        text = draft.text
        if latest is not None and previous == text:
            raise Conflict(f"nothing to propose: revision {latest.number} is already this spec")
        current = draft.previous
        diff = draft.diff.replace(f"+++ revision {base + 1}", "+++ proposed", 1)
        proposed = draft.loaded.spec  # as the store will hold it
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
            author_person=person,
        )
        detail = {
            "person": person,
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

    async def approve(
        self, proposal_id: int, reviewer: str, reason: str, *, person: str | None = None
    ) -> Proposal:
        """Apply a pending proposal as a new revision, if `reviewer` (a token, held by
        `person`; None: looked up by the token) is another person than its author's and it
        was made against the current revision."""
        person = person if person is not None else await self._person_of(reviewer)
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
            refusal = await self._second_person_refusal(p, reviewer, person)
            if refusal is not None:
                await self._controller.audit(
                    reviewer,
                    "approve-refused",
                    f"proposal/{p.id}",
                    refusal,
                    {"person": person, "author": p.author, "author_person": p.author_person},
                )
                raise Forbidden(refusal, proposal=p.id, person=person, audited=True)
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
            loaded = await offload(
                open_revision, p.yaml_text, f"proposal {p.id}", self._controller.sealer
            )
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
                reviewer_person=person,
            )
            detail = {
                "person": person,
                "author": p.author,
                "author_person": p.author_person,
                "revision": rev.number,
                "base_revision": current,
            }
            await self._controller.audit(reviewer, "approve", f"proposal/{p.id}", reason, detail)
            return done

    async def reject(
        self, proposal_id: int, actor: str, reason: str, *, person: str | None = None
    ) -> Proposal:
        """Close a pending proposal unapplied; anyone may, the author too (withdrawal)."""
        person = person if person is not None else await self._person_of(actor)
        async with self._lock:
            done = await asyncio.to_thread(
                self._store.review_proposal,
                proposal_id,
                state="rejected",
                reviewer=actor,
                reason=reason,
                now=self._clock.now(),
                reviewer_person=person,
            )
            detail = {
                "person": person,
                "author": done.author,
                "author_person": done.author_person,
                "base_revision": done.base_revision,
            }
            await self._controller.audit(actor, "reject", f"proposal/{proposal_id}", reason, detail)
            return done

    # --- persons ---------------------------------------------------------------------------

    async def _person_of(self, token_name: str) -> str:
        """The person holding `token_name` (token names are never reused); for a name that
        is no token (a caller inside the platform), a person named like it."""
        try:
            return (await asyncio.to_thread(self._store.get_token, token_name)).person
        except NotFound:
            return token_name.lower()

    async def _second_person_refusal(self, p: Proposal, reviewer: str, person: str) -> str | None:
        """Why `reviewer` (held by `person`) may not approve `p`, or None if they may: the
        same person as the author's, or a person the author's person enrolled (minted the
        first token of) after proposing, which is how a sock puppet would be made."""
        if person == p.author_person:
            return (
                f"proposal {p.id} was proposed by token {p.author} (person {p.author_person})"
                f"; token {reviewer} belongs to the same person: ask another person to "
                f"`sluice approve {p.id}`"
            )
        tokens = await asyncio.to_thread(self._store.list_tokens)
        first = next((t for t in tokens if t.person == person), None)  # ordered by id
        if first is None or first.created_at < p.created_at:
            return None
        minter = _token_named(tokens, first.created_by)
        if minter is None or minter.person != p.author_person:
            return None
        return (
            f"proposal {p.id} was proposed by token {p.author} (person {p.author_person}); "
            f"token {reviewer} belongs to person {person}, enrolled after the proposal by "
            f"token {minter.name} of the same person {p.author_person}: a person enrolled by "
            "the proposer after proposing cannot approve it; ask a person who held a token "
            f"before to `sluice approve {p.id}`"
        )

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


def _token_named(tokens: list[TokenRecord], name: str) -> TokenRecord | None:
    return next((t for t in tokens if t.name == name), None)


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
