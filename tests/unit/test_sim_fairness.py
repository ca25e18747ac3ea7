"""Tenants' fair shares in the fleet simulator (issue 35): a queued request is offered with
its tenant, its cost (`answer_cost` of its true tokens) and its tenant's weight, as the
gateway offers it, so a light tenant beside a heavy one hardly waits, weights 2:1 give
service 2:1, and a trace without tenants runs exactly as before (plain FIFO)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import sluice.sim.fleet
from sluice.policy.admission import GroupAdmission, Offer, answer_cost
from sluice.sim import InstanceModel, Trace, Workload, prepare, trace_from_rows
from sluice.sim.fleet import FleetOptions, _shares, run_fleet
from sluice.sim.routed import route_trace, routed_outcomes
from sluice.spec import PlatformSpec, load_spec_text

# 2 instances x 4 slots; a request holds a slot 0.2 ms per cost unit (prompt + 2 x
# completion tokens): light (100, 50) 40 ms, heavy (200, 100) 80 ms; 8 slots serve 100
# heavy requests a second
SPEC = """
pools:
  - {name: gpu, count: 4, memory_gb: 16, price_per_hour: 2.0}
groups:
  - name: chat
    owner: o
    business: b
    alert_channel: c
    models:
      m: {runtime: sim, sim: {service_time: {kind: linear, a: 0, b: 0.0002, c: 0.0004}}}
    resources: {pool: gpu, memory_gb: 1}
    max_concurrency: 4
    replicas: 2
    warmup: {requests: 0}
    queue: {max_length: QUEUE, max_wait_s: WAIT}
    slo: {latency_ms: 60000, target: 0.99}
tenants:
  - {name: light}
  - {name: heavy}
  - {name: gold, weight: 2}
  - {name: bronze, weight: 1}
  - {name: solo, weight: 3}
routes:
  - {tag: chat, match: {models: [m]}, to: chat}
"""
LIGHT, HEAVY = (100, 50), (200, 100)


def spec_of(queue: int = 100_000, wait_s: float = 600.0) -> PlatformSpec:
    return load_spec_text(SPEC.replace("QUEUE", str(queue)).replace("WAIT", str(wait_s))).spec


def poisson(rate: float, seconds: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    out: list[float] = np.sort(rng.uniform(0.0, seconds, rng.poisson(rate * seconds))).tolist()
    return out


def rows(
    times: list[float], size: tuple[int, int], tenant: str, priority: str = "normal"
) -> list[tuple[object, ...]]:
    return [(t, *size, "m", tenant, priority) for t in times]


def run(spec: PlatformSpec, trace: Trace) -> tuple[Workload, np.ndarray]:
    g = spec.group("chat")
    assert g is not None
    work = prepare(InstanceModel.from_spec(spec, g), trace)
    result = run_fleet(spec, {"chat": work}, FleetOptions(seed=1))
    return work, result.groups["chat"].sim.done


def collapsed(trace: Trace, name: str) -> Trace:
    """The same requests, all of one tenant `name`."""
    return trace_from_rows(
        (
            (t, i, o, "m", name, p)
            for t, i, o, p in zip(
                trace.t.tolist(),
                trace.input_tokens.tolist(),
                trace.output_tokens.tolist(),
                (("high", "normal", "low")[x] for x in trace.priority.tolist()),
                strict=True,
            )
        ),
        trace.name,
    )


def waits(work: Workload, done: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Seconds each request of `mask` waited in the queue (completed ones)."""
    ok = mask & (done >= 0)
    return done[ok] - work.trace.t[ok] - work.service[ok]


def test_a_light_tenant_beside_a_heavy_one_waits_far_less_than_under_fifo() -> None:
    # the light tenant: 16 req/s; the heavy one: 110 req/s, over the group's 100, so its
    # queue grows all along (~3,800 requests in 30 s)
    spec = spec_of()
    trace = trace_from_rows(
        rows(poisson(16, 30, 1), LIGHT, "light") + rows(poisson(110, 30, 2), HEAVY, "heavy")
    )
    light = trace.tenant == trace.tenants.index("light")
    work, fair = run(spec, trace)
    _, fifo = run(spec, collapsed(trace, "solo"))
    fair_p95 = float(np.percentile(waits(work, fair, light), 95))
    fifo_p95 = float(np.percentile(waits(work, fifo, light), 95))
    assert fifo_p95 > 1.0  # behind the heavy tenant's backlog
    assert fair_p95 < 0.05  # about one slot's turn (80 ms / 8)
    assert fair_p95 < 0.02 * fifo_p95
    assert np.all(fair >= 0) and np.all(fifo >= 0)  # everyone is served in the end


def test_weights_two_to_one_give_service_within_ten_percent_of_two_to_one() -> None:
    # gold (weight 2) sends light requests, bronze (weight 1) heavy ones, each more than
    # its share of the group (40,000 cost units/s): both stay backlogged
    spec = spec_of()
    trace = trace_from_rows(
        rows(poisson(150, 20, 3), LIGHT, "gold") + rows(poisson(100, 20, 4), HEAVY, "bronze")
    )
    work, done = run(spec, trace)
    dispatched = done - work.service
    window = (dispatched >= 5.0) & (dispatched < 20.0)
    cost = np.asarray(
        [answer_cost(i, o) for i, o in zip(trace.input_tokens, trace.output_tokens, strict=True)]
    )
    service = {
        name: float(cost[window & (trace.tenant == k)].sum())
        for k, name in enumerate(trace.tenants)
    }
    assert service["gold"] / service["bronze"] == pytest.approx(2.0, rel=0.10)


def test_a_routed_run_reports_each_tenants_queue_waits() -> None:
    spec = spec_of()
    trace = trace_from_rows(
        rows(poisson(16, 30, 1), LIGHT, "light") + rows(poisson(110, 30, 2), HEAVY, "heavy")
    )
    routed = route_trace(spec, trace)
    g = spec.group("chat")
    assert g is not None
    work = prepare(InstanceModel.from_spec(spec, g), routed.groups["chat"])
    out = routed_outcomes(routed, run_fleet(spec, {"chat": work}))
    light, heavy = out["tenants"]["light"], out["tenants"]["heavy"]
    for o in (light, heavy, out["routes"]["chat"]):
        assert {"p50_ms", "p95_ms", "p99_ms", "wait_p50_ms", "wait_p95_ms", "wait_p99_ms"} <= set(o)
        assert 0 <= o["wait_p50_ms"] <= o["wait_p95_ms"] <= o["wait_p99_ms"] <= o["p99_ms"]
    assert light["wait_p95_ms"] < 50 < 1000 < heavy["wait_p95_ms"]


def test_the_offer_carries_answer_cost_and_the_spec_weight() -> None:
    spec = spec_of()
    trace = trace_from_rows(
        [(0.0, 100, 50, "m", "gold"), (0.1, 7, 3, "m", "stranger"), (0.2, 200, 100, "m", "light")]
    )
    g = spec.group("chat")
    assert g is not None
    work = prepare(InstanceModel.from_spec(spec, g), trace)
    tenant, cost, weight = _shares(work, {t.name: t.weight for t in spec.tenants})
    assert tenant.tolist() == ["gold", "stranger", "light"]
    assert cost.tolist() == [answer_cost(100, 50), answer_cost(7, 3), answer_cost(200, 100)]
    assert weight.tolist() == [2.0, 1.0, 1.0]


class _Before(GroupAdmission[Any]):
    """The queue as the simulator offered to it before tenants: every request one tenant."""

    def offer_nowait(
        self,
        item: Any,
        priority: str,
        now: float,
        tenant: str = "",
        cost: float = 1.0,
        weight: float = 1.0,
    ) -> tuple[Offer, Any]:
        return super().offer_nowait(item, priority, now)


def test_a_trace_without_tenants_runs_exactly_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    # a busy group with a short queue and short waits: requests are queued, shed, evicted
    # (by priority) and expired
    spec = spec_of(queue=200, wait_s=2.0)
    prios = ("high", "normal", "low")
    heavy = [(t, *HEAVY, "m", "heavy", prios[k % 3]) for k, t in enumerate(poisson(120, 20, 5))]
    light = [(t, *LIGHT, "m", "light", prios[k % 3]) for k, t in enumerate(poisson(30, 20, 6))]
    trace = trace_from_rows(heavy + light)
    plain = collapsed(trace, "")
    assert plain.tenants == ("",)
    _, now = run(spec, plain)
    _, named = run(spec, collapsed(trace, "solo"))  # one tenant of weight 3: FIFO too
    with monkeypatch.context() as m:
        m.setattr(sluice.sim.fleet, "GroupAdmission", _Before)
        _, before = run(spec, plain)
    assert np.array_equal(now, before)
    assert np.array_equal(named, before)
    assert np.count_nonzero(before < 0) > 100  # shed or expired: the queue was exercised
    _, fair = run(spec, trace)
    assert not np.array_equal(fair, before)  # while two tenants do share


def test_tenants_alone_in_their_priority_queue_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    # two tenants, each alone in its priority: their offers carry tenants, costs and weights,
    # and each band is still FIFO, so every request is done when it was before
    spec = spec_of(queue=200, wait_s=2.0)
    trace = trace_from_rows(
        rows(poisson(120, 20, 7), HEAVY, "heavy", "low")
        + rows(poisson(30, 20, 8), LIGHT, "gold", "high")
    )
    _, now = run(spec, trace)
    with monkeypatch.context() as m:
        m.setattr(sluice.sim.fleet, "GroupAdmission", _Before)
        _, before = run(spec, trace)
    assert np.array_equal(now, before)
    assert np.count_nonzero(before < 0) > 100
