"""Whether a load generator kept its schedule (`sluice.policy.generator`), and what a load
test whose generator did not concludes: nothing (`RateSearch.inconclusive`, `run_verdict`)."""

from __future__ import annotations

import pytest

from sluice.core import EXIT_FAILED, EXIT_INCONCLUSIVE, verdict_exit
from sluice.policy.capacity import RateSearch, StepMeasure
from sluice.policy.generator import BEHIND_LAG_S, ScheduleBounds, judge_schedule
from sluice.tools.loadtest import run_verdict


def schedule(n: int, rate: float) -> list[float]:
    return [k / rate for k in range(n)]


def test_a_generator_on_time_kept_its_schedule() -> None:
    at = schedule(100, 50.0)
    sent = [a + 0.002 for a in at]
    kept = judge_schedule(at, sent, window=(0.0, 2.0), sends_in_window=100)
    assert kept.kept and kept.reason is None and kept.unsent == 0
    assert kept.lag_p99_ms == pytest.approx(2.0) and kept.send_share == 1.0


def test_unsent_arrivals_and_a_late_p99_are_each_named() -> None:
    at = schedule(10, 10.0)
    sent: list[float | None] = [a + 2 * BEHIND_LAG_S for a in at]
    sent[3] = None
    judged = judge_schedule(at, sent)
    assert not judged.kept
    assert judged.reasons == (
        "1 of 10 arrivals unsent (in-flight cap reached)",
        "p99 schedule lag 100 ms > 50 ms",
    )


def test_a_generator_that_falls_further_behind_sends_below_the_asked_rate() -> None:
    """Under a loose lag bound (`--max-lag-ms 1000`), a generator whose every send is 2.5 ms
    later than the one before stays within it (p99 under 500 ms), but it sends at 89 % of
    the rate asked: behind all the same."""
    at = schedule(200, 50.0)
    sent = [a + 0.0025 * k for k, a in enumerate(at)]
    in_window = sum(1 for s in sent if s < 4.0)
    loose = ScheduleBounds(max_p99_lag_s=1.0)
    judged = judge_schedule(at, sent, window=(0.0, 4.0), sends_in_window=in_window, bounds=loose)
    assert judged.lag_p99_ms is not None and judged.lag_p99_ms < 500
    assert not judged.kept and judged.send_share == pytest.approx(0.89)
    assert judged.reasons == ("sent 44.5 rps of the 50 asked (89% < 90%)",)


def test_a_short_window_is_not_judged_by_its_send_rate() -> None:
    at = schedule(10, 10.0)
    judged = judge_schedule(at, [a + 0.001 for a in at], window=(0.0, 1.0), sends_in_window=5)
    assert judged.kept and judged.send_share is None


def test_a_bound_of_zero_calls_any_lag_behind_and_bad_bounds_are_refused() -> None:
    at = schedule(5, 10.0)
    judged = judge_schedule(at, [a + 1e-6 for a in at], bounds=ScheduleBounds(0.0))
    assert not judged.kept and "p99 schedule lag 0 ms > 0 ms" in judged.reasons[0]
    with pytest.raises(ValueError, match="max_p99_lag_s"):
        ScheduleBounds(-1.0)
    with pytest.raises(ValueError, match="min_send_share"):
        ScheduleBounds(0.05, 1.5)
    with pytest.raises(ValueError, match="2 scheduled offsets but 1"):
        judge_schedule([0.0, 1.0], [0.0])


def measure(rate: float, *, p95: float = 100.0, behind: bool = False) -> StepMeasure:
    return StepMeasure(
        offered_rps=rate,
        achieved_rps=rate,
        requests=500,
        errors=0,
        shed=0,
        unsent=0,
        p50_ms=p95 / 2,
        p95_ms=p95,
        p99_ms=p95 * 1.5,
        mean_latency_ms=p95 / 2,
        mean_in_flight=2.0,
        behind=behind,
    )


def search() -> RateSearch:
    return RateSearch(10.0, max_rps=100.0, slo_ms=500.0)


def test_a_search_whose_lowest_failure_is_the_generator_is_inconclusive() -> None:
    """The issue's run: steps held up to 9.95 rps, then the generator fell behind at 14.9;
    the 'knee' below it is the generator's limit, so no knee and no targets."""
    s = search()
    s.record(measure(9.95))
    s.record(measure(14.9, behind=True))
    why = s.inconclusive()
    assert why is not None and "14.9 rps" in why and "no knee and no targets" in why


def test_a_generator_behind_only_above_a_real_failure_does_not_matter() -> None:
    s = search()
    s.record(measure(10.0))
    s.record(measure(15.0, p95=900.0))  # the group breaks its SLO
    s.record(measure(22.5, behind=True))
    assert s.inconclusive() is None
    knee = s.knee()
    assert knee is not None and knee.rate_rps == 10.0 and knee.limited_by == "slo"


def test_a_run_verdict_and_its_exit_code() -> None:
    measured = {"slo_ms": 500.0, "knee": {"rate_rps": 40.0}, "inconclusive": None}
    no_knee = {"slo_ms": 500.0, "knee": None, "inconclusive": None}
    behind = {"slo_ms": 500.0, "knee": None, "inconclusive": "the load generator fell behind"}
    bad_fit = {"slo_ms": None, "knee": None, "fit": {"error": "too few answers"}}
    assert [run_verdict(r) for r in (measured, no_knee, behind, bad_fit)] == [
        "pass",
        "fail",
        "inconclusive",
        "fail",
    ]
    assert [verdict_exit(v) for v in ("pass", "fail", "inconclusive", "weird")] == [
        0,
        EXIT_FAILED,
        EXIT_INCONCLUSIVE,
        EXIT_FAILED,
    ]
    assert (EXIT_FAILED, EXIT_INCONCLUSIVE) == (8, 9)  # documented in the README
