"""Discrete-event engine: replays a trace through the live admission code and a live
autoscaler (`sluice.policy.autoscale.build_autoscaler`) against simulated instances on a
virtual clock.

Events sit in one heap of `(t, kind, request)` tuples on float seconds; arrivals come from the
sorted trace arrays beside it (no heap push per arrival). `kind >= 0` is the completion of
`request` on instance `kind`; negative kinds are control events (ready, crash, drain deadline,
decision tick). At equal times control events run first, so a tick sees an instance that
became ready at that instant.

Scaling: each tick builds a `GroupLoad`, asks the policy, and applies `Decision.desired`
through the live planner `sluice.policy.plan.plan_group` (called only when the count
differs). The quota allocator is not in the loop: one simulated group owns its pool.

Instances: `starting` (launch -> ready takes the model's start-up + warm-up, times
`slow_start_factor` for an injected slow start) -> `active` (takes requests in
`max_concurrency` independent slots; service time does not depend on how busy it is) ->
`draining` (no new requests; stops when its last request finishes, or is killed at
`drain_timeout_s`, failing what is left) -> stopped. An injected crash (exponential lifetime,
`crash_rate_per_hour`) fails the instance's in-flight requests at once.

Gateway: one `GroupAdmission` (the live code): slots = active instances x max_concurrency;
in-flight counts every running request, draining instances included, as the live gateway
does. Waiters past `max_wait_s` are expired at each tick (up to one tick late).

Balancing: least-loaded over active instances with a free slot (in-flight buckets, O(slots)
per pick; ties go to an arbitrary but seeded-deterministic instance). The live p2c picker
(`sluice.policy.balance.pick_endpoint`) is not used on this path: with independent slots and
no slowdown the choice of instance changes no latency, only which instance drains first, and
building `Endpoint` maps per request would cost about a third of the speed budget.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.core.instances import InstanceState, InstanceStatus
from sluice.policy.admission import GroupAdmission, Offer
from sluice.policy.autoscale import Autoscaler, FixedPolicy, GroupLoad, build_autoscaler
from sluice.policy.plan import GroupTarget, Launch, Remove, plan_group
from sluice.policy.routing import PRIORITIES
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
from sluice.sim.model import InstanceModel
from sluice.sim.trace import Trace

__all__ = ["EPOCH", "SimOptions", "SimResult", "Workload", "make_policy", "prepare", "run"]

EPOCH = 1_767_225_600.0
"""Trace second 0 on the policy's clock: 2026-01-01 00:00 UTC (cron schedules read it)."""

_READY, _CRASH, _DRAIN_DEADLINE, _TICK = -4, -3, -2, -1
_STATUS = {STARTING: InstanceState.STARTING, ACTIVE: InstanceState.READY}
_SAMPLE_EVERY, _SAMPLES = 300, 100


@dataclass(frozen=True)
class SimOptions:
    seed: int = 0
    crash_rate_per_hour: float = 0.0
    """per instance; 0 = no crashes"""
    slow_start_prob: float = 0.0
    """chance that one launch takes `slow_start_factor` x the normal start-up"""
    slow_start_factor: float = 3.0
    initial: int | None = None
    """instances ready at t=0; None: a fixed policy's N, else `replicas` within [min, max]"""
    epoch: float = EPOCH
    decision_log: int = 1000
    """most count-changing decisions kept (all are counted in `scale_events`); every 300th
    tick's decision is also kept, up to 100 of them, marked `changed: false`"""


@dataclass(frozen=True)
class Workload:
    """A trace priced for one instance model: the per-request arrays the hot loop reads."""

    model: InstanceModel
    trace: Trace
    service: npt.NDArray[np.float64]
    limit: npt.NDArray[np.float64]
    """per-request latency bound (s)"""

    @property
    def work_floor_instance_seconds(self) -> float:
        """sum(service time) / slots per instance: no policy can serve the trace with fewer
        instance-seconds of ready instances (each slot runs one request at a time)."""
        return float(self.service.sum()) / self.model.slots


def prepare(model: InstanceModel, trace: Trace, seed: int | None = None) -> Workload:
    """Service times and SLO bounds for every request (numpy, once per trace)."""
    s = seed if seed is not None else model.seed
    service = model.service_times(
        trace.models, trace.model, trace.input_tokens, trace.output_tokens, s
    )
    return Workload(model, trace, service, model.slo_limits(service))


def make_policy(model: InstanceModel, policy: str | None, templates: Any = None) -> Autoscaler:
    """The live autoscaler for the group (`policy` overrides the spec's choice)."""
    return build_autoscaler(model.group, templates or {}, policy)


@dataclass
class SimResult:
    """Outcome of one run; `summary()` is the JSON document `sluice simulate` prints."""

    policy: str
    workload: Workload
    done: npt.NDArray[np.float64]
    """completion time per request; -2 rejected (shed/expired), -3 failed (crash/kill)"""
    timeline: npt.NDArray[np.float64]
    """one row per tick: TIMELINE_COLUMNS"""
    decisions: list[dict[str, Any]]
    instance_seconds: float
    scale_events: int
    peak_instances: int
    shed: int
    expired: int
    end_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    initial_instances: int = 0
    """instances ready at t = 0, before the first decision (`SimOptions.initial` or its
    default)"""

    TIMELINE_COLUMNS = (
        "t",
        "arrivals",
        "current",
        "ready",
        "desired",
        "queued",
        "in_flight",
        "draining",
        "alive",
    )

    def column(self, name: str) -> npt.NDArray[np.float64]:
        return self.timeline[:, self.TIMELINE_COLUMNS.index(name)]

    def latencies(self) -> npt.NDArray[np.float64]:
        """Latency (s) of each completed request, in trace order."""
        ok = self.done >= 0
        return self.done[ok] - self.workload.trace.t[ok]

    def summary(self) -> dict[str, Any]:
        w = self.workload
        n = len(w.trace)
        ok_mask = self.done >= 0
        lat = self.done - w.trace.t
        in_slo = int(np.count_nonzero(ok_mask & (lat <= w.limit + 1e-9)))
        done_lat = lat[ok_mask]
        waits = done_lat - w.service[ok_mask]
        q = self.column("queued") if len(self.timeline) else np.zeros(1)
        price = w.model.price_per_hour
        return {
            "policy": self.policy,
            "trace": w.trace.name,
            "requests": n,
            "completed": int(ok_mask.sum()),
            "rejected": self.shed + self.expired,
            "failed": int(np.count_nonzero(self.done == FAILED)),
            "slo_attainment": in_slo / n if n else 1.0,
            "slo_target": w.model.slo.target,
            "p50_ms": _pct_ms(done_lat, 50),
            "p90_ms": _pct_ms(done_lat, 90),
            "p99_ms": _pct_ms(done_lat, 99),
            "mean_wait_ms": float(waits.mean() * 1000) if waits.size else 0.0,
            "mean_queue": float(q.mean()),
            "instance_seconds": self.instance_seconds,
            "cost": self.instance_seconds / 3600.0 * price,
            "work_floor_instance_seconds": w.work_floor_instance_seconds,
            "scale_events": self.scale_events,
            "peak_instances": self.peak_instances,
            "duration_s": self.end_s,
            "initial_instances": self.initial_instances,
            **self.extra,
        }


def _pct_ms(values: npt.NDArray[np.float64], q: float) -> float | None:
    return float(np.percentile(values, q) * 1000.0) if values.size else None


def run(work: Workload, policy: Autoscaler, opts: SimOptions | None = None) -> SimResult:
    """Replay `work` under `policy` until every request has finished or been turned away."""
    o = opts or SimOptions()
    m = work.model
    group = m.group
    c = m.slots
    startup = m.startup_s
    interval = m.interval_s
    drain_timeout = group.drain_timeout_s
    arr: list[float] = work.trace.t.tolist()
    svc: list[float] = work.service.tolist()
    prio_names: list[str] = [PRIORITIES[p] for p in range(len(PRIORITIES))]
    prio: list[str] = [prio_names[p] for p in work.trace.priority.tolist()]
    n = len(arr)
    rng = random.Random(o.seed)
    crash_rate = o.crash_rate_per_hour / 3600.0

    adm: GroupAdmission[int] = GroupAdmission(group.queue.max_length, group.queue.max_wait_s)
    try_acquire = adm.try_acquire
    offer = adm.offer_nowait
    release = adm.release
    shed_offer = Offer.SHED

    heap: list[tuple[float, int, int]] = []
    push, pop = heappush, heappop
    inflight: list[int] = []
    state: list[int] = []
    launched: list[float] = []
    stopped: list[float] = []
    buckets: list[set[int]] = [set() for _ in range(c)]
    starting_ids: list[int] = []
    active_ids: list[int] = []
    done: list[float] = [PENDING] * n
    lat_log: list[float] = []
    served = served_sq = 0.0  # service seconds of the completions (GroupLoad.served_s)
    marks: deque[int] = deque([0], maxlen=P95_WINDOW_TICKS + 1)
    timeline: list[tuple[float, ...]] = []
    decisions: list[dict[str, Any]] = []
    counts = {
        "alive": 0,
        "peak": 0,
        "draining": 0,
        "shed": 0,
        "expired": 0,
        "scale": 0,
        "sampled": 0,
    }

    def launch(now: float, ready_now: bool = False) -> None:
        k = len(state)
        state.append(STARTING)
        inflight.append(0)
        launched.append(now)
        stopped.append(math.nan)
        starting_ids.append(k)
        counts["alive"] += 1
        counts["peak"] = max(counts["peak"], counts["alive"])
        delay = 0.0 if ready_now else startup
        if o.slow_start_prob > 0 and not ready_now and rng.random() < o.slow_start_prob:
            delay *= o.slow_start_factor
        push(heap, (now + delay, _READY, k))
        if crash_rate > 0:
            push(heap, (now + rng.expovariate(crash_rate), _CRASH, k))

    def start(r: int, now: float) -> None:
        for lvl in range(c):
            b = buckets[lvl]
            if b:
                break
        k = next(iter(b))
        b.remove(k)
        inflight[k] = lvl + 1
        if lvl + 1 < c:
            buckets[lvl + 1].add(k)
        push(heap, (now + svc[r], k, r))

    def stop(k: int, now: float, how: int = STOPPED) -> None:
        if state[k] == DRAINING:
            counts["draining"] -= 1
        state[k] = how
        stopped[k] = now
        counts["alive"] -= 1

    def take_out(k: int, now: float) -> None:
        """Remove an active instance from rotation (drain or crash)."""
        lvl = inflight[k]
        if lvl < c:
            buckets[lvl].discard(k)
        active_ids.remove(k)
        for r in adm.set_slots(len(active_ids) * c):
            start(r, now)

    def kill(k: int, now: float) -> None:
        """Crash or drain deadline: in-flight requests fail (their completions are void)."""
        st = state[k]
        if st == STARTING:
            starting_ids.remove(k)
        elif st == ACTIVE:
            take_out(k, now)
        if st in (STARTING, ACTIVE, DRAINING):
            stop(k, now, DEAD)
            for _ in range(inflight[k]):
                for r in release():
                    start(r, now)
            inflight[k] = 0

    def reconcile(desired: int, now: float) -> None:
        """Apply the count through the live planner (`plan_group`), only when it differs:
        launch the shortfall; stop not-ready instances, then drain ready ones, newest first."""
        if desired == len(starting_ids) + len(active_ids):
            return
        observed = [
            InstanceStatus(f"{k:09d}", group.name, "sim", _STATUS[state[k]], launched[k])
            for k in (*starting_ids, *active_ids)
        ]
        for action in plan_group(GroupTarget(group.name, "sim", desired), observed):
            if isinstance(action, Launch):
                launch(now)
                continue
            k = int(action.instance_id)
            if isinstance(action, Remove):
                starting_ids.remove(k)
                stop(k, now)
                continue
            take_out(k, now)  # Drain
            state[k] = DRAINING
            counts["draining"] += 1
            if inflight[k] == 0:
                stop(k, now)
            else:
                push(heap, (now + drain_timeout, _DRAIN_DEADLINE, k))

    # t = 0: the fleet the trace starts with is already warm
    initial = o.initial
    if initial is None:
        initial = (
            policy.n
            if isinstance(policy, FixedPolicy)
            else min(max(group.replicas, m.min_instances), m.max_instances)
        )
    for _ in range(initial):
        launch(0.0, ready_now=True)
    push(heap, (0.0, _TICK, 0))

    last_desired: int | None = None
    now = 0.0
    i = 0
    inf = math.inf
    end = 0.0
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
                lat_log.append(now - arr[r])
                x = svc[r]
                served += x
                served_sq += x * x
                lvl = inflight[k]
                inflight[k] = lvl - 1
                if st == ACTIVE:
                    if lvl < c:
                        buckets[lvl].remove(k)
                    buckets[lvl - 1].add(k)
                elif lvl == 1:  # a draining instance finished its last request
                    stop(k, now)
                woken = release()
                if woken:
                    for w in woken:
                        start(w, now)
            elif k == _TICK:
                for x in adm.expire(now):
                    done[x] = REJECTED
                    counts["expired"] += 1
                marks.append(len(lat_log))
                window = lat_log[marks[0] :]
                p95 = None
                if window:
                    window.sort()
                    p95 = window[min(len(window) - 1, int(0.95 * len(window)))]
                load = GroupLoad(
                    at=o.epoch + now,
                    current=len(starting_ids) + len(active_ids),
                    ready=len(active_ids),
                    slots_per_instance=c,
                    in_flight=adm.in_use,
                    queued=adm.queue_length,
                    arrivals=i,
                    completions=len(lat_log),
                    served_s=served,
                    served_sq_s=served_sq,
                    latency_p95_s=p95,
                    startup_s=startup,
                    draining=counts["draining"],
                )
                d = policy.decide(load, o.epoch + now)
                desired = max(0, d.desired)
                if desired != last_desired:
                    if last_desired is not None:
                        counts["scale"] += 1
                    if len(decisions) < o.decision_log:
                        decisions.append(decision_entry(now, load, d, last_desired))
                    last_desired = desired
                elif len(timeline) % _SAMPLE_EVERY == 0 and counts["sampled"] < _SAMPLES:
                    counts["sampled"] += 1  # a bounded sample of the steady decisions too
                    decisions.append(decision_entry(now, load, d, last_desired))
                reconcile(desired, now)
                timeline.append(
                    (
                        now,
                        i,
                        len(starting_ids) + len(active_ids),
                        len(active_ids),
                        desired,
                        adm.queue_length,
                        adm.in_use,
                        counts["draining"],
                        counts["alive"],
                    )
                )
                if i >= n and adm.in_use == 0 and adm.queue_length == 0:
                    end = now
                    break
                push(heap, (now + interval, _TICK, 0))
            elif k == _READY:
                if state[r] == STARTING:
                    state[r] = ACTIVE
                    starting_ids.remove(r)
                    active_ids.append(r)
                    buckets[0].add(r)
                    for w in adm.set_slots(len(active_ids) * c):
                        start(w, now)
            else:  # crash, or a drain that outlived drain_timeout_s
                if k == _CRASH or state[r] == DRAINING:
                    kill(r, now)
            continue
        # an arrival
        r = i
        i += 1
        if try_acquire():
            start(r, ta)
        else:
            res, evicted = offer(r, prio[r], ta)
            if res is shed_offer:
                done[r] = REJECTED
                counts["shed"] += 1
            if evicted is not None:
                done[evicted] = REJECTED

    for k in range(len(state)):
        if state[k] in (STARTING, ACTIVE, DRAINING):
            stopped[k] = end
    inst_s = float(np.sum(np.asarray(stopped) - np.asarray(launched)))
    return SimResult(
        policy=getattr(policy, "name", type(policy).__name__),
        workload=work,
        done=np.asarray(done, dtype=np.float64),
        timeline=np.asarray(timeline, dtype=np.float64).reshape(
            -1, len(SimResult.TIMELINE_COLUMNS)
        ),
        decisions=decisions,
        instance_seconds=inst_s,
        scale_events=counts["scale"],
        peak_instances=counts["peak"],
        shed=counts["shed"],
        expired=counts["expired"],
        end_s=end,
        initial_instances=initial,
    )
