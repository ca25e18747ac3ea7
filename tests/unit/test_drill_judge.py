"""Judging a peak drill (O5): pass, and each way it fails, with the reasons it gives."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import pytest

from sluice.policy.drills import (
    RECOVERY_GRACE_S,
    DrillCriteria,
    DrillPlan,
    DrillReport,
    DrillSample,
    InstanceUp,
    ScaleEvent,
    judge_drill,
    time_to_ready_tolerance,
    time_to_scale_tolerance,
)

WARM, HOLD, COOL = 20, 240, 30


@dataclass(frozen=True)
class Drill:
    """A fluid model of a group under a step peak, one reading a second: the autoscaler
    decides at `decide_s` after the peak starts (None: never) to want `want` instances,
    which are ready `startup_s` later; each ready instance completes `per_instance` rps;
    answers that waited over `slo_s` miss the SLO; a queue over `shed_over` is shed."""

    base: int = 30
    peak: int = 60
    per_instance: int = 20
    start: int = 2
    max_instances: int = 8
    decide_s: float | None = 5
    want: int = 5
    startup_s: float | None = 15
    clipped_by: tuple[str, ...] = ()
    served: bool | None = None
    """None: per-instance counts unknown; False: the new instances answered nothing"""
    slo_s: float = 2.0
    shed_over: int | None = None
    needed: int | None = -1
    """-1: ceil(peak / per_instance)"""

    def plan(self) -> DrillPlan:
        needed = math.ceil(self.peak / self.per_instance) if self.needed == -1 else self.needed
        return DrillPlan(
            WARM, WARM + HOLD, self.base, self.peak, self.max_instances, self.start, needed
        )

    def run(self, criteria: DrillCriteria | None = None) -> DrillReport:
        return judge_drill(self.plan(), *self.parts(), criteria or DrillCriteria())

    def parts(self) -> tuple[list[DrillSample], list[ScaleEvent], list[InstanceUp]]:
        decide = None if self.decide_s is None else WARM + self.decide_s
        desired_after = min(self.want, self.max_instances)
        ready_at = None if decide is None or self.startup_s is None else decide + self.startup_s
        samples: list[DrillSample] = []
        queue = served = 0
        for t in range(1, WARM + HOLD + COOL + 1):
            offered = self.peak if WARM <= t < WARM + HOLD else self.base
            desired = desired_after if decide is not None and t >= decide else self.start
            ready = desired if ready_at is not None and t >= ready_at else self.start
            serving = self.start if self.served is False else ready
            queue += offered
            done = min(queue, serving * self.per_instance)
            queue -= done
            served += max(0, done - self.start * self.per_instance)
            shed = 0
            if self.shed_over is not None and queue > self.shed_over:
                shed, queue = queue - self.shed_over, self.shed_over
            in_slo = done if queue <= self.slo_s * serving * self.per_instance else 0
            samples.append(DrillSample(t, offered, desired, ready, queue, done, in_slo, shed, 0))
        events: list[ScaleEvent] = []
        if decide is not None and desired_after != self.start:
            events.append(ScaleEvent(decide, self.start, desired_after, "queue", self.clipped_by))
        n_new = max(0, desired_after - self.start) if decide is not None else 0
        instances = [InstanceUp(f"i-{k}", 0.0, 0.0, None) for k in range(self.start)] + [
            InstanceUp(
                f"n-{k}",
                float(decide or 0),
                ready_at,
                None if self.served is None or ready_at is None else served // max(n_new, 1),
            )
            for k in range(n_new)
        ]
        return samples, events, instances


def has(report: DrillReport, words: str) -> bool:
    return any(words in r for r in report.reasons)


def test_a_peak_the_autoscaler_meets_in_time_passes() -> None:
    report = Drill().run()
    assert report.verdict == "pass", report.reasons
    assert report.reasons == []
    assert report.first_scale_up_s == 5
    assert report.instances_ready_s == [20, 20, 20]
    assert report.queue_recovered_s is not None and report.queue_recovered_s < 40
    assert report.slo_attainment is not None and report.slo_attainment >= 0.9
    assert report.shed == 0 and report.shed_rate == 0
    assert not (report.hit_max or report.hit_quota or report.hit_budget)
    assert (report.peak_desired, report.peak_ready) == (5, 5)
    assert report.did_the_metric_trigger.answer and "2 -> 5" in report.did_the_metric_trigger.detail
    assert report.did_the_instances_come_up.answer
    # no per-instance counts: the completed rate rose past what the start could do (40 rps)
    assert report.did_traffic_reach_them.answer
    assert "per-instance counts unknown" in report.did_traffic_reach_them.detail


def test_per_instance_counts_show_traffic_reached_the_new_instances() -> None:
    report = Drill(served=True).run()
    assert report.verdict == "pass" and report.did_traffic_reach_them.answer
    assert "n-0" in report.did_traffic_reach_them.detail


def test_new_instances_that_served_nothing_fail_on_routing() -> None:
    report = Drill(served=False).run()
    assert report.verdict == "fail" and not report.did_traffic_reach_them.answer
    assert has(report, "traffic did not reach the new instances")
    assert has(report, "never got back under")


def test_a_group_capped_by_its_max_fails_naming_the_max() -> None:
    report = Drill(peak=160, start=1, max_instances=2, want=8, clipped_by=("max",)).run()
    assert report.verdict == "fail" and report.hit_max
    assert has(report, "the autoscaler wanted 8 but max is 2: the group hit its max")
    assert has(report, "raise autoscaling.max or its quota")
    assert "bound by max" in report.did_the_instances_come_up.detail


def test_reaching_max_while_the_peak_needs_more_is_a_hit_even_unclipped() -> None:
    report = Drill(peak=160, start=1, max_instances=2, want=2).run()
    assert report.hit_max and has(report, "hit its max")


def test_no_scale_decision_fails_as_the_metric_not_triggering() -> None:
    report = Drill(decide_s=None).run()
    assert report.verdict == "fail" and report.first_scale_up_s is None
    assert has(report, "the metric did not trigger")
    assert not report.did_the_metric_trigger.answer
    assert not report.did_the_instances_come_up.answer
    assert not report.did_traffic_reach_them.answer


def test_a_peak_the_start_already_covers_fails_as_too_small() -> None:
    # 35 rps fits 2 x 20: the group never needed to scale, and the queue never grew
    report = Drill(peak=35, decide_s=None).run()
    assert report.verdict == "fail"
    assert has(report, "too small to exercise the autoscaler (raise --peak)")
    assert report.queue_recovered_s == 0 and report.slo_attainment == 1.0


def test_a_too_small_peak_fails_even_when_the_autoscaler_moved() -> None:
    report = Drill(peak=35).run()
    assert report.verdict == "fail" and has(report, "too small")


def test_slow_instances_fail_time_to_ready() -> None:
    slow = Drill(startup_s=60)
    report = slow.run(DrillCriteria(max_time_to_ready_s=40.0, min_slo_attainment=0.0))
    assert report.verdict == "fail" and report.instances_ready_s[0] == 65
    assert has(report, "ready 65.0 s after the peak started, over the 40 s limit")
    assert has(report, "instances start slowly")
    # None: time to ready not judged
    unjudged = slow.run(DrillCriteria(min_slo_attainment=0.0))
    assert not has(unjudged, "over the 40 s limit") and unjudged.verdict == "pass"


def test_instances_that_never_come_up_fail() -> None:
    report = Drill(startup_s=None).run()
    assert report.verdict == "fail" and report.instances_ready_s == []
    assert has(report, "no new instance became ready (3 launched, 3 never ready)")
    assert "never ready: n-0, n-1, n-2" in report.did_the_instances_come_up.detail


def test_a_late_first_decision_fails_time_to_scale() -> None:
    report = Drill(decide_s=45).run(DrillCriteria(min_slo_attainment=0.0))
    assert report.verdict == "fail"
    assert has(report, "first scale-up 45.0 s after the peak started, over the 30 s limit")


def test_quota_and_budget_clips_fail_naming_the_limit() -> None:
    report = Drill(clipped_by=("quota",)).run()
    assert report.hit_quota and not report.hit_max and has(report, "hit its quota")
    limited = judge_drill(Drill().plan(), *Drill().parts(), DrillCriteria(), {"budget": True})
    assert limited.hit_budget and has(limited, "hit its budget")


def test_shedding_over_the_limit_fails_with_its_rate() -> None:
    report = Drill(shed_over=20).run(DrillCriteria(min_slo_attainment=0.0, max_shed_rate=0.01))
    assert report.shed == 380 and report.shed_rate == pytest.approx(380 / 15_900)
    assert has(report, "of the offered requests were shed")


def test_a_queue_that_drains_only_after_the_peak_fails() -> None:
    # 5 x 20 never catches up with 101 rps: it drains in the cool-down
    report = Drill(peak=101, want=5, needed=5, slo_s=1e9).run(
        DrillCriteria(max_time_to_recover_s=1e9)
    )
    assert has(report, "drained only after the peak ended")


def test_the_report_is_json_with_its_criteria() -> None:
    report = Drill(decide_s=None).run()
    doc = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert doc["verdict"] == "fail" and doc["criteria"]["max_time_to_scale_s"] == 30.0
    assert set(doc["milestones"]) == {"first_scale_up_s", "instances_ready_s", "queue_recovered_s"}
    assert doc["did_the_metric_trigger"]["answer"] is False


def test_a_drill_needs_readings_and_a_plan_with_a_peak() -> None:
    with pytest.raises(ValueError, match="samples"):
        judge_drill(Drill().plan(), [], [], [], DrillCriteria())
    with pytest.raises(ValueError, match="peak_end_s"):
        replace(Drill().plan(), peak_end_s=WARM)


def test_live_and_simulated_drills_agree_within_ticks_and_samples() -> None:
    assert time_to_scale_tolerance(2.0) == pytest.approx(6.0)
    assert time_to_scale_tolerance(2.0, sample_s=0.5) == pytest.approx(5.0)
    assert time_to_ready_tolerance(2.0, 40.0) == pytest.approx(16.0)
    with pytest.raises(ValueError, match="tick_s"):
        time_to_scale_tolerance(0.0)
    with pytest.raises(ValueError, match="startup_s"):
        time_to_ready_tolerance(1.0, -1.0)


def _with_queue(samples: list[DrillSample], at: range, queued: float) -> list[DrillSample]:
    return [replace(s, queued=queued) if s.t_s in at else s for s in samples]


def test_a_short_burst_after_the_queue_recovered_does_not_undo_it() -> None:
    """A 2 s burst late in the hold (Poisson arrivals near capacity) is not a relapse; one
    lasting the grace is, and recovery then dates from its end."""
    drill = Drill()
    samples, events, instances = drill.parts()
    recovered = judge_drill(drill.plan(), samples, events, instances, DrillCriteria())
    base = recovered.queue_recovered_s
    assert base is not None and base < 40
    late = WARM + 200
    burst = _with_queue(samples, range(late, late + 2), 50.0)
    report = judge_drill(drill.plan(), burst, events, instances, DrillCriteria())
    assert report.queue_recovered_s == base and report.verdict == "pass", report.reasons
    grace = int(RECOVERY_GRACE_S)
    relapse = _with_queue(samples, range(late, late + grace + 1), 50.0)
    report = judge_drill(drill.plan(), relapse, events, instances, DrillCriteria())
    assert report.queue_recovered_s == 200 + grace + 1
    assert has(report, "over the 120 s limit")


def test_the_peaks_own_first_queue_counts_however_short() -> None:
    """The queue the peak builds before the scale-up is what recovery is measured from,
    even when it lasts less than the grace."""
    drill = Drill(start=3, peak=70, want=4, startup_s=1, decide_s=1)
    samples, events, instances = drill.parts()
    quiet = [replace(s, queued=0.0) for s in samples]
    first = _with_queue(quiet, range(WARM, WARM + 2), 30.0)
    report = judge_drill(drill.plan(), first, events, instances, DrillCriteria())
    assert report.queue_recovered_s == 2
