"""The simulator: a whole spec (every group, shared pools, guarantees, borrowing, reclaims,
budgets) on one virtual clock, decided each tick by the live controller's own kernel
`sluice.policy.kernel.step`, so a what-if ("add this group", "shrink the pool to 40")
shows what the controller would do, per group: SLO, cost, loans and reclaims. A one-group
study (`sluice.sim.single.run`: `sluice simulate`, the oracle, the causal reference, the
drill's dry run, bench/autoscale.py) is this same loop on a fleet of one.

Events sit in one heap of `(t, kind, request)` tuples on float seconds; arrivals come from
the merged, sorted traces beside it (no heap push per arrival). `kind >= 0` is the
completion of `request` on instance `kind`; negative kinds are control events (ready,
crash, drain deadline, tick), and -1 a batching instance's next event (below). At equal
times control events run first, so a tick sees an instance that became ready at that
instant.

Requests: each group's gateway is one `GroupAdmission` (the live code): slots = ready
instances x max_concurrency; in-flight counts every running request, draining instances
included, as the live gateway does; waiters past `max_wait_s` expire at each tick (up to
one tick late). A queued request is offered as the gateway offers it (`Exchange._share`):
its trace tenant, its cost and its tenant's `weight` in the spec (1.0 for a tenant the spec
does not name, or a spec without tenants), so each priority's waiters share by weighted
service (the queue's fair shares, issue 35). The cost is `answer_cost` of the request's
true tokens: what the gateway's counter holds once it has corrected its estimate by the
answer's usage (the simulator knows the tokens up front, so there is no estimate to
correct). A trace without tenants is one tenant, "": plain FIFO, as before (and where no
trace has two tenants, offers carry none: the per-request lists would only cost time).
Nothing is requeued here (an instance never refuses a request).

Balancing is least-loaded over ready instances with a free slot (in-flight buckets,
O(slots) per pick). The live p2c picker (`sluice.policy.balance.pick_endpoint`)
is not used: with independent slots and no slowdown the choice of instance changes no
latency, only which instance drains first, and building `Endpoint` maps per request would
cost about a third of the speed budget.

Instances: starting (launch -> ready takes the model's start-up, times
`slow_start_factor` for an injected slow start) -> ready (takes requests in
`max_concurrency` independent slots; service time does not depend on how busy it is) ->
draining (no new requests; stops when its last request finishes, killed at
`drain_timeout_s`, failing what is left) -> stopped. An injected crash (exponential
lifetime, `crash_rate_per_hour`) fails the instance's in-flight requests at once; the
instance is observed `failed` until the tick's plan removes it.

Batching instances (a group whose model's `sim` params have `batching:`,
`InstanceModel.batching`): each instance is a `BatchingInstance` (`sluice.sim.batching`),
a continuously batching server. The gateway is the same: its `GroupAdmission` decides who
is dispatched, slots = ready instances x max_concurrency, least-loaded over in-flight
counts; a dispatched request is offered to its instance with its trace tokens
(`batch_tokens`: clipped as the server requires) and the instance decides when it runs
and ends. Where max_concurrency > max_seqs (or the KV cache is full) a server's own
waiting queue forms behind its batch, as with vLLM: those requests count as in flight at
the gateway and as `server_waiting` in the `GroupLoad` (with the admitted ones whose prefill
has not begun, as vLLM's num_requests_waiting counts them). Each instance keeps one live heap
entry `(next_event_at(), -1, k)`; `ev_at[k]` is its time, and an entry at another time is
stale (superseded by an offer or an event) and skipped. At an event the instance advances
and each `Finished` is a completion: latency = gateway wait + its latency at the
instance, TTFT = gateway wait + the instance's TTFT, TPOT the instance's, served time =
its time at the instance (as the live gateway counts it). At equal times an instance's
event runs after control events (as slot completions do); a request dispatched at that
instant is offered before it. A crash, a removal or a drain deadline `clear()`s the
instance (its requests fail); a draining instance takes no new requests and stops once its
server is empty. The autoscaler's `GroupLoad` gets what a live vLLM group gives it: p95
TTFT and TPOT over the completions of the last `P95_WINDOW_TICKS` ticks, the ready
instances' mean KV-cache use (None for an unbounded cache), and `server_waiting`.

Every `TICK_S` of virtual time the tick does what `Controller.tick` does: the fleet as
`InstanceStatus`es and a `GroupLoad` for each group the kernel says is `due` make the
`World`; one `step` on the kernel's `Memory` (counts, policy memories, due times, quota,
meter, crash-loop backoff) decides, and its actions are applied (Launch: a new starting
instance; Drain: draining; Remove: stopped at once). The loan ledger is kept with
`ledger_changes`, as `LiveQuota._sync_ledger` does. So quota (the pool's count, borrowing,
reclaims, budgets), warm standby (launched, and counted by quota) and crash-loop backoff
(a group whose instances keep crashing waits before each replacement) are the kernel's.
Warm standby stays out of rotation as the live routing keeps it: a group serves from its
oldest ready instances, as many as its count in force (`rotate`).

Sleeping standby (`autoscaling.sleeping_standby`) is placed by the live placement itself,
`sluice.policy.standby.split_standby` (`place`, after every change of the ready instances
and every tick): the count in force serves (what of it is awake, `Memory.awake`), then
`warm_standby`, awake ones oldest first;
an awake instance in a sleeping place that serves nothing is put to sleep and is asleep the
model's `sim.sleep_s` later (1 s), out of the routing from the moment the sleep starts; an
asleep one a serving or warm place needs is woken (`sim.wake_s`, 3 s). The gateway
(`route`, as `GroupRuntime` and `GatewayState.watch_queue`): a request that waits, or one
admitted past the group's standby level (`TickDecision.standby_at`), promotes
the warm standby, and while requests still wait wakes as many asleep instances as they
need, at once, oldest first (`sleepers_to_wake`); once awake each joins the warm standby,
in rotation at once and held as a promoted one, so the `GroupLoad`'s `standby_in_rotation`
counts it and the kernel takes it into the count (the `woken` a live gateway reports). An
asleep instance-second is counted apart (`SimResult.sleeping_seconds`) and priced at
`sleeping_cost_ratio` of an awake one (`sluice.sim.result`: the host memory its weights
hold, `sim.host_memory_gb`, against an H100's on-demand price); falling asleep and waking
count as awake. Not simulated: the live sleep's wait for in-flight requests is polled every
tick here (every 0.2 s live) and not bounded by the drain timeout; the controller learns of
a gateway's wake at once. The kernel reads the instances asleep (`World.asleep`, from the
sleep's end to the wake's) and lends a sleeper's units as live (`TickDecision.fence`): a
fenced sleeper is one the gateway does not wake, released from its group's claim the next
tick (`World.fenced`: the one gateway has the fence at once), so quota lends its units; one
the count needs is woken once quota grants them back (`TickDecision.unwoken`: after the
reclaim's grace and the borrower's drain).

On a pool that pins `devices` each launch takes devices as the supervisor gives them
(`place_beside_lent`: a lent sleeper's devices last) and starts once it has them, pending
until then; a sleeper wakes only once no other instance holds its devices
(`devices_free`), and the kernel's device-aware reclaim (`GroupClaim.reclaim_first`) reads
the `devices` label as it does live.

A rollout is simulated by its floor only (`FleetOptions.rollouts`: from the second it
starts to the second it ends, its baseline keeps at least the count in force when it
started, as `RolloutRunner.start` floors it; no canary, split or analysis). Not
simulated: pins, overrides and no-gain holds (the `World` has none), slow start's small
share of traffic for a newly ready instance; the route choice only with
`sluice.sim.routed` (else each trace row goes to its group).
"""

from __future__ import annotations

import dataclasses
import math
import random
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any

import numpy as np
import numpy.typing as npt

from sluice.core.instances import InstanceState, InstanceStatus
from sluice.policy.admission import COMPLETION_WEIGHT, PROMPT_WEIGHT, GroupAdmission, Offer
from sluice.policy.autoscale import GroupLoad, ScalingPolicy, TokenLoad
from sluice.policy.devices import DeviceHold, may_wake, place_beside_lent
from sluice.policy.kernel import Memory, World, due, step
from sluice.policy.plan import Drain, Launch
from sluice.policy.quota import Allocation, Loan
from sluice.policy.routing import PRIORITIES, STANDBY_HOLD_S, Endpoint
from sluice.policy.standby import over_level, sleepers_to_wake, split_standby
from sluice.policy.tick import BURST, STABLE, TICK_S, is_advisory, spec_count, standby
from sluice.sim.batching import BatchingInstance, BatchingParams
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
from sluice.sim.fleet_inputs import compiled_for, sleep_params, with_pool_counts, workloads_for
from sluice.sim.fleet_report import (
    FLEET_COLUMNS,
    FleetGroup,
    FleetResult,
    Ledger,
    LedgerRow,
    ReclaimRecord,
)
from sluice.sim.model import batch_tokens
from sluice.sim.result import SimResult
from sluice.sim.workload import EPOCH, Workload
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


_SLEPT, _AWAKE, _READY, _CRASH, _DRAIN_DEADLINE, _TICK, _SERVER = -7, -6, -5, -4, -3, -2, -1
"""control events first at equal times, then batching servers' events, then completions"""
_DOZING, _ASLEEP, _WAKING = 1, 2, 3
"""a sleeping-standby instance's sleep: being put to sleep, asleep, being woken"""
_REASONS = 5
"""distinct refusal texts kept per group"""
_SAMPLE_EVERY, _SAMPLES = 300, 100
"""every 300th tick's decision is kept too, up to 100 of them per group"""


@dataclass(frozen=True)
class FleetOptions:
    seed: int = 0
    """seeds the injected crashes and slow starts (and a study's trace transforms,
    `sluice.sim.study`); the same seed gives the same run"""
    epoch: float = EPOCH
    pool_counts: Mapping[str, int] = field(default_factory=dict)
    """pool -> count instead of the spec's ("what if the pool shrinks to 40")"""
    initial: Mapping[str, int] = field(default_factory=dict)
    """group -> instances ready at t = 0; default: its count in force (+ warm standby). An
    actively autoscaled group starts with it as the count in force (less its standby), as
    if its autoscaler had set it"""
    end_s: float | None = None
    """stop at this virtual second; None: once every request has finished"""
    policies: Mapping[str, str] = field(default_factory=dict)
    """autoscaled group -> policy name instead of the spec's (`build_policy`)"""
    scalers: Mapping[str, ScalingPolicy[Any]] = field(default_factory=dict)
    """autoscaled group -> a policy itself (a study's tuned or clairvoyant one), before
    `policies` and the spec's"""
    crash_rate_per_hour: float = 0.0
    """per instance; 0 = no crashes"""
    slow_start_prob: float = 0.0
    """chance that one launch takes `slow_start_factor` x the normal start-up"""
    slow_start_factor: float = 3.0
    decision_log: int = 1000
    """most count-changing decisions kept per group (all are counted in `scale_events`);
    every 300th tick's decision is also kept, up to 100 of them, marked `changed: false`"""
    rollouts: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    """baseline group -> (the virtual second a rollout of it starts, the second it ends:
    `math.inf` for never): meanwhile its count is floored at its count in force when it
    started (module docstring)"""


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
    """ready instances in rotation, in the order they became ready"""
    spare: list[int] = field(default_factory=list)
    """ready instances kept out of rotation (warm standby: the newest), oldest first"""
    positions: list[int] = field(default_factory=list)
    """indexes of the group's requests in the merged arrivals"""
    lat_log: list[float] = field(default_factory=list)
    marks: deque[int] = field(default_factory=lambda: deque([0], maxlen=P95_WINDOW_TICKS + 1))
    decisions: list[dict[str, Any]] = field(default_factory=list)
    stops: list[dict[str, Any]] = field(default_factory=list)
    rows: list[tuple[float, ...]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    refused: str | None = None
    served: float = 0.0
    served_sq: float = 0.0
    prompt_tokens: float = 0.0
    """a batching group's: the tokens of the requests it answered (as a gateway counts
    their usage), which size it on its capacity at the SLO (`TokenLoad`)"""
    output_tokens: float = 0.0
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
    clipped: Counter[str] = field(default_factory=Counter)
    """decisions clipped, by guard (quota, budget, cooldown, step, max, ...)"""
    refusals: int = 0
    initial: int = 0
    units_now: int = 0
    warm: bool = False
    """keeps warm standby out of rotation (an active autoscaler's `warm_standby`)"""
    promoted_until: float = 0.0
    """the gateway's promotion of the warm standby (requests waited) lasts until then; 0.0:
    not promoted (`GroupRuntime.promote`)"""
    warm_n: int = 0
    """`autoscaling.warm_standby`"""
    sleepers: int = 0
    """`autoscaling.sleeping_standby`: placed by `split_standby`, put to sleep, woken"""
    sleep_s: float = 0.0
    wake_s: float = 0.0
    naps: dict[int, int] = field(default_factory=dict)
    """sleeping standby: instance -> _DOZING, _ASLEEP or _WAKING (absent: awake)"""
    asleep_since: dict[int, float] = field(default_factory=dict)
    slept_s: float = 0.0
    """instance-seconds asleep, the instances' that are no longer asleep"""
    standby_n: int = 0
    """sleeping standby: the warm standby the gateway sees (`GroupRuntime.standby`)"""
    woken: set[int] = field(default_factory=set)
    """sleeping standby the gateway woke (reported, as `routed`, while promoted)"""
    waking: set[int] = field(default_factory=set)
    """the instances the gateway is waking (`GroupRuntime.waking`)"""
    standby_at: float | None = None
    """the standby level the last tick published (`TickDecision.standby_at`): an admitted
    request past it takes the standby in (`GroupRuntime.over_level`)"""
    awake: int | None = None
    """of the count in force, the instances that serve (`Memory.awake`); None: all"""
    promotions: int = 0
    """times the gateway put the warm standby in rotation (its `standby_promotions`)"""
    gateway_wakes: int = 0
    """sleeping standby the gateway woke (its `standby_wakes`; the controller's not)"""
    eps: dict[int, Endpoint] = field(default_factory=dict)
    """sleeping standby: the ready instances as `split_standby` reads them"""
    placed: tuple[list[int], list[int], list[int]] = ([], [], [])
    """sleeping standby: the controller's last placement (rotation, warm, asleep)"""
    ratio: float = 1.0
    """an asleep instance-second's price as a share of an awake one's"""
    sampled: int = 0
    before: int = 0
    """instances starting or ready when the tick began"""
    seq_before: int = 0
    batch: BatchingParams | None = None
    """the instances as batching servers; None: slots"""
    engines: list[BatchingInstance | None] = field(default_factory=list)
    """every instance's server (the run's list, shared by the lanes; None for slots)"""
    draining_ks: set[int] = field(default_factory=set)
    """batching: the draining instances (their servers still count)"""
    ttft_log: list[float] = field(default_factory=list)
    tpot_log: list[float] = field(default_factory=list)
    tmarks: deque[tuple[int, int]] = field(
        default_factory=lambda: deque([(0, 0)], maxlen=P95_WINDOW_TICKS + 1)
    )
    preempted: int = 0
    low: int = 0
    """batching: no bucket below this level has an instance (where `start_batch` begins its
    scan: max_concurrency is often in the hundreds for a batching server)"""

    @classmethod
    def of(cls, gi: int, g: GroupSpec, work: Workload) -> _Lane:
        count = spec_count(g)  # as `Controller.desired_replicas` starts
        adm: GroupAdmission[int] = GroupAdmission(g.queue.max_length, g.queue.max_wait_s)
        c = g.max_concurrency
        lane = cls(gi, g, work, adm, [set() for _ in range(c)], count, c)
        lane.warm = standby(g) > 0
        lane.batch = work.model.batching
        if g.autoscaling is not None and g.autoscaling.sleeping_standby:
            lane.warm_n = g.autoscaling.warm_standby
            lane.sleepers = g.autoscaling.sleeping_standby
            sp = sleep_params(g)
            lane.sleep_s, lane.wake_s = sp.sleep_s, sp.wake_s
        return lane

    def kv_usage(self, now: float) -> float:
        """Batching: the ready instances' mean KV-cache use at `now` (NaN: none ready, or
        an unbounded cache)."""
        engines = self.engines
        ks = (*self.active, *self.spare)
        if not ks or self.batch is None or self.batch.kv_tokens == math.inf:
            return math.nan
        return sum(e.kv_usage(now) for k in ks if (e := engines[k]) is not None) / len(ks)

    def server_waiting(self, now: float) -> int:
        """Batching: requests waiting inside the instances' servers at `now` (draining ones
        too), as vLLM's num_requests_waiting counts them (`BatchingInstance.waiting_at`:
        the servers' queues and the admitted requests whose prefill has not begun)."""
        engines = self.engines
        return sum(
            e.waiting_at(now)
            for k in (*self.active, *self.spare, *self.draining_ks)
            if (e := engines[k]) is not None
        )

    def load(self, at: float, arrivals: int, now: float = 0.0) -> GroupLoad:
        """The group's `GroupLoad` at virtual second `now`; `current` is the count in force
        (what the controller passes, `LiveAutoscaling.due`; `step` sets it again from its
        memory)."""
        self.marks.append(len(self.lat_log))
        p95 = _p95(self.lat_log, self.marks[0])
        auto = self.g.autoscaling
        lead = auto.lead_time_s if auto is not None else None
        # a batching group's servers say what the live scrape and gateway would: their
        # queue, KV-cache use, and the p95 time to first and per output token
        ttft = tpot = kv = None
        waiting = 0
        if self.batch is not None:
            self.tmarks.append((len(self.ttft_log), len(self.tpot_log)))
            ttft = _p95(self.ttft_log, self.tmarks[0][0])
            tpot = _p95(self.tpot_log, self.tmarks[0][1])
            kv = self.kv_usage(now)
            kv = None if kv != kv else kv  # NaN: an unbounded cache has no share in use
            waiting = self.server_waiting(now)
        load = GroupLoad(
            at=at,
            current=self.count,
            ready=len(self.active) + len(self.spare),
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
            server_waiting=waiting,
            standby_in_rotation=len(self.active) if self.promoted_until else 0,
            ttft_p95_s=ttft,
            tpot_p95_s=tpot,
            kv_cache_usage=kv,
        )
        if self.batch is None:
            return load
        # the gateway counts a generative group's tokens: they size it on its capacity
        fields = {f.name: getattr(load, f.name) for f in dataclasses.fields(load)}
        return TokenLoad(
            **fields,
            token_requests=len(self.lat_log),
            prompt_tokens=round(self.prompt_tokens),
            output_tokens=round(self.output_tokens),
        )


def _p95(log: list[float], since: int) -> float | None:
    """The p95 of `log[since:]` (the window of the last ticks); None when empty."""
    window = log[since:]
    if not window:
        return None
    window.sort()
    return window[min(len(window) - 1, int(0.95 * len(window)))]


def _cat(parts: list[npt.NDArray[Any]], dtype: type[Any]) -> npt.NDArray[Any]:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _shares(
    work: Workload, weights: Mapping[str, float]
) -> tuple[npt.NDArray[Any], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per request of `work`, in trace order, what its queue offer carries (`Exchange._share`):
    its tenant's name (the trace's; "" without one), its cost, `answer_cost(input_tokens,
    output_tokens)` of its true tokens (vectorised: `PROMPT_WEIGHT` x prompt +
    `COMPLETION_WEIGHT` x completion), and its tenant's weight (1.0 unless `weights` names
    it)."""
    tr = work.trace
    tenant = np.asarray(tr.tenants, dtype=object)[tr.tenant]
    weight = np.asarray([weights.get(x, 1.0) for x in tr.tenants], dtype=np.float64)[tr.tenant]
    cost = PROMPT_WEIGHT * tr.input_tokens + COMPLETION_WEIGHT * tr.output_tokens
    return tenant, cost.astype(np.float64, copy=False), weight


def run_fleet(
    spec: PlatformSpec, workloads: Mapping[str, Workload], opts: FleetOptions | None = None
) -> FleetResult:
    """Replay every group's workload on one fleet until all requests have finished (or
    `opts.end_s`), deciding each tick with the kernel's `step` (module docstring)."""
    o = opts or FleetOptions()
    spec = with_pool_counts(spec, o.pool_counts)
    works = workloads_for(spec, workloads)
    lanes = [_Lane.of(gi, g, works[g.name]) for gi, g in enumerate(spec.groups)]
    sleepy = [L for L in lanes if L.sleepers]
    fast = [L for L in lanes if L.warm]  # (warm or sleeping standby)
    for L in sleepy:
        L.ratio = sleep_params(L.g, spec.pool(L.g.resources.pool)).ratio
    by_name = {L.g.name: L for L in lanes}
    unknown = sorted(set(o.rollouts) - set(by_name))
    if unknown:
        raise ValueError(f"a rollout of {', '.join(unknown)}: no such group in the run")
    floors: dict[str, int] = {}  # running rollouts' baselines: their counts when they began
    compiled = compiled_for(spec, o.policies, o.scalers)
    epoch = o.epoch
    rng = random.Random(o.seed)
    crash_rate = o.crash_rate_per_hour / 3600.0
    slow_prob, slow_factor = o.slow_start_prob, o.slow_start_factor

    # all arrivals merged in time order (stable: by group at equal times)
    t_all = _cat([L.work.trace.t for L in lanes], np.float64)
    order = np.argsort(t_all, kind="stable")
    grp_sorted = _cat([np.full(len(L.work.trace), L.gi) for L in lanes], np.int64)[order]
    arr: list[float] = t_all[order].tolist()
    grp: list[int] = grp_sorted.tolist()
    svc: list[float] = _cat([L.work.service for L in lanes], np.float64)[order].tolist()
    names = [PRIORITIES[p] for p in range(len(PRIORITIES))]
    prio = [names[p] for p in _cat([L.work.trace.priority for L in lanes], np.int8)[order].tolist()]
    # what a queued request's offer carries; with one tenant (or none) in every trace each
    # queue is FIFO whatever the costs, so the lists are built only where tenants share
    shared = any(len(L.work.trace.tenants) > 1 for L in lanes)
    tenant_of: list[str] = []
    cost: list[float] = []
    weight: list[float] = []
    if shared:
        weights = {t.name: t.weight for t in spec.tenants}
        shares = [_shares(L.work, weights) for L in lanes]
        tenant_of = _cat([s[0] for s in shares], object)[order].tolist()
        cost = _cat([s[1] for s in shares], np.float64)[order].tolist()
        weight = _cat([s[2] for s in shares], np.float64)[order].tolist()
    for L in lanes:
        L.positions = np.nonzero(grp_sorted == L.gi)[0].tolist()
    n = len(arr)
    # batching groups: each request's tokens as its server takes them, and what it felt
    batching = any(L.batch is not None for L in lanes)
    ptok: list[float] = []
    otok: list[float] = []
    ttft: list[float] = []
    tpot: list[float] = []
    if batching:
        toks = [
            batch_tokens(L.batch, L.work.trace.input_tokens, L.work.trace.output_tokens)
            if L.batch is not None
            else (np.zeros(len(L.work.trace)), np.ones(len(L.work.trace)))
            for L in lanes
        ]
        ptok = _cat([x[0] for x in toks], np.float64)[order].tolist()
        otok = _cat([x[1] for x in toks], np.float64)[order].tolist()
        ttft = [math.nan] * n
        tpot = [math.nan] * n
    tries = [L.adm.try_acquire for L in lanes]
    offers = [L.adm.offer_nowait for L in lanes]
    shed_offer = Offer.SHED

    heap: list[tuple[float, int, int]] = []
    push, pop = heappush, heappop
    inf = math.inf
    state: list[int] = []
    inflight: list[int] = []
    rotating: list[bool] = []  # ready and in rotation (not a warm standby)
    lane_of: list[_Lane] = []
    launched: list[float] = []
    stopped: list[float] = []
    status: list[InstanceStatus] = []
    sids: list[str] = []
    index: dict[str, int] = {}
    live: dict[int, InstanceStatus] = {}  # alive or draining, in launch order: as observed
    failed: dict[int, None] = {}  # crashed, observed `failed` until the plan removes them
    done: list[float] = [PENDING] * n
    awaiting: dict[int, ReclaimRecord] = {}  # instance -> the reclaim its stop releases
    engines: list[BatchingInstance | None] = []  # batching instances' servers
    pinned = {p.name: p for p in spec.pools if p.devices}  # pools that pin devices
    holding: dict[int, DeviceHold] = {}  # instance -> its devices, until it stops
    seating: list[tuple[int, float]] = []  # launched, waiting for devices: (k, start-up s)
    lent_now: frozenset[str] = frozenset()
    """sleepers whose units the last tick lent (the controller's `_lent`): they hold no device"""
    ev_at: list[float] = []  # when each server's live heap entry is due (inf: none)
    for L in lanes:
        L.engines = engines

    def launch(L: _Lane, now: float, template: str, ready_now: bool = False) -> None:
        k = len(state)
        sid = f"{L.g.name}-{L.seq:06d}"
        L.seq += 1
        state.append(STARTING)
        inflight.append(0)
        rotating.append(False)
        lane_of.append(L)
        engines.append(BatchingInstance(L.batch) if L.batch is not None else None)
        ev_at.append(math.inf)
        launched.append(now)
        stopped.append(math.nan)
        status.append(InstanceStatus(sid, L.g.name, template, InstanceState.STARTING, epoch + now))
        live[k] = status[k]
        sids.append(sid)
        index[sid] = k
        L.starting.append(k)
        L.alive += 1
        L.peak = max(L.peak, L.alive)
        delay = 0.0 if ready_now else L.work.model.startup_s
        if slow_prob > 0 and not ready_now and rng.random() < slow_prob:
            delay *= slow_factor
        if L.g.resources.pool in pinned:  # it starts once it has its devices
            status[k] = live[k] = dataclasses.replace(status[k], state=InstanceState.PENDING)
            seating.append((k, delay))
            seat(now)
        else:
            push(heap, (now + delay, _READY, k))
        if crash_rate > 0:
            push(heap, (now + rng.expovariate(crash_rate), _CRASH, k))

    def seat(now: float) -> None:
        """Launched instances of pools that pin devices take them as the supervisor gives
        them (`InstanceSupervisor._place`: `place_beside_lent`), in launch order; one that
        finds none waits, pending, until an instance leaves or a sleeper's units are lent.
        Its start-up runs from then."""
        waiting = []
        for k, delay in seating:
            if state[k] != STARTING:
                continue  # stopped while it waited
            res = lane_of[k].g.resources
            pool = pinned[res.pool]
            held = [h for j, h in holding.items() if j != k]
            grant = place_beside_lent(
                pool.devices or [],
                pool.units_per_device,
                held,
                res.accelerators,
                res.fractional,
                lent_now,
            )
            if not grant.ok:
                waiting.append((k, delay))
                continue
            holding[k] = DeviceHold(sids[k], grant.devices, grant.units)
            labels = {"devices": ",".join(grant.devices)}
            status[k] = live[k] = dataclasses.replace(
                status[k], state=InstanceState.STARTING, labels=labels
            )
            push(heap, (now + delay, _READY, k))
        seating[:] = waiting

    def devices_free(k: int) -> bool:
        """As `InstanceSupervisor.devices_free_for`: a sleeper wakes where it lives, once no
        other instance holds its devices."""
        me = holding.get(k)
        if me is None:
            return True
        pool = pinned[lane_of[k].g.resources.pool]
        return may_wake(me, pool.units_per_device, list(holding.values()), lent_now)

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

    def start_batch(L: _Lane, r: int, now: float) -> None:
        """`start` for a batching group: the least-loaded instance's server takes `r`."""
        buckets = L.buckets
        for lvl in range(L.low, L.c):
            b = buckets[lvl]
            if b:
                break
        L.low = lvl
        k = next(iter(b))
        b.remove(k)
        inflight[k] = lvl + 1
        if lvl + 1 < L.c:
            buckets[lvl + 1].add(k)
        eng = engines[k]
        assert eng is not None
        eng.offer(r, ptok[r], otok[r], now)
        due_at = eng.next_event_at()
        if due_at != ev_at[k]:
            ev_at[k] = due_at
            if due_at < inf:
                push(heap, (due_at, _SERVER, k))

    def server_event(k: int, now: float) -> None:
        """Instance `k`'s server reaches its next event (its live heap entry: one at
        another time than `ev_at[k]` is stale, superseded by an offer, an event or a clear,
        and skipped by the loop): its finished requests complete."""
        eng = engines[k]
        assert eng is not None
        L = lane_of[k]
        for f in eng.advance(now):
            r = f.req_id
            done[r] = now
            lat = now - arr[r]
            L.lat_log.append(lat)
            x = f.latency_s
            L.served += x
            L.served_sq += x * x
            L.prompt_tokens += ptok[r]
            L.output_tokens += otok[r]
            first = lat - x + f.ttft_s
            ttft[r] = first
            L.ttft_log.append(first)
            if f.tpot_s == f.tpot_s:  # not NaN: more than one token
                tpot[r] = f.tpot_s
                L.tpot_log.append(f.tpot_s)
            L.preempted += f.preemptions
            st = state[k]
            lvl = inflight[k]
            inflight[k] = lvl - 1
            if st == ACTIVE:
                if rotating[k]:
                    if lvl < L.c:
                        L.buckets[lvl].remove(k)
                    L.buckets[lvl - 1].add(k)
                    if lvl - 1 < L.low:
                        L.low = lvl - 1
            elif lvl == 1:  # a draining instance finished its last request
                stop(k, now)
            for w in L.adm.release():
                start_batch(L, w, now)
        due_at = eng.next_event_at()
        if due_at != ev_at[k]:
            ev_at[k] = due_at
            if due_at < inf:
                push(heap, (due_at, _SERVER, k))

    def stop(k: int, now: float, how: int = STOPPED) -> None:
        L = lane_of[k]
        if state[k] == DRAINING:
            L.draining -= 1
        state[k] = how
        stopped[k] = now
        L.alive -= 1
        L.draining_ks.discard(k)
        del live[k]
        rec = awaiting.pop(k, None)
        if rec is not None:
            rec.released(now)
        if holding.pop(k, None) is not None and seating:
            seat(now)  # its devices are free

    def take_out(k: int, now: float) -> None:
        """A ready instance leaves (drain, removal or crash): out of rotation, or out of
        the warm standby, which the next in line then refills (`rotate`)."""
        L = lane_of[k]
        if rotating[k]:
            lvl = inflight[k]
            if lvl < L.c:
                L.buckets[lvl].discard(k)
            L.active.remove(k)
            rotating[k] = False
        else:
            L.spare.remove(k)
        if L.sleepers:
            wake_up(L, k, now)
            L.woken.discard(k)
            L.eps.pop(k, None)
        rotate(L, now)

    def rotate(L: _Lane, now: float, placed: bool = True) -> None:
        """A warm-standby group serves from its oldest ready instances, as many as its count
        in force; the newest stay out of rotation (what the live routing publishes), unless
        the gateway promoted them (requests waited). A group with sleeping standby is placed
        by `place` (or, `placed` False, only routed anew: the gateway's own change). Then
        the gateway's slots follow the instances in rotation."""
        if L.sleepers:
            if placed:
                place(L, now)
            else:
                route(L)
        elif L.warm:
            active, spare, buckets = L.active, L.spare, L.buckets
            if L.promoted_until and len(active) + len(spare) <= L.count:
                L.promoted_until = 0.0  # the count in force took the standby in
            target = len(active) + len(spare) if L.promoted_until else L.count
            while len(active) > target:
                k = active.pop()  # the newest in rotation becomes the oldest spare
                lvl = inflight[k]
                if lvl < L.c:
                    buckets[lvl].discard(k)
                rotating[k] = False
                spare.insert(0, k)
            while len(active) < target and spare:
                k = spare.pop(0)
                active.append(k)
                rotating[k] = True
                if inflight[k] < L.c:
                    buckets[inflight[k]].add(k)
                    L.low = min(L.low, inflight[k])
        go = start if L.batch is None else start_batch
        for r in L.adm.set_slots(len(L.active) * L.c):
            go(L, r, now)

    def place(L: _Lane, now: float) -> None:
        """A group with sleeping standby, placed as the live controller places it
        (`split_standby`: the count in force serves, then warm standby, then sleeping
        places), what the gateway then does with it (`GroupRuntime.configure`: its warm
        standby, what it woke included, is in rotation while promoted; with none the
        promotion ends), and the controller's sleeps and wakes (`Sleepers.act`): an awake
        instance in a sleeping place that serves nothing falls asleep `sleep_s` later
        (never routed meanwhile); an asleep one the serving or warm places need is awake
        `wake_s` after."""
        naps, eps = L.naps, L.eps
        ready = (*L.active, *L.spare)
        for k in ready:
            if k not in eps:
                eps[k] = Endpoint(sids[k], "", 0, L.c, status[k].ready_at or 0.0)
        routed = frozenset(sids[k] for k in L.woken) if L.promoted_until else frozenset()
        split = split_standby(
            [eps[k] for k in ready],
            L.count if L.awake is None else min(L.count, L.awake),
            L.warm_n,
            L.sleepers,
            asleep=frozenset(sids[k] for k in naps),
            routed=routed,
        )
        L.placed = (
            [index[e.instance_id] for e in split.rotation],
            [index[e.instance_id] for e in split.warm],
            [index[e.instance_id] for e in split.sleeping],
        )
        for e in split.to_sleep:
            k = index[e.instance_id]
            if k not in naps and inflight[k] == 0:
                naps[k] = _DOZING
                push(heap, (now + L.sleep_s, _SLEPT, k))
        for e in split.to_wake:
            k = index[e.instance_id]
            if naps.get(k) == _ASLEEP and e.instance_id not in unwoken and devices_free(k):
                wake(L, k, now)
        route(L)

    def route(L: _Lane) -> None:
        """What the gateway routes to (`GroupRuntime.configure`, `_place_standby`): the
        placement's rotation, and while promoted its warm standby with the sleepers the
        gateway woke since (the placement still lists them asleep); with no standby left the
        promotion ends."""
        rot, warm, sleeping = L.placed
        woken = L.woken
        standby = warm + [k for k in sleeping if k in woken] if woken else warm
        L.standby_n = len(standby)
        if not standby:  # the count took it all in: the promotion is over
            L.promoted_until = 0.0
            woken.clear()
        want = rot + standby if L.promoted_until else rot
        keep = set(want)
        buckets, c = L.buckets, L.c
        for k in L.active:
            if k not in keep:
                lvl = inflight[k]
                if lvl < c:
                    buckets[lvl].discard(k)
                rotating[k] = False
        for k in want:
            if not rotating[k]:
                rotating[k] = True
                if inflight[k] < c:
                    buckets[inflight[k]].add(k)
                    L.low = min(L.low, inflight[k])
        L.spare = [k for k in (*L.active, *L.spare) if k not in keep]
        L.active = want

    def wake(L: _Lane, k: int, now: float) -> None:
        """A wake call on asleep instance `k` (the controller's, or the gateway's)."""
        L.slept_s += now - L.asleep_since.pop(k)
        L.naps[k] = _WAKING
        push(heap, (now + L.wake_s, _AWAKE, k))

    def wake_up(L: _Lane, k: int, now: float) -> None:
        """`k` is awake (it woke, or leaves the group): its asleep time is counted."""
        since = L.asleep_since.pop(k, None)
        if since is not None:
            L.slept_s += now - since
        L.naps.pop(k, None)
        L.waking.discard(k)

    def wake_more(L: _Lane, now: float) -> None:
        """Requests wait (or are in flight) beyond what the rotation and the warm standby
        take: the gateway wakes as many asleep instances at once as they need, oldest first
        (`GatewayState._wake_sleeping`)."""
        naps = L.naps
        asleep = [k for k, nap in naps.items() if nap == _ASLEEP and sids[k] not in fence]
        if not asleep:
            return
        asleep.sort(key=lambda k: (status[k].ready_at or 0.0, sids[k]))
        level = L.standby_at
        c = L.c if level is None else level
        over = over_level(L.adm.in_use, L.adm.queue_length, level, len(L.active))
        for k in sleepers_to_wake(over, len(L.waking) * c, ((k, c) for k in asleep)):
            L.waking.add(k)
            L.gateway_wakes += 1
            wake(L, k, now)

    def slept(k: int, now: float) -> None:
        """A sleep call returned: asleep (unless it left the group meanwhile)."""
        L = lane_of[k]
        if state[k] == ACTIVE and L.naps.get(k) == _DOZING:
            L.naps[k] = _ASLEEP
            L.asleep_since[k] = now
            rotate(L, now)

    def awoke(k: int, now: float) -> None:
        """A wake call returned: awake. One the gateway woke joins its warm standby, in
        rotation at once (`GroupRuntime.awake`), and is reported woken while promoted."""
        L = lane_of[k]
        if state[k] != ACTIVE or L.naps.get(k) != _WAKING:
            return
        if k not in L.waking:  # the controller's wake: it places the group again
            wake_up(L, k, now)
            rotate(L, now)
            return
        wake_up(L, k, now)
        L.woken.add(k)
        if not L.promoted_until:  # (`GroupRuntime.awake` promotes: counted as one)
            L.promotions += 1
            L.promoted_until = now + STANDBY_HOLD_S
        rotate(L, now, placed=False)

    def take_standby_in(L: _Lane, now: float) -> None:
        """Requests wait, or are in flight past the standby level, in a group with standby:
        its warm standby joins the rotation and sleepers are woken for what is still over
        (`GatewayState.take_standby_in`)."""
        if L.sleepers:
            if L.standby_n:
                promote(L, now)
            wake_more(L, now)
        elif len(L.active) + len(L.spare) > L.count:
            promote(L, now)

    def promote(L: _Lane, now: float) -> None:
        """A request waits in a warm-standby group: the gateway puts the standby in rotation
        at once and holds it there (as `GroupRuntime.promote`)."""
        promoted = bool(L.promoted_until)
        L.promoted_until = now + STANDBY_HOLD_S
        if not promoted:
            L.promotions += 1
            rotate(L, now, placed=False)

    def demote(L: _Lane, now: float) -> None:
        """The hold is over and nothing waits: the standby leaves the rotation again (as
        `GroupRuntime.demote`, which the gateway's queue timer calls)."""
        if L.promoted_until and now >= L.promoted_until and not L.adm.queue_length:
            L.promoted_until = 0.0
            L.woken.clear()  # placed by now: in the count, or to sleep again
            rotate(L, now, placed=False)

    def kill(k: int, now: float) -> None:
        """Stop at once; in-flight requests fail (their completions are void; a batching
        server's requests fail here)."""
        L = lane_of[k]
        stop(k, now, DEAD)
        eng = engines[k]
        go = start
        if eng is not None:
            go = start_batch
            for r in eng.clear():
                done[r] = FAILED
            ev_at[k] = inf
        for _ in range(inflight[k]):
            for r in L.adm.release():
                go(L, r, now)
        inflight[k] = 0

    def crash(k: int, now: float) -> None:
        """An injected crash: killed in any state it is alive in, then observed failed."""
        st = state[k]
        if st == STARTING:
            lane_of[k].starting.remove(k)
        elif st == ACTIVE:
            take_out(k, now)
        elif st != DRAINING:
            return
        kill(k, now)
        status[k] = dataclasses.replace(
            status[k], state=InstanceState.FAILED, reason="crashed (injected)"
        )
        failed[k] = None

    def drain(k: int, now: float) -> None:
        st = state[k]
        if st == STARTING:  # serves nothing yet: stopped at once
            lane_of[k].starting.remove(k)
            stop(k, now)
        elif st == ACTIVE:
            take_out(k, now)
            state[k] = DRAINING
            lane_of[k].draining += 1
            if engines[k] is not None:
                lane_of[k].draining_ks.add(k)
            live[k] = status[k] = dataclasses.replace(status[k], state=InstanceState.DRAINING)
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

    memory = Memory(  # an active autoscaler's count in force starts at what is ready
        counts={
            L.g.name: max(0, L.initial - standby(L.g))
            for L in lanes
            if L.g.autoscaling is not None and not is_advisory(L.g)
        }
    )
    for name, count in memory.counts.items():
        by_name[name].count = count
    loans: tuple[Loan, ...] = ()
    fence: frozenset[str] = frozenset()
    """sleepers the last tick fenced: no gateway wakes them (`TickDecision.fence`)"""
    unwoken: frozenset[str] = frozenset()
    """fenced sleepers the count needs, left asleep until quota grants their units back"""
    book = Ledger(epoch)
    tiers: Mapping[str, str] = {}
    last_tick = 0.0
    ticks = 0

    def keep(alloc: Allocation, now: float) -> None:
        """What follows from a round (`LiveQuota.record`): the ledger and the reclaims,
        and each refusal counted once while it lasts."""
        for rec in book.keep(alloc, memory.quota.loans, now):
            for sid in rec.instances:
                awaiting[index[sid]] = rec
        for L in lanes:
            why = alloc.refusals.get(L.g.name)
            if why is not None and why != L.refused:
                L.refusals += 1
                if why not in L.reasons and len(L.reasons) < _REASONS:
                    L.reasons.append(why)
            L.refused = why

    def tiers_after(L: _Lane, own_units: int) -> tuple[int, int]:
        """(stable, burst) of the group's running instances after the tick's actions, by
        the tier the tick told each (one launched this tick has none). With all of its
        instances on one side of its guarantee every one has that tier (`tick._tier`):
        counted without asking the tiers one instance at a time."""
        own = own_units // L.g.resources.accelerators
        if own <= 0 or own >= L.before:
            told = len(L.starting) + len(L.active) + len(L.spare) - (L.seq - L.seq_before)
            return (told, 0) if own > 0 else (0, told)
        seen = [tiers.get(sids[k]) for k in (*L.starting, *L.active, *L.spare)]
        return seen.count(STABLE), seen.count(BURST)

    def tick(now: float, arrived: int) -> bool:
        """One controller tick at `now`; True when the run is over."""
        nonlocal memory, loans, tiers, last_tick, ticks, fence, unwoken, lent_now
        at = epoch + now
        dt = now - last_tick
        last_tick = now
        for L in lanes:
            for x in L.adm.expire(now):
                done[x] = REJECTED
                L.expired += 1
            L.unit_s += L.units_now * dt
            if L.promoted_until:
                demote(L, now)
        for loan in loans:
            by_name[loan.borrower].borrowed_s += loan.units * dt
            if loan.lender is not None:
                by_name[loan.lender].lent_s += loan.units * dt
        loads = {
            name: by_name[name].load(at, bisect_left(by_name[name].positions, arrived), now)
            for name in due(memory, compiled, at)
        }
        for L in lanes:  # what the tiers are told of (`_tiers_after`)
            L.before = len(L.starting) + len(L.active) + len(L.spare)
            L.seq_before = L.seq
        observed = list(live.values())
        if failed:
            observed += [status[k] for k in failed]
        for name, (since, until) in o.rollouts.items():
            if not since <= now < until:
                floors.pop(name, None)
            elif name not in floors:
                floors[name] = by_name[name].count
        asleep = frozenset(  # as `Sleepers.asleep`: from the sleep's end to the wake's
            sids[k] for L in sleepy for k, nap in L.naps.items() if nap != _DOZING
        )
        # fenced: the last tick's fence, published to the one gateway at once (live, once
        # every gateway serves it: `Sleepers.fenced`)
        world = World(
            compiled, observed, loads, floors=floors, asleep=asleep, fenced=fence & asleep
        )
        d, after = step(memory, world, at)
        lent_now = world.fenced & d.fence  # as the controller's `_lending`
        fence, unwoken = d.fence, d.unwoken
        for L in fast:
            L.standby_at = after.standby_at.get(L.g.name)
            L.awake = after.awake.get(L.g.name)
        alloc = d.allocation.enforced
        keep(alloc, now)
        memory = after
        for name, count in d.counts.items():
            by_name[name].count = count
            by_name[name].scale_events += 1
            if by_name[name].warm:
                rotate(by_name[name], now)
        for s in d.scaled:
            if s.advisory:
                continue
            L = by_name[s.group.name]
            if s.guards:
                L.clipped.update(s.guards)
            if s.count != s.actual:
                if len(L.decisions) >= o.decision_log:
                    continue
            elif len(L.rows) % _SAMPLE_EVERY or L.sampled >= _SAMPLES:
                continue
            else:
                L.sampled += 1  # a bounded sample of the steady decisions too
            shown = dataclasses.replace(
                s.decision, desired=s.count, clipped_by=s.guards, reason=s.reason
            )
            L.decisions.append(decision_entry(now, s.load, shown, s.actual))
        for a in d.actions:
            if isinstance(a, Launch):
                launch(by_name[a.group], now, a.template)
                continue
            k = index.get(a.instance_id)
            if k is None:
                continue
            if k in failed:  # a crashed one, removed
                del failed[k]
            elif state[k] >= STOPPED or (isinstance(a, Drain) and state[k] == DRAINING):
                continue
            L = lane_of[k]
            if len(L.stops) < o.decision_log:  # the tier decided (reclaimed: last tick's)
                tier = d.tiers.get(a.instance_id, tiers.get(a.instance_id))
                how = "drain" if isinstance(a, Drain) else "remove"
                stop_row = {"t": now, "instance": a.instance_id, "action": how, "tier": tier}
                L.stops.append({**stop_row, "reason": a.reason})
            if state[k] < STOPPED:
                (drain if isinstance(a, Drain) else remove)(k, now)
        if seating:  # a sleeper's units lent since: its devices may seat a launch
            seat(now)
        for L in lanes:
            if L.sleepers:  # the controller re-places them every tick (`_publish_routing`)
                rotate(L, now)
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
            adm = L.adm
            busy = busy or adm.in_use > 0 or adm.queue_length > 0
            ready = len(L.active) + len(L.spare)
            running = len(L.starting) + ready
            row: tuple[float, ...] = (now, bisect_left(L.positions, arrived), running)
            row += (ready, L.count)
            row += (adm.queue_length, adm.in_use, L.draining, L.alive)
            if L.batch is None:
                row += (0, math.nan)
            else:
                row += (L.server_waiting(now), L.kv_usage(now))
            row += (*tiers_after(L, alloc.grants[name].own_units), borrowed.get(name, 0))
            L.rows.append((*row, lent.get(name, 0), L.units_now))
        ticks += 1
        if o.end_s is not None:
            return now >= o.end_s
        return arrived >= n and not busy

    now = 0.0
    i = 0
    starts = [start if L.batch is None else start_batch for L in lanes]
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
                    if rotating[k]:
                        if lvl < L.c:
                            L.buckets[lvl].remove(k)
                        L.buckets[lvl - 1].add(k)
                elif lvl == 1:  # a draining instance finished its last request
                    stop(k, now)
                woken = L.adm.release()
                if woken:
                    for w in woken:
                        start(L, w, now)
            elif k == _SERVER:  # a batching server's event (unless superseded since)
                if now == ev_at[r]:
                    server_event(r, now)
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
                    L.low = 0
                    rotating[r] = True
                    live[r] = status[r] = dataclasses.replace(
                        status[r], state=InstanceState.READY, ready_at=epoch + now
                    )
                    rotate(L, now)
            elif k == _CRASH:
                crash(r, now)
            elif k == _SLEPT:
                slept(r, now)
            elif k == _AWAKE:
                awoke(r, now)
            elif state[r] == DRAINING:  # a drain that outlived drain_timeout_s
                kill(r, now)
            continue
        # an arrival
        r = i
        i += 1
        gi = grp[r]
        if tries[gi]():
            L = lanes[gi]
            starts[gi](L, r, ta)
            at = L.standby_at
            if (
                at is not None
                and over_level(L.adm.in_use, L.adm.queue_length, at, len(L.active)) > 0
            ):
                take_standby_in(L, ta)
        else:
            if shared:
                res, evicted = offers[gi](r, prio[r], ta, tenant_of[r], cost[r], weight[r])
            else:
                res, evicted = offers[gi](r, prio[r], ta)
            if res is shed_offer:
                done[r] = REJECTED
                lanes[gi].shed += 1
            else:
                L = lanes[gi]
                if L.warm:  # `GatewayState.watch_queue`
                    take_standby_in(L, ta)
            if evicted is not None:
                done[evicted] = REJECTED

    for k in live:
        stopped[k] = now
    for L in lanes:
        for since in L.asleep_since.values():
            L.slept_s += now - since
    held_s = np.asarray(stopped) - np.asarray(launched)
    owner = np.asarray([L.gi for L in lane_of], dtype=np.int64)
    done_all = np.asarray(done, dtype=np.float64)
    ttft_all = np.asarray(ttft, dtype=np.float64)
    tpot_all = np.asarray(tpot, dtype=np.float64)
    groups: dict[str, FleetGroup] = {}
    for L in lanes:
        tl = np.asarray(L.rows, dtype=np.float64).reshape(-1, len(FLEET_COLUMNS))
        base = len(SimResult.TIMELINE_COLUMNS)
        mine = np.asarray(L.positions, dtype=np.int64)
        extra: dict[str, Any] = {"clipped_decisions": dict(sorted(L.clipped.items()))}
        if L.batch is not None:
            extra["preemptions"] = L.preempted
        if L.warm or L.sleepers:  # the fast tier at work, as a live gateway counts it
            extra["standby_promotions"] = L.promotions
            extra["standby_wakes"] = L.gateway_wakes
        sim = SimResult(
            policy=p.name if (p := compiled.policies.get(L.g.name)) else "fixed",
            workload=L.work,
            done=done_all[mine],
            timeline=np.ascontiguousarray(tl[:, :base]),
            decisions=L.decisions,
            instance_seconds=float(held_s[owner == L.gi].sum()),
            scale_events=L.scale_events,
            peak_instances=L.peak,
            shed=L.shed,
            expired=L.expired,
            end_s=now,
            initial_instances=L.initial,
            extra=extra,
            ttft_s=ttft_all[mine] if L.batch is not None else None,
            tpot_s=tpot_all[mine] if L.batch is not None else None,
            sleeping_standby=L.sleepers,
            sleeping_seconds=L.slept_s,
            sleeping_ratio=L.ratio,
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
