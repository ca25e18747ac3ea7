"""One brain, two bodies: the live controller's tick decides through the one pure kernel,
`sluice.policy.kernel.step` (the fleet simulator calls the same object: its own test), and
applies exactly the actions it returns; a recorded live run replays through it tick by tick."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import sluice.control.controller as live
from sluice.policy import kernel
from sluice.policy import tick as step
from sluice.policy.plan import Launch
from sluice.sim.fleet import FleetOptions, run_fleet
from sluice.spec import load_spec_text
from tests.integration.test_advisory import controller, spec, ticks


@pytest.mark.asyncio
async def test_the_controller_applies_what_the_decision_step_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert live.step is kernel.step  # the very function, not a copy
    seen: list[step.TickDecision] = []

    def spy(
        memory: kernel.Memory, world: kernel.World, now: float
    ) -> tuple[step.TickDecision, kernel.Memory]:
        decision, after = kernel.step(memory, world, now)
        seen.append(decision)
        return decision, after

    monkeypatch.setattr(live, "step", spy)
    async with controller(tmp_path, spec(mode="active")) as (ctl, sup, _store, clock):
        await ticks(ctl, clock, 3)
        assert len(seen) == 3  # every tick, once
        launches = sum(isinstance(a, Launch) for d in seen for a in d.actions)
        assert launches > 0 and sup.launched == launches  # nothing more, nothing less
        counts: dict[str, Any] = {}
        for d in seen:
            counts.update(d.counts)
        assert ctl.desired_replicas("chat") == counts["chat"]
        assert all(ctl.tier(i) in (step.STABLE, step.BURST) for i in sup.instances)
        metrics = ctl.server_metrics().decode()
        assert "sluice_controller_decide_seconds_count 3.0" in metrics
        assert "sluice_controller_tick_seconds_bucket" in metrics


def _view(d: step.TickDecision) -> tuple[Any, ...]:
    """What a decision says: actions, counts, each scaled group's count and reasons, tiers,
    grants, and the policies' next memories."""
    scaled = [(s.group.name, s.count, s.guards, s.reason, s.decision) for s in d.scaled]
    grants = d.allocation.enforced.grants
    return (d.actions, dict(d.counts), scaled, dict(d.tiers), grants, dict(d.memories))


@pytest.mark.asyncio
async def test_a_recorded_live_run_replays_through_the_kernel_tick_by_tick(
    tmp_path: Path,
) -> None:
    """The controller's journal port records each tick's memory, world and decision; from
    the first memory, the recorded worlds give the same decisions and the same memories,
    tick by tick. The same input twice decides the same and changes nothing it was given."""
    records: list[tuple[kernel.Memory, kernel.World, float, step.TickDecision]] = []
    async with controller(tmp_path, spec(mode="active")) as (ctl, _sup, _store, clock):
        ctl.journal = lambda m, w, now, d: records.append((m, w, now, d))
        await ticks(ctl, clock, 12)
    assert len(records) == 12
    assert any(d.counts for *_, d in records) and any(d.actions for *_, d in records)
    memory = records[0][0]
    for recorded, world, now, decision in records:
        assert memory == recorded
        again, memory = kernel.step(memory, world, now)
        assert _view(again) == _view(decision)
    first, world, now, _ = records[6]
    kept = copy.deepcopy(first)
    a, after_a = kernel.step(first, world, now)
    b, after_b = kernel.step(first, world, now)
    assert _view(a) == _view(b) and after_a == after_b and first == kept


BUDGETED = """
pools:
  - {name: gpu, count: 4, memory_gb: 16, price_per_hour: 2.0}
groups:
  - name: chat
    owner: o@example.com
    business: search
    alert_channel: "#ops"
    models:
      m: {runtime: sim}
    resources: {pool: gpu, memory_gb: 1}
    replicas: 3
    quota: {guaranteed: 1}
    budget: {max_accelerators: 2}
tenants:
  - {name: t, api_keys: [sk-t-12ccad2ae47ed66b]}
"""


@pytest.mark.asyncio
async def test_live_and_simulated_fleets_cut_the_same_burst_instance_for_a_budget(
    tmp_path: Path,
) -> None:
    """Same inputs, same decision: 3 instances on a guarantee of 1 under a 2-accelerator
    budget; the controller and the fleet simulator both drain the newest burst instance,
    for the same reason, and keep the stable one."""
    loaded = load_spec_text(BUDGETED, "budget.yaml")
    drained: list[tuple[str, str]] = []
    async with controller(tmp_path, loaded) as (ctl, sup, _store, clock):
        ids = sorted(sup.instances, key=lambda i: sup.instances[i].created_at)
        plain_drain = sup.drain

        def drain(instance_id: str, reason: str) -> None:
            drained.append((instance_id, reason))
            plain_drain(instance_id, reason)

        sup.drain = drain  # type: ignore[method-assign]
        await ticks(ctl, clock, 1)
        live_tiers = {i: ctl.tier(i) for i in ids}
    result = run_fleet(loaded.spec, {}, FleetOptions(end_s=1.0))
    (stop,) = result.groups["chat"].stops
    assert stop["action"] == "drain" and stop["tier"] == step.BURST
    ((live_id, live_reason),) = drained
    assert live_id == ids[-1]  # the newest, a burst instance, as in the simulator
    assert live_tiers == {ids[0]: step.STABLE, ids[1]: step.BURST, ids[2]: step.BURST}
    assert stop["instance"].endswith("000002")
    assert live_reason == stop["reason"]
    assert "budget" in live_reason and "max_accelerators" in live_reason


@pytest.mark.asyncio
async def test_metrics_show_each_groups_tiers_quota_units_and_spend(tmp_path: Path) -> None:
    """`/metrics` after the budget cut above: per group, instances by state and tier, the
    quota units (the drained one still held while it drains) and the spend rate."""
    async with controller(tmp_path, load_spec_text(BUDGETED, "budget.yaml")) as (ctl, *_rest):
        clock = _rest[-1]
        await ticks(ctl, clock, 1)
        text = ctl.server_metrics().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return samples[name, tuple(sorted({"group": "chat", **labels}.items()))]

    assert value("sluice_group_instances", state="ready") == 2  # the cut one is gone
    assert value("sluice_group_tier_instances", tier="stable") == 1
    assert value("sluice_group_tier_instances", tier="burst") == 1
    assert value("sluice_group_quota_units", pool="gpu", kind="guaranteed") == 1
    assert value("sluice_group_quota_units", pool="gpu", kind="held") == 3  # one draining
    assert value("sluice_group_quota_units", pool="gpu", kind="borrowed") == 2
    assert value("sluice_group_spend_per_hour") == 6.0  # 3 units x 2.0
