"""The Knative KPA emulation, checked against numbers from the upstream formulas
(knative/serving pkg/autoscaler/scaling/autoscaler.go, pkg/autoscaler/aggregation)."""

from __future__ import annotations

from typing import Any

from sluice.policy.autoscale import Decision, GroupLoad, KpaMemory, KpaPolicy, Stateful
from sluice.spec.autoscaling import KpaSpec


def load(t: float, ready: int, concurrency: int, **kw: Any) -> GroupLoad:
    current = kw.pop("current", ready)
    running = min(concurrency, ready * 4)
    return GroupLoad(
        at=t,
        current=current,
        ready=ready,
        slots_per_instance=4,
        in_flight=running,
        queued=concurrency - running,
        arrivals=0,
        **kw,
    )


def feed(pol: Stateful[KpaMemory], start: int, stop: int, ready: int, concurrency: int) -> Decision:
    dec = None
    for t in range(start, stop):
        dec = pol.decide(load(t, ready, concurrency), float(t))
    assert dec is not None
    return dec


def test_dspc_is_ceil_of_the_stable_average_over_target() -> None:
    pol = Stateful(KpaPolicy(KpaSpec(), min_scale=0, max_scale=0))
    dec = feed(pol, 0, 60, ready=4, concurrency=8)
    assert dec.desired == 3  # ceil(8 / 2.8)
    assert dec.proposals == {"stable": 3, "panic": 3}


def test_partial_and_full_windows_average_per_second_buckets() -> None:
    pol = Stateful(KpaPolicy(KpaSpec(), min_scale=0, max_scale=0))
    feed(pol, 0, 30, ready=10, concurrency=28)
    dec = feed(pol, 30, 59, ready=10, concurrency=0)  # last tick at t=58
    # stable: 30 x 28 over 59 buckets = 14.24 -> 6; panic 0 -> clamped to floor(10 / 2)
    assert dec.signals["stable_concurrency"] == 840 / 59
    assert dec.desired == 6
    dec = feed(pol, 59, 91, ready=10, concurrency=0)  # t=90: buckets 31..90 all 0
    assert dec.signals["stable_concurrency"] == 0 and dec.desired == 5


def test_panic_at_200_percent_and_never_decreasing_while_panicking() -> None:
    pol = Stateful(KpaPolicy(KpaSpec(), min_scale=0, max_scale=0))
    feed(pol, 0, 60, ready=5, concurrency=14)
    assert pol.decide(load(60, 5, 28), 60.0).desired == 6  # (59x14 + 28)/60 -> 6
    pol.decide(load(61, 5, 28), 61.0)
    dec = pol.decide(load(62, 5, 28), 62.0)
    assert dec.signals["panicking"] == 0  # panic (3x14 + 3x28)/6 = 21 -> 8 < 2 x 5
    pol.decide(load(63, 5, 28), 63.0)
    dec = pol.decide(load(64, 5, 28), 64.0)
    assert dec.signals["panicking"] == 1  # (14 + 5x28)/6 = 25.7 -> 10 >= 2 x 5
    assert dec.desired == 10 and dec.winner == "panic"
    # the load falls, ready catches up: in panic the count never decreases
    for t in range(65, 124):
        assert pol.decide(load(t, 10, 3), float(t)).desired == 10, t
    # 60 s after the last crossing (t=64) panic ends: stable mode, halving at most
    dec = feed(pol, 124, 130, ready=10, concurrency=3)
    assert dec.signals["panicking"] == 0 and dec.desired == 5


def test_max_scale_down_rate_halves_at_most_per_tick_then_zero_after_grace() -> None:
    pol = Stateful(KpaPolicy(KpaSpec(), min_scale=0, max_scale=0))
    assert feed(pol, 0, 61, ready=10, concurrency=0).desired == 5  # floor(10 / 2)
    assert pol.decide(load(62, 5, 0), 62.0).desired == 2
    assert pol.decide(load(64, 2, 0), 64.0).desired == 1
    dec = pol.decide(load(66, 1, 0), 66.0)  # floor(1 / 2) = 0: grace period first
    assert dec.desired == 1 and "grace" in dec.reason
    assert pol.decide(load(94, 1, 0), 94.0).desired == 1
    assert pol.decide(load(96, 1, 0), 96.0).desired == 0  # 30 s after t=66


def test_max_scale_up_rate() -> None:
    pol = Stateful(KpaPolicy(KpaSpec(), min_scale=0, max_scale=0))
    assert pol.decide(load(0, 1, 1000), 0.0).desired == 358  # ceil(1000/2.8) <= 1000 x 1
    pol = Stateful(KpaPolicy(KpaSpec(max_scale_up_rate=2), min_scale=0, max_scale=0))
    assert pol.decide(load(0, 1, 1000), 0.0).desired == 2  # ceil(2 x 1)
    pol = Stateful(KpaPolicy(KpaSpec(), min_scale=1, max_scale=50))
    assert pol.decide(load(0, 1, 1000), 0.0).desired == 50


def test_tick_every_2s_and_poke_from_zero() -> None:
    pol = Stateful(KpaPolicy(KpaSpec(), min_scale=0, max_scale=0))
    first = pol.decide(load(0, 2, 5), 0.0)
    assert pol.decide(load(1, 2, 50), 1.0) is first
    assert pol.decide(load(2, 2, 50), 2.0) is not first
    cold = Stateful(KpaPolicy(KpaSpec(), min_scale=0, max_scale=0))
    assert cold.decide(load(0, 0, 0), 0.0).desired == 0
    assert cold.decide(load(1, 0, 1), 1.0).desired == 1  # the activator pokes at once


def test_scale_down_delay_keeps_the_recent_max() -> None:
    pol = Stateful(
        KpaPolicy(KpaSpec(scale_down_delay_s=30, stable_window_s=6), min_scale=0, max_scale=0)
    )
    assert feed(pol, 0, 10, ready=10, concurrency=28).desired == 10
    # t=10: buckets 5..10 hold 5 x 28 -> ceil(23.3 / 2.8) = 9, kept for 30 s
    assert feed(pol, 10, 39, ready=10, concurrency=0).desired == 9
    assert feed(pol, 39, 41, ready=10, concurrency=0).desired == 5


def test_missing_metrics_keep_the_count() -> None:
    pol = Stateful(KpaPolicy(KpaSpec(), min_scale=1, max_scale=10))
    dec = pol.decide(load(0, 3, 0, fresh=False), 0.0)
    assert dec.desired == 3 and "metrics missing" in dec.reason
