"""The queueing model the Sluice policy sizes with, and the traffic estimators that feed it:
known closed forms, monotonicity, and a check against the simulator it must predict."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.policy.autoscale import GroupLoad, queueing
from sluice.policy.autoscale.queueing import (
    Objective,
    burst_slots,
    erlang_c,
    steady_slots,
    wait_allowance_s,
)
from sluice.policy.autoscale.traffic import TrafficWindows
from sluice.sim import InstanceModel, SimOptions, make_policy, pick_group, prepare, run
from sluice.sim.families import FAMILIES
from sluice.spec import load_spec_file
from sluice.spec.autoscaling import AutoscalingSpec

from .test_sim_single import REFERENCE


def test_erlang_c_matches_the_closed_forms() -> None:
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(4, 4.0) == 1.0 and erlang_c(3, 5.0) == 1.0  # unstable: everyone waits
    assert erlang_c(10, 0.0) == 0.0


@settings(max_examples=300, deadline=None)
@given(
    c=st.integers(min_value=1, max_value=20_000),
    busy=st.floats(min_value=0.001, max_value=3.0),
)
def test_erlang_b_in_closed_form_is_the_recursion(c: int, busy: float) -> None:
    """The closed form (pmf over cdf) that large groups use agrees with the recursion."""
    a = c * busy
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    assert queueing._erlang_b(c, a) == pytest.approx(b, rel=1e-9, abs=1e-300)


@settings(max_examples=300, deadline=None)
@given(c=st.integers(min_value=1, max_value=100_000), busy=st.floats(0.001, 3.0))
def test_the_closed_form_reads_scipys_poisson_cdf_to_the_bit(c: int, busy: float) -> None:
    """The Cython entry of pdtr the closed form calls is the ufunc's number, exactly."""
    from scipy.special import pdtr

    a = c * busy
    assert queueing.pdtr(c, a) == float(pdtr(c, a))


def test_wait_allowance_is_the_tighter_bound() -> None:
    assert wait_allowance_s(2.0, 2.0, 1.0, None) == 3.0  # one service time + 1 s
    assert wait_allowance_s(2.0, None, 0.0, 2500) == pytest.approx(0.5)
    assert wait_allowance_s(2.0, 2.0, 1.0, 2500) == pytest.approx(0.5)
    assert wait_allowance_s(3.0, None, 0.0, 2500) == 0.0  # never negative


def test_objective_rounds_to_the_safe_side() -> None:
    o = Objective.of(5.7, 2.0, 1.0, None, arrival_cv2=0.5, service_cv2=0.41)
    assert o.slack <= 1.0 / 5.7 and o.slowdown_wait == 1.0
    assert o.arrival_cv2 == 1.0  # smoother than Poisson is not counted on
    assert o.service_cv2 >= 0.41
    plain = Objective.of(1.0, None, 0.0, None)
    assert plain.slowdown_wait == 1.0  # no objective: wait about one service time


@settings(max_examples=60, deadline=None)
@given(
    load=st.floats(0.05, 400),
    miss=st.sampled_from([0.001, 0.005, 0.01, 0.05]),
    cs2=st.floats(0.0, 4.0),
)
def test_steady_need_is_the_smallest_count_that_meets_the_budget(
    load: float, miss: float, cs2: float
) -> None:
    o = Objective.of(1.0, 2.0, 1.0, None, 1.0, cs2)
    c = steady_slots(load, o, miss)
    assert c > load
    assert o.miss(c, load) <= miss
    # the smallest such count, for the load rounded up to its 1 % (log) step
    rounded = load * 1.0101
    assert c == math.floor(load) + 1 or o.miss(c - 1, rounded) > miss * 0.99
    # more load or a tighter budget never needs fewer slots
    assert steady_slots(load * 1.2, o, miss) >= c
    assert steady_slots(load, o, miss / 2) >= c


@settings(max_examples=200, deadline=None)
@given(
    load=st.floats(0.05, 5000),
    tolerance=st.sampled_from([0.0, 0.05, 0.1, 0.5]),
    miss=st.sampled_from([0.001, 0.005, 0.01, 0.05]),
    slowdown=st.sampled_from([None, 1.5, 2.0, 4.0]),
    latency_ms=st.sampled_from([None, 300.0, 2000.0]),
    dispersion=st.floats(1.0, 30.0),
    cs2=st.floats(0.0, 25.0),
)
def test_a_search_started_at_a_smaller_loads_answer_is_the_full_scan(
    load: float,
    tolerance: float,
    miss: float,
    slowdown: float | None,
    latency_ms: float | None,
    dispersion: float,
    cs2: float,
) -> None:
    """The hold need's search starts at the steady need (`at_least`): the same count as the
    scan from the first stable count, which reads every miss share on the way up."""
    o = Objective.of(0.2, slowdown, 1.0, latency_ms, dispersion, cs2)
    steady = steady_slots(load, o, miss)
    hold = steady_slots(load * (1 + tolerance), o, miss, steady)
    rounded = math.exp(
        math.ceil(math.log(load * (1 + tolerance)) / queueing._LOG_STEP) * queueing._LOG_STEP
    )
    c = max(1, math.floor(rounded) + 1)
    while o.miss(c, rounded) > miss:  # the plain scan, Erlang B afresh at every count
        c += 1
    assert hold >= steady
    assert abs(hold - c) <= 1  # (afresh and carried Erlang B differ in the last bits)
    assert hold == steady_slots(load * (1 + tolerance), o, miss)


def test_square_root_staffing_at_large_loads() -> None:
    """The margin over the mean load grows like sqrt(load), so its share shrinks."""
    o = Objective.of(1.0, 2.0, 0.0, None)
    margins = {a: steady_slots(a, o, 0.01) - a for a in (25.0, 100.0, 400.0)}
    assert 0 < margins[25.0] < margins[100.0] < margins[400.0]
    assert margins[400.0] / 400 < margins[25.0] / 25
    assert margins[400.0] / math.sqrt(400) == pytest.approx(margins[100.0] / 10, rel=0.35)


@pytest.mark.parametrize(("instances", "busy"), [(2, 0.68), (3, 0.78)])
def test_the_model_predicts_the_simulators_misses(instances: int, busy: float) -> None:
    """A fixed fleet on Poisson arrivals of the reference model: the predicted share of
    requests past their SLO is within 0.5-3x of what the simulator measures."""
    spec = load_spec_file(REFERENCE).spec
    model = InstanceModel.from_spec(spec, pick_group(spec, None))
    fam = FAMILIES["poisson-1"]
    c = 4 * instances
    rate = busy * c / 5.7
    trace = fam.trace(seed=1, duration_s=7200, rate_scale=rate / fam.mean_rate())
    work = prepare(model, trace)
    res = run(work, make_policy(model, f"fixed:{instances}"), SimOptions(initial=instances))
    measured = 1 - res.summary()["slo_attainment"]
    s = work.service
    load = len(trace) / trace.span_s * float(s.mean())
    o = Objective.of(float(s.mean()), 2.0, 1.0, None, 1.0, float(s.var() / s.mean() ** 2))
    assert measured > 0.005  # enough misses to compare
    assert 0.5 <= o.miss(c, load) / measured <= 3.0


def test_burst_envelope_takes_the_worst_span() -> None:
    # 40 s of work in the last 1 s, 50 in 2 s, 60 in 8 s; waits of 2 s allowed
    slots, span = burst_slots([(1.0, 40.0), (2.0, 50.0), (8.0, 60.0)], 2.0)
    assert span == 1.0 and slots == pytest.approx(40 / 3)
    assert burst_slots([], 2.0) == (0.0, 0.0)


# -- the estimators --------------------------------------------------------------------


def feed(counts: list[int], service_s: float = 1.0, spec: AutoscalingSpec | None = None) -> Any:
    """A TrafficWindows fed one tick a second with these arrivals, each served in
    `service_s` (the gateway's served seconds), all finished by the next tick."""
    tw = TrafficWindows.start(spec or AutoscalingSpec(max=100))
    arrivals = 0
    for t, n in enumerate(counts):
        arrivals += n
        load = GroupLoad(
            at=float(t),
            current=4,
            ready=4,
            slots_per_instance=4,
            in_flight=0,
            queued=0,
            arrivals=arrivals,
            completions=arrivals,
            served_s=arrivals * service_s,
            served_sq_s=arrivals * service_s**2,
        )
        _, tw = tw.observe(load, float(t), 60.0)
    return tw


def test_dispersion_reads_poisson_as_one_and_clumps_as_far_more() -> None:
    rng = np.random.default_rng(3)
    poisson = feed(rng.poisson(8, 600).tolist())
    assert 0.8 <= poisson.dispersion(599.0) <= 1.3
    clumps = feed([48 if t % 6 == 0 else 0 for t in range(600)])  # 8/s, in one second of six
    assert clumps.dispersion(599.0) > 10
    # a rate that changes between windows is not burstiness
    steps = feed([int(x) for x in rng.poisson([2] * 150 + [16] * 150 + [2] * 150 + [16] * 150)])
    assert steps.dispersion(599.0) < 2.5


def test_steady_rate_ignores_noise_and_follows_a_change() -> None:
    rng = random.Random(5)
    counts = [sum(rng.random() < 0.3 for _ in range(10)) for _ in range(300)]  # ~3/s
    tw = feed(counts)
    short, _ = tw.rate()
    dispersion = tw.dispersion(299.0)
    long = tw.steady_rate(short, dispersion)
    assert abs(long - 3.0) < 0.35  # the whole 300 s memory: fewer than 1600 arrivals
    assert tw.steady_rate(long * 1.15, dispersion) == pytest.approx(long)  # noise: long
    assert tw.steady_rate(long * 2.0, dispersion) == long * 2.0  # a change: the short rate


def test_service_mean_and_variability_from_served_seconds() -> None:
    tw = feed([5] * 100, service_s=2.0)
    mean, cv2 = tw.service() or (0.0, 0.0)
    assert mean == pytest.approx(2.0) and cv2 == pytest.approx(0.0, abs=1e-9)
    assert feed([5] * 5).service() is None  # 25 completions: unknown


def test_work_by_span_doubles_up_to_the_horizon() -> None:
    tw = feed([1] * 50 + [10] * 10)
    work = dict(tw.work_by_span(2.0, 1.0))
    assert list(work) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert work[1.0] == 20.0 and work[8.0] == 160.0 and work[16.0] == 2.0 * (100 + 6)
