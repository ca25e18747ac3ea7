"""The live side of canary rollouts (C1-C6): feed each running rollout's pure state machine
(`sluice.policy.rollouts`) once per tick with the samples its two groups' instances report,
hand the gateway the split it asks for, and archive every change.

A rollback is one tick (at most a second): the state machine returns no split, the next
routing snapshot sends everything to the baseline, which stayed scaled for all of its traffic
(`baseline_floors`). The canary keeps running for inspection until an operator removes it.

Nothing slow runs in the tick: the samples are read by the collector's own task, and the
analysis of a window runs in a thread, again only when the window changed, and pausing
`ANALYSIS_PAUSE` times its own duration between runs (so it takes at most a fifth of a core
however large the windows); the tick feeds the state machine the latest one. Between the
planned looks of `sluice.policy.canary_plan` an analysis only runs the fast path (cheap);
the state machine counts the looks, so analysing again never re-tests. A failing analysis
wakes the controller at once. A change the store refused is archived on a later tick (the
split it asks for is in force already).

A step's window holds the requests that arrived under its split, and a look compares only
those that arrived at least a horizon before the instant both sides have been read up to,
and finished by it (`sluice.policy.windows`): the same rule for both sides, so a good canary
is compared with its baseline on exchangeable samples however long its answers take.

Command servers (vLLM, SGLang, ...) and external endpoints keep no per-request samples:
their groups' answers are the rows the gateway records of them (status, latency, time to the
first body byte of streamed answers as TTFT; `SampleCollector` reads them in-process), and
the criteria those rows cannot show (text, tokens, finish reasons, resources) are skipped
with the reason (`sluice.policy.analysis.unobserved`), never judged on missing values. Where
their metrics are scraped (`ServerScraper`), each step's window of the servers' own TTFT and
TPOT histograms is shown in the live state too (`server_latency`, p50/p99 a side) for the
operator; it gates nothing (a binned test would need its own share of the false-rollback
budget).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.comparing import run_suite
from sluice.control.autoscaling import TrafficSource
from sluice.control.events import EventLog
from sluice.control.rates import ArrivalRates
from sluice.control.samples import GroupSamples, SampleCollector, window_rows
from sluice.control.scraper import ServerScraper
from sluice.core import Conflict, InstanceState, InstanceStatus, NotFound
from sluice.policy import rollouts as machine
from sluice.policy.analysis import (
    Analysis,
    Prior,
    RequestSample,
    ResourceUse,
    analyze,
    unobserved,
)
from sluice.policy.canary_plan import (
    RATIO_CAP,
    RolloutPlan,
    StepPlan,
    plan_rollout,
    step_seconds,
)
from sluice.policy.compare import CompareOptions, Target, parse_suite
from sluice.policy.rollouts import RolloutPhase, RolloutState, evidence_before
from sluice.policy.routing import CanarySplit
from sluice.policy.windows import horizon_s, look_rows
from sluice.spec import PlatformSpec
from sluice.spec.rollouts import AnalysisSpec, RolloutSpec
from sluice.store import RolloutRecord
from sluice.store.ports import RolloutRecords

__all__ = ["RolloutRunner", "plan_report"]

log = logging.getLogger("sluice.rollouts")

ACTIONS = ("pause", "resume", "promote", "abort")
ANALYSIS_PAUSE = 4.0
"""After an analysis that took d seconds, the next waits at least 4 d (at most 20% busy)."""


@dataclass
class _Run:
    """One running rollout: its archive row, its state, and the analysis windows."""

    id: int
    spec: RolloutSpec
    state: RolloutState
    baseline_floor: int
    plan: RolloutPlan
    window_at: float | None = None
    compare_task: asyncio.Task[None] | None = None
    previous_baseline: list[RequestSample] = field(default_factory=list)
    """the baseline's samples of the step before (the 100% step compares against them)"""
    previous_use: ResourceUse | None = None
    archived: int = 0
    """transitions of `state` already in the archive (the rest wait for the store)"""
    analysis: Analysis | None = None
    analysis_key: tuple[object, ...] | None = None
    """(window, the instant both sides are read up to, baseline version, canary version,
    compared with the step before, looks taken, hold over)"""
    analyzing: asyncio.Task[None] | None = None
    next_analysis_at: float = 0.0


class RolloutRunner:
    def __init__(
        self,
        store: RolloutRecords,
        events: EventLog,
        collector: SampleCollector,
        on_change: Callable[[], None],
        wake: Callable[[], None] = lambda: None,
        traffic: TrafficSource | None = None,
        servers: ServerScraper | None = None,
    ) -> None:
        """`on_change` publishes the routing snapshot: called the moment a split changes,
        before anything is written, so a rollback reaches the gateway first. `wake` asks
        for a tick now (an analysis failed: roll back without waiting for the next one).
        `traffic`: the gateway's counters, read each tick while the spec has rollouts, for
        the plans' time estimates. `servers`: the command servers' scraped metrics, whose
        latency windows restart with each step (`server_latency`)."""
        self._traffic = traffic
        self._servers = servers
        self._rates = ArrivalRates()
        self._on_change = on_change
        self._wake = wake
        self._store = store
        self._events = events
        self._collector = collector
        self._runs: dict[str, _Run] = {}
        self._urls: Callable[[str], str | None] = lambda _group: None
        self._gateway_sampled: frozenset[str] = frozenset()
        """Groups under rollout whose servers keep no samples (the gateway's rows stand in)."""

    async def aclose(self) -> None:
        for run in self._runs.values():
            for task in (run.compare_task, run.analyzing):
                if task is not None:
                    task.cancel()
        await self._collector.aclose()

    def sampling_status(self) -> dict[str, Any]:
        """The sample poller's state, for the control API's status."""
        return self._collector.status()

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

    def phases(self) -> dict[str, tuple[str, str, float]]:
        """Each known rollout -> (its baseline group, its phase, the canary's percent)."""
        return {
            name: (run.spec.baseline, run.state.phase.value, run.state.percent)
            for name, run in self._runs.items()
        }

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
        run = self._runs[name] = _Run(
            run_id, rs, state, floor, plan_rollout(rs), archived=len(state.transitions)
        )
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
        """Point the sample poller at the instances of every running rollout's groups, and
        move each state machine on with the latest analysis of its current step's window (a
        rollout that left `spec` holds still). Waits for nothing but the store."""
        for run in self._runs.values():
            if run.archived < len(run.state.transitions):
                await self._archive(run)  # a change the store refused before
        if spec.rollouts and self._traffic is not None:
            try:
                self._rates.observe(self._traffic())
            except Exception:  # unreadable counters only leave the plan's rate unknown
                log.debug("traffic counters unreadable for rollout rates", exc_info=True)
        names = {r.name for r in spec.rollouts}
        stepping = [r for r in self._runs.values() if not r.state.final]
        groups = {g for r in stepping for g in (r.spec.baseline, r.spec.canary)}
        self._gateway_sampled = frozenset(
            g.name
            for g in spec.groups
            if g.name in groups and any(m.server is not None for m in g.models.values())
        )
        self._collector.watch(
            (
                (i.group, i.id, i.url)
                for i in observed
                if i.group in groups and i.state is InstanceState.READY and i.url
            ),
            from_gateway=self._gateway_sampled,
        )
        for run in stepping:
            if run.spec.name not in names:
                continue  # the rollout left the spec; its state holds until it is back
            self._roll_window(run)
            analysis = self._latest_analysis(run)
            if analysis is not None:
                state = machine.evaluate(run.spec, run.state, analysis, now)
                if state.transitions != run.state.transitions:
                    await self._save(run, state, now)
                else:
                    run.state = state  # latest analysis kept in memory; archived on change
            if not run.state.final:
                self._roll_window(run)
                self._start_analysis(run, now)

    def _latest_analysis(self, run: _Run) -> Analysis | None:
        """The newest analysis of the run's current window (None before the first)."""
        if run.analysis_key is None or run.analysis_key[0] != run.window_at:
            return None
        return run.analysis

    def _start_analysis(self, run: _Run, now: float) -> None:
        """A new analysis in a thread when the window, the looks taken or the hold changed
        since the last, and one is due. Called only after the state machine has been fed
        the latest result, so the looks it counts from (`looks_done`) include every look
        taken: an analysis never re-spends the look just taken (the state machine discards
        a result whose `after` is not its count anyway)."""
        loop = asyncio.get_running_loop()
        busy = run.analyzing is not None and not run.analyzing.done()
        if busy or loop.time() < run.next_analysis_at or run.window_at is None:
            return
        base = self._collector.window(run.spec.baseline)
        canary = self._collector.window(run.spec.canary)
        previous = run.state.percent >= 100.0 and bool(run.previous_baseline)
        record = run.state.steps[-1]
        started = run.state.step_started_at if run.state.step_started_at is not None else now
        final_ready = now - started >= run.spec.hold_s
        # both sides are cut at the same instant (the earlier read), a horizon before it
        through = self._collector.through(run.spec.canary)
        if not previous:
            through = _earliest(through, self._collector.through(run.spec.baseline))
        key = (
            run.window_at,
            through,
            base.version,
            canary.version,
            previous,
            record.looks,
            final_ready,
        )
        if key != run.analysis_key:
            base_rows, base_use = list(base.samples), _use(base)
            if previous:
                base_rows, base_use = run.previous_baseline, run.previous_use
            job = _Job(
                key,
                base_rows,
                list(canary.samples),
                base_use,
                _use(canary),
                record.looks,
                final_ready,
                evidence_before(run.state, baseline_reused=previous),
                previous,
                unobserved(
                    base.from_gateway or run.spec.baseline in self._gateway_sampled,
                    canary.from_gateway or run.spec.canary in self._gateway_sampled,
                ),
                run.window_at,
                through,
                self._latencies(run),
            )
            run.analyzing = loop.create_task(
                self._analyze(run, job), name=f"analysis-{run.spec.name}"
            )

    async def _analyze(self, run: _Run, job: _Job) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        step = run.plan.step(run.state.step)
        try:
            result = await asyncio.to_thread(
                _judge,
                job,
                job.base_use,
                job.canary_use,
                run.spec.analysis,
                step,
                looks_done=job.looks_done,
                final_ready=job.final_ready,
                prior=job.prior,
                fast_alpha=run.plan.fast_alpha,
                baseline_reused=job.baseline_reused,
                unobserved=job.unobserved,
            )
        except Exception:
            log.exception("rollout %s: analysis failed", run.spec.name)
            run.next_analysis_at = loop.time() + 5.0
            return
        took = loop.time() - started
        run.next_analysis_at = loop.time() + ANALYSIS_PAUSE * took
        if job.key[0] != run.window_at:
            return  # the step moved on while this ran
        run.analysis, run.analysis_key = result, job.key
        if result.verdict == "fail":
            self._wake()

    def _latencies(self, run: _Run) -> list[float]:
        """The two groups' recent latencies, for a look's horizon (`horizon_s`)."""
        return self._collector.latencies(run.spec.baseline) + self._collector.latencies(
            run.spec.canary
        )

    def _roll_window(self, run: _Run) -> None:
        """A new step (or a resume) starts a new analysis window for both groups; the
        baseline's answers of the step before are kept (as a look would have cut them) for
        the 100% step."""
        started = run.state.step_started_at
        if started is None or started == run.window_at:
            return
        base = self._collector.window(run.spec.baseline)
        if run.window_at is not None and base.samples:
            through = self._collector.through(run.spec.baseline)
            run.previous_baseline = look_rows(
                base.samples, run.window_at, through, horizon_s(self._latencies(run))
            )
            run.previous_use = _use(base)
        run.window_at = started
        run.next_analysis_at = 0.0
        # room for the larger side at RATIO_CAP x the step's samples, as the plan assumes
        need = run.plan.step(run.state.step).samples
        rows = window_rows(math.ceil((RATIO_CAP + 1) * need / 2))
        self._collector.reset((run.spec.baseline, run.spec.canary), started, rows)
        if self._servers is not None:
            self._servers.reset((run.spec.baseline, run.spec.canary), started)

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
            suite_path = Path(run.spec.compare.suite)
            data = await asyncio.to_thread(suite_path.read_bytes)
            async with asyncio.timeout(run.spec.compare.timeout_s):
                report = await run_suite(
                    parse_suite(data, str(suite_path), "compare.suite"),
                    Target(f"group:{run.spec.baseline}", base, run.spec.baseline),
                    Target(f"group:{run.spec.canary}", canary, run.spec.canary),
                    CompareOptions(),
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
        """The new state is in force at once (split published); then it is archived. If the
        store refuses, this raises and a later tick archives it (`tick`)."""
        run.state = state
        self._on_change()
        await self._archive(run, now)

    async def _archive(self, run: _Run, now: float | None = None) -> None:
        state = run.state
        final = state.final
        if now is None:
            now = state.transitions[-1].at if state.transitions else 0.0
        await asyncio.to_thread(
            self._store.update_rollout,
            run.id,
            phase=state.phase.value,
            state=state.to_json(),
            now=now,
            ended=final,
            conclusion=state.conclusion if final else None,
        )
        new, run.archived = state.transitions[run.archived :], len(state.transitions)
        for t in new:
            kind = "rollback" if t.to_phase is RolloutPhase.ROLLED_BACK else "rollout"
            await self._events.emit(run.spec.canary, None, kind, f"{run.spec.name}: {t.reason}")

    def plan(self, spec: PlatformSpec, name: str) -> dict[str, Any]:
        """`sluice rollout plan NAME`: the design and, at the baseline's traffic of the last
        minute (unknown before two ticks), how long each step and the whole rollout take."""
        rs = next((r for r in spec.rollouts if r.name == name), None)
        if rs is None:
            known = ", ".join(r.name for r in spec.rollouts) or "none in the spec"
            raise NotFound(f"no rollout named {name!r}; rollouts: {known}", rollout=name)
        latencies = self._collector.latencies(rs.baseline) + self._collector.latencies(rs.canary)
        return plan_report(rs, self._rates.rate(rs.baseline), horizon_s(latencies))

    def live_state(self, name: str) -> RolloutState | None:
        """The state in memory, with the latest analysis of the current step (the archive
        holds it as of the last transition)."""
        run = self._runs.get(name)
        return run.state if run else None

    def live_json(self, name: str) -> dict[str, Any] | None:
        """`live_state` as JSON, with `server_latency` when either side's servers are
        scraped: their TTFT/TPOT over the current step's window (shown, not gated on)."""
        run = self._runs.get(name)
        if run is None:
            return None
        out = run.state.to_json()
        sides = {"baseline": run.spec.baseline, "canary": run.spec.canary}
        windows = {
            side: self._servers.window(group) if self._servers is not None else None
            for side, group in sides.items()
        }
        if any(w is not None for w in windows.values()):
            out["server_latency"] = {
                side: w.to_json() if w is not None else None for side, w in windows.items()
            }
        return out


@dataclass(frozen=True)
class _Job:
    """One analysis' inputs, taken on the loop before it runs in a thread."""

    key: tuple[object, ...]
    base: list[RequestSample]
    canary: list[RequestSample]
    base_use: ResourceUse | None
    canary_use: ResourceUse | None
    looks_done: int
    final_ready: bool
    prior: Prior
    baseline_reused: bool
    unobserved: Mapping[str, str]
    since: float
    """the window's start: requests that arrived before it are in neither side"""
    through: float | None
    """the instant both sides are known up to (None: not yet)"""
    latencies: list[float]
    """recent latencies of both groups, for the horizon"""


def _judge(
    job: _Job,
    base_use: ResourceUse | None,
    canary_use: ResourceUse | None,
    spec: AnalysisSpec,
    step: StepPlan,
    **options: Any,
) -> Analysis:
    """In the analysis thread: cut both sides as a look compares them (`look_rows`; the
    baseline of the step before was cut when it ended), then `analyze`."""
    horizon = horizon_s(job.latencies)
    canary = look_rows(job.canary, job.since, job.through, horizon)
    base = job.base
    if not job.baseline_reused:
        base = look_rows(job.base, job.since, job.through, horizon)
    return analyze(base, canary, base_use, canary_use, spec, step, **options)


def plan_report(rs: RolloutSpec, rate_rps: float | None, horizon: float) -> dict[str, Any]:
    """The plan's JSON, with `rate_rps`, the look `horizon_s` (from the two groups' recent
    latencies), each step's `seconds` and `total_s` (None when the rate is unknown or zero:
    then only the samples are known)."""
    plan = plan_rollout(rs)
    report: dict[str, Any] = {"rollout": rs.name, "baseline": rs.baseline, **plan.to_json()}
    report["rate_rps"] = rate_rps
    report["horizon_s"] = horizon
    seconds = step_seconds(plan, rs, rate_rps, horizon) if rate_rps else None
    for i, row in enumerate(report["steps"]):
        row["seconds"] = None if seconds is None else seconds[i]
    report["total_s"] = None if seconds is None else sum(seconds)
    return report


def _earliest(a: float | None, b: float | None) -> float | None:
    """The earlier of two read times; None (nothing known) if either is."""
    return None if a is None or b is None else min(a, b)


def _use(w: GroupSamples) -> ResourceUse | None:
    if w.requests <= 0:
        return None
    return ResourceUse(w.requests, w.cpu_s, w.memory_gb or None, instance_s=w.instance_s)


def _resume(rec: RolloutRecord) -> _Run:
    """A run from the archive; a spec archived before the false-rollback budget replaced
    `analysis.alpha` resumes under the budget's default."""
    spec_data = dict(rec.spec)
    floor = int(spec_data.pop("baseline_floor", 0))
    analysis = spec_data.get("analysis")
    if isinstance(analysis, dict) and "alpha" in analysis:
        spec_data["analysis"] = {k: v for k, v in analysis.items() if k != "alpha"}
    state = RolloutState.from_json(rec.state)
    rs = RolloutSpec.model_validate(spec_data)
    return _Run(rec.id, rs, state, floor, plan_rollout(rs), archived=len(state.transitions))
