"""Rollout state machine on a virtual clock: promotion through every step with its hold,
rollback on each criterion, each planned look counted once, waiting on thin data and
pausing when answers stop coming, pause/resume, manual promote/abort, tenant pacing per
step, the evidence handed to the next step, and the archive's JSON round trip."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable

import pytest

from sluice.core import Conflict, ManualClock
from sluice.policy import CanarySplit, RolloutPhase, RolloutState, split_for
from sluice.policy.analysis import Analysis, RequestSample, analyze
from sluice.policy.canary_plan import StepPlan
from sluice.policy.rollouts import (
    abort,
    evaluate,
    evidence_before,
    pause,
    promote,
    resume,
    start,
)
from sluice.spec.rollouts import DEFAULT_STEPS, PacingSpec, RolloutSpec
from tests.unit.test_analysis import REGRESSIONS, clean, use

SPEC = RolloutSpec(name="chat-v2", baseline="chat", canary="chat-v2")
TICK = 10.0  # the controller evaluates every second live; 10 s keeps these tests short

CLEAN = analyze(clean(seed=1), clean(seed=2), use(), use(), SPEC.analysis)
THIN = analyze(clean(50, seed=1), clean(50, seed=2), use(50), use(50), SPEC.analysis)


def bad(name: str) -> Analysis:
    transform, canary_use = REGRESSIONS[name]
    return analyze(clean(seed=1), transform(clean(seed=2)), use(), canary_use, SPEC.analysis)


def drive(
    spec: RolloutSpec, state: RolloutState, clock: ManualClock, analysis: Analysis, seconds: float
) -> RolloutState:
    """Evaluate every TICK for `seconds` of virtual time, or until the rollout ends."""
    end = clock.now() + seconds
    while clock.now() < end and not state.final:
        clock.advance(TICK)
        state = evaluate(spec, state, analysis, clock.now())
    return state


def started(spec: RolloutSpec = SPEC) -> tuple[RolloutState, ManualClock]:
    clock = ManualClock(1000.0)
    return start(spec, clock.now(), by="alice"), clock


def test_clean_canary_is_promoted_through_every_step_with_its_hold() -> None:
    assert CLEAN.verdict == "pass"
    state, clock = started()
    assert state.phase is RolloutPhase.STEPPING and state.percent == 1.0
    state = drive(SPEC, state, clock, CLEAN, 3600)
    assert state.phase is RolloutPhase.PROMOTED
    assert state.conclusion is not None and "all steps passed" in state.conclusion
    # The timeline: started, then one transition per step, 60 s apart, doubling then slow.
    steps = [t for t in state.transitions if t.to_phase is RolloutPhase.STEPPING]
    assert [t.percent for t in steps] == list(DEFAULT_STEPS)
    assert [t.percent for t in steps][:6] == [1, 2, 4, 8, 16, 32]
    times = [t.at for t in state.transitions]
    assert [b - a for a, b in itertools.pairwise(times)] == [SPEC.hold_s] * 11
    assert clock.now() - 1000.0 == 11 * SPEC.hold_s
    assert state.transitions[0].by == "alice"
    assert state.transitions[0].from_phase is RolloutPhase.PENDING
    assert [r.outcome for r in state.steps] == ["passed"] * 11
    assert all(r.evaluations == 6 and r.analysis == CLEAN for r in state.steps)
    split = split_for(SPEC, state)
    assert split is not None and split.share_for("anyone") == 100.0


def test_a_step_never_advances_before_its_hold() -> None:
    state, clock = started()
    state = evaluate(SPEC, state, CLEAN, clock.now() + SPEC.hold_s - 0.001)
    assert state.percent == 1.0 and len(state.transitions) == 1
    state = evaluate(SPEC, state, CLEAN, clock.now() + SPEC.hold_s)
    assert state.percent == 2.0 and state.step == 1 and state.step_started_at == 1060.0


@pytest.mark.parametrize("criterion", sorted(REGRESSIONS))
def test_any_failed_criterion_rolls_back_at_once(criterion: str) -> None:
    state, clock = started()
    state = drive(SPEC, state, clock, CLEAN, 3 * SPEC.hold_s)
    assert state.percent == 8.0
    clock.advance(1.0)  # one second into the step: no hold, no waiting
    state = evaluate(SPEC, state, bad(criterion), clock.now())
    assert state.phase is RolloutPhase.ROLLED_BACK and state.percent == 0.0
    assert split_for(SPEC, state) is None  # 100% of traffic back on the baseline
    last = state.transitions[-1]
    assert last.at == clock.now() and last.from_phase is RolloutPhase.STEPPING
    assert last.reason.startswith("step 4/11 (8%):") and criterion in last.reason
    assert state.steps[-1].outcome == "failed"
    assert state.steps[-1].analysis is not None and state.steps[-1].analysis.verdict == "fail"
    assert state.conclusion == f"rolled back: {last.reason}"
    # final: later analyses change nothing, manual actions are refused
    assert evaluate(SPEC, state, CLEAN, clock.now() + 100) == state
    with pytest.raises(Conflict):
        promote(SPEC, state, clock.now())


def test_thin_data_waits_without_advancing_then_pauses_when_answers_stop() -> None:
    """THIN has the same 50 answers a side at every evaluation: progress stopped at the
    first one (t = 1010), so max_wait_s later the step pauses."""
    assert THIN.verdict == "wait"
    spec = SPEC.model_copy(update={"max_wait_s": 600.0})
    state, clock = started(spec)
    state = drive(spec, state, clock, THIN, 600)
    assert state.phase is RolloutPhase.STEPPING and state.percent == 1.0
    assert len(state.transitions) == 1 and state.steps[-1].evaluations == 60
    assert state.steps[-1].progress == 50 and state.steps[-1].progress_at == 1010.0
    assert split_for(spec, state) == split_for(spec, started(spec)[0])
    state = drive(spec, state, clock, THIN, TICK)
    assert state.phase is RolloutPhase.PAUSED and state.paused_at == clock.now() == 1610.0
    assert "no new answer on the smaller side for 600 s" in state.transitions[-1].reason
    assert "too few" in state.transitions[-1].reason
    assert split_for(spec, state) is not None  # a pause holds the split
    # on_no_data: rollback ends it instead
    spec = spec.model_copy(update={"on_no_data": "rollback"})
    state, clock = started(spec)
    state = drive(spec, state, clock, THIN, 3600)
    assert state.phase is RolloutPhase.ROLLED_BACK and clock.now() == 1610.0
    assert state.steps[-1].outcome == "no_data"


def test_slow_answers_that_keep_coming_are_waited_for() -> None:
    """A step far short of its samples, but gaining an answer now and then, never stalls."""
    spec = SPEC.model_copy(update={"max_wait_s": 600.0})
    state, clock = started(spec)
    base, canary = clean(99, seed=1), clean(99, seed=2)
    for n in range(1, 100):  # one more answer a side every 500 s: 14 hours
        clock.advance(500.0)
        thin = analyze(base[:n], canary[:n], None, None, SPEC.analysis)
        state = evaluate(spec, state, thin, clock.now())
    assert state.phase is RolloutPhase.STEPPING and state.steps[-1].progress == 99


def test_each_look_counts_once_and_only_the_fast_path_acts_between_looks() -> None:
    """The controller may analyse a look again before it sees the first result: a repeat
    decides nothing, so a look's alpha is spent once. The fast path may act any time."""
    step = StepPlan(0, 1.0, 100, (25, 50, 100), (0.001, 0.001, 0.002))
    base, canary = clean(400, seed=1), clean(400, seed=2)
    first = analyze(base[:30], canary[:30], None, None, SPEC.analysis, step)
    assert first.look == 1 and first.verdict == "wait"
    state, clock = started()
    state = evaluate(SPEC, state, first, clock.now() + 1)
    assert state.steps[-1].looks == 1
    bad_error = bad("error_rate")
    assert bad_error.look == 1 and bad_error.verdict == "fail" and not bad_error.fast
    kept = evaluate(SPEC, state, bad_error, clock.now() + 2)  # look 1 again: ignored
    assert kept.phase is RolloutPhase.STEPPING and kept.steps[-1].analysis == bad_error
    broken = [RequestSample(500, 1.0)] * 10
    gross = analyze(clean(400, seed=1), broken, None, None, SPEC.analysis, step, looks_done=1)
    assert gross.fast and gross.look == 0
    done = evaluate(SPEC, kept, gross, clock.now() + 3)
    assert done.phase is RolloutPhase.ROLLED_BACK and "gross failure" in done.transitions[-1].reason


def test_two_looks_due_a_second_apart_spend_the_plans_alpha_once_each() -> None:
    """Issue 32: the controller started the next analysis before the state machine had
    accepted the look just taken, so that analysis re-spent it (look 2 at alpha 1 + 2).
    A result computed after fewer looks than the stay has taken decides nothing; the look
    is taken again by an analysis that counts from the accepted looks, at its own alpha."""
    step = StepPlan(0, 1.0, 100, (25, 50, 100), (0.001, 0.001, 0.002))
    base, canary = clean(400, seed=1), clean(400, seed=2)

    def transform(rows: list[RequestSample]) -> list[RequestSample]:
        return [dataclasses.replace(r, latency_s=r.latency_s * 3) for r in rows]

    state, clock = started()
    spent: list[float] = []

    def feed(analysis: Analysis, at: float) -> RolloutState:
        before = state.steps[-1].looks
        after = evaluate(SPEC, state, analysis, at)
        if after.steps[-1].looks > before:
            spent.append(analysis.alpha)
        return after

    first = analyze(base[:30], canary[:30], None, None, SPEC.analysis, step, looks_done=0)
    # started a second later, before `first` was fed: it counts from 0 looks
    early = analyze(base[:60], transform(canary[:60]), None, None, SPEC.analysis, step)
    assert (first.look, early.look, early.after) == (1, 2, 0)
    assert early.alpha == pytest.approx(0.002) and early.verdict == "fail"
    state = feed(first, clock.now() + 1)
    state = feed(early, clock.now() + 2)
    assert state.phase is RolloutPhase.STEPPING and state.steps[-1].looks == 1
    second = analyze(base[:60], canary[:60], None, None, SPEC.analysis, step, looks_done=1)
    assert second.look == 2 and second.after == 1
    state = feed(second, clock.now() + 3)
    state = feed(second, clock.now() + 4)  # fed again next tick: nothing more is spent
    assert state.steps[-1].looks == 2
    assert spent == [pytest.approx(0.001), pytest.approx(0.001)]
    assert sum(spent) <= sum(step.alphas[:2]) + 1e-12


def test_the_next_step_gets_the_earlier_steps_evidence() -> None:
    state, clock = started()
    state = drive(SPEC, state, clock, CLEAN, 3 * SPEC.hold_s)
    assert state.percent == 8.0 and len(state.steps) == 4
    prior = evidence_before(state)
    assert len(prior.strata) == 3 and "error_rate" in prior.strata[0]
    assert "fast" not in prior.strata[0]
    fast = CLEAN.tables["fast"]
    assert prior.fast.n_base == 3 * fast.n_base and prior.fast.n_canary == 3 * fast.n_canary
    # at the 100% step the stay before's baseline answers are compared again: not pooled
    reused = evidence_before(state, baseline_reused=True)
    assert len(reused.strata) == 2 and reused.fast == prior.fast


def test_wait_forever_without_max_wait() -> None:
    spec = SPEC.model_copy(update={"max_wait_s": None})
    state, clock = started(spec)
    state = drive(spec, state, clock, THIN, 86_400)
    assert state.phase is RolloutPhase.STEPPING and state.percent == 1.0


def test_pause_holds_the_split_and_resume_restarts_the_hold() -> None:
    state, clock = started()
    state = drive(SPEC, state, clock, CLEAN, 2 * SPEC.hold_s + 30)
    assert state.percent == 4.0
    before = split_for(SPEC, state)
    clock.advance(1)
    state = pause(state, clock.now(), "checking dashboards", by="bob")
    assert state.phase is RolloutPhase.PAUSED and split_for(SPEC, state) == before
    state = drive(SPEC, state, clock, CLEAN, 600)  # passing analyses do not advance a pause
    assert state.phase is RolloutPhase.PAUSED and state.percent == 4.0
    with pytest.raises(Conflict):
        pause(state, clock.now())
    state = resume(state, clock.now(), "looks fine", by="bob")
    assert state.phase is RolloutPhase.STEPPING and state.step_started_at == clock.now()
    assert [r.outcome for r in state.steps] == ["passed", "passed", "paused", "running"]
    assert state.steps[-1].percent == 4.0 and state.steps[-1].evaluations == 0
    resumed_at = clock.now()
    state = drive(SPEC, state, clock, CLEAN, SPEC.hold_s)
    assert state.percent == 8.0 and state.transitions[-1].at == resumed_at + SPEC.hold_s
    assert [(t.to_phase.value, t.by) for t in state.transitions[-3:]] == [
        ("paused", "bob"),
        ("stepping", "bob"),
        ("stepping", "controller"),
    ]
    with pytest.raises(Conflict):
        resume(state, clock.now())


def test_a_failure_while_paused_still_rolls_back() -> None:
    state, clock = started()
    state = pause(state, clock.now() + 5)
    state = evaluate(SPEC, state, bad("error_rate"), clock.now() + 6)
    assert state.phase is RolloutPhase.ROLLED_BACK and state.paused_at is None
    assert state.steps[-1].outcome == "failed"


def test_manual_promote_skips_the_remaining_steps_and_abort_rolls_back() -> None:
    state, clock = started()
    state = drive(SPEC, state, clock, CLEAN, 65)
    promoted = promote(SPEC, state, clock.now(), "urgent fix", by="carol")
    assert promoted.phase is RolloutPhase.PROMOTED and promoted.percent == 100.0
    assert (
        promoted.transitions[-1].reason == "urgent fix"
        and promoted.conclusion == "promoted: urgent fix"
    )
    assert promoted.steps[-1].outcome == "promoted"
    split = split_for(SPEC, promoted)
    assert split is not None and split.share_for(None) == 100.0
    aborted = abort(state, clock.now(), "wrong build", by="carol")
    assert aborted.phase is RolloutPhase.ROLLED_BACK and split_for(SPEC, aborted) is None
    assert aborted.steps[-1].outcome == "aborted" and aborted.transitions[-1].by == "carol"
    for final in (promoted, aborted):
        actions: list[Callable[[RolloutState], RolloutState]] = [
            lambda s: pause(s, 0),
            lambda s: resume(s, 0),
            lambda s: abort(s, 0),
            lambda s: promote(SPEC, s, 0),
            lambda s: start(SPEC, 0, state=s),
        ]
        for action in actions:
            with pytest.raises(Conflict, match=r"it is (rolled_back|promoted)"):
                action(final)


def test_pending_rollouts_route_nothing_and_ignore_analyses() -> None:
    pending = RolloutState(name=SPEC.name)
    assert split_for(SPEC, pending) is None
    assert evaluate(SPEC, pending, bad("error_rate"), 5.0) == pending
    with pytest.raises(Conflict):
        pause(pending, 0)
    aborted = abort(pending, 1.0, "never mind")
    assert aborted.phase is RolloutPhase.ROLLED_BACK and aborted.steps == ()


def test_tenant_pacing_per_step() -> None:
    spec = SPEC.model_copy(
        update={
            "pacing": PacingSpec(
                early=["tools"], late=["payments"], normal_from_percent=4, late_from_percent=50
            )
        }
    )
    state, clock = started(spec)
    seen: dict[float, tuple[float, float, float, float]] = {}
    while state.phase is RolloutPhase.STEPPING:
        split = split_for(spec, state)
        assert split is not None and (split.baseline, split.canary) == ("chat", "chat-v2")
        shares = [split.share_for(t) for t in ("tools", "search", None, "payments")]
        seen[state.percent] = (shares[0], shares[1], shares[2], shares[3])
        state = drive(spec, state, clock, CLEAN, spec.hold_s)
    # (early, unlisted tenant, no tenant, late) at each step percent
    assert seen == {
        1: (4, 0, 0, 0),
        2: (8, 0, 0, 0),
        4: (16, 4, 4, 0),
        8: (32, 8, 8, 0),
        16: (64, 16, 16, 0),
        32: (100, 32, 32, 0),
        50: (100, 50, 50, 50),
        70: (100, 70, 70, 70),
        85: (100, 85, 85, 85),
        95: (100, 95, 95, 95),
        100: (100, 100, 100, 100),
    }
    early_split = split_for(spec, start(spec, 0.0))
    assert early_split == CanarySplit(
        "chat", "chat-v2", 0.0, 4.0, 0.0, frozenset({"tools"}), frozenset({"payments"})
    )
    assert early_split.excluded_tenants == frozenset({"payments"})


def test_state_round_trips_through_json_for_the_archive() -> None:
    state, clock = started()
    state = drive(SPEC, state, clock, CLEAN, 2 * SPEC.hold_s + 20)
    state = pause(state, clock.now(), "look")
    state = evaluate(SPEC, state, THIN, clock.now() + 1)
    text = json.dumps(state.to_json(), allow_nan=False)
    back = RolloutState.from_json(json.loads(text))
    assert back == state
    done = evaluate(SPEC, resume(back, clock.now() + 2), bad("memory"), clock.now() + 3)
    data = json.loads(json.dumps(done.to_json(), allow_nan=False))
    assert data["phase"] == "rolled_back" and "memory" in data["conclusion"]
    assert data["steps"][-1]["analysis"]["criteria"][9]["name"] == "memory"
    assert RolloutState.from_json(data) == done
