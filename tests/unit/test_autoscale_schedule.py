"""Scheduled floors (S8) and the policy factory: cron windows, templates by name, names."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sluice.policy.autoscale import (
    FixedPolicy,
    GroupLoad,
    HpaPolicy,
    KpaPolicy,
    ScheduleFloors,
    SluicePolicy,
    Stateful,
    build_autoscaler,
    build_policy,
    resolve_schedules,
)
from sluice.spec import GroupSpec
from sluice.spec.autoscaling import ScheduleEntry

MONDAY_9 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC).timestamp()  # a Monday


def entry(
    cron: str = "0 9 * * 1-5", n: int = 6, dur: float = 3600, tz: str = "UTC"
) -> ScheduleEntry:
    return ScheduleEntry(cron=cron, min=n, duration_s=dur, timezone=tz)


def group(autoscaling: dict[str, Any] | None = None, **kw: Any) -> GroupSpec:
    body: dict[str, Any] = {
        "name": "chat",
        "owner": "ml",
        "business": "search",
        "alert_channel": "#ml",
        "models": {"m1": {"runtime": "sim"}},
        "resources": {"pool": "gpu", "memory_gb": 16},
        "max_concurrency": 4,
        "replicas": 2,
        **kw,
    }
    if autoscaling is not None:
        body["autoscaling"] = autoscaling
    return GroupSpec.model_validate(body)


def idle(at: float, current: int) -> GroupLoad:
    return GroupLoad(
        at=at,
        current=current,
        ready=current,
        slots_per_instance=4,
        in_flight=0,
        queued=0,
        arrivals=0,
    )


def test_floor_holds_from_each_firing_for_its_duration() -> None:
    floors = ScheduleFloors([("schedule:peak", entry())])
    assert floors.floor_at(MONDAY_9 - 1) == (0, None)
    assert floors.floor_at(MONDAY_9) == (6, "schedule:peak")
    assert floors.floor_at(MONDAY_9 + 3599.5) == (6, "schedule:peak")
    assert floors.floor_at(MONDAY_9 + 3600) == (0, None)
    assert floors.floor_at(MONDAY_9 + 86_400 + 10) == (6, "schedule:peak")  # Tuesday
    assert floors.floor_at(MONDAY_9 + 5 * 86_400 + 10) == (0, None)  # Saturday
    assert floors.floor_at(MONDAY_9 + 30) == (6, "schedule:peak")  # time may go back


def test_highest_active_entry_wins_and_timezones_apply() -> None:
    floors = ScheduleFloors(
        [
            ("schedule:a", entry(n=3, dur=7200)),
            ("schedule:b", entry(cron="30 9 * * *", n=8, dur=600)),
        ]
    )
    assert floors.floor_at(MONDAY_9 + 60) == (3, "schedule:a")
    assert floors.floor_at(MONDAY_9 + 1800) == (8, "schedule:b")
    assert floors.floor_at(MONDAY_9 + 2400) == (3, "schedule:a")
    # 18:00 in Tokyo is 09:00 UTC
    assert ScheduleFloors([("t", entry(cron="0 18 * * *", tz="Asia/Tokyo"))]).floor_at(
        MONDAY_9 + 5
    ) == (6, "t")


def test_templates_resolve_by_name_and_unknown_names_fail() -> None:
    templates = {"peak-season": [entry()]}
    resolved = resolve_schedules(["peak-season", entry(cron="0 1 * * *")], templates)
    assert [label for label, _ in resolved] == ["schedule:peak-season", "schedule:0 1 * * *"]
    with pytest.raises(ValueError, match="no schedule template 'nope'"):
        resolve_schedules(["nope"], templates)


def test_cron_floor_applied_and_released_through_a_named_template() -> None:
    g = group({"min": 1, "max": 20, "schedules": ["peak-season"], "down": {"cooldown_s": 0}})
    pol = build_autoscaler(g, {"peak-season": [entry(n=6, dur=600)]})
    assert isinstance(pol, Stateful) and isinstance(pol.policy, SluicePolicy)
    current, t = 1, MONDAY_9 - 60
    seen: list[int] = []
    while t < MONDAY_9 + 1800:
        dec = pol.decide(idle(t, current), t)
        if t == MONDAY_9:
            assert dec.desired == 6
            assert dec.winner == "schedule:peak-season"
            assert "schedule:peak-season" in dec.clipped_by
            assert "floor schedule:peak-season 6" in dec.reason
        current = dec.desired
        seen.append(current)
        t += 1
    assert seen[0] == 1 and max(seen) == 6
    assert seen[60 + 599] == 6  # held for the whole duration
    assert seen[-1] == 1  # released, then stepped down the ladder


def test_factory_picks_policies_by_name() -> None:
    g = group({"min": 1, "max": 10, "stable": 2})
    assert isinstance(build_policy(g, {}), SluicePolicy)
    hpa = build_policy(g, {}, "hpa")
    assert isinstance(hpa, HpaPolicy) and (hpa.min, hpa.max) == (2, 10)
    kpa = build_policy(g, {}, "kpa")
    assert isinstance(kpa, KpaPolicy) and (kpa.min, kpa.max) == (2, 10)
    fixed = build_autoscaler(g, {}, "fixed:7")
    assert isinstance(fixed, FixedPolicy) and fixed.decide(idle(0, 1), 0).desired == 7
    assert build_autoscaler(g, {}, "fixed").decide(idle(0, 1), 0).desired == 2  # replicas
    assert isinstance(build_autoscaler(group(), {}), FixedPolicy)
    assert isinstance(build_policy(group({"max": 3, "policy": "kpa"}), {}), KpaPolicy)
    # the stateful face: the same policy, its memory kept
    for name, cls in (("sluice", SluicePolicy), ("hpa", HpaPolicy), ("kpa", KpaPolicy)):
        scaler = build_autoscaler(g, {}, name)
        assert isinstance(scaler, Stateful) and isinstance(scaler.policy, cls)
        assert scaler.name == name and scaler.memory == scaler.policy.initial()


@pytest.mark.parametrize("name", ["nope", "fixed:x", "fixed:-1", "HPA"])
def test_factory_rejects_unknown_names(name: str) -> None:
    with pytest.raises(ValueError, match=r"unknown autoscaling policy|fixed:N"):
        build_autoscaler(group({"max": 3}), {}, name)


def test_factory_needs_an_autoscaling_block_for_real_policies() -> None:
    with pytest.raises(ValueError, match="no 'autoscaling' block"):
        build_autoscaler(group(), {}, "sluice")


def test_factory_uses_the_slo_latency_as_p95_target() -> None:
    g = group({"max": 5}, slo={"latency_ms": 1500})
    pol = build_policy(g, {})
    assert isinstance(pol, SluicePolicy) and pol.latency_target_ms == 1500
