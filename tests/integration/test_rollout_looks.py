"""The live runner spends each planned look once (issue 32): with looks falling due every
tick and no pause between analyses, every analysis that takes a look counts from the looks
the state machine has accepted, so the looks form one chain (each starts where the one
before ended) and the alpha spent is the plan's, once each."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sluice.control import rollouts as runner_module
from sluice.control.rollouts import RolloutRunner
from sluice.control.samples import GroupSamples
from sluice.policy.analysis import Analysis, RequestSample
from sluice.spec import load_spec_text
from tests.integration.test_control_resilience import GROUP, SPEC

ROLLOUT = """
rollouts:
  - name: r1
    baseline: chat
    canary: chat-v2
    steps: [50, 100]
    hold_s: 1
    analysis: {min_samples: 400}
"""


class Collector:
    """The sample collector's face to the runner: windows filled by the test, every answer
    known up to `now`."""

    def __init__(self) -> None:
        self.windows: dict[str, GroupSamples] = {}
        self.now = 0.0

    def reset(self, groups: Any, now: float, capacity: int = 5000) -> None:
        for g in groups:
            self.windows[g] = GroupSamples(since=now, capacity=capacity)

    def window(self, group: str) -> GroupSamples:
        return self.windows.setdefault(group, GroupSamples())

    def through(self, group: str) -> float | None:
        return self.now

    def latencies(self, group: str) -> list[float]:
        return [0.01]

    def watch(self, instances: Any, from_gateway: Any = ()) -> None:
        list(instances)

    def status(self) -> dict[str, Any]:
        return {}

    async def aclose(self) -> None:
        return None


class Store:
    def add_rollout(self, **_: Any) -> int:
        return 1

    def update_rollout(self, *_: Any, **__: Any) -> None:
        return None


class Events:
    async def emit(self, *_: Any, **__: Any) -> None:
        return None


@pytest.mark.asyncio
async def test_looks_due_a_tick_apart_are_each_spent_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = GROUP.format(name="chat", model="m", replicas=1)
    groups += GROUP.format(name="chat-v2", model="m", replicas=1)
    spec = load_spec_text(SPEC.format(groups=groups, rollouts=ROLLOUT)).spec
    taken: list[tuple[int, Analysis]] = []  # (looks counted from, the result)
    real = runner_module.analyze

    def recording(*args: Any, **kwargs: Any) -> Analysis:
        result = real(*args, **kwargs)
        if result.look:
            taken.append((kwargs["looks_done"], result))
        return result

    monkeypatch.setattr(runner_module, "analyze", recording)
    monkeypatch.setattr(runner_module, "ANALYSIS_PAUSE", 0.0)  # the next one is due at once
    collector = Collector()
    runner = RolloutRunner(Store(), Events(), collector, lambda: None)  # type: ignore[arg-type]
    now = 1000.0
    collector.now = now
    await runner.start(spec, "r1", lambda _g: 1, "tester", "test", now)
    for _ in range(60):
        now += 1.0
        collector.now = now
        for g in ("chat", "chat-v2"):
            win = collector.window(g)
            for i in range(40):  # arrived in the second before the last, done at once
                win.add(RequestSample(200, 0.01, arrived_at=now - 2.0 + i / 40))
            win.version += 1
        await runner.tick(spec, [], now)
        await asyncio.sleep(0.02)  # the analysis thread finishes before the next second
        state = runner.live_state("r1")
        assert state is not None
        if state.final:
            break
    await runner.aclose()
    assert state.phase.value == "promoted", state.transitions[-1].reason
    plan = runner_module.plan_rollout(spec.rollouts[0])
    chain = [(done, a.look) for done, a in taken]
    assert len(chain) >= 4, chain  # both steps took looks
    looks, spent, step = 0, 0.0, 0
    for done, a in taken:
        if done == 0 and looks:  # the next step's first look
            looks, spent, step = 0, 0.0, step + 1
        assert done == looks, chain  # counts from the looks accepted: none spent twice
        looks, spent = a.look, spent + a.alpha
        assert spent <= sum(plan.step(step).alphas) + 1e-12
