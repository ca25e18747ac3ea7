"""Fair shares between tenants inside a group's admission queue (issue 35): the Virtual Token
Counter (Sheng et al., OSDI'24) in `GroupAdmission`, through its public methods only.

The group is driven as a saturated one: every slot is busy, requests wait, and each
`release()` (one request finished) hands the freed slot to the next waiter; the order in
which waiters come out is what the tests read. U below is the most one dispatch adds to a
counter: the largest cost / weight offered.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from sluice.gateway.metrics import GatewayMetrics
from sluice.policy.admission import (
    OTHER_TENANTS,
    SERVICE_TENANTS_MAX,
    TENANTS_MAX,
    GroupAdmission,
    Offer,
    request_cost,
)
from sluice.policy.routing import PRIORITIES, Endpoint, RouteTable, RoutingSnapshot
from sluice.policy.snapshot import tenant_access
from sluice.policy.snapshot_wire import snapshot_from_json, snapshot_to_json
from sluice.spec.models import TenantSpec

RANK = {p: i for i, p in enumerate(PRIORITIES)}
_seq = itertools.count()


@dataclass(eq=False)
class Req:
    """One request: whose, what it costs, its priority; compared by identity."""

    tenant: str
    cost: float = 1.0
    priority: str = "normal"
    weight: float = 1.0
    seq: int = field(default_factory=lambda: next(_seq))


def busy(slots: int = 1, max_queue: int = 100_000) -> GroupAdmission[Req]:
    """A group whose `slots` are all taken: whatever is offered now waits."""
    adm: GroupAdmission[Req] = GroupAdmission(max_queue, max_wait_s=1e9, slots=slots)
    for _ in range(slots):
        assert adm.try_acquire()
    return adm


def offer(adm: GroupAdmission[Req], req: Req, now: float = 0.0) -> None:
    outcome, evicted = adm.offer_nowait(req, req.priority, now, req.tenant, req.cost, req.weight)
    assert (outcome, evicted) == (Offer.QUEUED, None)


def dispatch(adm: GroupAdmission[Req], n: int) -> list[Req]:
    """The next `n` waiters to get a slot, one finished request at a time."""
    out: list[Req] = []
    for _ in range(n):
        woken = adm.release()
        assert len(woken) <= 1
        out += woken
        if not woken:  # nobody waited: the slot stays free; take it back to stay saturated
            assert adm.try_acquire()
    return out


def service(reqs: list[Req], tenant: str) -> float:
    return sum(r.cost for r in reqs if r.tenant == tenant)


# -- the cost estimate ------------------------------------------------------------------------


def test_request_cost_is_prompt_bytes_over_four_plus_twice_the_completion() -> None:
    assert request_cost(2000, {"max_tokens": 100}) == 500 + 200  # the docstring's example
    assert request_cost(400) == 100 + 2 * 256  # no max_tokens: 256 expected
    assert request_cost(400, {"max_completion_tokens": 10, "max_tokens": 99}) == 100 + 20
    assert request_cost(0, {"max_tokens": 10**9}) == 2 * 4096  # capped
    for odd in (True, -5, 0, 1.5, "100", None):  # not a positive int: the default
        assert request_cost(0, {"max_tokens": odd}) == 2 * 256
    assert request_cost(0, ["max_tokens", 1]) == 2 * 256


# -- one tenant is FIFO; several share by counter ---------------------------------------------


def test_callers_that_name_no_tenant_are_served_in_arrival_order() -> None:
    adm: GroupAdmission[str] = GroupAdmission(max_queue=10, max_wait_s=9.0, slots=1)
    assert adm.try_acquire()
    for name, cost in [("a", 50.0), ("b", 1.0), ("c", 7.0)]:
        adm.offer_nowait(name, "normal", 0.0, cost=cost)
    assert [adm.release(), adm.release(), adm.release()] == [["a"], ["b"], ["c"]]


def test_the_tenant_with_least_service_goes_first_and_fifo_within_a_tenant() -> None:
    adm = busy()
    heavy = [Req("heavy", cost=10.0) for _ in range(6)]
    light = [Req("light", cost=1.0) for _ in range(6)]
    for r in heavy + light:  # the heavy tenant asked first, all of it
        offer(adm, r)
    order = dispatch(adm, 12)
    # at equal counters (0) the smaller request first (light's), then least counter first
    assert order == [light[0], heavy[0], *light[1:], *heavy[1:]]
    assert [r for r in order if r.tenant == "heavy"] == heavy  # FIFO within a tenant


@settings(max_examples=150, deadline=None)
@given(
    costs_a=st.lists(st.integers(1, 100), min_size=1, max_size=60),
    costs_b=st.lists(st.integers(1, 100), min_size=1, max_size=60),
    weights=st.tuples(st.sampled_from([0.5, 1.0, 2.0, 3.0]), st.sampled_from([0.5, 1.0, 4.0])),
    slots=st.integers(1, 4),
)
def test_vtc_bound_while_two_tenants_stay_backlogged(
    costs_a: list[int], costs_b: list[int], weights: tuple[float, float], slots: int
) -> None:
    """VTC's bound: while both wait, their counters (service / weight) stay within U of each
    other, so over any interval in which both stay backlogged, service / weight differs by
    at most 2 U (U = the largest cost / weight offered)."""
    wa, wb = weights
    adm = busy(slots)
    reqs = [Req("a", c, weight=wa) for c in costs_a] + [Req("b", c, weight=wb) for c in costs_b]
    random.Random(len(costs_a) * 101 + len(costs_b)).shuffle(reqs)
    for r in reqs:
        offer(adm, r)
    u = max(r.cost / r.weight for r in reqs)
    left = {"a": len(costs_a), "b": len(costs_b)}
    norm = {"a": 0.0, "b": 0.0}
    history = [(0.0, 0.0)]  # (a, b) normalized service after each dispatch with both waiting
    while left["a"] and left["b"]:
        (r,) = dispatch(adm, 1)
        left[r.tenant] -= 1
        norm[r.tenant] += r.cost / r.weight
        assert abs(norm["a"] - norm["b"]) <= u + 1e-9
        history.append((norm["a"], norm["b"]))
        if left["a"] and left["b"]:
            assert adm.fairness_gap() <= u + 1e-9
    for (a1, b1), (a2, b2) in itertools.combinations(history, 2):
        assert abs((a2 - a1) - (b2 - b1)) <= 2 * u + 1e-9


@pytest.mark.parametrize("costs", [(10.0, 10.0), (3.0, 17.0), (40.0, 1.0)])
def test_weights_two_to_one_give_service_within_ten_percent_of_two_to_one(
    costs: tuple[float, float],
) -> None:
    adm = busy(slots=4)
    for _ in range(2000):
        offer(adm, Req("gold", costs[0], weight=2.0))
        offer(adm, Req("bronze", costs[1], weight=1.0))
    served = dispatch(adm, 1000)  # both stay backlogged throughout
    ratio = service(served, "gold") / service(served, "bronze")
    assert abs(ratio / 2.0 - 1.0) <= 0.10


def test_a_returning_tenant_gets_no_burst_of_credit() -> None:
    adm = busy()
    for _ in range(100):
        offer(adm, Req("steady"))
    for _ in range(5):
        offer(adm, Req("bursty"))
    first = dispatch(adm, 30)  # bursty is served its 5, then idles while steady goes on
    assert sum(r.tenant == "bursty" for r in first) == 5
    for _ in range(50):  # it comes back with a burst, and a brand-new tenant too
        offer(adm, Req("bursty"))
        offer(adm, Req("newcomer"))
    after = dispatch(adm, 30)
    counts = {t: sum(r.tenant == t for r in after) for t in ("steady", "bursty", "newcomer")}
    # lifted to the steady tenant's counter: a third each (give or take one), not all 30
    assert all(9 <= n <= 11 for n in counts.values()), counts


def test_a_tenant_that_was_alone_leaves_no_credit_to_whoever_comes_next() -> None:
    adm = busy()
    for _ in range(20):
        offer(adm, Req("first"))
    dispatch(adm, 20)  # the band is empty again; "first" was last to leave
    for _ in range(10):
        offer(adm, Req("first"))
        offer(adm, Req("second"))
    order = dispatch(adm, 20)
    assert [r.tenant for r in order[:6]] == ["first", "second"] * 3  # level: they alternate


def test_priority_bands_come_before_counters() -> None:
    adm = busy()
    big = [Req("vip", cost=1000.0, priority="high") for _ in range(3)]
    small = [Req("small", cost=1.0, priority="normal") for _ in range(3)]
    low = [Req("small", cost=1.0, priority="low")]
    for r in small + low + big:
        offer(adm, r)
    assert dispatch(adm, 7) == [*big, *small, *low]


def test_work_conserving_an_idle_tenants_share_goes_to_the_other() -> None:
    adm = busy(slots=2)
    for _ in range(10):
        offer(adm, Req("busy", weight=1.0))
    # "quiet" has a weight of 9 but asks for nothing: "busy" gets every slot, none idles
    assert [r.tenant for r in dispatch(adm, 10)] == ["busy"] * 10
    assert adm.in_use == 2 and adm.queue_length == 0
    for _ in range(4):
        offer(adm, Req("quiet", weight=9.0))
        offer(adm, Req("busy", weight=1.0))
    # both wait now: the weight of 9 gets its four in the first five slots
    got = dispatch(adm, 8)
    assert [r.tenant for r in got[:5]].count("quiet") == 4 and adm.queue_length == 0


# -- corrections, requeue, eviction, metrics ---------------------------------------------------


def test_charge_corrects_a_tenants_counter_once_the_real_cost_is_known() -> None:
    adm = busy()
    for _ in range(10):
        offer(adm, Req("a", cost=10.0))
        offer(adm, Req("b", cost=10.0))
    assert [r.tenant for r in dispatch(adm, 2)] == ["a", "b"]
    adm.charge("a", 35.0)  # its first answer was 45, not 10: it waits for b to catch up
    assert [r.tenant for r in dispatch(adm, 5)] == ["b", "b", "b", "b", "a"]
    assert adm.fairness_gap() == pytest.approx(5.0)
    adm.charge("a", -1e6)  # a refund is no credit below the least counter waiting
    assert [r.tenant for r in dispatch(adm, 2)] == ["a", "b"]
    adm.charge("nobody", -5.0)  # unknown, nothing to refund: nothing happens
    assert adm.statistics().tenants == 2


def test_charge_is_per_priority_band_and_over_weight() -> None:
    adm = busy()
    for _ in range(4):
        offer(adm, Req("a", priority="low", weight=4.0))
        offer(adm, Req("b", priority="low"))
    adm.charge("a", 10.0, "low", weight=4.0)  # 2.5 units in the low band, none in normal
    assert [r.tenant for r in dispatch(adm, 4)] == ["b", "b", "b", "a"]


def test_requeue_refunds_the_charge_and_keeps_fifo_within_the_tenant() -> None:
    adm = busy(slots=1)
    a = [Req("a", cost=5.0) for _ in range(3)]
    b = [Req("b", cost=5.0) for _ in range(3)]
    for r in a + b:
        offer(adm, r, now=float(r.seq))
    assert dispatch(adm, 1) == [a[0]]
    assert adm.set_slots(0) == []  # its instances all refused it; the group has none left
    assert adm.requeue(a[0], "normal", float(a[0].seq), "a", 5.0) == []
    # a's counter is back at b's: a[0] goes first again, ahead of a[1], then they alternate
    assert adm.set_slots(6) == [a[0], b[0], a[1], b[1], a[2], b[2]]
    assert adm.queue_length == 0 and adm.statistics().tenants == 0  # both at the level


def test_eviction_takes_the_newest_of_the_lowest_priority_whatever_its_tenant() -> None:
    adm = busy(max_queue=3)
    old_low, new_low = Req("x", priority="low"), Req("y", priority="low")
    offer(adm, old_low)
    offer(adm, Req("x", priority="normal"))
    offer(adm, new_low)
    high = Req("z", priority="high")
    assert adm.offer_nowait(high, "high", 0.0, "z") == (Offer.QUEUED, new_low)
    assert adm.offer_nowait(Req("y"), "low", 0.0, "y") == (Offer.SHED, None)
    assert dispatch(adm, 3)[0] is high


def test_expire_and_cancel_leave_counters_consistent() -> None:
    adm = busy()
    adm.max_wait_s = 1.0
    reqs = [Req(t) for t in "abcabc"]
    for i, r in enumerate(reqs):
        offer(adm, r, now=0.1 * i)
    assert adm.cancel(reqs[1]) and not adm.cancel(reqs[1])
    assert adm.expire(1.25) == reqs[:3:2]  # a@0.0 and c@0.2; b@0.1 was cancelled
    assert adm.oldest_wait(1.25) == pytest.approx(0.95)
    assert dispatch(adm, 3) == reqs[3:]
    assert adm.queue_length == 0 and adm.fairness_gap() == 0.0


def test_tenant_service_counts_dispatched_cost_and_is_capped() -> None:
    adm = busy()
    for i in range(SERVICE_TENANTS_MAX + 50):
        offer(adm, Req(f"t{i}", cost=2.0))
    dispatch(adm, SERVICE_TENANTS_MAX + 50)
    got = adm.tenant_service()
    assert len(got) == SERVICE_TENANTS_MAX + 1
    assert got[OTHER_TENANTS] == 100.0 and got["t0"] == 2.0
    assert sum(got.values()) == 2.0 * (SERVICE_TENANTS_MAX + 50)


@dataclass
class View:
    """What a scrape reads of a group (`metrics.RuntimeView`): here, only its admission."""

    admission: GroupAdmission[Any]
    endpoints: tuple[Endpoint, ...] = ()

    def ejected_now(self, now: float) -> Mapping[str, object]:
        return {}


def test_metrics_export_tenant_service_and_fairness_gap() -> None:
    adm = busy()
    adm.offer_nowait(Req("a"), "normal", 0.0, "a", 30.0)
    adm.offer_nowait(Req("a"), "normal", 0.0, "a", 30.0)
    adm.offer_nowait(Req("b"), "normal", 0.0, "b", 80.0, 2.0)
    adm.release()  # at equal counters the smaller (30 against 80 / 2): a at 30, b at 0
    metrics = GatewayMetrics(lambda: {"g1": View(adm)}, lambda: 1)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    service = {
        s.labels["tenant"]: s.value for s in families["sluice_gateway_tenant_service"].samples
    }
    assert service == {"a": 30.0}
    (gap,) = families["sluice_gateway_fairness_gap"].samples
    assert gap.labels == {"group": "g1"} and gap.value == 30.0


# -- the spec's weight, on its way to the gateway -----------------------------------------------


def test_a_tenants_weight_goes_from_the_spec_to_the_gateways_snapshot() -> None:
    spec = TenantSpec(name="gold", api_keys=["sk-gold-0123456789abcdef"], weight=2.5)
    access = tenant_access(spec)
    assert access.weight == 2.5 and tenant_access(TenantSpec(name="plain")).weight == 1.0
    snap = RoutingSnapshot(
        version=1,
        routes=RouteTable(()),
        tenants_by_key={"digest": access},
        endpoints={},
        group_models={},
    )
    back = snapshot_from_json(json.loads(json.dumps(snapshot_to_json(snap))))
    assert back.tenants_by_key["digest"].weight == 2.5  # a remote gateway gets it too
    for bad in (0, -1.0, 1001):
        with pytest.raises(ValidationError, match="weight"):
            TenantSpec(name="t", weight=bad)


# -- bounded memory ---------------------------------------------------------------------------


def test_memory_stays_bounded_with_100000_distinct_tenants() -> None:
    """Counters of tenants with nothing queued are forgotten once at the lift level: each
    of 100,000 tenants sends one request, alone in the band for the first half (each the
    last to leave), beside a tenant that stays backlogged for the second."""
    adm = busy(slots=2)
    for i in range(100_000):
        if i == 50_000:
            for _ in range(50):
                offer(adm, Req("regular", cost=3.0))
        offer(adm, Req(f"tenant-{i}", cost=float(1 + i % 7)))
        if i >= 50_000 and i % 2:
            offer(adm, Req("regular", cost=3.0))
        dispatch(adm, 1 + (i >= 50_000 and i % 2 == 1))
        assert adm.statistics().tenants <= 64
    assert adm.queue_length == 50 and len(adm.tenant_service()) == SERVICE_TENANTS_MAX + 1


def test_idle_counters_are_capped_when_tenants_leave_with_debt() -> None:
    """Tenants served once at a cost far above the floor stay held (their debt counts if they
    come back) until the floor passes them; past `TENANTS_MAX` the lowest are forgotten."""
    adm = busy()
    for _ in range(30_000):
        offer(adm, Req("cheap", cost=1.0))
    for i in range(TENANTS_MAX + 3000):
        offer(adm, Req(f"t{i}", cost=1e9))
        dispatch(adm, 2)  # "cheap" (older at equal counters), then the newcomer
        assert adm.statistics().tenants <= TENANTS_MAX + 2
    assert adm.statistics().tenants >= TENANTS_MAX  # held, but no more


# -- a state machine over tenants, bands, expiry and cancels ----------------------------------


class FairAdmissionMachine(RuleBasedStateMachine):
    """Random offers from a few tenants (each with a fixed weight), releases, slot changes,
    clock steps, cancels and charges; a model of every ticket's life checks what the
    admission hands out."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.tickets: list[Req] = []
        self.state: dict[int, str] = {}
        self.at: dict[int, float] = {}
        self.adm: GroupAdmission[Req] = GroupAdmission(1, 1.0)
        self.weights = {"a": 1.0, "b": 2.0, "c": 0.5}
        self.u = 0.0
        self.charged = False
        self.dispatched_cost = 0.0

    @initialize(slots=st.integers(0, 3), max_queue=st.integers(0, 8))
    def setup(self, slots: int, max_queue: int) -> None:
        self.adm = GroupAdmission(max_queue, 2.0, slots)

    def queued(self) -> list[Req]:
        return [t for t in self.tickets if self.state[t.seq] == "queued"]

    def woke(self, woken: list[Req]) -> None:
        for t in woken:
            waiting = self.queued()
            assert t in waiting
            best_rank = min(RANK[w.priority] for w in waiting)
            assert RANK[t.priority] == best_rank  # highest band first
            same = [w for w in waiting if w.tenant == t.tenant and w.priority == t.priority]
            assert t is min(same, key=lambda w: w.seq)  # FIFO within a tenant
            self.state[t.seq] = "admitted"
            self.dispatched_cost += t.cost

    @rule(
        tenant=st.sampled_from(["a", "b", "c"]),
        priority=st.sampled_from(PRIORITIES),
        cost=st.sampled_from([0.0, 1.0, 5.0, 40.0]),
    )
    def offer(self, tenant: str, priority: str, cost: float) -> None:
        t = Req(tenant, cost, priority, self.weights[tenant])
        self.tickets.append(t)
        self.at[t.seq] = self.now
        self.u = max(self.u, cost / t.weight)
        outcome, evicted = self.adm.offer_nowait(t, priority, self.now, tenant, cost, t.weight)
        if evicted is not None:
            assert self.state[evicted.seq] == "queued"
            assert RANK[evicted.priority] > RANK[priority]
            self.state[evicted.seq] = "evicted"
        self.state[t.seq] = {
            Offer.ADMITTED: "admitted",
            Offer.QUEUED: "queued",
            Offer.SHED: "shed",
        }[outcome]

    @precondition(lambda self: any(s == "admitted" for s in self.state.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        running = [t for t in self.tickets if self.state[t.seq] == "admitted"]
        t = data.draw(st.sampled_from(running))
        self.state[t.seq] = "released"
        self.woke(self.adm.release())

    @rule(slots=st.integers(0, 4))
    def set_slots(self, slots: int) -> None:
        self.woke(self.adm.set_slots(slots))

    @rule(dt=st.sampled_from([0.5, 1.0, 3.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        for t in self.adm.expire(self.now):
            assert self.state[t.seq] == "queued" and self.now - self.at[t.seq] >= 2.0
            self.state[t.seq] = "expired"

    @precondition(lambda self: bool(self.tickets))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        t = data.draw(st.sampled_from(self.tickets))
        was = self.state[t.seq] == "queued"
        assert self.adm.cancel(t) is was
        if was:
            self.state[t.seq] = "cancelled"

    @rule(tenant=st.sampled_from(["a", "b", "zz"]), extra=st.sampled_from([-50.0, 3.0]))
    def charge(self, tenant: str, extra: float) -> None:
        self.adm.charge(tenant, extra, "normal", self.weights.get(tenant, 1.0))
        self.charged = self.charged or extra > 0

    @invariant()
    def counts_match(self) -> None:
        stats = self.adm.statistics()
        queued = self.queued()
        assert stats.queue_length == self.adm.queue_length == len(queued)
        for p in PRIORITIES:
            assert stats.queued[p] == sum(t.priority == p for t in queued)
        assert stats.in_use == sum(s == "admitted" for s in self.state.values())
        assert stats.tenants <= 3 * 4  # three tenants (and "zz") in three bands at most
        assert sum(self.adm.tenant_service().values()) == pytest.approx(self.dispatched_cost)

    @invariant()
    def work_conserving(self) -> None:
        if self.queued():
            assert self.adm.in_use >= self.adm.slots

    @invariant()
    def gap_within_one_request(self) -> None:
        """Without upward corrections, waiting tenants' counters stay within U."""
        gap = self.adm.fairness_gap()
        assert gap >= 0.0
        if not self.charged:
            assert gap <= self.u + 1e-9


TestFairAdmissionMachine = FairAdmissionMachine.TestCase
TestFairAdmissionMachine.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
