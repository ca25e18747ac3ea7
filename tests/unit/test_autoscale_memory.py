"""Every autoscaling policy as a pure step over a frozen memory value (`ScalingPolicy`):
`step` never changes the memory it is given, the same inputs give equal outputs, memories
compare with == and pickle, and `Stateful` decides exactly as threading `step` by hand."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.policy.autoscale import (
    Decision,
    FixedPolicy,
    GroupLoad,
    HpaPolicy,
    KpaPolicy,
    ScalingPolicy,
    ScheduleFloors,
    SluicePolicy,
    Stateful,
    build_autoscaler,
    build_policy,
)
from sluice.policy.autoscale.windows import RollingExtreme, SlidingMean, Trend
from sluice.spec import GroupSpec
from sluice.spec.autoscaling import AutoscalingSpec, ScheduleEntry

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC
EVERY_10_MIN = ScheduleEntry(cron="*/10 * * * *", min=5, duration_s=120, timezone="Europe/Berlin")


def group(autoscaling: dict[str, Any]) -> GroupSpec:
    return GroupSpec.model_validate(
        {
            "name": "g",
            "owner": "o@example.com",
            "business": "b",
            "alert_channel": "#a",
            "models": {"m": {"runtime": "sim"}},
            "resources": {"pool": "p", "memory_gb": 1},
            "max_concurrency": 4,
            "replicas": 2,
            "autoscaling": autoscaling,
            "slo": {"slowdown": 2, "slack_s": 1, "target": 0.99},
        }
    )


SHORT = {"window_s": 10, "trend_window_s": 20, "service_completions": 40, "rate_arrivals": 50}
POLICIES: dict[str, Callable[[], ScalingPolicy[Any]]] = {
    "sluice": lambda: build_policy(group({"max": 50}), {}),
    "sluice-tight": lambda: build_policy(
        group(
            {
                "min": 0,
                "max": 30,
                "lead_time_s": 5,
                "targets": {**SHORT, "latency_p95_ms": 2000},
                "up": {"stabilization_s": 3, "max_step": 2, "period_s": 5},
                "down": {"cooldown_s": 4, "stabilization_s": 8, "to_zero_delay_s": 6},
                "panic": {"window_s": 3},
                "schedules": [EVERY_10_MIN],
            }
        ),
        {},
    ),
    "hpa": lambda: build_policy(
        group(
            {
                "max": 40,
                "hpa": {
                    "sync_period_s": 3,
                    "scale_down": {
                        "stabilization_s": 9,
                        "policies": [{"type": "Pods", "value": 2, "period_s": 6}],
                    },
                },
            }
        ),
        {},
        "hpa",
    ),
    "kpa": lambda: build_policy(
        group(
            {
                "min": 0,
                "max": 40,
                "kpa": {"stable_window_s": 8, "scale_down_delay_s": 5, "scale_to_zero_grace_s": 4},
            }
        ),
        {},
        "kpa",
    ),
    "fixed": lambda: build_policy(group({"max": 5}), {}, "fixed:3"),
}

_sample = st.tuples(
    st.sampled_from([1.0, 1.0, 1.0, 0.5, 2.0, 7.0]),  # seconds since the last sample
    st.integers(0, 60),  # arrivals since
    st.integers(0, 60),  # completions since
    st.integers(0, 40),  # in flight
    st.sampled_from([0, 0, 0, 3, 25]),  # queued
    st.integers(0, 12),  # current
    st.sampled_from([True, True, True, True, True, False]),  # fresh
    st.sampled_from([0.0, 0.0, 0.0, 0.0, 30.0]),  # sample age
    st.one_of(st.none(), st.floats(0.01, 8.0)),  # p95
    st.sampled_from([0, 0, 0, 2]),  # server_waiting
    st.booleans(),  # served seconds known
)


@st.composite
def traffic(draw: st.DrawFn) -> list[tuple[GroupLoad, float]]:
    """(load, now) samples of one group: cumulative counters, time moving forward."""
    start = draw(st.floats(0, 3600))
    now, arrivals, completions, served, served_sq = T0 + start, 0, 0, 0.0, 0.0
    out = []
    for dt, arr, comp, in_flight, queued, current, fresh, age, p95, waiting, known in draw(
        st.lists(_sample, min_size=1, max_size=50)
    ):
        now += dt
        arrivals += arr
        completions += comp
        served += 0.3 * comp
        served_sq += 0.3 * 0.3 * comp
        load = GroupLoad(
            at=now - age,
            current=current,
            ready=max(0, current - 1) if dt > 1 else current,
            slots_per_instance=4,
            in_flight=in_flight,
            queued=queued,
            arrivals=arrivals,
            completions=completions,
            latency_p95_s=p95,
            startup_s=10.0,
            fresh=fresh,
            server_waiting=waiting,
            served_s=served if known else None,
            served_sq_s=served_sq if known else None,
        )
        out.append((load, now))
    return out


def _immutable(value: Any, path: str = "memory") -> None:
    """Every field of a memory is a number, str, bytes (a packed window), None, tuple,
    frozenset or a frozen dataclass of those (a held `Decision` is returned as it is: the
    one exception)."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, Decision)):
        return
    if isinstance(value, (tuple, frozenset)):
        for i, v in enumerate(value):
            _immutable(v, f"{path}[{i}]")
        return
    assert dataclasses.is_dataclass(value), f"{path}: {type(value).__name__} is not a value"
    params = getattr(type(value), "__dataclass_params__")  # noqa: B009
    assert params.frozen, f"{path}: {type(value).__name__} is not frozen"
    assert not hasattr(value, "__dict__"), f"{path}: {type(value).__name__} has no slots"
    for f in dataclasses.fields(value):
        _immutable(getattr(value, f.name), f"{path}.{f.name}")


def _thread(policy: ScalingPolicy[Any], samples: list[tuple[GroupLoad, float]]) -> list[Any]:
    """[(decision, memory)] of `step` threaded by hand from `initial()`."""
    memory = policy.initial()
    out = []
    for load, now in samples:
        decision, memory = policy.step(memory, load, now)
        out.append((decision, memory))
    return out


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=traffic())
def test_step_is_a_pure_function_of_its_memory(
    name: str, samples: list[tuple[GroupLoad, float]]
) -> None:
    policy = POLICIES[name]()
    config = dict(vars(policy))  # its parts are frozen: only a rebinding could change it
    memory = policy.initial()
    _immutable(memory)
    for load, now in samples:
        before = copy.deepcopy(memory)
        decision, after = policy.step(memory, load, now)
        # (a) the memory passed in is left as it was
        assert memory == before
        # the same memory, the same sample: equal decisions and memories
        again, after_again = policy.step(memory, load, now)
        assert again == decision and after_again == after
        _immutable(after)
        memory = after
    # the policy is configuration only: no step changed it
    assert vars(policy) == config
    # memories pickle, and a step from the unpickled memory goes on the same way
    thawed = pickle.loads(pickle.dumps(memory))
    assert thawed == memory
    load, now = samples[-1]
    nxt = dataclasses.replace(load, at=load.at + 1.0, arrivals=load.arrivals + 3)
    assert policy.step(thawed, nxt, now + 1.0) == policy.step(memory, nxt, now + 1.0)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=traffic())
def test_replay_and_the_stateful_adapter_agree(
    name: str, samples: list[tuple[GroupLoad, float]]
) -> None:
    policy = POLICIES[name]()
    first = _thread(policy, samples)
    # (b) replaying the same sequence from `initial()` gives equal decisions and memories
    assert _thread(policy, samples) == first
    # (c) the Stateful adapter decides exactly as `step` threaded by hand
    scaler = Stateful(policy)
    assert scaler.name == policy.name and scaler.memory == policy.initial()
    for (load, now), (decision, memory) in zip(samples, first, strict=True):
        assert scaler.decide(load, now) == decision
        assert scaler.memory == memory
    # a fresh policy built from the same spec is the same function
    assert _thread(POLICIES[name](), samples) == first


def test_the_factory_wraps_every_remembering_policy_in_stateful() -> None:
    g = group({"max": 10})
    for name, cls in (("sluice", SluicePolicy), ("hpa", HpaPolicy), ("kpa", KpaPolicy)):
        scaler = build_autoscaler(g, {}, name)
        assert isinstance(scaler, Stateful) and isinstance(scaler.policy, cls)
    fixed = build_autoscaler(g, {}, "fixed:2")  # remembers nothing: its own autoscaler
    assert isinstance(fixed, FixedPolicy) and fixed.step(fixed.initial(), _idle(), T0) == (
        fixed.decide(_idle(), T0),
        fixed.initial(),
    )


def _idle() -> GroupLoad:
    return GroupLoad(
        at=T0, current=1, ready=1, slots_per_instance=4, in_flight=0, queued=0, arrivals=0
    )


def test_held_decisions_return_the_memory_as_it_was() -> None:
    # between HPA syncs and KPA ticks nothing is learnt: the memory comes back unchanged
    hpa = HpaPolicy(min_replicas=1, max_replicas=10)
    _, m = hpa.step(hpa.initial(), _idle(), T0)
    d, m2 = hpa.step(m, _idle(), T0 + 1)
    assert m2 is m and d is m.last
    kpa = KpaPolicy(min_scale=0, max_scale=10)
    _, k = kpa.step(kpa.initial(), _idle(), T0)
    stale = dataclasses.replace(_idle(), fresh=False)
    d, k2 = kpa.step(k, stale, T0 + 1)
    assert k2 is k and d is k.last


# -- the window values ---------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 3.0]), st.integers(-20, 20)), max_size=80),
    st.sampled_from([0.0, 1.0, 5.0]),
    st.booleans(),
)
def test_rolling_extreme_is_the_brute_force_extreme(
    steps: list[tuple[float, int]], window: float, largest: bool
) -> None:
    roll: RollingExtreme[int] = RollingExtreme(window, largest)
    seen: deque[tuple[float, int]] = deque()
    t = 0.0
    for dt, v in steps:
        t += dt
        before = roll
        roll = roll.add(t, v)
        assert before == copy.deepcopy(before) and roll is not before
        seen.append((t, v))
        inside = [x for s, x in seen if s > t - window] or [v]
        assert roll.extreme == (max(inside) if largest else min(inside))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([0.5, 1.0, 2.0]), st.floats(-100, 100)), max_size=80),
    st.sampled_from([0.0, 3.0, 10.0]),
)
def test_sliding_mean_and_trend_values_are_left_as_they_were(
    steps: list[tuple[float, float]], window: float
) -> None:
    mean, trend = SlidingMean(window), Trend(window)
    t = 0.0
    kept: list[tuple[float, float]] = []
    for dt, v in steps:
        t += dt
        m0, t0 = copy.deepcopy(mean), copy.deepcopy(trend)
        new_mean, new_trend = mean.add(t, v), trend.add(t, v)
        assert mean == m0 and trend == t0  # the old values are untouched
        mean, trend = new_mean, new_trend
        kept = [(s, x) for s, x in [*kept, (t, v)] if s > t - window]
        expect = sum(x for _, x in kept) / len(kept) if kept else None
        got = mean.mean(t)
        assert (got is None) == (expect is None)
        if got is not None and expect is not None:
            assert got == pytest.approx(max(0.0, expect), abs=1e-6)
        assert mean.evict(t) is mean  # add already dropped what `t` pushes out
        assert trend.count == mean.count == len(kept)


def test_schedule_floors_keep_their_firings_in_the_callers_value() -> None:
    floors = ScheduleFloors([("schedule:x", EVERY_10_MIN)])
    cache = floors.initial()
    assert cache == (None,)
    for k in range(0, 1800, 7):
        now = T0 + k
        floor, label, nxt = floors.floor_in(now, cache)
        assert (floor, label) == floors.floor_at(now)
        assert nxt[0] is not None and nxt[0][0] <= now < nxt[0][1]
        if cache[0] is not None and cache[0][0] <= now < cache[0][1]:
            assert nxt is cache  # within the cached firings: no lookup, the same value
        cache = nxt


def test_equal_specs_start_from_equal_memories() -> None:
    spec = AutoscalingSpec(max=10)
    pol = SluicePolicy(spec)
    memory = pol.initial()
    assert memory == SluicePolicy(AutoscalingSpec(max=10)).initial()
    assert (
        memory
        != SluicePolicy(
            AutoscalingSpec.model_validate({"max": 10, "targets": {"window_s": 5}})
        ).initial()
    )
