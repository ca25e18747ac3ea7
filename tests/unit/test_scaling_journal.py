"""The live autoscaler's plumbing: latency windows from cumulative histograms, and explain's
pairing of decisions with the instances they launched."""

from __future__ import annotations

import pytest

from sluice.control.explain import explain_decisions
from sluice.policy.autoscale.base import TrafficSample, window_quantile
from sluice.store import Event, ScalingDecision

BOUNDS = (0.1, 0.5, 1.0)


def sample(at: float, counts: tuple[int, ...]) -> TrafficSample:
    return TrafficSample(at, 0, 0, sum(counts), sum(counts), BOUNDS, counts)


def test_window_quantile_uses_only_requests_between_the_samples() -> None:
    old = sample(0, (1000, 0, 0, 0))  # fast requests long ago must not dilute the window
    new = sample(10, (1000, 0, 100, 0))  # 100 new ones, all in (0.5, 1.0]
    assert window_quantile(old, new, 0.95) == pytest.approx(0.5 + 0.5 * 95 / 100)
    assert window_quantile(new, new, 0.95) is None  # nothing finished: no data, not zero


def test_window_quantile_interpolates_like_histogram_quantile() -> None:
    old = sample(0, (0, 0, 0, 0))
    new = sample(5, (50, 50, 0, 0))
    assert window_quantile(old, new, 0.5) == pytest.approx(0.1)
    assert window_quantile(old, new, 0.75) == pytest.approx(0.1 + 0.4 * 0.5)


def test_window_quantile_overflow_bucket_reports_its_lower_edge() -> None:
    assert window_quantile(sample(0, (0, 0, 0, 0)), sample(1, (0, 0, 0, 10)), 0.95) == 1.0


def decision(i: int, at: float, current: int, desired: int) -> ScalingDecision:
    return ScalingDecision(i, at, "chat", "sluice", current, desired, "concurrency", "why", {})


def event(i: int, at: float, instance: str, kind: str, **detail: float) -> Event:
    return Event(i, at, "chat", instance, kind, kind, dict(detail))


def test_explain_pairs_launches_with_the_decision_before_them() -> None:
    decisions = [decision(2, 20.0, 3, 2), decision(1, 10.0, 1, 3)]  # newest first
    events = [
        event(6, 25.0, "c", "drain"),
        event(5, 14.0, "c", "ready", startup_s=3.5),
        event(4, 11.0, "b", "failed"),
        event(3, 10.5, "c", "launch"),
        event(2, 10.4, "b", "launch"),
        event(1, 1.0, "a", "launch"),
    ]
    out = explain_decisions(decisions, list(events), {"c": 42})
    down, up = out
    assert down["launched"] == []  # a scale-down launches nothing
    assert [i["instance"] for i in up["launched"]] == ["b", "c"]
    b, c = up["launched"]
    assert (b["outcome"], b["requests_served"]) == ("failed", 0)
    assert (c["outcome"], c["startup_s"], c["requests_served"]) == ("came up", 3.5, 42)
