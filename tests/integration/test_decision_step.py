"""One brain, two bodies: the live controller's tick decides through the one pure step,
`sluice.policy.tick.decide` (the fleet simulator calls the same object: its own test), and
applies exactly the actions it returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sluice.control.controller as live
from sluice.policy import tick as step
from sluice.policy.plan import Launch
from tests.integration.test_advisory import controller, spec, ticks


@pytest.mark.asyncio
async def test_the_controller_applies_what_the_decision_step_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert live.decide is step.decide  # the very function, not a copy
    seen: list[step.TickDecision] = []

    def spy(inputs: step.TickInput) -> step.TickDecision:
        decision = step.decide(inputs)
        seen.append(decision)
        return decision

    monkeypatch.setattr(live, "decide", spy)
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
