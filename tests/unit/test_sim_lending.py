"""The fleet simulator lends a sleeping standby's units as the live controller does (issue
36): a `sim` group's sleeper (the sim worker has vLLM's sleep mode) on its lendable
guarantee is fenced while another group of its pool waits for units; that group borrows
them; a burst of the sleeper's own group reclaims them, and the sleeper is woken once
quota grants them back: after the reclaim's grace and the borrower's drain, long before a
start-up."""

from __future__ import annotations

import numpy as np

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


def lending_run(sleeping: int, lendable: int = 2) -> FleetResult:
    text = SPEC.replace("SLEEPING", f"sleeping_standby: {sleeping}")
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
