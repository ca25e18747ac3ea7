"""The tick's one decision step (`sluice.policy.tick.decide`), by example: an autoscaler's
count clipped by quota, reclaims drained before the plan, tiers, advice that changes nothing,
and a budget cut that takes the burst part first."""

from __future__ import annotations

import dataclasses

from sluice.core import InstanceState, InstanceStatus
from sluice.policy import Drain, Launch, Remove
from sluice.policy.autoscale import FixedPolicy, GroupLoad
from sluice.policy.gain import NoGainHold
from sluice.policy.quota.metering import Meter
from sluice.policy.tick import BURST, STABLE, TickInput, decide
from sluice.spec import PlatformSpec, load_spec_text

# 2026-11-30T00:00:00Z: 24 hours left in the month.
T0 = 1_795_996_800.0

SPEC = """
pools:
  - {name: gpu, count: 6, memory_gb: 16, price_per_hour: 2.0}
groups:
  - name: core
    owner: o
    business: core
    alert_channel: c
    models: {m-a: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    replicas: 2
    quota: {guaranteed: 3, reclaim_grace_s: 0}
  - name: bursty
    owner: o
    business: ads
    alert_channel: c
    models: {m-b: {runtime: sim}}
    resources: {pool: gpu, memory_gb: 1}
    autoscaling: {min: 1, max: 6, MODE}
    quota: {guaranteed: 2}
"""


def spec(mode: str = "active") -> PlatformSpec:
    return load_spec_text(SPEC.replace("MODE", f"mode: {mode}")).spec


def ready(group: str, n: int, template: str, t0: float = 0.0) -> list[InstanceStatus]:
    return [
        InstanceStatus(f"{group}-{k}", group, template, InstanceState.READY, T0 - 100 + t0 + k)
        for k in range(n)
    ]


def fleet_of(s: PlatformSpec, bursty: int) -> list[InstanceStatus]:
    """core's 2 instances, then `bursty` of bursty's (newer)."""
    core, b = s.group("core"), s.group("bursty")
    assert core and b
    return ready("core", 2, core.template()) + ready("bursty", bursty, b.template(), 10)


def load(current: int) -> GroupLoad:
    return GroupLoad(
        at=T0,
        current=current,
        ready=current,
        slots_per_instance=1,
        in_flight=0,
        queued=0,
        arrivals=0,
    )


def test_an_autoscaler_is_clipped_by_quota_and_its_burst_runs_above_the_guarantee() -> None:
    s = spec()
    bursty = s.group("bursty")
    assert bursty
    fleet = fleet_of(s, 2)
    tick = decide(
        TickInput(
            s,
            fleet,
            counts={"core": 2, "bursty": 2},
            now=T0,
            loads={"bursty": load(2)},
            scalers={"bursty": FixedPolicy(6)},
        )
    )
    (scaled,) = tick.scaled
    # 6 units: core holds 2 and protects nothing (all lendable), so bursty gets 4 of 6 wanted
    assert scaled.count == 4 and "quota" in scaled.guards
    assert tick.counts == {"bursty": 4}
    assert [type(a) for a in tick.actions] == [Launch, Launch]
    assert tick.tiers == {
        "core-0": STABLE,
        "core-1": STABLE,
        "bursty-0": STABLE,
        "bursty-1": STABLE,
    }
    # once they run, the two above bursty's guarantee of 2 units are its burst part
    started = [
        InstanceStatus(f"bursty-{k}", "bursty", bursty.template(), InstanceState.STARTING, T0 + k)
        for k in (2, 3)
    ]
    after = decide(TickInput(s, fleet + started, {"core": 2, "bursty": 4}, T0 + 1))
    assert after.tiers["bursty-2"] == BURST and after.tiers["bursty-3"] == BURST
    assert after.actions == ()


def test_a_reclaim_drains_the_newest_burst_instances_before_the_plan_sees_them() -> None:
    s = spec()
    tick = decide(TickInput(s, fleet_of(s, 4), {"core": 3, "bursty": 4}, T0))
    drains = [a for a in tick.actions if isinstance(a, Drain)]
    assert [d.instance_id for d in drains] == ["bursty-3"]  # the newest one above 2 units
    assert "reclaim" in drains[0].reason
    seen = {i.id: i.state for i in tick.observed}
    assert seen["bursty-3"] is InstanceState.DRAINING
    assert not any(isinstance(a, Launch) for a in tick.actions)  # core waits for the unit
    assert tick.tiers["bursty-2"] == tick.tiers["bursty-3"] == BURST  # reclaimed as burst


def test_advice_is_previewed_against_quota_and_changes_nothing() -> None:
    s = spec("advisory")
    tick = decide(
        TickInput(
            s,
            fleet_of(s, 2),
            {"core": 2, "bursty": 2},
            T0,
            loads={"bursty": load(2)},
            scalers={"bursty": FixedPolicy(6)},
        )
    )
    (scaled,) = tick.scaled
    assert scaled.advisory and scaled.count == 4 and scaled.actual == 2
    assert tick.counts == {} and tick.actions == ()
    assert tick.preview is not None and tick.preview.grants["bursty"].instances == 4


def test_instances_of_a_group_no_longer_in_the_spec_stop() -> None:
    s = spec()
    gone = [*ready("old", 1, "x"), InstanceStatus("old-9", "old", "x", InstanceState.STARTING, T0)]
    tick = decide(TickInput(s, gone, {"core": 0, "bursty": 0}, T0, meter=Meter()))
    assert {(type(a), a.instance_id) for a in tick.actions if not isinstance(a, Launch)} == {
        (Drain, "old-0"),
        (Remove, "old-9"),
    }


def test_a_no_gain_hold_stops_scale_up_at_its_count_but_never_scale_down() -> None:
    s = spec()
    hold = NoGainHold("bursty", count=2, rate=10.0, since=T0, until=None, reason="backend")
    up = decide(
        TickInput(
            s,
            fleet_of(s, 2),
            counts={"core": 2, "bursty": 2},
            now=T0,
            loads={"bursty": load(2)},
            scalers={"bursty": FixedPolicy(4)},
            holds={"bursty": hold},
        )
    )
    (scaled,) = up.scaled
    assert scaled.count == 2 and "no_gain" in scaled.guards
    assert scaled.decision.unclipped == 4 and "held at 2: backend" in scaled.reason
    assert up.counts == {} and up.actions == ()
    down = decide(
        TickInput(
            s,
            fleet_of(s, 2),
            counts={"core": 2, "bursty": 2},
            now=T0,
            loads={"bursty": load(2)},
            scalers={"bursty": FixedPolicy(1)},
            holds={"bursty": hold},
        )
    )
    assert down.counts == {"bursty": 1} and "no_gain" not in down.scaled[0].guards


def test_warm_standby_a_gateway_put_in_rotation_joins_the_count_and_is_launched_anew() -> None:
    s = load_spec_text(SPEC.replace("MODE", "warm_standby: 1")).spec
    b = s.group("bursty")
    assert b
    fleet = fleet_of(s, 3)  # 2 in force and their warm standby, all ready
    promoted = dataclasses.replace(load(2), standby_in_rotation=3)
    tick = decide(
        TickInput(
            s,
            fleet,
            counts={"core": 2, "bursty": 2},
            now=T0,
            loads={"bursty": promoted},
            scalers={"bursty": FixedPolicy(2)},
        )
    )
    (scaled,) = tick.scaled
    assert scaled.count == 3 and scaled.decision.winner == "standby"
    assert "a gateway promoted the warm standby" in scaled.reason
    assert tick.counts == {"bursty": 3}
    assert [(type(a), a.group) for a in tick.actions] == [(Launch, "bursty")]  # the new spare
    # the autoscaler still scales down as it likes once the gateway has no standby in
    # rotation (the count in force took it in), and a count as large is its own
    for in_rotation, want, count in ((0, 1, 1), (3, 3, 3)):
        later = decide(
            TickInput(
                s,
                fleet,
                counts={"core": 2, "bursty": 3},
                now=T0 + 1,
                loads={"bursty": dataclasses.replace(load(3), standby_in_rotation=in_rotation)},
                scalers={"bursty": FixedPolicy(want)},
            )
        )
        assert later.scaled[0].count == count and later.scaled[0].decision.winner != "standby"
