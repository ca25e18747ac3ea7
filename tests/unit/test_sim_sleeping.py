"""The simulator's sleeping standby (issue 36): placed by the live `split_standby`, put to
sleep once ready, never routed while it falls asleep, sleeps or wakes; a burst that waits
with no warm standby left wakes one (served `wake_s` later, not a launch's start-up later),
and the kernel takes it into the count; asleep time is priced at `sleeping_cost_ratio`."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sluice.sim.fleet
from sluice.sim import InstanceModel, SimResult, make_policy, prepare, run, trace_from_rows
from sluice.sim.fleet_inputs import sleep_params
from sluice.sim.result import (
    ACCELERATOR_PRICE_PER_HOUR,
    HOST_MEMORY_PRICE_PER_GB_HOUR,
    sleeping_cost_ratio,
)
from tests.unit.test_sim_single import model_with

QUIET = [(i / 2, 100, 10) for i in range(120)]
"""2 requests/s for a minute: one instance (4 slots, 0.5 s each) never queues"""
BURST = QUIET + [(60 + i / 20, 100, 10) for i in range(1200)]
"""then 20 requests/s for a minute: a queue at once"""


def sleepy(sleeping: int = 1, warm: int = 0, **sim: Any) -> InstanceModel:
    """0.5 s a request, 4 slots, 30 s start-up; the group keeps `sleeping` sleeping standby
    (a `sim` worker has vLLM's sleep mode)."""
    return model_with(
        models={
            "m": {
                "runtime": "sim",
                "sim": {
                    "startup_s": 30,
                    "memory_gb": 1,
                    "service_time": {"kind": "fixed", "seconds": 0.5},
                    **sim,
                },
            }
        },
        autoscaling={"min": 1, "max": 8, "sleeping_standby": sleeping, "warm_standby": warm},
    )


def dispatches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, int, int]]:
    """Every heap entry the run pushes: (t, kind, r); kind >= 0 is request r's completion on
    instance `kind` (pushed when it is dispatched there)."""
    pushed: list[tuple[float, int, int]] = []
    real = sluice.sim.fleet.heappush

    def push(heap: list[tuple[float, int, int]], item: tuple[float, int, int]) -> None:
        pushed.append(item)
        real(heap, item)

    monkeypatch.setattr(sluice.sim.fleet, "heappush", push)
    return pushed


def served_between(res: SimResult, t0: float, t1: float) -> int:
    return int(np.count_nonzero((res.done >= t0) & (res.done < t1)))


def test_a_burst_wakes_the_sleeper_which_serves_after_the_wake_not_a_start_up() -> None:
    runs = {}
    for sleeping in (1, 0):
        model = sleepy(sleeping, wake_s=2.0)
        runs[sleeping] = run(prepare(model, trace_from_rows(BURST)), make_policy(model, "sluice"))
    slept, cold = runs[1], runs[0]
    assert slept.initial_instances == 2 and cold.initial_instances == 1
    # one instance serves 8 requests/s; nothing else can serve before 60 + 30 s but a
    # woken sleeper, from 2 s after the first request waited (60.2 s)
    assert served_between(slept, 60.5, 62.0) <= 8 * 1.5 + 4
    assert served_between(slept, 63.0, 89.0) >= 1.8 * 8 * 26
    assert served_between(cold, 63.0, 89.0) <= 1.1 * 8 * 26
    # ... and the kernel took it into the count: 2 in force from the next ticks on
    t = slept.column("t")
    assert np.all(slept.column("desired")[(t >= 64) & (t < 70)] >= 2)
    burst = slept.workload.trace.t >= 60
    waited = {k: float(np.mean((r.done - r.workload.trace.t)[burst])) for k, r in runs.items()}
    assert waited[1] < 0.5 * waited[0], waited


@pytest.mark.parametrize("warm", [0, 1])
def test_a_burst_wakes_as_many_sleepers_at_once_as_its_waiting_requests_need(warm: int) -> None:
    """40 requests/s on instances serving 8/s each: the queue outgrows one sleeper's 4
    slots at once, so the gateway wakes both sleepers (beside the warm standby it puts in
    rotation first), not one after another: from 2 s after the burst began, all 1 + warm +
    2 instances serve, busy."""
    flood = QUIET + [(60 + i / 40, 100, 10) for i in range(1200)]
    model = sleepy(2, warm=warm, wake_s=2.0)
    res = run(prepare(model, trace_from_rows(flood)), make_policy(model, "sluice"))
    assert res.initial_instances == 1 + warm + 2
    served = served_between(res, 62.5, 65.0)
    assert served >= 0.95 * (1 + warm + 2) * 8 * 2.5, served
    # counted as a live gateway counts them (`sluice_gateway_standby_*_total`)
    summary = res.summary()
    assert summary["standby_wakes"] == 2 and summary["standby_promotions"] >= 1, summary
    plain = sleepy(0)
    assert (
        "standby_wakes"
        not in run(prepare(plain, trace_from_rows(flood)), make_policy(plain, "sluice")).summary()
    )


def test_the_woken_sleeper_is_promoted_into_the_count_as_warm_standby_is() -> None:
    # a wake shorter than a tick: the gateway routes to it before the autoscaler has seen
    # the burst, and the kernel's next decision takes it in (`standby_in_rotation`)
    model = sleepy(1, wake_s=0.3)
    res = run(prepare(model, trace_from_rows(BURST)), make_policy(model, "sluice"))
    first = next(d for d in res.decisions if d["t"] >= 60)
    assert first["t"] <= 61 and (first["from"], first["to"]) == (1, 2)
    assert "promoted the warm standby" in first["reason"], first["reason"]


def test_instances_asleep_falling_asleep_or_waking_are_never_routed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pushed = dispatches(monkeypatch)
    model = sleepy(2, sleep_s=1.0, wake_s=2.0)
    res = run(prepare(model, trace_from_rows(BURST)), make_policy(model, "sluice"))
    assert res.summary()["sleeping_instance_seconds"] > 100  # two slept a minute at least
    asleep: dict[int, list[list[float]]] = {}
    for t, kind, k in sorted(pushed):
        if kind == sluice.sim.fleet._SLEPT:  # asleep from the sleep's start (t - sleep_s)
            asleep.setdefault(k, []).append([t - 1.0, np.inf])
        elif kind == sluice.sim.fleet._AWAKE:
            asleep[k][-1][1] = t
    # the two at t = 0 are woken by the burst, one after the other (the second once the
    # kernel took the first in and requests still waited); the standby launched anew sleeps
    assert asleep[1][0][1] < asleep[2][0][1] < 70, asleep
    assert len(asleep) > 2
    routed = [(t - 0.5, kind) for t, kind, _ in pushed if kind >= 0]  # dispatched at t - 0.5
    assert routed
    for at, k in routed:
        for lo, hi in asleep.get(k, ()):
            assert not lo <= at < hi, (k, at, lo, hi)


def test_a_sleeper_that_is_never_woken_serves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    pushed = dispatches(monkeypatch)
    model = sleepy(1, wake_s=500.0)  # the wake outlasts the run
    res = run(prepare(model, trace_from_rows(BURST)), make_policy(model, "fixed:1"))
    on = {kind for _, kind, _ in pushed if kind >= 0}
    assert on == {0}, on  # the first instance serves; the sleeper (1) never does
    assert res.summary()["completed"] == len(BURST)


def test_asleep_time_is_priced_at_host_memory_over_the_accelerator() -> None:
    model = sleepy(2, host_memory_gb=16, sleep_s=1.0)
    res = run(prepare(model, trace_from_rows(QUIET)), make_policy(model, "fixed:1"))
    s = res.summary()
    ratio = 16 * HOST_MEMORY_PRICE_PER_GB_HOUR / ACCELERATOR_PRICE_PER_HOUR
    assert s["sleeping_cost_ratio"] == pytest.approx(ratio) == sleeping_cost_ratio(16)
    assert 0.005 < ratio < 0.01  # 16 GB of RAM vs one H100, at the stated prices
    # three instances the whole run, two of them asleep from 1 s on
    end = s["duration_s"]
    assert s["instance_seconds"] == pytest.approx(3 * end)
    assert s["sleeping_instance_seconds"] == pytest.approx(2 * (end - 1.0))
    priced = 3 * end - 2 * (end - 1.0) * (1 - ratio)
    assert s["priced_instance_seconds"] == pytest.approx(priced)
    assert s["cost"] == pytest.approx(priced / 3600 * model.price_per_hour)
    # warm standby, and a group without standby, are priced in full as before
    warm = sleepy(0, warm=2)
    w = run(prepare(warm, trace_from_rows(QUIET)), make_policy(warm, "fixed:1")).summary()
    assert "sleeping_instance_seconds" not in w
    assert w["cost"] == pytest.approx(w["instance_seconds"] / 3600 * warm.price_per_hour)


def test_a_pool_that_prices_host_memory_prices_the_sleepers_at_its_own_prices() -> None:
    model = sleepy(1, host_memory_gb=16)
    pool = model.platform.pool(model.group.resources.pool) if model.platform else None
    assert pool is not None and pool.price_per_hour > 0
    assert sleep_params(model.group, pool).ratio == pytest.approx(sleeping_cost_ratio(16))
    priced = pool.model_copy(update={"host_memory_price_per_gb_hour": 0.01})
    assert sleep_params(model.group, priced).ratio == pytest.approx(
        16 * 0.01 / (model.group.resources.accelerators * pool.price_per_hour)
    )
