"""Admission per group (R6): slots first, then a bounded priority queue, shedding lowest first;
inside a priority, tenants share by the service they received (issue 35).

A sync core in the style of anyio's memory streams: `offer_nowait`, `release`, `expire`,
`cancel` and `statistics` never wait and never read a clock (time comes in as `now`); the
gateway's async shell parks queued requests on futures and wakes the ones returned here.

- slots = ready instances x max_concurrency, set by the gateway on every snapshot;
- a request takes a slot if one is free and nobody waits;
- else it waits in its priority's band (high, normal, low; high is served first); inside a
  band a freed slot goes to the waiting tenant that has had the least service (below), FIFO
  within a tenant;
- when the queue is full, a newcomer evicts the *newest* waiter of the lowest priority below
  its own; with none below it, the newcomer itself is shed (429). So overload sheds `low`
  before `normal` before `high`;
- a waiter older than `max_wait_s` is expired (the gateway answers 503/429);
- a request whose instances all refused it goes back to the queue (`requeue`) in the place
  its arrival time gives it.

Fair shares inside a band, after the Virtual Token Counter (Sheng et al., "Fairness in
Serving Large Language Models", OSDI'24). Each tenant has a counter: the cost of the requests
dispatched to it from the band (`request_cost`, in prompt-token units), over its `weight`. A
freed slot goes to the backlogged tenant (one with a request waiting) with the least counter;
at equal counters, to the smaller request (a tenant lifted to the least counter, below, ties
with it: a light tenant's small request then need not wait behind a heavy one's), then the
older. Each dispatch adds at most U = max(cost / weight) to one counter, so two tenants that stay
backlogged keep their counters within U of each other, and over any interval in which both
stay backlogged, service / weight differs by at most 2 U. A tenant that becomes backlogged
is first lifted to the least counter among the backlogged ones (with none, to the level the
last one to leave had reached): idle time earns no credit to spend in a burst. Work
conserving: a slot is never idle while anyone waits. Callers that name no tenant are all the
tenant "", which is plain FIFO. `try_acquire`, and an offer that finds a free slot, charge
nothing: they run only when nobody waits, where order does not matter, and the lift rule
makes service nobody competed for irrelevant to who goes first later.

Bounded memory: a band forgets the counter of a tenant with nothing queued once it is at or
below the lift level (forgetting it changes nothing: it would be lifted there on return), and
holds at most `TENANTS_MAX` idle counters. O(log n) per dispatch: a heap keyed by counter,
with stale entries skipped when they surface and compacted when they outnumber live ones.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from heapq import heapify, heappop, heappush
from typing import Generic, TypeVar

from sluice.policy.routing import PRIORITIES

__all__ = [
    "BYTES_PER_TOKEN",
    "COMPLETION_TOKENS_MAX",
    "COMPLETION_WEIGHT",
    "EXPECTED_COMPLETION_TOKENS",
    "OTHER_TENANTS",
    "PROMPT_WEIGHT",
    "SERVICE_TENANTS_MAX",
    "TENANTS_MAX",
    "AdmissionStats",
    "GroupAdmission",
    "Offer",
    "answer_cost",
    "request_cost",
]

T = TypeVar("T")
_RANK = {p: i for i, p in enumerate(PRIORITIES)}

PROMPT_WEIGHT = 1.0
COMPLETION_WEIGHT = 2.0
"""Cost of a prompt token and of a generated one (VTC's w_p = 1, w_q = 2: a decode step costs
an instance about twice what a prefilled token does, per token)."""
BYTES_PER_TOKEN = 4.0
"""The prompt's size in tokens is estimated as its request body's bytes over this (English
text runs about 4 bytes a token; the JSON around it is counted too)."""
EXPECTED_COMPLETION_TOKENS = 256.0
"""Tokens a request is expected to generate when it names no `max_tokens`."""
COMPLETION_TOKENS_MAX = 4096.0
"""Cap on the completion estimate taken from `max_tokens` (an upper bound, often generous)."""
TENANTS_MAX = 10_000
"""Idle counters (tenants with nothing queued, above the lift level) one band holds at most;
past it the lowest are forgotten, losing at most what they were above the level."""
SERVICE_TENANTS_MAX = 1_000
"""Tenants `tenant_service` reports by name; later ones are summed under `OTHER_TENANTS`."""
OTHER_TENANTS = "_other"
"""Not a tenant name (those start with a letter or digit)."""


def request_cost(body_bytes: int, payload: object = None) -> float:
    """The estimated cost of one request, in prompt-token units, known before it is served:
    `PROMPT_WEIGHT` x prompt tokens (`body_bytes` / `BYTES_PER_TOKEN`) + `COMPLETION_WEIGHT` x
    completion tokens (the body's `max_tokens` or `max_completion_tokens`, at most
    `COMPLETION_TOKENS_MAX`, else `EXPECTED_COMPLETION_TOKENS`). `payload`: the parsed body.
    Once the answer's real cost is known, `GroupAdmission.charge` corrects the difference.

    Worked example: a 2,000-byte chat body with `max_tokens: 100` costs 500 + 200 = 700.
    """
    completion = EXPECTED_COMPLETION_TOKENS
    if isinstance(payload, dict):
        asked = payload.get("max_completion_tokens", payload.get("max_tokens"))
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
            completion = min(float(asked), COMPLETION_TOKENS_MAX)
    return PROMPT_WEIGHT * body_bytes / BYTES_PER_TOKEN + COMPLETION_WEIGHT * completion


def answer_cost(prompt_tokens: int, completion_tokens: int) -> float:
    """The real cost of an answered request, in `request_cost`'s units."""
    return PROMPT_WEIGHT * prompt_tokens + COMPLETION_WEIGHT * completion_tokens


class Offer(Enum):
    ADMITTED = "admitted"
    QUEUED = "queued"
    SHED = "shed"


@dataclass(frozen=True, slots=True)
class AdmissionStats:
    slots: int
    in_use: int
    queued: dict[str, int]
    admitted_total: int
    queued_total: int
    shed_total: int
    expired_total: int
    tenants: int = 0
    """Fairness counters held, all bands: backlogged tenants and idle ones above the lift."""

    @property
    def queue_length(self) -> int:
        return sum(self.queued.values())


class _Waiter(Generic[T]):
    """One queued request. `share`: what dispatching it adds to its tenant's counter (cost /
    weight); `order`: unique, rising with each offer; `live`: still queued (a band's arrival
    deque drops the others lazily)."""

    __slots__ = ("cost", "item", "live", "order", "share", "since", "tenant")

    def __init__(
        self, item: T, since: float, tenant: str, cost: float, share: float, order: int
    ) -> None:
        self.item = item
        self.since = since
        self.tenant = tenant
        self.cost = cost
        self.share = share
        self.order = order
        self.live = True


class _Tenant(Generic[T]):
    """A tenant's counter in one band (service / weight) and its waiters, oldest first."""

    __slots__ = ("counter", "queue")

    def __init__(self, counter: float) -> None:
        self.counter = counter
        self.queue: deque[_Waiter[T]] = deque()


# (counter, head's share, head's since, head's order, tenant): the least counter first; at
# equal counters (as a tenant lifted to the least one is) the smaller request, then the oldest.
_Ready = tuple[float, float, float, int, str]


class _Band(Generic[T]):
    """The waiters of one priority: per-tenant FIFOs picked by least counter, plus every
    waiter in arrival order (for expiry, eviction and `requeue`'s place).

    Invariants: `arrivals` is sorted by `since` (offers come with a `now` that never goes
    back; `requeue` inserts in place), and each tenant's queue is its live entries of
    `arrivals`, in the same order, so the band's oldest (newest) waiter heads (ends) its
    tenant's queue. Every backlogged tenant has a current entry in `ready`. `floor` never
    goes down, and while anyone is backlogged it is the least backlogged counter; every
    counter held is at or above it.
    """

    __slots__ = ("arrivals", "backlogged", "dead", "floor", "idle", "ready", "tenants", "waiting")

    def __init__(self) -> None:
        self.arrivals: deque[_Waiter[T]] = deque()
        self.dead = 0  # entries of `arrivals` no longer queued
        self.waiting = 0
        self.tenants: dict[str, _Tenant[T]] = {}
        self.backlogged = 0  # tenants with a waiter
        self.ready: list[_Ready] = []
        self.idle: list[tuple[float, str]] = []  # idle tenants held, by counter (lazily)
        self.floor = 0.0

    # -- in ---------------------------------------------------------------------------------

    def push(self, w: _Waiter[T]) -> None:
        """`w` (the newest waiter) joins the end of its tenant's queue."""
        self.arrivals.append(w)
        self.waiting += 1
        t = self.tenants.get(w.tenant)
        if t is None or not t.queue:
            t = self._join(w.tenant, t)
            t.queue.append(w)
            self._ready(w.tenant, t)
            self._settle()  # (alone, a tenant that left with a debt raises the level)
        else:
            t.queue.append(w)

    def insert(self, w: _Waiter[T]) -> None:
        """`w` waits again, in its place by `since` in the band and in its tenant's queue,
        ahead of those who came at `since` or later; its charge is refunded."""
        at = _place(self.arrivals, w.since)
        self.arrivals.insert(at, w)
        self.waiting += 1
        name = w.tenant
        t = self.tenants.get(name)
        if t is None or not t.queue:
            t = self._join(name, t)
            t.queue.append(w)
        else:
            t.queue.insert(_place(t.queue, w.since), w)
        self.charge(name, -w.share)  # (pushes its entry in `ready`)

    def _join(self, name: str, t: _Tenant[T] | None) -> _Tenant[T]:
        """`name` becomes backlogged, lifted to at least the least backlogged counter (or,
        with none backlogged, the floor): VTC's rule against hoarding credit."""
        lift = self.ready_top()[0] if self.backlogged else self.floor
        if t is None:
            t = self.tenants[name] = _Tenant(lift)
        elif t.counter < lift:
            t.counter = lift
        self.backlogged += 1
        return t

    def charge(self, name: str, delta: float) -> None:
        """Add `delta` (cost / weight; negative: a refund) to `name`'s counter, never below
        the floor (no credit below what a returning tenant would be lifted to). A tenant
        forgotten was at or below the floor: it starts from there."""
        t = self.tenants.get(name)
        if t is None:
            if delta <= 0.0:
                return
            t = self.tenants[name] = _Tenant(self.floor)
        t.counter = max(t.counter + delta, self.floor)
        if t.queue:
            self._ready(name, t)
        else:
            self._idle(name, t)
        self._settle()

    # -- out --------------------------------------------------------------------------------

    def pop_next(self) -> _Waiter[T]:
        """Dispatch the head of the least-counter tenant's queue and charge it (pre:
        `waiting`)."""
        name = heappop(self.ready_heap())[4]
        t = self.tenants[name]
        w = t.queue.popleft()
        w.live = False
        self.dead += 1
        self.waiting -= 1
        t.counter += w.share
        if t.queue:
            self._ready(name, t)
        else:
            self.backlogged -= 1
            if not self.backlogged:  # VTC: the last to leave sets the level for the next
                self.floor = max(self.floor, t.counter)
            self._idle(name, t)
        self._settle()
        self._compact()
        return w

    def pop_oldest(self, limit: float) -> _Waiter[T] | None:
        """Remove the oldest waiter if it came at or before `limit`, else None."""
        arr = self.arrivals
        while arr and not arr[0].live:
            arr.popleft()
            self.dead -= 1
        if not arr or arr[0].since > limit:
            return None
        w = arr.popleft()
        t = self.tenants[w.tenant]
        t.queue.popleft()  # (it is `w`: see the invariants)
        self._left(w, t)
        return w

    def pop_newest(self) -> _Waiter[T]:
        """Remove the newest waiter (pre: `waiting`)."""
        arr = self.arrivals
        while not arr[-1].live:
            arr.pop()
            self.dead -= 1
        w = arr.pop()
        t = self.tenants[w.tenant]
        t.queue.pop()  # (it is `w`)
        self._left(w, t)
        return w

    def remove(self, item: object) -> bool:
        """Remove the waiter holding `item` (by identity); False if none does."""
        for w in self.arrivals:
            if w.live and w.item is item:
                t = self.tenants[w.tenant]
                t.queue.remove(w)  # (waiters compare by identity)
                self.dead += 1
                self._left(w, t)
                self._compact()
                return True
        return False

    def oldest_since(self) -> float | None:
        for w in self.arrivals:
            if w.live:
                return w.since
        return None

    def gap(self) -> float:
        """Greatest minus least counter among backlogged tenants (0 with fewer than two)."""
        if self.backlogged < 2:
            return 0.0
        counters = [t.counter for t in self.tenants.values() if t.queue]
        return max(counters) - min(counters)

    # -- bookkeeping ------------------------------------------------------------------------

    def _left(self, w: _Waiter[T], t: _Tenant[T]) -> None:
        """`w` left the queue unserved (expired, evicted, cancelled): no charge."""
        w.live = False
        self.waiting -= 1
        if t.queue:
            self._ready(w.tenant, t)  # (its head may have changed)
        else:
            self.backlogged -= 1
            self._idle(w.tenant, t)
        self._settle()

    def _ready(self, name: str, t: _Tenant[T]) -> None:
        head = t.queue[0]
        ready = self.ready
        heappush(ready, (t.counter, head.share, head.since, head.order, name))
        if len(ready) > 2 * self.backlogged + 64:  # mostly stale: keep the current ones
            self.ready = [e for e in set(ready) if self._current(e)]
            heapify(self.ready)

    def _current(self, e: _Ready) -> bool:
        t = self.tenants.get(e[4])
        return t is not None and bool(t.queue) and t.queue[0].order == e[3] and t.counter == e[0]

    def ready_heap(self) -> list[_Ready]:
        """`ready` with a current entry on top (pre: `backlogged`)."""
        self.ready_top()
        return self.ready

    def ready_top(self) -> _Ready:
        ready = self.ready
        while not self._current(ready[0]):
            heappop(ready)
        return ready[0]

    def _idle(self, name: str, t: _Tenant[T]) -> None:
        """`name` has nothing queued: forget it at or below the floor, else hold it."""
        if t.counter <= self.floor:
            del self.tenants[name]
            return
        idle = self.idle
        heappush(idle, (t.counter, name))
        held = len(self.tenants) - self.backlogged
        if len(idle) > 2 * held + 64:
            self.idle = [(c, n) for c, n in set(idle) if self._idle_at(n, c)]
            heapify(self.idle)
        while held > TENANTS_MAX:  # forget the lowest: they lose the least
            c, n = heappop(self.idle)
            if self._idle_at(n, c):
                del self.tenants[n]
                held -= 1

    def _idle_at(self, name: str, counter: float) -> bool:
        t = self.tenants.get(name)
        return t is not None and not t.queue and t.counter == counter

    def _settle(self) -> None:
        """Raise the floor to the least backlogged counter; forget idle tenants below it."""
        if self.backlogged:
            self.floor = max(self.floor, self.ready_top()[0])
        idle = self.idle
        tenants = self.tenants
        while idle and idle[0][0] <= self.floor:
            name = heappop(idle)[1]
            t = tenants.get(name)
            if t is not None and not t.queue and t.counter <= self.floor:
                del tenants[name]

    def _compact(self) -> None:
        """Drop waiters no longer queued from `arrivals`: at its head at once (one tenant's
        FIFO leaves nothing else), elsewhere once they outnumber the queued ones."""
        arr = self.arrivals
        if not self.waiting:
            arr.clear()
            self.dead = 0
            return
        while not arr[0].live:
            arr.popleft()
            self.dead -= 1
        if self.dead > 32 and self.dead > self.waiting:
            self.arrivals = deque(w for w in arr if w.live)
            self.dead = 0


def _place(queue: deque[_Waiter[T]], since: float) -> int:
    """Where a waiter of `since` goes in a queue sorted by `since`: before those of `since`
    or later (from the end: a requeued request is usually recent)."""
    at = len(queue)
    while at and queue[at - 1].since >= since:
        at -= 1
    return at


class GroupAdmission(Generic[T]):
    """Admission state of one group. `T` is whatever the caller uses as a ticket."""

    def __init__(self, max_queue: int, max_wait_s: float, slots: int = 0) -> None:
        self.max_queue = max_queue
        self.max_wait_s = max_wait_s
        self.slots = slots
        self.in_use = 0
        self._bands: tuple[_Band[T], ...] = tuple(_Band() for _ in PRIORITIES)
        self._queued = 0
        self._order = 0
        self._service: dict[str, float] = {}
        self._admitted = self._queued_total = self._shed = self._expired = 0

    @property
    def queue_length(self) -> int:
        """Requests waiting now, all priorities."""
        return self._queued

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits (the hot path; no ticket, no clock).

        True means admitted, exactly as `offer_nowait` returning ADMITTED; False changes
        nothing, so the caller may look elsewhere (a fallback group) before queueing here.
        """
        if self.in_use < self.slots and self._queued == 0:
            self.in_use += 1
            self._admitted += 1
            return True
        return False

    def offer_nowait(
        self,
        item: T,
        priority: str,
        now: float,
        tenant: str = "",
        cost: float = 1.0,
        weight: float = 1.0,
    ) -> tuple[Offer, T | None]:
        """Admit, queue or shed `item` (`now`: seconds, the caller's monotonic clock). The
        second value is a waiter evicted to make room (the caller answers it 429), or None.

        `tenant`, `cost` (`request_cost` units, >= 0) and `weight` (> 0): whose request it
        is, what dispatching it from the queue charges that tenant's counter (cost /
        weight), and its share against other tenants of its priority. The defaults make
        every caller one tenant: FIFO."""
        if self.in_use < self.slots and self._queued == 0:
            self.in_use += 1
            self._admitted += 1
            return Offer.ADMITTED, None
        rank = _RANK[priority]
        evicted: T | None = None
        if self._queued >= self.max_queue:
            victim_rank = self._lowest_waiting_rank()
            if victim_rank is None or victim_rank <= rank:
                self._shed += 1
                return Offer.SHED, None
            evicted = self._bands[victim_rank].pop_newest().item  # newest of the lowest
            self._queued -= 1
            self._shed += 1
        self._order += 1
        self._bands[rank].push(_Waiter(item, now, tenant, cost, cost / weight, self._order))
        self._queued += 1
        self._queued_total += 1
        return Offer.QUEUED, evicted

    def requeue(
        self,
        item: T,
        priority: str,
        since: float,
        tenant: str = "",
        cost: float = 1.0,
        weight: float = 1.0,
    ) -> list[T]:
        """`item` gives its slot back unserved (every instance it could go to refused it)
        and waits again, in order of `since`: when it first asked for a slot, so its
        `max_wait_s` counts from then and it goes ahead of those who asked then or later.
        It is no newcomer, so `max_queue` does not shed it (the queue may run over by as
        many as held slots). Its tenant gets `cost` / `weight` back (what its dispatch
        charged; not below the band's lift level). Returns waiters admitted now (it too,
        if a slot is free)."""
        self.in_use -= 1
        self._order += 1
        self._bands[_RANK[priority]].insert(
            _Waiter(item, since, tenant, cost, cost / weight, self._order)
        )
        self._queued += 1
        return self._fill()

    def charge(
        self, tenant: str, extra_cost: float, priority: str = "normal", weight: float = 1.0
    ) -> None:
        """Correct `tenant`'s counter in `priority`'s band once a request's real cost is
        known: `extra_cost` is real minus estimated cost (`request_cost` units; negative
        when the estimate was high), over `weight`. A counter never drops below the band's
        lift level. `tenant_service` keeps counting the estimates (it never goes down)."""
        self._bands[_RANK[priority]].charge(tenant, extra_cost / weight)

    def release(self) -> list[T]:
        """A request finished and gives its slot back; returns waiters admitted now."""
        self.in_use -= 1
        return self._fill() if self._queued else []

    def set_slots(self, slots: int) -> list[T]:
        """Capacity changed (instances came or went); returns waiters admitted now. A drop
        below `in_use` takes effect as requests finish."""
        self.slots = slots
        return self._fill()

    def expire(self, now: float) -> list[T]:
        """Waiters that have waited `max_wait_s` or longer, removed from the queue."""
        out: list[T] = []
        limit = now - self.max_wait_s
        for band in self._bands:
            while band.waiting:
                w = band.pop_oldest(limit)
                if w is None:
                    break
                out.append(w.item)
        self._queued -= len(out)
        self._expired += len(out)
        return out

    def cancel(self, item: T) -> bool:
        """A waiter gave up (client went away). False if it was not waiting."""
        for band in self._bands:
            if band.waiting and band.remove(item):
                self._queued -= 1
                return True
        return False

    def oldest_wait(self, now: float) -> float:
        """Seconds the longest waiter has waited (0 if none)."""
        starts = [s for b in self._bands if b.waiting and (s := b.oldest_since()) is not None]
        return now - min(starts) if starts else 0.0

    def tenant_service(self) -> dict[str, float]:
        """Cost (`request_cost` units, before weights) dispatched from the queue so far, by
        tenant; past `SERVICE_TENANTS_MAX` tenants, the rest under `OTHER_TENANTS`."""
        return dict(self._service)

    def fairness_gap(self) -> float:
        """The most any band's backlogged tenants' counters differ now (greatest minus
        least, cost / weight units); 0 where fewer than two tenants wait in every band."""
        return max(band.gap() for band in self._bands)

    def statistics(self) -> AdmissionStats:
        return AdmissionStats(
            slots=self.slots,
            in_use=self.in_use,
            queued={p: b.waiting for p, b in zip(PRIORITIES, self._bands, strict=True)},
            admitted_total=self._admitted,
            queued_total=self._queued_total,
            shed_total=self._shed,
            expired_total=self._expired,
            tenants=sum(len(b.tenants) for b in self._bands),
        )

    def _fill(self) -> list[T]:
        out: list[T] = []
        service = self._service
        while self._queued and self.in_use < self.slots:
            for band in self._bands:  # highest priority first, least counter within
                if band.waiting:
                    w = band.pop_next()
                    break
            out.append(w.item)
            name = w.tenant
            if name not in service and len(service) >= SERVICE_TENANTS_MAX:
                name = OTHER_TENANTS
            service[name] = service.get(name, 0.0) + w.cost
            self._queued -= 1
            self.in_use += 1
            self._admitted += 1
        return out

    def _lowest_waiting_rank(self) -> int | None:
        for rank in range(len(PRIORITIES) - 1, -1, -1):
            if self._bands[rank].waiting:
                return rank
        return None
