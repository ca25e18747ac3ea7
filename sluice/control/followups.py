""" "Did it help?" live (S12): notice each scaling change and failover, judge it `settle_s`
later (`sluice.policy.gain.judge`), record the verdict as a `followup` event of the group
(what `sluice explain` shows), and hold scale-up where more instances did not help.

A change is seen as the count in force moving (manual `sluice scale` or the autoscaler)
or a failover starting or ending. Consecutive moves the same way are one episode: a climb
2 -> 3 -> 4 is judged once, `settle_s` after its first step, from the window before it to
the last window then (with the count reached by then), so an autoscaler stepping every few
seconds is judged while it climbs, and stopped before `max` when the climb buys nothing. The no-gain
holds are kept in the store, so a restart does not forget them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.control.events import EventLog
from sluice.policy.gain import Change, NoGainHold, hold_released, judge
from sluice.policy.tick import is_advisory
from sluice.spec import PlatformSpec
from sluice.spec.observability import FollowupSpec
from sluice.store import Fenced
from sluice.store.ports import StateRecords

__all__ = ["Followups"]

log = logging.getLogger("sluice.followups")

Values = Mapping[str, float | None]
Window = Callable[[str, float], Values]
"""(group, window_s) -> its series over the last window_s"""

_HOLDS_KEY = "no_gain_holds"


@dataclass
class _Pending:
    change: Change
    due: float


class Followups:
    def __init__(self, store: StateRecords, events: EventLog) -> None:
        self._store = store
        self._events = events
        self._counts: dict[str, int] = {}
        self._failovers: dict[str, str] = {}
        self._pending: dict[str, _Pending] = {}
        self.holds: dict[str, NoGainHold] = {}
        self._fw = FollowupSpec()
        self._looked = False

    async def load(self) -> None:
        doc = await asyncio.to_thread(self._store.get_state, _HOLDS_KEY)
        for h in (doc or {}).get("holds", []):
            self.holds[h["group"]] = NoGainHold(**h)

    async def step(
        self,
        spec: PlatformSpec,
        counts: Mapping[str, int],
        failovers: Mapping[str, str],
        window: Window,
        now: float,
        host_load: float | None = None,
    ) -> None:
        """One look: start or extend episodes for what changed, judge those due, release
        holds whose demand moved."""
        fw = self._fw = spec.observability.followup
        if self._looked:  # the first look only learns what is in force (after a restart too)
            for g in spec.groups:
                old, new = self._counts.get(g.name), counts.get(g.name)
                if old is not None and new is not None and new != old:
                    self._moved(g.name, old, new, g.max_concurrency, window, now)
            for group, backup in failovers.items():
                if self._failovers.get(group) != backup:
                    self._start(group, "failover", 0, 0, f"-> {backup}", window, now)
            for group in self._failovers.keys() - failovers.keys():
                if spec.group(group) is not None:
                    self._start(group, "restore", 0, 0, "", window, now)
        self._looked = True
        self._counts = dict(counts)
        self._failovers = dict(failovers)
        # every verdict (and the hold it sets) before any await: a hold is then set at the
        # counts this look was given, which no scale-up decided since can have outrun
        due = [g for g, p in self._pending.items() if now >= p.due]
        verdicts = [
            self._judge(spec, self._pending.pop(g).change, window, now, host_load) for g in due
        ]
        if any("hold" in detail for _, _, detail in verdicts):
            await self._keep_holds(now)
        for group, text, detail in verdicts:
            await self._events.emit(group, None, "followup", text, **detail)
        for group, hold in list(self.holds.items()):
            grp = spec.group(group)
            why = (
                "the group left the spec or is no longer actively autoscaled"
                if grp is None or grp.autoscaling is None or is_advisory(grp)
                else hold_released(hold, window(group, fw.window_s).get("requests_per_s"), now)
            )
            if why is not None:
                del self.holds[group]
                await self._events.emit(group, None, "no_gain_released", f"scale-up free: {why}")
                await self._keep_holds(now)

    def _moved(
        self,
        group: str,
        old: int,
        new: int,
        slots: int,
        window: Window,
        now: float,
    ) -> None:
        p = self._pending.get(group)
        if p is not None and p.change.kind == "scale":
            c = p.change
            same_way = (new > old) == (c.after_count > c.before_count)
            if same_way:  # judged when the episode's first step settles, not later
                p.change = dataclasses.replace(c, after_count=new)
                return
        self._start(group, "scale", old, new, "", window, now, slots)

    def _start(
        self,
        group: str,
        kind: str,
        old: int,
        new: int,
        note: str,
        window: Window,
        now: float,
        slots: int = 1,
    ) -> None:
        """A new episode; one still open for the group is superseded (judged no more)."""
        before = window(group, self._fw.window_s)
        change = Change(group, kind, now, old, new, note, before, slots)
        self._pending[group] = _Pending(change, now + self._fw.settle_s)

    def _judge(
        self,
        spec: PlatformSpec,
        change: Change,
        window: Window,
        now: float,
        host_load: float | None,
    ) -> tuple[str, str, dict[str, Any]]:
        """The verdict as (group, text, detail) for its `followup` event; a no-gain verdict
        of an autoscaled group sets its hold (kept by the caller)."""
        fw = spec.observability.followup
        watched = change.group
        if change.kind == "failover" and change.note.startswith("-> "):
            watched = change.note[3:]  # the backup now carries the group's traffic
        after = window(watched, fw.window_s)
        result = judge(change, after, host_load)
        detail: dict[str, Any] = {
            "change": {
                "kind": change.kind,
                "at": change.at,
                "from": change.before_count,
                "to": change.after_count,
                "note": change.note,
            },
            **result.to_json(),
        }
        g = spec.group(change.group)
        if result.verdict == "no_gain" and g is not None and g.autoscaling is not None:
            rate = after.get("requests_per_s") or 0.0
            hold = NoGainHold(
                group=change.group,
                # the count in force now: the climb may have gone on since its last move
                count=max(change.after_count, self._counts.get(change.group, 0)),
                rate=rate,
                since=now,
                until=now + fw.hold_s if fw.hold_s > 0 else None,
                reason=f"more instances did not help ({result.bottleneck})",
            )
            self.holds[change.group] = hold
            detail["hold"] = hold.to_json()
        return change.group, result.text, detail

    async def _keep_holds(self, now: float) -> None:
        doc = {"holds": [h.to_json() for h in self.holds.values()]}
        try:
            await asyncio.to_thread(self._store.put_state, _HOLDS_KEY, doc, now)
        except Fenced as exc:  # deposed: the new leader judges with its own
            log.warning("no-gain holds not kept: %s", exc)
        except Exception:
            log.exception("no-gain holds not kept; they hold until a restart")
