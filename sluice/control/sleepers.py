"""Puts a group's sleeping standby to sleep and wakes it, through the server's own endpoints
(vLLM's sleep mode: POST /sleep?level=1, POST /wake_up), as `sluice.policy.standby` places
the group's instances.

An instance is put to sleep only once it serves nothing (the gateway's in-flight count, as a
drain reads it; at most the group's drain timeout), since a sleeping server drops what it
was generating. A call that fails is tried again on a later tick, not sooner than
`RETRY_S`. What sleeps is this controller's memory: a controller that adopts running
instances (a restart, a takeover) cannot know which sleep, so it counts them asleep (never
routed before a wake, which an awake server answers at once) and sends a sleep to those in
sleeping places (which a sleeping server takes as done), until each answers `status_path`
(vLLM's GET /is_sleeping), which settles it in milliseconds. Until it is settled its units
are not lent: it may be awake, holding its accelerator memory (`holding_nothing`).

A sleeper whose units the tick lends (`sluice.policy.standby.sleeping_units`) is fenced:
left out of the gateways' wakeable standby, and counted fenced (its units free to lend)
only once every gateway serves a snapshot that leaves it out. A fenced sleeper the count
needs is woken only once quota grants its units back (`TickDecision.unwoken`) and, on a
pool that pins devices, once nothing else holds its devices (the supervisor's word, as
the tick's: a borrower placed there between the tick's look and now keeps it asleep).

The fence outlives this controller: each tick keeps it in the store (`FENCES_KEY`: the
sleepers fenced, and of them those whose units are lent) before it acts, and the next
controller (a restart, a takeover) reads it back before its first snapshot (`restore`):
a sleeper whose units a borrower may hold is never published wakeable, nor counted as
holding its units, and is woken only once a tick of the new controller lets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

import httpx

from sluice.control.events import EventLog
from sluice.policy.routing import Endpoint
from sluice.policy.standby import StandbySplit
from sluice.spec import PlatformSpec
from sluice.spec.servers import SleepSpec

__all__ = ["FENCES_KEY", "RETRY_S", "Sleepers", "fences_record"]

log = logging.getLogger(__name__)

RETRY_S = 5.0
"""The least time between two failed tries of the same call on the same instance."""
POLL_S = 0.2
"""How often the in-flight count is read while an instance waits to be put to sleep."""
ASK_S = 5.0
"""How long an adopted instance has to say whether it sleeps."""
FENCES_KEY = "sleepers"
"""The controller state (`Store.put_state`) that keeps the fence across controllers."""


def fences_record(fencing: Iterable[str], lent: Iterable[str]) -> dict[str, list[str]]:
    """What the store keeps of the fence: `fencing`, the sleepers no gateway is to wake
    (`TickDecision.fence`); `lent`, those of them whose units other groups may hold (fenced
    in a snapshot every gateway served, and released by the tick)."""
    return {"fencing": sorted(fencing), "lent": sorted(lent)}


class Sleepers:
    def __init__(
        self,
        events: EventLog,
        inflight: Callable[[str], Awaitable[int]],
        adopted: Callable[[str], bool],
        changed: Callable[[], None],
        now: Callable[[], float],
        devices_free: Callable[[str], bool] = lambda _: True,
    ) -> None:
        """`inflight(instance)`: requests it serves now (raises when unknown); `adopted`:
        whether an instance ran before this controller (recovered on a start); `changed()`:
        tell the loop to tick (an instance fell asleep or woke: the routing changes);
        `devices_free(instance)`: nothing else holds its devices (a borrower placed there
        while its units were lent is gone), so it may wake."""
        self._events = events
        self._inflight = inflight
        self._adopted = adopted
        self._changed = changed
        self._now = now
        self._devices_free = devices_free
        self.asleep: set[str] = set()
        """instances known (or, adopted, assumed) to sleep: never routed before a wake"""
        self._doubtful: set[str] = set()
        """adopted instances counted asleep without knowing it: a sleep is sent to be sure"""
        self._restored_lent: frozenset[str] = frozenset()
        """sleepers the previous controller had lent (`restore`): asleep, doubt or not"""
        self._known: set[str] = set()
        self._calls: dict[str, asyncio.Task[None]] = {}
        self._failed_at: dict[str, float] = {}
        self._client: httpx.AsyncClient | None = None
        self.fencing: frozenset[str] = frozenset()
        """sleepers the last tick fenced: no gateway is to wake them"""
        self._fenced_at: dict[str, int] = {}
        """fencing sleeper -> the first snapshot version that left it out"""
        self._unwoken: frozenset[str] = frozenset()

    def restore(self, record: Mapping[str, Any]) -> frozenset[str]:
        """Take up the fence a previous controller kept (`fences_record`), before the first
        tick and snapshot; returns the sleepers whose units are lent. They all count asleep
        (as every adopted sleeper does until it says otherwise) and stay out of the
        wakeable standby; the lent ones count fenced at once (every gateway serves a
        snapshot without them, of the old epoch or of this one: none offered them since
        they were fenced) and are not woken until a tick says so. Those fenced but not yet
        lent are fenced anew on this epoch (a gateway may have served an older snapshot
        that offered them)."""
        fencing = frozenset(str(i) for i in record.get("fencing", ()))
        lent = fencing & frozenset(str(i) for i in record.get("lent", ()))
        self.asleep |= fencing
        self.fencing, self._unwoken, self._restored_lent = fencing, lent, lent
        for iid in lent:
            self._fenced_at[iid] = 0  # any version of any epoch a gateway serves leaves it out
        return lent

    async def ask_adopted(
        self, spec: PlatformSpec, ready: Mapping[str, Sequence[Endpoint]]
    ) -> None:
        """Before the first routing snapshot after a start (a restart, a takeover): ask the
        adopted instances of every group that keeps sleeping standby whether they sleep, all
        at once (each within `ASK_S`), so that no snapshot puts a sleeping one in rotation,
        even for a tick (the placement serves from the oldest awake instances, and an
        adopted one counts awake until it says otherwise). One that does not answer counts
        asleep, as `act` counts it."""
        asks = []
        for g in spec.groups:
            a, sleep = g.autoscaling, g.sleep
            if a is None or not a.sleeping_standby or sleep is None:
                continue
            for ep in ready.get(g.name, ()):
                iid = ep.instance_id
                if not self._adopted(iid) or iid in self._known:
                    continue
                self._known.add(iid)  # asked: `act` does not count it asleep again
                self.asleep.add(iid)
                self._doubtful.add(iid)
                if sleep.status_path is not None:
                    asks.append(self._ask(g.name, ep, sleep.status_path))
        await asyncio.gather(*asks)

    def holding_nothing(self) -> frozenset[str]:
        """The sleepers a tick may count as holding no accelerator (whose units it may lend):
        those known asleep, not those only assumed asleep (adopted, not yet settled by an
        answer or a sleep: one may be awake and hold its memory), save the ones the previous
        controller had lent (a borrower may hold their units now; no gateway was offered
        them since, so only a controller's wake could have woken them)."""
        return frozenset(
            i for i in self.asleep if i not in self._doubtful or i in self._restored_lent
        )

    def fence(self, fencing: frozenset[str], unwoken: frozenset[str]) -> None:
        """The tick's fence (`TickDecision.fence`) and the fenced sleepers it does not let
        wake yet (`TickDecision.unwoken`)."""
        self.fencing, self._unwoken = fencing, unwoken
        for iid in [i for i in self._fenced_at if i not in fencing]:
            del self._fenced_at[iid]

    def published(self, version: int) -> None:
        """The routing snapshot `version` is out: the fencing sleepers are left out of it."""
        for iid in self.fencing:
            self._fenced_at.setdefault(iid, version)

    def fenced(self, oldest_served: int | None) -> frozenset[str]:
        """Asleep sleepers no gateway may wake: fenced in a snapshot version every gateway
        serves (`oldest_served`; None: no remote gateway, the local one has the newest)."""
        return frozenset(
            iid
            for iid, v in self._fenced_at.items()
            if iid in self.asleep and (oldest_served is None or oldest_served >= v)
        )

    def woken(self, ids: Iterable[str]) -> None:
        """A gateway woke these (requests waited) and routes to them."""
        for iid in ids:
            self.asleep.discard(iid)
            self._doubtful.discard(iid)

    def act(self, spec: PlatformSpec, placed: Mapping[str, StandbySplit]) -> None:
        """Start the sleeps and wakes the placements ask for (each instance one call at a
        time); ask adopted instances whether they sleep; forget instances no longer placed."""
        present = {e.instance_id for s in placed.values() for e in _all(s)}
        for gone in [i for i in self.asleep | set(self._failed_at) if i not in present]:
            self.asleep.discard(gone)
            self._doubtful.discard(gone)
            self._failed_at.pop(gone, None)
        known, self._known = self._known, present
        for group, split in placed.items():
            g = spec.group(group)
            sleep = g.sleep if g is not None else None
            if sleep is None or g is None:
                continue
            for ep in _all(split):
                if ep.instance_id not in known and self._adopted(ep.instance_id):
                    self.asleep.add(ep.instance_id)  # until it says otherwise: not routed
                    self._doubtful.add(ep.instance_id)
                    if sleep.status_path is not None:
                        self._start(ep, self._ask(group, ep, sleep.status_path))
            unsure = tuple(e for e in split.sleeping if e.instance_id in self._doubtful)
            for ep in split.to_sleep + unsure:
                self._start(ep, self._sleep(group, ep, sleep, g.drain_timeout_s))
            for ep in split.to_wake:  # not while its units are lent, or its devices held
                iid = ep.instance_id
                if iid not in self._unwoken and self._devices_free(iid):
                    self._start(ep, self._wake(group, ep, sleep))

    async def close(self) -> None:
        for task in list(self._calls.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._client is not None:
            await self._client.aclose()

    # --- the calls ---------------------------------------------------------------------

    def _start(self, ep: Endpoint, call: Coroutine[Any, Any, None]) -> None:
        iid = ep.instance_id
        failed = self._failed_at.get(iid)
        if iid in self._calls or (failed is not None and self._now() - failed < RETRY_S):
            call.close()  # a coroutine never to be awaited
            return
        task = asyncio.get_running_loop().create_task(call)
        self._calls[iid] = task
        task.add_done_callback(lambda _task: self._calls.pop(iid, None))

    async def _sleep(self, group: str, ep: Endpoint, sleep: SleepSpec, drain_s: float) -> None:
        iid = ep.instance_id
        deadline = self._now() + drain_s
        with contextlib.suppress(Exception):  # unknown in-flight: the drain timeout bounds it
            while await self._inflight(iid) > 0 and self._now() < deadline:
                await asyncio.sleep(POLL_S)
        why = await self._post(ep, f"{sleep.sleep_path}?level={sleep.level}", sleep.wake_timeout_s)
        if why is not None:
            self._failed_at[iid] = self._now()
            await self._events.emit(group, iid, "sleep-failed", f"sleep refused: {why}")
            return
        self._failed_at.pop(iid, None)
        doubtful = iid in self._doubtful
        self._doubtful.discard(iid)
        self.asleep.add(iid)
        self._changed()
        if not doubtful:
            await self._events.emit(
                group, iid, "asleep", f"sleeping standby (level {sleep.level}): out of rotation"
            )

    async def _wake(self, group: str, ep: Endpoint, sleep: SleepSpec) -> None:
        iid = ep.instance_id
        started = self._now()
        why = await self._post(ep, sleep.wake_path, sleep.wake_timeout_s)
        if why is not None:
            self._failed_at[iid] = self._now()
            await self._events.emit(group, iid, "wake-failed", f"wake refused: {why}")
            return
        self._failed_at.pop(iid, None)
        self.asleep.discard(iid)
        self._doubtful.discard(iid)
        self._changed()
        await self._events.emit(
            group, iid, "woken", f"woken by the controller in {self._now() - started:.1f}s"
        )

    async def _ask(self, group: str, ep: Endpoint, path: str) -> None:
        """An adopted instance: does it sleep? An answer settles it; none leaves it counted
        asleep (woken before it is routed, put to sleep again where it is not needed)."""
        iid = ep.instance_id
        try:
            r = await self._http().get(f"http://{ep.host}:{ep.port}{path}", timeout=ASK_S)
            sleeping = r.json().get("is_sleeping") if r.is_success else None
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.warning("%s: %s did not say whether it sleeps: %s", group, iid, exc)
            return
        if not isinstance(sleeping, bool):
            log.warning("%s: %s did not say whether it sleeps (%s)", group, iid, r.status_code)
            return
        self._doubtful.discard(iid)
        if not sleeping:
            self.asleep.discard(iid)
            self._changed()

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(trust_env=False)
        return self._client

    async def _post(self, ep: Endpoint, path: str, timeout_s: float) -> str | None:
        """POST `path` on the instance; None when it answered 2xx, else why not."""
        try:
            r = await self._http().post(f"http://{ep.host}:{ep.port}{path}", timeout=timeout_s)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"[:300]
        return None if r.is_success else f"HTTP {r.status_code}: {r.text[:200]}"


def _all(split: StandbySplit) -> tuple[Endpoint, ...]:
    return split.rotation + split.warm + split.sleeping + split.to_sleep
