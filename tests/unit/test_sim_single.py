"""One group's run, a fleet of one (`sluice.sim.single`): analytic instance counts, Little's
law, determinism, drains, crashes, and that every tick goes through the kernel's `step` and
the live admission code (no copies): quota at the pool's count, warm standby, crash-loop
backoff."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import sluice.policy.admission
import sluice.policy.autoscale
import sluice.policy.kernel
import sluice.sim.fleet
from sluice.policy.autoscale.queueing import Objective, steady_slots
from sluice.policy.kernel import Memory, World
from sluice.policy.tick import TICK_S, TickDecision
from sluice.sim import (
    InstanceModel,
    PlanPolicy,
    SimOptions,
    make_policy,
    pick_group,
    prepare,
    run,
    trace_from_rows,
)
from sluice.spec import load_spec_text
from sluice.spec.autoscaling import AutoscalingSpec

REFERENCE = Path(__file__).parents[2] / "examples" / "reference-sim.yaml"


def model_with(**group: Any) -> InstanceModel:
    """The reference instance model with some group fields replaced (dotted keys nest)."""
    data = yaml.safe_load(REFERENCE.read_text())
    g = data["groups"][0]
    for key, value in group.items():
        node = g
        *path, last = key.split("__")
        for p in path:
            node = node[p]
        node[last] = value
    spec = load_spec_text(yaml.safe_dump(data)).spec
    return InstanceModel.from_spec(spec, pick_group(spec, None))


def fixed_service(seconds: float, **kw: Any) -> InstanceModel:
    return model_with(
        models={
            "m": {
                "runtime": "sim",
                "sim": {
                    "startup_s": kw.pop("startup_s", 30),
                    "memory_gb": 1,
                    "service_time": {"kind": "fixed", "seconds": seconds},
                },
            }
        },
        **kw,
    )


def constant_rate(rate: float, seconds: float) -> Any:
    n = int(rate * seconds)
    return trace_from_rows((i / rate, 100, 10) for i in range(n))


def poisson(rate: float, seconds: float, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.1)))
    return trace_from_rows((x, 100, 10) for x in t[t < seconds])


@pytest.mark.parametrize("policy", ["hpa", "kpa"])
def test_constant_rate_settles_on_the_analytic_instance_count(policy: str) -> None:
    # lambda = 20 req/s, s = 0.5 s: 10 busy slots; 4 slots at each policy's default target
    # utilization u -> ceil(10 / (4 u)) (hpa, kpa 0.7 -> 4)
    defaults = AutoscalingSpec(max=10)
    utilization = {
        "hpa": defaults.hpa.target_per_instance,
        "kpa": defaults.kpa.target_utilization,
    }[policy]
    model = fixed_service(0.5)
    expected = math.ceil(20 * 0.5 / (4 * utilization))
    settled = _settled(model, policy)
    assert np.all((settled >= expected - 1) & (settled <= expected + 1)), np.unique(settled)
    assert expected - 0.5 <= float(np.median(settled)) <= expected + 0.5


def test_sluice_settles_on_the_queueing_models_count() -> None:
    # the same 10 busy slots; the Sluice policy sizes them by its queueing model: the slots
    # that keep waits past the SLO allowance (2 x 0.5 s + 1 s: a 1.5 s wait) under the
    # error budget, with a fixed service time (cs^2 0) and arrivals taken as Poisson
    model = fixed_service(0.5)
    slo = model.group.slo
    assert slo is not None and slo.slowdown is not None
    objective = Objective.of(0.5, slo.slowdown, slo.slack_s, None, 1.0, 0.0)
    targets = AutoscalingSpec(max=10).targets
    miss = (1 - slo.target) * targets.slo_budget_share
    need = math.ceil(steady_slots(10.0, objective, miss) / 4)
    hold = math.ceil(steady_slots(10.0 * (1 + targets.tolerance), objective, miss) / 4)
    assert need == 3  # 12 slots: the model is not plain ceil(10 / 4) by accident here
    settled = _settled(model, "sluice")
    assert np.all((settled >= need) & (settled <= hold + 1)), np.unique(settled)
    assert need <= float(np.median(settled)) <= hold


def _settled(model: InstanceModel, policy: str) -> Any:
    """Ready instances over the last 10 minutes of a 30-minute run at 20 req/s from 1."""
    res = run(prepare(model, constant_rate(20, 1800)), make_policy(model, policy))
    ready = res.column("ready")
    t = res.column("t")
    settled = ready[(t > 1200) & (t < 1790)]
    assert settled.size > 500
    return settled


def test_a_fleet_with_room_serves_every_request_in_its_service_time() -> None:
    model = fixed_service(0.5)
    res = run(prepare(model, constant_rate(20, 60)), make_policy(model, "fixed:3"))
    s = res.summary()
    assert s["requests"] == 1200 and s["completed"] == 1200
    assert s["p50_ms"] == pytest.approx(500) and s["p99_ms"] == pytest.approx(500)
    assert s["slo_attainment"] == 1.0 and s["mean_wait_ms"] == pytest.approx(0, abs=1e-6)
    assert s["peak_instances"] == 3 and s["scale_events"] == 0
    assert s["instance_seconds"] == pytest.approx(3 * s["duration_s"])


def test_littles_law_holds_on_the_gateway_queue() -> None:
    # one instance, 4 slots, lambda = 10/s, mean service ~0.34 s -> utilisation ~0.85
    model = model_with(
        models={
            "m": {
                "runtime": "sim",
                "sim": {
                    "startup_s": 1,
                    "memory_gb": 1,
                    "service_time": {"kind": "lognormal", "median_s": 0.3, "sigma": 0.5},
                },
            }
        }
    )
    trace = poisson(10.0, 20_000, seed=3)
    res = run(prepare(model, trace), make_policy(model, "fixed:1"))
    s = res.summary()
    rate = len(trace) / s["duration_s"]
    mean_wait_s = s["mean_wait_ms"] / 1000
    assert s["mean_queue"] > 0.5  # a real queue, not a trivial zero
    assert s["mean_queue"] == pytest.approx(rate * mean_wait_s, rel=0.05)


def test_same_seed_same_result_and_another_seed_differs() -> None:
    model = model_with(
        models={
            "m": {
                "runtime": "sim",
                "sim": {
                    "startup_s": 5,
                    "memory_gb": 1,
                    "service_time": {"kind": "lognormal", "median_s": 0.5, "sigma": 0.8},
                },
            }
        }
    )
    trace = poisson(8.0, 600, seed=1)
    opts = SimOptions(seed=7, crash_rate_per_hour=2.0, slow_start_prob=0.3)

    def once(seed: int) -> Any:
        work = prepare(model, trace, seed=seed)
        return run(work, make_policy(model, "hpa"), SimOptions(**{**opts.__dict__, "seed": seed}))

    a, b, c = once(7), once(7), once(8)
    assert np.array_equal(a.done, b.done)
    assert a.summary() == b.summary()
    assert not np.array_equal(a.done, c.done)


def test_every_tick_is_the_kernels_step_and_the_admission_is_the_live_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert sluice.sim.fleet.step is sluice.policy.kernel.step
    assert sluice.sim.fleet.GroupAdmission is sluice.policy.admission.GroupAdmission
    seen: list[float] = []

    def spy(memory: Memory, world: World, now: float) -> tuple[TickDecision, Memory]:
        seen.append(now)
        return sluice.policy.kernel.step(memory, world, now)

    monkeypatch.setattr(sluice.sim.fleet, "step", spy)
    model = fixed_service(0.5)
    res = run(prepare(model, constant_rate(20, 60)), make_policy(model, "sluice"))
    assert len(seen) == len(res.timeline) > 60
    assert np.allclose(np.diff(seen), TICK_S) and seen[0] == SimOptions().epoch
    for name in ("sluice", "hpa", "kpa", "fixed:2"):
        policy = make_policy(model, name)
        assert type(policy).__module__.startswith("sluice.policy.autoscale.")
        assert isinstance(
            policy,
            tuple(
                getattr(sluice.policy.autoscale, c)
                for c in ("SluicePolicy", "HpaPolicy", "KpaPolicy", "FixedPolicy")
            ),
        )


def test_a_drain_takes_its_time_and_loses_nothing() -> None:
    # 3 instances, then 1 from t=20: the two drained ones finish their 10 s requests first
    model = fixed_service(10.0, startup_s=0, slow_start_s=0)
    trace = trace_from_rows((t * 0.5, 1, 1) for t in range(40))  # 2/s for 20 s
    plan = np.array([3] * 20 + [1] * 100, dtype=np.int64)
    policy = PlanPolicy(plan, lead_s=0, epoch=SimOptions().epoch)
    res = run(prepare(model, trace), policy, SimOptions(initial=3))
    s = res.summary()
    assert s["failed"] == 0 and s["completed"] == 40
    draining = res.column("draining")
    assert draining.max() == 2  # both drained instances stayed while busy
    assert s["instance_seconds"] > 3 * 20 + 1 * (s["duration_s"] - 20)


def test_injected_crashes_fail_requests_and_get_replaced() -> None:
    model = fixed_service(1.0, startup_s=10)
    trace = constant_rate(5, 1800)
    res = run(
        prepare(model, trace),
        make_policy(model, "fixed:3"),
        SimOptions(seed=2, crash_rate_per_hour=3.0),
    )
    s = res.summary()
    assert s["failed"] > 0
    assert s["peak_instances"] >= 3
    assert s["completed"] + s["failed"] + s["rejected"] == s["requests"]
    # replacements: the fleet returns to 3 after each crash
    assert res.column("current")[-1] == 3


def test_every_policy_pays_at_least_the_work_floor() -> None:
    model = fixed_service(0.5)
    work = prepare(model, poisson(20, 600, seed=4))
    for name in ("hpa", "kpa", "fixed:3"):
        s = run(work, make_policy(model, name)).summary()
        assert s["instance_seconds"] >= s["work_floor_instance_seconds"]


def test_quota_clips_at_the_pools_count() -> None:
    # the group alone on its pool: 3 units, one per instance; fixed:5 gets 3, and says why
    model = model_with(autoscaling={"policy": "sluice", "min": 1, "max": 8})
    spec = model.platform
    assert spec is not None
    pool = spec.pools[0].model_copy(update={"count": 3})
    small = dataclasses.replace(model, platform=spec.model_copy(update={"pools": [pool]}))
    work = prepare(small, constant_rate(20, 60))
    res = run(work, make_policy(small, "fixed:5"), SimOptions(initial=1))
    assert res.peak_instances == 3 and res.column("desired").max() == 3
    first = res.decisions[0]
    assert first["to"] == 3 and "quota" in first["clipped_by"]


def test_warm_standby_is_launched_beside_the_count() -> None:
    model = fixed_service(0.5, autoscaling={"min": 1, "max": 8, "warm_standby": 1})
    res = run(prepare(model, constant_rate(20, 60)), make_policy(model, "fixed:3"))
    assert res.initial_instances == 4 and res.peak_instances == 4
    assert res.column("desired")[-1] == 3 and res.column("alive")[-1] == 4


def test_a_burst_puts_the_warm_standby_in_rotation_at_once_and_the_next_decision_keeps_it() -> None:
    # 2 req/s for a minute (one instance, 4 slots, never a queue), then 20 req/s: the first
    # request that waits brings the standby in (as the gateway's `promote`), the tick after
    # takes it into the count in force and launches a new standby, before any signal of
    # the autoscaler's own asked for more
    rows = [(i / 2, 100, 10) for i in range(120)] + [(60 + i / 20, 100, 10) for i in range(1200)]
    results = {}
    for spare in (1, 0):
        model = fixed_service(0.5, autoscaling={"min": 1, "max": 8, "warm_standby": spare})
        results[spare] = run(prepare(model, trace_from_rows(rows)), make_policy(model, "sluice"))
    warm, cold = results[1], results[0]
    first = next(d for d in warm.decisions if d["t"] >= 60)
    assert first["t"] <= 61 and (first["from"], first["to"]) == (1, 2)
    assert "promoted the warm standby" in first["reason"], first["reason"]
    t = warm.column("t")
    after = (t > 61) & (t < 65)
    assert np.all(warm.column("ready")[after] >= 2)  # the standby serves...
    assert np.all(warm.column("alive")[after] >= 3)  # ...and a new one is on its way
    assert not any("promoted" in d["reason"] for d in cold.decisions)
    burst = warm.workload.trace.t >= 60
    waited = {k: float(np.mean((r.done - r.workload.trace.t)[burst])) for k, r in results.items()}
    assert waited[1] < 0.5 * waited[0], waited


def test_a_crash_loop_waits_before_each_replacement() -> None:
    # crashes every few seconds, 10 s start-up: replacements crash before any is ready,
    # so the kernel's backoff (1 s, 2 s, 4 s ...) holds launches back
    model = fixed_service(1.0, startup_s=10)
    work = prepare(model, constant_rate(5, 300))
    res = run(work, make_policy(model, "fixed:3"), SimOptions(seed=1, crash_rate_per_hour=1800))
    short = res.column("current") < 3
    assert short.mean() > 0.3  # a real loop: often short of its count
    assert res.summary()["failed"] > 0
