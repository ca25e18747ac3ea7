"""The Sluice autoscaler on a virtual clock: every knob, driven through `decide` only (the
policy's `step`, its memory kept by `Stateful`)."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sluice.policy.autoscale import Decision, GroupLoad, SluiceMemory, SluicePolicy, Stateful
from sluice.policy.autoscale.sluice import _rounded
from sluice.spec.autoscaling import AutoscalingSpec

SLOTS = 4
TARGET = 0.7 * SLOTS  # 2.8 requests per instance at the default utilization


BASE: dict[str, Any] = {
    "max": 100,
    # pinned here so the exact numbers below do not move when defaults are retuned
    "targets": {"utilization": 0.7, "window_s": 30, "trend_window_s": 60, "tolerance": 0.1},
    "down": {"cooldown_s": 120, "stabilization_s": 60, "max_step": 1, "max_percent": 10},
}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def spec(**kw: Any) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate(merge(BASE, kw))


@dataclass
class World:
    """A group whose instances become ready `startup_s` after being asked for.

    Demand is concurrency (in flight + queued); each request lasts `service_s`, so the
    arrival rate is demand / service_s (Little's law).
    """

    policy: SluicePolicy
    current: int = 1
    startup_s: float = 0.0
    service_s: float = 1.0
    t: float = 0.0
    ready_at: list[float] = field(default_factory=list)
    arrivals: int = 0
    completions: int = 0
    carry: float = 0.0
    decisions: list[Decision] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    scaler: Stateful[SluiceMemory] = field(init=False)

    def __post_init__(self) -> None:
        self.ready_at = [-1e9] * self.current
        self.scaler = Stateful(self.policy)

    def tick(
        self,
        demand: float,
        *,
        p95_s: float | None = None,
        fresh: bool = True,
        age: float = 0,
        **caller: float | None,
    ) -> Decision:
        """One second of `demand`; `caller`: `GroupLoad`'s caller-facing readings
        (`ttft_p95_s`, `tpot_p95_s`, `kv_cache_usage`)."""
        ready = sum(1 for r in self.ready_at if r <= self.t)
        d = round(demand)
        in_flight = min(d, ready * SLOTS)
        self.carry += demand / self.service_s
        new = int(self.carry)
        self.carry -= new
        self.arrivals += new
        self.completions += round(in_flight / self.service_s)
        load = GroupLoad(
            at=self.t - age,
            current=len(self.ready_at),
            ready=ready,
            slots_per_instance=SLOTS,
            in_flight=in_flight,
            queued=d - in_flight,
            arrivals=self.arrivals,
            completions=self.completions,
            latency_p95_s=p95_s,
            startup_s=self.startup_s,
            fresh=fresh,
            **caller,  # type: ignore[arg-type]
        )
        dec = self.scaler.decide(load, self.t)
        self._apply(dec.desired)
        self.decisions.append(dec)
        self.counts.append(dec.desired)
        self.t += 1.0
        return dec

    def run(self, seconds: int, demand: float, **kw: Any) -> Decision:
        dec = self.tick(demand, **kw)
        for _ in range(seconds - 1):
            dec = self.tick(demand, **kw)
        return dec

    def _apply(self, desired: int) -> None:
        while len(self.ready_at) < desired:
            self.ready_at.append(self.t + self.startup_s)
        self.ready_at.sort()
        while len(self.ready_at) > desired:
            self.ready_at.pop()  # the youngest (starting first) goes first


def changes(counts: list[int]) -> int:
    return sum(1 for a, b in itertools.pairwise(counts) if a != b)


def _change_ticks(counts: list[int]) -> list[int]:
    return [i for i, (a, b) in enumerate(itertools.pairwise(counts)) if a != b]


# -- signals and explanations --------------------------------------------------------------


def test_concurrency_sizes_the_group_and_explains_it() -> None:
    w = World(SluicePolicy(spec(panic={"enabled": False})), current=4)
    dec = w.run(40, 28)  # 28 / 2.8 = 10 instances
    assert len(w.ready_at) == 10
    first_up = next(d for d in w.decisions if d.desired > 4)
    assert first_up.winner in ("concurrency", "queue", "rate")
    assert "->" in first_up.reason
    assert dec.signals["concurrency"] == 28.0
    assert dec.proposals["concurrency"] == 10


def test_reason_names_the_signal_the_target_and_the_step_clip() -> None:
    # only the concurrency signal speaks: no queue signal, and requests of 1000 s finish
    # none, so the service time (and with it the model's needs) is unknown
    quiet = {"queue_per_instance": 1000}
    pol = SluicePolicy(
        spec(up={"max_step": 4, "period_s": 15}, panic={"enabled": False}, targets=quiet)
    )
    w = World(pol, current=4, service_s=1000.0)
    w.run(29, 11)  # steady at 4: 11 / 2.8 -> 4
    dec = w.tick(31.5 * 30 - 11 * 29)  # the 30 s mean jumps to 31.5 -> 12 wanted
    assert dec.signals["concurrency"] == 31.5
    assert dec.proposals["concurrency"] == 12
    assert dec.desired == 8
    assert dec.unclipped == 12
    assert "step" in dec.clipped_by
    assert "concurrency 31.5 over target 2.8/instance -> 12" in dec.reason
    assert "step limit +4/15s clipped to 8" in dec.reason


def test_high_concurrency_with_low_latency_and_no_queue_does_not_scale_up() -> None:
    """S4: busy instances that still answer well under the latency target are enough."""
    pol = SluicePolicy(spec(targets={"latency_p95_ms": 2000}, panic={"enabled": False}))
    w = World(pol, current=4)
    dec = w.run(60, 15, p95_s=0.6)  # 15 in flight on 16 slots: no queue, 15/2.8 -> 6
    assert dec.proposals["concurrency"] == 6
    assert len(w.ready_at) == 4 and set(w.counts) == {4}
    assert "no scale-up (S4)" in dec.reason
    assert dec.winner == "latency"
    assert dec.reason.startswith("concurrency 15.0 over target 2.8/instance -> 6")
    # the same load with latency at risk does scale up
    w2 = World(SluicePolicy(spec(targets={"latency_p95_ms": 2000}, panic={"enabled": False})), 4)
    w2.run(60, 15, p95_s=1.9)
    assert len(w2.ready_at) == 6


def test_latency_alone_on_idle_instances_does_not_scale_up() -> None:
    pol = SluicePolicy(spec(targets={"latency_p95_ms": 500}))
    w = World(pol, current=4)
    dec = w.run(60, 2, p95_s=3.0)
    assert max(w.counts) == 4
    assert "bottleneck elsewhere" in dec.reason


def test_a_queue_scales_up_even_when_latency_still_looks_fine() -> None:
    pol = SluicePolicy(spec(targets={"latency_p95_ms": 5000}, panic={"enabled": False}))
    w = World(pol, current=2)
    w.run(10, 20, p95_s=0.5)  # 8 slots, 12 queued
    assert len(w.ready_at) == 8  # 20 / 2.8
    assert not any("S4" in d.reason for d in w.decisions)


# -- guards ----------------------------------------------------------------------------------


def test_cooldown_blocks_scale_down_after_a_scale_up() -> None:
    pol = SluicePolicy(
        spec(
            down={"cooldown_s": 120, "stabilization_s": 0, "max_step": 0, "max_percent": 0},
            panic={"enabled": False},
        )
    )
    w = World(pol, current=2)
    w.run(40, 28)  # up to 10 within the first seconds
    up_at = max(i for i, d in enumerate(w.decisions) if d.desired > (w.counts[i - 1] if i else 2))
    w.run(60, 3)  # calm again: wants 2, cooldown holds
    assert len(w.ready_at) == 10
    assert "cooldown" in w.decisions[-1].clipped_by
    while w.t < up_at + 119:
        w.tick(3)
    assert len(w.ready_at) == 10
    w.run(3, 3)
    assert len(w.ready_at) == 2


def test_scale_down_steps_count_per_period() -> None:
    pol = SluicePolicy(
        spec(
            down={
                "cooldown_s": 0,
                "stabilization_s": 0,
                "max_step": 2,
                "max_percent": 0,
                "period_s": 30,
            },
            panic={"enabled": False},
        )
    )
    w = World(pol, current=20)
    w.run(600, 0.2)
    downs = [
        (i, a - b) for i, (a, b) in enumerate(zip(w.counts, w.counts[1:], strict=False)) if b < a
    ]
    assert all(step == 2 for _, step in downs[:-1])
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(downs)]
    assert all(g >= 30 for g in gaps)
    assert w.counts[-1] == 1


def test_scale_down_percent_step_is_the_larger_of_count_and_percent() -> None:
    pol = SluicePolicy(
        spec(
            down={
                "cooldown_s": 0,
                "stabilization_s": 0,
                "max_step": 1,
                "max_percent": 50,
                "period_s": 30,
            },
            panic={"enabled": False},
        )
    )
    w = World(pol, current=40)
    dec = w.tick(0.5)
    assert dec.desired == 20  # 50 % of 40 beats 1
    assert "step limit -20/30s clipped to 20" in dec.reason
    w.run(29, 0.5)
    assert len(w.ready_at) == 20  # nothing more within the period
    w.run(1, 0.5)
    assert len(w.ready_at) == 10
    w.run(30, 0.5)
    assert len(w.ready_at) == 5
    w.run(30, 0.5)
    assert len(w.ready_at) == 3  # floor(5 * 0.5) = 2
    w.run(30, 0.5)
    assert len(w.ready_at) == 2  # at least 1 per period


def test_down_stabilization_keeps_the_rolling_max_of_recommendations() -> None:
    pol = SluicePolicy(
        spec(
            down={"cooldown_s": 0, "stabilization_s": 60, "max_step": 0, "max_percent": 0},
            # the steady rate reads the 1 s window alone (no long-window memory)
            targets={"window_s": 1, "rate_arrivals": 1},
            panic={"enabled": False},
        )
    )
    w = World(pol, current=10)
    w.run(5, 28)
    w.run(58, 2)  # wants 2, but 10 was recommended within the last 60 s
    assert len(w.ready_at) == 10
    w.run(3, 2)
    assert len(w.ready_at) == 2  # no step limits: straight down


def test_max_holds_under_a_100x_burst() -> None:
    pol = SluicePolicy(spec(max=12))
    w = World(pol, current=2, startup_s=30)
    w.run(30, 5)
    w.run(120, 500)
    assert max(w.counts) == 12
    assert "max" in w.decisions[-1].clipped_by


def test_min_and_stable_floors() -> None:
    w = World(SluicePolicy(spec(min=3, down={"cooldown_s": 0})), current=8)
    w.run(900, 0)
    assert len(w.ready_at) == 3 and min(w.counts) == 3
    w2 = World(SluicePolicy(spec(min=1, stable=5, down={"cooldown_s": 0})), current=8)
    w2.run(900, 0)
    assert min(w2.counts) == 5
    assert w2.decisions[-1].desired == 5


def test_stale_or_missing_metrics_hold_the_count() -> None:
    pol = SluicePolicy(spec(down={"cooldown_s": 0, "stabilization_s": 0}))
    w = World(pol, current=6)
    w.run(30, 16)
    for _ in range(120):
        dec = w.tick(0, fresh=False)  # gateway down: zero would be a lie
        assert dec.desired == 6
    assert "metrics missing" in dec.reason
    dec = w.tick(0, age=30)  # a sample older than metrics_max_age_s
    assert dec.desired == 6 and "metrics missing" in dec.reason


def test_scale_to_zero_after_the_delay_and_back_on_first_arrival() -> None:
    pol = SluicePolicy(spec(min=0, down={"to_zero_delay_s": 300, "cooldown_s": 0}))
    w = World(pol, current=1)
    w.run(10, 1)
    idle_from = w.t
    w.run(299, 0)
    assert len(w.ready_at) == 1
    assert "to-zero-delay" in w.decisions[-1].clipped_by
    w.run(2, 0)
    assert len(w.ready_at) == 0 and w.t - idle_from <= 302
    w.run(20, 0)
    assert set(w.counts[-20:]) == {0}
    dec = w.tick(1)  # first arrival at zero: at once
    assert dec.desired >= 1
    assert "cold start" in dec.reason


def test_scale_up_from_zero_ignores_stabilization_and_cooldown() -> None:
    pol = SluicePolicy(spec(min=0, up={"stabilization_s": 300}, down={"to_zero_delay_s": 0}))
    w = World(pol, current=0)
    w.run(5, 0)
    assert set(w.counts) == {0}
    assert w.tick(1).desired == 1


# -- panic --------------------------------------------------------------------------------


def test_panic_on_a_3x_step_scales_at_once_and_never_down_while_panicking() -> None:
    quiet = {"queue_per_instance": 1000}  # panic alone, not the queue signal
    w = World(SluicePolicy(spec(targets=quiet)), current=5, startup_s=30)
    w.run(120, 14)  # 14 / 2.8 = 5: steady
    assert set(w.counts[-60:]) == {5}
    step_at = len(w.counts)
    w.run(6, 42)
    # concurrency, then the burst envelope, ask 6, held within tolerance; at the 3rd
    # second the 6 s mean (28) asks 10 >= 2 x 5: panic, then the burst window fills:
    # 42 / 2.8 = 15
    assert w.counts[step_at:] == [5, 5, 10, 12, 14, 15]
    assert [d.signals["panicking"] for d in w.decisions[step_at:]] == [0, 0, 1, 1, 1, 1]
    assert w.decisions[step_at + 1].winner == "tolerance"
    assert w.decisions[step_at + 2].winner == "panic"
    # a dip while panicking does not lower the count
    w.run(20, 3)
    assert min(w.counts[step_at + 5 :]) == 15
    assert w.decisions[-1].signals["panicking"] == 1.0
    assert "no scale-down while panicking" in w.decisions[-1].reason


def test_no_collapse_right_after_panic_ends() -> None:
    """knative#3153/#9121: leaving panic must not drop the count in one go."""
    w = World(SluicePolicy(spec()), current=5, startup_s=30)
    w.run(60, 14)
    w.run(20, 60)  # burst: panic, scale up
    peak = max(w.counts)
    w.run(300, 3)
    after = w.counts[80:]
    drops = [a - b for a, b in itertools.pairwise(after) if b < a]
    assert peak >= 15
    assert drops and max(drops) <= max(1, int(peak * 0.1))  # the step ladder, not a cliff
    first_drop = next(i for i, (a, b) in enumerate(itertools.pairwise(after)) if b < a)
    assert first_drop >= 100  # cooldown (120 s after the last scale-up) first


# -- stability ----------------------------------------------------------------------------


def test_no_flapping_on_noisy_steady_load() -> None:
    rng = random.Random(7)
    w = World(SluicePolicy(spec()), current=6, startup_s=30)
    for _ in range(1800):  # 30 min of Poisson-ish noise around 14 in flight
        w.tick(max(0.0, rng.gauss(14, 14**0.5)))
    # 14 busy slots of 1 s work sit near the model's boundary between 5 and 6 instances
    # (20 slots hold 14 Erlangs, the 10 % hysteresis asks 21): a change every ~8 min at
    # most, never a flap
    assert changes(w.counts[120:]) <= 6
    assert all(b - a > 60 for a, b in itertools.pairwise(_change_ticks(w.counts[120:])))
    assert 5 <= w.counts[-1] <= 8


def test_lead_time_acts_earlier_on_a_ramp() -> None:
    def first_up(startup: float) -> int:
        # at full utilization the queueing model sizes the group; it sizes for the rate
        # projected one lead time ahead
        pol = SluicePolicy(spec(panic={"enabled": False}, targets={"utilization": 1.0}))
        w = World(pol, current=5, startup_s=startup, service_s=1.0)
        w.run(130, 12)
        for i in range(600):
            dec = w.tick(12 + 0.2 * i)  # +0.2 req/s each second
            if dec.desired > 5:
                return i
        raise AssertionError("never scaled up")

    slow, instant = first_up(30.0), first_up(0.0)
    assert slow + 5 <= instant  # (32 vs 39 s at the defaults)


def test_lead_time_spec_overrides_measured_startup() -> None:
    pol = SluicePolicy(spec(lead_time_s=0, panic={"enabled": False}))
    w = World(pol, current=5, startup_s=120)
    w.run(130, 12)
    dec = w.run(60, 12)
    assert dec.signals["lead_s"] == 0


# -- invariants ---------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    demands=st.lists(st.floats(min_value=0, max_value=400), min_size=1, max_size=120),
    lo=st.integers(0, 5),
    stable=st.integers(0, 5),
    hi=st.integers(5, 40),
    fresh=st.lists(st.booleans(), min_size=1, max_size=120),
)
def test_desired_always_within_floor_and_max(
    demands: list[float], lo: int, stable: int, hi: int, fresh: list[bool]
) -> None:
    pol = SluicePolicy(spec(min=lo, stable=stable, max=hi))
    w = World(pol, current=lo)
    for i, d in enumerate(demands):
        dec = w.tick(d, fresh=fresh[i % len(fresh)])
        assert max(lo, stable) <= dec.desired <= hi


def test_a_queue_the_ready_instances_drain_within_the_lead_time_adds_nothing() -> None:
    """S7: instances asked for now arrive after such a queue is gone."""
    w = World(SluicePolicy(spec(panic={"enabled": False})), current=5, startup_s=30)
    w.run(60, 10)  # 10 req/s of 1 s work on 20 slots
    dec = w.tick(30)  # 10 waiting, but 20 slots drain them in well under 30 s
    assert dec.signals["queue"] > 0 and dec.signals["backlog_at_ready"] == 0
    assert dec.proposals["queue"] == 0
    # a lasting surge over capacity leaves a backlog at ready time: scale up on it
    w2 = World(SluicePolicy(spec(panic={"enabled": False})), current=4, startup_s=30)
    w2.run(60, 10)  # 4 instances: what 10 busy slots need at the 0.7 target
    dec = w2.run(5, 60)
    assert dec.signals["backlog_at_ready"] > 0
    assert dec.proposals["queue"] > 5 and dec.desired > 5


def test_defaults_keep_capacity_between_recurring_bursts() -> None:
    """Bursts a minute apart find the capacity the last one bought (300 s rolling max)."""
    w = World(SluicePolicy(AutoscalingSpec(max=100)), current=2, startup_s=30)
    for _ in range(10):
        w.run(5, 40)
        w.run(55, 1)
    # 40 at once fills 10 instances' slots; 55 s of near silence (1 in flight: 1 instance)
    # between bursts never walks the count back down to the quiet level
    assert max(w.counts) >= 10
    assert min(w.counts[300:]) >= 6


def test_the_last_instance_waits_only_for_its_idle_delay() -> None:
    """1 -> 0 follows `to_zero_delay_s` alone: the default cooldown (120 s) and rolling max
    (300 s) would otherwise keep an idle instance for minutes."""
    pol = SluicePolicy(AutoscalingSpec(min=0, max=2, down={"to_zero_delay_s": 4}))
    w = World(pol, current=0)
    assert w.tick(1).desired == 1  # cold start, busy at t=0
    w.run(3, 0)
    assert len(w.ready_at) == 1
    dec = w.tick(0)  # t=4: idle 4 s
    assert dec.desired == 0 and "to-zero" in dec.clipped_by
    w.run(30, 0)
    assert set(w.counts[-30:]) == {0}  # stays at zero while nothing arrives


def test_panic_compares_the_burst_with_capacity_before_rounding_to_instances() -> None:
    """One instance with a target of 2: 3 requests at once (1.5x) is no 2x burst, 5 (2.5x)
    is. Rounded up to instances first, 3 asked for 2 = "2x" and a single Poisson cluster at
    half load panicked the group (Knative compares the unrounded ratio)."""
    w = World(SluicePolicy(spec(targets={"utilization": 0.5})))  # target 2/instance
    w.run(20, 0)
    dec = w.tick(3)
    assert dec.signals["burst"] == 3.0 and not dec.signals["panicking"]
    w = World(SluicePolicy(spec(targets={"utilization": 0.5})))
    w.run(20, 0)
    dec = w.tick(5)
    assert dec.signals["panicking"] and dec.desired >= 3


# -- burst reserve and the service-time estimate ------------------------------------------


def test_service_time_is_littles_law_over_the_service_window() -> None:
    w = World(SluicePolicy(spec(panic={"enabled": False})), current=5, service_s=2.0)
    dec = w.run(120, 8)  # 8 in flight of 2 s work: 4 req/s
    assert abs(dec.signals["service_s"] - 2.0) < 0.1
    assert abs(dec.signals["rate"] - 4.0) < 0.2


def test_service_time_is_unknown_until_enough_requests_finished() -> None:
    """Under 40 completions in the service window the mean is noise (one 30 s request reads
    as a 30 s service time): the model's needs stay silent until then."""
    w = World(SluicePolicy(spec()), current=2, service_s=1.0)
    dec = w.run(20, 1)  # ~1 completion per second: 19 so far
    assert "service_s" not in dec.signals
    assert "steady" not in dec.proposals and "envelope" not in dec.proposals
    dec = w.run(40, 1)
    assert abs(dec.signals["service_s"] - 1.0) < 0.1
    assert "steady" in dec.proposals and "envelope" in dec.proposals


def test_measured_service_seconds_beat_littles_law_at_a_rise() -> None:
    """With the gateway's served seconds the mean is the completions' own; Little's law
    (in-flight time / completions) counts the running requests' time too and reads high
    while long requests are still running."""

    def service_seen(served: bool) -> dict[str, float]:
        pol = Stateful(SluicePolicy(spec()))
        for t in range(100):
            # 10 requests of 1 s finish each second; 10 long ones (100 s) are running
            done = 10 * t
            load = GroupLoad(
                at=float(t),
                current=8,
                ready=8,
                slots_per_instance=SLOTS,
                in_flight=20,
                queued=0,
                arrivals=done,
                completions=done,
                served_s=float(done) if served else None,
                served_sq_s=float(done) if served else None,
            )
            dec = pol.decide(load, float(t))
        return dict(dec.signals)

    measured = service_seen(served=True)
    assert measured["service_s"] == 1.0 and measured["service_cv2"] == 0.0
    little = service_seen(served=False)
    assert little["service_s"] == pytest.approx(2.0, rel=0.05)  # 20 in flight / 10 per s
    assert little["service_cv2"] == 1.0  # unknown: taken as exponential


def test_burst_envelope_holds_capacity_for_a_burst_the_wait_cannot_absorb() -> None:
    """The fluid envelope: work arriving within T seconds must be served within T + the
    wait the objective allows. A 10 s burst of 40 req/s of 1 s work (wait allowance 2 s)
    needs 400 / 12 = 33 slots; the rolling max keeps them after the burst, then lets go."""
    pol = SluicePolicy(
        spec(
            panic={"enabled": False},
            down={"cooldown_s": 0, "stabilization_s": 120, "max_step": 0, "max_percent": 0},
        )
    )
    w = World(pol, current=2, service_s=1.0)
    w.run(60, 2)
    dec = w.run(10, 40)
    assert dec.signals["envelope_window_s"] >= 8
    assert dec.signals["envelope_slots"] == pytest.approx(400 / 12, rel=0.1)
    assert dec.proposals["envelope"] >= 8
    dec = w.run(30, 1)  # quiet again: the burst has left the envelope's horizon ...
    assert dec.proposals["envelope"] <= 2
    assert len(w.ready_at) >= 8  # ... and the rolling max keeps its count 120 s
    w.run(250, 1)  # (the steady rate remembers the burst for the memory, 120 s, too)
    assert len(w.ready_at) <= 2


def test_envelope_is_vetoed_like_the_other_load_signals_when_latency_is_fine() -> None:
    """S4: the model's needs alone do not scale up while p95 is well under target and
    no request waits."""
    pol = SluicePolicy(spec(panic={"enabled": False}, targets={"latency_p95_ms": 1000}))
    w = World(pol, current=3, service_s=1.0)
    w.run(60, 2, p95_s=0.2)
    dec = w.run(40, 10, p95_s=0.2)  # 10 in flight on 12 slots: the model asks 4
    assert dec.proposals["steady"] > 3
    assert dec.signals["queue"] == 0
    assert dec.desired == 3 and "S4" in dec.reason


def test_a_new_group_is_not_shrunk_before_its_stabilization_window_saw_load() -> None:
    """The starting count is the first recommendation: instances just launched (not even
    ready) are not stopped on the first idle second."""
    w = World(SluicePolicy(spec(down={"stabilization_s": 60, "cooldown_s": 0})), current=4)
    assert all(w.tick(0).desired == 4 for _ in range(55))
    w.run(10, 0)
    assert w.tick(0).desired < 4


_TIES = st.builds(
    lambda n, d: ((n + 0.5) / 10**d, d), st.integers(-(10**9), 10**9), st.sampled_from((1, 3, 4))
)
"""values whose product x * 10 ** digits lies at, or within float error of, a half"""


@settings(max_examples=3000)
@given(st.one_of(st.tuples(st.floats(), st.sampled_from((1, 3, 4))), _TIES))
@example((0.0005, 3))  # above the tie in binary: the builtin rounds it up, x * 1000 is 0.5
@example((0.0625, 3))  # an exact tie: half-even
@example((-0.0004, 3))  # -0.0
@example((-0.0, 1))
@example((2.675, 3))
@example((1e15, 1))  # beyond the exact range: the builtin's
def test_signals_round_bit_for_bit_as_the_builtin(case: tuple[float, int]) -> None:
    """The policy rounds its signals with `_rounded`, a fifth of the builtin's cost: it must
    give the builtin's float to the last bit (the sign of zero, NaN and infinities too),
    or the decision digests of bench/decide.py would move."""
    x, digits = case
    assert repr(_rounded(x, digits)) == repr(round(x, digits))
