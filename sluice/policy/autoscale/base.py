"""The contract every autoscaling policy keeps, live and simulated alike.

A policy (`ScalingPolicy`) is immutable configuration built from the spec; what it
remembers between ticks (its windows, cooldowns and panic mode) is a separate frozen value,
its memory. Fed one `GroupLoad` sample per tick, `step(memory, load, now)` returns the
`Decision` and the next memory, and never changes the memory it was given: the same
(memory, load, now) always gives equal results. It never reads a clock: `now` is an
argument, in seconds (epoch seconds live, trace seconds + an epoch offset in the
simulator), and `load.at` says when the sample was taken, so a sample older than the
policy's `metrics_max_age_s` counts as missing. The caller applies `Decision.desired`
through the quota allocator and planner.

`Autoscaler` is the older, stateful face of the same thing (`decide(load, now)`), kept for
callers that hold one object per group: `Stateful(policy)` is one, keeping the memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from sluice.core.frozen import fast_init

__all__ = [
    "Autoscaler",
    "Decision",
    "GroupLoad",
    "ScalingPolicy",
    "Stateful",
    "TokenLoad",
    "TrafficSample",
    "window_quantile",
]

M = TypeVar("M")
"""a policy's memory type: a frozen dataclass of immutable fields"""


@fast_init
@dataclass(frozen=True, slots=True)
class GroupLoad:
    """One sample of a group as the gateway and the controller see it at time `at`.

    Counters (`arrivals`, `completions`) are cumulative so that a missed tick loses no
    information; the policy differences them itself. `fresh=False` means the metrics could
    not be read (gateway down, stale sample): the policy must not read that as zero load.
    """

    at: float
    current: int
    """instances asked for and alive: ready + starting (what the last decision bought)"""
    ready: int
    """instances taking traffic"""
    slots_per_instance: int
    """the group's max_concurrency"""
    in_flight: int
    """requests at the instances now (the gateway's count; a server's own, if larger)"""
    queued: int
    """requests waiting at the gateway now"""
    arrivals: int
    """cumulative requests that reached the group"""
    completions: int = 0
    """cumulative requests that finished (any status)"""
    latency_p95_s: float | None = None
    """p95 of end-to-end latency (queue + service) over the last few seconds; None: none"""
    startup_s: float = 0.0
    """measured launch -> ready time of this group's instances (lead time, S7)"""
    draining: int = 0
    fresh: bool = True
    """False: the sample could not be read (missing metrics); never read as zero load"""
    server_waiting: int = 0
    """of `in_flight`, requests waiting inside the instances' own servers for a batch slot
    (scraped from a command server's metrics, `sluice.policy.server_metrics.server_view`;
    0 where nothing is scraped): queued, although the gateway's slots look taken by them"""
    served_s: float | None = None
    """cumulative seconds the `completions` spent at an instance (their service time); None
    where unknown (then service time is read from in-flight time by Little's law)"""
    served_sq_s: float | None = None
    """cumulative squares of the completions' service seconds (their variability)"""
    ttft_p95_s: float | None = None
    """p95 of streamed answers' time to first token (the gateway's time to their first body
    byte, queue wait included) over the last few seconds; None: no stream finished"""
    tpot_p95_s: float | None = None
    """p95 of streamed answers' time per output token over the last few seconds"""
    kv_cache_usage: float | None = None
    """the servers' mean KV-cache use, 0..1, where they export it (vLLM, SGLang, llama.cpp)"""
    standby_in_rotation: int = 0
    """instances a gateway routes to while it has put the group's warm standby in rotation
    (requests waited: the fast tier, before any decision); 0 when no gateway has"""


@dataclass(frozen=True, slots=True)
class TokenLoad(GroupLoad):
    """A `GroupLoad` with the tokens of the group's answers counted (a generative group
    whose gateway reads their usage): the means of the lengths size a batching group on its
    capacity at the SLO (`sluice.policy.autoscale.batching`). A subclass, so that a load
    without token counts stays the value (and the serialized decision) it was."""

    token_requests: int = 0
    """cumulative requests whose tokens `prompt_tokens` and `output_tokens` count"""
    prompt_tokens: int = 0
    """cumulative prompt tokens of those requests"""
    output_tokens: int = 0
    """cumulative output tokens of those requests"""


@fast_init
@dataclass(frozen=True, slots=True)
class Decision:
    """What a policy wants and why (S11): the journal stores all of it."""

    desired: int
    reason: str
    signals: Mapping[str, float] = field(default_factory=dict)
    """value of each input signal, e.g. {'concurrency': 31.5, 'queue': 4, 'p95_ms': 812}"""
    proposals: Mapping[str, int] = field(default_factory=dict)
    """instances each signal alone would ask for"""
    winner: str | None = None
    """the signal (or floor, e.g. 'schedule:peak') that set the count before guards"""
    clipped_by: tuple[str, ...] = ()
    """guards that changed the count: 'cooldown', 'step', 'max', 'min', 'stable', ..."""
    unclipped: int | None = None
    """the count before guards; None when equal to `desired`"""
    awake: int | None = None
    """of `desired`, the instances that serve now; the rest is capacity the scale-down
    stabilization holds for a burst's return, kept asleep by a group with sleeping standby
    (`autoscaling.sleep_held_after_s`). None: all of them serve"""


class ScalingPolicy(Protocol[M]):
    """A per-group scaling policy (sluice, hpa, kpa, fixed, ...): configuration only, its
    memory a value of type `M` (a frozen dataclass: tuples, numbers, None, nested frozen
    values; it compares with == and pickles)."""

    name: str

    def initial(self) -> M:
        """The memory before the first sample."""
        ...

    def step(self, memory: M, load: GroupLoad, now: float) -> tuple[Decision, M]:
        """(desired instance count at `now`, the next memory); called once per tick, `now`
        increasing. `memory` is not changed."""
        ...


class Autoscaler(Protocol):
    """A per-group scaling policy that keeps its own memory (see `Stateful`)."""

    name: str

    def decide(self, load: GroupLoad, now: float) -> Decision:
        """Desired instance count at `now`; called once per tick, `now` increasing."""
        ...


class Stateful(Generic[M]):
    """A `ScalingPolicy` with its memory kept here: the `Autoscaler` callers that hold one
    object per group use. `decide` is `step` on `memory`, which then becomes the next one."""

    __slots__ = ("memory", "name", "policy")

    def __init__(self, policy: ScalingPolicy[M], memory: M | None = None) -> None:
        self.policy = policy
        self.name = policy.name
        self.memory: M = policy.initial() if memory is None else memory

    def decide(self, load: GroupLoad, now: float) -> Decision:
        decision, self.memory = self.policy.step(self.memory, load, now)
        return decision

    def __repr__(self) -> str:
        return f"Stateful({self.policy!r})"


@dataclass(frozen=True, slots=True)
class TrafficSample:
    """What the gateway counted for one group, read at `at` (cumulative where it can be, so
    two samples bracket a window exactly): the live source of `GroupLoad`'s traffic fields.

    `latency_counts[i]` counts finished requests with latency <= `latency_bounds[i]` (and
    above the previous bound); the last entry is the overflow bucket.
    """

    at: float
    in_flight: int
    queued: int
    arrivals: int
    completions: int
    latency_bounds: tuple[float, ...]
    latency_counts: tuple[int, ...]
    served_s: float = 0.0
    """cumulative seconds finished requests spent at an instance (latency less queue wait)"""
    served_sq_s: float = 0.0
    """cumulative squares of those seconds"""
    server_errors: int = 0
    """cumulative 5xx answers (admission's 503s included)"""
    too_many: int = 0
    """cumulative 429 answers (admission shedding an overloaded group)"""
    client_errors: int = 0
    """cumulative other 4xx answers (the caller's fault: not the group's health)"""
    shed: int = 0
    """cumulative requests refused by admission, any reason"""
    queue_wait_bounds: tuple[float, ...] = ()
    queue_wait_counts: tuple[int, ...] = ()
    """cumulative queue waits by bucket, as `latency_counts`"""
    ttfb_bounds: tuple[float, ...] = ()
    ttfb_counts: tuple[int, ...] = ()
    """cumulative time to the first body byte of streamed answers (a TTFT proxy)"""
    tpot_bounds: tuple[float, ...] = ()
    tpot_counts: tuple[int, ...] = ()
    """cumulative time per output token of streamed answers (after their first)"""
    prompt_tokens: int = 0
    """cumulative prompt tokens of the group's answers, every tenant's (their usage)"""
    completion_tokens: int = 0
    """cumulative completion tokens of those answers"""
    usage_answers: int = 0
    """cumulative answers whose `usage` the gateway read (their prompt and completion tokens
    are in the two counts above; a stream answered without usage adds its chunks to
    `completion_tokens` only): the mean lengths' denominator. 0 from a gateway that does not
    count them (an older one): no token means"""
    usage_completion_tokens: int = 0
    """cumulative completion tokens of the `usage_answers` alone: the mean output length's
    numerator (`completion_tokens` also counts streams' chunks, whose answers
    `usage_answers` leaves out). 0 from a gateway that does not count them"""
    standby_in_rotation: int = 0
    """now: the instances this gateway routes to, if it has put the group's warm standby in
    rotation because requests waited (`GroupRuntime.promote`); else 0"""
    woken: tuple[str, ...] = ()
    """now: the group's sleeping standby this gateway woke and routes to (requests waited):
    the controller must not put them back to sleep while they are listed"""


def window_quantile(
    older: TrafficSample, newer: TrafficSample, q: float, histogram: str = "latency"
) -> float | None:
    """The `q` quantile of `histogram` ("latency", "ttfb", "tpot") over what finished
    between two samples, interpolated within its bucket (Prometheus' histogram_quantile);
    None when none finished, or when the older sample did not count it (an older gateway)."""
    bounds: tuple[float, ...] = getattr(newer, f"{histogram}_bounds")
    newer_counts: tuple[int, ...] = getattr(newer, f"{histogram}_counts")
    older_counts: tuple[int, ...] = getattr(older, f"{histogram}_counts")
    if len(newer_counts) != len(older_counts) or not newer_counts:
        return None
    deltas = [n - o for n, o in zip(newer_counts, older_counts, strict=True)]
    total = sum(deltas)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    lower = 0.0
    for i, count in enumerate(deltas):
        if i == len(bounds):  # overflow bucket: the best we can say is its lower edge
            return lower
        if count and seen + count >= rank:
            return lower + (bounds[i] - lower) * (rank - seen) / count
        seen += count
        lower = bounds[i]
    return lower
