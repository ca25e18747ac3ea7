"""The canary rollout state machine (C1, C2, C4, C6): pure; `now` (seconds) is an argument.

| from     | event                                        | to          | reason says             |
|----------|----------------------------------------------|-------------|-------------------------|
| pending  | `start`                                      | stepping(0) | who started it          |
| stepping | fast-path `fail` (any time), or `fail` at a  | rolled_back | the failed criteria and |
|          | look not taken before                        |             | their numbers           |
| stepping | `pass` (the last look) and `hold_s` elapsed, | stepping+1  | the step passed, hold   |
|          | not the last step                            |             |                         |
| stepping | the same, the last step (100%)               | promoted    | all steps passed        |
| stepping | `wait` and no new answer on the smaller side | paused or   | no verdict, which       |
|          | for `max_wait_s`                             | rolled_back | criteria (`on_no_data`) |
| stepping | `pause`                                      | paused      | operator's reason       |
| paused   | `fail` as above                              | rolled_back | safety holds paused     |
| paused   | `resume`                                     | stepping(k) | hold and looks restart  |
| pending, stepping, paused | `promote`                   | promoted    | manual, skips the rest  |
| pending, stepping, paused | `abort`                     | rolled_back | manual                  |

`promoted` and `rolled_back` are final. Anything else raises `Conflict`. Every transition is
kept in `RolloutState.transitions`, and each step's latest analysis in `RolloutState.steps`,
so the archive (`to_json`) holds the whole timeline with its numbers (C6).

Looks are counted here (`StepRecord.looks`): an analysis counts only if it was computed
after exactly the looks this stay has taken (`Analysis.after`, fixed when the previous
result was accepted); one that judged a look already taken, or that ran before the
previous result was accepted (and so re-spent its alpha), decides nothing, so each planned
look spends its alpha once (`sluice.policy.canary_plan`). The fast path's `fail`
is valid at any time and always counts. `evidence_before` hands the next analysis what the
earlier steps saw.

Rollback (C2) is instant because the baseline group stays scaled for all of its traffic
through the whole rollout: `split_for` returning None is the only change the gateway needs.
The canary keeps running for inspection until an operator removes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Literal, get_args

from sluice.core.errors import Conflict
from sluice.policy.analysis import Analysis, Prior, Table
from sluice.policy.routing import CanarySplit
from sluice.spec.rollouts import RolloutSpec

__all__ = [
    "CanarySplit",
    "RolloutPhase",
    "RolloutState",
    "StepOutcome",
    "StepRecord",
    "Transition",
    "abort",
    "evaluate",
    "evidence_before",
    "pause",
    "promote",
    "resume",
    "split_for",
    "start",
]


class RolloutPhase(StrEnum):
    PENDING = "pending"
    STEPPING = "stepping"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"


FINAL = frozenset({RolloutPhase.PROMOTED, RolloutPhase.ROLLED_BACK})


@dataclass(frozen=True, slots=True)
class Transition:
    """One edge of the timeline: at `at` (s), `from_phase` -> `to_phase`, then on step index
    `step` (-1: none) with the canary at `percent`; `by` is 'controller' or the operator."""

    at: float
    from_phase: RolloutPhase
    to_phase: RolloutPhase
    step: int
    percent: float
    reason: str
    by: str = "controller"


StepOutcome = Literal["running", "passed", "failed", "no_data", "paused", "promoted", "aborted"]


def _outcome(raw: object) -> StepOutcome:
    for known in get_args(StepOutcome):
        if raw == known:
            return known  # type: ignore[no-any-return]
    raise ValueError(f"unknown step outcome {raw!r}")


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One stay on a step (a resume starts a new record for the same step). `outcome`:
    running | passed | failed | no_data | paused | promoted | aborted. `analysis`: the latest
    of its `evaluations`, the one that decided when the step ended. `looks`: planned looks
    taken; `progress`: the most answers its smaller side has had, first seen at
    `progress_at` (None: none yet; the stall clock then runs from `started_at`)."""

    step: int
    percent: float
    started_at: float
    ended_at: float | None = None
    outcome: StepOutcome = "running"
    evaluations: int = 0
    analysis: Analysis | None = None
    looks: int = 0
    progress: int = 0
    progress_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "percent": self.percent,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "outcome": self.outcome,
            "evaluations": self.evaluations,
            "looks": self.looks,
            "progress": self.progress,
            "progress_at": self.progress_at,
            "analysis": None if self.analysis is None else self.analysis.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepRecord:
        raw = data.get("analysis")
        return cls(
            step=int(data["step"]),
            percent=float(data["percent"]),
            started_at=float(data["started_at"]),
            ended_at=None if data.get("ended_at") is None else float(data["ended_at"]),
            outcome=_outcome(data["outcome"]),
            evaluations=int(data["evaluations"]),
            analysis=None if raw is None else Analysis.from_json(raw),
            looks=int(data.get("looks", 0)),
            progress=int(data.get("progress", 0)),
            progress_at=None if data.get("progress_at") is None else float(data["progress_at"]),
        )


@dataclass(frozen=True, slots=True)
class RolloutState:
    """The rollout's memory; save `to_json()` after every change to survive restarts.
    `step`: index into the spec's steps (-1 before start); `percent`: the canary's share of
    the current step (0 after a rollback, 100 once promoted); `step_started_at`: when the
    current stay began (hold and max-wait count from it); `paused_at` while paused."""

    name: str
    phase: RolloutPhase = RolloutPhase.PENDING
    step: int = -1
    percent: float = 0.0
    step_started_at: float | None = None
    paused_at: float | None = None
    transitions: tuple[Transition, ...] = ()
    steps: tuple[StepRecord, ...] = field(default=())

    @property
    def final(self) -> bool:
        return self.phase in FINAL

    @property
    def conclusion(self) -> str | None:
        """'<phase>: <reason of the final transition>', or None while the rollout is open."""
        if not self.final or not self.transitions:
            return None
        return f"{self.phase.value.replace('_', ' ')}: {self.transitions[-1].reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "phase": self.phase.value,
            "step": self.step,
            "percent": self.percent,
            "step_started_at": self.step_started_at,
            "paused_at": self.paused_at,
            "transitions": [
                {
                    "at": t.at,
                    "from": t.from_phase.value,
                    "to": t.to_phase.value,
                    "step": t.step,
                    "percent": t.percent,
                    "reason": t.reason,
                    "by": t.by,
                }
                for t in self.transitions
            ],
            "steps": [s.to_json() for s in self.steps],
            "conclusion": self.conclusion,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RolloutState:
        def opt(key: str) -> float | None:
            return None if data.get(key) is None else float(data[key])

        return cls(
            name=str(data["name"]),
            phase=RolloutPhase(data["phase"]),
            step=int(data["step"]),
            percent=float(data["percent"]),
            step_started_at=opt("step_started_at"),
            paused_at=opt("paused_at"),
            transitions=tuple(
                Transition(
                    at=float(t["at"]),
                    from_phase=RolloutPhase(t["from"]),
                    to_phase=RolloutPhase(t["to"]),
                    step=int(t["step"]),
                    percent=float(t["percent"]),
                    reason=str(t["reason"]),
                    by=str(t.get("by", "controller")),
                )
                for t in data.get("transitions", [])
            ),
            steps=tuple(StepRecord.from_json(s) for s in data.get("steps", [])),
        )


# --- transitions -----------------------------------------------------------------------------


def _label(spec: RolloutSpec, state: RolloutState) -> str:
    return f"step {state.step + 1}/{len(spec.steps)} ({state.percent:g}%)"


def _move(
    state: RolloutState,
    now: float,
    to: RolloutPhase,
    reason: str,
    by: str,
    *,
    outcome: StepOutcome | None = None,
    **changes: Any,
) -> RolloutState:
    """Apply `changes`, close the open step record with `outcome`, log the transition."""
    records = state.steps
    if outcome is not None and records and records[-1].ended_at is None:
        records = (*records[:-1], replace(records[-1], ended_at=now, outcome=outcome))
    nxt = replace(state, phase=to, steps=records, **changes)
    edge = Transition(now, state.phase, to, nxt.step, nxt.percent, reason, by)
    return replace(nxt, transitions=(*state.transitions, edge))


def _enter_step(state: RolloutState, step: int, percent: float, now: float) -> RolloutState:
    record = StepRecord(step=step, percent=percent, started_at=now)
    return replace(
        state, step=step, percent=percent, step_started_at=now, steps=(*state.steps, record)
    )


def _require(state: RolloutState, allowed: frozenset[RolloutPhase], action: str) -> None:
    if state.phase not in allowed:
        names = ", ".join(sorted(p.value for p in allowed))
        raise Conflict(
            f"cannot {action} rollout {state.name!r}: it is {state.phase.value} "
            f"(allowed from: {names})",
            rollout=state.name,
            phase=state.phase.value,
        )


def start(
    spec: RolloutSpec,
    now: float,
    *,
    state: RolloutState | None = None,
    reason: str = "started",
    by: str = "controller",
) -> RolloutState:
    """pending -> stepping on the first step (`spec.steps[0]` percent) at `now` (s)."""
    state = state if state is not None else RolloutState(name=spec.name)
    _require(state, frozenset({RolloutPhase.PENDING}), "start")
    entered = _enter_step(state, 0, spec.steps[0], now)
    return _move(entered, now, RolloutPhase.STEPPING, f"{reason}; canary at {spec.steps[0]:g}%", by)


def evaluate(
    spec: RolloutSpec, state: RolloutState, analysis: Analysis, now: float
) -> RolloutState:
    """Feed one analysis of the current step's window (answers since `step_started_at`).

    A fast-path `fail` rolls back at once, also while paused; so does a `fail` at a look
    this stay has not taken yet, by an analysis that ran after exactly the looks taken so
    far (`analysis.after`; a repeat of a taken look, or a look computed before the previous
    one was accepted, decides nothing and spends nothing). `pass` (the
    step's last look) advances once `spec.hold_s` has passed since the step began (the
    promotion after the last, 100%, step). `wait` stays, until the smaller side has had no
    new answer for `spec.max_wait_s`; then `spec.on_no_data` decides. Pending and final
    rollouts are returned unchanged. At the 100% step the baseline gets no traffic: the
    caller compares with the baseline's answers of the step before."""
    if state.phase not in (RolloutPhase.STEPPING, RolloutPhase.PAUSED) or not state.steps:
        return state
    last = state.steps[-1]
    # a look counts only if it was taken after exactly the looks this stay has taken: one
    # computed before the previous result was accepted re-spends that look's alpha
    fresh = analysis.look > last.looks and analysis.after == last.looks
    smaller = min(analysis.baseline_samples, analysis.canary_samples)
    record = replace(
        last,
        evaluations=last.evaluations + 1,
        analysis=analysis,
        looks=analysis.look if fresh else last.looks,
    )
    if smaller > last.progress:
        record = replace(record, progress=smaller, progress_at=now)
    state = replace(state, steps=(*state.steps[:-1], record))
    label = _label(spec, state)
    if analysis.verdict == "fail" and (analysis.fast or fresh):
        return _move(
            state,
            now,
            RolloutPhase.ROLLED_BACK,
            f"{label}: {analysis.reason}",
            "controller",
            outcome="failed",
            percent=0.0,
            paused_at=None,
        )
    if state.phase is RolloutPhase.PAUSED:
        return state
    elapsed = now - (state.step_started_at if state.step_started_at is not None else now)
    if analysis.verdict == "pass" and elapsed >= spec.hold_s:
        later = [i for i, p in enumerate(spec.steps) if p > state.percent]
        if not later:
            return _move(
                state,
                now,
                RolloutPhase.PROMOTED,
                f"{label} passed after {elapsed:g} s (hold {spec.hold_s:g} s); all steps passed",
                "controller",
                outcome="passed",
            )
        nxt = later[0]
        closed = replace(
            state,
            steps=(*state.steps[:-1], replace(state.steps[-1], ended_at=now, outcome="passed")),
        )
        entered = _enter_step(closed, nxt, spec.steps[nxt], now)
        return _move(
            entered,
            now,
            RolloutPhase.STEPPING,
            f"{label} passed after {elapsed:g} s (hold {spec.hold_s:g} s); canary at "
            f"{spec.steps[nxt]:g}%",
            "controller",
        )
    moved_at = record.progress_at if record.progress_at is not None else record.started_at
    stalled = now - moved_at
    if analysis.verdict == "wait" and spec.max_wait_s is not None and stalled >= spec.max_wait_s:
        why = f"{label}: no verdict, and no new answer on the smaller side for {stalled:g} s "
        why += f"(max_wait_s {spec.max_wait_s:g}): {analysis.reason}"
        if spec.on_no_data == "rollback":
            return _move(
                state,
                now,
                RolloutPhase.ROLLED_BACK,
                why,
                "controller",
                outcome="no_data",
                percent=0.0,
            )
        return _move(
            state,
            now,
            RolloutPhase.PAUSED,
            why + "; resume, promote or abort",
            "controller",
            paused_at=now,
        )
    return state


def evidence_before(state: RolloutState, baseline_reused: bool = False) -> Prior:
    """What the steps before the current stay saw, for its analysis: every earlier stay's
    2x2 tables (from its latest analysis) and the sum of their fast-path counts. With
    `baseline_reused` (the 100% step compares with the stay before's baseline answers),
    that stay's tables are left out, so no baseline answer is in two strata."""
    before = state.steps[:-1]
    earlier = [r.analysis for r in before if r.analysis is not None]
    fast = [a.tables["fast"] for a in earlier if "fast" in a.tables]
    total = Table(
        sum(t.hits_base for t in fast),
        sum(t.n_base for t in fast),
        sum(t.hits_canary for t in fast),
        sum(t.n_canary for t in fast),
    )
    pooled = before[:-1] if baseline_reused else before
    strata = tuple(
        {k: t for k, t in r.analysis.tables.items() if k != "fast"}
        for r in pooled
        if r.analysis is not None and len(r.analysis.tables) > 1
    )
    return Prior(strata, total)


def pause(
    state: RolloutState, now: float, reason: str = "paused", by: str = "operator"
) -> RolloutState:
    """stepping -> paused: the split stays as it is; no step advances, but a failing
    analysis still rolls back. The step's record stays open until resume or an end."""
    _require(state, frozenset({RolloutPhase.STEPPING}), "pause")
    return _move(state, now, RolloutPhase.PAUSED, reason, by, paused_at=now)


def resume(
    state: RolloutState, now: float, reason: str = "resumed", by: str = "operator"
) -> RolloutState:
    """paused -> stepping on the same step, with a fresh stay: the hold and the analysis
    window start again at `now`, so samples from before the pause are not counted twice."""
    _require(state, frozenset({RolloutPhase.PAUSED}), "resume")
    last = state.steps[-1]
    closed = replace(
        state, steps=(*state.steps[:-1], replace(last, ended_at=now, outcome="paused"))
    )
    entered = _enter_step(closed, state.step, state.percent, now)
    return _move(entered, now, RolloutPhase.STEPPING, reason, by, paused_at=None)


_OPEN = frozenset({RolloutPhase.PENDING, RolloutPhase.STEPPING, RolloutPhase.PAUSED})


def promote(
    spec: RolloutSpec,
    state: RolloutState,
    now: float,
    reason: str = "promoted by hand",
    by: str = "operator",
) -> RolloutState:
    """Manual promotion: all of the baseline's traffic to the canary, skipping the steps left."""
    _require(state, _OPEN, "promote")
    return _move(
        state,
        now,
        RolloutPhase.PROMOTED,
        reason,
        by,
        outcome="promoted",
        percent=100.0,
        step=len(spec.steps) - 1,
        paused_at=None,
    )


def abort(
    state: RolloutState, now: float, reason: str = "aborted by hand", by: str = "operator"
) -> RolloutState:
    """Manual rollback: all traffic back to the baseline at once; the canary keeps running."""
    _require(state, _OPEN, "abort")
    return _move(
        state,
        now,
        RolloutPhase.ROLLED_BACK,
        reason,
        by,
        outcome="aborted",
        percent=0.0,
        paused_at=None,
    )


# --- outputs ---------------------------------------------------------------------------------


def split_for(spec: RolloutSpec, state: RolloutState) -> CanarySplit | None:
    """The gateway's split for this state: None (all to the baseline) when pending or rolled
    back; 100% canary for everyone once promoted; the current step's split while stepping
    or paused (a pause holds the split, it does not undo it)."""
    if state.phase in (RolloutPhase.PENDING, RolloutPhase.ROLLED_BACK):
        return None
    early, late = frozenset(spec.pacing.early), frozenset(spec.pacing.late)
    if state.phase is RolloutPhase.PROMOTED:
        return CanarySplit(spec.baseline, spec.canary, 100.0, 100.0, 100.0, early, late)
    p = state.percent
    pacing = spec.pacing
    return CanarySplit(
        baseline=spec.baseline,
        canary=spec.canary,
        percent=p if p >= pacing.normal_from_percent else 0.0,
        early_percent=min(100.0, p * pacing.early_factor),
        late_percent=p if p >= pacing.late_from_percent else 0.0,
        early_tenants=early,
        late_tenants=late,
    )
