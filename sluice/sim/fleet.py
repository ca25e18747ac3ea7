"""Fleet simulator: a whole spec (every group, shared pools, guarantees, borrowing, reclaims,
budgets) on one virtual clock, decided each tick by the live controller's own step
`sluice.policy.tick.decide`, so a what-if ("add this group", "shrink the pool to 40")
shows what the controller would do, per group: SLO, cost, loans and reclaims.

`sluice.sim.engine` stays the fast one-group engine (the policy studies); this one reuses
its request model: one event heap of `(t, kind, request)` tuples, arrivals from the merged,
sorted traces beside it, each group's gateway a `GroupAdmission` (the live code), instances
with independent slots, least-loaded pick over ready instances. Instances go starting ->
ready (after the model's start-up) -> draining (no new requests; stops when its last request
finishes, killed at `drain_timeout_s`, failing what is left) -> stopped.

Every `TICK_S` of virtual time the tick does what `Controller.tick` does: the fleet as
`InstanceStatus`es, each group's count in force, a `GroupLoad` per autoscaled group that is
due (its own `interval_s`, as `LiveAutoscaling.due`), the quota memory and the `Meter`
(advanced, then holding the round, as `LiveQuota.meter/record`), one `decide` call, and
its actions applied (Launch: a new starting instance; Drain: draining; Remove: stopped at
once). The loan ledger is kept with `ledger_changes`, as `LiveQuota._sync_ledger` does.
Not simulated: rollouts (no floors), crash-loop backoff, warm standby kept out of rotation
(standby instances serve here), crashes and slow starts (see the one-group engine).
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.core.instances import InstanceState, InstanceStatus
from sluice.policy.admission import GroupAdmission, Offer
from sluice.policy.autoscale import GroupLoad
from sluice.policy.plan import Drain, Launch
from sluice.policy.quota import Allocation, Loan, QuotaState
from sluice.policy.quota.metering import Meter
from sluice.policy.routing import PRIORITIES
from sluice.policy.tick import (
    BURST,
    STABLE,
    TICK_S,
    TickInput,
    decide,
    spec_count,
    standby,
)
from sluice.sim.codes import (
    ACTIVE,
    DEAD,
    DRAINING,
    FAILED,
    P95_WINDOW_TICKS,
    PENDING,
    REJECTED,
    STARTING,
    STOPPED,
    decision_entry,
)
from sluice.sim.engine import EPOCH, SimResult, Workload
from sluice.sim.fleet_inputs import scalers_for, with_pool_counts, workloads_for
from sluice.sim.fleet_report import (
    FLEET_COLUMNS,
    FleetGroup,
    FleetResult,
    Ledger,
    LedgerRow,
    ReclaimRecord,
)
from sluice.spec import GroupSpec, PlatformSpec

__all__ = [
    "FLEET_COLUMNS",
    "TICK_S",
    "FleetGroup",
    "FleetOptions",
    "FleetResult",
    "LedgerRow",
    "ReclaimRecord",
    "run_fleet",
]


_READY, _DRAIN_DEADLINE, _TICK = -3, -2, -1
_DECISION_LOG = 1000
_REASONS = 5
"""distinct refusal texts kept per group"""


@dataclass(frozen=True)
class FleetOptions:
    seed: int = 0
    """for the trace transforms of a study (`sluice.sim.study`); the run is deterministic"""
    epoch: float = EPOCH
    pool_counts: Mapping[str, int] = field(default_factory=dict)
    """pool -> count instead of the spec's ("what if the pool shrinks to 40")"""
    initial: Mapping[str, int] = field(default_factory=dict)
    """group -> instances ready at t = 0; default: its count in force (+ warm standby)"""
    end_s: float | None = None
    """stop at this virtual second; None: once every request has finished"""
    policies: Mapping[str, str] = field(default_factory=dict)
    """autoscaled group -> policy name instead of the spec's (`build_autoscaler`)"""


@dataclass(slots=True, eq=False)
class _Lane:
    """One group's simulated gateway and instances (mutable, private)."""

    gi: int
    g: GroupSpec
    work: Workload
    adm: GroupAdmission[int]
    buckets: list[set[int]]
    """instances with a free slot, by requests in flight (least-loaded pick)"""
    count: int
    """the count in force (`Controller.desired_replicas`; then what `decide` sets)"""
    c: int
    """slots per instance (max_concurrency)"""
    starting: list[int] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    """indexes of the group's requests in the merged arrivals"""
    lat_log: list[float] = field(default_factory=list)
    marks: deque[int] = field(default_factory=lambda: deque([0], maxlen=P95_WINDOW_TICKS + 1))
    decisions: list[dict[str, Any]] = field(default_factory=list)
    stops: list[dict[str, Any]] = field(default_factory=list)
    rows: list[tuple[float, ...]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    refused: str | None = None
    next_at: float = -math.inf
    served: float = 0.0
    served_sq: float = 0.0
    unit_s: float = 0.0
    borrowed_s: float = 0.0
    lent_s: float = 0.0
    alive: int = 0
    peak: int = 0
    draining: int = 0
    seq: int = 0
    shed: int = 0
    expired: int = 0
    scale_events: int = 0
    refusals: int = 0
    initial: int = 0
    units_now: int = 0

    @classmethod
    def of(cls, gi: int, g: GroupSpec, work: Workload) -> _Lane:
        count = spec_count(g)  # as `Controller.desired_replicas` starts
        adm: GroupAdmission[int] = GroupAdmission(g.queue.max_length, g.queue.max_wait_s)
        c = g.max_concurrency
        return cls(gi, g, work, adm, [set() for _ in range(c)], count, c)

    def load(self, at: float, arrivals: int) -> GroupLoad:
        """The group's `GroupLoad`, filled as the one-group engine fills it; `current` is
        the count in force (what the controller passes, `LiveAutoscaling.due`)."""
        self.marks.append(len(self.lat_log))
        window = self.lat_log[self.marks[0] :]
        p95 = None
        if window:
            window.sort()
            p95 = window[min(len(window) - 1, int(0.95 * len(window)))]
        auto = self.g.autoscaling
        lead = auto.lead_time_s if auto is not None else None
        return GroupLoad(
            at=at,
            current=self.count,
            ready=len(self.active),
            slots_per_instance=self.c,
            in_flight=self.adm.in_use,
            queued=self.adm.queue_length,
            arrivals=arrivals,
            completions=len(self.lat_log),
            served_s=self.served,
            served_sq_s=self.served_sq,
            latency_p95_s=p95,
            startup_s=self.work.model.startup_s if lead is None else lead,
            draining=self.draining,
        )


def _cat(parts: list[npt.NDArray[Any]], dtype: type[Any]) -> npt.NDArray[Any]:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def run_fleet(
    spec: PlatformSpec, workloads: Mapping[str, Workload], opts: FleetOptions | None = None
) -> FleetResult:
    """Replay every group's workload on one fleet until all requests have finished (or
    `opts.end_s`), deciding each tick with `decide` (module docstring)."""
    o = opts or FleetOptions()
    spec = with_pool_counts(spec, o.pool_counts)
    works = workloads_for(spec, workloads)
    lanes = [_Lane.of(gi, g, works[g.name]) for gi, g in enumerate(spec.groups)]
    by_name = {L.g.name: L for L in lanes}
    scalers = scalers_for(spec, o.policies)
    epoch = o.epoch

    # all arrivals merged in time order (stable: by group at equal times)
    t_all = _cat([L.work.trace.t for L in lanes], np.float64)
    order = np.argsort(t_all, kind="stable")
    grp_sorted = _cat([np.full(len(L.work.trace), L.gi) for L in lanes], np.int64)[order]
    arr: list[float] = t_all[order].tolist()
    grp: list[int] = grp_sorted.tolist()
    svc: list[float] = _cat([L.work.service for L in lanes], np.float64)[order].tolist()
    names = [PRIORITIES[p] for p in range(len(PRIORITIES))]
    prio = [names[p] for p in _cat([L.work.trace.priority for L in lanes], np.int8)[order].tolist()]
    for L in lanes:
        L.positions = np.nonzero(grp_sorted == L.gi)[0].tolist()
    n = len(arr)
    tries = [L.adm.try_acquire for L in lanes]
    offers = [L.adm.offer_nowait for L in lanes]
    shed_offer = Offer.SHED

    heap: list[tuple[float, int, int]] = []
    push, pop = heappush, heappop
    state: list[int] = []
    inflight: list[int] = []
    lane_of: list[_Lane] = []
    launched: list[float] = []
    stopped: list[float] = []
    status: list[InstanceStatus] = []
    sids: list[str] = []
    index: dict[str, int] = {}
    live: dict[int, None] = {}  # alive or draining, in launch order
    done: list[float] = [PENDING] * n
    awaiting: dict[int, ReclaimRecord] = {}  # instance -> the reclaim its stop releases

    def launch(L: _Lane, now: float, template: str, ready_now: bool = False) -> None:
        k = len(state)
        sid = f"{L.g.name}-{L.seq:06d}"
        L.seq += 1
        state.append(STARTING)
        inflight.append(0)
        lane_of.append(L)
        launched.append(now)
        stopped.append(math.nan)
        status.append(InstanceStatus(sid, L.g.name, template, InstanceState.STARTING, epoch + now))
        sids.append(sid)
        index[sid] = k
        live[k] = None
        L.starting.append(k)
        L.alive += 1
        L.peak = max(L.peak, L.alive)
        push(heap, (now if ready_now else now + L.work.model.startup_s, _READY, k))

    def start(L: _Lane, r: int, now: float) -> None:
        buckets = L.buckets
        for lvl in range(L.c):
            b = buckets[lvl]
            if b:
                break
        k = next(iter(b))
        b.remove(k)
        inflight[k] = lvl + 1
        if lvl + 1 < L.c:
            buckets[lvl + 1].add(k)
        push(heap, (now + svc[r], k, r))

    def stop(k: int, now: float, how: int = STOPPED) -> None:
        L = lane_of[k]
        if state[k] == DRAINING:
            L.draining -= 1
        state[k] = how
        stopped[k] = now
        L.alive -= 1
        del live[k]
        rec = awaiting.pop(k, None)
        if rec is not None:
            rec.released(now)

    def take_out(k: int, now: float) -> None:
        """A ready instance leaves rotation (drain or removal)."""
        L = lane_of[k]
        lvl = inflight[k]
        if lvl < L.c:
            L.buckets[lvl].discard(k)
        L.active.remove(k)
        for r in L.adm.set_slots(len(L.active) * L.c):
            start(L, r, now)

    def kill(k: int, now: float) -> None:
        """Stop at once; in-flight requests fail (their completions are void)."""
        L = lane_of[k]
        stop(k, now, DEAD)
        for _ in range(inflight[k]):
            for r in L.adm.release():
                start(L, r, now)
        inflight[k] = 0

    def drain(k: int, now: float) -> None:
        st = state[k]
        if st == STARTING:  # serves nothing yet: stopped at once
            lane_of[k].starting.remove(k)
            stop(k, now)
        elif st == ACTIVE:
            take_out(k, now)
            state[k] = DRAINING
            lane_of[k].draining += 1
            status[k] = dataclasses.replace(status[k], state=InstanceState.DRAINING)
            if inflight[k] == 0:
                stop(k, now)
            else:
                push(heap, (now + lane_of[k].g.drain_timeout_s, _DRAIN_DEADLINE, k))

    def remove(k: int, now: float) -> None:
        st = state[k]
        if st == STARTING:
            lane_of[k].starting.remove(k)
            stop(k, now)
        elif st == ACTIVE:
            take_out(k, now)
            kill(k, now)
        elif st == DRAINING:
            kill(k, now)

    # t = 0: each group's count in force (and its warm standby) is ready
    for L in lanes:
        L.initial = o.initial.get(L.g.name, L.count + standby(L.g))
        for _ in range(L.initial):
            launch(L, 0.0, L.g.template(), ready_now=True)
    push(heap, (0.0, _TICK, 0))

    quota, advice, meter = QuotaState(), QuotaState(), Meter()
    loans: tuple[Loan, ...] = ()
    book = Ledger(epoch)
    tiers: Mapping[str, str] = {}
    last_tick = 0.0
    ticks = 0

    def keep(alloc: Allocation, now: float) -> None:
        """What follows from a round (`LiveQuota.record`): the ledger and the reclaims,
        and each refusal counted once while it lasts."""
        for rec in book.keep(alloc, quota.loans, now):
            for sid in rec.instances:
                awaiting[index[sid]] = rec
        for L in lanes:
            why = alloc.refusals.get(L.g.name)
            if why is not None and why != L.refused:
                L.refusals += 1
                if why not in L.reasons and len(L.reasons) < _REASONS:
                    L.reasons.append(why)
            L.refused = why

    def tick(now: float, arrived: int) -> bool:
        """One controller tick at `now`; True when the run is over."""
        nonlocal quota, advice, meter, loans, tiers, last_tick, ticks
        at = epoch + now
        dt = now - last_tick
        last_tick = now
        for L in lanes:
            for x in L.adm.expire(now):
                done[x] = REJECTED
                L.expired += 1
            L.unit_s += L.units_now * dt
        for loan in loans:
            by_name[loan.borrower].borrowed_s += loan.units * dt
            if loan.lender is not None:
                by_name[loan.lender].lent_s += loan.units * dt
        meter = meter.advanced(at)
        loads: dict[str, GroupLoad] = {}
        for L in lanes:
            auto = L.g.autoscaling
            if auto is not None and at >= L.next_at:  # `LiveAutoscaling.due`
                L.next_at = at + auto.interval_s
                loads[L.g.name] = L.load(at, bisect_left(L.positions, arrived))
        d = decide(
            TickInput(
                spec,
                [status[k] for k in live],
                {L.g.name: L.count for L in lanes},
                at,
                loads=loads,
                scalers=scalers,
                quota=quota,
                advice=advice,
                meter=meter,
            )
        )
        alloc = d.allocation.enforced
        keep(alloc, now)
        quota, advice = alloc.state, d.allocation.advice.state
        meter = meter.holding(alloc)
        for name, count in d.counts.items():
            by_name[name].count = count
            by_name[name].scale_events += 1
        for s in d.scaled:
            L = by_name[s.group.name]
            if s.count != s.actual and not s.advisory and len(L.decisions) < _DECISION_LOG:
                shown = dataclasses.replace(
                    s.decision, desired=s.count, clipped_by=s.guards, reason=s.reason
                )
                L.decisions.append(decision_entry(now, s.load, shown, s.actual))
        for a in d.actions:
            if isinstance(a, Launch):
                launch(by_name[a.group], now, a.template)
                continue
            k = index.get(a.instance_id)
            drop = isinstance(a, Drain) and k is not None and state[k] == DRAINING
            if k is None or state[k] >= STOPPED or drop:
                continue
            L = lane_of[k]
            if len(L.stops) < _DECISION_LOG:  # the tier decided (reclaimed: last tick's)
                tier = d.tiers.get(a.instance_id, tiers.get(a.instance_id))
                how = "drain" if isinstance(a, Drain) else "remove"
                stop_row = {"t": now, "instance": a.instance_id, "action": how, "tier": tier}
                L.stops.append({**stop_row, "reason": a.reason})
            (drain if isinstance(a, Drain) else remove)(k, now)
        loans = alloc.loans
        borrowed: dict[str, int] = {}
        lent: dict[str, int] = {}
        for loan in loans:
            borrowed[loan.borrower] = borrowed.get(loan.borrower, 0) + loan.units
            if loan.lender is not None:
                lent[loan.lender] = lent.get(loan.lender, 0) + loan.units
        tiers = d.tiers
        busy = False
        for L in lanes:
            name = L.g.name
            L.units_now = alloc.grants[name].units_held
            seen = [tiers.get(sids[k]) for k in (*L.starting, *L.active)]
            adm = L.adm
            busy = busy or adm.in_use > 0 or adm.queue_length > 0
            running = len(L.starting) + len(L.active)
            row: tuple[float, ...] = (now, bisect_left(L.positions, arrived), running)
            row += (len(L.active), L.count)
            row += (adm.queue_length, adm.in_use, L.draining, L.alive)
            row += (seen.count(STABLE), seen.count(BURST), borrowed.get(name, 0))
            L.rows.append((*row, lent.get(name, 0), L.units_now))
        ticks += 1
        if o.end_s is not None:
            return now >= o.end_s
        return arrived >= n and not busy

    now = 0.0
    i = 0
    inf = math.inf
    while True:
        ta = arr[i] if i < n else inf
        if heap[0][0] <= ta:
            now, k, r = pop(heap)
            if k >= 0:  # a request finished
                st = state[k]
                if st == DEAD:
                    done[r] = FAILED
                    continue
                done[r] = now
                L = lane_of[k]
                L.lat_log.append(now - arr[r])
                x = svc[r]
                L.served += x
                L.served_sq += x * x
                lvl = inflight[k]
                inflight[k] = lvl - 1
                if st == ACTIVE:
                    if lvl < L.c:
                        L.buckets[lvl].remove(k)
                    L.buckets[lvl - 1].add(k)
                elif lvl == 1:  # a draining instance finished its last request
                    stop(k, now)
                woken = L.adm.release()
                if woken:
                    for w in woken:
                        start(L, w, now)
            elif k == _TICK:
                if tick(now, i):
                    break
                push(heap, (now + TICK_S, _TICK, 0))
            elif k == _READY:
                if state[r] == STARTING:
                    L = lane_of[r]
                    state[r] = ACTIVE
                    L.starting.remove(r)
                    L.active.append(r)
                    L.buckets[0].add(r)
                    status[r] = dataclasses.replace(
                        status[r], state=InstanceState.READY, ready_at=epoch + now
                    )
                    for w in L.adm.set_slots(len(L.active) * L.c):
                        start(L, w, now)
            elif state[r] == DRAINING:  # a drain that outlived drain_timeout_s
                kill(r, now)
            continue
        # an arrival
        r = i
        i += 1
        gi = grp[r]
        if tries[gi]():
            start(lanes[gi], r, ta)
        else:
            res, evicted = offers[gi](r, prio[r], ta)
            if res is shed_offer:
                done[r] = REJECTED
                lanes[gi].shed += 1
            if evicted is not None:
                done[evicted] = REJECTED

    for k in live:
        stopped[k] = now
    held_s = np.asarray(stopped) - np.asarray(launched)
    owner = np.asarray([L.gi for L in lane_of], dtype=np.int64)
    done_all = np.asarray(done, dtype=np.float64)
    groups: dict[str, FleetGroup] = {}
    for L in lanes:
        tl = np.asarray(L.rows, dtype=np.float64).reshape(-1, len(FLEET_COLUMNS))
        base = len(SimResult.TIMELINE_COLUMNS)
        sim = SimResult(
            policy=scalers[L.g.name].name if L.g.name in scalers else "fixed",
            workload=L.work,
            done=done_all[np.asarray(L.positions, dtype=np.int64)],
            timeline=np.ascontiguousarray(tl[:, :base]),
            decisions=L.decisions,
            instance_seconds=float(held_s[owner == L.gi].sum()),
            scale_events=L.scale_events,
            peak_instances=L.peak,
            shed=L.shed,
            expired=L.expired,
            end_s=now,
            initial_instances=L.initial,
        )
        pool = spec.pool(L.g.resources.pool)
        groups[L.g.name] = FleetGroup(
            name=L.g.name,
            sim=sim,
            timeline=tl,
            pool=L.g.resources.pool,
            price_per_unit_hour=pool.price_per_hour if pool else 0.0,
            unit_hours=L.unit_s / 3600.0,
            borrowed_unit_hours=L.borrowed_s / 3600.0,
            lent_unit_hours=L.lent_s / 3600.0,
            refusals=L.reasons,
            refusal_count=L.refusals,
            unfinished=sum(1 for x in sim.done.tolist() if x == PENDING),
            stops=L.stops,
        )
    return FleetResult(spec, groups, book.rows, book.reclaims, ticks, now)
