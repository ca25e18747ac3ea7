"""The live side of canary rollouts (C1-C6): feed each running rollout's pure state machine
(`sluice.policy.rollout`) once per tick with the samples its two groups' instances report,
hand the gateway the split it asks for, and archive every change.

A rollback is one tick (at most a second): the state machine returns no split, the next
routing snapshot sends everything to the baseline, which stayed scaled for all of its traffic
(`baseline_floors`). The canary keeps running for inspection until an operator removes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.control.events import EventLog
from sluice.control.samples import GroupSamples, SampleCollector
from sluice.core import Conflict, InstanceState, InstanceStatus, NotFound
from sluice.policy import rollout as machine
from sluice.policy.analysis import RequestSample, ResourceUse, analyze
from sluice.policy.rollout import RolloutPhase, RolloutState
from sluice.policy.routing import CanarySplit
from sluice.spec import PlatformSpec
from sluice.spec.rollout import RolloutSpec
from sluice.store import RolloutRecord, Store
from sluice.tools.compare import CompareOptions, Target, compare

__all__ = ["RolloutRunner"]

log = logging.getLogger("sluice.rollouts")

ACTIONS = ("pause", "resume", "promote", "abort")


@dataclass
class _Run:
    """One running rollout: its archive row, its state, and the analysis windows."""

    id: int
    spec: RolloutSpec
    state: RolloutState
    baseline_floor: int
    window_at: float | None = None
    compare_task: asyncio.Task[None] | None = None
    previous_baseline: list[dict[str, Any]] = field(default_factory=list)
    """the baseline's samples of the step before (the 100% step compares against them)"""
    previous_use: ResourceUse | None = None


class RolloutRunner:
    def __init__(
        self,
        store: Store,
        events: EventLog,
        collector: SampleCollector,
        on_change: Callable[[], None],
    ) -> None:
        """`on_change` publishes the routing snapshot: called the moment a split changes,
        before anything is written, so a rollback reaches the gateway first."""
        self._on_change = on_change
        self._store = store
        self._events = events
        self._collector = collector
        self._runs: dict[str, _Run] = {}
        self._urls: Callable[[str], str | None] = lambda _group: None

    async def aclose(self) -> None:
        for run in self._runs.values():
            if run.compare_task is not None:
                run.compare_task.cancel()
        await self._collector.aclose()

    async def load(self, spec: PlatformSpec) -> None:
        """The latest run of each rollout in the spec: a running one resumes, a promoted one
        keeps sending the baseline's traffic to the canary."""
        for rs in spec.rollouts:
            found = await asyncio.to_thread(self._store.list_rollouts, name=rs.name, limit=1)
            if found:
                self._runs[rs.name] = _resume(found[0])

    def baseline_floors(self) -> dict[str, int]:
        """Baseline group -> the instance count it had when its rollout started: it keeps
        that many while the rollout runs, so a rollback needs no scale-up (C2)."""
        return {r.spec.baseline: r.baseline_floor for r in self._runs.values() if not r.state.final}

    def splits(self, spec: PlatformSpec) -> list[CanarySplit]:
        """The gateway's splits: running rollouts at their step, promoted ones at 100%, for
        rollouts still in the spec (removing one from the spec ends its split)."""
        names = {r.name for r in spec.rollouts}
        out = []
        for name, run in self._runs.items():
            split = machine.split_for(run.spec, run.state) if name in names else None
            if split is not None:
                out.append(split)
        return out

    async def start(
        self,
        spec: PlatformSpec,
        name: str,
        baseline_count: Callable[[str], int],
        actor: str,
        reason: str,
        now: float,
    ) -> RolloutState:
        rs = next((r for r in spec.rollouts if r.name == name), None)
        if rs is None:
            known = ", ".join(r.name for r in spec.rollouts) or "none in the spec"
            raise NotFound(f"no rollout named {name!r}; rollouts: {known}", rollout=name)
        running = self._runs.get(name)
        if running is not None and not running.state.final:
            raise Conflict(f"rollout {name!r} is already {running.state.phase}", rollout=name)
        state = machine.start(rs, now, reason=reason, by=actor)
        floor = baseline_count(rs.baseline)
        run_id = await asyncio.to_thread(
            self._store.add_rollout,
            name=name,
            baseline=rs.baseline,
            canary=rs.canary,
            phase=state.phase.value,
            started_by=actor,
            spec={**rs.model_dump(mode="json"), "baseline_floor": floor},
            state=state.to_json(),
            now=now,
        )
        run = self._runs[name] = _Run(run_id, rs, state, floor)
        self._on_change()
        if rs.compare is not None:
            run.compare_task = asyncio.create_task(self._compare(run), name=f"compare-{name}")
        await self._events.emit(
            rs.canary, None, "rollout", f"{name}: {state.transitions[-1].reason}"
        )
        return state

    async def act(
        self, name: str, action: str, actor: str, reason: str, now: float
    ) -> RolloutState:
        """An operator's pause, resume, promote or abort."""
        run = self._runs.get(name)
        if run is None:
            raise NotFound(f"rollout {name!r} was never started", rollout=name)
        if action == "pause":
            state = machine.pause(run.state, now, reason, actor)
        elif action == "resume":
            state = machine.resume(run.state, now, reason, actor)
        elif action == "promote":
            state = machine.promote(run.spec, run.state, now, reason, actor)
        elif action == "abort":
            state = machine.abort(run.state, now, reason, actor)
        else:
            raise NotFound(f"no rollout action {action!r}; actions: {', '.join(ACTIONS)}")
        await self._save(run, state, now)
        return state

    async def tick(
        self, spec: PlatformSpec, observed: Sequence[InstanceStatus], now: float
    ) -> None:
        """Poll the instances of every running rollout's groups, analyse the current step's
        window, and move each state machine on (a rollout that left `spec` holds still)."""
        names = {r.name for r in spec.rollouts}
        stepping = [r for r in self._runs.values() if not r.state.final]
        if not stepping:
            return
        groups = {g for r in stepping for g in (r.spec.baseline, r.spec.canary)}
        await self._collector.poll(
            (i.group, i.id, i.url)
            for i in observed
            if i.group in groups and i.state is InstanceState.READY and i.url
        )
        for run in stepping:
            if run.spec.name not in names:
                continue  # the rollout left the spec; its state holds until it is back
            self._roll_window(run)
            base = self._collector.window(run.spec.baseline)
            canary = self._collector.window(run.spec.canary)
            base_rows, base_use = base.samples, _use(base)
            if run.state.percent >= 100.0 and run.previous_baseline:
                base_rows, base_use = run.previous_baseline, run.previous_use
            analysis = analyze(
                [RequestSample.from_json(s) for s in base_rows],
                [RequestSample.from_json(s) for s in canary.samples],
                base_use,
                _use(canary),
                run.spec.analysis,
            )
            state = machine.evaluate(run.spec, run.state, analysis, now)
            if state.transitions != run.state.transitions:
                await self._save(run, state, now)
            else:
                run.state = state  # latest analysis kept in memory; archived on change

    def _roll_window(self, run: _Run) -> None:
        """A new step (or a resume) starts a new analysis window for both groups."""
        started = run.state.step_started_at
        if started is None or started == run.window_at:
            return
        base = self._collector.window(run.spec.baseline)
        if run.window_at is not None and base.samples:
            run.previous_baseline, run.previous_use = list(base.samples), _use(base)
        run.window_at = started
        self._collector.reset((run.spec.baseline, run.spec.canary), started)

    def point_at(self, urls: Callable[[str], str | None]) -> None:
        """`urls(group)`: a READY instance's base URL (the compare run's targets)."""
        self._urls = urls

    async def _compare(self, run: _Run) -> None:
        """C5 at the start of a rollout: the suite against one baseline and one canary
        instance, straight to the instances; the report goes into the archive (C6)."""
        assert run.spec.compare is not None
        try:
            for _ in range(600):  # the canary may still be warming up
                base, canary = self._urls(run.spec.baseline), self._urls(run.spec.canary)
                if base and canary:
                    break
                await asyncio.sleep(1.0)
            else:
                raise TimeoutError("no ready instance on both sides within 10 minutes")
            report = await asyncio.wait_for(
                compare(
                    Path(run.spec.compare.suite),
                    Target(f"group:{run.spec.baseline}", base, run.spec.baseline),
                    Target(f"group:{run.spec.canary}", canary, run.spec.canary),
                    CompareOptions(),
                ),
                run.spec.compare.timeout_s,
            )
        except Exception as exc:  # archived as the compare result; never stops the rollout
            log.warning("rollout %s: compare failed: %s", run.spec.name, exc)
            report = {"error": f"{type(exc).__name__}: {exc}"}
        await asyncio.to_thread(
            self._store.update_rollout,
            run.id,
            phase=run.state.phase.value,
            state=run.state.to_json(),
            now=run.state.transitions[-1].at if run.state.transitions else 0.0,
            compare=report,
        )

    async def _save(self, run: _Run, state: RolloutState, now: float) -> None:
        before = run.state
        run.state = state
        self._on_change()
        final = state.final
        await asyncio.to_thread(
            self._store.update_rollout,
            run.id,
            phase=state.phase.value,
            state=state.to_json(),
            now=now,
            ended=final,
            conclusion=state.conclusion if final else None,
        )
        for t in state.transitions[len(before.transitions) :]:
            kind = "rollback" if t.to_phase is RolloutPhase.ROLLED_BACK else "rollout"
            await self._events.emit(run.spec.canary, None, kind, f"{run.spec.name}: {t.reason}")

    def live_state(self, name: str) -> RolloutState | None:
        """The state in memory, with the latest analysis of the current step (the archive
        holds it as of the last transition)."""
        run = self._runs.get(name)
        return run.state if run else None


def _use(w: GroupSamples) -> ResourceUse | None:
    if w.requests <= 0:
        return None
    return ResourceUse(w.requests, w.cpu_s, w.memory_gb or None)


def _resume(rec: RolloutRecord) -> _Run:
    spec_data = dict(rec.spec)
    floor = int(spec_data.pop("baseline_floor", 0))
    return _Run(
        rec.id, RolloutSpec.model_validate(spec_data), RolloutState.from_json(rec.state), floor
    )
