"""The Kubernetes HPA v2 emulation, checked against numbers from the upstream formulas
(kubernetes/kubernetes pkg/controller/podautoscaler/horizontal.go, replica_calculator.go)."""

from __future__ import annotations

from typing import Any

from sluice.policy.autoscale import GroupLoad, HpaMemory, HpaPolicy, Stateful
from sluice.spec.autoscaling import HpaBehaviorRule, HpaSpec
from sluice.spec.autoscaling import HpaPolicy as Rule


def load(
    current: int, in_flight: int, *, ready: int | None = None, at: float = 0.0, **kw: Any
) -> GroupLoad:
    return GroupLoad(
        at=at,
        current=current,
        ready=current if ready is None else ready,
        slots_per_instance=4,
        in_flight=in_flight,
        queued=kw.pop("queued", 0),
        arrivals=0,
        **kw,
    )


def hpa(**kw: Any) -> HpaSpec:
    return HpaSpec.model_validate(kw)


def test_within_tolerance_is_skipped() -> None:
    pol = Stateful(HpaPolicy(hpa(), min_replicas=1, max_replicas=100))
    dec = pol.decide(load(10, 29), 0.0)  # 2.9 per pod vs 2.8: ratio 1.036 <= 1.1
    assert dec.desired == 10


def test_desired_is_ceil_of_current_times_ratio() -> None:
    pol = Stateful(HpaPolicy(hpa(), min_replicas=1, max_replicas=100))
    assert pol.decide(load(10, 31), 0.0).desired == 12  # ratio 1.107 -> ceil(11.07)
    pol = Stateful(HpaPolicy(hpa(), min_replicas=1, max_replicas=100))
    assert pol.decide(load(3, 12), 0.0).desired == 5  # 4 / 2.8 = 1.43 -> ceil(4.29)


def test_default_scale_up_limit_is_max_of_double_and_plus_four_per_15s() -> None:
    pol = Stateful(HpaPolicy(hpa(target_per_instance=0.1), min_replicas=1, max_replicas=1000))
    # 4 in flight per pod vs target 0.4: ratio 10
    d0 = pol.decide(load(2, 8, at=0), 0.0)
    assert d0.desired == 6  # max(2 x 2, 2 + 4)
    assert d0.unclipped == 20 and "scale-up limit" in d0.clipped_by
    d15 = pol.decide(load(6, 24, at=15), 15.0)
    assert d15.desired == 12  # max(2 x 6, 6 + 4); the t=0 event left the 15 s period
    assert pol.decide(load(12, 48, at=30), 30.0).desired == 24


def test_scale_up_limit_counts_events_of_the_period() -> None:
    rule = HpaBehaviorRule(stabilization_s=0, policies=[Rule(type="Pods", value=4, period_s=60)])
    pol = Stateful(
        HpaPolicy(hpa(target_per_instance=0.1, scale_up=rule), min_replicas=1, max_replicas=99)
    )
    assert pol.decide(load(2, 8), 0.0).desired == 6
    assert pol.decide(load(6, 24, at=15), 15.0).desired == 6  # +4 already used in 60 s
    assert pol.decide(load(6, 24, at=60), 60.0).desired == 10


def test_sync_period_holds_the_previous_decision() -> None:
    pol = Stateful(HpaPolicy(hpa(), min_replicas=1, max_replicas=100))
    first = pol.decide(load(3, 12), 0.0)
    assert pol.decide(load(3, 0, at=7), 7.0) is first
    assert pol.decide(load(5, 0, at=14.9), 14.9) is first
    assert pol.decide(load(5, 14, at=15), 15.0) is not first


def test_scale_down_stabilization_is_a_300s_rolling_max() -> None:
    pol = Stateful(HpaPolicy(hpa(), min_replicas=1, max_replicas=100))
    t = 0.0
    while t < 150:
        assert pol.decide(load(10, 28, at=t), t).desired == 10
        t += 15
    while t <= 420:  # 0.56 per pod: wants 2, but 10 was recommended at t=135
        dec = pol.decide(load(10, 6, at=t), t)
        assert dec.desired == 10, t
        t += 15
    assert "stabilization" in dec.clipped_by
    assert pol.decide(load(10, 6, at=435), 435.0).desired == 3  # ceil(10 x 0.214)


def ladder(select: str) -> Stateful[HpaMemory]:
    down = HpaBehaviorRule(
        stabilization_s=0,
        select_policy=select,  # type: ignore[arg-type]
        policies=[
            Rule(type="Pods", value=4, period_s=60),
            Rule(type="Percent", value=10, period_s=60),
        ],
    )
    return Stateful(HpaPolicy(hpa(scale_down=down), min_replicas=1, max_replicas=100))


def walk(pol: Stateful[HpaMemory], start: int, until: float) -> list[int]:
    current, t, seen = start, 0.0, [start]
    while t <= until:
        current = pol.decide(load(current, 0, at=t), t).desired
        if current != seen[-1]:
            seen.append(current)
        t += 15
    return seen


def test_pods_and_percent_ladder_with_max_takes_10_percent_above_40_and_4_below() -> None:
    assert walk(ladder("Max"), 50, 360) == [50, 45, 40, 36, 32, 28, 24, 20]


def test_ladder_with_min_takes_the_smaller_step_and_disabled_holds() -> None:
    assert walk(ladder("Min"), 50, 180) == [50, 46, 42, 38, 34]  # at 38: max(38 - 4, int(34.2))
    assert walk(ladder("Disabled"), 50, 180) == [50]


def test_unready_pods_count_as_zero_on_scale_up() -> None:
    pol = Stateful(HpaPolicy(hpa(), min_replicas=1, max_replicas=100))
    # 2 ready pods at 4 (ratio 1.43) but 2 starting: 8 / 4 pods = 2 < 2.8 -> no scale-up
    assert pol.decide(load(4, 8, ready=2), 0.0).desired == 4
    pol = Stateful(HpaPolicy(hpa(target_per_instance=0.3), min_replicas=1, max_replicas=100))
    # target 1.2: 8 / 4 / 1.2 = 1.67 -> ceil(6.67)
    assert pol.decide(load(4, 8, ready=2), 0.0).desired == 7


def test_missing_metrics_and_bounds() -> None:
    pol = Stateful(HpaPolicy(hpa(), min_replicas=2, max_replicas=8))
    dec = pol.decide(load(5, 0, fresh=False), 0.0)
    assert dec.desired == 5 and "metrics missing" in dec.reason
    assert pol.decide(load(5, 0, ready=0, at=15), 15.0).desired == 5
    assert pol.decide(load(9, 36, at=30), 30.0).desired == 8
    assert pol.decide(load(1, 0, at=45), 45.0).desired == 2
