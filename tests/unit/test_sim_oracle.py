"""The clairvoyant references: oracle <= best fixed fleet, both reach the SLO, work floor
below everything, and the plan launches ahead by the start-up time."""

from __future__ import annotations

import numpy as np

from sluice.policy.autoscale import GroupLoad
from sluice.sim import PlanPolicy, best_fixed, oracle, prepare, run, trace_from_rows, work_floor
from tests.unit.test_sim_single import fixed_service


def bursty_trace() -> object:
    """Quiet (1/s) with a 60 s burst at 30/s every 5 minutes."""
    rows = []
    for t in np.arange(0, 1800, 1.0):
        rows.append((float(t), 1, 1))
        if (t % 300) < 60:
            rows.extend((float(t) + k / 30, 1, 1) for k in range(30))
    return trace_from_rows(rows)


def test_oracle_is_never_dearer_than_the_best_fixed_fleet_and_meets_the_slo() -> None:
    model = fixed_service(0.5, startup_s=20)
    work = prepare(model, bursty_trace())  # type: ignore[arg-type]
    n, fixed = best_fixed(work)
    assert n is not None and fixed.summary()["slo_attainment"] >= 0.99
    if n > 1:  # one fewer would miss the target
        from sluice.policy.autoscale import FixedPolicy

        assert run(work, FixedPolicy(n - 1)).summary()["slo_attainment"] < 0.99
    o = oracle(work)
    s = o.result.summary()
    assert s["slo_attainment"] >= 0.99
    assert o.result.instance_seconds <= fixed.instance_seconds
    assert o.result.instance_seconds < 0.8 * fixed.instance_seconds  # bursts pay off
    assert work_floor(work) <= o.result.instance_seconds


def test_a_plan_is_asked_for_start_up_seconds_ahead() -> None:
    plan = np.array([1] * 100 + [5] * 10 + [1] * 100, dtype=np.int64)
    p = PlanPolicy(plan, lead_s=30, epoch=1000.0)
    load = GroupLoad(
        at=0, current=1, ready=1, slots_per_instance=4, in_flight=0, queued=0, arrivals=0
    )
    m = p.initial()

    def at(now: float) -> int:
        d, after = p.step(m, load, now)
        assert after == m  # it remembers nothing: the plan is its configuration
        return d.desired

    assert p.start == 1
    assert at(1000.0 + 60) == 1
    assert at(1000.0 + 69) == 5  # 100 - 31: launched in time
    assert at(1000.0 + 109) == 5
    assert at(1000.0 + 111) == 1  # down once the need is over
