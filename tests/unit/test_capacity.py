"""The capacity test (O4): step verdicts, the rate search, the knee and the targets."""

from __future__ import annotations

import functools
import heapq
import json
from collections.abc import Callable

import numpy as np
import pytest

from sluice.policy.capacity import (
    Knee,
    RateSearch,
    StepMeasure,
    StepVerdict,
    compare_capacity,
    judge_step,
    knee_moved,
    recommend,
)


def step(
    rate: float,
    *,
    achieved: float | None = None,
    p95: float | None = 100.0,
    errors: int = 0,
    shed: int = 0,
    unsent: int = 0,
    behind: bool = False,
    in_flight: float = 2.0,
) -> StepMeasure:
    return StepMeasure(
        offered_rps=rate,
        achieved_rps=rate if achieved is None else achieved,
        requests=1000,
        errors=errors,
        shed=shed,
        unsent=unsent,
        p50_ms=None if p95 is None else p95 / 2,
        p95_ms=p95,
        p99_ms=None if p95 is None else p95 * 1.5,
        mean_latency_ms=None if p95 is None else p95 / 2,
        mean_in_flight=in_flight,
        behind=behind,
    )


def test_a_step_within_every_criterion_holds() -> None:
    v = judge_step(step(10.0), slo_ms=200)
    assert v.holds and v.criterion is None and "holds at 10 rps" in v.why and "100 <= 200" in v.why


@pytest.mark.parametrize(
    ("measure", "criterion", "words"),
    [
        (step(10.0, p95=250.0), "slo", "p95 250 ms over the 200 ms SLO"),
        (step(10.0, p95=None), "slo", "no successful answer"),
        (step(10.0, errors=20, shed=15), "errors", "errors 2.0% (20/1000, 15 shed)"),
        (step(10.0, achieved=9.0), "throughput", "does not keep up"),
    ],
)
def test_each_failing_criterion_is_named_with_its_numbers(
    measure: StepMeasure, criterion: str, words: str
) -> None:
    v = judge_step(measure, slo_ms=200)
    assert not v.holds and v.criterion == criterion and words in v.why


def test_a_short_steps_shortfall_within_its_count_noise_still_holds() -> None:
    # 33 requests at ~1 in flight: 2 fewer finished than arrived is the window's edges
    few = StepMeasure(9.4, 9.4 * 31 / 33, 33, 0, 0, 0, 50.0, 100.0, 120.0, 60.0, 1.0, False)
    assert judge_step(few, slo_ms=800).holds
    # the same share missing from 1000 requests is a group that does not keep up
    many = step(9.4, achieved=9.4 * 31 / 33, in_flight=1.0)
    assert judge_step(many, slo_ms=800).criterion == "throughput"


def test_every_failing_criterion_is_listed_and_the_slo_decides() -> None:
    v = judge_step(step(10.0, p95=900.0, errors=50, achieved=5.0), slo_ms=200)
    assert v.criterion == "slo"
    assert "SLO" in v.why and "errors 5.0%" in v.why and "keep up" in v.why


@pytest.mark.parametrize("measure", [step(10.0, behind=True), step(10.0, unsent=3)])
def test_a_generator_that_fell_behind_is_inconclusive_never_a_pass(measure: StepMeasure) -> None:
    v = judge_step(measure, slo_ms=200)
    assert not v.holds and v.criterion == "generator"
    assert "inconclusive" in v.why and "generator, not the group" in v.why


def test_the_judged_quantile_is_the_one_asked_for() -> None:
    s = step(10.0, p95=180.0)  # p99 270
    assert judge_step(s, slo_ms=200, quantile="p95").holds
    assert not judge_step(s, slo_ms=200, quantile="p99").holds


def threshold(capacity: float, criterion: str = "slo") -> Callable[[float], StepMeasure]:
    """A group that holds every rate up to `capacity` and fails above it."""

    def measure(rate: float) -> StepMeasure:
        if rate <= capacity:
            return step(rate, in_flight=rate * 0.1)
        if criterion == "errors":
            return step(rate, errors=100)
        if criterion == "generator":
            return step(rate, behind=True)
        return step(rate, p95=1000.0)

    return measure


def drive(search: RateSearch, measure: Callable[[float], StepMeasure]) -> list[float]:
    rates = []
    while (rate := search.next_rate()) is not None:
        rates.append(rate)
        search.record(measure(rate))
    return rates


def test_search_grows_geometrically_then_bisects_to_the_resolution() -> None:
    search = RateSearch(1.0, max_rps=1000, slo_ms=200)
    rates = drive(search, threshold(7.3))
    assert rates[:6] == pytest.approx([1.0, 1.5, 2.25, 3.375, 5.0625, 7.59375])
    knee = search.knee()
    assert knee is not None and knee.limited_by == "slo" and not knee.lower_bound
    assert 7.3 / 1.05 <= knee.rate_rps <= 7.3
    assert knee.concurrency == pytest.approx(knee.rate_rps * 0.1) and knee.latency_ms == 100.0
    assert knee.failing is not None and not knee.failing.holds
    hi = min(s.offered_rps for s, v in search.steps if not v.holds)
    assert hi - knee.rate_rps <= 0.05 * knee.rate_rps
    assert len(search.steps) == len(rates) <= 16


@pytest.mark.parametrize("criterion", ["errors", "generator"])
def test_the_knee_names_what_broke_above_it(criterion: str) -> None:
    search = RateSearch(2.0, max_rps=1000, slo_ms=200)
    drive(search, threshold(20.0, criterion))
    knee = search.knee()
    assert knee is not None and knee.limited_by == criterion
    assert knee.lower_bound is (criterion == "generator")


def test_a_max_rps_that_holds_ends_the_search_with_a_lower_bound() -> None:
    search = RateSearch(10.0, max_rps=40.0, slo_ms=200)
    rates = drive(search, threshold(1e9))
    assert rates[-1] == 40.0 and max(rates) == 40.0
    knee = search.knee()
    assert knee is not None and knee.rate_rps == 40.0 and knee.limited_by == "max_rps"
    assert knee.lower_bound and knee.failing is None


def test_running_out_of_steps_is_a_lower_bound_too() -> None:
    search = RateSearch(1.0, max_rps=1e6, max_steps=4, slo_ms=200)
    assert len(drive(search, threshold(1e9))) == 4
    knee = search.knee()
    assert knee is not None and knee.limited_by == "max_steps" and knee.lower_bound


def test_when_the_first_step_fails_the_search_steps_down_then_up_again() -> None:
    search = RateSearch(50.0, max_rps=100.0, slo_ms=200)
    rates = drive(search, threshold(10.0))
    assert rates[:4] == [50.0, 25.0, 12.5, 6.25]
    knee = search.knee()
    assert knee is not None and knee.limited_by == "slo"
    assert 10.0 / 1.05 <= knee.rate_rps <= 10.0


def test_when_even_the_floor_fails_there_is_no_knee() -> None:
    search = RateSearch(50.0, max_rps=100.0, min_rps=10.0, slo_ms=200)
    assert drive(search, threshold(5.0)) == [50.0, 25.0, 12.5, 10.0]
    assert search.knee() is None


def test_a_failure_below_a_hold_wins() -> None:
    search = RateSearch(10.0, max_rps=100.0, slo_ms=200)
    for rate, ok in ((10.0, True), (15.0, True), (22.5, False), (12.0, False)):
        search.record(step(rate) if ok else step(rate, p95=999.0))
    knee = search.knee()
    assert knee is not None and knee.rate_rps == 10.0
    assert search.next_rate() == pytest.approx(11.0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"start_rps": 0}, "start_rps"),
        ({"start_rps": 50}, "max_rps"),
        ({"min_rps": 2.0}, "min_rps"),
        ({"growth": 1.0}, "growth"),
        ({"resolution": 0}, "resolution"),
        ({"max_steps": 0}, "max_steps"),
        ({"slo_ms": 0}, "slo_ms"),
        ({"quantile": "p90"}, "quantile"),
    ],
)
def test_bad_search_arguments_name_themselves(kwargs: dict[str, object], name: str) -> None:
    args: dict[str, object] = {"start_rps": 1.0, "max_rps": 10.0, "slo_ms": 100.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        RateSearch(**args)  # type: ignore[arg-type]


def mdc_step(rate: float, c: int, s: float, rng: np.random.Generator) -> StepMeasure:
    """One step against an M/D/c instance: c slots, fixed service s, FIFO queue. Arrivals
    are a Poisson process conditioned on its count (uniform order statistics), so the
    step's load is exactly `rate` and only the queueing is random. The step is long enough
    for ~4000 arrivals (at least 5 s); answers after the step's end do not count."""
    span = max(5.0, 4000 / rate)
    arrivals = np.sort(rng.random(round(rate * span))) * span
    free = [0.0] * c
    latency = np.empty(arrivals.size)
    for i, a in enumerate(arrivals):
        done = max(a, heapq.heappop(free)) + s
        heapq.heappush(free, done)
        latency[i] = done - a
    ok = arrivals + latency <= span
    ms = latency[ok] * 1000
    p50, p95, p99 = (float(q) for q in np.percentile(ms, [50, 95, 99]))
    return StepMeasure(
        offered_rps=rate,
        achieved_rps=float(ok.sum()) / span,
        requests=arrivals.size,
        errors=0,
        shed=0,
        unsent=0,
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        mean_latency_ms=float(ms.mean()),
        mean_in_flight=float(latency[ok].sum()) / span,
        behind=False,
    )


@pytest.mark.parametrize("c", [2, 4, 8])
@pytest.mark.parametrize("s", [0.05, 0.2])
def test_the_knee_of_an_mdc_instance_is_within_15_percent_of_c_over_s(c: int, s: float) -> None:
    capacity = c / s
    for seed in range(3):
        rng = np.random.default_rng(seed)
        search = RateSearch(0.2 * capacity, max_rps=10 * capacity, slo_ms=8 * s * 1000)
        drive(search, functools.partial(mdc_step, c=c, s=s, rng=rng))
        knee = search.knee()
        assert knee is not None and knee.limited_by in ("slo", "throughput")
        assert abs(knee.rate_rps / capacity - 1) <= 0.15, (seed, knee)
        assert knee.latency_ms <= 8 * s * 1000
        # Little: what was in flight is the rate times the mean time in the system
        assert 0 < knee.concurrency <= c * 1.5 + knee.rate_rps * 8 * s


def knee(rate: float = 20.0, concurrency: float = 6.0, latency: float = 400.0) -> Knee:
    return Knee(rate, concurrency, latency, "slo", StepVerdict(False, "x", "slo"))


def test_the_recommendation_runs_at_headroom_below_the_knee() -> None:
    r = recommend(knee(), max_concurrency=8, slo_ms=500)
    assert r.rate_per_instance == pytest.approx(16.0)
    assert r.concurrency_per_instance == pytest.approx(4.8)
    assert r.utilization == pytest.approx(0.6) and 0 < r.utilization <= 1
    assert r.queue_per_instance == 0.5  # nothing waited at the knee: the spec's floor
    assert r.latency_p95_ms == pytest.approx(320.0)  # 0.8 x the knee's 400, under the SLO
    assert r.spec_targets() == {
        "utilization": 0.6,
        "queue_per_instance": 0.5,
        "latency_p95_ms": 320.0,
    }
    assert r.notes == ()


def test_a_knee_past_the_slots_saturates_utilization_and_sets_a_queue() -> None:
    r = recommend(knee(concurrency=20.0, latency=900.0), max_concurrency=8, slo_ms=500)
    assert r.utilization == 1.0
    assert r.queue_per_instance == pytest.approx(0.8 * 12)
    assert r.latency_p95_ms == pytest.approx(400.0)  # the SLO is the lower bound
    assert any("waited in a queue" in n for n in r.notes)


def test_a_tiny_knee_keeps_utilization_positive_and_a_lower_bound_says_so() -> None:
    lb = Knee(5.0, 0.0001, 30.0, "max_rps", None)
    r = recommend(lb, max_concurrency=64, slo_ms=500)
    assert 0 < r.utilization <= 1 and r.spec_targets()["utilization"] > 0
    assert any("lower bound" in n for n in r.notes)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"max_concurrency": 0}, "max_concurrency"), ({"headroom": 1.5}, "headroom")],
)
def test_bad_recommend_arguments_name_themselves(kwargs: dict[str, float], name: str) -> None:
    args: dict[str, float] = {"max_concurrency": 8, "slo_ms": 500, **kwargs}
    with pytest.raises(ValueError, match=name):
        recommend(knee(), **args)  # type: ignore[arg-type]


def stored(version: str, rate: float, conc: float = 4.0, lat: float = 300.0) -> dict[str, object]:
    return {"version": version, "knee": {"rate_rps": rate, "concurrency": conc, "latency_ms": lat}}


def test_compare_capacity_gives_changes_and_a_verdict() -> None:
    out = compare_capacity(stored("v1", 20.0), stored("v2", 25.0, 5.0, 270.0))
    assert out["old_version"] == "v1" and out["new_version"] == "v2"
    assert out["rate_change"] == pytest.approx(0.25)
    assert out["concurrency_change"] == pytest.approx(0.25)
    assert out["latency_change"] == pytest.approx(-0.1)
    assert out["verdict"] == "faster"
    assert compare_capacity(stored("a", 20.0), stored("b", 17.0))["verdict"] == "slower"
    assert compare_capacity(stored("a", 20.0), stored("b", 20.9))["verdict"] == "same"


def test_compare_capacity_refuses_results_without_a_knee() -> None:
    with pytest.raises(ValueError, match="new"):
        compare_capacity(stored("a", 20.0), {"version": "b"})
    with pytest.raises(ValueError, match="old"):
        compare_capacity({"version": "a", "knee": {"rate_rps": 1}}, stored("b", 2.0))


def test_everything_serialises_to_json() -> None:
    search = RateSearch(1.0, max_rps=100, slo_ms=200)
    drive(search, threshold(9.0))
    k = search.knee()
    assert k is not None
    doc = {
        "knee": k.to_json(),
        "recommendation": recommend(k, max_concurrency=4, slo_ms=200).to_json(),
        "steps": [{"measure": m.to_json(), "verdict": v.to_json()} for m, v in search.steps],
    }
    back = json.loads(json.dumps(doc, allow_nan=False))
    assert back["knee"]["limited_by"] == "slo" and back["knee"]["lower_bound"] is False
    assert set(back["recommendation"]["spec_targets"]) == {
        "utilization",
        "queue_per_instance",
        "latency_p95_ms",
    }
    assert back["steps"][0]["measure"]["offered_rps"] == 1.0


def test_a_knee_moved_past_the_margin_either_way_makes_targets_stale() -> None:
    def result(rate: float) -> dict[str, object]:
        return {"version": "v1", "knee": {"rate_rps": rate, "concurrency": 4, "latency_ms": 500}}

    assert knee_moved(result(40), result(30))["rate_change"] == -0.25  # type: ignore[index]
    assert knee_moved(result(40), result(50)) is not None  # faster counts too
    assert knee_moved(result(40), result(45)) is None  # +12.5 %: within the 20 % margin
    assert knee_moved(result(40), {"version": "v2", "knee": None}) is None  # nothing to compare
    assert knee_moved(result(40), result(45), margin=0.1) is not None
