"""The Sluice autoscaler: instances sized from a queueing model of the work, several signals
combined, up fast, down careful, lead-time aware, every decision explained (S4-S9, S11).

The traffic is read by `TrafficWindows` (traffic.py): the arrival rate over
`targets.window_s` and, for sizing, over the last `targets.rate_arrivals` arrivals unless
the short window shows a real change (3 standard errors); the service time's mean and
variability over the last `targets.service_completions` completions (from the gateway's
served seconds, else by Little's law); the local dispersion of the arrivals; the work that
arrived over each recent span. The objective is the group's `slo` (slowdown + slack, a fixed
`latency_ms`, or both; a request may wait about its own service time plus 1 s when none is
stated), at its `target`.

Signals (each proposes an instance count; `lead` = `lead_time_s`, else the measured
`startup_s`, S7):
- steady (the model, `queueing.steady_slots`): the slots that keep the share of requests
  waiting past their allowance under `targets.slo_budget_share` of the error budget at the
  offered load (rate x mean service), with the measured service variability and arrival
  dispersion (G/G/c). The rate is projected `lead` seconds ahead along its least-squares
  trend over `targets.trend_window_s` when the slope stands 4 standard errors clear of zero
  (capacity asked now serves the rate at ready time);
- envelope (the model, `queueing.burst_slots`): for T = 1, 2, 4, ... s up to two lead
  times, the work that arrived in the last T must be served within T + the mean request's
  wait allowance: a burst's size, read from the trace, not assumed;
- concurrency: mean of `in_flight + queued` over `targets.window_s` at `utilization` x slots
  per instance (1 by default: what is busy now is a floor, the model sizes), the queued part
  counted only up to `backlog_at_ready` and spread over the lead time;
- queue: above `queue_per_instance` per ready instance, and only if a backlog remains at
  ready time, `backlog_at_ready = queued + (rate - ready x slots / service) x lead`: a queue
  the ready instances drain before new ones could start needs none (knative/serving#13284);
- latency: p95 against `targets.latency_p95_ms` (else the group's `slo.latency_ms`);
- ttft, tpot (generative groups, issue 36): the p95 of streamed answers' time to first token
  (the gateway's, queue included) and time per output token against `targets.ttft_p95_ms`
  and `targets.tpot_p95_ms`, weighed as latency is (below), sized from the ready instances;
- kv_cache: the servers' mean KV-cache use against `targets.kv_cache_usage` (vLLM, SGLang,
  llama.cpp export it): a leading signal, a load proposal of its own once over target;
- panic: arrivals over `panic.window_s` x service; at `threshold` x current capacity it
  enters burst mode.
The model's needs stay silent until the service time is known (40 completions).

A request waiting inside an instance's own server (`server_waiting`, scraped from a
command server's metrics) counts as queued, not in flight: it waits for a batch slot.

Combination rule (S4): the count is the max of the load proposals (steady, envelope,
concurrency, queue, and panic while panicking), then
- a scale-up needs evidence beyond one metric: when a latency target is known and p95 is
  well under it (< 80 %) and the queue is under its target, no load signal alone scales up
  (instances are busy but serve in time); a queue always counts (people wait);
- latency over target adds `ceil(current x min(p95/target, 2))` only while instances are
  busy (concurrency near target, a queue, or more than `queue_per_instance` requests per
  ready instance waiting inside the servers: a batching server bound by prefill or its KV
  cache is busy far under its gateway slots): high latency on idle instances is a
  bottleneck elsewhere (S12), more instances would not help; ttft and tpot are latency
  targets too (any over target is evidence, all well under is the S4 veto);
- a scale-down needs latency under target (or unknown) and fresh data;
- deadband: concurrency or the envelope within `tolerance` above capacity does not scale
  up (the steady need reads a long window and has its margin); a scale-down goes only to a
  count that would still hold `tolerance` more load (hysteresis in load, not in instances).

Guards, in order: up-stabilization (rolling min), down-stabilization (rolling max of
recommendations, HPA style: the policy's memory of bursts), panic (max(stable, panic),
never down while panicking, and the panic counts stay in the rolling max so leaving panic
does not collapse the count: knative/serving#3153, #9121), cooldown (no scale-down within
`down.cooldown_s` of a scale-up), step limits per period (the larger of `max_step` and
`max_percent`, at least 1), the 1 -> 0 rule (`down.to_zero_delay_s` of no arrival, nothing
running or queued; that idle time is the last instance's only wait), then floors (`min`,
`stable` pool, scheduled floors: hard, they bypass step limits) and `max`. From zero, any
arrival or queued request asks for >= 1 at once. Missing or stale metrics hold the count.

Why the defaults. The sizing has no trace-shaped constant: the model reads the rate,
service time, variability, dispersion and burst shape from the traffic, and the objective
from the spec. What is left are estimator windows and guards, each set by what it
estimates, and checked by `bench/autoscale.py` on every shared trace and every generated
family (`sluice.sim.families`) with leave-one-out (bench/README.md has the tables):
- `rate_arrivals` 1600 (within the 300 s memory: the steady rate to +-2.5 % where the
  memory holds that many), `service_completions` 1000 (+-3 % at cs2 0.7): estimator noise
  is what the rolling max turns into cost, at any rate; the 3-sigma change test keeps the
  response to a real change within one window;
- `slo_budget_share` 0.5: half the error budget for steady-state queueing, half for the
  transitions the model does not see;
- tolerance 0.05: half the upstream HPA deadband; the steady need is smooth enough;
- these three are the pick of the leave-one-out grid in `bench/_autoscale_loo.py` (on 15
  of its 16 folds; the Azure fold picks share 1.0); held out, every trace scores within
  0.019 of SLO attainment (the Azure fold) and 5 % of cost of them;
- window 30 s (about one start-up), trend window 60 s with a 4-standard-error test (at 14
  req/s Poisson noise clears it in ~3e-5 of windows; 3 SE and 2.5 SE cost 2-13 % more on
  the stationary families for one fewer miss on a ramp);
- up: no stabilization, no step limit: under-provisioning costs SLO, over-shoot only cost;
- down: rolling max 300 s (HPA's default) is the memory that keeps a burst's capacity
  resident for the next one; cooldown 120 s (4 start-ups); 1 instance or 25 % per 30 s (a
  ladder, not a cliff, after a burst, knative/serving#3153); to zero after 300 s idle.
What the defaults do not reach, and why, is in bench/README.md (autoscale section).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from sluice.core.frozen import fast_init
from sluice.policy.autoscale.base import Decision, GroupLoad, TokenLoad
from sluice.policy.autoscale.batching import BatchingServer, ServerCapacity, batching_capacity
from sluice.policy.autoscale.queueing import (
    Objective,
    burst_slots,
    steady_slots,
    wait_allowance_s,
)
from sluice.policy.autoscale.reasons import lead_sentence
from sluice.policy.autoscale.schedule import Firings, ScheduleFloors
from sluice.policy.autoscale.traffic import TrafficWindows
from sluice.policy.autoscale.windows import RollingExtreme
from sluice.spec.autoscaling import AutoscalingSpec, SloSpec

__all__ = ["SluiceMemory", "SluicePolicy", "TokenMemory"]

_LATENCY_OK: Final = 0.8
"""p95 under this share of its target counts as 'well under' (S4 veto)"""
_TREND_SIGMAS: Final = 4.0
"""a slope must stand this many standard errors clear of zero to be projected"""
_EPS: Final = 1e-9
_LENGTH_REQUESTS: Final = 4000
"""the mean prompt and output lengths are read over the policy's memory span
(`down.stabilization_s`, where the steady rate is) and at least this many requests: the
mean of a length whose coefficient of variation is 2 (Azure code's output lengths: 2.15)
to +-3 % (one standard error). Noise in the means is what the rolling max turns into cost:
over the memory span alone (300 s, ~700 requests) the Azure code trace cost 7 % more
instance-seconds for the same SLO attainment (0.951); from 3,000 requests on it decides as
the mean since the start did"""
_LENGTH_MAX_S: Final = 3600.0
"""...and never further back than this (a slow group's recent mix)"""
_LENGTH_STEP_S: Final = 30.0
"""a snapshot of the token counts this often: at most 120 a group"""
_CALLER_TARGETS = (
    ("latency", "p95_ms", "p95_target_ms"),
    ("ttft", "ttft_p95_ms", "ttft_target_ms"),
    ("tpot", "tpot_p95_ms", "tpot_target_ms"),
)
"""each caller-facing p95 target: its proposal's name, its value's and its target's in the
decision's signals"""
_LABEL = {"latency": "p95", "ttft": "ttft p95", "tpot": "tpot p95"}
"""how a decision's notes name each of them"""
DEFAULT_SLO = SloSpec(slowdown=2.0, slack_s=1.0, target=0.99)
"""the objective sized for when a group states none: a request may wait about its own
service time plus a second, 99 % of the time"""


_EXACT: Final = 1e15
"""`_rounded` decides where x * 10 ** digits is below this (integers < 2 ** 53 are exact)"""
_HALF_ERROR: Final = 2.0**-52
"""`x * 10 ** digits` is within this share of the exact product (twice its bound, 2 ** -53)"""


def _rounded(x: float, digits: int) -> float:
    """`round(x, digits)` bit for bit (signals are shown rounded), at a fifth of its cost:
    the builtin writes and parses a decimal string (~3.3k instructions, this ~630 compiled;
    15 signals a step, 500 steps a tick: 8.6 % of bench/decide.py's compiled kernel, by
    callgrind). Here the product x * 10 ** digits is rounded to the nearest integer n, then
    n / 10 ** digits: IEEE division is correctly rounded, as the builtin's parse of the
    string 'nE-digits' is. Where the product lies within its float error of a half (the
    builtin's half-even tie, or too close to tell), or is huge, infinite or NaN, the
    builtin decides."""
    scale = 10.0**digits  # exact
    y = x * scale
    if -_EXACT < y < _EXACT:
        whole = math.floor(y)
        frac = y - whole  # exact: y's bits below the point
        if abs(frac - 0.5) > abs(y) * _HALF_ERROR:
            n = whole + 1 if frac > 0.5 else whole
            return n / scale if n else math.copysign(0.0, x)  # -0.0 as the builtin's
    return round(x, digits)


def _need(demand: float, per_instance: float) -> int:
    """Instances needed for `demand` at `per_instance` each (ceil, float noise tolerant)."""
    n = math.ceil(demand / per_instance - _EPS)
    return n if n > 0 else 0  # max(0, n) without the call: five needs a step


def _waiting_is_queued(load: GroupLoad) -> GroupLoad:
    """Move the requests waiting inside the servers from `in_flight` to `queued`: the queue
    signal then sees them, and Little's law does not take their wait for service time."""
    waiting = min(load.server_waiting, load.in_flight)
    if waiting <= 0:
        return load
    return replace(load, in_flight=load.in_flight - waiting, queued=load.queued + waiting)


@fast_init
@dataclass(frozen=True, slots=True)
class SluiceMemory:
    """What `SluicePolicy` remembers between ticks (a frozen value; `step` returns the next)."""

    traffic: TrafficWindows
    down_max: RollingExtreme[int]
    """rolling max of the recommendations over `down.stabilization_s`"""
    up_min: RollingExtreme[int]
    """rolling min of the recommendations over `up.stabilization_s`"""
    ups: tuple[tuple[float, int], ...] = ()
    """(t, instances added) within the longest step-limit period"""
    downs: tuple[tuple[float, int], ...] = ()
    """(t, instances removed) within the longest step-limit period"""
    last_up_at: float | None = None
    """when the count last went up (the cooldown's clock)"""
    last_out: int | None = None
    """the count the last decision asked for"""
    seeded: bool = False
    """the first sample's count is in `down_max`"""
    panic_over_at: float | None = None
    """when the burst last stood over the panic threshold; None: not panicking"""
    panic_max: int = 0
    """the highest count asked while panicking"""
    schedule: Firings = ()
    """the scheduled floors' cached firings (`ScheduleFloors.floor_in`)"""


_HELD_OTHERWISE = frozenset({"panic", "cooldown"})
"""guards that keep a count the rolling max does not: none of it is held asleep (`_awake`)"""

LengthSnapshot = tuple[float, int, int, int]
"""(t, requests, prompt tokens, output tokens): a `TokenLoad`'s cumulative token counts"""


@fast_init
@dataclass(frozen=True, slots=True)
class TokenMemory(SluiceMemory):
    """A `SluiceMemory` with snapshots of the token counts, for a group sized on its
    batching server's capacity (`SluicePolicy._lengths`): a subclass, so that the memory of
    every other group stays the value it was."""

    lengths: tuple[LengthSnapshot, ...] = ()
    """oldest first, one every `_LENGTH_STEP_S`, the oldest where the window starts"""


class SluicePolicy:
    """Sluice's multi-signal policy: configuration only (its memory is a `SluiceMemory`
    value, see `ScalingPolicy`). Reads every `GroupLoad` field except `draining`.

    `latency_target_ms` stands in when `spec.targets.latency_p95_ms` is unset (the factory
    passes the group's `slo.latency_ms`); `held_after_s` for `spec.sleep_held_after_s` (the
    factory's `held_window`). `now` and `load.at` in seconds.
    """

    name = "sluice"

    def __init__(
        self,
        spec: AutoscalingSpec,
        schedules: ScheduleFloors | None = None,
        latency_target_ms: float | None = None,
        slo: SloSpec | None = None,
        server: BatchingServer | None = None,
        server_from: str | None = None,
        held_after_s: float | None = None,
    ) -> None:
        self.spec = spec
        self.server = server
        """the group's batching server model (declared or fitted): sizes the group on its
        capacity at the SLO instead of its slots; None: slots (`_capacity`)"""
        self.server_from = server_from
        """where `server` came from (e.g. 'load test #12 (v3)'), said in the sizing note"""
        self._capacities: dict[tuple[float, float], ServerCapacity] = {}
        """a cache of `batching_capacity` by mean lengths (3 significant digits): a pure
        function's answers, not memory"""
        self.slo = slo if slo is not None else DEFAULT_SLO
        self.schedules = schedules if schedules is not None else ScheduleFloors()
        self.latency_target_ms = spec.targets.latency_p95_ms or latency_target_ms
        t = spec.targets
        self._caller_targets = tuple(
            names
            for names, target in zip(
                _CALLER_TARGETS, (self.latency_target_ms, t.ttft_p95_ms, t.tpot_p95_ms), strict=True
            )
            if target is not None
        )
        """the caller-facing p95 targets this group states, as (proposal, value, target) names
        in `signals`: what `_combine` weighs as latency evidence"""
        self._step_horizon = max(spec.up.period_s, spec.down.period_s)
        # what every step reads of the spec and the objective, worked out once (the same
        # expressions, so the same floats): 500 groups step every tick
        floor, by = spec.min, "min"
        if spec.stable > floor:
            floor, by = spec.stable, "stable"
        self._floor_fixed = (min(floor, spec.max), by)
        """the floor without schedules: (`min` or `stable`, its name), within `max`"""
        self._miss = (1.0 - self.slo.target) * t.slo_budget_share
        """the share of requests the steady need lets wait past their allowance"""
        self._waits = (self.slo.slowdown, self.slo.slack_s, self.slo.latency_ms)
        """the objective's terms `Objective.of` and `wait_allowance_s` take"""
        if held_after_s is None:
            held_after_s = spec.sleep_held_after_s if spec.sleeping_standby else 0.0
        self._held_after_s = held_after_s
        """a group with sleeping standby keeps asleep what the rolling max holds beyond what
        this many seconds asked for (`_awake`); 0.0: all of it serves"""
        # the bounds a batching group's capacity is sized at: the SLO's TTFT / TPOT at its
        # target, else the TTFT / TPOT p95 targets at 0.95
        if self.slo.ttft_ms is not None or self.slo.tpot_ms is not None:
            ttft_ms, tpot_ms, q = self.slo.ttft_ms, self.slo.tpot_ms, self.slo.target
        else:
            ttft_ms, tpot_ms, q = t.ttft_p95_ms, t.tpot_p95_ms, 0.95
        self._bounds = (
            None if ttft_ms is None else ttft_ms / 1000.0,
            None if tpot_ms is None else tpot_ms / 1000.0,
            q,
        )

    def initial(self) -> SluiceMemory:
        """The memory before the first sample: empty windows, nothing asked yet."""
        spec = self.spec
        return SluiceMemory(
            TrafficWindows.start(spec),
            RollingExtreme(spec.down.stabilization_s),
            RollingExtreme(spec.up.stabilization_s, largest=False),
            schedule=self.schedules.initial(),
        )

    # -- the tick --------------------------------------------------------------------------

    def step(
        self, memory: SluiceMemory, load: GroupLoad, now: float
    ) -> tuple[Decision, SluiceMemory]:
        """Desired instances at `now` (seconds) from one sample, and the next memory; see the
        module docstring. `memory` is not changed."""
        spec = self.spec
        m = memory
        if self.schedules:
            floor, floor_by, schedule = self._floor(now, m.schedule)
        else:  # `_floor` without schedules: the spec's, the same every tick
            (floor, floor_by), schedule = self._floor_fixed, m.schedule
        current = load.current
        down_max = m.down_max
        if not m.seeded:  # the starting count is the first recommendation: a new (or
            # restarted) group is not shrunk before the window has seen load
            down_max = down_max.add(now, current)
        if not load.fresh or now - load.at > spec.metrics_max_age_s:
            decision = self._hold_missing(load, now, floor, floor_by, m.last_out)
            ups, downs, last_up_at, last_out = self._commit(now, current, decision.desired, m)
            return decision, replace(  # the rest as it was (a `TokenMemory`'s lengths too)
                m,
                down_max=down_max,
                ups=ups,
                downs=downs,
                last_up_at=last_up_at,
                last_out=last_out,
                seeded=True,
                schedule=schedule,
            )
        if load.server_waiting:
            load = _waiting_is_queued(load)
        lead = self._lead(load)
        # the longest burst span, max(window, 2 x lead): beyond two lead times the steady
        # need sees a surge in time to act on it
        horizon = 2.0 * lead
        if not horizon > spec.targets.window_s:
            horizon = spec.targets.window_s
        arrived, traffic = m.traffic.observe(load, now, horizon)
        lengths: tuple[LengthSnapshot, ...] | None = None
        means = None
        if self.server is not None and isinstance(load, TokenLoad):
            means, lengths = self._lengths(load, now, m)
        elif isinstance(m, TokenMemory):  # a sample without token counts: keep the snapshots
            lengths = m.lengths
        signals, proposals, traffic, sizing = self._signals(load, now, traffic, lead, means)
        panic_over_at, panic_max = self._update_panic(load, signals, m.panic_over_at, m.panic_max)
        rec, winner, top, notes, panic_max = self._combine(
            load, signals, proposals, panic_over_at is not None, panic_max
        )
        if load.server_waiting:
            notes.append(f"{load.server_waiting} requests wait inside the servers")
        if sizing is not None:
            notes.append(sizing)
        cold = current == 0 and (arrived > 0 or load.queued > 0 or load.in_flight > 0)
        active_at = traffic.active_at
        idle = now - active_at if active_at is not None else math.inf
        desired, clipped, up_min, down_max = self._guard(
            load, now, rec, cold, notes, idle, panic_over_at is not None, m, m.up_min, down_max
        )
        if cold and desired < 1:
            desired = 1
        if desired < floor:
            desired, winner = floor, floor_by
            clipped.append(floor_by)
            notes.append(f"floor {floor_by} {floor}")
        if desired > spec.max:
            desired = spec.max
            clipped.append("max")
            notes.append(f"max {spec.max}")
        if cold:
            notes.append("cold start: scale from zero at once")
        awake = None
        if self._held_after_s and "stabilization" in clipped and not _HELD_OTHERWISE & set(clipped):
            awake = self._awake(desired, floor, down_max, now, notes)
        ups, downs, last_up_at, last_out = self._commit(now, current, desired, m)
        fallback = f"{winner} -> {rec}" if winner else f"hold {rec}"
        opening = lead_sentence(top, signals, proposals, fallback)
        decision = Decision(  # by position, as the fields are declared (every group, every tick)
            desired,  # desired
            "; ".join([opening, *notes]) if notes else opening,  # reason
            signals,
            proposals,
            winner,
            tuple(clipped),  # clipped_by
            rec if rec != desired else None,  # unclipped
            awake,
        )
        carried = (  # a `SluiceMemory`'s fields, by position, as declared
            traffic,
            down_max,
            up_min,
            ups,
            downs,
            last_up_at,
            last_out,
            True,  # seeded
            panic_over_at,
            panic_max,
            schedule,
        )
        if lengths is not None:
            return decision, TokenMemory(*carried, lengths)
        return decision, SluiceMemory(*carried)

    # -- steps -----------------------------------------------------------------------------

    def _awake(
        self, desired: int, floor: int, down_max: RollingExtreme[int], now: float, notes: list[str]
    ) -> int | None:
        """Of `desired`, which the rolling max holds, the instances that serve: the most the
        last `sleep_held_after_s` asked for (at least the floor, and one); the rest is kept
        asleep, for the gateways to wake when the burst returns (`Decision.awake`). None:
        all of them serve. (Only the rolling max's: a count that a cooldown, a step limit or
        panic holds is one the burst may still need.)"""
        recent = down_max.extreme_since(now - self._held_after_s)
        if recent is None:
            return None
        awake = max(recent, floor, 1)
        if awake >= desired:
            return None
        notes.append(
            f"{desired - awake} held asleep: the last {self._held_after_s:g}s asked for {recent}"
        )
        return awake

    def _floor(self, now: float, schedule: Firings) -> tuple[int, str, Firings]:
        spec = self.spec
        floor, by = spec.min, "min"
        if spec.stable > floor:
            floor, by = spec.stable, "stable"
        if self.schedules:
            sched, label, schedule = self.schedules.floor_in(now, schedule)
            if sched > floor and label is not None:
                floor, by = sched, label
        return min(floor, spec.max), by, schedule

    def _hold_missing(
        self, load: GroupLoad, now: float, floor: int, by: str, last_out: int | None
    ) -> Decision:
        """Stale or missing metrics are not zero load: keep the count, floors still hold."""
        keep = load.current if last_out is None else max(load.current, last_out)
        desired = min(max(keep, floor), self.spec.max)
        clipped = (by,) if desired > keep else ()
        age = now - load.at
        return Decision(
            desired=desired,
            reason=f"metrics missing (fresh={load.fresh}, age {age:.0f}s): hold {desired}",
            winner=by if clipped else None,
            clipped_by=clipped,
            unclipped=keep if desired != keep else None,
        )

    def _lead(self, load: GroupLoad) -> float:
        return self.spec.lead_time_s if self.spec.lead_time_s is not None else load.startup_s

    def _lengths(
        self, load: TokenLoad, now: float, m: SluiceMemory
    ) -> tuple[tuple[int, int, int], tuple[LengthSnapshot, ...]]:
        """The token counts (requests, prompt, output) of the requests counted over the
        memory span and at least `_LENGTH_REQUESTS` requests, at most `_LENGTH_MAX_S` back:
        `load`'s less the oldest snapshot's, where that window counted any; else `load`'s,
        cumulative (the first tick; a quiet hour; the counts went back: a gateway
        restarted). And the next snapshots."""
        snaps = m.lengths if isinstance(m, TokenMemory) else ()
        n, p, o = load.token_requests, load.prompt_tokens, load.output_tokens
        if snaps and n < snaps[-1][1]:  # the counts went back: a new start
            snaps = ()
        cutoff, oldest = now - self.spec.down.stabilization_s, now - _LENGTH_MAX_S
        k = 0
        while k + 1 < len(snaps) and (  # the next one still starts a window long enough
            snaps[k + 1][0] <= oldest
            or (snaps[k + 1][0] <= cutoff and n - snaps[k + 1][1] >= _LENGTH_REQUESTS)
        ):
            k += 1
        if k:
            snaps = snaps[k:]
        means = (n, p, o)
        if snaps:
            _, n0, p0, o0 = snaps[0]
            if n > n0:
                means = (n - n0, p - p0, o - o0)
        if not snaps or now - snaps[-1][0] >= _LENGTH_STEP_S:
            snaps = (*snaps, (now, n, p, o))
        return means, snaps

    def _capacity(self, counts: tuple[int, int, int] | None) -> ServerCapacity | None:
        """The batching server's capacity at the SLO at the mean lengths of the requests
        `counts` counts, (requests, prompt tokens, output tokens) (`batching_capacity`);
        None without a server model or requests counted."""
        if self.server is None or counts is None or counts[0] <= 0:
            return None
        n, prompt_tokens, output_tokens = counts
        prompt = float(f"{max(prompt_tokens / n, 0.0):.3g}")
        output = float(f"{max(output_tokens / n, 1.0):.3g}")
        key = (prompt, output)
        cap = self._capacities.get(key)
        if cap is None:
            if len(self._capacities) >= 4096:
                self._capacities.clear()
            ttft_s, tpot_s, q = self._bounds
            cap = batching_capacity(self.server, prompt, output, ttft_s, tpot_s, q)
            self._capacities[key] = cap
        return cap

    def _signals(
        self,
        load: GroupLoad,
        now: float,
        traffic: TrafficWindows,
        lead: float,
        lengths: tuple[int, int, int] | None = None,
    ) -> tuple[dict[str, float], dict[str, int], TrafficWindows, str | None]:
        """The signals and each one's proposal, the windows once read (`settle`), and a
        note when a batching group is sized on its capacity at the SLO at the mean lengths
        of `lengths`' (requests, prompt, output tokens; `_lengths`) (`_capacity`): its
        slots per instance are then that capacity x the measured service time, the
        concurrency the instance holds at that rate by Little's law, where it is under
        `max_concurrency`; `lead` is `_lead(load)`."""
        t = self.spec.targets
        rate, span, burst_rate = traffic.rates()
        measured = traffic.service()
        service, service_cv2 = measured if measured is not None else (None, 1.0)
        slots = float(load.slots_per_instance)
        sizing = None
        cap = self._capacity(lengths) if service is not None else None
        if cap is not None and service is not None:
            if cap.rps > 0 and cap.rps * service < slots:
                slots = cap.rps * service
                source = f", server from {self.server_from}" if self.server_from else ""
                sizing = (
                    f"batching capacity {cap.rps:.3g} req/s per instance ({cap.limit} "
                    f"bound{source}) x service {service:.3g}s = {slots:.3g} slots per "
                    f"instance, not {load.slots_per_instance}"
                )
            elif cap.rps <= 0:
                sizing = "batching capacity: the mean request misses its bounds alone; slots"
        target = t.utilization * slots
        ready = load.ready if load.ready >= 1 else 1  # max(load.ready, 1) without the call
        in_flight, queue_w = traffic.busy(now)
        conc = in_flight + queue_w
        # smoothed, but a queue that has drained by now no longer counts
        queue = min(traffic.queue(now), float(load.queued))
        signals: dict[str, float] = {
            "concurrency": _rounded(conc, 3),
            "target_per_instance": target,
            "slots_per_instance": float(slots),
            "queue": _rounded(queue, 3),
            "queue_per_instance": _rounded(queue / ready, 3),
            "lead_s": lead,
        }
        if load.server_waiting:
            signals["server_queue"] = float(load.server_waiting)
        if cap is not None:
            signals["capacity_rps"] = _rounded(cap.rps, 3)
            signals["capacity_batch"] = _rounded(cap.batch, 1)
        proposals: dict[str, int] = {}
        # the backlog still waiting when instances asked for now are ready (S7): a queue
        # the ready instances drain within the lead time needs no new instance; its work
        # (requests x service) is spread over the lead time, the soonest new instances
        # can take it (sized per service time instead, a queue that grows while instances
        # start would ask for more every second)
        backlog, spread = float(load.queued), 1.0
        if service is not None:
            drain = ready * slots / service
            backlog = max(0.0, load.queued + (rate - drain) * lead)
            spread = service / max(lead, service)
            signals["service_s"] = _rounded(service, 3)
        signals["backlog_at_ready"] = _rounded(backlog, 3)
        proposals["concurrency"] = _need(in_flight + min(queue_w, backlog) * spread, target)
        if span > 0:
            # the steady need sizes for the rate at ready time: the steady rate, plus the
            # trend over the lead time when its slope stands clear of the noise
            at = load.at
            traffic = traffic.settle(at)
            dispersion = traffic.dispersion(at)
            steady_rate = traffic.steady_rate(rate, dispersion)
            projected = steady_rate
            fit = traffic.trend(at)
            if fit is not None:
                _, slope, se = fit
                signals["rate_slope"] = _rounded(slope, 4)
                if slope > 0 and slope >= _TREND_SIGMAS * se:
                    projected += slope * lead
            signals["rate"] = _rounded(rate, 3)
            signals["rate_steady"] = _rounded(steady_rate, 3)
            signals["rate_projected"] = _rounded(projected, 3)
            if service is not None:
                self._size_from_model(
                    slots, traffic, projected, service, service_cv2, dispersion, signals, proposals
                )
        over = queue > t.queue_per_instance * ready + _EPS and backlog > _EPS
        sustained = rate * service if service is not None else in_flight
        proposals["queue"] = _need(sustained + min(queue, backlog) * spread, target) if over else 0
        burst = burst_rate * service if service is not None else float(load.in_flight + load.queued)
        signals["burst"] = _rounded(burst, 3)
        proposals["panic"] = _need(burst, target)
        if load.latency_p95_s is not None:
            signals["p95_ms"] = _rounded(load.latency_p95_s * 1000, 1)
            if self.latency_target_ms is not None:
                ratio = load.latency_p95_s * 1000 / self.latency_target_ms
                signals["p95_target_ms"] = self.latency_target_ms
                proposals["latency"] = (
                    math.ceil(max(load.current, 1) * min(ratio, 2.0)) if ratio > 1 else load.current
                )
        if (
            load.ttft_p95_s is not None
            or load.tpot_p95_s is not None
            or load.kv_cache_usage is not None
        ):
            self._caller_signals(load, signals, proposals)
        return signals, proposals, traffic, sizing

    def _caller_signals(
        self, load: GroupLoad, signals: dict[str, float], proposals: dict[str, int]
    ) -> None:
        """What callers of a generative group feel (issue 36): time to first token and time
        per output token (p95 of streamed answers) against their targets, each proposing as
        latency does, `ceil(current x min(p95 / target, 2))`; and the servers' KV-cache use
        against its target, a leading signal (a full cache preempts sequences before any
        queue or TTFT shows it): `ceil(current x use / target)`, more instances spreading
        the same sequences thinner. Shown without a target; proposing only with one. Each
        sizes from the ready instances, the ones whose answers and caches were read: counting
        those still starting would compound the proposal every tick until they are ready
        (1 -> 1000 in 10 s on a 20x burst with 30 s start-ups, found in simulation)."""
        t = self.spec.targets
        ready = max(load.ready, 1)
        for name, seen_s, target_ms in (
            ("ttft", load.ttft_p95_s, t.ttft_p95_ms),
            ("tpot", load.tpot_p95_s, t.tpot_p95_ms),
        ):
            if seen_s is None:
                continue
            signals[f"{name}_p95_ms"] = _rounded(seen_s * 1000, 1)
            if target_ms is not None:
                signals[f"{name}_target_ms"] = target_ms
                ratio = seen_s * 1000 / target_ms
                proposals[name] = math.ceil(ready * min(ratio, 2.0)) if ratio > 1 else load.current
        use = load.kv_cache_usage
        if use is not None:
            signals["kv_cache_usage"] = _rounded(use, 3)
            if t.kv_cache_usage is not None:
                signals["kv_cache_target"] = t.kv_cache_usage
                over = use > t.kv_cache_usage
                proposals["kv_cache"] = (
                    math.ceil(ready * use / t.kv_cache_usage) if over else load.current
                )

    def _size_from_model(
        self,
        slots: float,
        traffic: TrafficWindows,
        rate: float,
        service: float,
        service_cv2: float,
        dispersion: float,
        signals: dict[str, float],
        proposals: dict[str, int],
    ) -> None:
        """The queueing model's two needs (`queueing` module): steady (G/G/c at the
        projected rate, the measured service variability and arrival dispersion) and burst
        (the fluid envelope of the recent arrivals)."""
        slowdown, slack_s, latency_ms = self._waits
        objective = Objective.of(service, slowdown, slack_s, latency_ms, dispersion, service_cv2)
        miss = self._miss
        offered = rate * service
        steady = steady_slots(offered, objective, miss)
        tolerance = self.spec.targets.tolerance
        # the hold's load is no smaller (tolerance >= 0): its answer is no smaller either,
        # so its search starts at the steady one's (`steady_slots`' `at_least`)
        hold = steady_slots(
            offered * (1 + tolerance), objective, miss, steady if tolerance >= 0 else 0
        )
        wait = wait_allowance_s(service, slowdown, slack_s, latency_ms)
        work = traffic.work_by_span(service, self.spec.interval_s)
        envelope, window = burst_slots(work, wait)
        signals["offered_load"] = _rounded(offered, 3)
        signals["service_cv2"] = _rounded(service_cv2, 3)
        signals["dispersion"] = _rounded(dispersion, 3)
        signals["wait_allowance_s"] = _rounded(wait, 3)
        signals["steady_slots"] = float(steady)
        signals["steady_slots_hold"] = float(hold)
        signals["envelope_slots"] = _rounded(envelope, 3)
        signals["envelope_window_s"] = window
        proposals["steady"] = _need(steady, slots)
        proposals["envelope"] = _need(envelope, slots)

    def _combine(
        self,
        load: GroupLoad,
        signals: dict[str, float],
        proposals: dict[str, int],
        panicking: bool,
        panic_max: int,
    ) -> tuple[int, str, str, list[str], int]:
        """Apply the combination rule (module docstring), `panicking` as `_update_panic`
        says, `panic_max` the highest count asked while panicking.

        Returns (count, winner, top, notes, panic_max): `top` is the load signal that asked
        the most (it opens the reason), `winner` what set the count ('latency' or
        'tolerance' when they held it).
        """
        spec, t = self.spec, self.spec.targets
        current = load.current
        notes: list[str] = []
        candidates: dict[str, int] = {}
        for k in ("steady", "envelope", "concurrency"):  # a loop: a comprehension is a call
            if k in proposals:
                candidates[k] = proposals[k]
        queue_fires = proposals["queue"] > 0
        if queue_fires:
            candidates["queue"] = proposals["queue"]
        if panicking:
            candidates["panic"] = max(proposals["panic"], panic_max)
        if proposals.get("kv_cache", 0) > current:  # a leading signal: evidence in itself
            candidates["kv_cache"] = proposals["kv_cache"]
        winner: str = max(candidates, key=candidates.__getitem__)
        top, rec = winner, candidates[winner]
        target = signals["target_per_instance"]
        busy_ratio = signals["concurrency"] / (max(current, 1) * target)
        # caller-facing p95s with a target (latency, time to first and per output token)
        known = (  # none stated (most groups): no comprehension to call
            [
                (name, seen, signals[goal])
                for name, value, goal in self._caller_targets
                if (seen := signals.get(value)) is not None
            ]
            if self._caller_targets
            else []
        )
        lat_ok = bool(known) and all(seen < _LATENCY_OK * goal for _, seen, goal in known)
        bad = [name for name, seen, goal in known if seen > goal] if known else []
        # a batching server's own queue is the evidence that its instances are busy: the
        # gateway's slots (max_concurrency) overstate what it serves when prefill or the KV
        # cache bounds it, so concurrency stays far under target and the backlog test
        # (ready x slots / service) sees the queue drained, while requests wait inside
        server_busy = (
            signals.get("server_queue", 0.0) > t.queue_per_instance * max(load.ready, 1) + _EPS
        )
        if bad and (busy_ratio >= 1 - t.tolerance or queue_fires or server_busy):
            worst = max(bad, key=lambda name: proposals[name])
            if proposals[worst] > rec:
                winner = top = worst
                rec = proposals[worst]
        elif bad and rec <= current:
            notes.append(
                f"{_LABEL[bad[0]]} over target on idle instances: bottleneck elsewhere, no scale-up"
            )
        if rec > current:
            if (
                lat_ok
                and not queue_fires
                and winner in ("concurrency", "steady", "envelope", "panic")
            ):
                name, seen, goal = known[0]
                notes.append(
                    f"but {_LABEL[name]} {seen:.0f}ms is well under {goal:.0f}ms and no queue: "
                    "no scale-up (S4)"
                )
                return current, name, top, notes, panic_max
            # the deadband is for the noisy short-window signals; the steady need reads a
            # long window (or a change that cleared its noise test) and has its margin
            damped = winner in ("concurrency", "envelope")
            if damped and self._demand_slots(winner, signals) <= current * (1 + t.tolerance):
                notes.append(f"within tolerance {t.tolerance:g} of capacity: hold")
                return current, "tolerance", top, notes, panic_max
        elif rec < current and bad:
            notes.append(f"{_LABEL[bad[0]]} over target: no scale-down")
            return current, bad[0], top, notes, panic_max
        elif rec < current:
            # hysteresis: shrink only to a count that stays `tolerance` under its target,
            # so noise around a boundary does not walk the count down and up again
            # (the model's needs in load space: the count must hold `tolerance` more load)
            # (at utilization 1 concurrency is only the floor of what is busy: no band)
            band = 1 - t.tolerance if t.utilization < 1 else 1.0
            keep = max(
                _need(signals["concurrency"], target * band),
                _need(signals.get("steady_slots_hold", 0.0), signals["slots_per_instance"]),
                _need(
                    signals.get("envelope_slots", 0.0) * (1 + t.tolerance),
                    signals["slots_per_instance"],
                ),
            )
            if keep > rec:
                rec = min(keep, current)
                if rec == current:
                    winner = "tolerance"
                    notes.append(f"within tolerance {t.tolerance:g} of target: hold")
        if panicking:
            held = rec == panic_max > proposals["panic"]
            panic_max = max(panic_max, rec)
            notes.append(f"panic (burst {signals['burst']:.1f}, >= {spec.panic.threshold:g}x)")
            if held:
                notes.append(f"no scale-down while panicking: hold {panic_max}")
        return rec, winner, top, notes, panic_max

    @staticmethod
    def _demand_slots(signal: str, signals: dict[str, float]) -> float:
        """What `signal` asks for in instances, unrounded (for the deadband)."""
        if signal == "concurrency":
            return signals["concurrency"] / signals["target_per_instance"]
        slots = signals.get(f"{signal}_slots", 0.0)
        return slots / signals["slots_per_instance"]

    def _update_panic(
        self,
        load: GroupLoad,
        signals: dict[str, float],
        panic_over_at: float | None,
        panic_max: int,
    ) -> tuple[float | None, int]:
        """Enter at threshold x capacity over the panic window; leave a calm window later.
        Returns the next (panic_over_at, panic_max): panicking while the first is set."""
        p = self.spec.panic
        if not p.enabled:
            return panic_over_at, panic_max
        # the burst's own ratio to capacity, as Knative compares it: rounded up to instances
        # first, a 1-instance group read any burst just over its target as 2x
        capacity = signals["target_per_instance"] * max(load.current, 1)
        over = signals["burst"] >= p.threshold * capacity and signals["burst"] > 0
        if over:
            panic_over_at = load.at
        elif panic_over_at is not None and load.at - panic_over_at >= self.spec.targets.window_s:
            panic_over_at = None
            panic_max = 0
        signals["panicking"] = 1.0 if panic_over_at is not None else 0.0
        return panic_over_at, panic_max

    def _guard(
        self,
        load: GroupLoad,
        now: float,
        rec: int,
        cold: bool,
        notes: list[str],
        idle: float,
        panicking: bool,
        m: SluiceMemory,
        up_min: RollingExtreme[int],
        down_max: RollingExtreme[int],
    ) -> tuple[int, list[str], RollingExtreme[int], RollingExtreme[int]]:
        """Stabilization, cooldown, step limits and the 1 -> 0 rule (`idle`: seconds since
        anything was active; `m`: the tick's memory, for the step history and the cooldown
        clock). Returns (count, guards, up_min, down_max): the windows with `rec` in."""
        spec = self.spec
        current = load.current
        clipped: list[str] = []
        down = spec.down
        zero_ok = spec.min == 0 and spec.stable == 0
        if current == 0 and not cold:
            notes.append("at zero, nothing arrived: stay")  # the windows are history
            return 0, clipped, up_min, down_max
        if current == 1 and zero_ok and idle >= down.to_zero_delay_s and not panicking:
            # the last instance has its own rule (Ray's downscale_to_zero_delay_s, KEDA's
            # cooldownPeriod): the idle time is its stabilization, cooldown does not apply
            clipped.append("to-zero")
            notes.append(f"idle {idle:.0f}s >= {down.to_zero_delay_s:g}s: release the last")
            return 0, clipped, up_min, down_max
        if not cold:
            up_min = up_min.add(now, rec)
        up_rec = rec if cold else up_min.extreme
        down_max = down_max.add(now, rec)
        down_rec = down_max.extreme
        stabilized = min(max(current, up_rec), down_rec)
        if rec > current and stabilized < rec:
            clipped.append("up-stabilization")
            notes.append(f"up-stabilization {spec.up.stabilization_s:g}s holds {stabilized}")
        elif rec < current and stabilized > rec:
            clipped.append("stabilization")
            notes.append(f"rolling max over {spec.down.stabilization_s:g}s holds {stabilized}")
        if stabilized > current:
            desired = self._limit_up(now, current, stabilized, clipped, notes, m.ups)
            return desired, clipped, up_min, down_max
        if stabilized < current:
            if panicking:
                clipped.append("panic")
                notes.append("no scale-down while panicking")
                return current, clipped, up_min, down_max
            last_up_at = m.last_up_at
            if last_up_at is not None and now - last_up_at < spec.down.cooldown_s:
                left = spec.down.cooldown_s - (now - last_up_at)
                clipped.append("cooldown")
                notes.append(
                    f"cooldown {spec.down.cooldown_s:g}s after scale-up ({left:.0f}s left)"
                )
                return current, clipped, up_min, down_max
            desired = self._limit_down(now, current, stabilized, clipped, notes, m.downs)
            if desired == 0 and zero_ok and idle < spec.down.to_zero_delay_s:
                clipped.append("to-zero-delay")
                notes.append(
                    f"last instance kept: idle {idle:.0f}s < {spec.down.to_zero_delay_s:g}s"
                )
                desired = 1
            return desired, clipped, up_min, down_max
        return current, clipped, up_min, down_max

    def _limit_up(
        self,
        now: float,
        current: int,
        want: int,
        clipped: list[str],
        notes: list[str],
        ups: tuple[tuple[float, int], ...],
    ) -> int:
        up = self.spec.up
        if not (up.max_step or up.max_percent):
            return want
        added = _in_period(now, up.period_s, ups)
        base = max(current - added, 0)
        allowed = max(up.max_step, math.ceil(base * up.max_percent / 100), 1)
        upper = max(base + allowed, current)
        if want > upper:
            clipped.append("step")
            notes.append(f"step limit +{allowed}/{up.period_s:g}s clipped to {upper}")
            return upper
        return want

    def _limit_down(
        self,
        now: float,
        current: int,
        want: int,
        clipped: list[str],
        notes: list[str],
        downs: tuple[tuple[float, int], ...],
    ) -> int:
        down = self.spec.down
        if not (down.max_step or down.max_percent):
            return want
        removed = _in_period(now, down.period_s, downs)
        base = current + removed
        allowed = max(down.max_step, math.floor(base * down.max_percent / 100), 1)
        lower = min(base - allowed, current)
        if want < lower:
            clipped.append("step")
            notes.append(f"step limit -{allowed}/{down.period_s:g}s clipped to {lower}")
            return lower
        return want

    def _commit(
        self, now: float, current: int, desired: int, m: SluiceMemory
    ) -> tuple[tuple[tuple[float, int], ...], tuple[tuple[float, int], ...], float | None, int]:
        """What to remember of what was asked (step-limit history, cooldown clock): the next
        (ups, downs, last_up_at, last_out)."""
        before = m.last_out if m.last_out is not None else current
        change = desired - before
        ups, downs, last_up_at = m.ups, m.downs, m.last_up_at
        if change > 0:
            last_up_at = now
            ups = (*ups, (now, change))
        elif change < 0:
            downs = (*downs, (now, -change))
        cutoff = now - self._step_horizon
        return _after(ups, cutoff), _after(downs, cutoff), last_up_at, desired


def _after(events: tuple[tuple[float, int], ...], cutoff: float) -> tuple[tuple[float, int], ...]:
    """`events` (oldest first) less the leading ones at or before `cutoff`."""
    k, n = 0, len(events)
    while k < n and events[k][0] <= cutoff:
        k += 1
    return events[k:] if k else events


def _in_period(now: float, period_s: float, events: tuple[tuple[float, int], ...]) -> int:
    """Instances changed by events newer than now - period_s."""
    cutoff = now - period_s
    return sum(n for t, n in events if t > cutoff)
