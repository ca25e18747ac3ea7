"""GroupAdmission (R6): slots, a bounded priority queue, shedding lowest priority first.

A hypothesis state machine drives random offers, releases, slot changes, cancels and clock
steps against a model of every ticket's life, checking the invariants after each step.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from sluice.policy.admission import GroupAdmission, Offer
from sluice.policy.routing import PRIORITIES

RANK = {p: i for i, p in enumerate(PRIORITIES)}
ENDINGS = {"released", "shed", "evicted", "expired", "cancelled"}


class Ticket:
    """One request; `seq` orders arrivals."""

    def __init__(self, seq: int, priority: str, at: float) -> None:
        self.seq = seq
        self.priority = priority
        self.at = at
        self.state = "new"
        self.history: list[str] = []

    def move(self, state: str, allowed_from: set[str]) -> None:
        assert self.state in allowed_from, f"ticket {self.seq}: {self.state} -> {state}"
        self.state = state
        self.history.append(state)

    def __repr__(self) -> str:
        return f"T{self.seq}({self.priority},{self.state})"


class AdmissionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.tickets: list[Ticket] = []
        self.adm: GroupAdmission[Ticket] = GroupAdmission(1, 1.0)

    @initialize(
        slots=st.integers(0, 4), max_queue=st.integers(0, 5), max_wait=st.sampled_from([0.5, 2.0])
    )
    def setup(self, slots: int, max_queue: int, max_wait: float) -> None:
        self.adm = GroupAdmission(max_queue, max_wait, slots)

    # -- helpers --------------------------------------------------------------------------------

    def in_state(self, state: str) -> list[Ticket]:
        return [t for t in self.tickets if t.state == state]

    def admit_woken(self, woken: list[Ticket]) -> None:
        """Woken waiters come out highest priority first, FIFO within a priority."""
        for t in woken:
            waiting = self.in_state("queued")
            best = min(waiting, key=lambda w: (RANK[w.priority], w.seq))
            assert t is best, f"woke {t}, but {best} should go first"
            t.move("admitted", {"queued"})
        if woken:  # admitting never overfills (a shrink below in_use waits for releases)
            assert self.adm.in_use <= self.adm.slots

    # -- rules ----------------------------------------------------------------------------------

    @rule(priority=st.sampled_from(PRIORITIES))
    def offer(self, priority: str) -> None:
        t = Ticket(len(self.tickets), priority, self.now)
        self.tickets.append(t)
        queued_before = self.in_state("queued")
        full = len(queued_before) >= self.adm.max_queue
        had_room = self.adm.in_use < self.adm.slots and not queued_before
        outcome, evicted = self.adm.offer_nowait(t, priority, self.now)
        if had_room:
            assert (outcome, evicted) == (Offer.ADMITTED, None)
            t.move("admitted", {"new"})
            return
        assert outcome is not Offer.ADMITTED
        lowest = max((RANK[w.priority] for w in queued_before), default=-1)
        if full and lowest > RANK[priority]:  # someone below it waits: the newest of those goes
            victims = [w for w in queued_before if RANK[w.priority] == lowest]
            assert evicted is max(victims, key=lambda w: w.seq)
            evicted.move("evicted", {"queued"})
        else:
            assert evicted is None
        if full and evicted is None:
            assert outcome is Offer.SHED
            t.move("shed", {"new"})
        else:
            assert outcome is Offer.QUEUED
            t.move("queued", {"new"})

    @precondition(lambda self: any(t.state == "admitted" for t in self.tickets))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.in_state("admitted")))
        t.move("released", {"admitted"})
        self.admit_woken(self.adm.release())

    @rule(slots=st.integers(0, 6))
    def set_slots(self, slots: int) -> None:
        self.admit_woken(self.adm.set_slots(slots))

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 3.0]))  # exact in binary: no rounding surprises
    def tick(self, dt: float) -> None:
        self.now += dt
        expired = self.adm.expire(self.now)
        for t in expired:
            assert self.now - t.at >= self.adm.max_wait_s
            t.move("expired", {"queued"})
        for t in self.in_state("queued"):
            assert self.now - t.at < self.adm.max_wait_s

    @precondition(lambda self: bool(self.tickets))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.tickets))
        was_queued = t.state == "queued"
        assert self.adm.cancel(t) is was_queued
        if was_queued:
            t.move("cancelled", {"queued"})

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def counts_match(self) -> None:
        stats = self.adm.statistics()
        assert stats.in_use == len(self.in_state("admitted"))
        queued = self.in_state("queued")
        assert self.adm.queue_length == stats.queue_length == len(queued)
        for p in PRIORITIES:
            assert stats.queued[p] == sum(1 for t in queued if t.priority == p)
        assert len(queued) <= self.adm.max_queue

    @invariant()
    def no_idle_slot_while_someone_waits(self) -> None:
        if self.in_state("queued"):
            assert self.adm.in_use >= self.adm.slots

    @invariant()
    def one_state_each(self) -> None:
        for t in self.tickets:  # `move` checked every transition; an ending is final
            assert sum(1 for h in t.history if h in ENDINGS) <= 1

    def teardown(self) -> None:
        """Drain: every ticket ever offered ends exactly once."""
        for t in self.in_state("admitted"):
            t.move("released", {"admitted"})
            for w in self.adm.release():
                w.move("admitted", {"queued"})
        for t in self.adm.expire(float("inf")):
            t.move("expired", {"queued"})
        while self.in_state("admitted"):
            for t in self.in_state("admitted"):
                t.move("released", {"admitted"})
                self.adm.release()
        for t in self.tickets:
            assert t.state in ENDINGS, t
            assert sum(1 for h in t.history if h in ENDINGS) == 1
        assert self.adm.in_use == 0 and self.adm.queue_length == 0


TestAdmissionMachine = AdmissionMachine.TestCase
TestAdmissionMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


# -- examples -------------------------------------------------------------------------------------


def test_admits_up_to_slots_then_queues_then_sheds() -> None:
    adm: GroupAdmission[str] = GroupAdmission(max_queue=1, max_wait_s=5.0, slots=2)
    assert adm.try_acquire() and adm.try_acquire()
    assert not adm.try_acquire()  # full: nothing changes
    assert adm.in_use == 2
    assert adm.offer_nowait("a", "normal", 0.0) == (Offer.QUEUED, None)
    assert not adm.try_acquire()  # someone waits: a free slot goes to the queue first
    assert adm.offer_nowait("b", "normal", 0.0) == (Offer.SHED, None)
    assert adm.offer_nowait("c", "high", 0.0) == (Offer.QUEUED, "a")  # evicts the lower one
    assert adm.release() == ["c"]
    assert adm.statistics().shed_total == 2


def test_expire_takes_only_waiters_past_max_wait() -> None:
    adm: GroupAdmission[str] = GroupAdmission(max_queue=10, max_wait_s=1.0, slots=0)
    adm.offer_nowait("old", "low", 0.0)
    adm.offer_nowait("new", "high", 0.6)
    assert adm.expire(0.99) == []
    assert adm.oldest_wait(0.99) == pytest.approx(0.99)
    assert adm.expire(1.0) == ["old"]
    assert adm.expire(1.6) == ["new"]
    assert adm.queue_length == 0 and adm.statistics().expired_total == 2


def test_cancel_removes_only_a_waiter() -> None:
    adm: GroupAdmission[str] = GroupAdmission(max_queue=10, max_wait_s=1.0, slots=1)
    adm.offer_nowait("running", "normal", 0.0)
    adm.offer_nowait("waiting", "normal", 0.0)
    assert adm.cancel("running") is False  # admitted, not waiting: release() is its way out
    assert adm.cancel("waiting") is True
    assert adm.cancel("waiting") is False
    assert adm.release() == [] and adm.in_use == 0


def test_set_slots_admits_waiters_in_priority_order_and_shrinks_lazily() -> None:
    adm: GroupAdmission[str] = GroupAdmission(max_queue=10, max_wait_s=9.0, slots=1)
    adm.offer_nowait("busy", "normal", 0.0)
    for name, prio in [("l", "low"), ("n", "normal"), ("h1", "high"), ("h2", "high")]:
        adm.offer_nowait(name, prio, 0.0)
    assert adm.set_slots(4) == ["h1", "h2", "n"]
    assert adm.set_slots(1) == [] and adm.in_use == 4  # drops as requests finish
    assert adm.release() == [] and adm.release() == [] and adm.release() == []
    assert adm.release() == ["l"]


def test_requeue_puts_a_request_back_in_arrival_order_and_keeps_its_wait() -> None:
    adm: GroupAdmission[str] = GroupAdmission(max_queue=2, max_wait_s=1.0, slots=2)
    assert adm.offer_nowait("first", "normal", 0.0) == (Offer.ADMITTED, None)
    assert adm.offer_nowait("second", "normal", 0.1) == (Offer.ADMITTED, None)
    assert adm.set_slots(0) == []  # its instances all refused connections
    adm.offer_nowait("late", "normal", 0.5)
    adm.offer_nowait("later", "normal", 0.6)
    assert adm.requeue("second", "normal", 0.1) == []
    assert adm.requeue("first", "normal", 0.0) == []
    # over max_queue (2): the requeued were admitted once, they are not shed
    assert adm.queue_length == 4 and adm.in_use == 0
    assert adm.expire(1.05) == ["first"]  # its wait counts from its first ask, at 0.0
    assert adm.set_slots(3) == ["second", "late", "later"]


def test_requeue_into_a_group_with_a_free_slot_admits_at_once() -> None:
    adm: GroupAdmission[str] = GroupAdmission(max_queue=10, max_wait_s=1.0, slots=1)
    adm.offer_nowait("a", "high", 0.0)
    assert adm.requeue("a", "high", 0.0) == ["a"] and adm.in_use == 1
