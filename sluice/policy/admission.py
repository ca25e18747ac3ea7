"""Admission per group (R6): slots first, then a bounded priority queue, shedding lowest first.

A sync core in the style of anyio's memory streams: `offer_nowait`, `release`, `expire`,
`cancel` and `statistics` never wait and never read a clock (time comes in as `now`); the
gateway's async shell parks queued requests on futures and wakes the ones returned here.

- slots = ready instances x max_concurrency, set by the gateway on every snapshot;
- a request takes a slot if one is free and nobody waits;
- else it waits in its priority's FIFO queue (high, normal, low; high is served first);
- when the queue is full, a newcomer evicts the *newest* waiter of the lowest priority below
  its own; with none below it, the newcomer itself is shed (429). So overload sheds `low`
  before `normal` before `high`;
- a waiter older than `max_wait_s` is expired (the gateway answers 503/429);
- a request whose instances all refused it goes back to the queue (`requeue`) in the place
  its arrival time gives it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from sluice.policy.routing import PRIORITIES

__all__ = ["AdmissionStats", "GroupAdmission", "Offer"]

T = TypeVar("T")
_RANK = {p: i for i, p in enumerate(PRIORITIES)}


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

    @property
    def queue_length(self) -> int:
        return sum(self.queued.values())


class GroupAdmission(Generic[T]):
    """Admission state of one group. `T` is whatever the caller uses as a ticket."""

    def __init__(self, max_queue: int, max_wait_s: float, slots: int = 0) -> None:
        self.max_queue = max_queue
        self.max_wait_s = max_wait_s
        self.slots = slots
        self.in_use = 0
        self._queues: tuple[deque[tuple[T, float]], ...] = tuple(deque() for _ in PRIORITIES)
        self._queued = 0
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

    def offer_nowait(self, item: T, priority: str, now: float) -> tuple[Offer, T | None]:
        """Admit, queue or shed `item` (`now`: seconds, the caller's monotonic clock). The
        second value is a waiter evicted to make room (the caller answers it 429), or None."""
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
            evicted = self._queues[victim_rank].pop()[0]  # newest of the lowest priority
            self._queued -= 1
            self._shed += 1
        self._queues[rank].append((item, now))
        self._queued += 1
        self._queued_total += 1
        return Offer.QUEUED, evicted

    def requeue(self, item: T, priority: str, since: float) -> list[T]:
        """`item` gives its slot back unserved (every instance it could go to refused it)
        and waits again, in order of `since`: when it first asked for a slot, so its
        `max_wait_s` counts from then and it goes ahead of those who asked then or later.
        It is no newcomer, so `max_queue` does not shed it (the queue may run over by as
        many as held slots). Returns waiters admitted now (it too, if a slot is free)."""
        self.in_use -= 1
        queue = self._queues[_RANK[priority]]
        at = len(queue)
        while at and queue[at - 1][1] >= since:  # the queue stays sorted by time, for expire
            at -= 1
        queue.insert(at, (item, since))
        self._queued += 1
        return self._fill()

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
        for q in self._queues:
            while q and q[0][1] <= limit:
                out.append(q.popleft()[0])
        self._queued -= len(out)
        self._expired += len(out)
        return out

    def cancel(self, item: T) -> bool:
        """A waiter gave up (client went away). False if it was not waiting."""
        for q in self._queues:
            for entry in q:
                if entry[0] is item:
                    q.remove(entry)
                    self._queued -= 1
                    return True
        return False

    def oldest_wait(self, now: float) -> float:
        """Seconds the longest waiter has waited (0 if none)."""
        starts = [q[0][1] for q in self._queues if q]
        return now - min(starts) if starts else 0.0

    def statistics(self) -> AdmissionStats:
        return AdmissionStats(
            slots=self.slots,
            in_use=self.in_use,
            queued={p: len(q) for p, q in zip(PRIORITIES, self._queues, strict=True)},
            admitted_total=self._admitted,
            queued_total=self._queued_total,
            shed_total=self._shed,
            expired_total=self._expired,
        )

    def _fill(self) -> list[T]:
        out: list[T] = []
        while self._queued and self.in_use < self.slots:
            for q in self._queues:  # highest priority first, FIFO within
                if q:
                    out.append(q.popleft()[0])
                    break
            self._queued -= 1
            self.in_use += 1
            self._admitted += 1
        return out

    def _lowest_waiting_rank(self) -> int | None:
        for rank in range(len(PRIORITIES) - 1, -1, -1):
            if self._queues[rank]:
                return rank
        return None
