"""The fleet simulator lends a sleeping standby's units as the live controller does (issue
36): a `sim` group's sleeper (the sim worker has vLLM's sleep mode) on its lendable
guarantee is fenced while another group of its pool waits for units; that group borrows
them; a burst of the sleeper's own group reclaims them, and the sleeper is woken once
quota grants them back: after the reclaim's grace and the borrower's drain, long before a
start-up."""

from __future__ import annotations

import numpy as np
import pytest

import sluice.sim.fleet
from sluice.core import InstanceState, InstanceStatus
from sluice.policy.kernel import Memory, World
from sluice.policy.tick import TickDecision
from sluice.sim import InstanceModel, prepare
from sluice.sim.fleet import TICK_S, FleetResult, run_fleet
from sluice.spec import PlatformSpec, load_spec_text
from tests.unit.test_sim_fleet import arrivals, row
from tests.unit.test_sim_sleeping import served_between

SPEC = """
pools:
  - {name: gpu, count: 3, memory_gb: 16, price_per_hour: 2.0, host_memory_price_per_gb_hour: 0.01}
groups:
  - name: chat
    owner: o
    business: b
    alert_channel: c
    models:
      m: {runtime: sim, sim: {startup_s: 60, wake_s: 1, memory_gb: 4,
          service_time: {kind: fixed, seconds: 1}}}
    resources: {pool: gpu, memory_gb: 4}
    max_concurrency: 4
    replicas: 1
    warmup: {requests: 0}
    drain_timeout_s: 5
    queue: {max_length: 100000, max_wait_s: 600}
    slo: {latency_ms: 5000, target: 0.99}
    autoscaling: {min: 1, max: 3, SLEEPING}
    quota: {guaranteed: 2, lendable: 2, reclaim_grace_s: 2}
  - name: batch
    owner: o
    business: b
    alert_channel: c
    models:
      m: {runtime: sim, sim: {startup_s: 2, service_time: {kind: fixed, seconds: 1}}}
    resources: {pool: gpu, memory_gb: 1}
    max_concurrency: 4
    replicas: 1
    warmup: {requests: 0}
    drain_timeout_s: 5
    queue: {max_length: 100000, max_wait_s: 600}
    slo: {latency_ms: 5000, target: 0.99}
    autoscaling: {min: 1, max: 3}
    quota: {guaranteed: 1}
"""
BURST_AT = 200.0


def chat_rate(t: np.ndarray) -> np.ndarray:
    """1 req/s (one instance), then 6 req/s from BURST_AT (two instances of 4 slots x 1 s)."""
    return np.where(t < BURST_AT, 1.0, 6.0)


def batch_rate(t: np.ndarray) -> np.ndarray:
    return np.full_like(t, 6.0)  # two instances: its guarantee holds one


def lending_run(sleeping: int, lendable: int = 2, devices: bool = False) -> FleetResult:
    text = SPEC.replace("SLEEPING", f"sleeping_standby: {sleeping}")
    if devices:
        text = text.replace("count: 3,", "count: 3, devices: [0, 1, 2],")
    spec: PlatformSpec = load_spec_text(text.replace("lendable: 2", f"lendable: {lendable}")).spec
    traces = {"chat": arrivals(chat_rate, 320.0, 1), "batch": arrivals(batch_rate, 320.0, 2)}
    works = {}
    for name, trace in traces.items():
        g = spec.group(name)
        assert g is not None
        works[name] = prepare(InstanceModel.from_spec(spec, g), trace)
    return run_fleet(spec, works)


def test_a_sleepers_units_are_lent_and_reclaimed_for_its_groups_burst() -> None:
    lent = lending_run(1)
    chat, batch = row(lent, "chat"), row(lent, "batch")
    assert chat["lent_unit_hours"] > 0 and batch["borrowed_unit_hours"] > 0
    loans = [x for x in lent.ledger if x.lender == "chat" and x.borrower == "batch"]
    assert loans and loans[0].started_at < BURST_AT  # lent before the burst (virtual s)
    [reclaim] = [r for r in lent.reclaims if r.lender == "chat"]
    assert reclaim.borrower == "batch" and reclaim.asked_at > BURST_AT
    # fenced, the sleeper is not woken by the waiting requests: one instance serves (4/s)
    # until its unit is back; then it is woken (1 s), not started (60 s)
    c = lent.groups["chat"].sim
    assert reclaim.released_at is not None
    assert served_between(c, BURST_AT + 1.0, reclaim.asked_at) <= 4 * (reclaim.asked_at - BURST_AT)
    woke = reclaim.released_at + 1.0 + 2 * TICK_S
    assert served_between(c, woke, BURST_AT + 60.0) >= 5.5 * (BURST_AT + 60.0 - woke)
    # what lending trades: without sleeping standby chat's burst waits for a start-up
    # (60 s); with a sleeper that keeps its unit (lendable: 0) chat is served at once and
    # batch never gets a second unit
    cold, kept = lending_run(0), lending_run(1, lendable=0)
    assert row(cold, "chat")["slo_attainment"] + 0.3 < chat["slo_attainment"]
    assert row(kept, "chat")["slo_attainment"] >= chat["slo_attainment"]
    assert (
        row(kept, "chat")["lent_unit_hours"] == 0 and row(kept, "batch")["borrowed_unit_hours"] == 0
    )
    assert row(kept, "batch")["slo_attainment"] + 0.3 < batch["slo_attainment"]
    # asleep while lent: priced at host memory, not at the accelerator
    assert chat["sleeping_instance_seconds"] > 100


def test_on_a_pool_that_pins_devices_a_lent_sleepers_gpu_holds_one_awake_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same run on GPUs the pool pins: batch's borrower is placed on the sleeper's GPU
    (the only one left), and at no tick does a GPU hold two instances unless one is a
    sleeper whose units are lent; the sleeper wakes once the borrower has left it, and the
    outcome is the one on virtual units."""
    seen: list[World] = []
    real = sluice.sim.fleet.step

    def spy(memory: Memory, world: World, at: float) -> tuple[TickDecision, Memory]:
        seen.append(world)
        return real(memory, world, at)

    monkeypatch.setattr(sluice.sim.fleet, "step", spy)
    pinned = lending_run(1, devices=True)
    shared_with_sleeper = 0
    for world in seen:
        on: dict[str, list[InstanceStatus]] = {}
        for i in world.observed:
            if i.state is InstanceState.PENDING:
                assert not i.devices  # waiting for one
            elif i.state is not InstanceState.FAILED:
                assert i.devices, i
                for d in i.devices:
                    on.setdefault(d, []).append(i)
        for d, there in on.items():
            awake = [i for i in there if i.id not in world.fenced]
            assert len(awake) <= 1 and len(there) <= 2, (d, there)
            shared_with_sleeper += len(there) == 2
    assert shared_with_sleeper > 0  # batch ran on the lent sleeper's GPU
    virtual = lending_run(1)
    for name in ("chat", "batch"):
        assert row(pinned, name)["slo_attainment"] == pytest.approx(
            row(virtual, name)["slo_attainment"], abs=0.02
        )
    [reclaim] = [r for r in pinned.reclaims if r.lender == "chat"]
    assert reclaim.borrower == "batch" and reclaim.released_at is not None
