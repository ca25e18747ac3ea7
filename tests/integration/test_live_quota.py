"""The controller's quota round against a real store (SQLite, then PostgreSQL): the ledger
follows the allocator's loans, a reclaim marks its loan and closes it with a latency once
the units are back, and an unchanged refusal is emitted once, not every tick."""

from __future__ import annotations

import asyncio

from sluice.control.events import EventLog
from sluice.control.quota import LiveQuota
from sluice.core import InstanceState, InstanceStatus, ManualClock
from sluice.policy.quota import Allocation
from sluice.policy.tick import TickDecision, TickInput, decide
from sluice.spec import PlatformSpec, load_spec_text
from tests.databases import Database

SPEC = """
pools:
  - {name: gpu, count: 4, memory_gb: 16, price_per_hour: 3.0}
groups:
  - name: a
    owner: o
    business: core
    alert_channel: c
    models: {m-a: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    replicas: 0
    quota: {guaranteed: 2, lendable: 2, reclaim_grace_s: 2}
  - name: b
    owner: o
    business: batch
    alert_channel: c
    models: {m-b: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    drain_timeout_s: 10
    quota: {guaranteed: 2, borrow_limit: 2, limit: 4}
"""


def ready(group: str, n: int, t0: float = 0.0) -> list[InstanceStatus]:
    return [
        InstanceStatus(f"{group}-{k}", group, "t", InstanceState.READY, created_at=t0 + k)
        for k in range(n)
    ]


async def round_(
    quota: LiveQuota,
    spec: PlatformSpec,
    observed: list[InstanceStatus],
    counts: dict[str, int],
    now: float,
) -> tuple[Allocation, TickDecision]:
    """One tick's decision for these counts, kept by `quota` as the controller keeps it."""
    state, advice = quota.memory
    meter = quota.meter(now)
    tick = decide(TickInput(spec, observed, counts, now, quota=state, advice=advice, meter=meter))
    kept = meter.holding(tick.allocation.enforced)
    return await quota.record(spec, tick, kept, now), tick


def test_loan_reclaim_and_return_are_in_the_ledger(database: Database) -> None:
    spec = load_spec_text(SPEC).spec
    clock = ManualClock(1_800_000_000.0)
    with database.open() as store:
        quota = LiveQuota(store, EventLog(store, clock))

        async def scenario() -> None:
            now = clock.now()
            _, tick = await round_(quota, spec, ready("b", 2), {"a": 0, "b": 2}, now - 1)
            assert tick.spare["gpu"] == 2  # a's idle guarantee is still unassigned
            r, tick = await round_(quota, spec, ready("b", 2), {"a": 0, "b": 4}, now)
            assert r.grants["b"].instances == 4  # 2 own + 2 of a's idle units
            assert tick.spare["gpu"] == 0  # granted in full: no room to surge a roll
            b4 = ready("b", 4)
            await round_(quota, spec, b4, {"a": 0, "b": 5}, now + 1)  # over its limit
            await round_(quota, spec, b4, {"a": 0, "b": 5}, now + 2)
            loans = store.list_loans(open_only=True)
            assert [(x.lender, x.borrower, x.units) for x in loans] == [("a", "b", 2)]
            refusals = [e for e in store.list_events(group="b") if e.kind == "quota"]
            assert len(refusals) == 1, refusals  # said once, not every tick

            r, _ = await round_(quota, spec, b4, {"a": 2, "b": 4}, now + 3)  # a wants its units
            assert r.reclaims == ()  # not before the grace period
            r, _ = await round_(quota, spec, b4, {"a": 2, "b": 4}, now + 6)
            (reclaim,) = r.reclaims
            assert reclaim.borrower == "b" and set(reclaim.instance_ids) == {"b-2", "b-3"}
            assert r.grants["a"].instances == 0  # only once the units are back
            assert store.list_loans(open_only=True)[0].reclaim_requested_at == now + 6
            draining = [
                InstanceStatus(i.id, "b", "t", InstanceState.DRAINING, i.created_at) for i in b4[2:]
            ]
            await round_(quota, spec, b4[:2] + draining, {"a": 2, "b": 4}, now + 8)
            r, _ = await round_(quota, spec, b4[:2], {"a": 2, "b": 4}, now + 9.5)  # drained
            assert r.grants["a"].instances == 2
            (loan,) = store.list_loans()
            assert loan.ended_at == now + 9.5 and loan.reclaim_latency_s == 3.5
            report = quota.report(spec, store.list_loans(), now + 10, 3600, 0.5)
            assert report["loans"][0]["reclaim_latency_s"] == 3.5

        asyncio.run(scenario())
