"""Metrics history rollups (O3): counters difference, histograms merge, minutes close."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sluice.policy.autoscale.base import TrafficSample
from sluice.policy.history import (
    Accumulator,
    HistogramCounts,
    Rollup,
    SeriesContext,
    merge,
    quantile,
    series,
    share_within,
)

BOUNDS = (0.1, 0.2, 0.5, 1.0)


def sample(at: float, arrivals: int, counts: tuple[int, ...], **kw: Any) -> TrafficSample:
    return TrafficSample(
        at=at,
        in_flight=kw.pop("in_flight", 0),
        queued=kw.pop("queued", 0),
        arrivals=arrivals,
        completions=sum(counts),
        latency_bounds=BOUNDS,
        latency_counts=counts,
        **kw,
    )


def test_a_reading_counts_what_grew_since_the_one_before() -> None:
    older = sample(100.0, 10, (5, 5, 0, 0, 0), server_errors=1)
    newer = sample(101.0, 30, (10, 10, 5, 0, 0), server_errors=3)
    r = Rollup.between(older, newer, {"ready_instances": 2.0}, end=101.0, seconds=1.0)
    assert (r.requests, r.completed, r.server_errors) == (20, 15, 2)
    assert r.latency.counts == (5, 5, 5, 0, 0)
    assert r.gauges["ready_instances"] == (2.0, 2.0, 1)


def test_a_first_reading_is_a_baseline_and_a_reset_counts_from_zero() -> None:
    first = Rollup.between(None, sample(1.0, 500, (500, 0, 0, 0, 0)), {}, end=1.0, seconds=1.0)
    assert first.requests == 0 and first.latency.total == 0  # not 500 requests in one second
    restarted = Rollup.between(
        sample(1.0, 500, (500, 0, 0, 0, 0)), sample(2.0, 7, (7, 0, 0, 0, 0)), {}, 2.0, 1.0
    )
    assert restarted.requests == 7 and restarted.latency.total == 7


def test_tokens_count_what_grew_and_a_restarted_gateway_counts_from_zero() -> None:
    older = sample(100.0, 10, (10, 0, 0, 0, 0), prompt_tokens=5_000, completion_tokens=800)
    newer = sample(102.0, 14, (14, 0, 0, 0, 0), prompt_tokens=5_600, completion_tokens=880)
    r = Rollup.between(older, newer, {}, end=102.0, seconds=2.0)
    assert (r.prompt_tokens, r.completion_tokens) == (600, 80)
    values = series(r)
    assert (values["prompt_tokens_per_s"], values["completion_tokens_per_s"]) == (300.0, 40.0)
    restarted = sample(103.0, 2, (2, 0, 0, 0, 0), prompt_tokens=90, completion_tokens=12)
    again = Rollup.between(newer, restarted, {}, end=103.0, seconds=1.0)
    assert (again.prompt_tokens, again.completion_tokens) == (90, 12)
    first = Rollup.between(None, newer, {}, end=102.0, seconds=1.0)
    assert (first.prompt_tokens, first.completion_tokens) == (0, 0)  # a baseline, not a burst


def test_streams_time_per_output_token_is_kept_and_merged_like_latency() -> None:
    bounds = (0.01, 0.02, 0.05)
    older = sample(100.0, 10, (10, 0, 0, 0, 0), tpot_bounds=bounds, tpot_counts=(4, 0, 0, 0))
    newer = sample(101.0, 20, (20, 0, 0, 0, 0), tpot_bounds=bounds, tpot_counts=(4, 10, 0, 0))
    r = Rollup.between(older, newer, {}, end=101.0, seconds=1.0)
    assert r.tpot.counts == (0, 10, 0, 0)
    p95 = series(r)["tpot_p95_ms"]
    assert p95 is not None and 10.0 < p95 <= 20.0
    back = Rollup.from_json(r.start, r.to_json())
    assert back.tpot == r.tpot and merged_counts([r, back]) == (0, 20, 0, 0)
    assert series(Rollup(start=0.0, seconds=1.0))["tpot_p95_ms"] is None  # no stream: nothing


def merged_counts(rollups: list[Rollup]) -> tuple[int, ...]:
    merged = merge(rollups)
    assert merged is not None
    return merged.tpot.counts


def test_token_rates_are_over_the_spans_seconds_and_none_without_seconds() -> None:
    minutes = [
        Rollup(start=0.0, seconds=60.0, prompt_tokens=6_000, completion_tokens=600),
        Rollup(start=60.0, seconds=60.0, prompt_tokens=0, completion_tokens=0),
    ]
    both = merge(minutes)
    assert both is not None and (both.prompt_tokens, both.completion_tokens) == (6_000, 600)
    values = series(both)
    assert (values["prompt_tokens_per_s"], values["completion_tokens_per_s"]) == (50.0, 5.0)
    quiet = series(minutes[1])
    assert (quiet["prompt_tokens_per_s"], quiet["completion_tokens_per_s"]) == (0.0, 0.0)
    empty = series(Rollup(start=0.0))
    assert empty["prompt_tokens_per_s"] is None and empty["completion_tokens_per_s"] is None


def test_quantiles_of_a_merge_come_from_the_merged_histogram_not_averaged_quantiles() -> None:
    fast = Rollup(
        start=0, seconds=60, completed=99, latency=HistogramCounts(BOUNDS, (99, 0, 0, 0, 0))
    )
    slow = Rollup(
        start=60, seconds=60, completed=1, latency=HistogramCounts(BOUNDS, (0, 0, 0, 1, 0))
    )
    both = merge([fast, slow])
    assert both is not None and both.completed == 100
    p50 = quantile(both.latency, 0.5)
    assert p50 is not None and p50 < 0.1  # averaging the two p50s would say ~0.4
    p99 = series(both)["p99_ms"]
    assert p99 is not None and p99 <= 100.0


def test_slo_attainment_is_the_share_within_the_bound_and_burn_its_misses_over_the_budget() -> None:
    h = HistogramCounts(BOUNDS, (50, 40, 10, 0, 0))
    assert share_within(h, 0.2) == 0.9
    r = Rollup(start=0, seconds=10, completed=100, latency=h)
    values = series(r, SeriesContext(slo_latency_s=0.2, slo_target=0.95))
    assert values["slo_attainment"] == 0.9
    assert abs((values["slo_burn"] or 0) - 2.0) < 1e-9  # 10% missed of a 5% budget


def test_series_say_nothing_rather_than_zero_without_requests() -> None:
    values = series(Rollup(start=0, seconds=60, gauges={"ready_instances": (0.0, 0.0, 1)}))
    assert values["p95_ms"] is None and values["error_rate"] is None
    assert values["requests_per_s"] == 0.0 and values["ready_instances"] == 0.0


def test_rollups_round_trip_through_json() -> None:
    r = Rollup(
        start=120.0,
        seconds=60.0,
        requests=9,
        completed=8,
        too_many=1,
        served_s=1.5,
        latency=HistogramCounts(BOUNDS, (1, 2, 3, 2, 0)),
        prompt_tokens=4_096,
        completion_tokens=512,
        gauges={"held_units": (120.0, 3.0, 60)},
        spend=0.25,
    )
    assert Rollup.from_json(120.0, r.to_json()) == r


def test_a_row_stored_before_tokens_were_kept_loads_with_no_tokens() -> None:
    doc = Rollup(start=60.0, seconds=60.0, requests=3, completed=3, prompt_tokens=9).to_json()
    del doc["prompt_tokens"], doc["completion_tokens"]
    old = Rollup.from_json(60.0, doc)
    assert (old.requests, old.prompt_tokens, old.completion_tokens) == (3, 0, 0)
    assert series(old)["prompt_tokens_per_s"] == 0.0


def test_the_accumulator_closes_each_minute_once_a_reading_falls_in_the_next() -> None:
    acc = Accumulator(keep_s=30.0)
    arrivals = 0
    for t in range(0, 150):
        arrivals += 2
        acc.observe("chat", sample(float(t), arrivals, (arrivals, 0, 0, 0, 0)), {}, float(t))
    closed = acc.closed()
    assert [start for _, start, _ in closed] == [0.0, 60.0]
    assert closed[1][2].requests == 120 and closed[1][2].seconds == 60.0
    assert acc.closed() == []
    window = acc.window("chat", 149.0, 10.0)
    assert window is not None and window.requests == 20
    rest = acc.flush()
    assert [start for _, start, _ in rest] == [120.0] and rest[0][2].requests == 60


def test_an_unreadable_gateway_is_missing_not_zero() -> None:
    acc = Accumulator(keep_s=60.0)
    acc.observe("chat", sample(0.0, 10, (10, 0, 0, 0, 0)), {}, 0.0)
    acc.observe("chat", None, {"ready_instances": 1.0}, 1.0)
    acc.observe("chat", sample(2.0, 30, (30, 0, 0, 0, 0)), {}, 2.0)
    w = acc.window("chat", 2.0, 10.0)
    assert w is not None and w.requests == 20  # the gap is bridged by the next reading


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=20))
def test_merging_in_any_grouping_gives_the_same_totals(parts: list[tuple[int, int]]) -> None:
    rollups = [
        Rollup(
            start=float(i),
            seconds=1.0,
            requests=a,
            completed=b,
            prompt_tokens=40 * a,
            completion_tokens=3 * b,
            latency=HistogramCounts(BOUNDS, (b, 0, 0, 0, 0)),
            gauges={"in_flight": (float(a), float(a), 1)},
        )
        for i, (a, b) in enumerate(parts)
    ]
    whole = merge(rollups)
    halves = merge([m for m in (merge(rollups[::2]), merge(rollups[1::2])) if m is not None])
    assert whole is not None and halves is not None
    assert (whole.requests, whole.completed, whole.latency) == (
        halves.requests,
        halves.completed,
        halves.latency,
    )
    assert (whole.prompt_tokens, whole.completion_tokens) == (
        halves.prompt_tokens,
        halves.completion_tokens,
    )
    assert whole.prompt_tokens == 40 * sum(a for a, _ in parts)
    assert whole.peak("in_flight") == max(a for a, _ in parts)
